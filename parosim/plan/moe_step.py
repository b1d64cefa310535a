"""One global training step of a mixture-of-experts model as a Plan (docs/moe.md, "A MoE
training step").

The layout is expert parallelism beside data parallelism (TP = PP = CP = ETP = 1): n GPUs
hold the dense parameters (attention, dense MLPs, shared experts, router, norms, embedding,
head) as one data-parallel group of n sharded by ``--strategy`` (the cluster's scopes, as a
dense model), and the routed experts as EP groups of EP ranks (E / EP experts each) and
expert-data-parallel (EDP) groups of n / EP ranks sharded by ``--expert-strategy``
(:class:`~parosim.plan.experts.ExpertLayout`).

One micro-step, per unit (embed, L0 .. L{L-1}, head) as the dense Plan
(:mod:`parosim.plan.dataparallel`): forward over the units, backward in reverse. On a MoE
layer the layer's compute is split:

* forward: ``fwd Li`` (attention, router, shared experts: the dense part), the **dispatch**
  all-to-all over every EP group, ``expert-fwd Li`` (the grouped GEMMs of the rows this rank
  receives), the **combine** all-to-all; the next unit's compute waits for the combine;
* backward: the combine's gradient all-to-all, ``expert-bwd Li``, the dispatch's gradient
  all-to-all, then ``bwd Li`` (the dense part).

The all-to-alls run on their own stream (``comm-a2a``) on the network beside the parameter
gathers and gradient reductions, so they contend for links with them; they are on the
compute stream's critical path (the compute waits for them). ``--a2a-algo`` p2p or
hierarchical-a2a costs them as NCCL's all-to-alls of the dispatched rows; deepep-normal,
deepep-ll or hybridep as DeepEP's kernel calls of the rank's tokens in bf16, the combine's
gradient a dispatch and the dispatch's a combine (docs/moe.md, "DeepEP kernels in a MoE
layer or step").

Sharding collectives, at the levels of each strategy (the tables of
:mod:`parosim.plan.dataparallel`): the dense units' gathers (p = I / G) and gradient
reduce-scatters (g = I / G) over the n GPUs; each MoE layer's expert shard (its E / EP
experts) gathered (expert p = I / G) and its gradients reduce-scattered (expert g = I / G)
over the EDP groups, with the expert unit's uses. At the accumulation boundary: the expert
gradient sync (over the EDP groups), the dense gradient sync, one optimizer step over both
local shards, then both parameter syncs.

Compute: FLOPs at the GPU's bf16 peak x ``training.compute_efficiency`` (the flat compute
model, :func:`parosim.cost.compute.compute_seconds`, the dense path's function); the
kernel compute model and FP8 are refused for MoE steps. Per token, forward: the dense part
``2·(attention + router + shared or dense-MLP matmul weights) + 2·(w_qk + w_v)·s_eff``
(the attention scores, :func:`parosim.spec.moe.attention_score_dims`; sliding-window layers
averaged over the layers); the experts ``2·(one expert's matmul weights)`` per routed row;
the head ``2·h·vocab``. Backward: the matmuls ``(1 + r)`` x forward, the attention scores
2 x.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from ..collectives.alltoall import lower_alltoall
from ..collectives.deepep import (
    EPCall,
    EPDispatcher,
    bf16_token_bytes,
    deepep_routing,
    lower_ep_groups,
)
from ..collectives.lowering import lower
from ..collectives.types import Algo, Op, Scope, parse_enum
from ..cost.compute import ADAM_BYTES_PER_PARAM, compute_model, compute_seconds
from ..errors import InputError
from ..spec.model import ModelSpec
from ..spec.moe import Attention, attention_score_dims
from ..spec.strategy import Level, Strategy, parse_strategy
from ..spec.system import ClusterSpec
from ..spec.training import BYTES_PER_GRAD, BYTES_PER_PARAM, TrainingSpec
from .builder import (
    COMM_GRAD,
    COMM_PARAM,
    COMPUTE,
    LEVEL_SCOPE,
    SYNC_GRAD,
    SYNC_PARAM,
    Builder,
    GroupOp,
    Plan,
    boundary,
)
from .experts import ExpertLayout, dispatch_bytes
from .layout import group_scopes

COMM_A2A = "comm-a2a"
A2A_ALGOS = (Algo.P2P, Algo.HIERARCHICAL_A2A)
#: every ``--a2a-algo`` of a MoE step: NCCL's all-to-alls and DeepEP's kernels
A2A_CHOICES = (*A2A_ALGOS, *EPDispatcher)


def parse_a2a_algo(value) -> Algo | EPDispatcher:
    """``--a2a-algo``: p2p | hierarchical-a2a | deepep-normal | deepep-ll | hybridep."""
    if isinstance(value, (Algo, EPDispatcher)):
        algo = value
    else:
        key = str(value).strip().lower()
        try:
            algo = (EPDispatcher(key) if key in {e.value for e in EPDispatcher}
                    else parse_enum(Algo, value, "--a2a-algo"))
        except InputError:
            algo = None
    if algo not in A2A_CHOICES:
        shown = algo.value if algo is not None else str(value)
        raise InputError(f"--a2a-algo {shown!r} is not an all-to-all algorithm; "
                         f"expected one of {', '.join(a.value for a in A2A_CHOICES)}")
    return algo


@dataclass(frozen=True)
class A2AOp(GroupOp):
    """One all-to-all over every EP group of the layout (``scopes``: the groups).
    With a DeepEP dispatcher, ``direction`` (dispatch or combine: the gradient of a combine
    is a dispatch and the reverse) and ``ep_call`` = (tokens per rank, bytes per token,
    experts, top-k) give the kernel's call (:func:`_ep_program`)."""

    a2a_algo: Algo | EPDispatcher = Algo.P2P
    direction: str = "dispatch"
    ep_call: tuple = ()

    def lower(self, spec, algo: Algo):
        if isinstance(self.a2a_algo, EPDispatcher):
            return _ep_program(spec, self.a2a_algo, self.direction, *self.ep_call,
                               self.scopes)
        return _a2a_program(spec, self.size_bytes, self.a2a_algo, self.scopes)

    @property
    def cache_key(self) -> tuple:
        return ("a2a", self.size_bytes, self.a2a_algo, self.scopes) + (
            (self.direction, self.ep_call) if self.ep_call else ())


@lru_cache(maxsize=1024)
def _a2a_program(spec: ClusterSpec, size: float, algo: Algo, groups: tuple):
    """The lowered all-to-all over ``groups`` (cached: every layer repeats it)."""
    return lower_alltoall(spec, Scope.GLOBAL, size, algo, groups=[list(g) for g in groups])


@lru_cache(maxsize=1024)
def _ep_program(spec: ClusterSpec, disp: EPDispatcher, direction: str, tokens: int,
                token_bytes: float, experts: int, topk: int, groups: tuple):
    """DeepEP's ``direction`` call of ``tokens`` tokens of ``token_bytes`` per rank over every
    EP group (:func:`~parosim.collectives.deepep.lower_ep_groups`), routed by a random top-k
    of the experts (:func:`~parosim.collectives.deepep.deepep_routing`, ungrouped: exact)."""
    routing = deepep_routing(len(groups[0]), spec.gpus_per_node, experts, topk,
                             grouped=False)
    call = EPCall(disp.kernel, direction, tokens, token_bytes, routing)
    return lower_ep_groups(spec, call, groups)


@lru_cache(maxsize=256)
def program_key(op, algo: Algo) -> tuple:
    """The key under which a collective op's lowered program is cached across the plans of
    one cluster: equal keys lower to equal programs (a group op's scopes by their groups, an
    all-to-all by its EP groups, a plain collective by op, scope, bytes and algorithm)."""
    if getattr(op, "lower", None) is None:
        return (op.op, op.scope, op.size_bytes, algo)
    return (op.cache_key, getattr(op.scopes, "glob", op.scopes), getattr(op.scopes, "m", 0),
            algo)


def op_program(op, spec: ClusterSpec, algo: Algo):
    """The lowered :class:`~parosim.collectives.types.Program` of one collective op."""
    own = getattr(op, "lower", None)
    return own(spec, algo) if own is not None else lower(spec, op.op, op.scope,
                                                         op.size_bytes, algo)


def expert_scopes(cluster: ClusterSpec, experts: int, ep: int):
    """(layout, EDP group scopes, EP groups) of EP on ``cluster``, built once per layout:
    the lowered group collectives are cached by the scopes' identity."""
    lay = ExpertLayout(cluster, experts, ep=ep)
    return lay, group_scopes(lay.edp_groups(0), lay.m_edp, "edp"), lay.ep_groups(0)


@dataclass(frozen=True)
class MoEPlan(Plan):
    """A MoE step's Plan with its expert layout and strategy."""

    expert_strategy: Strategy | None = None
    ep: int = 1
    edp: int = 1
    m_edp: int = 1
    a2a_algo: Algo | EPDispatcher = Algo.P2P
    a2a_size_bytes: float = 0.0


def check_moe_step(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec,
                   timing: bool = True) -> None:
    """Refuse, in one line each, what the MoE step does not model (``timing`` False: what
    its memory does not model)."""
    if not model.is_moe:
        raise InputError(f"model {model.name!r} is not a mixture of experts; --ep and "
                         "--expert-strategy need a MoE model")
    if timing and compute_model(cluster, training) != "flat":
        raise InputError("the kernel compute model is not modelled for MoE steps (grouped "
                         "GEMMs, MLA kernels); expected --compute-model flat")
    if training.precision != "bf16":
        raise InputError(f"--precision {training.precision} is not modelled for MoE steps; "
                         "expected bf16")
    if training.recompute:
        raise InputError("--recompute is not modelled for MoE steps; expected it off")


def unit_params(model: ModelSpec) -> dict:
    """Parameters of the dense part of each unit and of one MoE layer's routed experts."""
    c = model.param_counts
    L, dl = model.layers, model.moe.dense_layers
    ml = L - dl
    base = (c.attention + c.norms) / L
    dense_layer = base + (c.dense_mlp / dl if dl else 0.0)
    moe_layer = base + ((c.router + c.shared_experts) / ml if ml else 0.0)
    return {"embed": float(c.embedding), "head": float(c.head), "dense_layer": dense_layer,
            "moe_layer": moe_layer, "experts": c.routed_experts / ml if ml else 0.0}


def flops(model: ModelSpec, training: TrainingSpec) -> dict:
    """Forward FLOPs of one micro-batch on one GPU: ``dense_layer``, ``moe_layer`` (their
    dense parts), ``expert_row`` (one routed row through one expert), ``head``; the
    attention scores part ``scores`` (its backward is 2 x, the matmuls' (1 + r) x)."""
    h, moe = model.hidden, model.moe
    T = training.micro_batch * training.seq_len
    c = model.param_counts
    a = model.attention or Attention()
    qk, v = attention_score_dims(model)
    s = training.seq_len
    win = min(s, a.window) if a.window else s
    s_eff = (s * (model.layers - a.window_layers) + win * a.window_layers) / model.layers
    scores = 2.0 * (qk + v) * s_eff * T
    mlp_k = 3 if model.mlp == "swiglu" else 2
    L, dl = model.layers, moe.dense_layers
    attn_w = (c.active_matmul - model.vocab * h - dl * mlp_k * h * model.ffn_hidden
              - (L - dl) * (moe.top_k * mlp_k * h * moe.expert_ffn
                            + moe.shared_experts * mlp_k * h * moe.shared_width
                            + h * moe.experts)) / L
    dense_w = attn_w + mlp_k * h * model.ffn_hidden
    moe_w = attn_w + moe.shared_experts * mlp_k * h * moe.shared_width + h * moe.experts
    return {"dense_layer": 2.0 * dense_w * T, "moe_layer": 2.0 * moe_w * T, "scores": scores,
            "expert_row": 2.0 * mlp_k * h * moe.expert_ffn, "head": 2.0 * h * model.vocab * T}


def build_moe_plan(model: ModelSpec, strategy: Strategy | str,
                   expert_strategy: Strategy | str, cluster: ClusterSpec,
                   training: TrainingSpec, ep: int,
                   a2a_algo: Algo | EPDispatcher = Algo.P2P,
                   expert_rows: list[float] | None = None,
                   a2a_sizes: list[float] | None = None) -> MoEPlan:
    """The op list of one global MoE step (module docstring).

    ``expert_rows`` / ``a2a_sizes``: per MoE-layer use (micro-step-major, layer order) the
    rows the busiest rank computes and the all-to-all size (bytes per rank) of that layer,
    from a drawn routing (:mod:`parosim.evaluate.moe_step`); None = forced balance."""
    check_moe_step(model, cluster, training)
    strategy, est = parse_strategy(strategy), parse_strategy(expert_strategy)
    a2a_algo = parse_a2a_algo(a2a_algo)
    lay, edp, ep_groups = expert_scopes(cluster, model.moe.experts, ep)
    d = dispatch_bytes(model, training, lay)
    n, m = cluster.gpus, cluster.group_size
    r = training.trainable_ratio
    up = unit_params(model)
    fl = flops(model, training)
    e_unit = up["experts"] / ep
    rows0 = float(d["rows"])
    b = Builder(n, m)

    def sec(f: float) -> float:
        return compute_seconds(f, cluster, training)

    size0 = float(d["a2a_size_bytes"])

    def a2a(name: str, size: float, layer: int, mb: int, dep, direction: str) -> int | None:
        if ep <= 1:
            return dep
        call: tuple = ()
        if isinstance(a2a_algo, EPDispatcher):
            # the step's bf16 tokens; a drawn routing scales them as it scales the size
            call = (int(d["tokens_per_rank"]),
                    bf16_token_bytes(model.hidden) * (float(size) / size0),
                    model.moe.experts, model.moe.top_k)
        op = A2AOp(len(b.ops), name, Op.ALL_TO_ALL, Scope.GLOBAL, float(size), "dispatch",
                   layer, mb, COMM_A2A, tuple(sorted({x for x in (dep,) if x is not None})),
                   None, 0, "ep", count=1, scopes=ep_groups, a2a_algo=a2a_algo,
                   direction=direction, ep_call=call)
        b.ops.append(op)
        b.last[COMM_A2A] = op.id
        return op.id

    dl = model.moe.dense_layers
    units = ([("embed", None, up["embed"], 0.0)]
             + [("layer", i, up["dense_layer"] if i < dl else up["moe_layer"],
                 e_unit if i >= dl else 0.0) for i in range(model.layers)]
             + [("head", None, up["head"], 0.0)])
    uses = [("fwd", u) for u in units] + [("bwd", u) for u in reversed(units)]
    done: list[int] = []      # the (dense) compute op of each use: the gathers' prefetch
    e_done: list[int] = []    # the expert compute op of each expert use
    after: int | None = None  # what the next compute waits for (a forward's combine)
    k = 0   # MoE-layer use index into expert_rows / a2a_sizes (forward and backward)
    for mb in range(training.accum_steps):
        for phase, (kind, i, p_d, p_e) in uses:
            label = "embed" if kind == "embed" else "head" if kind == "head" else f"L{i}"
            gather = egather = None
            if strategy.p is not Level.N:
                gather = b.collective(f"ag-param {phase} {label} mb{mb}", Op.ALL_GATHER,
                                      LEVEL_SCOPE[strategy.p], BYTES_PER_PARAM * p_d,
                                      "param-gather", i, mb, COMM_PARAM,
                                      [done[-2] if len(done) >= 2 else None])
            if p_e and est.p is not Level.N:
                egather = b.collective(f"ag-expert {phase} {label} mb{mb}", Op.ALL_GATHER,
                                       LEVEL_SCOPE[est.p], BYTES_PER_PARAM * p_e,
                                       "param-gather", i, mb, COMM_PARAM,
                                       [e_done[-2] if len(e_done) >= 2 else None],
                                       group="edp", scopes=edp)
            if kind == "layer":
                lin = fl["dense_layer"] if i < dl else fl["moe_layer"]
                sc = fl["scores"]
                fwd_f, bwd_f = lin + sc, (1.0 + r) * lin + 2.0 * sc
            elif kind == "head":
                fwd_f, bwd_f = fl["head"], (1.0 + r) * fl["head"]
            else:
                fwd_f = bwd_f = 0.0
            ck = phase if kind == "layer" else f"{kind}-{phase}"
            if not p_e:
                ff = fwd_f if phase == "fwd" else bwd_f
                cid = b.compute(f"{phase} {label} mb{mb}", ck, i, mb, ff, sec(ff),
                                [gather, after])
                after = None
            else:
                rows = rows0 if expert_rows is None else expert_rows[k]
                size = d["a2a_size_bytes"] if a2a_sizes is None else a2a_sizes[k]
                k += 1
                ef = rows * fl["expert_row"] * (1.0 if phase == "fwd" else 1.0 + r)
                if phase == "fwd":
                    cid = b.compute(f"fwd {label} mb{mb}", "fwd", i, mb, fwd_f, sec(fwd_f),
                                    [gather, after])
                    x = a2a(f"a2a dispatch {label} mb{mb}", size, i, mb, cid, "dispatch")
                    eid = b.compute(f"expert-fwd {label} mb{mb}", "fwd", i, mb, ef, sec(ef),
                                    [x, egather])
                    after = a2a(f"a2a combine {label} mb{mb}", size, i, mb, eid, "combine")
                else:
                    # DeepEP: a combine's gradient is a dispatch, a dispatch's a combine
                    x = a2a(f"a2a combine-grad {label} mb{mb}", size, i, mb,
                            done[-1] if done else None, "dispatch")
                    eid = b.compute(f"expert-bwd {label} mb{mb}", "bwd", i, mb, ef, sec(ef),
                                    [x, egather])
                    y = a2a(f"a2a dispatch-grad {label} mb{mb}", size, i, mb, eid, "combine")
                    cid = b.compute(f"bwd {label} mb{mb}", "bwd", i, mb, bwd_f, sec(bwd_f),
                                    [gather, y])
                    if est.g is not Level.N:
                        b.collective(f"rs-expert {label} mb{mb}", Op.REDUCE_SCATTER,
                                     LEVEL_SCOPE[est.g], BYTES_PER_GRAD * p_e * r,
                                     "grad-reduce", i, mb, COMM_GRAD, [eid], group="edp",
                                     scopes=edp)
                e_done.append(eid)
            done.append(cid)
            if phase == "bwd" and strategy.g is not Level.N:
                b.collective(f"rs-grad {label} mb{mb}", Op.REDUCE_SCATTER,
                             LEVEL_SCOPE[strategy.g], BYTES_PER_GRAD * p_d * r, "grad-reduce",
                             i, mb, COMM_GRAD, [cid])
    # the accumulation boundary: expert gradient sync, then the dense boundary (its gradient
    # sync, one optimizer step over both shards, its parameter sync), then the expert
    # parameter sync
    psi_d = float(model.param_counts.total - model.param_counts.routed_experts)
    psi_e = e_unit * (model.layers - dl)
    full_e = BYTES_PER_GRAD * psi_e * r
    e_sizes = {"full": full_e, "shard": full_e / lay.m_edp}
    deps_ = [done[-1], b.last.get(COMM_GRAD)]
    for op, scope, size in SYNC_GRAD[(est.g, est.os)]:
        cid = b.collective(f"sync-grad expert {op.value} {scope.value}", op, scope,
                           e_sizes[size], "sync-grad", None, None, COMM_GRAD, deps_,
                           group="edp", scopes=edp)
        deps_ = [done[-1], cid] if cid is not None else deps_
    shard = (psi_d * r / strategy.os.divisor(n, m)
             + psi_e * r / est.os.divisor(lay.edp, lay.m_edp))
    opt_s = ADAM_BYTES_PER_PARAM * shard / cluster.gpu.hbm_bandwidth_Bps
    boundary(b, strategy, BYTES_PER_GRAD * psi_d * r, m, deps_, opt_s)
    opt = max(o.id for o in b.ops if o.stream == COMPUTE)
    dep_p = [opt]
    for op, scope, size in SYNC_PARAM.get((est.os, est.p), ()):
        cid = b.collective(f"sync-param expert {op.value} {scope.value}", op, scope,
                           e_sizes[size], "sync-param", None, None, COMM_PARAM, dep_p,
                           group="edp", scopes=edp)
        dep_p = [cid] if cid is not None else dep_p
    tokens_gpu = training.tokens_per_gpu_step
    from ..spec.moe import flops_per_token  # deferred: only the MFU count needs it

    return MoEPlan(ops=tuple(b.ops), strategy=strategy, gpus=n, group_size=m,
                   model=model.name, micro_batch=training.micro_batch,
                   accum_steps=training.accum_steps, seq_len=training.seq_len,
                   trainable_ratio=r, tokens_per_step=tokens_gpu * n,
                   model_flops_per_step=flops_per_token(model, training.seq_len) * tokens_gpu,
                   recompute=False, expert_strategy=est, ep=ep, edp=lay.edp, m_edp=lay.m_edp,
                   a2a_algo=a2a_algo, a2a_size_bytes=float(d["a2a_size_bytes"]))


def moe_uses(model: ModelSpec, training: TrainingSpec) -> int:
    """MoE-layer uses per step (forward and backward of every MoE layer, every micro-step):
    the length of ``expert_rows`` / ``a2a_sizes``."""
    return 2 * (model.layers - model.moe.dense_layers) * training.accum_steps


def balanced_rows(model: ModelSpec, training: TrainingSpec, ep: int) -> float:
    """Rows a rank computes under forced balance: T·k (padded with a capacity factor)."""
    moe = model.moe
    tokens = training.micro_batch * training.seq_len
    if moe.capacity_factor is not None:
        return float(moe.experts * math.ceil(moe.capacity_factor * tokens * moe.top_k
                                             / moe.experts))
    return float(tokens * moe.top_k)
