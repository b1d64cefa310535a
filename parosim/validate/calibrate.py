"""Calibration: fit the cluster's α (latency) and β (1/bandwidth) per link class and the
per-call overhead from short ring microbenchmarks on the target, and store them as a ClusterSpec.

The simulator's cost of a ring phase is ``steps * alpha + bytes_per_rank / B`` plus
``collective.call_overhead_s`` per collective (:mod:`parosim.collectives.cost`), where alpha and
B depend on the link class the ring crosses: the intra-node link (``intra``) or the NIC
(``nic``, shared by the rings that leave a node through it). That time is linear in

    theta = (intra.latency_s, nic.latency_s, 1/intra.bandwidth_Bps, 1/nic.bandwidth_Bps,
             collective.call_overhead_s, collective.phase_overhead_s)

for single-scope rings, so ``T = F @ theta`` with a feature row F per microbenchmark, read off
the simulator's own closed form by finite differences (the fit is thus consistent with whatever
the cost model counts: steps, bytes, NIC sharing). theta is the non-negative least-squares
solution minimising the *relative* error over the microbenchmarks: all-gather and all-reduce
(k-1 and 2(k-1) steps, which separates per-step latency from per-call overhead) on the intra
and inter scopes at a few sizes, and hierarchical (multi-phase) programs that separate the
per-phase launch cost from the per-call one. ``collective.step_latency_s`` is left at 0: each
class's latency
absorbs the per-step software cost of the executor. PCIe is set to be no bottleneck (the
emulated NIC *is* the node's network path).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from ..calibrate.links import nnls_relative  # noqa: F401  (the shared solver; re-exported)
from ..collectives import Algo, Op, Scope, lower, program_time
from ..errors import InputError
from ..spec.system import ClusterSpec, CollectiveTuning, GPUSpec, LinkSpec, NICSpec
from .emulate import Shaping
from .executor import Launch, auto_iters, collective_task, run_tasks

MiB = 2**20
# calibration sizes differ from validate's default evaluation sizes (1, 4, 16 MiB), so no
# evaluated collective is a program the fit saw (rows say so: ``seen_in_calibration``)
CAL_SIZES = (64 * 1024, 512 * 1024, 8 * MiB)
_NO_PCIE = LinkSpec(1e13, 0.0)  # "no bottleneck": the emulated NIC path is the whole path
# A rank's "GPU": compute ops sleep their simulated duration, so its speed only sets how long
# compute takes next to the emulated network: 0.2 TFLOP/s makes the validation model's layers
# take a few ms, like its collectives on a 300 Mbit/s NIC (a comm-bound regime, as in the paper).
EMULATED_GPU = GPUSpec(model="cpu-rank (emulated)", memory_bytes=80 * 10**9, peak_flops=2e11,
                       hbm_bandwidth_Bps=2.0e12)
PARAMS = ("intra_latency_s", "nic_latency_s", "intra_s_per_B", "nic_s_per_B", "call_overhead_s",
          "phase_overhead_s")


def emulated_spec(nodes: int, ranks_per_node: int, shaping: Shaping,
                  name: str = "emulated") -> ClusterSpec:
    """The nominal ClusterSpec of an emulated cluster (before calibration).

    The node's loopback is shared by its ranks, so a rank's nominal intra bandwidth is
    ``intra_rate / ranks_per_node``. One NIC per node on one switch.
    """
    return ClusterSpec(
        name=name, nodes=nodes, gpus_per_node=ranks_per_node,
        gpu=EMULATED_GPU,
        intra=LinkSpec(shaping.intra_rate_Bps / ranks_per_node, shaping.intra_latency_s),
        pcie=_NO_PCIE,
        nic=NICSpec(per_node=1, bandwidth_Bps=shaping.nic_rate_Bps,
                    latency_s=shaping.nic_latency_s),
        # gloo ranks on CPUs: one thread per rank drives every phase's steps
        collective=CollectiveTuning(serial_progress=True),
        notes=(f"emulated: {nodes} network namespaces x {ranks_per_node} ranks, NIC "
               f"{shaping.nic_rate_Bps * 8 / 1e6:g} Mbit/s shaped with tc, loopback "
               f"{shaping.intra_rate_Bps * 8 / 1e6:g} Mbit/s shared by a node's ranks"))


def spec_with(base: ClusterSpec, theta) -> ClusterSpec:
    """``base`` with the six calibrated parameters (see module docstring) set."""
    a_i, a_n, s_i, s_n, call, phase = (float(x) for x in theta)
    return replace(base, intra=LinkSpec(1.0 / s_i, a_i), pcie=_NO_PCIE,
                   nic=replace(base.nic, bandwidth_Bps=1.0 / s_n, latency_s=a_n),
                   collective=replace(base.collective, step_latency_s=0.0,
                                      call_overhead_s=call, phase_overhead_s=phase))


def _theta0(base: ClusterSpec) -> np.ndarray:
    return np.array([base.intra.latency_s, base.nic.latency_s, 1 / base.intra.bandwidth_Bps,
                     1 / base.nic.bandwidth_Bps, base.collective.call_overhead_s,
                     base.collective.phase_overhead_s])


def features(base: ClusterSpec, program) -> np.ndarray:
    """dT/dtheta of the closed-form time of ``program`` (exact: T is linear in theta)."""
    th = _theta0(base)
    scale = np.array([1e-4, 1e-4, th[2], th[3], 1e-4, 1e-4])
    t0 = program_time(spec_with(base, th), program)
    f = np.empty(len(th))
    for j in range(len(th)):
        d = th.copy()
        d[j] += scale[j]
        f[j] = (program_time(spec_with(base, d), program) - t0) / scale[j]
    return f


@dataclass
class Calibration:
    """A fitted cluster spec and the microbenchmarks it was fitted to."""

    spec: ClusterSpec
    theta: dict[str, float]
    rows: list[dict] = field(default_factory=list)

    @property
    def seen(self) -> set[tuple[str, str, str, int]]:
        """(op, algo, scope, size) of every calibration program."""
        return {(r["op"], r["algo"], r["scope"], int(r["size_bytes"])) for r in self.rows}

    @property
    def fit_error_pct(self) -> float:
        return max((abs(r["error_pct"]) for r in self.rows), default=0.0)


def microbenchmarks(base: ClusterSpec, sizes=CAL_SIZES) -> list[tuple[str, object]]:
    """(id, Program) of the calibration set: all-gather and all-reduce rings on the intra and
    inter scopes at ``sizes``, and the flat global ring (its k-1 and 2(k-1) steps separate the
    per-step latency from the per-call overhead) at the two smallest sizes."""
    out = []
    scopes = [(Scope.INTRA, base.group_size, sizes), (Scope.INTER, base.groups, sizes),
              (Scope.GLOBAL, base.gpus, sorted(sizes)[:2])]
    for scope, k, ss in scopes:
        if k < 2 or (scope is Scope.GLOBAL and (base.groups < 2 or base.group_size < 2)):
            continue
        for op in (Op.ALL_GATHER, Op.ALL_REDUCE):
            for size in ss:
                out.append((f"cal/{scope.value}/{op.value}/{int(size)}",
                            lower(base, op, scope, size, Algo.RING)))
    if base.groups >= 2 and base.group_size >= 2:  # 2 and 3 phases per call
        for op in (Op.ALL_GATHER, Op.ALL_REDUCE):
            for size in sorted(sizes)[:2]:
                out.append((f"cal/hierarchical/{op.value}/{int(size)}",
                            lower(base, op, Scope.GLOBAL, size, Algo.HIERARCHICAL)))
    return out


def _start(base: ClusterSpec) -> ClusterSpec:
    """Starting point of the fit: the nominal spec with a NIC hop slower to start than an
    intra-node hop (so the flat ring's linearisation picks the NIC's latency), as on hardware."""
    a_i = max(base.intra.latency_s, 20e-6)
    a_n = max(base.nic.latency_s, 2 * a_i)
    return spec_with(base, [a_i, a_n, 1 / base.intra.bandwidth_Bps,
                            1 / base.nic.bandwidth_Bps, base.collective.call_overhead_s,
                            base.collective.phase_overhead_s])


def fit(base: ClusterSpec, programs: list[tuple[str, object]],
        measured_s: dict[str, float], max_chunks: int | None = None,
        rounds: int = 4) -> Calibration:
    """Fit theta to measured times of the microbenchmark programs.

    The flat ring's time has a max() over link classes, so the fit re-linearises at each new
    estimate (Gauss-Newton on a piecewise-linear model; ``rounds`` at most).
    ``max_chunks`` (if given) caps HO-Ring's chunk count in the fitted spec.
    """
    if not programs:
        raise InputError("calibration needs at least 2 ranks per node or 2 nodes")
    t = np.array([measured_s[i] for i, _ in programs])
    cur = _start(base)
    th0 = _theta0(cur)
    theta = th0
    for _ in range(rounds):
        F = np.array([features(cur, p) for _, p in programs])
        new = nnls_relative(F, t)
        for j in (2, 3):  # an unidentifiable bandwidth keeps its nominal value
            if new[j] <= 0:
                new[j] = th0[j]
        done = np.allclose(new, theta, rtol=1e-6, atol=1e-12)
        theta, cur = new, spec_with(base, new)
        if done:
            break
    spec = cur
    if max_chunks is not None:
        spec = replace(spec, collective=replace(spec.collective, ho_ring_max_chunks=max_chunks))
    spec = replace(spec, name=f"{base.name}-calibrated",
                   notes=base.notes + "; calibrated from ring microbenchmarks "
                   "(parosim.validate.calibrate)")
    rows = []
    for (pid, p), tm in zip(programs, t, strict=True):
        ts = program_time(spec, p)
        rows.append({"what": "calibration", "id": pid, "op": p.op.value, "algo": p.algo.value,
                     "scope": p.scope.value,
                     "size_bytes": p.size_bytes, "fitted_s": ts, "measured_s": float(tm),
                     "error_pct": 100 * (ts - tm) / tm})
    return Calibration(spec, dict(zip(PARAMS, map(float, theta), strict=True)), rows)


def calibrate(launch: Launch, base: ClusterSpec, sizes=CAL_SIZES, warmup: int = 1,
              iters: int | None = None, max_chunks: int | None = None) -> Calibration:
    """Run the microbenchmarks on ``launch`` (explicit ring steps) and fit the spec.

    ``iters`` timed runs per benchmark (default: :func:`~.executor.auto_iters` of the nominal
    prediction); each time is the median.

    >>> cal = calibrate(Launch(nodes=2, ranks_per_node=2, emulated=emu), base)  # doctest: +SKIP
    >>> print(cluster_to_yaml(cal.spec))                                        # doctest: +SKIP
    """
    programs = microbenchmarks(base, sizes)
    start = _start(base)
    tasks = [collective_task(i, p, "explicit", warmup,
                             iters or auto_iters(program_time(start, p)))
             for i, p in programs]
    res = run_tasks(launch, tasks)
    return fit(base, programs, {i: r.median_s for i, r in res.items()}, max_chunks)
