"""3D parallelism (TP x PP x CP x DP with PaRO on the DP group): the Plan of one step.

The layout (ranks, groups, their lowering) is :mod:`parosim.plan.layout`; the per-unit costs
and collectives :mod:`parosim.plan.threed_parts`; the memory model :mod:`parosim.plan.memory3d`;
the closed form and the pipeline-phase metrics :mod:`parosim.evaluate.threed`. Formulas and
sources: ``docs/tensor-pipeline.md``.

Per pipeline stage k (streams ``compute/s{k}``, ``comm-param/s{k}``, ``comm-grad/s{k}``,
``p2p-fwd/s{k}``, ``p2p-bwd/s{k}``):

* **Units.** The L layers are cut into p·v chunks of L/(p·v) layers (v = 1 for 1F1B); chunk
  c of stage k is virtual stage c·p + k. The token embedding sits on virtual stage 0 (stage 0),
  the final norm + LM head on the last (stage p-1) (Megatron-LM's placement). Every unit's
  weights are split by t (Megatron column/row split; the vocabulary-parallel embedding and
  head split the vocabulary); norm weights, replicated in Megatron, are counted split too
  (< 0.01 % of the parameters). A tied embedding with p > 1 is held twice, on the first and
  the last stage (Megatron's copy; the all-reduce of its gradient between the two stages,
  once per step, is not modelled).
* **Compute** per unit and micro-batch: the FLOPs of :mod:`parosim.cost.compute` divided by t, at
  the same efficiency (flat model), or the kernels of :mod:`parosim.cost.kernels` on the rank's
  shard (``--compute-model kernel``: :func:`unit_seconds`). Full recomputation adds one
  layer forward before each backward;
  selective recomputation (attention core only, Korthikanti et al. 2022 §5) adds the
  attention's QKᵀ/AV FLOPs (:func:`recompute_flops`; kernel model: the attention forward's
  kernels).
* **TP collectives** (full buffer 2·s·b·h bytes, bf16), on the compute stream (blocking, as in
  Megatron): per layer 2 all-reduces in forward and 2 in backward (f and g of Shoeybi et al.
  2019), again 2 in the recomputed forward; the embedding's forward output 1 all-reduce; the
  LM head's backward input gradient 1 all-reduce. With sequence parallelism each all-reduce
  becomes an all-gather + a reduce-scatter of the same buffer (Korthikanti §4.2.2).
* **Pipeline**: 1F1B (warm-up p-k-1 forwards on stage k, then one forward / one backward,
  then the cool-down) or Megatron's interleaved schedule (warm-up 2(p-k-1) + (v-1)p chunk
  forwards; needs m divisible by p). After a chunk's forward its output activation
  (2·s·b·h/t bytes per rank: Megatron's scatter/gather optimisation, or the
  sequence-parallel shard) goes point-to-point to the next stage on ``p2p-fwd/s{k}``; without
  sequence parallelism the receiving TP group all-gathers it (2·s·b·h). Gradients go back the
  same way on ``p2p-bwd/s{k}``. Those transfers are flows on the cluster graph: they contend.
* **DP with PaRO**: exactly :mod:`parosim.plan`'s rules applied to the stage's units and its
  DP groups (n -> d, m -> m_dp, sizes /t): parameter all-gathers before each use for p = I/G
  (prefetched one unit ahead), gradient reduce-scatters after each backward for g = I/G, and
  at the boundary the gradient sync, the optimizer step and the parameter sync, per stage.
  With ``dp_comm_overlap`` (Megatron-Core's DDP buckets, NNN / NNI / NNG) those syncs run per
  bucket beside the last micro-batch's backward and the first one's forward instead
  (:func:`dp_buckets`, docs/parallelism.md "DP communication overlap").

With p = N and g = N a chunk's forward (backward) is one compute op and one TP op per
collective kind with a ``count`` (the engine moves count x the bytes and pays count x the
latency): the same time as the per-layer ops when nothing else shares the links, and far fewer
ops. Otherwise ops are per unit, as in :mod:`parosim.plan`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ..collectives.types import Algo, Op, Scope
from ..cost.compute import (
    compute_seconds,
    step_flops,
)
from ..errors import InputError
from ..io.runtime import as_runtime
from ..spec.model import ModelSpec
from ..spec.strategy import Level, Strategy, parse_strategy
from ..spec.system import ClusterSpec
from ..spec.training import (
    BYTES_PER_GRAD,
    BYTES_PER_PARAM,
    TrainingSpec,
)
from .builder import (
    COMM_GRAD,
    LEVEL_SCOPE,
    SYNC_GRAD,
    SYNC_PARAM,
    Builder,
    ComputeOp,
    GroupOp,
    Plan,
    boundary,
    chunk_units,
    resolve_recompute,
)
from .hybrid import hybrid_3d, owner_param_sync
from .layout import (
    Layout,
    PairSet,
    ParallelSpec,
    layout_for,
)
from .memory3d import (  # noqa: F401  (re-exported: the 3D memory model and its helpers)
    UB_BUFFERS,
    UB_FP8_BUFFERS,
    UB_PIPELINE_SPLITS,
    StageMemory,
    check_cp,
    cp_kv_bytes,
    cp_local,
    in_flight,
    is_fp8,
    layer_activation_bytes_3d,
    max_micro_batch_3d,
    memory_3d,
    resolve_recompute_3d,
    stage_fp8_params,
    stage_memory_3d,
    stage_params,
    userbuffer_bytes,
)
from .threed_parts import (
    check_dp_overlap,
    cp_attention_step,
    cp_pairs,
    dp_buckets,
    optimizer_seconds_3d,
    recompute_flops,
    tp_buffer_bytes,
    tp_collectives,
    tp_overlap_pairs,
    unit_flops,
    unit_seconds,
)


@dataclass(frozen=True)
class Plan3D(Plan):
    """A Plan of a TP x PP x DP job. ``group_size`` is m_dp (DP ranks per PaRO group);
    ``accum_steps`` is m, the micro-batches per step per DP replica."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    schedule: str = "1f1b"
    virtual: int = 1
    sequence_parallel: bool = False
    selective_recompute: bool = False
    tp_comm_overlap: bool = False
    cp: int = 1          # context parallelism (``dp`` then counts DP x CP ranks)
    hardware_flops_per_gpu: float = 0.0
    stage_params: tuple[float, ...] = field(default=())
    # DP communication overlap (:func:`dp_chains`): per stage, the bucket chain of the last
    # backward; per virtual stage, the buckets of the first forward (op ids of the busy time,
    # op ids of the bucket's collectives)
    dp_grad_chains: tuple = field(default=())
    dp_param_chains: tuple = field(default=())

    @property
    def groups(self) -> int:
        return self.dp // self.group_size

    def layout(self, spec: ClusterSpec) -> Layout:
        """The :class:`~parosim.plan.layout.Layout` of this plan on ``spec``."""
        return layout_for(spec, self.tp, self.pp)

    def overlap_gates(self) -> tuple[tuple[int, ...], ...]:
        """Per op, the pipeline stages whose GPUs run it: the engine's overlap-interference
        gates (:func:`parosim.evaluate.replay.replay`). A compute op on ``compute/s{k}`` runs on
        every GPU of stage k; a collective involves the stages of its participating ranks
        (a TP or DP collective: its own stage; a point-to-point transfer: both ends). Ranks
        are ``tp + t·(dp + d·stage)`` (:class:`parosim.plan.layout.Layout`), so a rank's stage
        is ``rank // (t·d)``. Compute slows only while a collective of its own stage is in
        flight: collectives of other stages run on other GPUs."""
        per = self.tp * self.dp
        out = []
        for op in self.ops:
            if isinstance(op, GroupOp):
                sc = op.scopes
                rings = sc.rings if isinstance(sc, PairSet) else sc.glob.rings
                out.append(tuple(sorted({r // per for ring in rings for r in ring})))
            else:
                out.append((int(op.stream.rsplit("/s", 1)[1]),))
        return tuple(out)


def schedule_order(stage: int, par: ParallelSpec, m: int) -> list[tuple[str, int, int]]:
    """(``"F"``/``"B"``, virtual stage, micro-batch) in the order stage ``stage`` runs them.

    >>> [f"{a}{i}" for a, _, i in schedule_order(0, ParallelSpec(pp=3), 4)]
    ['F0', 'F1', 'F2', 'B0', 'F3', 'B1', 'B2', 'B3']
    """
    p, v = par.pp, par.virtual
    total = m * v
    if v == 1:
        warm = min(p - stage - 1, m)
    else:
        if m % p:
            raise InputError(f"the interleaved schedule needs the micro-batches per step "
                             f"(--accum = {m}) to be a multiple of --pp {p}")
        warm = min((p - stage - 1) * 2 + (v - 1) * p, total)

    def unit(u: int, backward: bool) -> tuple[int, int]:
        c = (u // p) % v
        if backward:
            c = v - 1 - c
        return c * p + stage, (u // (p * v)) * p + u % p if v > 1 else u

    order = [("F", *unit(u, False)) for u in range(warm)]
    for j in range(total - warm):
        order.append(("F", *unit(warm + j, False)))
        order.append(("B", *unit(j, True)))
    order += [("B", *unit(u, True)) for u in range(total - warm, total)]
    return order


def build_plan_3d(model: ModelSpec, strategy: Strategy | str, cluster: ClusterSpec,
                  training: TrainingSpec, par: ParallelSpec, runtime=None) -> Plan3D:
    """The op list of one global step of a TP x PP x DP job (module docstring).

    ``training.micro_batch`` is per DP replica and ``training.accum_steps`` is m, the
    micro-batches each replica's pipeline runs per step. ``runtime``: a
    :class:`parosim.spec.runtime.RuntimeSpec` (:func:`check_runtime_3d`): its boundary buckets and
    per-call algorithm; None = ideal.
    """

    rt = as_runtime(runtime)
    strategy = parse_strategy(strategy)
    check_runtime_3d(rt, strategy, par)
    check_cp(cluster, training, par)
    orig, training = training, cp_local(training, par)   # one CP rank: s/cp tokens
    lay = layout_for(cluster, par.tp, par.pp)
    p, t, v = par.pp, par.tp, par.virtual
    m = training.accum_steps
    r = training.trainable_ratio
    sp = par.sequence_parallel
    recompute = resolve_recompute(model, strategy, cluster, training, par=par)
    rc_flops = recompute_flops(model, training, recompute, par.selective_recompute)
    units = chunk_units(model, par)
    last_vs = len(units) - 1
    ks = unit_seconds(model, cluster, training, par, recompute)   # None: flat model
    b = Builder(runtime=rt)
    tp_size = tp_buffer_bytes(model, training)
    msg = tp_size / t                    # p2p bytes per rank (scatter/gather or SP shard)
    tp_algo = par.tp_algo if t > cluster.gpus_per_node else Algo.RING
    coalesce = strategy.p is Level.N and strategy.g is Level.N
    done: list[list[int]] = [[] for _ in range(p)]
    sent: dict[tuple[str, int, int], int] = {}
    ovl = par.tp_comm_overlap
    pairs = ({ph: tp_overlap_pairs(model, cluster, training, par, ph)
              for ph in ("fwd", "bwd", "recompute")} if ovl else {})
    check_dp_overlap(strategy, par)
    dpo = par.dp_comm_overlap
    buckets = dp_buckets(model, par, lay.d) if dpo else []
    psync = SYNC_PARAM.get((strategy.os, strategy.p), ()) if dpo else ()
    gsync = SYNC_GRAD[(strategy.g, strategy.os)] if dpo else ()
    # first-use order of a stage's buckets (forward: chunk by chunk, last bucket first)
    use_order = [[(vs, bi) for vs in range(k, len(units), p)
                  for bi in range(len(buckets[vs]) - 1, -1, -1)] if dpo else []
                 for k in range(p)]
    gathers: dict[tuple[int, int], int | None] = {}
    gchain: dict[tuple[int, int], tuple] = {}
    pchain: dict[tuple[int, int], tuple] = {}
    # InternLM's hybrid ZeRO with TP (pp = 1, plan.hybrid): the previous step's per-owner
    # broadcasts open the step (the first forward waits per unit), the gradients of the last
    # backward are all-reduced over the DP group in the runtime's buckets
    hyb = not rt.is_ideal and hybrid_3d(strategy, rt)
    waits = (owner_param_sync(b, model, units[0], strategy, r, [], BYTES_PER_PARAM, tp=t,
                              stage=0, scopes=lay.dp_scopes(0)) if hyb else None)
    cap = BYTES_PER_GRAD * rt.grad_bucket_elements if hyb and rt.grad_bucket_elements else None
    bucket = [0.0, 0]      # hybrid: gradient bytes waiting in the open bucket, buckets issued

    def hybrid_reduce(k: int, u, cid: int) -> None:
        """The last backward's bucketed all-reduce once unit u's gradients are final."""
        bucket[0] += BYTES_PER_GRAD * u.params * r / t
        sizes = []
        while cap is not None and bucket[0] >= cap:
            sizes.append(cap)
            bucket[0] -= cap
        if (cap is None or u.kind == "embed") and bucket[0] > 0:   # end of backward: flush
            sizes.append(bucket[0])
            bucket[0] = 0.0
        for size in sizes:
            b.collective(f"ar-grad bucket{bucket[1]}", Op.ALL_REDUCE, Scope.GLOBAL, size,
                         "grad-reduce", None, m - 1, f"{COMM_GRAD}/s{k}", [cid], stage=k,
                         group="dp", scopes=lay.dp_scopes(k))
            bucket[1] += 1

    def secs(f: float, kinds=(), phase: str = "fwd") -> float:
        """Flat: FLOPs at the efficiency; kernel: the kernel times of these unit kinds."""
        if ks is None:
            return compute_seconds(f, cluster, training)
        return sum(ks[(kd, phase)] for kd in kinds)

    tp_counts: dict[tuple, dict[Op, int]] = {}   # per (unit kinds, phase): the same each time
    unit_f: dict[tuple, float] = {}   # FLOPs per (unit kind, phase) and per (chunk, phase)

    def uflops(kind: str, phase: str) -> float:
        """unit_flops of one unit (the layers are identical: computed once)."""
        f = unit_f.get((kind, phase))
        if f is None:
            f = unit_f[(kind, phase)] = unit_flops(model, training, kind, phase)
        return f

    def chunk_flops(vs: int, phase: str) -> float:
        """FLOPs of chunk ``vs``'s units, summed in unit order, once per chunk."""
        f = unit_f.get((vs, phase))
        if f is None:
            f = unit_f[(vs, phase)] = sum(uflops(u.kind, phase) for u in units[vs])
        return f

    def tp_ops(k: int, kinds: list[str], phase: str, mb: int, label: str) -> None:
        counts = tp_counts.get((tuple(kinds), phase))
        if counts is None:
            counts = tp_counts[(tuple(kinds), phase)] = {}
            for kind in kinds:
                if ovl and kind == "layer":   # overlapped: overlap_ops
                    continue
                for op, c in tp_collectives(kind, phase, sp):
                    counts[op] = counts.get(op, 0) + c
        for op, c in counts.items():
            b.collective(f"tp {op.value} {phase} {label} mb{mb}", op, Scope.GLOBAL, tp_size, "tp",
                   None, mb, f"compute/s{k}", [], stage=k, group="tp",
                   scopes=lay.tp_scopes(k), count=c, algo=tp_algo)

    cpp = {ph: cp_pairs(model, cluster, training, par, ks, ph)
           for ph in ("fwd", "bwd", "recompute")}
    cp_bwd = cp_attention_step(model, cluster, training, par, ks) if par.cp > 1 else None

    def rest(phase: str, n: int, f: float, sec: float) -> tuple[float, float]:
        """FLOPs and seconds of a compute op once its n layers' overlapped GEMMs are split
        off (TP communication overlap; unchanged without it), and with context parallelism
        the layers' attention backward (its cp steps are ops of their own: cp_ops)."""
        if cp_bwd is not None and phase == "bwd" and n:
            f, sec = f - n * cp_bwd[3], sec - n * cp_bwd[1]
        if not ovl or n == 0:
            return f, sec
        return (max(0.0, f - n * sum(pr.gemm_flops for pr in pairs[phase])),
                max(0.0, sec - n * sum(pr.gemm_s for pr in pairs[phase])))

    def cp_ops(k: int, phase: str, mb: int, label: str, n: int, kind: str) -> None:
        """Context parallelism: per ring step type of n layers, the attention steps on the
        compute stream beside the K/V (dK/dV) ring transfers on ``tp-ovl/s{k}`` (both start
        together, as the TP overlap pairs), then a zero-length wait for the transfers."""
        if par.cp == 1 or n == 0 or (phase == "recompute" and not rc_flops):
            return
        cs = f"compute/s{k}"
        for i, (sec, fl, size, c) in enumerate(cpp[phase]):
            pre = b.last[cs]
            gid = b.compute(f"{kind} cp-attn{i} {label} mb{mb}", kind, None, mb, n * c * fl,
                            n * c * sec, [], cs)
            cid = b.collective(f"cp ring{i} {phase} {label} mb{mb}", Op.ALL_GATHER, Scope.GLOBAL,
                         size, "cp-ring", None, mb, f"tp-ovl/s{k}", [pre], stage=k,
                         group="p2p", scopes=lay.cp_ring(k, par.cp), count=n * c, pair=gid)
            b.compute(f"cp wait{i} {label} mb{mb}", "cp-wait", None, mb, 0.0, 0.0, [cid], cs)

    def overlap_ops(k: int, phase: str, mb: int, label: str, n: int, kind: str) -> None:
        """TP communication overlap: per overlapped collective of n layers, its GEMM on the
        compute stream beside the collective on ``tp-ovl/s{k}`` (both start together; the
        engine's overlap gate slows the GEMM while it runs), then the exposed chunk on the
        compute stream after both (bulk: a zero-length wait for the collective)."""
        if not ovl or n == 0:
            return
        cs = f"compute/s{k}"
        for pr in pairs[phase]:
            pre = b.last[cs]
            gid = b.compute(f"{kind} {pr.name} {label} mb{mb}", kind, None, mb,
                            n * pr.gemm_flops, n * pr.gemm_s, [], cs)
            size = tp_size * pr.size_scale
            cid = b.collective(f"tp {pr.op.value} {pr.name} {label} mb{mb}", pr.op, Scope.GLOBAL,
                         size, "tp-overlap", None, mb, f"tp-ovl/s{k}", [pre], stage=k,
                         group="tp", scopes=lay.tp_scopes(k), count=n, algo=tp_algo, pair=gid)
            if pr.chunks:
                b.collective(f"tp {pr.op.value} chunk {pr.name} {label} mb{mb}", pr.op,
                       Scope.GLOBAL, size / pr.chunks, "tp-chunk", None, mb, cs, [cid],
                       stage=k, group="tp", scopes=lay.tp_scopes(k), count=n, algo=tp_algo)
            else:
                b.compute(f"tp-overlap wait {pr.name} {label} mb{mb}", "tp-wait", None, mb,
                          0.0, 0.0, [cid], cs)

    def gather(k: int, u, phase: str, mb: int) -> int | None:
        if strategy.p is Level.N:
            return None
        d = done[k]
        return b.collective(f"ag-param {phase} {u.label} mb{mb}", Op.ALL_GATHER,
                      LEVEL_SCOPE[strategy.p], BYTES_PER_PARAM * u.params / t,
                      "param-gather", None, mb, f"comm-param/s{k}",
                      [d[-2] if len(d) >= 2 else None], stage=k, group="dp",
                      scopes=lay.dp_scopes(k))

    def bucket_sync(k: int, key: tuple[int, int], table, purpose: str, stream: str,
                    deps) -> list[int]:
        """The DP collectives of one bucket (DP communication overlap), chained."""
        vs, bi = key
        trainable = sum(units[vs][i].params for i in buckets[vs][bi]) * r / t
        full = BYTES_PER_GRAD * trainable
        sizes = {"full": full, "shard": full / lay.m_dp}
        ids = []
        for op, scope, size in table:
            cid = b.collective(f"{purpose} {op.value} {scope.value} c{vs} b{bi}", op, scope,
                         sizes[size], purpose, None, None, f"{stream}/s{k}", deps, stage=k,
                         group="dp", scopes=lay.dp_scopes(k))
            if cid is not None:
                ids.append(cid)
                deps = [cid]
        return ids

    def window(k: int, n0: int) -> tuple[int, ...]:
        """Ids of stage k's busy ops (compute stream and TP overlap) emitted since n0."""
        return tuple(o.id for o in b.ops[n0:]
                     if o.stream in (f"compute/s{k}", f"tp-ovl/s{k}"))

    def forward_buckets(k: int, vs: int, mb: int, dep0) -> None:
        """First micro-batch with DP communication overlap: bucket by bucket, each waiting
        for its parameter all-gather; the stage's gathers all start at the step's start,
        back to back in the order of use (Megatron's aligned launch)."""
        cs = f"compute/s{k}"
        if not any(key in gathers for key in use_order[k]):
            for key in use_order[k]:
                gathers[key] = bucket_sync(k, key, psync, "param-bucket", "comm-param", [])
        for bi in range(len(buckets[vs]) - 1, -1, -1):
            us = [units[vs][i] for i in reversed(buckets[vs][bi])]
            first = dep0 if bi == len(buckets[vs]) - 1 else None
            g = gathers[(vs, bi)]
            n0 = len(b.ops)
            kinds = [u.kind for u in us]
            f = sum(uflops(u.kind, "fwd") for u in us) / t
            nl = kinds.count("layer")
            f_r, s_r = rest("fwd", nl, f, secs(f, kinds))
            b.compute(f"fwd c{vs} b{bi} mb{mb}", "fwd", None, mb, f_r, s_r,
                      [first, g[-1] if g else None], cs)
            overlap_ops(k, "fwd", mb, f"c{vs}b{bi}", nl, "fwd")
            cp_ops(k, "fwd", mb, f"c{vs}b{bi}", nl, "fwd")
            done[k].append(b.last[cs])
            tp_ops(k, kinds, "fwd", mb, f"c{vs}b{bi}")
            pchain[(vs, bi)] = (window(k, n0), tuple(g))

    def backward_buckets(k: int, vs: int, mb: int, dep0) -> None:
        """Last micro-batch with DP communication overlap: bucket by bucket, each bucket's
        gradient reduction issued on ``comm-grad/s{k}`` as soon as its backward ends."""
        cs = f"compute/s{k}"
        first = [dep0]
        for bi, bucket in enumerate(buckets[vs]):
            us = [units[vs][i] for i in bucket]
            kinds = [u.kind for u in us]
            layers = [kd for kd in kinds if kd == "layer"]
            nl = len(layers)
            n0 = len(b.ops)
            if rc_flops and nl:
                f = nl * rc_flops / t
                s_rc = secs(f, layers, "recompute")
                if recompute:
                    f, s_rc = rest("recompute", nl, f, s_rc)
                b.compute(f"recompute c{vs} b{bi} mb{mb}", "recompute", None, mb, f, s_rc,
                          first, cs)
                if recompute:
                    overlap_ops(k, "recompute", mb, f"c{vs}b{bi}", nl, "recompute")
                    tp_ops(k, kinds, "recompute", mb, f"c{vs}b{bi}")
                cp_ops(k, "recompute", mb, f"c{vs}b{bi}", nl, "recompute")
                first = []
            f = sum(uflops(u.kind, "bwd") for u in us) / t
            f_r, s_r = rest("bwd", nl, f, secs(f, kinds, "bwd"))
            b.compute(f"bwd c{vs} b{bi} mb{mb}", "bwd", None, mb, f_r, s_r, first, cs)
            first = []
            overlap_ops(k, "bwd", mb, f"c{vs}b{bi}", nl, "bwd")
            cp_ops(k, "bwd", mb, f"c{vs}b{bi}", nl, "bwd")
            done[k].append(b.last[cs])
            tp_ops(k, kinds, "bwd", mb, f"c{vs}b{bi}")
            ids = window(k, n0)
            gchain[(vs, bi)] = (ids, tuple(bucket_sync(k, (vs, bi), gsync, "grad-bucket",
                                                       "comm-grad", [b.last[cs]])))

    def forward(k: int, vs: int, mb: int) -> None:
        us = units[vs]
        dep0 = sent.get(("F", vs - 1, mb))
        cs = f"compute/s{k}"
        if dpo and psync and mb == 0:
            forward_buckets(k, vs, mb, dep0)
        elif coalesce and not (waits is not None and mb == 0):
            f = chunk_flops(vs, "fwd") / t
            nl = sum(u.kind == "layer" for u in us)
            f_r, s_r = rest("fwd", nl, f, secs(f, [u.kind for u in us]))
            b.compute(f"fwd c{vs} mb{mb}", "fwd", None, mb, f_r, s_r, [dep0], cs)
            overlap_ops(k, "fwd", mb, f"c{vs}", nl, "fwd")
            cp_ops(k, "fwd", mb, f"c{vs}", nl, "fwd")
            done[k].append(b.last[cs])
            tp_ops(k, [u.kind for u in us], "fwd", mb, f"c{vs}")
        else:
            for j, u in enumerate(us):
                g = gather(k, u, "fwd", mb)
                f = uflops(u.kind, "fwd") / t
                kind = {"layer": "fwd", "head": "head-fwd", "embed": "embed-fwd"}[u.kind]
                nl = int(u.kind == "layer")
                f_r, s_r = rest("fwd", nl, f, secs(f, [u.kind]))
                w = waits[j] if waits is not None and mb == 0 else None
                b.compute(f"fwd {u.label} mb{mb}", kind, None, mb, f_r, s_r,
                          [g, dep0 if j == 0 else None, w], cs)
                overlap_ops(k, "fwd", mb, u.label, nl, kind)
                cp_ops(k, "fwd", mb, u.label, nl, kind)
                done[k].append(b.last[cs])
                tp_ops(k, [u.kind], "fwd", mb, u.label)
        if vs < last_vs:
            send(k, vs, vs + 1, mb, "F", "act", "fwd", b.last[cs])

    def send(k: int, vs: int, to_vs: int, mb: int, key: str, what: str, way: str,
             after) -> None:
        """Chunk ``vs``'s activation (forward) or gradient (backward) to the stage of chunk
        ``to_vs``: a pipeline send, then (TP without SP) the receivers' all-gather."""
        peer = to_vs % p
        sid = b.collective(f"send {what} c{vs} mb{mb}", Op.ALL_GATHER, Scope.GLOBAL, msg,
                     f"p2p-{what}", None, mb, f"p2p-{way}/s{k}", [after], stage=k,
                     group="p2p", scopes=lay.pairs(k, peer))
        if not sp and t > 1:
            sid = b.collective(f"tp all-gather {what} c{to_vs} mb{mb}", Op.ALL_GATHER,
                         Scope.GLOBAL, tp_size, "tp", None, mb, f"p2p-{way}/s{k}", [sid],
                         stage=peer, group="tp", scopes=lay.tp_scopes(peer), algo=tp_algo)
        sent[(key, vs, mb)] = sid if sid is not None else after

    def backward(k: int, vs: int, mb: int) -> None:
        us = units[vs]
        dep0 = sent.get(("B", vs + 1, mb))
        cs = f"compute/s{k}"
        if dpo and mb == m - 1:
            backward_buckets(k, vs, mb, dep0)
        elif coalesce and not (hyb and mb == m - 1):
            first = [dep0]
            nl = sum(u.kind == "layer" for u in us)
            if rc_flops:
                f = sum(rc_flops for u in us if u.kind == "layer") / t
                s_rc = secs(f, [u.kind for u in us if u.kind == "layer"], "recompute")
                if recompute:
                    f, s_rc = rest("recompute", nl, f, s_rc)
                b.compute(f"recompute c{vs} mb{mb}", "recompute", None, mb, f, s_rc, first,
                          cs)
                if recompute:
                    overlap_ops(k, "recompute", mb, f"c{vs}", nl, "recompute")
                    tp_ops(k, [u.kind for u in us], "recompute", mb, f"c{vs}")
                cp_ops(k, "recompute", mb, f"c{vs}", nl, "recompute")
                first = []
            f = chunk_flops(vs, "bwd") / t
            f_r, s_r = rest("bwd", nl, f, secs(f, [u.kind for u in us], "bwd"))
            b.compute(f"bwd c{vs} mb{mb}", "bwd", None, mb, f_r, s_r, first, cs)
            overlap_ops(k, "bwd", mb, f"c{vs}", nl, "bwd")
            cp_ops(k, "bwd", mb, f"c{vs}", nl, "bwd")
            done[k].append(b.last[cs])
            tp_ops(k, [u.kind for u in us], "bwd", mb, f"c{vs}")
        else:
            for j, u in enumerate(reversed(us)):
                g = gather(k, u, "bwd", mb)
                first = [dep0] if j == 0 else []
                nl = int(u.kind == "layer")
                if rc_flops and u.kind == "layer":
                    f = rc_flops / t
                    s_rc = secs(f, ["layer"], "recompute")
                    if recompute:
                        f, s_rc = rest("recompute", nl, f, s_rc)
                    b.compute(f"recompute {u.label} mb{mb}", "recompute", None, mb, f, s_rc,
                              [g, *first], cs)
                    if recompute:
                        overlap_ops(k, "recompute", mb, u.label, nl, "recompute")
                        tp_ops(k, ["layer"], "recompute", mb, u.label)
                    cp_ops(k, "recompute", mb, u.label, nl, "recompute")
                    first = []
                f = uflops(u.kind, "bwd") / t
                kind = {"layer": "bwd", "head": "head-bwd", "embed": "embed-bwd"}[u.kind]
                f_r, s_r = rest("bwd", nl, f, secs(f, [u.kind], "bwd"))
                b.compute(f"bwd {u.label} mb{mb}", kind, None, mb, f_r, s_r, [g, *first], cs)
                overlap_ops(k, "bwd", mb, u.label, nl, kind)
                cp_ops(k, "bwd", mb, u.label, nl, kind)
                cid = b.last[cs]
                done[k].append(cid)
                tp_ops(k, [u.kind], "bwd", mb, u.label)
                if hyb and mb == m - 1:
                    hybrid_reduce(k, u, cid)
                if strategy.g is not Level.N:
                    b.collective(f"rs-grad {u.label} mb{mb}", Op.REDUCE_SCATTER,
                           LEVEL_SCOPE[strategy.g], BYTES_PER_GRAD * u.params * r / t,
                           "grad-reduce", None, mb, f"comm-grad/s{k}", [cid], stage=k,
                           group="dp", scopes=lay.dp_scopes(k))
        if vs > 0:
            send(k, vs, vs - 1, mb, "B", "grad", "bwd", b.last[cs])

    orders = [schedule_order(k, par, m) for k in range(p)]
    ptr = [0] * p
    while any(ptr[k] < len(orders[k]) for k in range(p)):
        progressed = False
        for k in range(p):
            while ptr[k] < len(orders[k]):
                what, vs, mb = orders[k][ptr[k]]
                if what == "F" and vs > 0 and ("F", vs - 1, mb) not in sent:
                    break
                if what == "B" and vs < last_vs and ("B", vs + 1, mb) not in sent:
                    break
                (forward if what == "F" else backward)(k, vs, mb)
                ptr[k] += 1
                progressed = True
        if not progressed:  # a schedule bug, not an input problem
            raise RuntimeError("pipeline schedule cannot progress: "
                               + ", ".join(f"s{k}: {orders[k][ptr[k]]}" for k in range(p)
                                           if ptr[k] < len(orders[k])))
    sparams = stage_params(model, par)
    fp8p = stage_fp8_params(model, par)
    for k in range(p):
        boundary_3d(b, k, strategy, lay, sparams[k] * r, cluster, training, fp8p[k], dpo, rt)
    gch, pch = dp_chains(p, v, buckets, gchain, pchain) if dpo else ((), ())
    n = cluster.gpus
    tokens = training.micro_batch * training.seq_len * m * lay.d
    hw = sum(o.flops for o in b.ops if isinstance(o, ComputeOp)) / p
    training = orig   # MFU counts the model's FLOPs of the whole sequence
    return Plan3D(ops=tuple(b.ops), strategy=strategy, gpus=n, group_size=lay.m_dp,
                  model=model.name, micro_batch=training.micro_batch, accum_steps=m,
                  seq_len=training.seq_len, trainable_ratio=r, tokens_per_step=tokens,
                  model_flops_per_step=step_flops(model, training, tokens / n),
                  recompute=recompute, tp=t, pp=p, dp=lay.d, schedule=par.schedule,
                  virtual=v, sequence_parallel=sp, cp=par.cp,
                  selective_recompute=par.selective_recompute, tp_comm_overlap=ovl,
                  hardware_flops_per_gpu=hw, runtime=rt.name,
                  engine_only="the gradients are reduced in the last micro-step only" if hyb
                  else "",
                  stage_params=tuple(sparams), dp_grad_chains=gch, dp_param_chains=pch)


def dp_chains(p: int, v: int, buckets, gchain, pchain) -> tuple[tuple, tuple]:
    """Per stage, the gradient chain (chunks in the order of their last backward, the last
    virtual chunk first): entries (busy op ids, collective op ids, scale); with the
    interleaved schedule p - 1 other micro-batches of the next chunk run between two chunks'
    last backwards: an entry of that chunk's pass x (p - 1) with no collective. Per virtual
    stage, the parameter chain: (busy op ids, gather op ids) of its buckets in forward order
    (:func:`parosim.evaluate.threed.param_fill_exposed`; docs/comm-overlap.md)."""
    gch, pch = [], []
    for k in range(p):
        g = []
        for ci, c in enumerate(reversed(range(v))):
            vs = k + c * p
            ents = [gchain[(vs, bi)] for bi in range(len(buckets[vs]))]
            if ci > 0:
                g.append((tuple(i for e in ents for i in e[0]), (), p - 1))
            g += [(e[0], e[1], 1) for e in ents]
        gch.append(tuple(g))
    if pchain:
        for vs in range(len(buckets)):
            pch.append(tuple(pchain[(vs, bi)] for bi in range(len(buckets[vs]) - 1, -1, -1)))
    return tuple(gch), tuple(pch)


def boundary_3d(b: Builder, k: int, strategy: Strategy, lay: Layout, trainable: float,
              cluster: ClusterSpec, training: TrainingSpec, fp8_params: float = 0.0,
              dp_overlap: bool = False, runtime=None) -> None:
    """Per stage: t_sync_g, the optimizer step, t_sync_p (:func:`parosim.plan.builder.boundary`).
    With DP communication overlap the syncs are the buckets' (in the last backward, the
    first forward): only the optimizer step stays here."""
    d_os = strategy.os.divisor(lay.d, lay.m_dp)
    opt_s = optimizer_seconds_3d(trainable, d_os, cluster, training, fp8_params)
    boundary(b, strategy, BYTES_PER_GRAD * trainable, lay.m_dp,
             [b.last.get(f"compute/s{k}"), b.last.get(f"comm-grad/s{k}")], opt_s, runtime,
             stage=k, scopes=lay.dp_scopes(k), syncs=not dp_overlap)


def check_runtime_3d(rt, strategy: Strategy, par: ParallelSpec) -> None:
    """Refuse, with one line, a runtime profile whose schedule has no meaning on the 3D
    planner. A framework profile (DeepSpeed, FSDP, PaRO's fork) shapes the per-micro-step
    parameter gathers and gradient reductions (prefetch, buckets, overlap, persistence): on
    TP / PP layouts parosim models only strategies that have none (parameters and gradients
    whole during the micro-steps: p = N, g = N, as DeepSpeed's pipeline engine requires,
    ZeRO-0 / ZeRO-1), with the profile's boundary buckets, per-call algorithm, compute
    slowdown, attention kernel and logit bytes (docs/parallelism.md, "Runtime profiles")."""
    if rt.is_ideal:
        return
    if strategy.p is not Level.N or strategy.g is not Level.N:
        fits = ", ".join(rt.label(s) for s, _ in rt.stages if s[:2] == "NN") or "NNN, NNI, NNG"
        raise InputError(f"--runtime {rt.name} with --tp / --pp / --cp models strategies "
                         "whose parameters and gradients stay whole during the micro-steps "
                         f"(p = N, g = N: {fits}); got --strategy {rt.label(strategy.short)}")
    if par.cp > 1:
        raise InputError(f"--runtime {rt.name}: context parallelism is Megatron-Core / "
                         "Transformer Engine's, not this framework's; --tp / --pp / --cp / "
                         "--sequence-parallel with a runtime profile expect --cp 1")
    if rt.grad_sync_every_micro_step:
        raise InputError(f"--runtime {rt.name} synchronises gradients every micro-step "
                         "(grad_sync_every_micro_step), which is not modelled with --tp / "
                         "--pp / --cp; expected another runtime or no --tp / --pp / --cp")
    if par.dp_comm_overlap:
        raise InputError(f"--dp-comm-overlap models Megatron-Core's DDP buckets, not "
                         f"--runtime {rt.name}'s; expected one of them")
    hybrid = [f for f in ("grad_sync_all_reduce", "grad_sync_last_backward",
                          "param_sync_per_owner", "param_sync_overlap_forward")
              if getattr(rt, f)]
    if hybrid and (par.pp > 1 or not hybrid_3d(strategy, rt)):
        raise InputError(f"--runtime {rt.name}'s hybrid-ZeRO schedule ({', '.join(hybrid)}) "
                         "is modelled with --tp only (all four fields on, no pipeline); "
                         f"got --pp {par.pp}; expected --pp 1 or another runtime")


def training_for_runtime_3d(training: TrainingSpec, rt) -> TrainingSpec:
    """A runtime profile's memory settings on the 3D planner: its attention kernel and logit
    bytes where ``training`` leaves them unset. Its ``memory_model`` is not taken: with TP /
    PP the layers are Megatron's, whose activations the Korthikanti et al. estimate counts
    (an explicit ``--memory-model runtime`` is refused). The ideal profile: unchanged."""
    if rt.is_ideal:
        return training
    return replace(training, attention=training.attention or rt.attention,
                   logit_bytes=(training.logit_bytes if training.logit_bytes is not None
                                else rt.logit_bytes))


def check_supported(cluster: ClusterSpec, training: TrainingSpec,
                    algo: Algo | None = None) -> None:
    """Refuse, with one line, what the TP/PP model does not honour (never a silent answer)."""
    flags = "--tp / --pp / --sequence-parallel / --recompute selective"
    if (training.memory_model or "korthikanti") != "korthikanti":
        raise InputError(f"{flags} use the Korthikanti et al. memory estimate; expected no "
                         "--memory-model runtime with them")
