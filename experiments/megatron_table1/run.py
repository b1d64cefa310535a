"""Megatron-LM's weak-scaling table (Narayanan et al. 2021, Table 1), predicted.

Every row of ``table1.csv`` (GPT 1.7B ... 1T on 32 ... 3072 A100-80GB, the published TP, PP,
DP and global batch, and the achieved TFLOP/s per GPU) is simulated on the ``dgx-a100-ib``
preset with that node count. Nothing is fitted to the table: it is a check.

Choices where the paper's table is silent (the same rule for every row, stated in
docs/parallelism.md):

* model: the GPT architecture of the paper (4h GeLU MLP, LayerNorm, biases, tied embedding,
  learned positions), vocabulary 51200, sequence 2048;
* micro-batch 1 per pipeline (m = global batch / DP micro-batches per step);
* full activation recomputation (the table's setting), Megatron's DDP = PaRO-NNN, ring
  all-reduce (NCCL's), TP inside a node;
* PP > 1: the interleaved schedule (the table's setting) with the smallest number of model
  chunks v >= 2 that divides the layers of a stage;
* compute efficiency: the project default, 50 % of peak (``--efficiency`` not set), not
  calibrated on this table;
* analytic mode (the larger rows have up to 512 micro-batches x 128 model chunks; the
  ``--engine`` flag replays the rows up to ``--engine-max-gpus`` GPUs on the engine too).

Run: ``python experiments/megatron_table1/run.py [--engine]``; writes ``results.csv`` and
``results.md`` beside this file and prints the table.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def gpt_model(row: dict):
    from parosim.spec.model import ModelSpec

    h = int(row["hidden"])
    return ModelSpec(row["model"], layers=int(row["layers"]), hidden=h, ffn_hidden=4 * h,
                     heads=int(row["heads"]), vocab=int(row["vocab"]), mlp="gelu",
                     norm="layernorm", bias=True, tied_embeddings=True,
                     pos_embedding=int(row["seq_len"]))


def virtual_stages(layers: int, pp: int) -> int:
    """Smallest v >= 2 dividing the layers of a stage (1 when pp = 1)."""
    if pp == 1:
        return 1
    per = layers // pp
    return next(v for v in range(2, per + 1) if per % v == 0) if per > 1 else 1


def setup(row: dict, micro_batch: int = 1):
    from parosim.io import load_cluster
    from parosim.plan.layout import ParallelSpec
    from parosim.spec.training import TrainingSpec

    tp, pp, dp = int(row["tp"]), int(row["pp"]), int(row["dp"])
    cluster = load_cluster("dgx-a100-ib", int(row["nodes"]))
    assert cluster.gpus == tp * pp * dp, row
    model = gpt_model(row)
    v = virtual_stages(model.layers, pp)
    par = (ParallelSpec(tp=tp, pp=pp) if v == 1 else
           ParallelSpec(tp=tp, pp=pp, schedule="interleaved", virtual=v))
    per_replica = int(row["global_batch"]) // dp
    training = TrainingSpec(micro_batch=micro_batch, accum_steps=per_replica // micro_batch,
                            seq_len=int(row["seq_len"]), recompute=True)
    return model, cluster, training, par


def predict(row: dict, mode: str = "analytic"):
    from parosim.simulate.step import simulate_step

    model, cluster, training, par = setup(row)
    return simulate_step(model, cluster, "NNN", training, "ring", mode, parallel=par)


def load_rows() -> list[dict]:
    with open(HERE / "table1.csv", newline="") as f:
        return list(csv.DictReader(f))


def run(engine: bool = False, engine_max_gpus: int = 256) -> list[dict]:
    out = []
    for row in load_rows():
        t0 = time.perf_counter()
        r = predict(row)
        wall = time.perf_counter() - t0
        pub = float(row["published_tflops_per_gpu"])
        par = getattr(r, "parallel", None) or {  # TP = PP = 1: plain data parallelism
            "virtual_stages": 1, "bubble_fraction": 0.0,
            "micro_batches": int(row["global_batch"]) // int(row["dp"])}
        res = {"model": row["model"], "tp": row["tp"], "pp": row["pp"], "dp": row["dp"],
               "gpus": r.gpus, "global_batch": row["global_batch"],
               "virtual_stages": par["virtual_stages"],
               "micro_batches": par["micro_batches"],
               "published_tflops_per_gpu": pub,
               "predicted_tflops_per_gpu": round(r.tflops_per_gpu, 2),
               "error_pct": round(100 * (r.tflops_per_gpu / pub - 1), 2),
               "bubble_fraction": round(par["bubble_fraction"], 4),
               "memory_GB": round(r.memory.total_bytes / 1e9, 1), "fits": r.fits}
        print(f"{row['model']}: analytic in {wall:.3f} s", file=sys.stderr)
        if engine and r.gpus <= engine_max_gpus:
            t0 = time.perf_counter()
            e = predict(row, "engine")
            res["engine_tflops_per_gpu"] = round(e.tflops_per_gpu, 2)
            res["engine_error_pct"] = round(100 * (e.tflops_per_gpu / pub - 1), 2)
            print(f"{row['model']}: engine in {time.perf_counter() - t0:.2f} s",
                  file=sys.stderr)
        out.append(res)
    return out


def median_abs_error(rows: list[dict]) -> float:
    return statistics.median(abs(r["error_pct"]) for r in rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", action="store_true", help="also replay small rows on the engine")
    ap.add_argument("--engine-max-gpus", type=int, default=256)
    a = ap.parse_args(argv)
    rows = run(a.engine, a.engine_max_gpus)
    cols = list(dict.fromkeys(k for r in rows for k in r))
    with open(HERE / "results.csv", "w", newline="") as f:
        w = csv.DictWriter(f, cols)
        w.writeheader()
        w.writerows(rows)
    lines = ["| model | TP | PP | DP | GPUs | batch | v | published TFLOP/s | predicted | "
             "error | bubble |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['tp']} | {r['pp']} | {r['dp']} | {r['gpus']} | "
                     f"{r['global_batch']} | {r['virtual_stages']} | "
                     f"{r['published_tflops_per_gpu']:.0f} | "
                     f"{r['predicted_tflops_per_gpu']:.1f} | {r['error_pct']:+.1f} % | "
                     f"{100 * r['bubble_fraction']:.1f} % |")
    med = median_abs_error(rows)
    lines.append(f"\nmedian |error| = {med:.1f} %, worst = "
                 f"{max(abs(r['error_pct']) for r in rows):.1f} %")
    (HERE / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    if a.engine:
        for r in rows:
            if "engine_tflops_per_gpu" in r:
                print(f"engine {r['model']}: {r['engine_tflops_per_gpu']} TFLOP/s "
                      f"({r['engine_error_pct']:+.1f} %)")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(HERE.parents[1]))
    sys.exit(main())
