"""Expert parallelism in the layout, PaRO levels for expert parameters, and the bytes of one
MoE layer's dispatch and combine (docs/moe.md, "Expert parallelism").

Megatron-Core's expert layout (``megatron/core/parallel_state.py``): inside every pipeline
stage, the n/p ranks that the dense layers split as TP x CP x DP are split for the experts as
ETP x EP x EDP, ranks in the order "tp-ep-dp" (ETP fastest):

    local rank = etp + ETP·(ep + EP·edp),   EDP = TP·CP·DP / (EP·ETP)

* the **EP group** of a rank: the EP ranks with its etp and edp; each holds E / EP of the
  routed experts (each expert split over ETP ranks), and the dispatch / combine all-to-alls
  run over it;
* the **expert-data-parallel (EDP) group**: the EDP ranks with its etp and ep, which hold
  the same expert shard; expert gradients are reduced and expert optimizer states sharded
  over it, as the dense ones over the DP group.

PaRO levels for experts (``--expert-strategy``): the same 14 strategies, applied to the
routed experts over the EDP group: N = every EDP rank holds the whole expert shard, I =
sharded over the EDP ranks inside one PaRO group of nodes (m_edp of them), G = sharded over
all EDP ranks. Dense parameters (attention, dense MLPs, shared experts, router, embeddings)
keep ``--strategy`` over the DP group.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

from ..collectives.types import Op, Scope
from ..errors import InputError
from ..spec.model import ModelSpec
from ..spec.strategy import Strategy, model_states_bytes
from ..spec.system import ClusterSpec
from ..spec.training import BYTES_PER_OPTIM_STATE, BYTES_PER_PARAM, TrainingSpec
from .builder import LEVEL_SCOPE, SYNC_GRAD, SYNC_PARAM


def _pos_int(v: object, flag: str) -> None:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise InputError(f"{flag} = {v!r} must be a positive integer")


@dataclass(frozen=True)
class ExpertLayout:
    """Dense TP x CP x DP x PP and expert ETP x EP x EDP x PP ranks of one job.

    >>> from parosim.spec.system import ClusterSpec
    >>> lay = ExpertLayout(ClusterSpec(nodes=2, gpus_per_node=8), experts=8, ep=8)
    >>> lay.edp, lay.ep_groups(0)[0], lay.edp_groups(0)[0], lay.m_edp
    (2, (0, 1, 2, 3, 4, 5, 6, 7), (0, 8), 1)
    """

    cluster: ClusterSpec
    experts: int
    ep: int = 1
    etp: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1

    def __post_init__(self) -> None:
        for f, flag in (("ep", "--ep"), ("etp", "--etp"), ("tp", "--tp"), ("pp", "--pp"),
                        ("cp", "--cp"), ("experts", "moe experts")):
            _pos_int(getattr(self, f), flag)
        n = self.cluster.gpus
        if n % (self.tp * self.cp * self.pp):
            raise InputError(f"--tp {self.tp} x --cp {self.cp} x --pp {self.pp} does not divide "
                             f"the {n} GPUs of cluster {self.cluster.name!r}")
        stage = n // self.pp
        if stage % (self.ep * self.etp):
            raise InputError(f"--ep {self.ep} x --etp {self.etp} = {self.ep * self.etp} does "
                             f"not divide the {stage} GPUs of a pipeline stage (TP x CP x DP); "
                             "expected EP x ETP to divide TP x CP x DP (Megatron-Core)")
        if self.experts % self.ep:
            raise InputError(f"--ep {self.ep} does not divide the model's {self.experts} "
                             "routed experts; expected a divisor")
        _ = self.m_edp   # checks the EDP groups split evenly over PaRO groups

    @property
    def stage_size(self) -> int:
        return self.cluster.gpus // self.pp

    @property
    def dp(self) -> int:
        """DP of the dense layers: n / (TP·CP·PP)."""
        return self.cluster.gpus // (self.tp * self.cp * self.pp)

    @property
    def edp(self) -> int:
        """Expert-data-parallel size: TP·CP·DP / (EP·ETP)."""
        return self.stage_size // (self.ep * self.etp)

    def rank(self, etp: int, ep: int, edp: int, stage: int) -> int:
        return etp + self.etp * (ep + self.ep * edp) + self.stage_size * stage

    def ep_groups(self, stage: int) -> tuple[tuple[int, ...], ...]:
        """The EP groups of a stage (the all-to-all groups), each in EP order."""
        return tuple(tuple(self.rank(t, e, d, stage) for e in range(self.ep))
                     for d in range(self.edp) for t in range(self.etp))

    def edp_groups(self, stage: int) -> tuple[tuple[int, ...], ...]:
        """The EDP groups of a stage (same expert shard), each in EDP order."""
        return tuple(tuple(self.rank(t, e, d, stage) for d in range(self.edp))
                     for e in range(self.ep) for t in range(self.etp))

    def _node_group(self, rank: int) -> int:
        c = self.cluster
        return rank // (c.gpus_per_node * c.group_nodes)

    @cached_property
    def m_edp(self) -> int:
        """EDP ranks of an EDP group inside one PaRO group of nodes (checked uniform)."""
        g0 = self.edp_groups(0)[0]
        m = sum(1 for r in g0 if self._node_group(r) == self._node_group(g0[0]))
        for k in range(self.pp):
            for g in self.edp_groups(k):
                for c in range(0, self.edp, m):
                    if self.edp % m or len({self._node_group(r) for r in g[c:c + m]}) != 1:
                        raise InputError(
                            f"the expert-data-parallel groups of --ep {self.ep} --etp "
                            f"{self.etp} do not split evenly over PaRO groups of "
                            f"{self.cluster.group_nodes} node(s); expected --group-nodes such "
                            "that every EDP group has the same ranks in every group")
        return m

    @property
    def dense_dp(self) -> int:
        """The dense layers' data-parallel group (DP x CP, as Megatron-Core's distributed
        optimizer shards over it): n / (TP·PP)."""
        return self.stage_size // self.tp

    @cached_property
    def m_dp(self) -> int:
        """Ranks of the dense DP x CP group 0 inside the first rank's PaRO group of nodes."""
        grp = [self.tp * j for j in range(self.dense_dp)]
        return sum(1 for r in grp if self._node_group(r) == self._node_group(grp[0]))

    @property
    def ep_nodes(self) -> int:
        """Nodes (NVLink domains) one EP group spans: 1 = its all-to-all stays on NVLink."""
        return len({r // self.cluster.gpus_per_node for r in self.ep_groups(0)[0]})


def expert_params_per_gpu(model: ModelSpec, lay: ExpertLayout) -> float:
    """Routed-expert parameters on one GPU of the most loaded pipeline stage:
    ceil(MoE layers / PP) x E x one expert / (EP x ETP)."""
    c = model.param_counts
    per_layer = c.routed_experts / c.moe_layers
    return math.ceil(c.moe_layers / lay.pp) * per_layer / (lay.ep * lay.etp)


def dense_params_per_gpu(model: ModelSpec, lay: ExpertLayout) -> float:
    """Everything but the routed experts (attention, dense MLPs, shared experts, router,
    norms, embedding, head) split evenly over TP x PP: an average per GPU, not the most
    loaded stage (the embedding and head sit on the first and last stage)."""
    c = model.param_counts
    return (c.total - c.routed_experts) / (lay.tp * lay.pp)


def dense_states_bytes(model: ModelSpec, strategy: Strategy, lay: ExpertLayout,
                       trainable_ratio: float = 1.0,
                       optim_bytes: float = BYTES_PER_OPTIM_STATE) -> float:
    """Dense model states per GPU under ``--strategy`` over the DP x CP group
    (``optim_bytes``: optimizer-state bytes per trainable parameter)."""
    psi = dense_params_per_gpu(model, lay)
    return model_states_bytes(strategy, psi, psi * trainable_ratio, lay.dense_dp, lay.m_dp,
                              optim_bytes)


def expert_states_bytes(model: ModelSpec, strategy: Strategy, lay: ExpertLayout,
                        trainable_ratio: float = 1.0,
                        optim_bytes: float = BYTES_PER_OPTIM_STATE) -> float:
    """Expert model states per GPU: (2/d_p + 2r/d_g + 12r/d_os) x the GPU's expert
    parameters, the divisors over the EDP group (d_N = 1, d_I = m_edp, d_G = EDP)."""
    psi = expert_params_per_gpu(model, lay)
    return model_states_bytes(strategy, psi, psi * trainable_ratio, lay.edp, lay.m_edp,
                              optim_bytes)


def expert_traffic(model: ModelSpec, strategy: Strategy, lay: ExpertLayout,
                   accum_steps: int = 1, trainable_ratio: float = 1.0) -> list[dict]:
    """The expert-parameter collectives of one global step and the bytes each GPU sends in
    them (ring model: AG / RS (k-1)/k·S, AR 2(k-1)/k·S), the dense rules of docs/model.md
    applied over the EDP group: per micro-step the p = I / G all-gathers of the expert
    parameters (forward and backward) and the g = I / G reduce-scatters of their gradients;
    per step the gradient and parameter syncs. Rows: ``what``, ``op``, ``scope``, ``ranks``
    (k), ``size_bytes`` (S of one call), ``calls``, ``bytes_per_gpu`` (all calls)."""
    psi = expert_params_per_gpu(model, lay)
    full = BYTES_PER_PARAM * psi * trainable_ratio     # bf16 gradients / trainable params
    k_of = {Scope.INTRA: lay.m_edp, Scope.INTER: lay.edp // lay.m_edp, Scope.GLOBAL: lay.edp}
    rows: list[dict] = []

    def add(what: str, op: Op, scope: Scope, size: float, calls: int) -> None:
        k = k_of[scope]
        if k <= 1 or size <= 0:
            return
        rows.append({"what": what, "op": op.value, "scope": scope.value, "ranks": k,
                     "size_bytes": size, "calls": calls,
                     "bytes_per_gpu": calls * op.ring_factor * (k - 1) / k * size})

    s = accum_steps
    if strategy.p in LEVEL_SCOPE:
        add("expert params gather", Op.ALL_GATHER, LEVEL_SCOPE[strategy.p],
            BYTES_PER_PARAM * psi, 2 * s)
    if strategy.g in LEVEL_SCOPE:
        add("expert grads reduce-scatter", Op.REDUCE_SCATTER, LEVEL_SCOPE[strategy.g], full, s)
    sizes = {"full": full, "shard": full / lay.m_edp}
    for op, scope, size in SYNC_GRAD[(strategy.g, strategy.os)]:
        add("expert sync-grad", op, scope, sizes[size], 1)
    for op, scope, size in SYNC_PARAM.get((strategy.os, strategy.p), ()):
        add("expert sync-param", op, scope, sizes[size], 1)
    return rows


def dispatch_bytes(model: ModelSpec, training: TrainingSpec, lay: ExpertLayout,
                   bytes_per_element: int = 2) -> dict:
    """Bytes of one MoE layer's token dispatch on one rank, for one micro-batch (the
    combine moves the same back; the backward pass repeats both with gradients).

    Tokens per rank T = micro_batch x seq_len / CP (/ TP: Megatron's alltoall dispatcher with
    sequence parallelism; TP = 1 here unless stated); each goes to top_k experts: the
    dispatch send buffer is T·k·h elements (with a capacity factor c: E·ceil(c·T·k/E)
    rows, padded). Under uniform routing a fraction (EP-1)/EP of it leaves the rank.
    ``a2a_size_bytes`` is the all-to-all's size in nccl-tests' terms (the send buffer).
    """
    if lay.etp != 1 or lay.tp != 1:
        raise InputError(f"dispatch bytes with --etp {lay.etp} / --tp {lay.tp}: the token "
                         "all-gather over tensor-parallel ranks before the dispatch is not "
                         "modelled; expected --tp 1 --etp 1")
    moe = model.moe
    tokens = training.micro_batch * training.seq_len // lay.cp
    rows = tokens * moe.top_k
    if moe.capacity_factor is not None:
        rows = moe.experts * math.ceil(moe.capacity_factor * tokens * moe.top_k / moe.experts)
    size = rows * model.hidden * bytes_per_element
    remote = size * (lay.ep - 1) / lay.ep
    return {"tokens_per_rank": tokens, "rows": rows, "a2a_size_bytes": float(size),
            "remote_bytes": remote, "local_bytes": size - remote, "ep": lay.ep,
            "all_to_alls_per_layer": 4}
