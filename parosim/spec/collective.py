"""The collective vocabulary users name: operations, scopes and algorithms.

Sizes follow nccl-tests: ``size_bytes`` is the full buffer, i.e. the all-gather *output*, the
reduce-scatter *input*, the all-reduce buffer. The lowered program that an algorithm makes of a
collective is :mod:`parosim.collectives.types`.
"""

from __future__ import annotations

import enum

from ..errors import InputError


class Op(str, enum.Enum):
    ALL_GATHER = "all-gather"
    REDUCE_SCATTER = "reduce-scatter"
    ALL_REDUCE = "all-reduce"

    @property
    def ring_factor(self) -> int:
        """Ring steps per rank over (k-1): 1 for AG/RS, 2 for AR."""
        return 2 if self is Op.ALL_REDUCE else 1

    def busbw_factor(self, k: int) -> float:
        """nccl-tests: busbw = algbw x this factor."""
        return self.ring_factor * (k - 1) / k if k > 1 else 0.0


class Scope(str, enum.Enum):
    GLOBAL = "global"  # all n GPUs
    INTRA = "intra"    # the m GPUs of each group, all groups at once
    INTER = "inter"    # GPUs with the same local index across groups, all m rings at once


class Algo(str, enum.Enum):
    RING = "ring"
    HIERARCHICAL = "hierarchical"
    HO_RING = "ho-ring"
    NCCL = "nccl"  # NCCL's tuner: the fastest (ring | tree, protocol) pair (collectives.nccl)


def parse_enum(cls, text: str, what: str):
    """``parse_enum(Op, "all-gather", "--op")``; the error names the value and the choices."""
    aliases = {"allgather": "all-gather", "reducescatter": "reduce-scatter",
               "allreduce": "all-reduce", "ag": "all-gather", "rs": "reduce-scatter",
               "ar": "all-reduce", "horing": "ho-ring", "ho_ring": "ho-ring",
               "hier": "hierarchical", "paro-cc": "hierarchical"}
    key = str(text).strip().lower()
    key = aliases.get(key.replace("-", "").replace("_", ""), aliases.get(key, key))
    try:
        return cls(key)
    except ValueError:
        raise InputError(f"{what} {text!r} is not known; expected one of "
                         f"{', '.join(e.value for e in cls)}") from None
