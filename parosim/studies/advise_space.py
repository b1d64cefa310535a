"""What ``parosim advise`` searches: the dimensions, each either searched over its default
values or fixed to the values a flag names (docs/advise.md, "Search space").

>>> SearchSpace().fixed()
{}
>>> SearchSpace(attention=("flash",), tp=(2, 4)).fixed()
{'attention': ('flash',), 'tp': (2, 4)}
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from ..collectives.types import Algo, parse_enum
from ..errors import InputError
from ..io.runtime import available_runtimes, load_runtime
from ..spec.model import ModelSpec
from ..spec.strategy import ALL_STRATEGIES, Strategy, parse_strategy
from ..spec.system import ClusterSpec
from ..spec.training import PRECISIONS

RECOMPUTE = ("none", "selective", "full")
ATTENTIONS = ("flash", "eager")
SCHEDULES = ("1f1b", "interleaved")
#: the largest PaRO group (nodes) searched when ``--group-nodes`` is not given
MAX_GROUP_NODES = 8
#: context parallelism is searched (c = 2, 4, 8) from this sequence length on, when ``--cp``
#: is not given: it splits long sequences (Megatron-Core's long-context recipes use it from
#: 8k-32k tokens); shorter ones keep c = 1 unless ``--cp`` asks
CP_MIN_SEQ_LEN = 8192


@dataclass(frozen=True)
class SearchSpace:
    """Each dimension: ``None`` = searched over its defaults (:meth:`resolve`), else the
    values a flag fixed it to (a tuple of one value, or of several from a comma list)."""

    attention: tuple[str, ...] | None = None
    precision: tuple[str, ...] | None = None
    runtime: tuple[str, ...] | None = None
    recompute: tuple[str, ...] | None = None
    tp: tuple[int, ...] | None = None
    pp: tuple[int, ...] | None = None
    cp: tuple[int, ...] | None = None
    strategy: tuple[str, ...] | None = None
    group_nodes: tuple[int, ...] | None = None
    micro_batch: tuple[int, ...] | None = None
    algo: tuple[str, ...] | None = None

    def fixed(self) -> dict:
        """The dimensions a flag fixed ({name: values})."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if getattr(self, f.name) is not None}


@dataclass(frozen=True)
class Resolved:
    """The values each dimension takes in one search."""

    attention: tuple[str, ...]
    precision: tuple[str, ...]
    runtimes: tuple          # RuntimeSpec, ideal first
    recompute: tuple[str, ...]
    tp: tuple[int, ...]
    pp: tuple[int, ...]
    cp: tuple[int, ...]
    strategies: tuple[Strategy, ...]
    group_nodes: tuple[int, ...]
    micro_batch: tuple[int, ...]
    algos: tuple[Algo, ...] | None     # None: the algorithms that differ (advise._algos)

    def searched(self) -> dict:
        """{dimension: number of values} (the JSON ``search_space``)."""
        return {"attention": list(self.attention), "precision": list(self.precision),
                "runtime": [r.name for r in self.runtimes], "recompute": list(self.recompute),
                "tp": list(self.tp), "pp": list(self.pp), "cp": list(self.cp),
                "strategies": [s.short for s in self.strategies],
                "group_nodes": list(self.group_nodes), "micro_batch": list(self.micro_batch),
                "algo": "auto" if self.algos is None else [a.value for a in self.algos]}


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _ints(values, flag: str, allowed=None, what: str = "") -> tuple[int, ...]:
    out = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise InputError(f"{flag} {v!r} must be a positive integer")
        if allowed is not None and v not in allowed:
            raise InputError(f"{flag} {v} {what}; expected one of "
                             f"{', '.join(map(str, allowed))}")
        out.append(v)
    return tuple(dict.fromkeys(out))


def _names(values, flag: str, allowed) -> tuple[str, ...]:
    out = []
    for v in values:
        v = str(v).strip().lower()
        if v not in allowed:
            raise InputError(f"{flag} {v!r} is not known; expected one of {', '.join(allowed)}")
        out.append(v)
    return tuple(dict.fromkeys(out))


def resolve(space: SearchSpace, model: ModelSpec, cluster: ClusterSpec,
            max_micro_batch: int, seq_len: int = 2048) -> Resolved:
    """The values of every dimension: the fixed ones checked (one line naming the flag),
    the others their defaults (docs/advise.md)."""
    has_fp8 = cluster.gpu.peak_fp8_flops > 0
    att = (_names(space.attention, "--attention", ATTENTIONS) if space.attention
           else ATTENTIONS)
    if space.precision:
        prec = _names(space.precision, "--precision", PRECISIONS)
        if "fp8" in prec and not has_fp8:
            raise InputError(f"--precision fp8 needs FP8 tensor cores; GPU {cluster.gpu.model} "
                             f"of cluster {cluster.name!r} has none; expected bf16 or a GPU "
                             "with FP8 (H100, H200)")
    else:
        prec = ("bf16", "fp8") if has_fp8 else ("bf16",)
    if space.runtime:
        runtimes = tuple(load_runtime(n) for n in dict.fromkeys(space.runtime))
    else:   # every bundled profile whose schedule the closed-form screen can cost
        runtimes = tuple(rt for rt in (load_runtime(n) for n in dict.fromkeys(
            ["ideal"] + [n for n in available_runtimes() if n != "ideal"]))
            if not (rt.grad_sync_last_backward or rt.param_sync_per_owner))
    rc = (_names(space.recompute, "--recompute",
                 RECOMPUTE + ("off", "on")) if space.recompute else RECOMPUTE)
    rc = tuple(dict.fromkeys({"off": "none", "on": "full"}.get(r, r) for r in rc))
    gpn = cluster.gpus_per_node
    tp = (_ints(space.tp, "--tp", divisors(gpn), f"is not a divisor of the {gpn} GPUs per "
                "node (advise keeps tensor parallelism inside a node)")
          if space.tp else tuple(divisors(gpn)))
    pp = (_ints(space.pp, "--pp", divisors(model.layers),
                f"does not divide the {model.layers} layers")
          if space.pp else tuple(divisors(model.layers)))
    cp = _ints(space.cp, "--cp") if space.cp else (
        tuple(c for c in (1, 2, 4, 8) if c <= gpn) if seq_len >= CP_MIN_SEQ_LEN else (1,))
    strategies = tuple(parse_strategy(s) for s in (space.strategy or ALL_STRATEGIES))
    strategies = tuple(dict.fromkeys(strategies))
    gn = (_ints(space.group_nodes, "--group-nodes", divisors(cluster.nodes),
                f"does not divide the {cluster.nodes} nodes")
          if space.group_nodes else tuple(g for g in divisors(cluster.nodes)
                                          if g <= MAX_GROUP_NODES))
    if space.micro_batch:
        mb = _ints(space.micro_batch, "--micro-batch")
    else:
        mb, b = [], 1
        while b <= max_micro_batch:
            mb.append(b)
            b *= 2
        mb = tuple(mb)
    algos = (tuple(dict.fromkeys(parse_enum(Algo, a, "--algo") for a in space.algo))
             if space.algo else None)
    if algos and Algo.NCCL in algos:
        raise InputError("--algo nccl: advise screens with the closed form, which has no NCCL "
                         "tuner; expected ring, hierarchical or ho-ring")
    return Resolved(att, prec, runtimes, rc, tp, pp, cp, strategies, gn, mb, algos)


def split_list(text: str | None) -> tuple[str, ...] | None:
    """A flag's comma list (``flash`` or ``flash,eager``); None or ``all`` = searched."""
    if text is None or str(text).strip().lower() in ("all", "search", ""):
        return None
    return tuple(t.strip() for t in str(text).split(",") if t.strip()) or None


def split_ints(text: str | None, flag: str) -> tuple[int, ...] | None:
    items = split_list(text)
    if items is None:
        return None
    try:
        return tuple(int(t) for t in items)
    except ValueError:
        raise InputError(f"{flag} {text!r} is not a list of integers; expected e.g. 2 or "
                         "1,2,4 (or all)") from None
