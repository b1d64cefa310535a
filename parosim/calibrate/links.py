"""Calibration: fit a cluster's link and protocol parameters to measured collective times.

One room for fitting (``parosim calibrate`` and ``parosim validate`` share it). A
:class:`Measurement` is one measured collective (op, size, the cluster it ran on, time); a
:class:`Param` is one field of the :class:`~parosim.spec.system.ClusterSpec` (a link bandwidth, a
latency, a per-call or per-protocol cost). :func:`fit` finds the parameters that minimise

    sum_i ln(T_sim,i / T_meas,i) ** 2

(relative errors, symmetric in over- and under-prediction, so a 16 GB point weighs as much as an
8 B one) with ``scipy.optimize.least_squares`` (trust-region reflective, bounded), each parameter
searched in log space between physical bounds. ``T_sim`` is the simulator's closed form
(:func:`parosim.collectives.closed_form_time`) of the chosen algorithm, which the flow-level
engine matches to within 1% (tests); the result is therefore whatever the cost model can
express, no more: a behaviour the model lacks shows up as a fit error, not as a hidden knob.

A fit always reports its error on data it did not see: :func:`split_holdout` keeps part of the
measurements out (every other size, one op, a size range, one log) and :class:`Fit` holds
both the fit rows and the held-out rows.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field, fields, is_dataclass, replace

import numpy as np

from ..collectives import Algo, Op, Scope, closed_form_time, parse_enum
from ..collectives.bench import cluster_for_log
from ..collectives.nccl import log2i, tuner_rates
from ..errors import InputError
from ..spec.system import ClusterSpec
from ..units import parse_size
from .scale import split_scale, standard_errors


@dataclass(frozen=True)
class Measurement:
    """One measured collective on ``spec`` (its node count is the run's)."""

    op: Op
    size_bytes: int
    measured_s: float
    spec: ClusterSpec
    log: str = ""       # where it comes from (a file, a source)
    scope: Scope = Scope.GLOBAL


@dataclass(frozen=True)
class Param:
    """One fitted field: ``section.key`` as in the cluster YAML (``nic.bandwidth``)."""

    name: str
    get: Callable[[ClusterSpec], float]
    set: Callable[[ClusterSpec, float], ClusterSpec]
    lo: float
    hi: float
    unit: str  # "B/s" or "s": how the YAML writes it


def _sub(section: str, attr: str) -> tuple[Callable, Callable]:
    def get(s):
        return getattr(getattr(s, section), attr)

    def set_(s, v):
        return replace(s, **{section: replace(getattr(s, section), **{attr: float(v)})})

    return get, set_


# name -> (section attribute, field, lower bound, upper bound, unit)
_KNOWN = {
    "intra_node.bandwidth": ("intra", "bandwidth_Bps", 1e9, 2e12, "B/s"),
    "intra_node.latency": ("intra", "latency_s", 1e-8, 1e-4, "s"),
    "nic.bandwidth": ("nic", "bandwidth_Bps", 1e8, 1e12, "B/s"),
    "nic.latency": ("nic", "latency_s", 1e-8, 1e-3, "s"),
    "pcie.bandwidth": ("pcie", "bandwidth_Bps", 1e9, 1e12, "B/s"),
    "collective.call_overhead": ("collective", "call_overhead_s", 1e-8, 1e-3, "s"),
    "collective.step_latency": ("collective", "step_latency_s", 1e-9, 1e-4, "s"),
    "collective.phase_overhead": ("collective", "phase_overhead_s", 1e-9, 1e-3, "s"),
    "collective.chain_chunk": ("collective", "chain_chunk_bytes", 1024.0, 64.0 * 2**20, "B"),
}


def make_param(name: str) -> Param:
    """A :class:`Param` by its YAML name: one of :data:`_KNOWN`, or any float field of the
    ``collective`` section (``collective.<field without _s/_Bps>``), bounded generically."""
    if name in _KNOWN:
        sec, attr, lo, hi, unit = _KNOWN[name]
        g, s = _sub(sec, attr)
        return Param(name, g, s, lo, hi, unit)
    attrs = _resolve(name)
    if attrs is not None and attrs[0] == "collective":
        last = attrs[-1]

        def get(s, attrs=attrs):
            for a in attrs:
                s = getattr(s, a)
            return float(s)

        def set_(s, v, attrs=attrs):
            return _set_path(s, attrs, float(v))

        if last.endswith("_Bps"):
            return Param(name, get, set_, 1e8, 1e13, "B/s")
        if last.endswith("_s"):
            return Param(name, get, set_, 1e-9, 1e-3, "s")
        if "eff" in last:
            return Param(name, get, set_, 1e-2, 1.0, "")
        return Param(name, get, set_, 1e-3, 1e3, "")
    raise InputError(f"--params: {name!r} is not a fittable parameter; expected one of "
                     f"{', '.join(_KNOWN)} or a numeric collective.* field")


def _resolve(name: str) -> list[str] | None:
    """YAML path ``collective.ring_simple.base_latency`` -> attribute path on a ClusterSpec
    (``collective``, ``ring_simple``, ``base_latency_s``), or None; numeric leaves only."""
    obj: object = ClusterSpec()
    attrs: list[str] = []
    parts = name.split(".")
    for i, key in enumerate(parts):
        if not is_dataclass(obj):
            return None
        names = {f.name for f in fields(obj)}
        cands = [key, key + "_s", key + "_Bps"] if i == len(parts) - 1 else [key]
        if key == "intra_node":
            cands = ["intra"]
        hit = next((c for c in cands if c in names), None)
        if hit is None:
            return None
        attrs.append(hit)
        obj = getattr(obj, hit)
    if not isinstance(obj, float):  # integers (channels, NIC counts) are not fitted
        return None
    return attrs


def _set_path(obj, attrs: list[str], value: float):
    if len(attrs) == 1:
        return replace(obj, **{attrs[0]: value})
    return replace(obj, **{attrs[0]: _set_path(getattr(obj, attrs[0]), attrs[1:], value)})


def default_params(meas: list[Measurement]) -> list[str]:
    """What the measurements can identify: the intra-node link and the per-call cost always;
    the NIC when some measurement spans nodes; with the NCCL model (``collective.model:
    nccl``) every protocol's base latency and per-hop latency over the node's link
    (``nvlink_latency``, or ``pcie_latency`` on a PCIe-switch node) and, on several nodes,
    over the network (``net_latency``), and the bandwidth efficiency of LL and LL128; for
    ring and (on several nodes, for all-reduce) tree; on several nodes also NCCL's
    ``net_overhead`` (the floor of an inter-node ring's intra-node steps; not in the 2.8
    profile, which has none). Caps stay at NCCL's values.

    A tree's latency is ``base + 2 ((ppn - 1) hop + log2(nodes) net)``: with one value of
    log2(nodes) among the tree measurements (all on 2 nodes, say) its ``net_latency`` cannot
    be told from its ``base_latency``, and with one ranks-per-node its hop latency cannot
    either; such a latency keeps NCCL's value instead of a fitted one that would carry an
    arbitrary share to other node counts."""
    names = ["intra_node.bandwidth", "intra_node.latency", "collective.call_overhead"]
    multi = any(m.spec.nodes > 1 for m in meas)
    if multi:
        names += ["nic.bandwidth", "nic.latency"]
    tun = meas[0].spec.collective if meas else None
    if tun is not None and getattr(tun, "model", "ideal") == "nccl":
        algs = [a for a in tun.algorithms
                if a == "ring" or (multi and any(m.op is Op.ALL_REDUCE for m in meas))]
        spec0 = meas[0].spec
        if multi and getattr(tun, "nccl_version", "2.20") == "2.20":
            names.append("collective.net_overhead")  # NCCL netOverhead (inter-node rings)
        hop = ("pcie_latency" if getattr(spec0.intra_fabric, "value", "") == "pcie-switch"
               else "nvlink_latency")
        trees = [(log2i(m.spec.nodes), m.spec.gpus_per_node) for m in meas
                 if m.op is Op.ALL_REDUCE and m.spec.nodes > 1]
        for a in algs:
            tree = a == "tree"
            for p in tun.protocols:
                names.append(f"collective.{a}_{p}.base_latency")
                if spec0.gpus_per_node > 1 and (not tree or len({t[1] for t in trees}) > 1):
                    names.append(f"collective.{a}_{p}.{hop}")
                if multi and (not tree or len({t[0] for t in trees}) > 1):
                    names.append(f"collective.{a}_{p}.net_latency")
            for p in tun.protocols:
                if p != "simple":
                    names.append(f"collective.{a}_{p}.bw_efficiency")
    return names


@dataclass
class Fit:
    """A fitted spec, the fitted values, and rows of (simulated, measured, error %)."""

    spec: ClusterSpec
    params: list[str]
    values: dict[str, float]
    identified: dict[str, bool]
    fit_rows: list[dict] = field(default_factory=list)
    held_rows: list[dict] = field(default_factory=list)
    algo: str = ""
    holdout: str = "none"
    cost: float = 0.0
    #: fitted sizes - fitted parameters, and per parameter its one-standard-error range
    #: (:func:`parosim.calibrate.scale.standard_errors`)
    dof: int = 0
    standard_errors: dict = field(default_factory=dict)

    @staticmethod
    def _stats(rows: list[dict], min_size: int = 0) -> dict:
        e = [abs(r["error_pct"]) for r in rows if r["size_bytes"] >= min_size]
        return {"n": len(e), "median_abs_error_pct": statistics.median(e) if e else None,
                "max_abs_error_pct": max(e) if e else None}

    def summary(self, min_size: int = 0) -> dict:
        return {"fit": self._stats(self.fit_rows, min_size),
                "held_out": self._stats(self.held_rows, min_size)}


def _rows(spec_of: Callable[[Measurement], ClusterSpec], meas: list[Measurement], algo: Algo,
          what: str) -> list[dict]:
    out = []
    for m in meas:
        sim = closed_form_time(spec_of(m), m.op, m.scope, m.size_bytes, algo)
        out.append({"what": what, "log": m.log, "op": m.op.value, "size_bytes": m.size_bytes,
                    "nodes": m.spec.nodes, "measured_s": m.measured_s, "simulated_s": sim,
                    "error_pct": 100.0 * (sim - m.measured_s) / m.measured_s})
    return out


class _HashOnce(ClusterSpec):
    """A ClusterSpec that computes its (deep) hash once: the cost model's caches are keyed by
    the spec, and a fit evaluates thousands of specs, each for every measured size."""

    def __hash__(self) -> int:
        h = self.__dict__.get("_hash")
        if h is None:
            h = ClusterSpec.__hash__(self)
            self.__dict__["_hash"] = h
        return h


def _hash_once(spec: ClusterSpec) -> ClusterSpec:
    return _HashOnce(**{f.name: getattr(spec, f.name) for f in fields(ClusterSpec) if f.init})


def apply(base: ClusterSpec, params: list[Param], values) -> ClusterSpec:
    s = base
    for p, v in zip(params, values, strict=True):
        s = p.set(s, float(v))
    return s


#: rounds of a fit under ``collective.choice: tuner`` (see :func:`fit`)
TUNER_ROUNDS = 3


def _pinned(spec: ClusterSpec, rates: tuple[float, float]) -> ClusterSpec:
    return replace(spec, collective=replace(spec.collective, tuner_intra_bandwidth_Bps=rates[0],
                                            tuner_net_bandwidth_Bps=rates[1]))


def fit(base: ClusterSpec, meas: list[Measurement], algo: Algo,
        params: list[str] | None = None, held: list[Measurement] | None = None,
        holdout: str = "none", starts: tuple[float, ...] = (0.0,),
        max_nfev: int = 100) -> Fit:
    """Fit ``params`` (YAML names; default :func:`default_params`) of ``base`` to ``meas``.

    Every measurement's own ``spec`` gives its node count (and anything else that differs
    per run); the fitted values are set on it. ``starts``: shifts of ln(parameters) from the
    base values to start the search from (the best end wins: the cost is piecewise smooth);
    ``max_nfev``: cost evaluations per start. Deterministic: same inputs, same result.

    Under ``collective.choice: tuner`` with the tuner's link rates left to the cluster's links
    (``tuner_intra_bandwidth`` / ``tuner_net_bandwidth`` 0), NCCL's choice would move with
    the fitted links and make the cost jump inside the search. The fit therefore pins the
    tuner's rates at the base's links, fits, pins them at the fitted links and fits again
    from there, until they move by less than 1 % (at most :data:`TUNER_ROUNDS` rounds); the
    result keeps the last pinned rates (written to the YAML).
    """
    tun = base.collective
    if getattr(tun, "choice", "") != "tuner" or (tun.tuner_intra_bandwidth_Bps
                                                 and tun.tuner_net_bandwidth_Bps):
        return _fit(base, meas, algo, params, held, holdout, starts, max_nfev)
    rates = tuner_rates(base)
    for _ in range(TUNER_ROUNDS):
        f = _fit(_pinned(base, rates), [replace(m, spec=_pinned(m.spec, rates)) for m in meas],
                 algo, params, [replace(m, spec=_pinned(m.spec, rates)) for m in held or []],
                 holdout, starts, max_nfev)
        links = (f.spec.intra.bandwidth_Bps, f.spec.nic.per_node * f.spec.nic.bandwidth_Bps)
        if all(abs(a / b - 1) < 0.01 for a, b in zip(links, rates, strict=True)):
            break
        rates = links
        base = apply(base, [make_param(n) for n in f.params],
                     [f.values[n] for n in f.params])  # the next round starts from here
    return f


def _fit(base: ClusterSpec, meas: list[Measurement], algo: Algo,
         params: list[str] | None, held: list[Measurement] | None, holdout: str,
         starts: tuple[float, ...], max_nfev: int) -> Fit:
    """One least-squares fit (:func:`fit`)."""
    from scipy.optimize import least_squares  # deferred: scipy loads only when this runs

    if not meas:
        raise InputError("calibration has no measurements left to fit (every size is held out "
                         "by --holdout or below --min-size); expected some sizes in the fit")
    names = params or default_params(meas)
    ps = [make_param(n) for n in names]
    t = np.array([m.measured_s for m in meas])
    if not np.all(t > 0):
        bad = next(m for m in meas if not m.measured_s > 0)
        raise InputError(f"calibration: a measured time of {bad.measured_s!r} s (an nccl-tests "
                         "log of --nccl-tests) is not positive; expected positive times")
    lo = np.log([p.lo for p in ps])
    hi = np.log([p.hi for p in ps])
    x0 = np.clip(np.log([max(p.get(base), p.lo) for p in ps]), lo + 1e-9, hi - 1e-9)

    groups: dict[ClusterSpec, list[int]] = {}
    for i, m in enumerate(meas):
        groups.setdefault(m.spec, []).append(i)

    def resid(x):
        out = np.empty(len(meas))
        vals = np.exp(x)
        for s0, idx in groups.items():
            spec = _hash_once(apply(s0, ps, vals))  # one spec per run and point, hashed once
            for i in idx:
                m = meas[i]
                sim = closed_form_time(spec, m.op, m.scope, m.size_bytes, algo)
                out[i] = math.log(sim / m.measured_s)
        return out

    best = None
    # a few deterministic starts: the base values, and every parameter scaled down / up
    for shift in starts:
        xs = np.clip(x0 + shift, lo + 1e-9, hi - 1e-9)
        r = least_squares(resid, xs, bounds=(lo, hi), method="trf", x_scale=1.0,
                          diff_step=1e-3, ftol=1e-6, xtol=1e-6, max_nfev=max_nfev)
        if best is None or r.cost < best.cost - 1e-12:
            best = r
    assert best is not None
    x = best.x
    jac = np.abs(best.jac).sum(axis=0) if best.jac is not None else np.zeros(len(ps))
    identified = {p.name: bool(j > 1e-6) for p, j in zip(ps, jac, strict=True)}
    # a parameter with no effect at the optimum (the NIC on one-node logs, a link that another
    # one caps) goes back to its base value when that leaves the fit unchanged; otherwise it
    # keeps the value the search moved it to (e.g. out of the way of the link that binds)
    values = {p.name: float(math.exp(v)) for p, v in zip(ps, x, strict=True)}
    cost = float(np.sum(resid(x) ** 2))
    for i, p in enumerate(ps):
        if identified[p.name] or not p.get(base) > 0:
            continue
        x_try = x.copy()
        x_try[i] = math.log(p.get(base))
        if float(np.sum(resid(x_try) ** 2)) <= cost * (1 + 1e-12) + 1e-300:
            x = x_try
            values[p.name] = float(p.get(base))
    spec = apply(base, ps, [values[p.name] for p in ps])
    se = standard_errors(best.jac, best.fun, values, [False] * len(ps))
    f = Fit(spec, names, values, identified, algo=algo.value, holdout=holdout,
            cost=float(best.cost), dof=se["dof"], standard_errors=se["params"])

    def fitted(m):
        return apply(m.spec, ps, [values[p.name] for p in ps])

    f.fit_rows = _rows(fitted, meas, algo, "fit")
    if held:
        f.held_rows = _rows(fitted, held, algo, "held-out")
    return f


def nnls_relative(F: np.ndarray, t: np.ndarray) -> np.ndarray:
    """theta >= 0 minimising sum(((F theta - t) / t)^2): for cost models linear in their
    parameters (``parosim validate``'s alpha-beta microbenchmarks), with
    ``scipy.optimize.lsq_linear`` (bounded linear least squares). Parameters no measurement
    depends on stay 0.

    >>> nnls_relative(np.array([[1.0, 1.0], [1.0, 2.0]]), np.array([3.0, 5.0])).round(6)
    array([1., 2.])
    """
    from scipy.optimize import lsq_linear  # deferred: scipy loads only when this runs

    F = np.asarray(F, dtype=float)
    t = np.asarray(t, dtype=float)
    used = np.abs(F).sum(axis=0) > 0
    theta = np.zeros(F.shape[1])
    if used.any():
        A = F[:, used] / t[:, None]
        scale = np.abs(A).max(axis=0)  # columns of very different magnitude (s vs s/B)
        r = lsq_linear(A / scale, np.ones(len(t)), bounds=(0.0, np.inf), method="bvls",
                       tol=1e-14, lsmr_tol="auto")
        theta[used] = r.x / scale
    return np.clip(theta, 0.0, None)


def split_holdout(meas: list[Measurement], how: str) -> tuple[list[Measurement],
                                                              list[Measurement]]:
    """(fit, held-out) by ``how``: ``none``; ``every-other`` (alternate sizes of each log,
    the smallest kept in the fit); ``op:NAME`` (all measurements of one op); ``sizes:LO-HI``
    (sizes in [LO, HI] bytes held out, units allowed: ``sizes:64KiB-16MiB``, open ends
    ``sizes:1GiB-``); ``log:TEXT`` (measurements of logs whose name contains TEXT)."""

    how = (how or "none").strip()
    if how == "none":
        return list(meas), []
    held: list[Measurement] = []
    if how == "every-other":
        by_log: dict[str, list[Measurement]] = {}
        for m in meas:
            by_log.setdefault(f"{m.log}|{m.op.value}", []).append(m)
        keep = []
        for ms in by_log.values():
            ms = sorted(ms, key=lambda m: m.size_bytes)
            keep += ms[0::2]
            held += ms[1::2]
        fitted = [m for m in meas if m in keep]
        held = [m for m in meas if m not in keep]
    elif how.startswith("op:"):
        op = parse_enum(Op, how[3:], "--holdout op")
        fitted = [m for m in meas if m.op is not op]
        held = [m for m in meas if m.op is op]
    elif how.startswith("sizes:"):
        lo_t, sep, hi_t = how[6:].partition("-")
        if not sep:
            raise InputError(f"--holdout {how!r}: expected sizes:LO-HI, e.g. sizes:64KiB-16MiB")
        lo = parse_size(lo_t, "--holdout sizes", allow_zero=True) if lo_t.strip() else 0
        hi = parse_size(hi_t, "--holdout sizes") if hi_t.strip() else float("inf")
        fitted = [m for m in meas if not lo <= m.size_bytes <= hi]
        held = [m for m in meas if lo <= m.size_bytes <= hi]
    elif how.startswith("scale:"):
        fitted, held = split_scale(meas, how, lambda m: m.spec.nodes)
    elif how.startswith("log:"):
        key = how[4:]
        fitted = [m for m in meas if key not in m.log]
        held = [m for m in meas if key in m.log]
    else:
        raise InputError(f"--holdout {how!r} is not known; expected none, every-other, "
                         "op:NAME, sizes:LO-HI, log:TEXT or scale:N")
    if not held:
        raise InputError(f"--holdout {how!r} holds out nothing; expected it to select some "
                         "measurements")
    if not fitted:
        raise InputError(f"--holdout {how!r} holds out everything; nothing is left to fit")
    return fitted, held


def measurements_from_log(base: ClusterSpec, log, nodes: int | None = None,
                          min_size: int = 1, in_place: bool = False) -> list[Measurement]:
    """Measurements of one parsed nccl-tests log on ``base`` resized to the log's ranks."""
    spec = cluster_for_log(base, log, nodes)
    out = []
    for r in log.rows:
        if r.size_bytes < min_size:
            continue
        t = r.time_ip_s if (in_place and r.time_ip_s is not None) else r.time_s
        out.append(Measurement(Op(log.op), r.size_bytes, t, spec, log.path))
    return out
