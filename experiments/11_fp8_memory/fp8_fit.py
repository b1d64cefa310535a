"""Do the 12 published NeMo 24.07 / Megatron-Bridge 25.11 FP8 runs on DGX-H100 80GB fit?

Each run (experiments/07_compute_model/all_tables.py: nemo_rows) is given to parosim's
memory estimate twice:

* ``default``: precision fp8 and the published parallelism only (``hidden_dropout`` None:
  dropout masks counted as Korthikanti et al. count them; bf16 primary weights);
* ``settings``: plus the run's documented memory settings (docs/memory.md, "FP8"):
  ``hidden_dropout`` 0.1 for GPT-3 (NeMo-Framework-Launcher gpt3/*.yaml), 0.0 for Llama 2,
  Nemotron (launcher llama/*.yaml, nemotron/*.yaml) and Llama 3 (Megatron-Bridge
  ``Llama3ModelProvider``);
  fp8 primary weights (``fp8_params``) for the two Megatron-Bridge 25.11 FP8-CS runs
  (``fp8_param_gather = True`` in its FP8-CS mixed-precision recipe).

Prints per run the most loaded GPU's terms (GB = 1e9 bytes) and whether it fits the 80e9-byte
H100 of the dgx-h100-ib preset; the gap is total - capacity for runs that do not fit.

    PYTHONPATH=$PWD python experiments/11_fp8_memory/fp8_fit.py
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "experiments" / "07_compute_model"))

import all_tables as at  # noqa: E402

from parosim.cost.memory import memory_breakdown  # noqa: E402
from parosim.io import load_cluster  # noqa: E402
from parosim.plan.threed import stage_memory_3d  # noqa: E402
from parosim.spec.training import TrainingSpec  # noqa: E402


def run_settings(r: dict) -> dict:
    """The memory settings of a published run, as ``nemo_rows`` records them (module
    docstring)."""
    return dict(hidden_dropout=r["hidden_dropout"], fp8_params=r["fp8_params"],
                optimizer_dtype=r["optimizer_dtype"])


def worst(r: dict, training: TrainingSpec):
    c = load_cluster(r["cluster"], r["nodes"])
    if r["tp"] * r["pp"] * r["cp"] > 1 or r["selective"]:
        par = at.parallel_spec(r)
        return max(stage_memory_3d(r["model"], r["strategy"], c, training, par),
                   key=lambda m: m.total_bytes)
    return memory_breakdown(r["model"], r["strategy"], c, training)


def table(settings: bool) -> list[tuple[str, object]]:
    out = []
    for r in at.nemo_rows():
        tr = TrainingSpec(micro_batch=r["micro_batch"], accum_steps=r["accum"],
                          seq_len=r["seq"], recompute=False, attention="flash",
                          precision="fp8")
        if settings:
            tr = replace(tr, **run_settings(r))
        out.append((r["config"], worst(r, tr)))
    return out


def main() -> None:
    for settings in (False, True):
        rows = table(settings)
        print(f"\n== {'run settings (dropout, fp8 params)' if settings else 'default'}: "
              f"{sum(w.fits for _, w in rows)} of {len(rows)} fit ==")
        print(f"{'run':40s} {'states':>7s} {'cache':>6s} {'acts':>6s} {'bufs':>5s} "
              f"{'margin':>6s} {'total':>6s}  fits  gap GB")
        for name, w in rows:
            gap = f"{(w.total_bytes - w.capacity_bytes) / 1e9:6.1f}" if not w.fits else ""
            print(f"{name:40s} {w.model_states_bytes / 1e9:7.1f} "
                  f"{w.fp8_weight_cache_bytes / 1e9:6.1f} {w.activations_bytes / 1e9:6.1f} "
                  f"{w.buffers_bytes / 1e9:5.1f} {w.margin_bytes / 1e9:6.1f} "
                  f"{w.total_bytes / 1e9:6.1f}  {str(w.fits):5s} {gap}")


if __name__ == "__main__":
    main()
