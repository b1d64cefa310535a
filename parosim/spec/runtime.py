"""Runtime profiles: how a training framework actually schedules a PaRO strategy.

A :class:`RuntimeSpec` is frozen data read by :mod:`parosim.io.runtime` from
``runtimes/<name>.yaml`` (every number there cites its source: the framework's config
defaults and code). The Plan builder consults it (:mod:`parosim.plan.runtime`): gradient
buckets, whether the gradient reduction overlaps the backward, prefetch depth, parameters
kept replicated below a size threshold, which collective algorithm each call uses, when
gradients are synchronised. The engine stays generic: it only replays the Plan.

Five profiles ship with parosim (docs/runtimes.md has the full reference):

* ``ideal``: today's schedule (one gradient bucket per unit, everything overlapped, the
  ``--algo`` of the run for every collective, no compute slowdown). The default.
* ``deepspeed``: DeepSpeed 0.10.0 ZeRO stages 0-3 as its config defaults make them run.
* ``fsdp``: PyTorch FSDP (FlatParameter per wrapped decoder layer) NO_SHARD, SHARD_GRAD_OP,
  FULL_SHARD, HYBRID_SHARD.
* ``paro``: the PaRO paper's DeepSpeed fork (sequential PaRO-CC for large list-API
  collectives only).
* ``internlm``: InternLM's hybrid ZeRO (NNN / NNI / NNG: gradients all-reduced in the last
  backward, one parameter broadcast per shard owner beside the next forward; with ``--tp``
  too, pipeline size 1; :mod:`parosim.plan.hybrid`).

>>> r = RuntimeSpec(name="x", stages=(("NGG", "ZeRO-2"),))
>>> r.label("NGG"), r.supports("NIG")
('NGG (ZeRO-2)', False)
>>> IDEAL.supports("NIG"), IDEAL.label("NIG")
(True, 'NIG')
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import InputError

COLLECTIVE_ALGOS = (None, "ring", "paro-cc")


def _nonneg_int(v: object, name: str) -> None:
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise InputError(f"runtime {name} = {v!r} must be a non-negative integer")


@dataclass(frozen=True)
class RuntimeSpec:
    """One framework's scheduling behaviour (units: elements = parameters, not bytes).

    ``stages``: (PaRO short name, framework stage) pairs; empty = every one of the 14
    strategies, with no framework name. A strategy outside a non-empty list is refused.
    ``collective_algo``: None = the run's ``--algo`` for every collective; ``"ring"`` = flat
    NCCL ring for every collective; ``"paro-cc"`` = the PaRO fork: sequential hierarchical
    (PaRO-CC) for the list-API collectives of at least ``paro_cc_min_elements`` elements
    (the boundary all-gather / all-reduce of global scope), flat ring for everything else.
    ``grad_bucket_elements``: gradient elements per reduction bucket (None = one bucket per
    unit). ``overlap_comm``: the gradient reduction runs beside the backward (True), blocks
    it (False), or None = DeepSpeed's default, True only when parameters are partitioned.
    ``sync_grads_end_of_backward``: the next micro-step waits for the last gradient bucket.
    ``prefetch_forward`` / ``prefetch_backward``: parameter gathers issued that many units
    ahead of their use (0 = on demand). ``persistence_threshold``: parameter tensors with
    fewer elements stay replicated (no gather; memory on every GPU). ``max_reuse_distance`` /
    ``max_live_parameters``: gathered units whose reuse (forward to backward) is closer than
    this many elements stay live and are not gathered again (DeepSpeed ZeRO-3); 0 = off.
    ``grad_sync_every_micro_step``: the boundary gradient sync runs after every unit's
    backward, every micro-step (FSDP without ``no_sync``). ``forward_only_gather``: strategies
    whose parameters are gathered once per micro-step in forward and kept for the backward,
    with no boundary parameter sync (FSDP SHARD_GRAD_OP). ``allgather_bucket_elements``:
    boundary parameter all-gathers split in buckets of this many elements (None = one call).
    ``reduce_scatter``: gradient buckets are reduce-scattered (True) or all-reduced (False,
    DeepSpeed ``reduce_scatter: false``: twice the bytes, every GPU gets the whole bucket).
    ``grad_reduce_per_owner``: a reduce-scattered bucket of partitioned gradients with whole
    parameters (ZeRO-2) is one reduce call per gradient partition it touches (DeepSpeed
    ZeRO-1/2 ``average_tensor``: ``dist.reduce(grad_slice, dst=...)`` for every entry of
    ``rank_and_offsets``); False = one reduce-scatter of the bucket.
    ``overlap_slowdown``: compute slowdown beside a collective when neither the command line
    nor the cluster YAML sets one.

    Hybrid-ZeRO scheduling (InternLM; all False = the schedules above):
    ``grad_sync_all_reduce``: a strategy with unpartitioned gradients synchronises them with
    one all-reduce over every data-parallel rank, whatever its optimizer-state level (the
    ZeRO group only partitions the optimizer). ``grad_sync_last_backward``: that sync runs in
    ``grad_bucket_elements`` buckets during the last micro-step's backward (the earlier
    micro-steps skip the reduction). ``param_sync_per_owner``: the boundary parameter sync is
    one call per shard owner (a broadcast of its shard), at most one per parameter tensor.
    ``param_sync_overlap_forward``: that sync runs beside the next step's forward, each unit's
    forward waiting for the calls that carry its parameters.

    Memory as the framework keeps it (each fills in the :class:`parosim.spec.training.TrainingSpec`
    field of the same name when the user leaves it unset; an explicit value wins):
    ``memory_model`` (``"korthikanti"`` | ``"runtime"``, :mod:`parosim.cost.memory`),
    ``attention`` (``"eager"`` | ``"flash"``: the attention kernel of the model code this
    framework is run with in its era) and ``logit_bytes`` (bytes per logit live at the loss;
    None = the memory model's own).
    """

    name: str = "ideal"
    framework: str = "ideal schedule (no framework)"
    stages: tuple[tuple[str, str], ...] = ()
    collective_algo: str | None = None
    paro_cc_min_elements: int = 0
    grad_bucket_elements: int | None = None
    overlap_comm: bool | None = True
    sync_grads_end_of_backward: bool = False
    prefetch_forward: int = 1
    prefetch_backward: int = 1
    persistence_threshold: int = 0
    max_reuse_distance: int = 0
    max_live_parameters: int = 0
    grad_sync_every_micro_step: bool = False
    forward_only_gather: tuple[str, ...] = ()
    allgather_bucket_elements: int | None = None
    reduce_scatter: bool = True
    grad_reduce_per_owner: bool = False
    overlap_slowdown: float = 1.0
    memory_model: str = "korthikanti"
    attention: str = "eager"
    logit_bytes: int | None = None
    grad_sync_all_reduce: bool = False
    grad_sync_last_backward: bool = False
    param_sync_per_owner: bool = False
    param_sync_overlap_forward: bool = False
    sources: str = ""

    def __post_init__(self) -> None:
        if self.collective_algo not in COLLECTIVE_ALGOS:
            raise InputError(f"runtime {self.name!r}: collective_algo = "
                             f"{self.collective_algo!r} is not known; expected ring, paro-cc "
                             "or none (the run's --algo)")
        for f in ("paro_cc_min_elements", "prefetch_forward", "prefetch_backward",
                  "persistence_threshold", "max_reuse_distance", "max_live_parameters"):
            _nonneg_int(getattr(self, f), f)
        for f in ("grad_bucket_elements", "allgather_bucket_elements"):
            v = getattr(self, f)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise InputError(f"runtime {f} = {v!r} must be a positive integer (elements) "
                                 "or null")
        for f in ("grad_sync_all_reduce", "grad_sync_last_backward", "param_sync_per_owner",
                  "param_sync_overlap_forward", "grad_reduce_per_owner"):
            if not isinstance(getattr(self, f), bool):
                raise InputError(f"runtime {f} = {getattr(self, f)!r} must be true or false")
        if self.grad_sync_last_backward and not self.grad_sync_all_reduce:
            raise InputError(f"runtime {self.name!r}: grad_sync_last_backward needs "
                             "grad_sync_all_reduce: true (the bucketed sync is an all-reduce)")
        if self.grad_sync_last_backward and self.grad_sync_every_micro_step:
            raise InputError(f"runtime {self.name!r}: grad_sync_last_backward and "
                             "grad_sync_every_micro_step exclude each other; expected one")
        if not isinstance(self.reduce_scatter, bool):
            raise InputError(f"runtime reduce_scatter = {self.reduce_scatter!r} must be true "
                             "or false")
        if self.overlap_comm is not None and not isinstance(self.overlap_comm, bool):
            raise InputError(f"runtime overlap_comm = {self.overlap_comm!r} must be true, "
                             "false or null")
        o = self.overlap_slowdown
        if isinstance(o, bool) or not isinstance(o, (int, float)) or not (
                math.isfinite(o) and o >= 1):
            raise InputError(f"runtime overlap_slowdown = {o!r} must be a factor >= 1")
        if self.memory_model not in ("korthikanti", "runtime"):
            raise InputError(f"runtime memory_model = {self.memory_model!r} is not known; "
                             "expected korthikanti or runtime")
        if self.attention not in ("eager", "flash"):
            raise InputError(f"runtime attention = {self.attention!r} is not known; expected "
                             "eager or flash")
        lb = self.logit_bytes
        if lb is not None and (isinstance(lb, bool) or not isinstance(lb, int)
                               or not 2 <= lb <= 16):
            raise InputError(f"runtime logit_bytes = {lb!r} must be an integer from 2 to 16 "
                             "or null (the memory model's own)")
        # fields that would be silently ignored: refused
        if self.paro_cc_min_elements and self.collective_algo != "paro-cc":
            raise InputError(f"runtime {self.name!r}: paro_cc_min_elements = "
                             f"{self.paro_cc_min_elements} applies only with collective_algo "
                             f"paro-cc, got {self.collective_algo!r}; expected 0 or paro-cc")
        stray = [s for s in self.forward_only_gather if not self.supports(s)]
        if stray:
            raise InputError(f"runtime {self.name!r}: forward_only_gather names "
                             f"{', '.join(stray)}, which is not among its stages; expected "
                             "strategies from stages")

    @property
    def is_ideal(self) -> bool:
        """True when the profile schedules exactly like the ideal Plan builder."""
        return self == RuntimeSpec(name=self.name, framework=self.framework,
                                   stages=self.stages, sources=self.sources,
                                   memory_model=self.memory_model, attention=self.attention,
                                   logit_bytes=self.logit_bytes)

    def supports(self, short: str) -> bool:
        return not self.stages or any(s == short for s, _ in self.stages)

    def stage(self, short: str) -> str:
        """The framework's name for a strategy ('' when none)."""
        return next((label for s, label in self.stages if s == short), "")

    def label(self, short: str) -> str:
        """``NGG (ZeRO-2)``: the PaRO name with the framework stage beside it."""
        st = self.stage(short)
        return f"{short} ({st})" if st else short

    def require(self, short: str) -> None:
        """Refuse a strategy the framework cannot run, naming what it can."""
        if not self.supports(short):
            names = ", ".join(f"{s} ({label})" for s, label in self.stages)
            raise InputError(f"--runtime {self.name}: {self.framework} has no stage for "
                             f"PaRO-{short}; expected one of {names} (or --runtime paro / "
                             "ideal for every PaRO strategy)")

    def overlaps_grad_reduce(self, p_partitioned: bool) -> bool:
        """Whether the gradient reduction runs beside the backward for this strategy."""
        return p_partitioned if self.overlap_comm is None else self.overlap_comm


IDEAL = RuntimeSpec()


def effective_overlap_slowdown(explicit: float | None, cluster_value: float | None,
                               runtime: RuntimeSpec | None) -> float:
    """The compute slowdown factor beside a collective: the command line / API value if
    given, else the cluster YAML's, else the runtime profile's default (ideal: 1.0).

    >>> effective_overlap_slowdown(None, None, None), effective_overlap_slowdown(1.5, 1.2, None)
    (1.0, 1.5)
    """
    if explicit is not None:
        return float(explicit)
    if cluster_value is not None:
        return float(cluster_value)
    return (runtime or IDEAL).overlap_slowdown
