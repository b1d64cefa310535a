"""One MoE layer (forward and backward) of every EP group on the flow-level engine, with the
token routing of each step drawn from a seeded distribution (docs/moe.md, "Token imbalance").

Per EP group of size EP, rank s routes ``R[s][d]`` token rows (token copies: tokens x top_k)
to the experts of rank d. The layer, per rank, as Megatron-Core's all-to-all dispatcher runs
it (no global barrier: a rank waits only for the rows it receives):

1. dispatch: every rank s sends ``R[s][d]·h·2`` bytes to every other rank d (bf16);
2. expert forward on rank d once all its rows arrived: grouped GEMMs of ``Σ_s R[s][d]`` rows,
   ``2·(expert matmul weights)`` FLOPs per row (:func:`expert_flops_per_row`);
3. combine: d returns ``R[s][d]`` rows to s;
4. backward, once every rank of the EP group has its combine (the layers between this
   layer's forward and its backward run their own all-to-alls over the group, which
   synchronise it): the combine's gradient s -> d, expert backward on d (2 x forward
   FLOPs), the dispatch's gradient d -> s.

Each flow is its own transfer on the network (max-min shared with every other flow of the
layer, of every EP group), costed like the p2p all-to-all (:mod:`parosim.collectives.
alltoall`): its bytes at the protocol's efficiency, then its path latency, the step latency,
the phase overhead and the protocol's fixed cost. Expert compute runs at the GPU's bf16 peak
x ``compute_efficiency`` (the flat compute model). The layer's time is the last rank's end.

Routing (``Routing``): ``balanced`` (forced balance: every rank gets rows / EP from every
rank, the deterministic case); ``uniform`` (every row picks one of the E experts uniformly
at random: multinomial draws); ``skew`` (one hot rank, chosen at random per step, receives
``max_over_mean`` times the mean, the others share the rest equally; rows split by largest
remainder, no other randomness); ``zipf`` (expert popularity ∝ 1 / rank^a over a random
permutation of the experts per step, multinomial draws). One numpy generator seeded with
``seed`` draws every step and group in order, so reruns are bit-identical. Approximation:
the k copies of a token are drawn independently (a token may pick one expert twice).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..collectives.alltoall import PairSet, lower_p2p
from ..collectives.cost import program_time
from ..collectives.deepep import (
    EPCall,
    EPDispatcher,
    bf16_token_bytes,
    deepep_routing,
    lower_ep_groups,
)
from ..collectives.simulate import simulate_program
from ..collectives.types import Scope
from ..errors import InputError
from ..fabric.engine import CountingEnvironment
from ..fabric.network import MAX_PS, PS, Network, horizon_error, to_ps
from ..fabric.topology import cluster_graph
from ..spec.model import ModelSpec
from ..spec.moe import check_max_over_mean, check_routing, check_zipf
from ..spec.system import ClusterSpec
from ..spec.training import TrainingSpec

BYTES_PER_ELEMENT = 2  # bf16 tokens
MAX_DRAWS = 1000       # steps per --routing run (each is one layer on the engine: ~0.1-1 s)


@dataclass(frozen=True)
class Routing:
    """How tokens are routed in each step (module docstring)."""

    kind: str = "balanced"
    max_over_mean: float = 1.0
    zipf: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        check_routing(self.kind)
        check_max_over_mean(self.max_over_mean)
        check_zipf(self.zipf)
        if not (isinstance(self.seed, int) and not isinstance(self.seed, bool)
                and self.seed >= 0):
            raise InputError(f"--seed = {self.seed!r} must be a non-negative integer")


def _largest_remainder(total: int, weights: np.ndarray) -> np.ndarray:
    x = total * weights / weights.sum()
    base = np.floor(x).astype(np.int64)
    rest = total - int(base.sum())
    order = np.argsort(-(x - base), kind="stable")
    base[order[:rest]] += 1
    return base


def route(routing: Routing, ep: int, experts: int, rows: int,
          rng: np.random.Generator) -> np.ndarray:
    """R[s][d]: rows rank s sends to rank d in one EP group (each rank sends ``rows``)."""
    if routing.kind == "balanced":
        return np.array([_largest_remainder(rows, np.ones(ep)) for _ in range(ep)])
    if routing.kind == "skew":
        if routing.max_over_mean > ep:
            raise InputError(f"--max-over-mean {routing.max_over_mean:g} is more than EP = "
                             f"{ep} (one rank cannot receive more than every row)")
        hot = int(rng.integers(ep))
        w = np.full(ep, (ep - routing.max_over_mean) / (ep - 1) if ep > 1 else 1.0)
        w[hot] = routing.max_over_mean
        return np.array([_largest_remainder(rows, w) for _ in range(ep)])
    if routing.kind == "uniform":
        p = np.full(experts, 1.0 / experts)
    else:
        p = 1.0 / np.arange(1, experts + 1, dtype=float) ** routing.zipf
        p = p[rng.permutation(experts)]
        p /= p.sum()
    per = experts // ep
    out = np.empty((ep, ep), dtype=np.int64)
    for s in range(ep):
        counts = rng.multinomial(rows, p)
        out[s] = counts.reshape(ep, per).sum(axis=1)
    return out


def expert_flops_per_row(model: ModelSpec) -> float:
    """Forward FLOPs of one token row in one routed expert: 2 x its matmul weights."""
    m = model.moe
    return 2.0 * (3 if model.mlp == "swiglu" else 2) * model.hidden * m.expert_ffn


@dataclass
class LayerResult:
    time_s: float
    compute_s: float          # the busiest rank's expert compute (forward + backward)
    max_over_mean: float      # the most loaded rank's rows over the mean, over all groups
    events: int


def simulate_layer(spec: ClusterSpec, model: ModelSpec, groups: list[list[int]],
                   matrices: list[np.ndarray], training: TrainingSpec,
                   graph=None) -> LayerResult:
    """One MoE layer, forward and backward, of every EP group at once on the network."""
    ep = len(groups[0])
    rows_sent = int(matrices[0][0].sum())
    size = rows_sent * model.hidden * BYTES_PER_ELEMENT
    ref = lower_p2p(spec, Scope.GLOBAL, size, groups=groups).phases[0]  # protocol costs
    tun = spec.collective
    g = graph if graph is not None else cluster_graph(spec, lite=True)
    env = CountingEnvironment()
    net = Network(env, g, spec.nodes, spec.nodes, spec.gpus_per_node)
    rate = spec.gpu.peak_flops * training.compute_efficiency
    f_row = expert_flops_per_row(model)
    row_bytes = model.hidden * BYTES_PER_ELEMENT
    extra = tun.step_latency_s + tun.phase_overhead_s + ref.fixed_s

    def flow(a: int, b: int, nbytes: float):
        fs = net.flowset(PairSet(((a, b),), "a2a", 2))
        yield net.transfer(fs, nbytes / ref.bw_eff, ref.cap_Bps / ref.bw_eff)
        yield env.timeout(to_ps(fs.alpha_s + extra))

    def all_to_all(grp, R, starts, reverse):
        """Flows of one all-to-all; rank i's flows start at starts[i]; returns the events of
        every rank's receipt of all its rows."""
        got = {r: [] for r in grp}
        for i, a in enumerate(grp):
            for j, b in enumerate(grp):
                if i == j:
                    continue
                n = R[j][i] if reverse else R[i][j]
                if n <= 0:
                    continue

                def proc(a=a, b=b, n=n, i=i):
                    yield starts[i]
                    yield from flow(a, b, n * row_bytes)
                got[b].append(env.process(proc()))
        return [env.all_of([starts[k], *got[r]]) for k, r in enumerate(grp)]

    def compute(ev, seconds):
        def proc():
            yield ev
            yield env.timeout(to_ps(seconds))
        return env.process(proc())

    ends = []
    busiest = 0.0
    worst = 1.0
    for grp, R in zip(groups, matrices, strict=True):
        loads = R.sum(axis=0)
        busiest = max(busiest, 3 * float(loads.max()) * f_row / rate)
        worst = max(worst, float(loads.max()) / float(loads.mean()))
        start = [env.timeout(0) for _ in grp]
        recv = all_to_all(grp, R, start, False)                            # dispatch
        fwd = [compute(recv[k], loads[k] * f_row / rate) for k in range(ep)]
        back = all_to_all(grp, R, fwd, True)                               # combine
        sync = env.all_of(back)   # the layers in between synchronise the EP group
        grad = all_to_all(grp, R, [sync] * ep, False)                      # combine grad
        bwd = [compute(grad[k], 2 * loads[k] * f_row / rate) for k in range(ep)]
        ends += all_to_all(grp, R, bwd, True)                              # dispatch grad
    env.run()
    if env.now > MAX_PS:
        raise horizon_error(env.now / PS)
    assert all(e.triggered for e in ends)
    return LayerResult(env.now / PS, busiest, worst, env.events)


def layer_closed_form(spec: ClusterSpec, model: ModelSpec, groups: list[list[int]], rows: int,
                      training: TrainingSpec) -> float:
    """Balanced routing by hand: 4 p2p all-to-alls of rows·h·2 bytes per rank, plus the
    expert forward (rows x F) and backward (2 x) at peak x efficiency."""
    size = rows * model.hidden * BYTES_PER_ELEMENT
    prog = lower_p2p(spec, Scope.GLOBAL, size, groups=groups)
    a2a = program_time(spec, prog) - spec.collective.call_overhead_s
    return 4 * a2a + 3 * rows * expert_flops_per_row(model) / (
        spec.gpu.peak_flops * training.compute_efficiency)


def _ep_calls(spec: ClusterSpec, model: ModelSpec, groups: list[list[int]], tokens: int,
              disp: EPDispatcher, scale: float = 1.0) -> list:
    """The programs of the layer's four DeepEP calls of ``tokens`` tokens per rank (module
    docstring), bytes per token x ``scale``."""
    m = model.moe
    ep = len(groups[0])
    r = deepep_routing(ep, spec.gpus_per_node, m.experts, m.top_k, grouped=False)
    # the combine's gradient is a dispatch and the dispatch's a combine: the same programs
    d, c = (lower_ep_groups(spec, EPCall(disp.kernel, x, tokens,
                                         bf16_token_bytes(model.hidden) * scale, r), groups)
            for x in ("dispatch", "combine"))
    return [d, c, d, c]


def busiest_scale(R: np.ndarray) -> float:
    """The busiest rank's remote rows (sent or received) over the mean rank's: 1 exactly
    under forced balance."""
    ep, rows = R.shape[0], float(R[0].sum())
    if ep == 1:
        return 1.0
    remote = max(float((R.sum(axis=0) - np.diag(R)).max()),
                 float((R.sum(axis=1) - np.diag(R)).max()))
    return 1.0 if remote * ep == rows * (ep - 1) else remote * ep / (rows * (ep - 1))


def simulate_layer_ep(spec: ClusterSpec, model: ModelSpec, groups: list[list[int]],
                      matrices: list[np.ndarray], training: TrainingSpec,
                      disp: EPDispatcher, tokens: int, graph=None) -> LayerResult:
    """One MoE layer with DeepEP's kernels, ``tokens`` per rank (module docstring): each
    call on the engine."""
    rate = spec.gpu.peak_flops * training.compute_efficiency
    f_row = expert_flops_per_row(model)
    load = max(float(R.sum(axis=0).max()) for R in matrices)
    worst = max(float(R.sum(axis=0).max()) / float(R.sum(axis=0).mean()) for R in matrices)
    scale = max(busiest_scale(R) for R in matrices)
    g = graph if graph is not None else cluster_graph(spec, lite=True)
    t, events = 0.0, 0
    done: dict = {}   # each distinct program once on the engine (a fresh network each time)
    for prog in _ep_calls(spec, model, groups, tokens, disp, scale):
        if id(prog) not in done:
            done[id(prog)] = simulate_program(spec, prog, g, symmetric=False)
        t += done[id(prog)].time_s
        events += done[id(prog)].events
    compute = 3 * load * f_row / rate
    return LayerResult(t + compute, compute, worst, events)


def layer_closed_form_ep(spec: ClusterSpec, model: ModelSpec, groups: list[list[int]],
                         rows: int, training: TrainingSpec, disp: EPDispatcher,
                         tokens: int) -> float:
    """Balanced routing by hand with DeepEP's kernels: the four calls' closed forms plus
    the expert forward (rows x F) and backward (2 x) at peak x efficiency."""
    calls = sum(program_time(spec, p) for p in _ep_calls(spec, model, groups, tokens, disp))
    return calls + 3 * rows * expert_flops_per_row(model) / (
        spec.gpu.peak_flops * training.compute_efficiency)


def layer_distribution(spec: ClusterSpec, model: ModelSpec, groups: list[list[int]],
                       rows: int, training: TrainingSpec, routing: Routing,
                       draws: int, a2a: EPDispatcher | None = None,
                       tokens: int | None = None) -> dict:
    """The layer time over ``draws`` steps of ``routing``, against forced balance;
    ``a2a``: a DeepEP dispatcher (else the per-flow p2p layer) with ``tokens`` per rank
    (default rows / top-k)."""
    if tokens is None:
        tokens = max(1, rows // model.moe.top_k)
    if not (isinstance(draws, int) and 1 <= draws <= MAX_DRAWS):
        raise InputError(f"--draws {draws!r} must be an integer in 1..{MAX_DRAWS} (each draw "
                         "is a layer on the engine)")
    ep, experts = len(groups[0]), model.moe.experts
    rng = np.random.default_rng(routing.seed)
    g = cluster_graph(spec, lite=True)

    def layer(mats):
        if a2a is None:
            return simulate_layer(spec, model, groups, mats, training, g)
        return simulate_layer_ep(spec, model, groups, mats, training, a2a, tokens, g)

    balanced = layer([route(Routing(), ep, experts, rows, rng)] * len(groups))
    times, ratios = [], []
    for _ in range(draws):
        mats = [route(routing, ep, experts, rows, rng) for _ in groups]
        r = layer(mats)
        times.append(r.time_s)
        ratios.append(r.max_over_mean)
    ts = np.array(times)
    return {"routing": routing.kind, "max_over_mean_param": routing.max_over_mean,
            "zipf": routing.zipf, "seed": routing.seed, "draws": draws,
            "rows_per_rank": rows, "balanced_s": balanced.time_s,
            "closed_form_s": (layer_closed_form(spec, model, groups, rows, training)
                              if a2a is None else
                              layer_closed_form_ep(spec, model, groups, rows, training, a2a,
                                                   tokens)),
            "times_s": times, "load_max_over_mean": ratios,
            "mean_s": float(ts.mean()), "p50_s": float(np.percentile(ts, 50)),
            "p99_s": float(np.percentile(ts, 99)), "max_s": float(ts.max()),
            "imbalance_cost": float(ts.mean() / balanced.time_s - 1.0)}
