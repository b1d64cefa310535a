"""Plausibility notes: one line when a prediction leaves the region its models were
calibrated or checked on (docs/accuracy.md, "Where the models were calibrated").

The region, from the published rows the compute and memory models were fitted or checked on
(the project's calibration set; tables in docs/accuracy.md):

* GPU and precision: A100 in bf16 (llm-foundry MPT, Megatron-LM tables, BigScience: the
  kernel model's fit and checks), H100 in bf16 (torchtitan) and fp8 (NeMo / Megatron-Bridge,
  torchtitan Float8; checks, never fitted). Any other GPU or precision has no rows.
* MFU: the highest published bf16 MFU among those rows is 64.2 % (llm-foundry MPT-7B, A100);
  a bf16 prediction above :data:`MFU_NOTE_ABOVE` (0.7) is above every row. FP8 runs count
  MFU against the bf16 peak in parosim (as NeMo reports TFLOP/s): the fastest published FP8
  row, GPT3-175B on 512 H100 (NeMo 24.07), reaches 842 TFLOP/s = 0.85 of the H100's bf16
  peak, so an FP8 prediction is noted above :data:`MFU_NOTE_ABOVE_FP8` (0.85).
* Micro-batch: the largest micro-batch of the rows is 128 sequences of 512 tokens = 65,536
  tokens, and the most tokens per micro-batch 98,304 (llm-foundry MPT-125M: micro-batch 48,
  seq 2048); a micro-batch of more than :data:`MICRO_BATCH_FACTOR` times that many tokens
  is far beyond any row.
"""

from __future__ import annotations

# (GPU family, precision) pairs with published rows (module docstring)
CALIBRATED = {("A100", "bf16"), ("H100", "bf16"), ("H100", "fp8")}
MFU_NOTE_ABOVE = 0.7
MFU_NOTE_ABOVE_FP8 = 842 / 989     # NeMo 24.07 GPT3-175B FP8, TFLOP/s per GPU / bf16 peak
MAX_PUBLISHED_MFU = {"bf16": 0.642, "fp8": 842 / 989}
MAX_CALIBRATED_MICRO_TOKENS = 98_304   # llm-foundry MPT-125M, micro-batch 48 x seq 2048
MICRO_BATCH_FACTOR = 2


def gpu_family(model: str) -> str:
    """``"A100"`` / ``"H100"`` / the model name itself (upper case) for any other GPU.

    >>> gpu_family("A100-SXM4-80GB"), gpu_family("H100-SXM5-80GB"), gpu_family("H200-SXM")
    ('A100', 'H100', 'H200-SXM')
    """
    name = str(model).upper()
    for fam in ("A100", "H100"):
        if fam in name:
            return fam
    return name


def plausibility_notes(settings: dict, gpu_model: str, rows: list[dict] | None = None,
                       compute: bool = True) -> list[str]:
    """The notes for one result: ``settings`` (the echoed settings), the cluster's GPU model,
    the result rows (their ``mfu`` and ``label`` / ``strategy``), ``compute`` False for a
    memory-only result (no compute-model note).

    >>> s = {"precision": "bf16", "micro_batch": 4, "seq_len": 512}
    >>> plausibility_notes(s, "A100-SXM4-80GB", [{"mfu": 0.45}])
    []
    >>> plausibility_notes(s, "H200", [{"mfu": 0.75, "label": "NIG"}])[1][:38]
    'MFU 0.75 (NIG) is above 0.70, higher t'
    """
    notes = []
    prec = settings.get("precision", "bf16")
    fam = gpu_family(gpu_model)
    if compute and (fam, prec) not in CALIBRATED:
        notes.append(f"GPU {gpu_model} in {prec}: no published run of this GPU and precision "
                     "was used to calibrate or check the compute model (calibrated: A100 "
                     "bf16; checked: H100 bf16 and fp8); the step time is an extrapolation")
    limit = MFU_NOTE_ABOVE_FP8 if prec == "fp8" else MFU_NOTE_ABOVE
    high = [r for r in rows or [] if (r.get("mfu") or 0) > limit]
    if compute and high:
        top = max(high, key=lambda r: r["mfu"])
        name = top.get("label") or top.get("strategy") or ""
        more = f", {len(high) - 1} more configuration(s) above it" if len(high) > 1 else ""
        notes.append(f"MFU {top['mfu']:.2f}{f' ({name})' if name else ''} is above "
                     f"{limit:.2f}, higher than any published {prec} run the compute model "
                     f"was checked on (at most {MAX_PUBLISHED_MFU.get(prec, 0.642):.2f}){more}"
                     ": treat it as an upper bound")
    tokens = settings.get("micro_batch", 0) * settings.get("seq_len", 0)
    if tokens > MICRO_BATCH_FACTOR * MAX_CALIBRATED_MICRO_TOKENS:
        notes.append(f"micro-batch {settings['micro_batch']} x seq-len {settings['seq_len']} = "
                     f"{tokens} tokens is more than {MICRO_BATCH_FACTOR}x the largest micro-"
                     f"batch of any calibration row ({MAX_CALIBRATED_MICRO_TOKENS} tokens); "
                     "kernel efficiencies and memory there are extrapolated")
    return notes


def scale_note(cluster) -> list[str]:
    """One line when ``cluster`` was calibrated on runs of some node counts
    (``calibrated_nodes``, written by ``parosim calibrate``) and runs on more nodes than the
    largest: its scale-dependent costs are extrapolated there.

    >>> from parosim.spec.system import ClusterSpec
    >>> scale_note(ClusterSpec(name="c", nodes=4, calibrated_nodes=(1, 2, 4)))
    []
    >>> scale_note(ClusterSpec(name="c", nodes=32, calibrated_nodes=(1, 2)))[0][:60]
    'cluster c was calibrated on runs of 1, 2 nodes; 32 nodes lie'
    """
    cal = getattr(cluster, "calibrated_nodes", ())
    if not cal or cluster.nodes <= max(cal):
        return []
    times = cluster.nodes / max(cal)
    return [f"cluster {cluster.name} was calibrated on runs of {', '.join(map(str, cal))} "
            f"node{'s' if cal != (1,) else ''}; {cluster.nodes} nodes lie {times:.3g}x "
            "beyond the largest, where its scale-dependent costs are extrapolated: how they "
            "grow with the node count was not measured (docs/calibration.md, 'Across node "
            "counts')"]
