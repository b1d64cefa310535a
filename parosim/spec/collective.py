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
    ALL_TO_ALL = "all-to-all"   # size: each rank's send buffer, S/k to every rank of its group

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
    # all-to-all only (collectives.alltoall): NCCL's send / receive to every peer, and the
    # two-stage NVLink + RDMA variant of DeepEP / HybridEP
    P2P = "p2p"
    HIERARCHICAL_A2A = "hierarchical-a2a"


#: the operations ring algorithms run (all but all-to-all)
RING_OPS = (Op.ALL_GATHER, Op.REDUCE_SCATTER, Op.ALL_REDUCE)
#: the algorithms of each kind of operation (``--algo all``)
RING_ALGOS = (Algo.RING, Algo.HIERARCHICAL, Algo.HO_RING, Algo.NCCL)
A2A_ALGOS = (Algo.P2P, Algo.HIERARCHICAL_A2A)
#: the dispatchers of a MoE step (``--a2a-algo``): :data:`A2A_ALGOS`, then DeepEP's kernel
#: families (:class:`parosim.collectives.deepep.EPDispatcher`; a test keeps the lists equal)
A2A_ALGO_NAMES = ("p2p", "hierarchical-a2a", "deepep-normal", "deepep-ll", "hybridep")


def parse_enum(cls, text: str, what: str):
    """``parse_enum(Op, "all-gather", "--op")``; the error names the value and the choices."""
    aliases = {"allgather": "all-gather", "reducescatter": "reduce-scatter",
               "allreduce": "all-reduce", "ag": "all-gather", "rs": "reduce-scatter",
               "ar": "all-reduce", "horing": "ho-ring", "ho_ring": "ho-ring",
               "hier": "hierarchical", "paro-cc": "hierarchical", "alltoall": "all-to-all",
               "a2a": "all-to-all", "hiera2a": "hierarchical-a2a"}
    key = str(text).strip().lower()
    key = aliases.get(key.replace("-", "").replace("_", ""), aliases.get(key, key))
    try:
        return cls(key)
    except ValueError:
        raise InputError(f"{what} {text!r} is not known; expected one of "
                         f"{', '.join(e.value for e in cls)}") from None


def check_a2a_algo(text, what: str = "--a2a-algo") -> str:
    """The name of a MoE step's all-to-all algorithm (:data:`A2A_ALGO_NAMES`), read as
    ``--a2a-algo`` reads it (aliases too); else one line naming ``what``."""
    key = str(text).strip().lower()
    if key not in A2A_ALGO_NAMES:
        try:
            key = parse_enum(Algo, text, what).value
        except InputError:
            pass
    if key not in A2A_ALGO_NAMES:
        raise InputError(f"{what} {text!r} is not an all-to-all algorithm; expected one of "
                         f"{', '.join(A2A_ALGO_NAMES)}")
    return key
