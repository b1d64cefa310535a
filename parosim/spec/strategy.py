"""The 14 PaRO strategies: partition levels, validity, parsing and model-state memory.

A strategy gives a partition :class:`Level` to each of parameters (p), gradients (g) and
optimizer states (os), written ``PaRO-<p><g><os>`` (docs/model.md). ``N`` = every GPU holds
a full copy, ``I`` = partitioned over the m GPUs of a group, ``G`` = partitioned over all n
GPUs; N < I < G in fineness. Valid iff os is at least as fine as p and as g: a coarser os
costs memory and saves no communication. That leaves 14 strategies.

>>> s = parse_strategy("paro-nig")
>>> s.name, s.short, s.p, s.g, s.os
('PaRO-NIG', 'NIG', <Level.N: 'N'>, <Level.I: 'I'>, <Level.G: 'G'>)
>>> parse_strategy("zero3").name
'PaRO-GGG'
>>> len(ALL_STRATEGIES)
14
"""

from __future__ import annotations

import enum
import functools
import itertools
from dataclasses import dataclass

from ..errors import InputError
from .training import BYTES_PER_GRAD, BYTES_PER_OPTIM_STATE, BYTES_PER_PARAM


@functools.total_ordering
class Level(enum.Enum):
    """Partition level, ordered by fineness: N < I < G."""

    N = "N"  # not partitioned: a full copy on every GPU
    I = "I"  # noqa: E741  -- partitioned inside a group (1/m per GPU)
    G = "G"  # partitioned over all GPUs (1/n per GPU)

    @property
    def rank(self) -> int:
        return "NIG".index(self.value)

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, Level):
            return NotImplemented
        return self.rank < other.rank

    def divisor(self, n: int, m: int) -> int:
        """d_N = 1, d_I = m, d_G = n: the share of a partitioned tensor a GPU holds is 1/d."""
        return 1 if self is Level.N else m if self is Level.I else n

    @property
    def meaning(self) -> str:
        return {"N": "not partitioned", "I": "partitioned within a group",
                "G": "partitioned over all GPUs"}[self.value]


# Known systems (docs/model.md, "Partition levels"); MiCS and hpZ are approximations.
KNOWN_SYSTEMS: dict[str, str] = {
    "NNN": "DDP", "NNG": "ZeRO-1", "NGG": "ZeRO-2", "GGG": "ZeRO-3 / FSDP",
    "III": "MiCS / HSDP (approx.)", "IGG": "ZeRO++ hpZ (approx.)",
}

# Aliases accepted by parse_strategy (keys normalised: lower case, no '-', '_', ' ', '+').
# The framework names of the strategies that frameworks ship (shown beside the PaRO name):
# DDP keeps everything replicated; ZeRO stages 1/2/3 (DeepSpeed) shard the optimizer states,
# then the gradients, then the parameters over all GPUs (PyTorch FSDP FULL_SHARD = ZeRO-3);
# MiCS / FSDP HYBRID_SHARD shard everything inside a group and replicate across groups;
# ZeRO++ hpZ keeps a secondary parameter shard inside the node.
FRAMEWORK_NAMES: dict[str, str] = {
    "NNN": "DDP", "NNG": "ZeRO-1", "NGG": "ZeRO-2", "GGG": "ZeRO-3 / FSDP",
    "III": "MiCS / HSDP", "IGG": "ZeRO++ hpZ",
}

ALIASES: dict[str, str] = {
    "ddp": "NNN", "zero1": "NNG", "zero2": "NGG", "zero3": "GGG", "fsdp": "GGG",
    "mics": "III", "hsdp": "III", "zeropp": "IGG", "hpz": "IGG",
}


@dataclass(frozen=True)
class Strategy:
    """One PaRO strategy; construction rejects the 13 invalid combinations.

    >>> Strategy(Level.I, Level.I, Level.G).name
    'PaRO-IIG'
    >>> Strategy(Level.I, Level.G, Level.G).system
    'ZeRO++ hpZ (approx.)'
    """

    p: Level
    g: Level
    os: Level

    def __post_init__(self) -> None:
        for field_name in ("p", "g", "os"):
            v = getattr(self, field_name)
            if not isinstance(v, Level):
                raise InputError(f"strategy level {field_name} = {v!r} must be a Level "
                                 "(N, I or G)")
        reason = invalid_reason(self.p, self.g, self.os)
        if reason:
            raise InputError(reason)

    @property
    def short(self) -> str:
        return f"{self.p.value}{self.g.value}{self.os.value}"

    @property
    def name(self) -> str:
        return f"PaRO-{self.short}"

    @property
    def system(self) -> str:
        """The known system this strategy corresponds to, or ``""``."""
        return KNOWN_SYSTEMS.get(self.short, "")

    def divisors(self, n: int, m: int) -> tuple[int, int, int]:
        """(d_p, d_g, d_os) for n GPUs in groups of m."""
        return self.p.divisor(n, m), self.g.divisor(n, m), self.os.divisor(n, m)

    def __str__(self) -> str:
        return self.name


def invalid_reason(p: Level, g: Level, os: Level) -> str:
    """Why ``PaRO-<p><g><os>`` is invalid, or ``""`` when it is valid."""
    if os >= p and os >= g:
        return ""
    fix = max(p, g).value
    return (f"PaRO-{p.value}{g.value}{os.value} is invalid: optimizer states ({os.value}) must "
            f"be partitioned at least as finely as parameters ({p.value}) and gradients "
            f"({g.value}), in the order N < I < G; a coarser optimizer partition costs memory "
            f"and saves no communication (did you mean PaRO-{p.value}{g.value}{fix}?)")


# docs/model.md order.
ALL_STRATEGIES: tuple[Strategy, ...] = tuple(
    Strategy(Level(c[0]), Level(c[1]), Level(c[2]))
    for c in ("NNN", "NNI", "NII", "INI", "III", "NNG", "NIG", "NGG", "ING", "IIG", "IGG",
              "GNG", "GIG", "GGG"))

INVALID_COMBINATIONS: tuple[str, ...] = tuple(
    "".join(c) for c in itertools.product("NIG", repeat=3)
    if invalid_reason(Level(c[0]), Level(c[1]), Level(c[2])))


def parse_strategy(text: str | Strategy) -> Strategy:
    """A strategy from ``"NIG"``, ``"PaRO-NIG"``, ``"paro-nig"`` or an alias (``ddp``,
    ``zero1``, ``zero2``, ``zero3``, ``fsdp``, ``mics``, ``hsdp``, ``zeropp``, ``hpz``).

    >>> parse_strategy("PaRO-IGG") == parse_strategy("zero++")
    True
    """
    if isinstance(text, Strategy):
        return text
    raw = str(text).strip()
    key = raw.lower().replace("-", "").replace("_", "").replace(" ", "").replace("+", "p")
    if key in ALIASES:
        key = ALIASES[key].lower()
    if key.startswith("paro"):
        key = key[4:]
    if len(key) == 3 and set(key) <= set("nig"):
        p, g, os = (Level(c.upper()) for c in key)
        reason = invalid_reason(p, g, os)
        if reason:
            raise InputError(reason)
        return Strategy(p, g, os)
    raise InputError(
        f"strategy {raw!r} is not known; expected three letters p g os from N, I, G (e.g. "
        "NIG), optionally prefixed 'PaRO-' (e.g. PaRO-NIG), or an alias: "
        + ", ".join(f"{a}={s}" for a, s in ALIASES.items())
        + f"; valid strategies: {', '.join(s.short for s in ALL_STRATEGIES)}")


def model_states_bytes(strategy: Strategy, params: float, trainable_params: float, n: int,
                       m: int, optim_bytes: float = BYTES_PER_OPTIM_STATE) -> float:
    """Model-state bytes per GPU: 2Ψ/d_p + 2Ψ'/d_g + 12Ψ'/d_os (docs/model.md);
    ``optim_bytes``: the optimizer-state bytes per trainable parameter (12: fp32 master
    weights and Adam moments; ``TrainingSpec.optim_state_bytes``).

    >>> model_states_bytes(parse_strategy("GGG"), 1e9, 1e9, n=32, m=8)
    500000000.0
    """
    if not (n >= 1 and m >= 1 and n % m == 0):
        raise InputError(f"n = {n!r} GPUs in groups of m = {m!r}: expected positive integers "
                         "with m dividing n")
    d_p, d_g, d_os = strategy.divisors(n, m)
    return (BYTES_PER_PARAM * params / d_p + BYTES_PER_GRAD * trainable_params / d_g
            + optim_bytes * trainable_params / d_os)
