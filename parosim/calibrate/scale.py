"""Calibration across scales: the ``scale:N`` hold-out and the fit warnings.

``--holdout scale:N`` (both ``calibrate --nccl-tests`` and ``calibrate --steps``) fits the
measurements taken on at most N nodes and reports the error on those above N: the question a
user asks of a fit (measure a few nodes, predict many). :func:`fit_warnings` says when a fit
cannot be trusted: its worst in-sample error exceeds :data:`WORST_FIT_PCT` (the model cannot
represent the data), a parameter is not identified, or every fitted measurement ran on one
node count (nothing in the data depends on scale, so every scale-out cost keeps its base
value).
"""

from __future__ import annotations

from ..errors import InputError

#: worst in-sample |error| (%) above which a fit is reported as unable to represent the data
WORST_FIT_PCT = 25.0


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


__all__ = ["WORST_FIT_PCT", "fit_warnings", "split_scale"]
