"""nccl-tests in the simulator: size sweeps like ``all_reduce_perf -b 8 -e 8G -f 2`` and the
comparison of simulated with measured nccl-tests logs.

Core module: no file I/O (logs are parsed by :mod:`parosim.io.nccltests`), no pandas or
matplotlib. Times in s, sizes in bytes (the full buffer, as nccl-tests counts it), bandwidths
in GB/s (1e9 B/s).
"""

from __future__ import annotations

from dataclasses import replace

from ..errors import InputError
from ..spec.collective import A2A_ALGOS, RING_ALGOS
from ..spec.system import ClusterSpec
from . import Algo, Op, Scope, closed_form_time, parse_enum, simulate_collective

#: sizes below this are "latency-bound" and reported apart (the acceptance bounds of the
#: calibrated presets apply from here up)
SMALL_BYTES = 64 * 1024


def size_range(begin: int, end: int, factor: float) -> list[int]:
    """The sizes nccl-tests runs for ``-b begin -e end -f factor``.

    >>> size_range(8, 64, 2)
    [8, 16, 32, 64]
    """
    if begin <= 0:
        raise InputError(f"-b {begin} must be a positive size")
    if end < begin:
        raise InputError(f"-e {end} must be >= -b {begin}")
    if not factor > 1:
        raise InputError(f"-f {factor!r} must be > 1")
    out, s = [], float(begin)
    while s <= end * (1 + 1e-12):
        out.append(int(s))
        s *= factor
        if len(out) > 200:
            raise InputError(f"-b {begin} -e {end} -f {factor} gives more than 200 sizes; "
                             "expected a larger -f or a narrower range")
    return out


def parse_algos(text: str | None, op: Op | None = None) -> list[Algo]:
    """``"ring,ho-ring"`` / ``"all"`` -> algorithms (order kept, duplicates dropped); ``all``
    is every algorithm of the operation's kind (ring-based, or all-to-all)."""
    if text is None or not str(text).strip():
        raise InputError("--algo '' is empty; expected e.g. ring or nccl,ring,ho-ring or all")
    if text.strip() == "all":
        return list(A2A_ALGOS if op is Op.ALL_TO_ALL else RING_ALGOS)
    out: list[Algo] = []
    for part in str(text).split(","):
        a = parse_enum(Algo, part, "--algo")
        if a not in out:
            out.append(a)
    return out


def default_compare_algo() -> Algo:
    """``nccl`` where the NCCL model exists, else the flat ring (what NCCL runs by default for
    large messages)."""
    return getattr(Algo, "NCCL", Algo.RING)


def collective_time(spec: ClusterSpec, op: Op, size: float, algo: Algo,
                    engine: bool = True, scope: Scope = Scope.GLOBAL) -> float:
    """Simulated time of one collective: the flow-level engine, or the closed form."""
    if engine:
        return simulate_collective(spec, op, scope, size, algo).time_s
    return closed_form_time(spec, op, scope, size, algo)


def sweep(spec: ClusterSpec, op: Op, sizes: list[int], algos: list[Algo],
          scope: Scope = Scope.GLOBAL) -> list[dict]:
    """One row per (size, algorithm): the nccl-tests columns, simulated with the engine."""
    rows = []
    for size in sizes:
        for a in algos:
            r = simulate_collective(spec, op, scope, size, a)
            d = r.to_dict()
            d.pop("links", None)
            d["cluster"] = spec.name
            rows.append(d)
    return rows


def cluster_for_log(spec: ClusterSpec, log, nodes: int | None = None) -> ClusterSpec:
    """``spec`` resized to the log's ranks; refuses (InputError) when they cannot match.

    The node count is ``nodes`` (``--nodes``), else the log's (its header's hosts or its
    metadata), else nranks / gpus_per_node.
    """
    gpn = spec.gpus_per_node
    if log.gpus_per_node is not None and log.gpus_per_node != gpn:
        raise InputError(f"nccl-tests log {log.path!r} has {log.gpus_per_node} GPUs per node "
                         f"({log.nranks} ranks on {log.nodes} nodes) but cluster "
                         f"{spec.name!r} has {gpn}; expected a cluster with "
                         f"{log.gpus_per_node} GPUs per node")
    n = nodes if nodes is not None else log.nodes
    if n is None:
        if log.nranks % gpn:
            raise InputError(f"nccl-tests log {log.path!r} has {log.nranks} ranks, not a "
                             f"multiple of cluster {spec.name!r}'s {gpn} GPUs per node")
        n = log.nranks // gpn
    if n * gpn != log.nranks:
        which = f"--nodes {n}" if nodes is not None else f"the cluster has {n} nodes"
        raise InputError(f"nccl-tests log {log.path!r} has {log.nranks} ranks but {which} x "
                         f"{gpn} GPUs = {n * gpn}; expected nodes x gpus_per_node = nranks")
    return spec.with_nodes(n) if n != spec.nodes else spec


def compare_log(spec: ClusterSpec, log, algo: Algo, engine: bool = True,
                in_place: bool = False) -> list[dict]:
    """Simulated vs measured for every size > 0 of one parsed log (``spec`` already matched
    with :func:`cluster_for_log`). ``error_pct`` = 100 (simulated - measured) / measured."""
    op = Op(log.op)
    rows = []
    for r in log.rows:
        if r.size_bytes <= 0:
            continue
        meas = r.time_ip_s if (in_place and r.time_ip_s is not None) else r.time_s
        sim = collective_time(spec, op, r.size_bytes, algo, engine)
        alg = r.size_bytes / sim / 1e9
        rows.append({
            "log": log.path, "op": op.value, "algo": algo.value, "cluster": spec.name,
            "gpus": spec.gpus, "size_bytes": r.size_bytes, "measured_s": meas,
            "simulated_s": sim, "error_pct": 100.0 * (sim - meas) / meas,
            "measured_busbw_GBps": r.size_bytes / meas / 1e9 * log.busbw_factor(),
            "simulated_busbw_GBps": alg * log.busbw_factor(),
        })
    return rows


def error_summary(rows: list[dict], small: int = SMALL_BYTES) -> dict:
    """Median and worst |error| in % for sizes >= ``small`` and below it (None when empty)."""
    out = {}
    for name, sel in (("large", [r for r in rows if r["size_bytes"] >= small]),
                      ("small", [r for r in rows if r["size_bytes"] < small])):
        errs = [abs(r["error_pct"]) for r in sel]
        out[f"{name}_n"] = len(errs)
        import statistics  # deferred: loads fractions and decimal; only for the summary
        out[f"{name}_median_abs_error_pct"] = statistics.median(errs) if errs else None
        out[f"{name}_max_abs_error_pct"] = max(errs) if errs else None
    return out


def renamed(spec: ClusterSpec, name: str) -> ClusterSpec:
    return replace(spec, name=name)
