"""Calibration across scales: the ``scale:N`` hold-out and the fit warnings.

``--holdout scale:N`` (both ``calibrate --nccl-tests`` and ``calibrate --steps``) fits the
measurements taken on at most N nodes and reports the error on those above N: the question a
user asks of a fit (measure a few nodes, predict many). :func:`fit_warnings` says when a fit
cannot be trusted: its worst in-sample error exceeds :data:`WORST_FIT_PCT` (the model cannot
represent the data), a parameter is not identified, a fitted parameter is poorly identified
(:func:`standard_errors`: its one-standard-error range spans more than :data:`SE_FACTOR` either
side of its value), or every fitted measurement ran on one node count (nothing in the data
depends on scale, so every scale-out cost keeps its base value).
"""

from __future__ import annotations

import math

from ..errors import InputError

#: worst in-sample |error| (%) above which a fit is reported as unable to represent the data
WORST_FIT_PCT = 25.0
#: a fitted parameter whose one-standard-error range reaches beyond this factor above or below
#: its value is reported poorly identified
SE_FACTOR = 2.0
#: a range wider than this factor either side is printed as such, not as its numbers
SE_FACTOR_SHOWN = 1000.0


def split_scale(items: list, holdout: str, nodes_of) -> tuple[list, list]:
    """``--holdout scale:N``: (the items at up to N nodes, the items above N nodes).

    >>> split_scale([1, 2, 4, 8], "scale:2", lambda x: x)
    ([1, 2], [4, 8])
    """
    text = holdout[len("scale:"):]
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise InputError(f"--holdout {holdout!r}: expected scale:N with N a positive number of "
                         "nodes (fit at up to N nodes, report the error above)")
    fit = [x for x in items if nodes_of(x) <= n]
    held = [x for x in items if nodes_of(x) > n]
    if not fit:
        raise InputError(f"--holdout {holdout}: no measurement at {n} nodes or fewer is left "
                         "to fit; expected a larger N")
    return fit, held


def standard_errors(jac, resid, values: dict[str, float], linear: list[bool]) -> dict:
    """One standard error of each fitted parameter, in log space, from the fit's Jacobian.

    ``jac`` (rows x parameters) is the least-squares Jacobian of the residuals ``resid`` at the
    solution, in the fit's own space: d resid / d ln(value) for a parameter searched in log
    space, d resid / d value where ``linear`` (its column is then multiplied by the value:
    d / d ln v = v d / dv). The covariance is s^2 (J^T J)^-1 with s^2 = sum(resid^2) / dof, dof
    = rows - parameters; a direction the Jacobian does not span (a zero column, or a
    combination of parameters the rows cannot separate) has an unbounded error. Returns ``dof``
    and per parameter ``value``, ``low`` = value / factor, ``high`` = value x factor and
    ``factor`` = exp(one standard error of ln(value)); all three None when unbounded or when
    dof <= 0 (s^2 undefined).

    >>> r = standard_errors([[1.0], [1.0], [1.0]], [0.1, -0.1, 0.0], {"a": 2.0}, [False])
    >>> r["dof"], round(r["params"]["a"]["factor"], 4)
    (2, 1.0594)
    >>> standard_errors([[1.0]], [0.0], {"a": 2.0}, [False])["params"]["a"]["factor"] is None
    True
    """
    import numpy as np  # deferred: numpy loads only when a fit runs

    names = list(values)
    j = np.array(jac, dtype=float).reshape(len(resid), len(names))
    v = np.array([values[n] for n in names], dtype=float)
    j = j * np.where(np.array(linear, dtype=bool), v, 1.0)
    r = np.asarray(resid, dtype=float)
    dof = len(r) - len(names)
    var = np.full(len(names), np.inf)
    if dof > 0:
        s2 = float(r @ r) / dof
        _, sv, vt = np.linalg.svd(j, full_matrices=True)
        sv = np.concatenate([sv, np.zeros(len(names) - len(sv))])
        keep = sv > (sv.max(initial=0.0) * max(j.shape) * np.finfo(float).eps)
        unbounded = np.any(np.abs(vt[~keep]) > 1e-6, axis=0)
        var = np.where(unbounded, np.inf,
                       s2 * ((vt[keep] / sv[keep, None]) ** 2).sum(axis=0))
    out = {}
    for n, x, e in zip(names, v, var, strict=True):
        f = math.exp(math.sqrt(e)) if e < 700.0 ** 2 else None   # beyond: exp overflows
        out[n] = {"value": float(x), "low": float(x) / f if f else None,
                  "high": float(x) * f if f else None, "factor": f}
    return {"dof": dof, "params": out}


def _quantity(name: str, v: float) -> str:
    """A fitted value with its unit: bandwidths in GB/s, latencies and overheads in us (ms from
    1 ms)."""
    leaf = name.rsplit(".", 1)[-1]
    if leaf.endswith("bandwidth"):
        return f"{v / 1e9:.3g} GB/s"
    if leaf.endswith(("latency", "overhead")):
        return f"{v * 1e3:.3g} ms" if v >= 1e-3 else f"{v * 1e6:.3g} us"
    return f"{v:.3g}"


def se_span(name: str, p: dict) -> str:
    """``spans LOW-HIGH`` (with units), or why there are no numbers to show.

    >>> se_span("nic.bandwidth", {"value": 1e10, "low": 1e-10, "high": 1e30, "factor": 1e20})
    'exceeds x1000 either side'
    """
    if p["factor"] is None:
        return "is unbounded or undefined"
    if p["factor"] > SE_FACTOR_SHOWN:
        return f"exceeds x{SE_FACTOR_SHOWN:g} either side"
    return f"spans {_quantity(name, p['low'])}-{_quantity(name, p['high'])}"


def se_range_text(name: str, p: dict) -> str:
    """``value (one standard error: low-high)`` with units, or the reason there is no range.

    >>> se_range_text("collective.step_latency",
    ...               {"value": 3e-5, "low": 1.2e-5, "high": 7.3e-5, "factor": 2.5})
    '30 us (one standard error: 12 us-73 us, x2.5 either side)'
    """
    if p["factor"] is None or p["factor"] > SE_FACTOR_SHOWN:
        return f"{_quantity(name, p['value'])} (one standard error {se_span(name, p)})"
    return (f"{_quantity(name, p['value'])} (one standard error: {_quantity(name, p['low'])}-"
            f"{_quantity(name, p['high'])}, x{p['factor']:.3g} either side)")


def se_warnings(se: dict, identified: dict[str, bool]) -> list[str]:
    """One line per identified parameter whose one-standard-error range reaches beyond
    :data:`SE_FACTOR` either side of its value (or is unbounded), or one line when dof <= 0.

    >>> se_warnings({"dof": 2, "params": {"a": {"value": 1.0, "low": 0.4, "high": 2.5,
    ...              "factor": 2.5}}}, {"a": True})[0][:20]
    'a poorly identified:'
    """
    if se["dof"] <= 0:
        n = len(se["params"])
        return [f"{n + se['dof']} fitted rows for {n} fitted parameters (dof = {se['dof']}): the "
                "standard errors are undefined, so nothing shows how well the rows pin the "
                "parameters down; give more rows"]
    out = []
    for k, p in se["params"].items():
        if identified.get(k, True) and (p["factor"] is None or p["factor"] > SE_FACTOR):
            out.append(f"{k} poorly identified: one standard error {se_span(k, p)} around "
                       f"{_quantity(k, p['value'])} (more than x{SE_FACTOR:g} either side); the "
                       "rows barely move it, so do not extrapolate on its value")
    return out


def fit_warnings(worst_fit_pct: float | None, identified: dict[str, bool],
                 fitted_nodes: set[int]) -> list[str]:
    """One line per reason not to trust a fit (empty: none).

    >>> fit_warnings(30.0, {"nic.bandwidth": False}, {1})[0][:33]
    'worst in-sample |error| 30.0 % > '
    >>> len(fit_warnings(3.0, {"a": True}, {1, 2}))
    0
    """
    out = []
    if worst_fit_pct is not None and worst_fit_pct > WORST_FIT_PCT:
        out.append(f"worst in-sample |error| {worst_fit_pct:.1f} % > {WORST_FIT_PCT:.0f} %: "
                   "the model cannot represent these measurements; do not extrapolate from "
                   "this fit")
    missing = [k for k, v in identified.items() if not v]
    if missing:
        out.append(f"not identified by the data (kept at the base value): {', '.join(missing)}")
    if len(fitted_nodes) == 1:
        (n,) = fitted_nodes
        out.append(f"every fitted measurement ran on {n} node{'s' if n > 1 else ''}: the fit "
                   "says nothing about how costs grow with the node count (scale-out costs "
                   "keep their base values)")
    return out


__all__ = ["SE_FACTOR", "SE_FACTOR_SHOWN", "WORST_FIT_PCT", "fit_warnings", "se_range_text",
           "se_span", "se_warnings",
           "split_scale", "standard_errors"]
