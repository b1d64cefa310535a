"""Robustness campaign 4: no wrong, silent or unclear answer from advise, run, jobs, overrides,
DeepSpeed configs, calibrate and compare; invariants that hold for every input.

Every CLI case runs ``parosim.cli.main`` in this process under a wall-clock alarm and checks
``ERR(needle)`` (exit 2, one stderr line ``parosim: error: ...`` holding ``needle``, which names
the flag or field, no traceback) or ``OK`` (exit 0, no traceback, no NaN in the JSON when
``--json`` is given). The answers checked against hand values are in the tests below the table.
"""

from __future__ import annotations

import argparse
import io
import json
import math
from contextlib import redirect_stdout
from pathlib import Path

import pytest
from cli_harness import (  # noqa: F401
    CASE_TIMEOUT_S,
    ERR,
    OK,
    check_err,
    cluster_yaml,
    run_case,
    with_overrides,
)

from parosim.cli.parser import EXAMPLES, build_parser

ROOT = Path(__file__).resolve().parents[1]
P4DE_LOG = ROOT / "tests" / "data" / "nccl-tests" / "aws-p4de-2node-all_reduce.txt"


def run_json(argv: list[str], capsys) -> dict:
    rc, out, err = run_case([*argv, "--json"], capsys)
    assert rc == 0, err
    assert "NaN" not in out and "Infinity" not in out
    return json.loads(out)


# --- input files -----------------------------------------------------------------------------

CL = cluster_yaml(2)


def _ov(*entries: str) -> str:
    return with_overrides(CL, *entries)


def _jobs(*jobs: str, top: str = "") -> str:
    return ("cluster: paper-a100-roce\nnodes: 4\nsteps: 1\n" + top + "jobs:\n"
            + "".join(f"  - {j}\n" for j in jobs))


J = "name: a, model: mpt-125m, strategy: NIG, accum: 1, nodes: [0, 1]"
STEPS_H = "model,strategy,nodes,micro_batch,accum,seq_len,step_time_s"
STEPS_ROW = "mpt-1b,GGG,1,8,4,2048,4.01"
LOG_NAN = None   # made from the published log in the fixture


def _ds(d: dict) -> str:
    return json.dumps(d)


FILES: dict[str, str] = {
    # clusters: names, overrides
    "name_list.yaml": CL.replace("name: t", "name: [a, b]"),
    "name_empty.yaml": CL.replace("name: t", "name: ''"),
    "name_map.yaml": CL.replace("name: t", "name: {a: 1}"),
    "name_bool.yaml": CL.replace("name: t", "name: true"),
    "name_num.yaml": CL.replace("name: t", "name: 8"),
    "ov_straggler.yaml": _ov("{gpus: [n0/gpu1], speed: 0.8}"),
    "ov_failed.yaml": _ov("{links: [[n1/nic0, switch]], failed: true}"),
    "ov_slow_nic.yaml": _ov("{nodes: [1], nic: {bandwidth: 25Gbps}}"),
    "jitter.yaml": CL + "jitter: {distribution: lognormal, cv: 0.05}\n",
    "ov_speed_word.yaml": _ov("{gpus: [n0/gpu1], speed: fast}"),
    "ov_speed_neg.yaml": _ov("{gpus: [n0/gpu1], speed: -1}"),
    "ov_speed_3.yaml": _ov("{gpus: [n0/gpu1], speed: 3}"),
    "ov_speed_nan.yaml": _ov("{gpus: [n0/gpu1], speed: .nan}"),
    "ov_gpu_out.yaml": _ov("{gpus: [n9/gpu0], speed: 0.9}"),
    "ov_gpu_idx_out.yaml": _ov("{gpus: [n0/gpu8], speed: 0.9}"),
    "ov_node_out.yaml": _ov("{nodes: [9], speed: 0.9}"),
    "ov_node_neg.yaml": _ov("{nodes: [-1], speed: 0.9}"),
    "ov_unknown_key.yaml": _ov("{nodes: [0], colour: red}"),
    "ov_no_target.yaml": _ov("{speed: 0.9}"),
    "ov_not_map.yaml": _ov("just-a-string"),
    "ov_not_list.yaml": CL + "overrides: {nodes: [0], speed: 0.9}\n",
    "ov_link_missing.yaml": _ov("{links: [[n0/gpu0, n1/gpu0]], bandwidth: 10Gbps}"),
    "ov_link_bw0.yaml": _ov("{links: [[n1/nic0, switch]], bandwidth: 0Gbps}"),
    "ov_link_bw_neg.yaml": _ov("{links: [[n1/nic0, switch]], bandwidth: -5Gbps}"),
    "ov_link_bw_inf.yaml": _ov("{links: [[n1/nic0, switch]], bandwidth: .inf}"),
    "ov_link_bw_empty.yaml": _ov("{links: [[n1/nic0, switch]], bandwidth: ''}"),
    "ov_link_lat_neg.yaml": _ov("{links: [[n1/nic0, switch]], latency: -1us}"),
    "ov_link_lat_bare.yaml": _ov("{links: [[n1/nic0, switch]], latency: 5}"),
    "ov_failed_word.yaml": _ov("{links: [[n1/nic0, switch]], failed: maybe}"),
    "ov_nic_bw0.yaml": _ov("{nodes: [0], nic: {bandwidth: 0Gbps}}"),
    "ov_nic_bw_inf.yaml": _ov("{nodes: [0], nic: {bandwidth: 1e999Gbps}}"),
    "ov_gpu_mem0.yaml": _ov("{nodes: [0], gpu: {memory: 0GB}}"),
    "ov_gpu_mem_empty.yaml": _ov("{nodes: [0], gpu: {memory: ''}}"),
    "ov_gpu_unknown.yaml": _ov("{nodes: [0], gpu: {model: B300-SXM}}"),
    "ov_gpu_tflops0.yaml": _ov("{nodes: [0], gpu: {peak_tflops: 0}}"),
    # runtimes
    "rt_empty_name.yaml": "name: ''\nstages: {NGG: ZeRO-2}\n",
    "rt_list_name.yaml": "name: [x]\nstages: {NGG: ZeRO-2}\n",
    "rt_blank_name.yaml": "name: '   '\nstages: {NGG: ZeRO-2}\n",
    # models
    "model_empty_name.yaml": "name: ''\nparams: 7.0e9\n",
    # jobs
    "jobs_ok.yaml": _jobs("{" + J + "}"),
    "jobs_alias.yaml": _jobs("{name: a, model: mpt-125m, strategy: NIG, accum_steps: 1, "
                             "compute_efficiency: 0.5, nodes: [0, 1]}"),
    "jobs_canonical.yaml": _jobs("{name: a, model: mpt-125m, strategy: NIG, accum: 1, "
                                 "efficiency: 0.5, nodes: [0, 1]}"),
    "jobs_both_accum.yaml": _jobs("{" + J + ", accum_steps: 2}"),
    "jobs_both_eff.yaml": _jobs("{" + J + ", efficiency: 0.5, compute_efficiency: 0.4}"),
    "jobs_accum0.yaml": _jobs("{name: a, model: mpt-125m, accum: 0, nodes: [0, 1]}"),
    "jobs_eff2.yaml": _jobs("{" + J + ", efficiency: 2}"),
    "jobs_ceff0.yaml": _jobs("{name: a, model: mpt-125m, accum: 1, compute_efficiency: 0, "
                             "nodes: [0, 1]}"),
    "jobs_mb0.yaml": _jobs("{" + J + ", micro_batch: 0}"),
    "jobs_seq_word.yaml": _jobs("{" + J + ", seq_len: long}"),
    "jobs_recompute.yaml": _jobs("{" + J + ", recompute: maybe}"),
    "jobs_tp0.yaml": _jobs("{" + J + ", tp: 0}"),
    "jobs_nodes_empty.yaml": _jobs("{name: a, model: mpt-125m, nodes: []}"),
    "jobs_node_out.yaml": _jobs("{name: a, model: mpt-125m, accum: 1, nodes: [0, 9]}"),
    "jobs_overlap.yaml": _jobs("{" + J + "}", "{name: b, model: mpt-125m, accum: 1, "
                               "nodes: [1, 2]}"),
    "jobs_dup_name.yaml": _jobs("{" + J + "}", "{name: a, model: mpt-125m, accum: 1, "
                                "nodes: [2, 3]}"),
    "jobs_strategy.yaml": _jobs("{" + J.replace("NIG", "XYZ") + "}"),
    "jobs_runtime.yaml": _jobs("{" + J + ", runtime: nope}"),
    "jobs_algo.yaml": _jobs("{" + J + ", algo: foo}"),
    "jobs_model.yaml": _jobs("{" + J.replace("mpt-125m", "gpt-9") + "}"),
    "jobs_key.yaml": _jobs("{" + J + ", colour: red}"),
    "jobs_steps0.yaml": _jobs("{" + J + "}").replace("steps: 1", "steps: 0"),
    "jobs_no_cluster.yaml": "jobs:\n  - {" + J + "}\n",
    "jobs_nic0.yaml": _jobs("{" + J + "}", top="nic_bandwidth: 0Gbps\n"),
    "jobs_gpumem_empty.yaml": _jobs("{" + J + "}", top="gpu_memory: ''\n"),
    "jobs_empty_list.yaml": "cluster: paper-a100-roce\njobs: []\n",
    "jobs_not_list.yaml": "cluster: paper-a100-roce\njobs: {a: 1}\n",
    "jobs_fp8.yaml": _jobs("{" + J + ", precision: fp8}"),
    "jobs_sched.yaml": _jobs("{" + J + ", pp: 2, pp_schedule: zigzag}"),
    "jobs_straggler.yaml": "cluster: {d}/ov_straggler.yaml\nsteps: 1\njobs:\n  - {" + J + "}\n",
    # DeepSpeed configs (32 GPUs on the default 4-node cluster)
    "ds_list.json": "[1, 2]",
    "ds_bad.json": '{"zero_optimization": {"stage": 2}',
    "ds_stage4.json": _ds({"zero_optimization": {"stage": 4}}),
    "ds_stage_word.json": _ds({"zero_optimization": {"stage": "two"}}),
    "ds_stage_neg.json": _ds({"zero_optimization": {"stage": -1}}),
    "ds_tb0.json": _ds({"train_batch_size": 0}),
    "ds_tb_neg.json": _ds({"train_batch_size": -32}),
    "ds_tb_word.json": _ds({"train_batch_size": "big"}),
    "ds_tb_frac.json": _ds({"train_batch_size": 1.5}),
    "ds_tb_odd.json": _ds({"train_batch_size": 100, "zero_optimization": {"stage": 2}}),
    "ds_gas_word.json": _ds({"gradient_accumulation_steps": "x"}),
    "ds_bucket_neg.json": _ds({"zero_optimization": {"stage": 2, "reduce_bucket_size": -1}}),
    "ds_bucket_word.json": _ds({"zero_optimization": {"stage": 2, "reduce_bucket_size": "x"}}),
    "ds_overlap_word.json": _ds({"zero_optimization": {"stage": 2, "overlap_comm": "yes"}}),
    "ds_offload_tape.json": _ds({"zero_optimization": {"stage": 2, "offload_optimizer":
                                                       {"device": "tape"}}}),
    "ds_nan_nested.json": '{"zero_optimization": {"stage": 2, "reduce_bucket_size": NaN}}',
    "ds_ok.json": _ds({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
                       "zero_optimization": {"stage": 2}}),
    # calibrate --steps CSVs
    "st_extra.csv": f"{STEPS_H}\n{STEPS_ROW},9\n",
    "st_short.csv": f"{STEPS_H}\nmpt-1b,GGG,1,8,4,2048\n",
    "st_dup.csv": f"{STEPS_H},nodes\n{STEPS_ROW},2\n",
    "st_tiny.csv": f"{STEPS_H}\nmpt-1b,GGG,1,8,4,2048,1e-300\n",
    "st_huge.csv": f"{STEPS_H}\nmpt-1b,GGG,1,8,4,2048,1e10\n",
    "st_nan.csv": f"{STEPS_H}\nmpt-1b,GGG,1,8,4,2048,nan\n",
    "st_inf.csv": f"{STEPS_H}\nmpt-1b,GGG,1,8,4,2048,inf\n",
    "st_neg.csv": f"{STEPS_H}\nmpt-1b,GGG,1,8,4,2048,-4\n",
    "st_word.csv": f"{STEPS_H}\nmpt-1b,GGG,1,8,4,2048,slow\n",
    "st_nodes0.csv": f"{STEPS_H}\nmpt-1b,GGG,0,8,4,2048,4.01\n",
    "st_mb_word.csv": f"{STEPS_H}\nmpt-1b,GGG,1,x,4,2048,4.01\n",
    "st_unknown_col.csv": f"{STEPS_H},colour\n{STEPS_ROW},red\n",
    "st_missing_col.csv": "model,strategy,nodes\nmpt-1b,GGG,1\n",
    "st_header_only.csv": f"{STEPS_H}\n",
    "st_empty.csv": "",
    "st_recompute.csv": f"{STEPS_H},recompute\n{STEPS_ROW},maybe\n",
    "st_sp.csv": f"{STEPS_H},sequence_parallel\n{STEPS_ROW},maybe\n",
    "st_tp0.csv": f"{STEPS_H},tp\n{STEPS_ROW},0\n",
    # nccl-tests logs
    "log_empty.txt": "",
    "log_text.txt": "hello\nthis is not an nccl-tests log\n",
}


def _write_files(root: Path) -> None:
    for name, text in FILES.items():
        (root / name).write_text(text.replace("{d}", str(root)))
    bad = P4DE_LOG.read_text().splitlines()     # lines "0:   size count float sum -1 time"
    last = max(i for i, ln in enumerate(bad) if " float " in ln)
    parts = bad[last].split()
    parts[parts.index("float") + 3] = "nan"      # the out-of-place time column
    bad[last] = "  ".join(parts)
    (root / "log_nan.txt").write_text("\n".join(bad) + "\n")


A = ["--mode", "analytic"]
SMALL = ["--nodes", "1", "--accum", "2"]
RUN = ["run", *A, "--nodes", "1", "--tokens", "1B", "--replications", "4"]
ADV = ["advise", "--model", "mpt-125m", "--nodes", "1", "--global-batch", "64",
       "--strategies", "NNN", "--engine-top", "0"]
ADV2 = ["advise", "--model", "mpt-125m", "--global-batch", "64", "--strategies", "NNN",
        "--engine-top", "0"]
CAL = ["calibrate", "--cluster", "llm-foundry-a100-roce", "-o", "{d}/out.yaml", "--steps"]
NCCL = ["calibrate", "--nccl-tests", str(P4DE_LOG), "--cluster", "aws-p4de", "-o",
        "{d}/p4de.yaml"]
DS = ["simulate", *A, "--deepspeed-config"]
SIM = ["simulate", *A]
JOBS = ["simulate", "--jobs"]

CASES: list[tuple[str, list[str], tuple]] = [
    # --- advise -----------------------------------------------------------------------------
    ("adv-engine-top-1000", [*ADV, "--engine-top", "1000"], ERR("--engine-top = 1000")),
    ("adv-engine-top-21", [*ADV, "--engine-top", "21"], ERR("at most 20")),
    ("adv-engine-top-neg", [*ADV, "--engine-top", "-1"], ERR("--engine-top = -1")),
    ("adv-top-1001", [*ADV, "--top", "1001"], ERR("--top = 1001")),
    ("adv-top-0", [*ADV, "--top", "0"], ERR("--top = 0")),
    ("adv-max-mb-0", [*ADV, "--max-micro-batch", "0"], ERR("--max-micro-batch = 0")),
    ("adv-strategies-empty", [*ADV, "--strategies", ""], ERR("--strategies is empty")),
    ("adv-strategies-commas", [*ADV, "--strategies", ",,"], ERR("--strategies ',,'")),
    ("adv-strategies-blank-list", [*ADV, "--strategies", " , "], ERR("--strategies")),
    ("adv-strategies-bad", [*ADV, "--strategies", "NIG,,XYZ"], ERR("'XYZ'")),
    ("adv-gb-empty", [*ADV, "--global-batch", ""], ERR("--global-batch ''")),
    ("adv-gb-frac", [*ADV, "--global-batch", "1.5"], ERR("--global-batch '1.5'")),
    ("adv-gb-word", [*ADV, "--global-batch", "lots"], ERR("--global-batch 'lots'")),
    ("adv-gb-tok", [*ADV, "--global-batch", "7tok"], ERR("--global-batch '7tok'")),
    ("adv-seq-0", [*ADV, "--seq-len", "0"], ERR("--seq-len = 0")),
    ("adv-seq-word", [*ADV, "--seq-len", "4x"], ERR("--seq-len")),
    ("adv-cp-0", [*ADV, "--cp", "0"], ERR("--cp 0")),
    ("adv-mode-not-model", [*ADV, "--mode", "analytic"], ERR("--mode")),   # no abbreviation
    ("adv-eff-0", [*ADV, "--efficiency", "0"], ERR("--efficiency = 0.0")),
    ("adv-eff-nan", [*ADV, "--efficiency", "nan"], ERR("--efficiency = nan")),
    ("adv-ceff-alias", [*ADV, "--compute-efficiency", "1.5"], ERR("--efficiency = 1.5")),
    ("adv-gpu-mem-empty", [*ADV, "--gpu-memory", ""], ERR("--gpu-memory is empty")),
    ("adv-gpu-mem-0", [*ADV, "--gpu-memory", "0GB"], ERR("--gpu-memory '0GB'")),
    # where the closed form does not hold (simulate --mode analytic refuses these too)
    ("adv-mixed", [*ADV2, "--cluster", "mixed-a100-h100"], ERR("GPU overrides")),
    ("adv-ecmp", [*ADV2, "--cluster", "eth-2spine-a100"], ERR("ECMP hashing")),
    ("adv-failed-link", [*ADV2, "--cluster", "{d}/ov_failed.yaml"], ERR("link overrides")),
    ("adv-slow-nic", [*ADV2, "--cluster", "{d}/ov_slow_nic.yaml"], ERR("link overrides")),
    ("adv-straggler", [*ADV2, "--cluster", "{d}/ov_straggler.yaml"], ERR("GPU overrides")),
    ("adv-jitter", [*ADV2, "--cluster", "{d}/jitter.yaml"], ERR("compute jitter")),
    # 24 GPUs, 32 layers: data-parallel degrees 3, 6, 12, 24 all miss 2048
    ("adv-divisibility", ["advise", "--model", "llama-7b", "--nodes", "3", "--global-batch",
                          "2048"], ERR("a divisibility problem, not memory")),
    ("adv-plot-gif", [*ADV, "--plot", "{d}/p.gif"], ERR("--plot")),
    ("adv-model-empty", [*ADV, "--model", ""], ERR("model ''")),
    ("adv-ok", [*ADV], OK()),
    # --- run --------------------------------------------------------------------------------
    ("run-ckint-1s", [*RUN, "--checkpoint-interval", "1s"], ERR("shorter than one step")),
    ("run-ckint-1e8s", [*RUN, "--checkpoint-interval", "1e8s"],
     ERR("--checkpoint-interval 1e8s is longer than the whole run")),
    ("run-ckint-0", [*RUN, "--checkpoint-interval", "0s"], ERR("--checkpoint-interval '0s'")),
    ("run-ckint-bare", [*RUN, "--checkpoint-interval", "5"], ERR("--checkpoint-interval '5'")),
    ("run-ckint-empty", [*RUN, "--checkpoint-interval", ""], ERR("--checkpoint-interval")),
    ("run-ckint-word", [*RUN, "--checkpoint-interval", "often"], ERR("'often'")),
    ("run-ckint-neg", [*RUN, "--checkpoint-interval=-1s"], ERR("--checkpoint-interval")),
    ("run-ckpt-1e9", [*RUN, "--checkpoint-time", "1e9s"], ERR("--checkpoint-time of 1e+09 s")),
    ("run-ckpt-1e10", [*RUN, "--checkpoint-time", "1e10s"], ERR("--checkpoint-time '1e10s'")),
    ("run-ckpt-word", [*RUN, "--checkpoint-time", "abc"], ERR("--checkpoint-time 'abc'")),
    ("run-ckpt-nan", [*RUN, "--checkpoint-time", "nans"], ERR("--checkpoint-time")),
    ("run-restart-1e9", [*RUN, "--restart-time", "1e9s"], ERR("--restart-time of 1e+09 s")),
    ("run-restart-1e10", [*RUN, "--restart-time", "1e10s"], ERR("--restart-time '1e10s'")),
    ("run-restart-word", [*RUN, "--restart-time", "soon"], ERR("--restart-time 'soon'")),
    ("run-restart-empty", [*RUN, "--restart-time", ""], ERR("--restart-time is empty")),
    ("run-gpu-mtbf-bare", [*RUN, "--gpu-mtbf", "2000"], ERR("min or h, e.g. '50000h'")),
    ("run-gpu-mtbf-0", [*RUN, "--gpu-mtbf", "0h"], ERR("--gpu-mtbf '0h'")),
    ("run-gpu-mtbf-huge", [*RUN, "--gpu-mtbf", "1e400h"], ERR("--gpu-mtbf '1e400h'")),
    ("run-gpu-mtbf-empty", [*RUN, "--gpu-mtbf", ""], ERR("--gpu-mtbf is empty")),
    ("run-node-mtbf-bare", [*RUN, "--node-mtbf", "2000"], ERR("--node-mtbf '2000'")),
    ("run-mtbf-none-none", [*RUN, "--gpu-mtbf", "none", "--node-mtbf", "none"],
     ERR("both 'none'")),
    ("run-tokens-empty", [*RUN, "--tokens", ""], ERR("--tokens ''")),
    ("run-tokens-0", [*RUN, "--tokens", "0"], ERR("--tokens '0'")),
    ("run-tokens-word", [*RUN, "--tokens", "5X"], ERR("--tokens '5X'")),
    ("run-tokens-inf", [*RUN, "--tokens", "1e400"], ERR("--tokens '1e400'")),
    ("run-replications-0", [*RUN, "--replications", "0"], ERR("--replications = 0")),
    ("run-search-2", [*RUN, "--search-points", "2"], ERR("--search-points = 2")),
    ("run-search-10001", [*RUN, "--search-points", "10001"], ERR("--search-points = 10001")),
    ("run-repeats-0", [*RUN, "--repeats", "0"], ERR("--repeats = 0")),
    ("run-repeats-10001", [*RUN, "--repeats", "10001"], ERR("--repeats = 10001")),
    ("run-seed-neg", [*RUN, "--seed", "-1"], ERR("--seed = -1")),
    ("run-jitter-2", [*RUN, "--jitter-cv", "2"], ERR("--jitter-cv = 2")),
    ("run-algo-all", [*RUN, "--algo", "all"], ERR("--algo all")),
    ("run-logit-0", [*RUN, "--logit-bytes", "0"], ERR("--logit-bytes = 0")),
    ("run-no-fit", [*RUN, "--model", "llama-65b"], ERR("GiB per GPU")),
    ("run-accum-steps-alias", [*RUN, "--accum-steps", "0"], ERR("--accum = 0")),
    ("run-runtime-empty", [*RUN, "--runtime", ""], ERR("--runtime is empty")),
    # --- simulate / compare / memory --------------------------------------------------------
    ("sim-runtime-empty", [*SIM, "--runtime", ""], ERR("--runtime is empty")),
    ("sim-runtime-blank", [*SIM, "--runtime", "  "], ERR("--runtime is empty")),
    ("sim-ds-empty", [*SIM, "--deepspeed-config", ""], ERR("--deepspeed-config is empty")),
    ("sim-trace-empty", ["simulate", "--trace", ""], ERR("--trace is empty")),
    ("sim-plot-empty", [*SIM, "--plot", ""], ERR("--plot is empty")),
    ("sim-jobs-empty", ["simulate", "--jobs", ""], ERR("--jobs is empty")),
    ("sim-link-timeline-empty", ["simulate", "--link-timeline", ""],
     ERR("--link-timeline is empty")),
    ("sim-strategy-empty", [*SIM, "--strategy", ""], ERR("--strategy is empty")),
    ("sim-memory-model-empty", [*SIM, "--memory-model", ""], ERR("--memory-model")),
    ("sim-gpu-memory-empty", [*SIM, "--gpu-memory", ""], ERR("--gpu-memory is empty")),
    ("sim-pp-schedule-empty", [*SIM, "--pp", "2", "--pp-schedule", ""], ERR("--pp-schedule")),
    ("sim-tp-algo-empty", [*SIM, "--tp", "2", "--tp-algo", ""], ERR("--tp-algo")),
    ("sim-logit-0", [*SIM, "--logit-bytes", "0"], ERR("--logit-bytes = 0 must be")),
    ("sim-logit-17", [*SIM, "--logit-bytes", "17"], ERR("--logit-bytes = 17")),
    ("sim-virtual-0", [*SIM, "--pp", "2", "--pp-schedule", "interleaved",
                       "--virtual-stages", "0"], ERR("--virtual-stages = 0")),
    ("sim-virtual-1-interleaved", [*SIM, "--pp", "2", "--pp-schedule", "interleaved",
                                   "--virtual-stages", "1"], ERR("--virtual-stages 1")),
    ("sim-virtual-3-1f1b", [*SIM, "--pp", "2", "--virtual-stages", "3"],
     ERR("--virtual-stages 3 needs --pp-schedule interleaved")),
    ("sim-group-nodes-3", [*SIM, "--group-nodes", "3"], ERR("--group-nodes = 3")),
    ("sim-seq-word", [*SIM, "--seq-len", "4x"], ERR("'4x' is not a token count")),
    ("sim-seq-4k-ok", [*SIM, *SMALL, "--seq-len", "4k"], OK()),
    ("sim-gpu-mem-lower-ok", [*SIM, *SMALL, "--gpu-memory", "40gb"], OK()),
    ("sim-gpu-mem-gib-lower-ok", [*SIM, *SMALL, "--gpu-memory", "64gib"], OK()),
    ("sim-gpu-mem-bits-word", [*SIM, "--gpu-memory", "40gbit"], ERR("--gpu-memory '40gbit'")),
    ("sim-repeats-20000", ["simulate", "--repeats", "20000", "--jitter-cv", "0.05"],
     ERR("--repeats 20000")),
    ("sim-name-list", [*SIM, "--cluster", "{d}/name_list.yaml"], ERR("name = ['a', 'b']")),
    ("sim-name-empty", [*SIM, "--cluster", "{d}/name_empty.yaml"], ERR("name is empty")),
    ("sim-name-map", [*SIM, "--cluster", "{d}/name_map.yaml"], ERR("name = {'a': 1}")),
    ("sim-name-bool", [*SIM, "--cluster", "{d}/name_bool.yaml"], ERR("name = True")),
    ("sim-name-number-ok", [*SIM, *SMALL, "--cluster", "{d}/name_num.yaml"], OK()),
    ("sim-rt-empty-name", [*SIM, "--strategy", "NGG", "--runtime", "{d}/rt_empty_name.yaml"],
     ERR("name is empty")),
    ("sim-rt-blank-name", [*SIM, "--strategy", "NGG", "--runtime", "{d}/rt_blank_name.yaml"],
     ERR("name is empty")),
    ("sim-rt-list-name", [*SIM, "--strategy", "NGG", "--runtime", "{d}/rt_list_name.yaml"],
     ERR("name = ['x']")),
    ("sim-model-empty-name", [*SIM, "--model", "{d}/model_empty_name.yaml"],
     ERR("name is empty")),
    ("memory-efficiency-not-offered", ["memory", "--efficiency", "0.3"],
     ERR("--efficiency")),
    ("memory-nic-bw-not-offered", ["memory", "--nic-bandwidth", "200Gbps"],
     ERR("--nic-bandwidth")),
    ("memory-compute-model-not-offered", ["memory", "--compute-model", "kernel"],
     ERR("--compute-model")),
    ("memory-strategy-blank", ["memory", "--strategy", " "], ERR("--strategy is empty")),
    ("compare-workers-0", ["compare", *A, "--workers", "0"], ERR("--workers = 0")),
    ("compare-algo-bad", ["compare", *A, "--algo", "ring,foo"], ERR("--algo 'foo'")),
    ("compare-runtime-empty", ["compare", *A, "--runtime", ""], ERR("--runtime is empty")),
    # --- overrides --------------------------------------------------------------------------
    ("ov-speed-word", [*SIM, "--cluster", "{d}/ov_speed_word.yaml"], ERR("overrides[0]")),
    ("ov-speed-neg", [*SIM, "--cluster", "{d}/ov_speed_neg.yaml"], ERR("speed = -1")),
    ("ov-speed-3", [*SIM, "--cluster", "{d}/ov_speed_3.yaml"], ERR("speed = 3")),
    ("ov-speed-nan", [*SIM, "--cluster", "{d}/ov_speed_nan.yaml"], ERR("speed")),
    ("ov-gpu-out", [*SIM, "--cluster", "{d}/ov_gpu_out.yaml"], ERR("n9/gpu0")),
    ("ov-gpu-idx-out", [*SIM, "--cluster", "{d}/ov_gpu_idx_out.yaml"], ERR("n0/gpu8")),
    ("ov-node-out", [*SIM, "--cluster", "{d}/ov_node_out.yaml"], ERR("node 9")),
    ("ov-node-neg", [*SIM, "--cluster", "{d}/ov_node_neg.yaml"], ERR("overrides[0]")),
    ("ov-unknown-key", [*SIM, "--cluster", "{d}/ov_unknown_key.yaml"], ERR("colour")),
    ("ov-no-target", [*SIM, "--cluster", "{d}/ov_no_target.yaml"], ERR("overrides[0]")),
    ("ov-not-map", [*SIM, "--cluster", "{d}/ov_not_map.yaml"], ERR("overrides[0]")),
    ("ov-not-list", [*SIM, "--cluster", "{d}/ov_not_list.yaml"], ERR("overrides")),
    ("ov-link-missing", ["simulate", "--cluster", "{d}/ov_link_missing.yaml"],
     ERR("overrides[0].links")),
    ("ov-link-bw0", ["simulate", "--cluster", "{d}/ov_link_bw0.yaml"],
     ERR("overrides[0].bandwidth")),
    ("ov-link-bw-neg", ["simulate", "--cluster", "{d}/ov_link_bw_neg.yaml"],
     ERR("overrides[0].bandwidth")),
    ("ov-link-bw-inf", ["simulate", "--cluster", "{d}/ov_link_bw_inf.yaml"],
     ERR("overrides[0].bandwidth")),
    ("ov-link-bw-empty", ["simulate", "--cluster", "{d}/ov_link_bw_empty.yaml"],
     ERR("overrides[0].bandwidth")),
    ("ov-link-lat-neg", ["simulate", "--cluster", "{d}/ov_link_lat_neg.yaml"],
     ERR("overrides[0].latency")),
    ("ov-link-lat-bare", ["simulate", "--cluster", "{d}/ov_link_lat_bare.yaml"],
     ERR("overrides[0].latency = 5 has no unit")),
    ("ov-failed-word", ["simulate", "--cluster", "{d}/ov_failed_word.yaml"],
     ERR("overrides[0].failed = 'maybe'")),
    ("ov-nic-bw0", ["simulate", "--cluster", "{d}/ov_nic_bw0.yaml"],
     ERR("overrides[0].nic.bandwidth")),
    ("ov-nic-bw-inf", ["simulate", "--cluster", "{d}/ov_nic_bw_inf.yaml"],
     ERR("overrides[0].nic.bandwidth")),
    ("ov-gpu-mem0", ["simulate", "--cluster", "{d}/ov_gpu_mem0.yaml"],
     ERR("overrides[0].gpu.memory")),
    ("ov-gpu-mem-empty", ["simulate", "--cluster", "{d}/ov_gpu_mem_empty.yaml"],
     ERR("overrides[0].gpu.memory")),
    ("ov-gpu-unknown", ["simulate", "--cluster", "{d}/ov_gpu_unknown.yaml"],
     ERR("overrides[0].gpu.model 'B300-SXM'")),
    ("ov-gpu-tflops0", ["simulate", "--cluster", "{d}/ov_gpu_tflops0.yaml"],
     ERR("overrides[0].gpu.peak_tflops")),
    ("ov-analytic-refused", [*SIM, "--cluster", "{d}/ov_straggler.yaml"],
     ERR("expected --mode engine")),
    # --- jobs -------------------------------------------------------------------------------
    ("jobs-ok", [*JOBS, "{d}/jobs_ok.yaml"], OK()),
    ("jobs-alias-ok", [*JOBS, "{d}/jobs_alias.yaml"], OK()),
    ("jobs-both-accum", [*JOBS, "{d}/jobs_both_accum.yaml"],
     ERR("accum_steps and accum are the same setting")),
    ("jobs-both-eff", [*JOBS, "{d}/jobs_both_eff.yaml"],
     ERR("compute_efficiency and efficiency")),
    ("jobs-accum0", [*JOBS, "{d}/jobs_accum0.yaml"], ERR("accum = 0")),
    ("jobs-eff2", [*JOBS, "{d}/jobs_eff2.yaml"], ERR("efficiency = 2")),
    ("jobs-ceff0", [*JOBS, "{d}/jobs_ceff0.yaml"], ERR("efficiency = 0")),
    ("jobs-mb0", [*JOBS, "{d}/jobs_mb0.yaml"], ERR("micro_batch = 0")),
    ("jobs-seq-word", [*JOBS, "{d}/jobs_seq_word.yaml"], ERR("seq_len = 'long'")),
    ("jobs-recompute", [*JOBS, "{d}/jobs_recompute.yaml"], ERR("recompute = 'maybe'")),
    ("jobs-tp0", [*JOBS, "{d}/jobs_tp0.yaml"], ERR("tp = 0")),
    ("jobs-nodes-empty", [*JOBS, "{d}/jobs_nodes_empty.yaml"], ERR("nodes = []")),
    ("jobs-node-out", [*JOBS, "{d}/jobs_node_out.yaml"], ERR("9")),
    ("jobs-overlap", [*JOBS, "{d}/jobs_overlap.yaml"], ERR("node 1")),
    ("jobs-dup-name", [*JOBS, "{d}/jobs_dup_name.yaml"], ERR("job name 'a' appears twice")),
    ("jobs-strategy", [*JOBS, "{d}/jobs_strategy.yaml"], ERR("'XYZ'")),
    ("jobs-runtime", [*JOBS, "{d}/jobs_runtime.yaml"], ERR("'nope'")),
    ("jobs-algo", [*JOBS, "{d}/jobs_algo.yaml"], ERR("algo")),
    ("jobs-model", [*JOBS, "{d}/jobs_model.yaml"], ERR("'gpt-9'")),
    ("jobs-key", [*JOBS, "{d}/jobs_key.yaml"], ERR("colour")),
    ("jobs-steps0", [*JOBS, "{d}/jobs_steps0.yaml"], ERR("steps = 0")),
    ("jobs-no-cluster", [*JOBS, "{d}/jobs_no_cluster.yaml"], ERR("'cluster'")),
    ("jobs-nic0", [*JOBS, "{d}/jobs_nic0.yaml"], ERR("nic_bandwidth '0Gbps'")),
    ("jobs-gpumem-empty", [*JOBS, "{d}/jobs_gpumem_empty.yaml"], ERR("gpu_memory is empty")),
    ("jobs-empty-list", [*JOBS, "{d}/jobs_empty_list.yaml"], ERR("'jobs'")),
    ("jobs-not-list", [*JOBS, "{d}/jobs_not_list.yaml"], ERR("'jobs'")),
    ("jobs-fp8-a100", [*JOBS, "{d}/jobs_fp8.yaml"], ERR("fp8")),
    ("jobs-sched", [*JOBS, "{d}/jobs_sched.yaml"], ERR("'zigzag'")),
    ("jobs-straggler", [*JOBS, "{d}/jobs_straggler.yaml"], ERR("overrides[0]")),
    ("jobs-mode-refused", [*JOBS, "{d}/jobs_ok.yaml", "--mode", "analytic"],
     ERR("--mode cannot be combined with --jobs")),
    # --- DeepSpeed configs ------------------------------------------------------------------
    ("ds-list", [*DS, "{d}/ds_list.json"], ERR("ds_list.json")),
    ("ds-bad-json", [*DS, "{d}/ds_bad.json"], ERR("ds_bad.json")),
    ("ds-stage4", [*DS, "{d}/ds_stage4.json"], ERR("stage")),
    ("ds-stage-word", [*DS, "{d}/ds_stage_word.json"], ERR("stage")),
    ("ds-stage-neg", [*DS, "{d}/ds_stage_neg.json"], ERR("stage")),
    ("ds-tb0", [*DS, "{d}/ds_tb0.json"], ERR("train_batch_size = 0")),
    ("ds-tb-neg", [*DS, "{d}/ds_tb_neg.json"], ERR("train_batch_size = -32")),
    ("ds-tb-word", [*DS, "{d}/ds_tb_word.json"], ERR("train_batch_size")),
    ("ds-tb-frac", [*DS, "{d}/ds_tb_frac.json"], ERR("train_batch_size")),
    ("ds-tb-odd", [*DS, "{d}/ds_tb_odd.json"], ERR("train_batch_size")),
    ("ds-gas-word", [*DS, "{d}/ds_gas_word.json"], ERR("gradient_accumulation_steps")),
    ("ds-bucket-neg", [*DS, "{d}/ds_bucket_neg.json"], ERR("reduce_bucket_size")),
    ("ds-bucket-word", [*DS, "{d}/ds_bucket_word.json"], ERR("reduce_bucket_size")),
    ("ds-overlap-word", [*DS, "{d}/ds_overlap_word.json"], ERR("overlap_comm")),
    ("ds-offload-tape", [*DS, "{d}/ds_offload_tape.json"], ERR("offload_optimizer")),
    ("ds-nan-nested", [*DS, "{d}/ds_nan_nested.json"], ERR("NaN")),
    ("ds-flag-disagrees", [*DS, "{d}/ds_ok.json", "--micro-batch", "4"],
     ERR("--micro-batch 4")),
    ("ds-ok", [*DS, "{d}/ds_ok.json"], OK()),
    # --- calibrate --------------------------------------------------------------------------
    ("cal-extra-cell", [*CAL, "{d}/st_extra.csv"], ERR("has 8 cells and the header 7")),
    ("cal-short-row", [*CAL, "{d}/st_short.csv"], ERR("has 6 cells and the header 7")),
    ("cal-dup-column", [*CAL, "{d}/st_dup.csv"], ERR("nodes appear twice")),
    ("cal-step-1e-300", [*CAL, "{d}/st_tiny.csv"], ERR("step_time_s = '1e-300'")),
    ("cal-step-1e10", [*CAL, "{d}/st_huge.csv"], ERR("step_time_s = '1e10'")),
    ("cal-step-nan", [*CAL, "{d}/st_nan.csv"], ERR("step_time_s = 'nan'")),
    ("cal-step-inf", [*CAL, "{d}/st_inf.csv"], ERR("step_time_s = 'inf'")),
    ("cal-step-neg", [*CAL, "{d}/st_neg.csv"], ERR("step_time_s = '-4'")),
    ("cal-step-word", [*CAL, "{d}/st_word.csv"], ERR("step_time_s = 'slow'")),
    ("cal-nodes-0", [*CAL, "{d}/st_nodes0.csv"], ERR("nodes = '0'")),
    ("cal-mb-word", [*CAL, "{d}/st_mb_word.csv"], ERR("micro_batch = 'x'")),
    ("cal-unknown-col", [*CAL, "{d}/st_unknown_col.csv"], ERR("unknown column(s) colour")),
    ("cal-missing-col", [*CAL, "{d}/st_missing_col.csv"], ERR("missing column(s)")),
    ("cal-header-only", [*CAL, "{d}/st_header_only.csv"], ERR("has a header but no rows")),
    ("cal-empty", [*CAL, "{d}/st_empty.csv"], ERR("is empty")),
    ("cal-recompute", [*CAL, "{d}/st_recompute.csv"], ERR("recompute = 'maybe'")),
    ("cal-sp", [*CAL, "{d}/st_sp.csv"], ERR("sequence_parallel = 'maybe'")),
    ("cal-tp0", [*CAL, "{d}/st_tp0.csv"], ERR("tp = '0'")),
    ("cal-steps-empty", ["calibrate", "--cluster", "aws-p4de", "-o", "{d}/o.yaml", "--steps",
                         ""], ERR("--steps is empty")),
    ("cal-nccl-empty", ["calibrate", "--cluster", "aws-p4de", "-o", "{d}/o.yaml",
                        "--nccl-tests", ""], ERR("--nccl-tests/--compare is empty")),
    ("cal-output-empty", ["calibrate", "--cluster", "aws-p4de", "-o", "", "--nccl-tests",
                          str(P4DE_LOG)], ERR("-o/--output is empty")),
    ("cal-holdout-bad", [*NCCL, "--holdout", "foo"], ERR("--holdout 'foo'")),
    ("cal-params-bad", [*NCCL, "--params", "foo.bar"], ERR("--params")),
    ("cal-min-size-word", [*NCCL, "--min-size", "abc"], ERR("--min-size 'abc'")),
    ("cal-nodes-3", [*NCCL, "--nodes", "3"], ERR("16 ranks")),
    ("cal-algo-bad", [*NCCL, "--algo", "foo"], ERR("--algo 'foo'")),
    ("cal-log-text", ["calibrate", "--cluster", "aws-p4de", "-o", "{d}/o.yaml",
                      "--nccl-tests", "{d}/log_text.txt"], ERR("log_text.txt")),
    ("cal-compare-alias-text", ["calibrate", "--cluster", "aws-p4de", "-o", "{d}/o.yaml",
                                "--compare", "{d}/log_text.txt"], ERR("log_text.txt")),
    # --- collective --compare ---------------------------------------------------------------
    ("cmp-empty-log", ["collective", "--compare", "{d}/log_empty.txt", "--cluster",
                       "aws-p4de"], ERR("log_empty.txt")),
    ("cmp-text-log", ["collective", "--compare", "{d}/log_text.txt", "--cluster", "aws-p4de"],
     ERR("log_text.txt")),
    ("cmp-nan-log", ["collective", "--compare", "{d}/log_nan.txt", "--cluster", "aws-p4de"],
     ERR("log_nan.txt")),
    ("cmp-missing-log", ["collective", "--compare", "{d}/nope.txt"], ERR("nope.txt")),
    ("cmp-empty-arg", ["collective", "--compare", ""], ERR("--compare/--nccl-tests is empty")),
    ("cmp-nccl-tests-alias-empty", ["collective", "--nccl-tests", ""],
     ERR("--compare/--nccl-tests is empty")),
    ("cmp-b-empty", ["collective", "-b", ""], ERR("-b/--minbytes is empty")),
    ("cmp-e-empty", ["collective", "-e", ""], ERR("-e/--maxbytes is empty")),
    ("cmp-f-empty", ["collective", "-b", "8", "-e", "64", "-f", ""],
     ERR("-f/--stepfactor is empty")),
    ("cmp-in-place-alone", ["collective", "--in-place"], ERR("--in-place")),
    ("cmp-ok", ["collective", "--compare", str(P4DE_LOG), "--cluster", "aws-p4de"], OK()),
    ("cmp-alias-ok", ["collective", "--nccl-tests", str(P4DE_LOG), "--cluster", "aws-p4de"],
     OK()),
]


@pytest.fixture(scope="module")
def d(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("robust4")
    _write_files(root)
    return root


def test_at_least_150_cases_with_unique_names():
    names = [c[0] for c in CASES]
    assert len(names) == len(set(names))
    assert len(names) >= 150


@pytest.mark.parametrize("name,argv,expect", CASES, ids=[c[0] for c in CASES])
def test_case(name, argv, expect, d, capsys):
    argv = [a.replace("{d}", str(d)) for a in argv]
    kind, needle = expect
    if kind == "ok" and "--json" not in argv and argv[0] in ("simulate", "advise",
                                                             "collective", "run"):
        argv = [*argv, "--json"]
    rc, out, err = run_case(argv, capsys)
    if kind == "ok":
        assert "Traceback" not in err + out
        assert rc == 0, f"{name}: expected success, got rc {rc}: {err}"
        if "--json" in argv:
            assert "NaN" not in out and "Infinity" not in out
            json.loads(out)
        return
    check_err(rc, out, err, needle)


# --- wrong answers: hand values --------------------------------------------------------------

def test_dp_of_tp2_pp2_cp2_on_16_gpus_is_2(capsys):
    r = run_json(["simulate", *A, "--nodes", "2", "--tp", "2", "--pp", "2", "--cp", "2"],
                 capsys)
    # 16 GPUs / (tp 2 x pp 2 x cp 2) = 2
    assert (r["tp"], r["pp"], r["cp"], r["dp"]) == (2, 2, 2, 2)
    assert r["settings"]["data_parallel"] == 2
    assert r["settings"]["global_batch_seqs"] == 4 * 10 * 2


@pytest.fixture(scope="module")
def jobs_3d(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("jobs3d") / "j.yaml"
    p.write_text("cluster: paper-a100-roce\nnodes: 2\nsteps: 1\njobs:\n"
                 "  - {name: a, model: llama-13b, strategy: NNN, tp: 2, pp: 2, micro_batch: 8,"
                 " accum: 4, fidelity: paper, nodes: [0, 1]}\n")
    return p


def test_a_job_alone_recomputes_and_takes_what_simulate_takes(jobs_3d, capsys):
    """Micro-batch 8 of LLaMA-13B with tp 2 x pp 2 needs full recomputation with the ideal
    runtime's eager attention (simulate says so); the job, alone on the same nodes, must
    resolve recomputation the same way and take the same time."""
    sim = run_json(["simulate", "--model", "llama-13b", "--strategy", "NNN", "--tp", "2",
                    "--pp", "2", "--micro-batch", "8", "--accum", "4", "--nodes", "2",
                    "--fidelity", "paper"], capsys)   # the job's fidelity
    assert sim["recompute_mode"] == "full"
    jobs = run_json(["simulate", "--jobs", str(jobs_3d)], capsys)
    a = jobs["jobs"][0]
    assert a["settings"]["recompute"] is True
    assert a["step_time_alone_s"] == pytest.approx(sim["step_time_s"], rel=1e-9)
    # without the key the job runs simulate's default fidelity, and again takes its step
    sim = run_json(["simulate", "--model", "llama-13b", "--strategy", "NNN", "--tp", "2",
                    "--pp", "2", "--micro-batch", "8", "--accum", "4", "--nodes", "2"], capsys)
    unpinned = jobs_3d.with_name("j_default.yaml")
    unpinned.write_text(jobs_3d.read_text().replace("fidelity: paper, ", ""))
    a = run_json(["simulate", "--jobs", str(unpinned)], capsys)["jobs"][0]
    assert a["settings"]["recompute"] is (sim["recompute_mode"] == "full")
    assert a["step_time_alone_s"] == pytest.approx(sim["step_time_s"], rel=1e-9)


def test_jobs_text_names_settings_as_simulate(jobs_3d, capsys):
    rc, out, err = run_case(["simulate", "--jobs", str(jobs_3d)], capsys)
    assert rc == 0, err
    line = next(ln for ln in out.splitlines() if ln.startswith("settings of a:"))
    assert "accum 4" in line and "efficiency 0.5" in line
    assert "accum-steps" not in line and "compute-efficiency" not in line


def test_jobs_alias_keys_give_the_same_jobs(d, capsys):
    a = run_json(["simulate", "--jobs", str(d / "jobs_canonical.yaml")], capsys)
    b = run_json(["simulate", "--jobs", str(d / "jobs_alias.yaml")], capsys)
    assert a["jobs"][0]["step_time_alone_s"] == b["jobs"][0]["step_time_alone_s"]
    assert a["jobs"][0]["settings"] == b["jobs"][0]["settings"]


def test_run_search_points_and_checkpoint_interval_of_whole_steps(capsys):
    base = ["run", *A, "--nodes", "1", "--replications", "4", "--search-points", "3"]
    # a long run: Young's interval / 4, x 1 and x 4 are three distinct whole-step intervals
    r = run_json([*base, "--tokens", "100B"], capsys)
    young_k = r["young_interval_s"] / r["step_time_s"]
    assert [s["interval_steps"] for s in r["searched"]] == [
        round(young_k / 4), round(young_k), round(young_k * 4)]
    # a run shorter than Young's interval x 4: the longer candidates are the whole run,
    # searched once, and the text says so
    short = run_json([*base, "--tokens", "1B"], capsys)
    ks = [s["interval_steps"] for s in short["searched"]]
    assert len(ks) == 2 and ks[-1] == short["steps"]
    rc, out, err = run_case([*base, "--tokens", "1B"], capsys)
    assert rc == 0 and "searched                  2 distinct whole-step intervals" in out
    assert "the longer candidates are the whole run" in out
    # an interval of 2.4 steps is rounded to 2 whole steps (a checkpoint between steps)
    step = short["step_time_s"]
    r2 = run_json([*base, "--tokens", "1B", "--checkpoint-interval", f"{2.4 * step!r}s"],
                  capsys)
    assert r2["at_interval"]["interval_steps"] == 2
    assert r2["at_interval"]["interval_s"] == pytest.approx(2 * step, rel=1e-12)


def test_advise_prints_gib_everywhere(capsys):
    rc, out, err = run_case(ADV, capsys)
    assert rc == 0, err
    assert "mem GiB" in out and "GiB" in out
    assert " GB" not in out.replace("GiB", "")


# --- one spelling, both spellings, defaults ------------------------------------------------

def test_accum_steps_and_compute_efficiency_are_aliases(capsys):
    base = ["simulate", *A, "--nodes", "1"]
    a = run_json([*base, "--accum", "3", "--efficiency", "0.4"], capsys)
    b = run_json([*base, "--accum-steps", "3", "--compute-efficiency", "0.4"], capsys)
    assert a == b and a["settings"]["accum_steps"] == 3
    assert a["settings"]["compute_efficiency"] == 0.4


def test_compare_and_nccl_tests_are_both_spellings_in_both_commands(capsys):
    a = run_json(["collective", "--compare", str(P4DE_LOG), "--cluster", "aws-p4de"], capsys)
    b = run_json(["collective", "--nccl-tests", str(P4DE_LOG), "--cluster", "aws-p4de"],
                 capsys)
    assert a == b
    p = build_parser("calibrate")
    for flag in ("--nccl-tests", "--compare"):
        ns = p.parse_args(["calibrate", flag, "x.txt", "--cluster", "c", "-o", "o.yaml"])
        assert ns.nccl_tests == ["x.txt"]


def test_advise_defaults_are_every_commands_defaults():
    p = build_parser()
    sim = p.parse_args(["simulate"])
    adv = p.parse_args(["advise", "--global-batch", "64"])
    assert (adv.cluster, adv.seq_len, adv.model) == (sim.cluster, sim.seq_len, sim.model)


def test_sizes_take_units_in_any_case_and_seq_len_takes_k(capsys):
    base = ["simulate", *A, *SMALL]
    a = run_json([*base, "--gpu-memory", "40gb"], capsys)
    b = run_json([*base, "--gpu-memory", "40 GB"], capsys)
    assert a["settings"]["gpu_memory_bytes"] == b["settings"]["gpu_memory_bytes"] == 40 * 10**9
    c = run_json([*base, "--seq-len", "4k"], capsys)
    e = run_json([*base, "--seq-len", "4096"], capsys)
    assert c["settings"]["seq_len"] == 4096 and c == e


def test_help_of_advise_calibrate_run_validate_has_examples_that_parse():
    for cmd in ("advise", "calibrate", "run", "validate"):
        text = EXAMPLES[cmd]
        assert text.startswith("examples:")
        lines = [ln.split("#")[0].split() for ln in text.splitlines()[1:]]
        assert lines
        p = build_parser(cmd)
        for argv in lines:
            assert argv[0] == "parosim" and argv[1] == cmd
            p.parse_args(argv[1:])     # every example parses (SystemExit otherwise)
        buf = io.StringIO()
        with redirect_stdout(buf), pytest.raises(SystemExit):
            p.parse_args([cmd, "--help"])
        assert "examples:" in buf.getvalue()


def test_the_run_example_runs(capsys):
    argv = EXAMPLES["run"].splitlines()[1].split()[1:]
    rc, out, err = run_case(argv, capsys, timeout=180)
    assert rc == 0, err and "goodput" in out


def test_memory_offers_only_flags_that_change_memory():
    p = build_parser("memory")
    sub = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction))
    flags = {o for a in sub.choices["memory"]._actions for o in a.option_strings}
    for gone in ("--efficiency", "--overlap-slowdown", "--compute-model", "--nic-bandwidth",
                 "--intra-bandwidth", "--tp-algo", "--dp-comm-overlap"):
        assert gone not in flags
    for kept in ("--micro-batch", "--seq-len", "--gpu-memory", "--tp", "--recompute",
                 "--tp-comm-overlap", "--runtime", "--precision"):
        assert kept in flags


def test_calibrate_table_prints_units_not_raw_floats():
    from parosim.cli.calibrate import param_text, print_result

    assert param_text("nic.bandwidth", 12.5e9) == "100 Gbps"
    assert param_text("intra_node.latency", 7.0e-6) == "7 us"
    assert param_text("collective.call_overhead", 2.844e-8) == "0.02844 us"
    res = {"mode": "nccl-tests", "cluster": "c", "base": "b", "algo": "nccl", "output": "o",
           "params": {"nic.bandwidth": 11649727108.07, "nic.latency": 2.52e-05},
           "identified": {"nic.bandwidth": True, "nic.latency": True},
           "fit": {"n": 0}, "held_out": {"n": 0}, "holdout": "none"}
    buf = io.StringIO()
    with redirect_stdout(buf):
        print_result(res)
    text = buf.getvalue()
    assert "93.2 Gbps" in text and "25.2 us" in text and "e-05" not in text \
        and "e+10" not in text


def test_dev_extra_has_nbconvert():
    text = (ROOT / "pyproject.toml").read_text()
    dev = text.split("dev = [", 1)[1].split("]", 1)[0]
    assert "nbconvert" in dev


# --- invariants -----------------------------------------------------------------------------

STRATS = ["NNN", "NIG", "IIG", "GGG", "III", "NGG"]


@pytest.mark.parametrize("strategy", STRATS)
@pytest.mark.parametrize("algo", ["ring", "ho-ring"])
def test_more_nic_bandwidth_is_never_slower(strategy, algo, capsys):
    steps = []
    for bw in ("25Gbps", "100Gbps", "400Gbps", "1600Gbps"):
        r = run_json(["simulate", *A, "--model", "mpt-1b", "--strategy", strategy, "--algo",
                      algo, "--nic-bandwidth", bw, "--accum", "2"], capsys)
        steps.append(r["step_time_s"])
    assert all(b <= a * (1 + 1e-12) for a, b in zip(steps, steps[1:], strict=False)), steps


@pytest.mark.parametrize("op", ["all-gather", "reduce-scatter", "all-reduce"])
@pytest.mark.parametrize("algo", ["ring", "hierarchical", "ho-ring", "nccl"])
def test_more_bandwidth_never_slows_a_collective(op, algo, tmp_path, capsys):
    times = []
    for nic, intra in (("50Gbps", "1000Gbps"), ("200Gbps", "1000Gbps"),
                       ("200Gbps", "4000Gbps"), ("800Gbps", "4000Gbps")):
        p = tmp_path / f"c{nic}{intra}.yaml"
        p.write_text(CL.replace("bandwidth: 100Gbps", f"bandwidth: {nic}")
                     .replace("bandwidth: 2000Gbps", f"bandwidth: {intra}"))
        r = run_json(["collective", "--op", op, "--size", "256MiB", "--algo", algo,
                      "--cluster", str(p)], capsys)
        times.append(r["time_s"])
    assert all(b <= a * (1 + 1e-12) for a, b in zip(times, times[1:], strict=False)), times


@pytest.mark.parametrize("strategy", ["NIG", "GGG"])
def test_a_straggler_is_never_faster(strategy, d, capsys):
    base = ["simulate", "--strategy", strategy, "--model", "mpt-125m", "--accum", "1"]
    fast = run_json([*base, "--cluster", str(d / "name_num.yaml")], capsys)
    slow = run_json([*base, "--cluster", str(d / "ov_straggler.yaml")], capsys)
    assert slow["step_time_s"] >= fast["step_time_s"]
    assert slow["step_time_s"] > fast["step_time_s"] * 1.01   # 0.8x compute shows


@pytest.mark.parametrize("model,nodes,mb,seq", [
    ("mpt-125m", 1, 1, 128), ("llama-7b", 4, 4, 512), ("mpt-1b", 16, 16, 4096)])
def test_mfu_is_a_fraction_in_every_strategy(model, nodes, mb, seq, capsys):
    r = run_json(["compare", *A, "--model", model, "--nodes", str(nodes), "--micro-batch",
                  str(mb), "--seq-len", str(seq), "--accum", "2", "--workers", "1"], capsys)
    rows = r["results"] if isinstance(r, dict) and "results" in r else r
    seen = 0
    for row in rows:
        if row.get("fits") and row.get("mfu") is not None:
            assert 0.0 < row["mfu"] <= 1.0, row
            assert math.isfinite(row["step_time_s"]) and row["step_time_s"] > 0
            seen += 1
    assert seen >= 1


@pytest.mark.parametrize("argv", [
    ["simulate", *A, "--model", "llama-13b", "--strategy", "IIG"],
    ["simulate", "--model", "mpt-125m", "--nodes", "1", "--accum", "1"],
    ["simulate", "--model", "mpt-125m", "--nodes", "2", "--accum", "1", "--jitter-cv", "0.1",
     "--repeats", "5"],
    ["compare", *A, "--model", "mpt-1b", "--nodes", "2", "--workers", "1"],
    ["memory", "--model", "llama-65b"],
    ["collective", "--op", "all-reduce", "-b", "8", "-e", "1M", "--algo", "nccl"],
    ["run", *A, "--nodes", "1", "--tokens", "1B", "--replications", "4"],
    ["simulate", *A, "--nodes", "2", "--tp", "2", "--pp", "2", "--cp", "2"],
], ids=["simulate", "engine", "jitter", "compare", "memory", "collective", "run", "3d"])
def test_the_same_command_twice_gives_byte_identical_json(argv, capsys):
    outs = []
    for _ in range(2):
        rc, out, err = run_case([*argv, "--json"], capsys)
        assert rc == 0, err
        outs.append(out)
    assert outs[0] == outs[1]
    assert "NaN" not in outs[0] and "Infinity" not in outs[0]


def test_advise_twice_is_identical_but_its_own_wall_time(capsys):
    outs = []
    for _ in range(2):
        r = run_json(ADV, capsys)
        r.pop("wall_s")
        outs.append(json.dumps(r, sort_keys=True))
    assert outs[0] == outs[1]
