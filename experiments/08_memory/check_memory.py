"""Memory model vs published runs that trained: does parosim say they fit?

Data: llm-foundry's MPT benchmark table (61 configurations that ran on A100 80GB with FSDP
FULL_SHARD = PaRO GGG; model, GPUs, micro-batch, activation checkpointing), rows copied in
experiments/data/published_rows.csv with their source.

For each run: (1) does it fit under parosim's memory model with the published micro-batch
and recomputation? (2) the largest micro-batch parosim allows (same recomputation) vs the
published one: within one power of two means published/2 <= ours <= 2 x published.

The runs are evaluated as a user would ask parosim, with ``--runtime fsdp`` and nothing else
set: the profile's defaults (runtimes/fsdp.yaml: the runtime memory model, FlashAttention,
6 bytes per logit, its FlatParameter buffers) decide memory; the published micro-batch and
activation checkpointing are the configuration. ``--runtime ideal`` shows the ideal
runtime's defaults (the Korthikanti estimate with eager attention, parosim before runtime
profiles) for comparison.

Fragmentation fraction: fitted one-sided on half of the configurations (even positions): the
largest fraction (0 to 30%, 0.5% steps) under which every fit-half run still fits; reported
on the held-out half. Run: PYTHONPATH=$PWD python experiments/08_memory/check_memory.py
[--rows] [--no-fit] [--fit-logit-bytes] [--runtime fsdp]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "07_compute_model"))
from published import foundry_rows, split  # noqa: E402

import parosim.cost.memory as memory  # noqa: E402
from parosim.io import load_cluster  # noqa: E402
from parosim.io.runtime import load_runtime  # noqa: E402
from parosim.spec.model import mpt  # noqa: E402
from parosim.spec.training import TrainingSpec  # noqa: E402

# None: the runtime profile's (fsdp: 6, fitted with --fit-logit-bytes: fused bf16 loss 2 + its
# gradient 2 + composer's metric 2); --fit-logit-bytes sets it explicitly while it searches.
LOGIT_BYTES = None


def setup(row, logit_bytes=None):
    """(model, cluster, training) of a published run: only what the run publishes is set;
    the memory settings are the runtime profile's."""
    cluster = load_cluster("llm-foundry-a100-roce", nodes=row.gpus // 8)
    t = TrainingSpec(micro_batch=row.micro_batch, accum_steps=row.accum, seq_len=row.seq_len,
                     recompute=row.recompute, logit_bytes=logit_bytes)
    return mpt(row.model, row.seq_len), cluster, t


RUNTIME = "fsdp"    # --runtime: the profile whose defaults decide memory (runtimes/fsdp.yaml)


def evaluate(rows, runtime=None):
    """[(row, fits, max_micro_batch, total_bytes)] under ``runtime`` (default RUNTIME)."""
    rt = load_runtime(runtime or RUNTIME)
    lb = LOGIT_BYTES if rt.memory_model == "runtime" else None   # the search's, if any
    out = []
    for r in rows:
        m, c, t = setup(r, lb)
        mb = memory.memory_breakdown(m, "GGG", c, t, rt)
        out.append((r, mb.fits, memory.max_micro_batch(m, "GGG", c, t, limit=4096,
                                                      runtime=rt), mb.total_bytes))
    return out


def summary(name, res):
    fits = np.mean([f for _, f, _, _ in res])
    within = np.mean([r.micro_batch / 2 <= mx <= 2 * r.micro_batch for r, _, mx, _ in res])
    print(f"{name:<40} n={len(res):>3}  fit {fits * 100:5.1f}%   max micro-batch within 2x "
          f"of published {within * 100:5.1f}%")
    return fits, within


def fit_fraction(rows) -> float:
    """The largest fraction (0.5% steps, up to 30%) under which every run of ``rows`` fits."""
    best = 0.0
    for f in np.arange(0.0, 0.3001, 0.005):
        memory.FRAGMENTATION_FRACTION = float(f)
        if all(fit for _, fit, _, _ in evaluate(rows)):
            best = float(f)
        else:
            break
    return best


def fit_both(rows) -> tuple[int, float]:
    """Bytes per logit (2..10) and fragmentation fitted together on ``rows``: for each byte
    count the largest fraction under which all runs fit; keep the pair whose largest
    micro-batch is within 2x of the published one for most runs (ties: fewer bytes)."""
    global LOGIT_BYTES
    best = None
    for lb in (2, 4, 6, 8, 10):
        LOGIT_BYTES = lb
        f = fit_fraction(rows)
        memory.FRAGMENTATION_FRACTION = f
        res = evaluate(rows)
        score = (all(x for _, x, _, _ in res),
                 np.mean([r.micro_batch / 2 <= mx <= 2 * r.micro_batch
                          for r, _, mx, _ in res]))
        print(f"  fit: logit_bytes {lb:>2}  fragmentation {f:.3f}  all fit {score[0]}  "
              f"within 2x {score[1] * 100:.1f}%")
        if best is None or score > best[0]:
            best = (score, lb, f)
    return best[1], best[2]


def other_runs():
    """Other published successful runs parosim can express (model, GPUs, micro-batch):
    [(name, model, cluster, strategy, training)]. Their micro-batches are not searched
    maxima, so only "does it fit" is checked.

    * SuperBench v0.4 gpt_models, Azure NDmv4 (8 x A100 80GB), PyTorch DDP, batch 8 per GPU,
      seq 224 (rows 666, 670): GPT-2 small and large, eager attention, autocast loss.
    * Megatron-Bridge 25.11, DGX-H100, LLAMA3_8B seq 8192, Megatron FSDP on 8 GPUs, MBS 1
      (row 931; FP8 compute: we count bf16 parameters, an upper bound); recomputation not
      stated, so the automatic rule decides; flash attention (Transformer Engine).
    """
    from parosim.spec.model import ModelSpec, preset
    arch = dict(mlp="gelu", norm="layernorm", bias=True, tied_embeddings=True,
                pos_embedding=1024)
    a100 = load_cluster("llm-foundry-a100-roce", nodes=1)
    h100 = load_cluster("dgx-h100-ib", nodes=1)
    out = []
    for name, layers, h, heads in (("gpt2-small", 12, 768, 12), ("gpt2-large", 36, 1280, 20)):
        m = ModelSpec(name, layers=layers, hidden=h, ffn_hidden=4 * h, heads=heads,
                      vocab=50257, **arch)
        out.append((f"SuperBench {name} DDP 8 GPUs mb8 seq224", m, a100, "NNN",
                    TrainingSpec(micro_batch=8, accum_steps=1, seq_len=224, recompute=False,
                                 memory_model="runtime", attention="eager")))
    out.append(("Megatron-Bridge llama-3-8b FSDP 8 GPUs mb1 seq8192", preset("llama-3-8b"),
                h100, "GGG", TrainingSpec(micro_batch=1, accum_steps=16, seq_len=8192,
                                          memory_model="runtime", attention="flash")))
    return out     # other frameworks than the fsdp profile: evaluated on the ideal runtime


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", action="store_true")
    ap.add_argument("--no-fit", action="store_true")
    ap.add_argument("--runtime", default="fsdp",
                    help="the runtime profile whose defaults decide memory (default fsdp)")
    ap.add_argument("--fit-logit-bytes", action="store_true",
                    help="also fit the bytes per logit (else the profile's)")
    a = ap.parse_args()
    global LOGIT_BYTES, RUNTIME
    RUNTIME = a.runtime
    rows = foundry_rows()
    committed = memory.FRAGMENTATION_FRACTION
    if a.fit_logit_bytes:
        lb, f = fit_both(split(rows, "fit"))
        LOGIT_BYTES = lb
        print(f"fitted on {len(split(rows, 'fit'))} configurations: logit_bytes {lb}, "
              f"fragmentation {f:.3f} (committed: {committed:.3f})")
        memory.FRAGMENTATION_FRACTION = f
    elif not a.no_fit:
        f = fit_fraction(split(rows, "fit"))
        print(f"fragmentation fraction fitted on {len(split(rows, 'fit'))} configurations: "
              f"{f:.3f} (committed: {committed:.3f})")
        memory.FRAGMENTATION_FRACTION = f
    summary("--runtime ideal (korthikanti, eager), all", evaluate(rows, "ideal"))
    name = f"--runtime {RUNTIME}"
    summary(f"{name}, fit half", evaluate(split(rows, "fit")))
    summary(f"{name}, held-out half", evaluate(split(rows, "held-out")))
    res = evaluate(rows)
    summary(f"{name}, all", res)
    for name, m, c, strat, t in other_runs():
        mb = memory.memory_breakdown(m, strat, c, t, None)
        print(f"other published run: {name}: fits {mb.fits} ({mb.total_bytes / 2**30:.1f} GiB"
              f" of {mb.capacity_bytes / 2**30:.1f}, recompute {mb.recompute})")
    if a.rows:
        print(f"  {'configuration':<32}{'ckpt':>5}{'fits':>6}{'GiB':>8}{'mb pub':>8}"
              f"{'mb max':>8}")
        for r, fit, mx, tot in res:
            print(f"  {r.key:<32}{int(r.recompute):>5}{str(fit):>6}{tot / 2**30:>8.1f}"
                  f"{r.micro_batch:>8}{mx:>8}")


if __name__ == "__main__":
    main()
