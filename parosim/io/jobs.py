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

A job takes every per-job field of ``parosim simulate`` (defaults as there): ``model``,
``strategy``, ``algo``, ``micro_batch``, ``accum``, ``seq_len``, ``trainable_ratio``,
``recompute`` (auto / on / off), ``efficiency``, ``overlap_slowdown``, ``group_nodes``,
``runtime`` (ideal / deepspeed / fsdp / paro / a YAML path), ``precision`` (bf16 / fp8),
``compute_model``, ``attention``,
``memory_model``, ``logit_bytes``;
``name`` and ``nodes`` (cluster node indices, in the job's rank order) are required. Fields of
the whole cluster (``cluster``, ``nodes`` count, bandwidths, GPU memory) go at the top.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import InputError
from .yamlspec import check_keys, read_yaml

TOP_KEYS = {"cluster", "nodes", "steps", "jobs", "nic_bandwidth", "intra_bandwidth",
            "gpu_memory"}
JOB_KEYS = {"name", "nodes", "model", "strategy", "algo", "micro_batch", "accum", "seq_len",
            "trainable_ratio", "recompute", "efficiency", "overlap_slowdown", "group_nodes",
            "runtime", "compute_model", "attention", "memory_model", "logit_bytes",
            "precision"}
JOB_DEFAULTS = {"model": "llama-7b", "strategy": "NIG", "algo": None, "micro_batch": 4,
                "accum": 10, "seq_len": 512, "trainable_ratio": "full", "recompute": "auto",
                "efficiency": None, "overlap_slowdown": None, "group_nodes": 1,
                "runtime": None, "compute_model": None, "attention": "flash",
                "memory_model": "korthikanti", "logit_bytes": None, "precision": "bf16"}


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


def load_jobs(path: str | Path):
    """(cluster spec, list of :class:`~parosim.studies.jobs.Job`, steps) from a jobs YAML."""
    from ..simulate.step import with_overrides
    from ..spec.training import DEFAULT_COMPUTE_EFFICIENCY, TrainingSpec, parse_trainable_ratio
    from ..studies.jobs import make_job
    from ..units import parse_bandwidth, parse_size
    from .cluster import load_cluster
    from .model import load_model
    from .runtime import load_runtime

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
        if rt.collective_algo is not None and p["algo"] is not None:
            raise InputError(f"{jw}: algo {p['algo']} cannot apply: runtime {rt.name} fixes "
                             f"each collective's algorithm ({rt.collective_algo}); expected "
                             "no algo, or runtime ideal")
        jobs.append(make_job(str(p["name"]), load_model(p["model"]), p["strategy"], cluster,
                             nd, training, p["algo"] or "ho-ring",
                             _int(p["group_nodes"], f"{jw}: group_nodes"), rt))
    return cluster, jobs, steps
