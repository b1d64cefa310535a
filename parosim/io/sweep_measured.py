"""The measured points of a sweep's scalability figure (the ``measured`` key of a figure
entry, docs/sweeps.md "figures"): a CSV read and validated when the spec is loaded, so a bad
file is one line naming the key before any point runs."""

from __future__ import annotations

import csv
import math
from pathlib import Path

from ..errors import InputError

#: a measured-points file's columns besides x and the metric (docs/sweeps.md, "figures")
MEASURED_COLUMNS = ("series", "scaling_efficiency", "source")


def measured_rows(fig: dict, where: str, base_dir: Path | None) -> tuple[dict, ...]:
    """The rows of a scalability figure's ``measured`` CSV, validated: ``series`` (matched to
    the figure's lines by name or by the strategy's short name), the figure's x column
    (default ``gpus``), and the figure's metric (default ``tokens_per_s``) and / or
    ``scaling_efficiency``, positive numbers; optional ``source``, and any column the
    figure's ``by`` names (a row then shows only in its group). ``#`` lines are comments."""
    name = f"{where}: figure {fig['plot']!r} measured"
    if fig["plot"] != "scalability":
        raise InputError(f"{name}: measured points are drawn on scalability figures only; "
                         f"expected plot: scalability, or no measured key")
    raw = fig["measured"]
    if not isinstance(raw, str) or not raw.strip():
        raise InputError(f"{name} {raw!r} is not a file path; expected a CSV path (relative "
                         "to the spec's folder)")
    path = Path(raw)
    if not path.is_absolute() and not path.exists() and base_dir is not None:
        path = base_dir / raw
    try:
        text = path.read_text()
    except OSError as e:
        raise InputError(f"{name} {raw!r} cannot be read: {e.strerror or e}") from None
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    rows = list(csv.DictReader(lines))
    x = fig.get("x") or "gpus"
    metric = fig.get("metric") or "tokens_per_s"
    header = list(rows[0]) if rows else []
    allowed = {x, metric, *MEASURED_COLUMNS, *fig.get("by", [])}
    extra = [c for c in header if c not in allowed]
    if not rows or "series" not in header or x not in header or extra or not (
            metric in header or "scaling_efficiency" in header):
        raise InputError(f"{name} {raw!r}: columns {', '.join(header) or 'none'}; expected "
                         f"series, {x}, {metric} and / or scaling_efficiency (optional: "
                         f"source{''.join(', ' + b for b in fig.get('by', []))})")
    out = []
    for i, r in enumerate(rows, start=1):
        row = {k: (v or "").strip() for k, v in r.items()}
        if not row["series"]:
            raise InputError(f"{name} {raw!r} row {i}: series is empty; expected a name")
        for k in (x, metric, "scaling_efficiency"):
            if k not in row or (k != x and row[k] == ""):
                continue
            try:
                v = float(row[k])
            except ValueError:
                v = math.nan
            if not (math.isfinite(v) and v > 0):
                raise InputError(f"{name} {raw!r} row {i}: {k} = {row[k]!r}; expected a "
                                 "positive number")
            row[k] = v
        if not any(isinstance(row.get(k), float) for k in (metric, "scaling_efficiency")):
            raise InputError(f"{name} {raw!r} row {i}: neither {metric} nor "
                             "scaling_efficiency is given; expected one of them")
        out.append(row)
    return tuple(out)
