"""Why are BigScience's Megatron-DeepSpeed runs on Jean Zay slower than predicted? The size of
each candidate mechanism, checked against the table's own micro-batch pair.

The published pair (bigscience-workshop/bigscience train/tr11-176B-ml/chronicles-prequel.md,
'Final round comparison', rows of the project's calibration set): at the same layout (TP 8 x
PP 6 x DP 8) and global batch (2048), micro-batch 2 (128 micro-batches, 133 pipeline slots)
takes 136.73 s and micro-batch 4 (64, 69 slots) 122.96 s (h12288; h13312: 135.55 / 122.93 s):
~0.2 s per extra slot. The model (the defaults, analytic mode) predicts +2 %.

Each candidate is sized with the model's own terms (cluster preset ``jean-zay-a100``) or with
the source's own numbers, never fitted:

* **DeepSpeed's pipeline schedule** (microsoft/DeepSpeed deepspeed/runtime/pipe/schedule.py
  @077e6740, ``TrainSchedule``: 2(m + p - 1) steps, even and odd stages alternating forward
  and backward steps, every send and receive blocking and paired). :func:`schedule_times`
  replays it (every transfer a rendezvous of its two stages) beside Megatron's 1F1B with
  the same per-stage times: with free transfers they end at the same instant, so the
  schedule adds no bubble; it puts 4 blocking transfers per slot on the critical path.
* **Those transfers**: DeepSpeed's engine partitions activations and gradients over the TP
  group (``is_pipe_partitioned`` / ``is_grad_partitioned``, deepspeed/runtime/pipe/engine.py,
  PipelineEngine.__init__; the gradient one is off in some 2021-22 versions): 1/t of the
  activation per rank between nodes, then an all-gather in the TP group, or the whole
  gradient from every rank; costed with parosim's collective model.
* **The LM head, fp32 logits and loss on the last stage** (GPTModelPipe's fixed
  ``partition_method='type:transformer'``, bigscience-workshop/Megatron-DeepSpeed
  megatron/model/gpt_model.py @0035f06a; ``--pp-partition-method`` came on 02-28 per the
  chronicles): already in the model (the last stage is the slowest one).
* **The bf16 optimizer's fp32 gradient accumulation after every micro-batch**: one pass of
  10 bytes per parameter (read bf16 grad and fp32 accumulator, write it) over the stage's
  parameters per GPU, at the kernel model's HBM rate. It did not exist on 02-23: the
  chronicles' 'Rebalancing layers' section (02-28) says testing uses the BF16 optimizer "that
  was just written" from then on.
* **The TP layer-norm weight sync**: every LayerNorm's weight and bias all-reduced over the
  TP group before each forward (train/tr11-176B-ml/chronicles.md, 2022-03-24 and 03-30, a
  band-aid later made ``--sync-tp-duplicated-parameters``): it came after 02-23; sized as 8
  small blocking all-reduces per layer and slot (forward and recomputed forward).
* **CUDA_LAUNCH_BLOCKING=1** (set in train/tr11-176B-ml/tr11-176B-ml.slurm: "do not remove or
  the training will hang"): every kernel launch waits for the GPU, so host time per kernel
  is exposed. Its size is bounded by the source's own A/B test (chronicles-prequel.md,
  'dealing with JZ hanging on the large model': 200B, TP 8 x PP 10, micro-batch 1; 80 GPUs
  GBS 512: 91.04 TFLOPs blocking vs 97.20 async; 160 GPUs GBS 2048: 90.29 vs 90.25) as a
  cost per layer and micro-batch, on the slot time of the same layout ('Best TFLOPs', bf16,
  80 GPUs: 853.81 s for 2048 micro-batches over 10 stages of 8 layers).

Run: ``PYTHONPATH=$PWD python experiments/defaults_accuracy/bigscience_candidates.py``
(a few seconds; prints one table, asserts the claims docs/accuracy.md makes).
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "experiments" / "07_compute_model"))

import all_tables  # noqa: E402
import evaluate_defaults as ed  # noqa: E402

# CUDA_LAUNCH_BLOCKING A/B (chronicles-prequel.md, see the module docstring): the larger of
# the two measured slowdowns, and the slot of that layout (s per micro-batch, 8 layers/stage)
BLOCKING_SLOWDOWN = 97.20 / 91.04 - 1
BLOCKING_SLOT_S = 853.81 / (2048 + 10 - 1)
BLOCKING_LAYERS_PER_STAGE = 80 // 10
# bytes per parameter of an fp32 gradient accumulation pass: read bf16 grad (2), read and
# write the fp32 accumulator (4 + 4)
ACCUMULATE_BYTES_PER_PARAM = 10


def _rendezvous(programs: list[list[tuple]], fwd: list[float], bwd: list[float],
                transfer_s: float) -> float:
    """End time of per-stage programs of ("F", j) / ("B", j) computations and ("x", key)
    blocking transfers: a transfer starts when both stages named in its key reach it and
    takes ``transfer_s``."""
    p = len(programs)
    at, t = [0] * p, [0.0] * p
    while any(at[k] < len(programs[k]) for k in range(p)):
        moved = False
        for k in range(p):
            while at[k] < len(programs[k]):
                op = programs[k][at[k]]
                if op[0] in ("F", "B"):
                    t[k] += fwd[k] if op[0] == "F" else bwd[k]
                    at[k] += 1
                    moved = True
                    continue
                lo = op[1][1]
                q = lo + 1 if k == lo else lo
                if at[q] >= len(programs[q]) or programs[q][at[q]] != op:
                    break
                t[k] = t[q] = max(t[k], t[q]) + transfer_s
                at[k] += 1
                at[q] += 1
                moved = True
        if not moved:
            raise RuntimeError("the schedule deadlocked")
    return max(t)


def deepspeed_program(p: int, m: int, k: int) -> list[tuple]:
    """Stage k's steps in DeepSpeed's TrainSchedule (schedule.py @077e6740): step s is a
    forward when s and k have the same parity, else a backward; the micro-batch of a step
    follows from s and k; a forward step first receives its activation then sends the
    previous step's input gradient, a backward step first sends the previous step's output
    then receives its gradient."""
    def step(s: int) -> tuple[int, bool]:
        half = s // 2
        if s % 2 == k % 2:
            return half - k // 2, True
        if s % 2 == 0:
            return half - p + (k + 1) // 2, False
        return half - p + 1 + k // 2, False

    def ok(j: int) -> bool:
        return 0 <= j < m

    out, prev = [], -1
    for s in range(2 * (m + p - 1)):
        j, fwd = step(s)
        if fwd and k > 0:
            out += [("x", ("act", k - 1, j))] if ok(j) else []
            out += [("x", ("grad", k - 1, prev))] if ok(prev) else []
        elif not fwd and k < p - 1:
            out += [("x", ("act", k, prev))] if ok(prev) else []
            out += [("x", ("grad", k, j))] if ok(j) else []
        if ok(j):
            out.append(("F" if fwd else "B", j))
        prev = j
    return out


def one_f_one_b_program(p: int, m: int, k: int) -> list[tuple]:
    """Stage k's 1F1B (Megatron-LM): p - k - 1 warm-up forwards, then forward / backward
    pairs with each neighbour exchange batched into one transfer, then the cool-down."""
    out, warm = [], min(p - k - 1, m)
    for j in range(warm):
        out += [("x", ("act", k - 1, j))] if k > 0 else []
        out.append(("F", j))
        out += [("x", ("act", k, j))] if k < p - 1 else []
    rest = m - warm
    out += [("x", ("act", k - 1, warm))] if rest > 0 and k > 0 else []
    for i in range(rest):
        out.append(("F", warm + i))
        out += [("x", ("pair", k, i))] if k < p - 1 else []
        out.append(("B", i))
        if k > 0:
            out.append(("x", ("pair", k - 1, i)) if i < rest - 1 else ("x", ("grad", k - 1, i)))
    for i in range(rest, m):
        out += [("x", ("grad", k, i))] if k < p - 1 else []
        out.append(("B", i))
        out += [("x", ("grad", k - 1, i))] if k > 0 else []
    return out


def schedule_times(p: int, m: int, fwd: list[float], bwd: list[float],
                   transfer_s: float = 0.0) -> tuple[float, float]:
    """(DeepSpeed TrainSchedule, 1F1B) pipeline phase in seconds."""
    return (_rendezvous([deepspeed_program(p, m, k) for k in range(p)], fwd, bwd, transfer_s),
            _rendezvous([one_f_one_b_program(p, m, k) for k in range(p)], fwd, bwd,
                        transfer_s))


def _parts(row: dict) -> dict:
    """The model's terms of one row: predicted step, per-stage micro-batch times, the
    pipeline transfer of one activation (s), parameters per GPU of a middle stage."""
    from parosim.collectives import Algo
    from parosim.collectives.cost import program_time
    from parosim.collectives.types import Op, Scope
    from parosim.evaluate.threed import summary_3d
    from parosim.io import load_cluster
    from parosim.plan.layout import layout_for, lower_group, lower_p2p
    from parosim.plan.memory3d import stage_params
    from parosim.plan.threed_parts import tp_buffer_bytes
    from parosim.spec.strategy import parse_strategy

    cluster = load_cluster(row["cluster"], row["nodes"])
    tr, par = ed.training_of(row, cluster), all_tables.parallel_spec(row)
    a = summary_3d(row["model"], parse_strategy(row["strategy"]), cluster, tr, par, Algo.NCCL,
                   True)
    lay = layout_for(cluster, par.tp, par.pp)
    size = tp_buffer_bytes(row["model"], tr)
    transfer = (program_time(cluster, lower_p2p(lay.pairs(0, 1), size / par.tp))
                + program_time(cluster, lower_group(cluster, Op.ALL_GATHER, Scope.GLOBAL, size,
                                                    Algo.RING, lay.tp_scopes(1))))
    whole = program_time(cluster, lower_p2p(lay.pairs(0, 1), size))   # not partitioned
    # one bf16 LayerNorm weight (or bias) all-reduced over the TP group
    norm_sync = program_time(cluster, lower_group(cluster, Op.ALL_REDUCE, Scope.GLOBAL,
                                                  2.0 * row["model"].hidden, Algo.RING,
                                                  lay.tp_scopes(1)))
    comp = cluster.compute
    return {"step": ed.predict(row)["predicted"], "stages": a.stage_time_s,
            "transfer": transfer, "whole": whole, "norm_sync": norm_sync,
            "params": stage_params(row["model"], par)[1],
            "hbm": cluster.gpu.hbm_bandwidth_Bps * comp.hbm_efficiency,
            "m": tr.accum_steps, "p": par.pp, "layers": row["model"].layers // par.pp}


def candidates(small: int = 0, large: int = 1) -> dict:
    """Per candidate: (seconds it adds to the micro-batch-2 step minus the micro-batch-4
    step, seconds it adds to the micro-batch-4 step) for the pair of rows ``small`` /
    ``large`` of the BigScience table; with the published and the predicted steps."""
    rows = all_tables.bigscience_rows()
    r2, r4 = rows[small], rows[large]
    assert (r2["micro_batch"], r4["micro_batch"]) == (2, 4)
    assert r2["model"] == r4["model"] and (r2["pp"], r2["dp"]) == (r4["pp"], r4["dp"])
    x2, x4 = _parts(r2), _parts(r4)
    slots = {k: x["m"] + x["p"] - 1 for k, x in (("2", x2), ("4", x4))}
    out = {"published": (r2["published"] - r4["published"], r4["published"]),
           "predicted": (x2["step"] - x4["step"], x4["step"])}

    # the schedule: DeepSpeed's vs 1F1B on the model's stage times (forward 1/4 of a slot with
    # full recomputation: forward, then recomputed forward + backward), free transfers
    for x in (x2, x4):
        fwd = [s / 4 for s in x["stages"]]
        bwd = [3 * s / 4 for s in x["stages"]]
        ds, ofob = schedule_times(x["p"], x["m"], fwd, bwd)
        x["schedule"] = ds - ofob
    out["schedule"] = (x2["schedule"] - x4["schedule"], x4["schedule"])

    # 4 blocking transfers per slot on the critical path (receive and send, each direction):
    # activations and gradients partitioned over TP; or the gradients whole from every rank
    # (engine versions with is_grad_partitioned off)
    def p2p(x, n, grad="transfer"):
        return 2 * (x["transfer"] + x[grad]) * n
    out["p2p"] = (p2p(x2, slots["2"]) - p2p(x4, slots["4"]), p2p(x4, slots["4"]))
    out["p2p_whole_grad"] = (p2p(x2, slots["2"], "whole") - p2p(x4, slots["4"], "whole"),
                             p2p(x4, slots["4"], "whole"))

    # the LM head stage, already modelled: the last stage's excess over the others, per step
    def head(x):
        others = x["stages"][:-1]
        return x["m"] * (x["stages"][-1] - sum(others) / len(others))
    out["lm_head_in_model"] = (head(x2) - head(x4), head(x4))

    # the bf16 optimizer's per-micro-batch fp32 accumulation (absent on 02-23)
    def acc(x):
        return x["m"] * ACCUMULATE_BYTES_PER_PARAM * x["params"] / x["hbm"]
    out["bf16_accumulation"] = (acc(x2) - acc(x4), acc(x4))

    # the TP layer-norm sync (absent on 02-23): weight and bias of both norms of every layer
    # all-reduced before each forward, the recomputed one included, blocking
    def sync(x, n):
        return 2 * 2 * 2 * x["layers"] * x["norm_sync"] * n
    out["norm_sync"] = (sync(x2, slots["2"]) - sync(x4, slots["4"]), sync(x4, slots["4"]))

    # CUDA_LAUNCH_BLOCKING: at most the source's larger A/B slowdown, per layer and slot
    per_layer = BLOCKING_SLOWDOWN * BLOCKING_SLOT_S / BLOCKING_LAYERS_PER_STAGE

    def blocking(x, n):
        return per_layer * x["layers"] * n
    out["launch_blocking_bound"] = (blocking(x2, slots["2"]) - blocking(x4, slots["4"]),
                                    blocking(x4, slots["4"]))
    return out


LABELS = {
    "published": "published (s)",
    "predicted": "predicted, defaults (s)",
    "schedule": "DeepSpeed TrainSchedule vs 1F1B",
    "p2p": "blocking pipeline transfers, 4 per slot",
    "p2p_whole_grad": "the same, gradients not partitioned over TP",
    "lm_head_in_model": "LM head + loss on the last stage (in the model)",
    "bf16_accumulation": "bf16 optimizer fp32 accumulation (absent on 02-23)",
    "norm_sync": "TP layer-norm sync before every forward (absent on 02-23)",
    "launch_blocking_bound": "CUDA_LAUNCH_BLOCKING=1, upper bound",
}


def main() -> int:
    lines = ["| candidate | h12288: MBS 2 - MBS 4 (s) | MBS 4 step (s) | h13312: MBS 2 - MBS 4 "
             "(s) | MBS 4 step (s) |", "|---|---:|---:|---:|---:|"]
    a, b = candidates(0, 1), candidates(3, 4)
    for key, label in LABELS.items():
        lines.append(f"| {label} | {a[key][0]:+.2f} | {a[key][1]:.2f} | {b[key][0]:+.2f} | "
                     f"{b[key][1]:.2f} |")
    print("\n".join(lines))
    for c in (a, b):
        gap2 = c["published"][0] - c["predicted"][0]        # the unexplained pair difference
        gap4 = c["published"][1] - c["predicted"][1]        # the unexplained micro-batch-4 time
        assert gap2 > 10 and gap4 > 20, (gap2, gap4)
        assert abs(c["schedule"][0]) < 1e-6 and abs(c["schedule"][1]) < 1e-6   # same as 1F1B
        assert abs(c["p2p"][0]) < 0.1 and c["p2p"][1] < 0.1 * gap4       # MBS-neutral
        assert abs(c["p2p_whole_grad"][0]) < 0.5 and c["p2p_whole_grad"][1] < 0.25 * gap4
        assert c["bf16_accumulation"][0] < 0.25 * gap2
        assert c["norm_sync"][0] < 0.1 * gap2
        assert c["launch_blocking_bound"][0] < 0.35 * gap2
        assert c["launch_blocking_bound"][1] < 0.25 * gap4
        assert c["lm_head_in_model"][1] > 0                 # the last stage is the slowest
    return 0


if __name__ == "__main__":
    sys.exit(main())
