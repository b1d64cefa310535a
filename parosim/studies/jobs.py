"""Several training jobs on one fabric: each job's step alone and shared, and the hot links.

Each :class:`Job` is a Plan (its own model, strategy, training settings) built for the job's
own view of the cluster (its nodes, in the order listed, are its nodes 0, 1, ...; its ranks are
node-major over them) and lowered by its own algorithm. The jobs are placed on ONE
:class:`~parosim.fabric.network.Network` over the whole cluster graph: every collective
phase's rings
are translated from job ranks to cluster ranks, so the flows of different jobs share every
link they both cross (NIC, leaf uplink, spine) by the same weighted max-min fairness as the
flows of one job.

No symmetry reduction: the network is built with ``period_nodes = nodes`` (the jobs' ring sets
are not invariant under translating ranks, and folding links of one job onto another's would
be wrong), so every flow is routed on the full graph.

Timing. Every job starts at t = 0 (in phase: the worst case for identical jobs) and runs its
step again and again until every job has finished ``steps`` steps; a job that is done keeps
running as background load until the last one finishes. A job's shared step time is the mean
of its first ``steps`` steps; its alone step time is the same measurement with only that job
on the same nodes of the same graph. ``slowdown`` = shared / alone.

Busiest links: utilization = bytes carried / (capacity x the shared run's duration), per
directed link, with the jobs whose flows use the link.

>>> from parosim.spec.model import preset
>>> from parosim.spec.system import ClusterSpec
>>> from parosim.spec.training import TrainingSpec
>>> c = ClusterSpec(nodes=4, gpus_per_node=2)
>>> jobs = [make_job(n, preset("llama-7b"), "GGG", c, nodes, TrainingSpec(accum_steps=1),
...         "ring") for n, nodes in (("a", (0, 1)), ("b", (2, 3)))]
>>> r = run_jobs(c, jobs)
>>> [round(j.slowdown, 6) for j in r.jobs]   # one non-blocking switch: no slowdown
[1.0, 1.0]
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from ..collectives.lowering import lower
from ..collectives.types import Algo, Program, RingSet, parse_enum
from ..cost.memory import memory_breakdown
from ..errors import InputError
from ..fabric.engine import (
    CountingEnvironment,
    OverlapGate,
    Record,
    run_counted,
    run_lanes,
)
from ..fabric.network import PS, Network, to_ps
from ..fabric.topology import cluster_graph
from ..io.cluster import load_cluster
from ..io.jobs import JOB_DEFAULTS, JOB_KEYS, TOP_KEYS
from ..io.model import load_model
from ..io.runtime import load_runtime, training_for_runtime
from ..io.yamlspec import check_keys, read_yaml
from ..plan.dataparallel import CollectiveOp, ComputeOp, Plan, build_plan
from ..plan.layout import ParallelSpec
from ..plan.threed import build_plan_3d, check_runtime_3d, training_for_runtime_3d
from ..simulate.step import resolve_runtime, setup_3d, with_overrides
from ..spec.model import ModelSpec
from ..spec.runtime import effective_overlap_slowdown
from ..spec.strategy import Strategy, parse_strategy
from ..spec.system import ClusterSpec
from ..spec.training import (
    DEFAULT_COMPUTE_EFFICIENCY,
    TrainingSpec,
    check_fidelity,
    for_fidelity,
    parse_trainable_ratio,
)
from ..units import fmt_bytes, parse_bandwidth, parse_size


@dataclass(frozen=True)
class Job:
    """One training job placed on ``nodes`` (cluster node indices, in rank order)."""

    name: str
    nodes: tuple[int, ...]
    plan: Plan
    spec: ClusterSpec          # the job's own view: len(nodes) nodes, its group size
    algo: Algo
    strategy: Strategy
    model: str
    overlap_slowdown: float = 1.0
    runtime: str = "ideal"
    settings: dict = field(default_factory=dict, compare=False)  # training inputs, echoed

    @property
    def gpus(self) -> int:
        return self.spec.gpus


def make_job(name: str, model: ModelSpec, strategy: Strategy | str, cluster: ClusterSpec,
             nodes, training: TrainingSpec, algo: Algo | str = Algo.HO_RING,
             group_nodes: int = 1, runtime=None, parallel: ParallelSpec | None = None) -> Job:
    """Build a job's Plan for its own nodes (as :func:`parosim.simulate.simulate_step` does:
    a runtime profile, if given, shapes the Plan and may fix each call's algorithm; a
    non-trivial ``parallel`` layout gives the TP x PP x CP x DP plan); raises
    :class:`InputError` if it does not fit."""

    strategy = parse_strategy(strategy)
    algo = algo if isinstance(algo, Algo) else parse_enum(Algo, algo, f"job {name!r}: algo")
    nodes = tuple(nodes)
    if not nodes:
        raise InputError(f"job {name!r}: nodes is empty; expected a list of node indices")
    spec = job_view(cluster, name, nodes, group_nodes)
    model.require_shape("a step simulation")
    rt = resolve_runtime(runtime)
    rt.require(strategy.short)
    three_d = parallel is not None and not parallel.trivial
    if three_d:
        check_runtime_3d(rt, strategy, parallel)
        training = training_for_runtime_3d(training, rt)
    else:   # the memory settings the profile sets, as simulate resolves them
        training = training_for_runtime(training, rt)
    if rt.collective_algo is not None:   # the runtime fixes each call's algorithm
        algo = Algo.RING
    slow = effective_overlap_slowdown(training.overlap_slowdown,
                                      getattr(cluster, "overlap_slowdown", None), rt)
    if three_d:
        mem = setup_3d(model, spec, strategy, training, parallel, algo)[0]
    else:
        mem = memory_breakdown(model, strategy, spec, training, rt)
    if not mem.fits:
        raise InputError(f"job {name!r}: {strategy.name} of {model.name} on {spec.gpus} GPUs "
                         f"does not fit in GPU memory (short by {fmt_bytes(mem.shortfall_bytes)} "
                         "per GPU); expected a configuration that fits")
    if three_d:
        plan = build_plan_3d(model, strategy, spec, training, parallel, rt)
    else:
        plan = build_plan(model, strategy, spec, training, rt)
    settings = {"micro_batch": training.micro_batch, "accum_steps": training.accum_steps,
                "seq_len": training.seq_len, "trainable_ratio": training.trainable_ratio,
                "recompute": mem.recompute, "group_nodes": group_nodes,
                "compute_efficiency": training.compute_efficiency, "overlap_slowdown": slow}
    # the models used, resolved (the efficiency applies to the flat compute model only)
    cm = training.compute_model or spec.compute.model
    if cm != "flat":
        del settings["compute_efficiency"]
    if three_d:   # the 3D planner: the Korthikanti estimate, fp32 logits unless told
        settings.update(compute_model=cm, attention=training.attention or "eager",
                        memory_model="korthikanti", logit_bytes=training.logit_bytes or 4)
    else:
        settings.update(compute_model=cm, attention=mem.attention,
                        memory_model=mem.memory_model, logit_bytes=mem.logit_bytes)
    if training.precision != "bf16":     # shown when not the default (bf16 outputs unchanged)
        settings["precision"] = training.precision
    if three_d:                          # shown with a layout (data-parallel outputs unchanged)
        settings.update(tp=parallel.tp, pp=parallel.pp, pp_schedule=parallel.schedule,
                        virtual_stages=parallel.virtual,
                        sequence_parallel=parallel.sequence_parallel)
    return Job(name, nodes, plan, spec, algo, strategy, model.name, slow, rt.name, settings)


def job_view(cluster: ClusterSpec, name: str, nodes: tuple[int, ...],
             group_nodes: int = 1) -> ClusterSpec:
    """The job's own homogeneous view of the cluster (``len(nodes)`` nodes), for its Plan and
    its collectives' lowering. Overrides of links and NICs act on the shared graph, which is
    built from the whole cluster; an override of a GPU's speed, type or memory on one of the
    job's nodes, or compute jitter, would change the job's own compute, which a multi-job run
    does not model: refused (one line), never ignored."""
    gpn = cluster.gpus_per_node
    mine = set(nodes)
    for k, o in enumerate(cluster.overrides):
        if not (o.touches_compute or o.memory_bytes is not None):
            continue
        hit = (set(o.nodes) | {cluster.rank_of(g) // gpn for g in o.gpus}) & mine
        if hit:
            raise InputError(f"job {name!r}: overrides[{k}] changes the GPUs of node "
                             f"{min(hit)} (speed, type or memory), which several-job runs do "
                             "not model; expected overrides of links and NICs only")
    if cluster.jitter_cv:
        raise InputError(f"jitter.cv = {cluster.jitter_cv} is not modelled across several "
                         "jobs; expected a cluster without compute jitter")
    return replace(cluster, nodes=len(nodes), group_nodes=group_nodes, overrides=(),
                   jitter_cv=0.0)


def check_placement(cluster: ClusterSpec, jobs: list[Job]) -> None:
    """Node indices in range, each node in at most one job, names unique."""
    owner: dict[int, str] = {}
    names = set()
    if len(jobs) < 1:
        raise InputError("jobs: expected at least one job")
    if cluster.collective.serial_progress:
        raise InputError("collective.serial_progress is not modelled across several jobs; "
                         "expected a cluster without it")
    for j in jobs:
        if j.name in names:
            raise InputError(f"job name {j.name!r} appears twice; expected unique names")
        names.add(j.name)
        for n in j.nodes:
            if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n < cluster.nodes:
                raise InputError(f"job {j.name!r}: node {n!r} is not a node of the "
                                 f"{cluster.nodes}-node cluster; expected 0..{cluster.nodes - 1}")
            if n in owner:
                other = owner[n]
                raise InputError(f"node {n} is in job {other!r} and job {j.name!r}"
                                 if other != j.name else
                                 f"job {j.name!r} lists node {n} twice")
                # (expected disjoint node sets: a GPU runs one job)
            owner[n] = j.name


class _JobPrograms:
    """A job's lowered collectives with ring ranks translated to cluster ranks."""

    def __init__(self, job: Job, gpus_per_node: int):
        self.job = job
        gpn = gpus_per_node
        self._to_global = np.array([job.nodes[r // gpn] * gpn + r % gpn
                                    for r in range(job.spec.gpus)], dtype=np.int64)
        self._c: dict[tuple, Program] = {}
        self._rs: dict[RingSet, RingSet] = {}

    def ringset(self, rs: RingSet) -> RingSet:
        """The same rings (or NCCL tree hops) on cluster ranks."""
        out = self._rs.get(rs)
        if out is None:
            g = self._to_global
            if hasattr(rs, "hop_list"):  # an NCCL tree (HopSet)
                out = replace(rs, hop_list=tuple((int(g[a]), int(g[b]))
                                                 for a, b in rs.hop_list))
            else:
                out = replace(rs, rings=tuple(tuple(int(g[r]) for r in ring)
                                              for ring in rs.rings))
            self._rs[rs] = out
        return out

    def get(self, op: CollectiveOp) -> Program:
        own = getattr(op, "lower", None)   # group collectives of 3D plans lower themselves
        algo = getattr(op, "algo", None) or self.job.algo   # a runtime may fix it per call
        key = (op.cache_key, algo) if own is not None else (op.op, op.scope, op.size_bytes, algo)
        p = self._c.get(key)
        if p is None:
            p = (own(self.job.spec, algo) if own is not None
                 else lower(self.job.spec, op.op, op.scope, op.size_bytes, algo))
            phases = tuple(replace(ph, ringset=self.ringset(ph.ringset)) for ph in p.phases)
            p = self._c[key] = replace(p, phases=phases)
        return p

    def ringsets(self) -> list[RingSet]:
        return [ph.ringset for p in self._c.values() for ph in p.phases]


@dataclass
class JobResult:
    """One job's step time alone and with the others (seconds)."""

    name: str
    model: str
    strategy: str
    algo: str
    nodes: tuple[int, ...]
    gpus: int
    tokens_per_step: int
    step_time_alone_s: float
    step_time_shared_s: float
    runtime: str = "ideal"
    settings: dict = field(default_factory=dict)

    @property
    def slowdown(self) -> float:
        return self.step_time_shared_s / self.step_time_alone_s

    def to_dict(self) -> dict:
        return {"name": self.name, "model": self.model, "strategy": self.strategy,
                "algo": self.algo, "runtime": self.runtime, "nodes": list(self.nodes),
                "gpus": self.gpus,
                "step_time_alone_s": self.step_time_alone_s,
                "step_time_shared_s": self.step_time_shared_s, "slowdown": self.slowdown,
                "tokens_per_s_alone": self.tokens_per_step / self.step_time_alone_s,
                "tokens_per_s_shared": self.tokens_per_step / self.step_time_shared_s,
                "settings": self.settings}


@dataclass
class JobsResult:
    cluster: str
    gpus: int
    steps: int
    jobs: list[JobResult]
    busiest_links: list[dict]
    shared_duration_s: float
    events: int
    records: list[Record] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"cluster": self.cluster, "gpus": self.gpus, "steps_measured": self.steps,
                "shared_duration_s": self.shared_duration_s, "events": self.events,
                "jobs": [j.to_dict() for j in self.jobs], "busiest_links": self.busiest_links}


def _simulate(cluster: ClusterSpec, graph, jobs: list[Job], steps: int, trace: bool):
    """Run the jobs together; returns (per-job step-time means in ps, duration ps, network,
    programs, events, records)."""
    env = CountingEnvironment()
    net = Network(env, graph, cluster.nodes, cluster.nodes, cluster.gpus_per_node)
    progs = [_JobPrograms(j, cluster.gpus_per_node) for j in jobs]
    ends: list[list[int]] = [[] for _ in jobs]
    all_done = env.event()
    records: list[Record] = []

    def job_proc(ji: int):
        job, cache = jobs[ji], progs[ji]
        ops = job.plan.ops
        tuning = job.spec.collective
        slow = job.overlap_slowdown
        gate = OverlapGate(env, slow)  # this job's compute vs its own collectives
        # 3D plans: one gate per pipeline stage, as in parosim.evaluate.replay (an op's gates
        # are those of the stages whose GPUs run it)
        keys = job.plan.overlap_gates() if (slow != 1.0
                                            and hasattr(job.plan, "overlap_gates")) else None
        gates = ({k: OverlapGate(env, slow) for ks in keys for k in ks}
                 if keys is not None else {})

        def compute(op: ComputeOp):
            # the fluid overlap slowdown of parosim.evaluate.replay: compute runs at 1/slow of its
            # speed while a collective of the SAME job is in flight (its own GPUs)
            work = to_ps(op.duration_s)
            if slow == 1.0:
                yield env.timeout(work)
                return
            yield from (gates[keys[op.id][0]] if keys is not None else gate).compute(work)

        def flip(i: int, delta: int) -> None:
            for g in ([gates[k] for k in keys[i]] if keys is not None else [gate]):
                g.flip(delta)

        def body(i: int):
            op = ops[i]
            if isinstance(op, ComputeOp):
                yield from compute(op)
            else:
                flip(i, +1)
                # 3D plans coalesce a chunk's TP collectives (count)
                yield from run_counted(env, net, cache.get(op), tuning, getattr(op, "count", 1))
                flip(i, -1)

        it = 0
        while not all_done.triggered:
            lane = (lambda i: f"{job.name}/{ops[i].stream}")
            on_rec = records.append if (trace and it < steps) else None
            kind = (lambda i: ops[i].kind if isinstance(ops[i], ComputeOp) else ops[i].purpose)
            done = run_lanes(env, ops, lane, lambda i: ops[i].deps, lambda i: ops[i].name,
                             body, on_rec, kind)
            yield env.all_of(done)
            ends[ji].append(env.now)
            it += 1
            if all(len(e) >= steps for e in ends) and not all_done.triggered:
                all_done.succeed()

    for ji in range(len(jobs)):
        env.process(job_proc(ji))
    env.run(until=all_done)
    means = [e[steps - 1] / steps for e in ends]
    return means, env.now, net, progs, env.events, records


def _link_usage(net: Network, progs: list[_JobPrograms], duration_ps: int, top: int
                ) -> list[dict]:
    """The ``top`` directed links that held the jobs back: by time as the bottleneck of any
    job's transfer, then utilization over the shared run (:meth:`Network.hot_links`), each
    with the jobs whose flows use it."""
    rows = net.hot_links(duration_ps / PS, top)
    names = net.link_names()
    users: dict[str, set[str]] = {}
    for p in progs:
        for rs in p.ringsets():
            for li in net.flowset(rs).links:
                users.setdefault(names[int(li)], set()).add(p.job.name)
    for r in rows:
        r.pop("orbit", None)  # no symmetry reduction here: every orbit is one link
        r["jobs"] = sorted(users.get(r["link"], ()))
    return rows


def run_jobs(cluster: ClusterSpec, jobs: list[Job], steps: int = 2, trace: bool = False,
             top_links: int = 5) -> JobsResult:
    """Each job alone, then all together on one network; see the module docstring."""
    if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= 100:
        raise InputError(f"steps = {steps!r} must be an integer in 1..100")
    check_placement(cluster, jobs)
    graph = cluster_graph(cluster)
    alone = [_simulate(cluster, graph, [j], 1, False)[0][0] for j in jobs]
    shared, dur, net, progs, events, records = _simulate(cluster, graph, jobs, steps, trace)
    res = [JobResult(j.name, j.model, j.strategy.name, j.algo.value, j.nodes, j.gpus,
                     j.plan.tokens_per_step, a / PS, s / PS, j.runtime, j.settings)
           for j, a, s in zip(jobs, alone, shared, strict=True)]
    return JobsResult(cluster.name, cluster.gpus, steps, res,
                      _link_usage(net, progs, dur, top_links), dur / PS, events, records)

def _int(v: Any, where: str, low: int = 1) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < low:
        raise InputError(f"{where} = {v!r} must be an integer >= {low}")
    return v


# TrainingSpec field names -> the jobs file's keys
_FIELDS = {"compute_efficiency": "efficiency", "accum_steps": "accum",
           "trainable ratio": "trainable_ratio"}


def _training(TrainingSpec, p: dict, eff, recompute, parse_trainable_ratio, default_eff,
              jw: str):
    return TrainingSpec(
        micro_batch=_int(p["micro_batch"], f"{jw}: micro_batch"),
        accum_steps=_int(p["accum"], f"{jw}: accum"),
        seq_len=_int(p["seq_len"], f"{jw}: seq_len"),
        trainable_ratio=parse_trainable_ratio(p["trainable_ratio"]),
        recompute=recompute,
        compute_efficiency=default_eff if eff is None else eff,
        overlap_slowdown=p["overlap_slowdown"], compute_model=p["compute_model"],
        attention=p["attention"], memory_model=p["memory_model"],
        logit_bytes=p["logit_bytes"], precision=p["precision"])


# the JSON / Python spellings of a job's keys -> the canonical ones (as simulate's flags)
_KEY_ALIASES = {"accum_steps": "accum", "compute_efficiency": "efficiency"}


def _canonical_keys(j: dict, jw: str) -> dict:
    """``accum_steps`` / ``compute_efficiency`` (the JSON names) read as ``accum`` /
    ``efficiency``; both spellings of one key are refused."""
    out = dict(j)
    for alias, key in _KEY_ALIASES.items():
        if alias in out:
            if key in out:
                raise InputError(f"{jw}: {alias} and {key} are the same setting; expected "
                                 f"one of them ({key})")
            out[key] = out.pop(alias)
    return out


def load_jobs(path: str | Path):
    """(cluster spec, list of :class:`Job`, steps) from a jobs YAML (its format:
    :mod:`parosim.io.jobs`)."""
    where = f"jobs file {str(path)!r}"
    data = read_yaml(path, "jobs")
    check_keys(data, TOP_KEYS, where)
    if "cluster" not in data:
        raise InputError(f"{where}: missing required key 'cluster'")
    nodes = data.get("nodes")
    if nodes is not None:
        _int(nodes, f"{where}: nodes")
    cluster = load_cluster(data["cluster"], nodes)
    cluster = with_overrides(
        cluster,
        parse_bandwidth(data["nic_bandwidth"], "nic_bandwidth") if "nic_bandwidth" in data
        else None,
        parse_bandwidth(data["intra_bandwidth"], "intra_bandwidth")
        if "intra_bandwidth" in data else None,
        parse_size(data["gpu_memory"], "gpu_memory") if "gpu_memory" in data else None)
    steps = _int(data.get("steps", 2), f"{where}: steps")
    raw = data.get("jobs")
    if not isinstance(raw, list) or not raw:
        raise InputError(f"{where}: 'jobs' must be a non-empty list of jobs, got {raw!r}")
    jobs = []
    for i, j in enumerate(raw):
        if not isinstance(j, dict):
            raise InputError(f"{where}: job {i} must be a mapping, got {j!r}")
        jw = f"{where}: job {j.get('name', i)!r}"
        j = _canonical_keys(j, jw)
        check_keys(j, JOB_KEYS, jw)
        for req in ("name", "nodes"):
            if req not in j:
                raise InputError(f"{jw}: missing required key {req!r}")
        nd = j["nodes"]
        if not isinstance(nd, list) or not nd:
            raise InputError(f"{jw}: nodes = {nd!r} must be a non-empty list of node indices")
        for n in nd:
            _int(n, f"{jw}: node", low=0)
        p = {**JOB_DEFAULTS, **j}
        rc = p["recompute"]
        recompute = {"auto": None, "on": True, "off": False, True: True, False: False}.get(rc)
        if recompute is None and rc != "auto":
            raise InputError(f"{jw}: recompute = {rc!r} is not known; expected auto, on or off")
        eff = p["efficiency"]
        try:
            training = _training(TrainingSpec, p, eff, recompute, parse_trainable_ratio,
                                 DEFAULT_COMPUTE_EFFICIENCY, jw)
        except InputError as e:   # name the jobs file's field, never a simulate flag
            msg = str(e)
            for field_name, key in _FIELDS.items():
                if msg.startswith(field_name + " "):
                    msg = key + msg[len(field_name):]
            raise InputError(msg if msg.startswith(jw) else f"{jw}: {msg}") from None
        rt = load_runtime(p["runtime"] or "ideal")
        algo = p["algo"] or "ho-ring"
        if check_fidelity(p["fidelity"], f"{jw}: fidelity") == "accurate":
            # simulate's accurate models for what the job leaves unset (its own defaults
            # of attention and memory model are the paper fidelity's)
            own = {k: j.get(k) for k in ("attention", "memory_model")}
            if eff is not None:   # an efficiency is the flat model's: it selects it
                if j.get("compute_model") == "kernel":
                    raise InputError(f"{jw}: efficiency {eff!r} applies to the flat compute "
                                     "model; got compute_model kernel; expected one of them")
                own["compute_model"] = "flat"
            training = for_fidelity(replace(training, **own), "accurate", rt,
                                    layered=(p["tp"] != 1 or p["pp"] != 1
                                             or bool(p["sequence_parallel"])),
                                    cluster=cluster)
            algo = p["algo"] or "nccl"
        if rt.collective_algo is not None and p["algo"] is not None:
            raise InputError(f"{jw}: algo {p['algo']} cannot apply: runtime {rt.name} fixes "
                             f"each collective's algorithm ({rt.collective_algo}); expected "
                             "no algo, or runtime ideal")
        par = ParallelSpec(tp=_int(p["tp"], f"{jw}: tp"), pp=_int(p["pp"], f"{jw}: pp"),
                           schedule=str(p["pp_schedule"]).strip().lower(),
                           virtual=p["virtual_stages"],
                           sequence_parallel=bool(p["sequence_parallel"]))
        jobs.append(make_job(str(p["name"]), load_model(p["model"]), p["strategy"], cluster,
                             nd, training, algo,
                             _int(p["group_nodes"], f"{jw}: group_nodes"), rt,
                             None if par.trivial else par))
    return cluster, jobs, steps
