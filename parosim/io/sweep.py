"""Sweep specs (YAML) in, ``results.csv`` out: the file side of :mod:`parosim.sweep`.

A sweep spec names a grid; the sweep runs one point per element of the grid's product::

    name: allgather-1gb
    kind: collective            # step | collective
    mode: engine                # engine (simpy flow-level replay) | analytic (closed form)
    grid:                       # key -> list (or scalar); the product of all, first key slowest
      nodes: [2, 4, 8, 16]
      algo: [ring, hierarchical, ho-ring]
    fixed:                      # optional: the same value for every point
      cluster: paper-a100-roce
      op: all-gather
      size: 1GB
    figures:                    # optional: plots made from results.csv (see parosim.plots)
      - collectives
      - {plot: collectives, x: size_bytes, by: [nodes]}

Keys are checked strictly and every value is parsed up front (presets exist, strategies and
algorithms are known, sizes and bandwidths parse) so that a bad spec fails with one
:class:`~parosim.errors.InputError` before any work starts. Combinations that only fail
together (e.g. ``group_nodes`` not dividing ``nodes``) are per-point problems: those points
become rows with ``status: error`` and the sweep goes on.

``results.csv`` is append-only while a sweep runs (one ``write`` + ``fsync`` per row) and is
read back on resume: a torn last line (the process was killed mid-write) is dropped, so is
any line that does not parse to the header's width.
"""

from __future__ import annotations

import csv
import hashlib
import io
import itertools
import json
import math
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..errors import InputError
from ..spec.collective import Algo, Op, Scope, check_a2a_algo, parse_enum
from ..spec.moe import check_max_over_mean, check_routing, check_zipf
from ..spec.system import check_jitter_cv
from ..spec.training import (
    DEFAULT_FIDELITY,
    PRECISIONS,
    accum_for_global_batch,
    check_fidelity,
    parse_trainable_ratio,
)
from ..units import parse_bandwidth, parse_size
from .cluster import cluster_data, cluster_schema, load_cluster
from .cluster_base import set_item, split_sets
from .model import load_model, model_file
from .runtime import load_runtime, runtime_file
from .sweep_columns import (  # noqa: F401  (the columns live there; their names stay here)
    COLUMNS,
    INPUT_KEYS,
    OPTIONAL_STEP_INPUTS,
    columns_markdown,
    sweep_columns,
)
from .sweep_measured import measured_rows
from .yamlspec import check_keys, positive_int, read_yaml

KINDS = ("step", "collective")
MODES = ("engine", "analytic")
_TOP = {"name", "kind", "mode", "grid", "fixed", "points", "figures", "description", "notes"}

# ---------------------------------------------------------------------------------------------
# The spec.
# ---------------------------------------------------------------------------------------------

# The largest grid a sweep accepts (docs/limits.md); setting one up costs ~7 s and ~350 MB
# per million points before the first one runs (linear in the grid size).
MAX_SWEEP_POINTS = 1_000_000

FIGURE_KEYS = {"plot", "by", "file", "x", "metric", "hue", "title", "measured"}


@dataclass(frozen=True)
class SweepSpec:
    """A parsed, validated sweep spec. ``points()`` is the grid in order."""

    name: str
    kind: str
    mode: str
    grid: dict[str, tuple[Any, ...]]
    fixed: dict[str, Any] = field(default_factory=dict)
    figures: tuple[dict[str, Any], ...] = ()
    description: str = ""
    # every axis in the spec's order: (keys, values) with one key per plain grid key, the keys
    # of a ``zip`` group (values: tuples, one element per key), or None for the ``points``
    # list (values: mappings); empty = the plain grid
    axes: tuple[tuple[tuple[str, ...] | None, tuple[Any, ...]], ...] = ()

    def _axes(self):
        return self.axes or tuple(((k,), tuple((v,) for v in vs))
                                  for k, vs in self.grid.items())

    def input_keys(self) -> set[str]:
        """Every input key a point of this sweep may set (grid, zip, points, fixed)."""
        keys = set(self.fixed)
        for names, values in self._axes():
            keys.update(names if names is not None else (k for v in values for k in v))
        return keys

    def has_moe(self) -> bool:
        """True when a point of this step sweep has a mixture-of-experts model (its
        ``results.csv`` then has the MoE columns, :func:`sweep_columns`)."""
        models = {self.fixed.get("model")} | {
            (v if names is None else dict(zip(names, v, strict=True))).get("model")
            for names, values in self._axes() for v in values}
        return self.kind == "step" and any(load_model(m).is_moe for m in models - {None})

    def points(self) -> list[dict[str, Any]]:
        """Every point (a plain dict): the product of the axes, the first varying slowest; a
        zip group is one axis whose keys vary together; the points list is one axis.

        >>> s = SweepSpec("s", "collective", "analytic", {"nodes": (2, 4), "algo": ("ring",)},
        ...               {"cluster": "paper-a100-roce"})
        >>> [p["nodes"] for p in s.points()]
        [2, 4]
        """
        axes = self._axes()
        out = []
        for combo in itertools.product(*(values for _, values in axes)):
            p: dict[str, Any] = {"kind": self.kind, "mode": self.mode, **self.fixed}
            for (names, _), value in zip(axes, combo, strict=True):
                p.update(value if names is None else zip(names, value, strict=True))
            out.append(p)
        return out


# Point keys whose value names a file (a path, or a preset / profile name that resolves to one
# of the repository's files), and what a point without the key reads. ``model`` presets are
# code, not files: the parosim version in every point id covers them.
FILE_KEYS: dict[str, tuple[str, ...]] = {"step": ("cluster", "model", "runtime"),
                                         "collective": ("cluster",)}
_FILE_DEFAULTS = {"cluster": "paper-a100-roce", "model": "llama-7b", "runtime": "ideal"}


def input_file(key: str, value: Any) -> Path | None:
    """The file a point's ``key = value`` makes the simulator read (None: none, e.g. a model
    preset). The loaders' own resolution (:func:`~parosim.io.cluster.cluster_file`, ...)."""
    from .cluster import cluster_file  # local: only the sweep keys need them

    if value is None or value == "":
        return None
    resolve = {"cluster": cluster_file, "model": model_file, "runtime": runtime_file}[key]
    return resolve(str(value))


def file_sha256(path: Path) -> str:
    """sha256 (hex) of a file's bytes; ``missing`` when it cannot be read (the point itself
    then reports why)."""
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return "missing"


def inputs_sha256(key: str, value: Any, path: Path) -> str:
    """sha256 of what a point's input reads: the file's bytes (:func:`file_sha256`); for a
    cluster that extends others (``base:``), of every file of the chain, so an edited base
    preset gives another id too."""
    if key == "cluster":
        try:
            _, files = cluster_data(str(value))
        except InputError:   # unreadable: the point itself reports why
            files = [path]
        if len(files) > 1:
            text = "\n".join(file_sha256(f) for f in files)
            return hashlib.sha256(text.encode()).hexdigest()
    return file_sha256(path)


def point_inputs(point: dict[str, Any],
                 cache: dict[tuple[str, str], tuple[str, str] | None] | None = None
                 ) -> dict[str, tuple[str, str]]:
    """The input files of a point: key -> (label, sha256 of the file's bytes), for every
    key of :data:`FILE_KEYS` that names a file (given or defaulted). ``label`` names the
    input for messages (``cluster 'my.yaml'``). ``cache`` ((key, value) -> entry) reads each
    file once per sweep.

    >>> point_inputs({"kind": "collective", "cluster": "paper-a100-roce"})["cluster"][0]
    "cluster 'paper-a100-roce'"
    """
    out: dict[str, tuple[str, str]] = {}
    for key in FILE_KEYS.get(point.get("kind", "step"), FILE_KEYS["step"]):
        value = point.get(key, _FILE_DEFAULTS[key])
        ck = (key, str(value))
        if cache is not None and ck in cache:
            entry = cache[ck]
        else:
            path = input_file(key, value)
            entry = None if path is None else (f"{key} {str(value)!r}",
                                               inputs_sha256(key, value, path))
            if cache is not None:
                cache[ck] = entry
        if entry is not None:
            out[key] = entry
    return out


def point_id(point: dict[str, Any], inputs: dict[str, tuple[str, str]] | None = None) -> str:
    """Stable id of a point (16 hex digits): sha256 of its JSON with sorted keys, of the
    contents (sha256) of every input file it references (:func:`point_inputs`, computed when
    not given) and of the parosim version. An edited cluster / model / runtime file or
    another parosim gives another id: the point is run again instead of resumed.

    >>> point_id({"a": 1, "b": "x"}) == point_id({"b": "x", "a": 1})
    True
    """
    from .. import __version__  # local: the package's version, read at call time

    if inputs is None:
        inputs = point_inputs(point)
    key = {"point": point, "inputs": {k: sha for k, (_, sha) in inputs.items()},
           "parosim_version": __version__}
    if point.get("kind", "step") == "step" and "fidelity" not in point:
        # a step point without the key runs the default fidelity (accurate since it stopped
        # being paper): its id says so, so that results of the former default never resume
        # as the new one's; a point that names its fidelity keeps the id it had
        key["fidelity"] = DEFAULT_FIDELITY
    text = json.dumps(key, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _as_list(value: Any, key: str, where: str) -> tuple[Any, ...]:
    vals = tuple(value) if isinstance(value, (list, tuple)) else (value,)
    if not vals:
        raise InputError(f"{where}: grid key {key!r} has an empty list; expected at least one "
                         "value")
    for v in vals:
        if isinstance(v, (dict, list)) or v is None:
            raise InputError(f"{where}: {key} value {v!r} must be a scalar (string or number)")
    return vals


def _validators(kind: str) -> dict[str, Callable[[Any], object]]:
    """Parse each value on its own, with the parsers the simulator itself uses."""

    def mode(v: Any) -> None:
        if v not in MODES:
            raise InputError(f"mode {v!r} is not known; expected one of {', '.join(MODES)}")

    common: dict[str, Callable[[Any], object]] = {
        "mode": mode,
        "cluster": load_cluster,
        "nodes": lambda v: positive_int(v, "nodes"),
        "group_nodes": lambda v: positive_int(v, "group_nodes"),
        "algo": lambda v: parse_enum(Algo, v, "algo"),
        "nic_bandwidth": lambda v: parse_bandwidth(v, "nic_bandwidth"),
        "intra_bandwidth": lambda v: parse_bandwidth(v, "intra_bandwidth"),
        "cluster_set": lambda v: [set_item(s, cluster_schema(), "cluster_set")
                                  for s in split_sets(v)],
    }
    if kind == "collective":
        return {**common, "op": lambda v: parse_enum(Op, v, "op"),
                "scope": lambda v: parse_enum(Scope, v, "scope"),
                "size": lambda v: parse_size(v, "size")}
    return {**common, "model": _parse_model, "strategy": _parse_strategy,
            "trainable_ratio": _parse_ratio,
            "micro_batch": lambda v: positive_int(v, "micro_batch"),
            "accum": lambda v: positive_int(v, "accum"),
            "seq_len": lambda v: positive_int(v, "seq_len"),
            "gpu_memory": lambda v: parse_size(v, "gpu_memory"),
            "recompute": _parse_recompute, "runtime": _parse_runtime,
            "overlap_slowdown": _parse_slowdown, "precision": _parse_precision,
            "tp": lambda v: positive_int(v, "tp"), "pp": lambda v: positive_int(v, "pp"),
            "cp": lambda v: positive_int(v, "cp"),
            "sequence_parallel": lambda v: _parse_flag(v, "sequence_parallel"),
            "tp_comm_overlap": lambda v: _parse_flag(v, "tp_comm_overlap"),
            "dp_comm_overlap": lambda v: _parse_flag(v, "dp_comm_overlap"),
            "global_batch": lambda v: accum_for_global_batch(v, 1, 1, 1),   # its form only
            "efficiency": _parse_efficiency,
            "compute_model": lambda v: _one_of(v, "compute_model", ("flat", "kernel")),
            "attention": lambda v: _one_of(v, "attention", ("eager", "flash")),
            "memory_model": lambda v: _one_of(v, "memory_model", ("korthikanti", "runtime")),
            "logit_bytes": lambda v: positive_int(v, "logit_bytes"),
            "seed": _parse_seed,
            "repeats": lambda v: positive_int(v, "repeats"),
            "jitter_cv": _parse_jitter,
            "deepspeed_config": _parse_file,
            "pp_schedule": lambda v: _one_of(v, "pp_schedule", ("1f1b", "interleaved")),
            "virtual_stages": lambda v: positive_int(v, "virtual_stages"),
            "tp_algo": lambda v: parse_enum(Algo, v, "tp_algo"),
            "fidelity": lambda v: check_fidelity(v, "fidelity"),
            "ep": lambda v: positive_int(v, "ep"),
            "expert_strategy": _parse_expert_strategy,
            "a2a_algo": lambda v: check_a2a_algo(v, "a2a_algo"),
            "routing": lambda v: check_routing(v, "routing"),
            "max_over_mean": lambda v: check_max_over_mean(v, "max_over_mean"),
            "zipf": lambda v: check_zipf(v, "zipf")}


RECOMPUTE_VALUES = ("auto", "on", "off", "full", "none", "selective")


def _one_of(v: Any, key: str, allowed: tuple[str, ...]) -> str:
    if v not in allowed:
        raise InputError(f"{key} = {v!r} is not known; expected one of {', '.join(allowed)}")
    return v


def _parse_seed(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise InputError(f"seed = {v!r} must be a non-negative integer")
    return v


def _parse_jitter(v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise InputError(f"jitter_cv = {v!r} must be a number")
    check_jitter_cv(float(v), "jitter_cv")
    return float(v)


def _parse_efficiency(v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= 1:
        raise InputError(f"efficiency = {v!r} must be a fraction in (0, 1]")
    return float(v)


def _parse_file(v: Any) -> Path:
    if not isinstance(v, str) or not Path(v).is_file():
        raise InputError(f"deepspeed_config = {v!r} is not a file; expected a DeepSpeed JSON "
                         "config path")
    return Path(v)


def _parse_recompute(v: Any) -> object:
    if isinstance(v, bool) or v in RECOMPUTE_VALUES:
        return v
    raise InputError(f"recompute = {v!r} is not known; expected true, false or one of "
                     f"{', '.join(RECOMPUTE_VALUES)} (leave it out for auto)")


def _parse_flag(v: Any, key: str) -> bool:
    if not isinstance(v, bool):
        raise InputError(f"{key} = {v!r} must be true or false")
    return v


def _parse_precision(v: Any) -> str:
    if v not in PRECISIONS:
        raise InputError(f"precision = {v!r} is not known; expected {' or '.join(PRECISIONS)}")
    return v


def _parse_runtime(v: Any) -> object:
    return load_runtime(v)


def _parse_slowdown(v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not (
            math.isfinite(v) and v >= 1):
        raise InputError(f"overlap_slowdown = {v!r} must be a factor >= 1")
    return float(v)


def _parse_model(v: Any) -> object:
    return load_model(v)


def _parse_ratio(v: Any) -> object:
    return parse_trainable_ratio(v)


def _parse_strategy(v: Any) -> object:
    try:
        from ..spec.strategy import parse_strategy  # deferred: sweep specs load first
    except ImportError:  # the strategies module is not there yet: the point reports it
        return v
    return parse_strategy(v)


def _parse_expert_strategy(v: Any) -> object:
    try:
        return _parse_strategy(v)
    except InputError as e:   # the message says "strategy": name the key
        raise InputError(f"expert_strategy: {e}") from None


def _best_x(fig: dict, grid: dict, where: str) -> dict:
    """A ``best`` figure draws its metric against a swept axis (default nic_bandwidth): that
    axis when swept, else the one numeric grid key left (not strategy, by or hue); refused
    when none or several are left."""
    if fig.get("x") is not None or len(grid.get("nic_bandwidth", ())) > 1:
        return fig
    taken = {"strategy", fig.get("hue"), *fig["by"]}
    cands = [k for k, vs in grid.items() if len(vs) > 1 and k not in taken
             and (k.endswith("_bandwidth") or all(isinstance(v, int | float)
                                                  and not isinstance(v, bool) for v in vs))]
    if len(cands) == 1:
        return {**fig, "x": cands[0]}
    raise InputError(f"{where}: figure 'best' needs x (the swept axis; its default "
                     "nic_bandwidth is not swept in the grid); expected x: one of "
                     f"{', '.join(cands) if cands else 'a numeric grid key with 2+ values'}")


def _figures(raw: Any, where: str, kind: str = "step", grid: dict | None = None,
             columns=None, base_dir: Path | None = None) -> tuple[dict[str, Any], ...]:
    from ..plots.figures import SWEEP_PLOTS  # names only; matplotlib is imported lazily there

    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise InputError(f"{where}: figures must be a list of plot names or mappings")
    out = []
    for f in raw:
        fig = {"plot": f} if isinstance(f, str) else f
        if not isinstance(fig, dict) or "plot" not in fig:
            raise InputError(f"{where}: figure {f!r} must be a plot name or a mapping with "
                             "'plot'")
        check_keys(fig, FIGURE_KEYS, f"{where}: figure")
        if fig["plot"] not in SWEEP_PLOTS:
            raise InputError(f"{where}: figure plot {fig['plot']!r} is not known; expected one "
                             f"of {', '.join(SWEEP_PLOTS)}")
        by = fig.get("by", [])
        fig = {**fig, "by": [by] if isinstance(by, str) else list(by)}
        columns = COLUMNS[kind] if columns is None else columns
        for key in ("x", "metric", "hue"):
            v = fig.get(key)
            if v is not None and v not in columns:
                raise InputError(f"{where}: figure {fig['plot']!r} {key} {v!r} is not a column "
                                 f"of a {kind} sweep; expected one of {', '.join(columns)}")
        for v in fig["by"]:
            if v not in columns:
                raise InputError(f"{where}: figure {fig['plot']!r} by {v!r} is not a column "
                                 f"of a {kind} sweep; expected one of {', '.join(columns)}")
        if fig.get("title") is not None and not str(fig["title"]).strip():
            raise InputError(f"{where}: figure {fig['plot']!r} title is empty; expected a "
                             "title or no title key")
        if fig["plot"] == "best" and grid is not None:
            fig = _best_x(fig, grid, where)
        if fig.get("measured") is not None:
            fig = {**fig, "measured_rows": measured_rows(fig, where, base_dir)}
        out.append(fig)
    return tuple(out)


def _resolve(value: Any, base_dir: Path | None) -> Any:
    """A ``.yaml`` path not found from here but found next to the spec: that one, written
    relative to the current directory (so rows stay short and readable)."""
    if base_dir is None or not isinstance(value, str) or not value.endswith((".yaml", ".yml")):
        return value
    if Path(value).exists() or not (base_dir / value).exists():
        return value
    return os.path.relpath(base_dir / value)


def sweep_from_dict(data: dict[str, Any], where: str = "sweep spec",
                    base_dir: str | Path | None = None) -> SweepSpec:
    """Build and validate a :class:`SweepSpec` from a parsed YAML mapping.

    ``base_dir``: where relative ``cluster`` / ``model`` YAML paths may also be found (the
    spec file's folder).
    """
    check_keys(data, _TOP, where)
    kind = data.get("kind", "step")
    if kind not in KINDS:
        raise InputError(f"{where}: kind {kind!r} is not known; expected one of "
                         f"{', '.join(KINDS)}")
    mode = data.get("mode", "engine")
    grid_raw = data.get("grid") or {}
    points_raw = data.get("points")
    if not isinstance(grid_raw, dict) or not (grid_raw or points_raw):
        raise InputError(f"{where}: 'grid' must be a non-empty mapping of key -> list of "
                         "values (or give 'points', a list of mappings)")
    fixed = data.get("fixed") or {}
    if not isinstance(fixed, dict):
        raise InputError(f"{where}: 'fixed' must be a mapping of key -> value")
    allowed = set(INPUT_KEYS[kind])
    plain = {k: v for k, v in grid_raw.items() if not _is_zip(k)}
    check_keys(plain, allowed, f"{where}: grid")
    check_keys(fixed, allowed, f"{where}: fixed")
    base = Path(base_dir) if base_dir is not None else None
    axes: list[tuple[tuple[str, ...] | None, tuple[Any, ...]]] = []
    grid: dict[str, tuple[Any, ...]] = {}
    seen_keys: dict[str, str] = {k: "fixed" for k in fixed}
    for k, v in grid_raw.items():
        if _is_zip(k):
            names, values = _zip_axis(k, v, allowed, where, base)
        else:
            names = (str(k),)
            values = tuple((_resolve(x, base),) for x in _as_list(v, k, where))
            grid[str(k)] = tuple(x[0] for x in values)
        for name in names:
            if name in seen_keys:
                here = "grid" if names == (str(k),) else f"grid {k!r}"
                raise InputError(f"{where}: key {name!r} is in both {here} and "
                                 f"{seen_keys[name]}; give it once")
            seen_keys[name] = f"grid {k!r}"
        axes.append((names, values))
    if points_raw is not None:
        axes.append((None, _point_list(points_raw, allowed, seen_keys, where, base)))
    n_points = math.prod(len(v) for _, v in axes)
    if n_points > MAX_SWEEP_POINTS:
        raise InputError(f"{where}: the grid has {n_points} points, more than the limit of "
                         f"{MAX_SWEEP_POINTS}; expected a smaller grid (split it into several "
                         "sweeps)")
    for k, v in fixed.items():
        _as_list(v, k, where)
    fixed = {k: _resolve(v, base) for k, v in fixed.items()}
    validators = _validators(kind)
    validators["mode"](mode)
    values = [(k, v) for names, vs in axes for combo in vs
              for k, v in (zip(names, combo, strict=True) if names else combo.items())]
    values += list(fixed.items())
    seen: set[tuple[str, str]] = set()
    for k, v in values:
        if (k, repr(v)) not in seen:
            seen.add((k, repr(v)))
            validators[k](v)
    spec = SweepSpec(name=str(data.get("name", "sweep")), kind=kind, mode=mode, grid=grid,
                     fixed=dict(fixed),
                     description=str(data.get("description", "")),
                     axes=() if len(axes) == len(grid) else tuple(axes))
    spec = replace(spec, figures=_figures(  # on the sweep's columns (optional ones included)
        data.get("figures"), where, kind, grid,
        sweep_columns(kind, spec.input_keys(), spec.has_moe()), base))
    in_axes = any(names is not None and "model" in names for names, _ in axes) or any(
        names is None and all("model" in p for p in vs) for names, vs in axes)
    if kind == "step" and "model" not in fixed and not in_axes:
        raise InputError(f"{where}: a step sweep needs 'model' in grid, fixed or every point")
    return spec


def _is_zip(key: Any) -> bool:
    return isinstance(key, str) and (key == "zip" or key.startswith("zip:"))


def _zip_axis(key: str, raw: Any, allowed: set[str], where: str, base: Path | None):
    """A ``zip`` group: key -> list of equal length; one axis of tuples."""
    if not isinstance(raw, dict) or not raw:
        raise InputError(f"{where}: grid {key!r} must be a mapping of key -> list of values "
                         "(lists of one length, varied together)")
    check_keys(raw, allowed, f"{where}: grid {key!r}")
    cols = {str(k): tuple(_resolve(x, base) for x in _as_list(v, k, where))
            for k, v in raw.items()}
    lengths = {k: len(v) for k, v in cols.items()}
    if len(set(lengths.values())) != 1:
        raise InputError(f"{where}: grid {key!r} lists have different lengths "
                         f"({', '.join(f'{k} {n}' for k, n in lengths.items())}); expected "
                         "one length (the values vary together)")
    return tuple(cols), tuple(zip(*cols.values(), strict=True))


def _point_list(raw: Any, allowed: set[str], seen: dict[str, str], where: str,
                base: Path | None) -> tuple[dict[str, Any], ...]:
    """``points``: a list of mappings, each a point's own keys (not in grid or fixed)."""
    if not isinstance(raw, list) or not raw:
        raise InputError(f"{where}: 'points' must be a non-empty list of mappings of key -> "
                         "value")
    out = []
    for i, p in enumerate(raw):
        if not isinstance(p, dict) or not p:
            raise InputError(f"{where}: points[{i}] must be a mapping of key -> value")
        check_keys(p, allowed, f"{where}: points[{i}]")
        for k, v in p.items():
            if k in seen:
                raise InputError(f"{where}: key {k!r} is in both {seen[k]} and points[{i}]; "
                                 "give it once")
            _as_list(v, k, where)
            if isinstance(v, (list, tuple)):
                raise InputError(f"{where}: points[{i}] {k} = {v!r} must be one value")
        out.append({str(k): _resolve(v, base) for k, v in p.items()})
    return tuple(out)


def load_sweep_spec(path: str | Path) -> SweepSpec:
    """Read and validate a sweep spec YAML file.

    >>> load_sweep_spec("experiments/03_allgather_1gb/sweep.yaml").kind  # doctest: +SKIP
    'collective'
    """
    return sweep_from_dict(read_yaml(path, "sweep spec"), where=f"sweep spec {str(path)!r}",
                           base_dir=Path(path).parent)


def check_out_dir(out_dir: str | Path) -> Path:
    """Create ``out_dir`` if needed and prove it is writable (else :class:`InputError`)."""
    d = Path(out_dir)
    try:
        d.mkdir(parents=True, exist_ok=True)
        probe = d / f".write-test-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise InputError(f"output directory {str(d)!r} is not writable: "
                         f"{e.strerror or e}") from None
    return d


# ---------------------------------------------------------------------------------------------
# results.csv: append one row at a time, read back tolerantly, rewrite sorted.
# ---------------------------------------------------------------------------------------------

def format_cell(v: Any) -> str:
    """One CSV cell: floats by ``repr`` (round-trips exactly), None/NaN empty, no newlines."""
    if v is None:
        return ""
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, float) or type(v).__name__.startswith("float"):
        f = float(v)
        return "" if math.isnan(f) else repr(f)
    if hasattr(v, "item") and not isinstance(v, str):  # numpy scalars
        return format_cell(v.item())
    return " ".join(str(v).split("\n"))


def _line(cells: Iterable[str]) -> str:
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerow(list(cells))
    return buf.getvalue()


# Input columns added to a sweep kind after results were published with it: a results.csv
# written before one of them is read with it empty, its documented default (the behaviour the
# rows were computed with), so such a sweep still resumes.
LATER_INPUT_COLUMNS = ("precision",)


class ResultsLog:
    """``results.csv`` as an append-only log keyed by ``point_id``.

    Opening reads what is there (dropping a torn last line and rows of the wrong width),
    rewrites the clean part, and keeps the file open for appends. A header that differs from
    ``columns`` means another kind of sweep wrote the file: :class:`InputError`.
    ``fresh``: start empty, whatever the file holds (``parosim sweep --fresh``).
    """

    def __init__(self, path: str | Path, columns: list[str], fresh: bool = False) -> None:
        self.path = Path(path)
        self.columns = list(columns)
        self.rows: dict[str, list[str]] = {}
        self.dropped = 0
        self._lock = _lock_dir(self.path)
        try:
            if self.path.is_dir():
                raise InputError(f"{str(self.path)!r} is a directory; expected the results "
                                 "file (remove it or use another --out directory)")
            try:
                if self.path.exists() and not fresh:
                    self._recover()
                else:
                    self._rewrite([])
                self._fh = open(self.path, "a", encoding="utf-8", newline="")
            except OSError as e:
                raise InputError(f"{str(self.path)!r} cannot be written: "
                                 f"{e.strerror or e}") from None
        except BaseException:
            self.release()
            raise

    def _recover(self) -> None:
        text = self.path.read_text(encoding="utf-8", errors="replace")
        complete, _, torn = text.rpartition("\n")
        self.dropped += bool(torn)
        lines = complete.split("\n") if complete else []
        if not lines:
            self._rewrite([])
            return
        header = next(csv.reader([lines[0]]))
        upgrade = None
        if header != self.columns and header == [c for c in self.columns
                                                 if c not in LATER_INPUT_COLUMNS]:
            # written before these input columns existed: read them as empty (= default)
            upgrade = [self.columns.index(c) for c in header]
        if header != self.columns and upgrade is None:
            raise InputError(f"{str(self.path)!r} holds results of a different sweep (its "
                             "columns differ); use another --out directory or remove the file")
        good = []
        for line in lines[1:]:
            try:
                cells = next(csv.reader([line]))
            except (csv.Error, StopIteration):
                cells = []
            if upgrade is not None and len(cells) == len(header):
                full = [""] * len(self.columns)
                for i, v in zip(upgrade, cells, strict=True):
                    full[i] = v
                cells = full
            if len(cells) != len(self.columns) or not cells[0]:
                self.dropped += 1
                continue
            if cells[0] not in self.rows:
                good.append(cells)
            self.rows[cells[0]] = cells
        self._rewrite(good)

    def _rewrite(self, rows: list[list[str]]) -> None:
        # a name of this process's own: two writers never share a temporary file
        tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
        with open(tmp, "w", encoding="utf-8", newline="") as fh:
            fh.write(_line(self.columns))
            for r in rows:
                fh.write(_line(r))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.path)

    def append(self, row: dict[str, Any]) -> None:
        """Write one row (one ``write`` call, then flush and fsync) and remember it."""
        cells = [format_cell(row.get(c)) for c in self.columns]
        self._fh.write(_line(cells))
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self.rows[cells[0]] = cells

    def finalize(self, order: list[str]) -> int:
        """Rewrite the file with the rows of ``order`` in that order; return rows dropped
        because their id is not in ``order`` (they go to ``results.stale.csv``)."""
        self.close()
        wanted = set(order)
        self._rewrite([self.rows[i] for i in order if i in self.rows])
        stale = [r for i, r in self.rows.items() if i not in wanted]
        stale_path = self.path.with_name("results.stale.csv")
        if stale:
            with open(stale_path, "w", encoding="utf-8", newline="") as fh:
                fh.write(_line(self.columns))
                for r in stale:
                    fh.write(_line(r))
        return len(stale)

    def close(self) -> None:
        fh = getattr(self, "_fh", None)
        if fh is not None and not fh.closed:
            fh.close()

    def release(self) -> None:
        """Drop the directory lock (after :meth:`finalize`, or on failure)."""
        self.close()
        if self._lock is not None:
            self._lock.close()  # closing the descriptor releases the flock
            self._lock = None


def _lock_dir(results: Path):
    """An exclusive lock on the output directory for the whole sweep: a second sweep into the
    same ``--out`` is refused at once instead of racing on ``results.csv``."""
    try:
        import fcntl  # deferred: POSIX only, used to lock the output
    except ImportError:  # not POSIX: no lock (one sweep per directory is then the user's rule)
        return None
    try:
        fh = open(results.parent / ".parosim-sweep.lock", "a+")
    except OSError as e:
        raise InputError(f"output directory {str(results.parent)!r} is not writable: "
                         f"{e.strerror or e}") from None
    try:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        fh.close()
        raise InputError(f"another parosim sweep is writing into {str(results.parent)!r}; "
                         "expected one sweep per --out directory at a time (wait for it or "
                         "use another --out)") from None
    return fh


# ---------------------------------------------------------------------------------------------
# inputs.json: the input files (and parosim version) the rows of results.csv were computed
# with, so a re-run can say which changed.
# ---------------------------------------------------------------------------------------------

INPUTS_FILE = "inputs.json"
VERSION_LABEL = "parosim version"


def read_inputs_manifest(out_dir: str | Path) -> dict[str, str]:
    """label -> sha256 (and ``parosim version`` -> version) of the last run into ``out_dir``;
    empty when there is none or it does not parse (a run then just says nothing changed)."""
    try:
        data = json.loads((Path(out_dir) / INPUTS_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    files = data.get("inputs", {})
    out = {str(k): str(v) for k, v in files.items()} if isinstance(files, dict) else {}
    if "parosim_version" in data:
        out[VERSION_LABEL] = str(data["parosim_version"])
    return out


def write_inputs_manifest(out_dir: str | Path, inputs: dict[str, str], version: str) -> None:
    """Write ``inputs.json`` (sorted keys: the same inputs give the same bytes), atomically."""
    path = Path(out_dir) / INPUTS_FILE
    text = json.dumps({"parosim_version": version, "inputs": dict(sorted(inputs.items()))},
                      indent=1, sort_keys=True) + "\n"
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
