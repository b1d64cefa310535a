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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import InputError
from ..spec.collective import Algo, Op, Scope, parse_enum
from ..spec.training import PRECISIONS, parse_trainable_ratio
from ..units import parse_bandwidth, parse_size
from .cluster import load_cluster
from .model import load_model, model_file
from .runtime import load_runtime, runtime_file
from .yamlspec import check_keys, positive_int, read_yaml

KINDS = ("step", "collective")
MODES = ("engine", "analytic")
_TOP = {"name", "kind", "mode", "grid", "fixed", "figures", "description", "notes"}

# ---------------------------------------------------------------------------------------------
# Columns. Every column of results.csv, with its unit, in file order (inputs, then outputs).
# ---------------------------------------------------------------------------------------------

_ID_COLUMNS: dict[str, str] = {
    "point_id": "stable id of the point: first 16 hex digits of sha256 of its normalized "
                "JSON (sorted keys), the sha256 of every input file it references (cluster, "
                "model, runtime YAML / JSON; presets by their file) and the parosim version; "
                "the key used for resume",
}
_STEP_INPUTS: dict[str, str] = {
    "kind": "point kind: step",
    "mode": "engine (simpy flow-level replay) or analytic (closed-form alpha-beta)",
    "model": "model preset or YAML path (e.g. llama-7b)",
    "cluster": "cluster preset or YAML path (e.g. paper-a100-roce)",
    "nodes": "nodes in the cluster (count)",
    "group_nodes": "nodes per PaRO group (count; 1 = a group is a node)",
    "strategy": "PaRO strategy as given in the spec (e.g. NIG, PaRO-NIG, zero3)",
    "algo": "collective algorithm: ring, hierarchical or ho-ring",
    "trainable_ratio": "trainable fraction as given: full (1), partial (1/16), peft (3/1000) "
                       "or a number",
    "micro_batch": "sequences per GPU per micro-step (count)",
    "accum": "gradient-accumulation micro-steps per global step (count)",
    "seq_len": "tokens per sequence (count)",
    "nic_bandwidth": "override of the per-NIC bandwidth as given (e.g. 200Gbps); empty = "
                     "the preset's",
    "intra_bandwidth": "override of the per-GPU intra-node bandwidth as given; empty = the "
                       "preset's",
    "gpu_memory": "override of the GPU memory capacity as given (e.g. 40GB); empty = the "
                  "preset's",
    "recompute": "full activation recomputation: True, False, or empty = automatic (on when "
                 "activations would not fit otherwise)",
    "runtime": "framework schedule: ideal, deepspeed, fsdp, paro or a runtime YAML path; "
               "empty = ideal (docs/runtimes.md)",
    "overlap_slowdown": "compute slowdown factor beside a collective (>= 1); empty = the "
                        "cluster's, else the runtime's default",
    "precision": "training precision: bf16 or fp8 (decoder-layer weight GEMMs at the GPU's "
                 "FP8 peak; docs/compute.md); empty = bf16",
}
# Optional step inputs (3D parallelism, docs/parallelism.md): a column of results.csv only
# when the spec gives the key, so sweeps without them keep their columns.
_STEP_PARALLEL_INPUTS: dict[str, str] = {
    "tp": "tensor-parallel degree (count; empty = 1)",
    "pp": "pipeline stages (count; empty = 1; accum is then the micro-batches per step)",
    "cp": "context-parallel degree, ring attention (count; empty = 1; seq_len divisible by "
          "2 x cp)",
    "sequence_parallel": "Megatron sequence parallelism: True or False (needs tp >= 2)",
    "tp_comm_overlap": "Megatron-Core / Transformer Engine TP communication overlap: True or "
                       "False (needs sequence_parallel)",
    "dp_comm_overlap": "Megatron-Core DP communication overlap (overlap_grad_reduce + "
                       "overlap_param_gather): True or False (needs tp or pp >= 2, PaRO NNN, "
                       "NNI or NNG)",
    "fidelity": "models of the unset settings: accurate (kernel compute, FlashAttention, "
                "runtime memory model, NCCL's tuner unless algo is given) or paper (the PaRO "
                "paper's closed forms); empty = paper (docs/sweeps.md)",
}
_COMMON_OUTPUTS: dict[str, str] = {
    "status": "ok, does-not-fit (memory exceeds capacity) or error (bad combination)",
    "reason": "why a point is not ok (empty when ok)",
    "gpus": "GPUs in the job, n (count)",
}
_STEP_OUTPUTS: dict[str, str] = {
    "step_time_s": "time of one global step (s)",
    "tokens_per_s": "training throughput of the whole job (tokens/s)",
    "tokens_per_s_per_gpu": "throughput per GPU (tokens/s/GPU)",
    "samples_per_s": "throughput of the whole job (sequences/s)",
    "tflops_per_gpu": "hardware TFLOP/s per GPU: FLOPs executed, activation recomputation "
                      "included, / step time (1e12 FLOP/s); mfu counts model FLOPs only",
    "mfu": "model FLOPs utilisation: achieved / peak FLOP/s (fraction 0..1)",
    "exposed_comm_s": "communication time not hidden behind compute, per step (s)",
    "bytes_intra": "bytes sent per GPU per global step over intra-group links (bytes)",
    "bytes_inter": "bytes sent per GPU per global step over inter-group links (bytes)",
    "model_states_bytes": "parameters + gradients + optimizer states per GPU (bytes)",
    "activations_bytes": "activation memory per GPU (bytes)",
    "buffers_bytes": "gathered-layer, prefetch and communication buffers per GPU (bytes)",
    "total_bytes": "total memory per GPU incl. fragmentation margin (bytes)",
    "capacity_bytes": "GPU memory capacity (bytes)",
    "shortfall_bytes": "memory missing to fit, total_bytes - capacity_bytes when positive "
                       "(bytes)",
    "fits": "total_bytes <= capacity_bytes (True/False)",
}
_COLL_INPUTS: dict[str, str] = {
    "kind": "point kind: collective",
    "mode": "engine (simpy flow-level replay) or analytic (closed-form alpha-beta)",
    "cluster": "cluster preset or YAML path",
    "nodes": "nodes in the cluster (count)",
    "group_nodes": "nodes per PaRO group (count)",
    "op": "all-gather, reduce-scatter or all-reduce",
    "scope": "global (all n GPUs), intra (each group) or inter (same local index across "
             "groups)",
    "size": "full buffer as given (nccl-tests: AG output, RS input, AR buffer)",
    "algo": "ring, hierarchical or ho-ring",
    "nic_bandwidth": "override of the per-NIC bandwidth as given; empty = the preset's",
    "intra_bandwidth": "override of the per-GPU intra-node bandwidth as given; empty = the "
                       "preset's",
}
_LINK_CLASSES = ("nvlink", "pcie", "nic", "uplink")
_COLL_OUTPUTS: dict[str, str] = {
    "ring_size": "k: ranks per ring instance of the scope (count)",
    "size_bytes": "full buffer (bytes)",
    "time_s": "collective time: simulated (engine) or closed form (analytic) (s)",
    "closed_form_s": "alpha-beta closed-form time of the same lowering (s)",
    "algbw_GBps": "algorithm bandwidth size_bytes / time_s (GB/s, 1e9 bytes/s)",
    "busbw_GBps": "nccl-tests bus bandwidth (GB/s, 1e9 bytes/s)",
    "chunks": "HO-Ring pipeline chunks (count; 1 for the others)",
    "events": "simpy events scheduled (count; 0 in analytic mode)",
    **{f"bytes_{c}": f"bytes carried by all {c} links together (bytes; engine mode only)"
       for c in _LINK_CLASSES},
    **{f"busy_s_{c}": f"busy time of the busiest {c} link (s; engine mode only)"
       for c in _LINK_CLASSES},
}

COLUMNS: dict[str, dict[str, str]] = {
    "step": {**_ID_COLUMNS, **_STEP_INPUTS, **_COMMON_OUTPUTS, **_STEP_OUTPUTS},
    "collective": {**_ID_COLUMNS, **_COLL_INPUTS, **_COMMON_OUTPUTS, **_COLL_OUTPUTS},
}
INPUT_KEYS: dict[str, tuple[str, ...]] = {
    "step": tuple(k for k in _STEP_INPUTS if k != "kind") + tuple(_STEP_PARALLEL_INPUTS),
    "collective": tuple(k for k in _COLL_INPUTS if k != "kind"),
}


def sweep_columns(kind: str, keys=()) -> dict[str, str]:
    """The columns of ``results.csv`` (name -> meaning): :data:`COLUMNS` of the kind, with
    the optional parallelism inputs among ``keys`` (the spec's grid and fixed keys) after
    the other inputs."""
    cols = COLUMNS[kind]
    extra = {k: v for k, v in _STEP_PARALLEL_INPUTS.items() if k in keys} \
        if kind == "step" else {}
    if not extra:
        return dict(cols)
    names = list(cols)
    i = names.index("status")
    return {**{k: cols[k] for k in names[:i]}, **extra, **{k: cols[k] for k in names[i:]}}


def columns_markdown(kind: str, keys=()) -> str:
    """The column documentation of ``results.csv`` as a Markdown table (``columns.md``)."""
    lines = [f"# results.csv columns ({kind} sweep)", "",
             "One row per grid point, in grid order (first grid key slowest). Empty cell = not "
             "applicable or not given.", "", "| column | meaning (unit) |", "|---|---|"]
    lines += [f"| `{k}` | {v} |" for k, v in sweep_columns(kind, keys).items()]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# The spec.
# ---------------------------------------------------------------------------------------------

# The largest grid a sweep accepts (docs/limits.md); setting one up costs ~7 s and ~350 MB
# per million points before the first one runs (linear in the grid size).
MAX_SWEEP_POINTS = 1_000_000

FIGURE_KEYS = {"plot", "by", "file", "x", "metric", "hue", "title"}


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

    def points(self) -> list[dict[str, Any]]:
        """Every point of the grid (a plain dict), first grid key varying slowest.

        >>> s = SweepSpec("s", "collective", "analytic", {"nodes": (2, 4), "algo": ("ring",)},
        ...               {"cluster": "paper-a100-roce"})
        >>> [p["nodes"] for p in s.points()]
        [2, 4]
        """
        keys = list(self.grid)
        out = []
        for combo in itertools.product(*(self.grid[k] for k in keys)):
            p: dict[str, Any] = {"kind": self.kind, "mode": self.mode, **self.fixed}
            p.update(zip(keys, combo, strict=False))
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
            entry = None if path is None else (f"{key} {str(value)!r}", file_sha256(path))
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
            "recompute": _parse_bool, "runtime": _parse_runtime,
            "overlap_slowdown": _parse_slowdown, "precision": _parse_precision,
            "tp": lambda v: positive_int(v, "tp"), "pp": lambda v: positive_int(v, "pp"),
            "cp": lambda v: positive_int(v, "cp"),
            "sequence_parallel": lambda v: _parse_flag(v, "sequence_parallel"),
            "tp_comm_overlap": lambda v: _parse_flag(v, "tp_comm_overlap"),
            "dp_comm_overlap": lambda v: _parse_flag(v, "dp_comm_overlap"),
            "fidelity": _parse_fidelity}


def _parse_fidelity(v: Any) -> str:
    from ..spec.training import check_fidelity  # deferred: sweep specs parse it only

    return check_fidelity(v, "fidelity")


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


def _parse_bool(v: Any) -> bool:
    if not isinstance(v, bool):
        raise InputError(f"recompute = {v!r} must be true or false (leave it out for automatic)")
    return v


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


def _figures(raw: Any, where: str, kind: str = "step",
             grid: dict | None = None) -> tuple[dict[str, Any], ...]:
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
        columns = COLUMNS[kind]
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
    grid_raw = data.get("grid")
    if not isinstance(grid_raw, dict) or not grid_raw:
        raise InputError(f"{where}: 'grid' must be a non-empty mapping of key -> list of "
                         "values")
    fixed = data.get("fixed") or {}
    if not isinstance(fixed, dict):
        raise InputError(f"{where}: 'fixed' must be a mapping of key -> value")
    allowed = set(INPUT_KEYS[kind])
    check_keys(grid_raw, allowed, f"{where}: grid")
    check_keys(fixed, allowed, f"{where}: fixed")
    both = sorted(set(grid_raw) & set(fixed))
    if both:
        raise InputError(f"{where}: key {both[0]!r} is in both grid and fixed; give it once")
    base = Path(base_dir) if base_dir is not None else None
    grid = {str(k): tuple(_resolve(v, base) for v in _as_list(v, k, where))
            for k, v in grid_raw.items()}
    n_points = math.prod(len(v) for v in grid.values())
    if n_points > MAX_SWEEP_POINTS:
        raise InputError(f"{where}: the grid has {n_points} points, more than the limit of "
                         f"{MAX_SWEEP_POINTS}; expected a smaller grid (split it into several "
                         "sweeps)")
    for k, v in fixed.items():
        _as_list(v, k, where)
    fixed = {k: _resolve(v, base) for k, v in fixed.items()}
    validators = _validators(kind)
    validators["mode"](mode)
    values = [(k, v) for k, vs in grid.items() for v in vs] + list(fixed.items())
    seen: set[tuple[str, str]] = set()
    for k, v in values:
        if (k, repr(v)) not in seen:
            seen.add((k, repr(v)))
            validators[k](v)
    if kind == "step" and "model" not in grid and "model" not in fixed:
        raise InputError(f"{where}: a step sweep needs 'model' in grid or fixed")
    return SweepSpec(name=str(data.get("name", "sweep")), kind=kind, mode=mode, grid=grid,
                     fixed=dict(fixed), figures=_figures(data.get("figures"), where, kind, grid),
                     description=str(data.get("description", "")))


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
