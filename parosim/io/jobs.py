"""Several jobs on one cluster: the ``parosim simulate --jobs FILE`` YAML.

::

    cluster: eth-2tier-a100          # preset name or YAML path
    nodes: 16                        # optional: resize the cluster
    steps: 2                         # optional: steps measured per job (default 2)
    nic_bandwidth: 200Gbps           # optional what-ifs of the whole cluster, as simulate's
    intra_bandwidth: 2400Gbps        #   --nic-bandwidth, --intra-bandwidth, --gpu-memory
    gpu_memory: 40GB
    jobs:
      - {name: a, model: llama-7b, strategy: GGG, nodes: [0, 1, 2, 3, 4, 5, 6, 7]}
      - {name: b, model: llama-13b, strategy: IIG, algo: ring, micro_batch: 2, accum: 4,
         nodes: [8, 9, 10, 11, 12, 13, 14, 15]}

A job takes every per-job field of ``parosim simulate`` (defaults: JOB_DEFAULTS): ``model``,
``strategy``, ``algo``, ``micro_batch``, ``accum``, ``seq_len``, ``trainable_ratio``,
``recompute`` (auto / on / off), ``efficiency``, ``overlap_slowdown``, ``group_nodes``,
``runtime`` (ideal / deepspeed / fsdp / paro / a YAML path), ``precision`` (bf16 / fp8),
``compute_model``, ``attention``,
``memory_model``, ``logit_bytes``, ``fidelity`` (absent or accurate, as ``simulate``'s
default: the unset ``compute_model``, ``attention``, ``memory_model``, ``logit_bytes`` and
``algo`` take ``simulate``'s accurate models; paper: the PaRO paper's closed forms, HO-Ring),
and the layout ``tp``,
``pp``, ``pp_schedule`` (1f1b / interleaved), ``virtual_stages``, ``sequence_parallel`` (as
simulate's ``--tp`` ... flags);
``name`` and ``nodes`` (cluster node indices, in the job's rank order) are required. Fields of
the whole cluster (``cluster``, ``nodes`` count, bandwidths, GPU memory) go at the top.
"""

from __future__ import annotations

from typing import Any

from ..errors import InputError

TOP_KEYS = {"cluster", "nodes", "steps", "jobs", "nic_bandwidth", "intra_bandwidth",
            "gpu_memory"}
JOB_KEYS = {"name", "nodes", "model", "strategy", "algo", "micro_batch", "accum", "seq_len",
            "trainable_ratio", "recompute", "efficiency", "overlap_slowdown", "group_nodes",
            "runtime", "compute_model", "attention", "memory_model", "logit_bytes",
            "precision", "tp", "pp", "pp_schedule", "virtual_stages", "sequence_parallel",
            "fidelity"}
JOB_DEFAULTS = {"model": "llama-7b", "strategy": "NIG", "algo": None, "micro_batch": 4,
                "accum": 10, "seq_len": 512, "trainable_ratio": "full", "recompute": "auto",
                "efficiency": None, "overlap_slowdown": None, "group_nodes": 1,
                "runtime": None, "compute_model": None, "attention": None,
                "memory_model": None, "logit_bytes": None, "precision": "bf16",
                "tp": 1, "pp": 1, "pp_schedule": "1f1b", "virtual_stages": None,
                "sequence_parallel": False, "fidelity": "accurate"}


def _int(v: Any, where: str, low: int = 1) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < low:
        raise InputError(f"{where} = {v!r} must be an integer >= {low}")
    return v
