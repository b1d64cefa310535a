"""Never ignore an input, probed flag by flag: every optional flag of every command with
``--json`` (read from :func:`parosim.cli.parser.build_parser`, so a new flag is covered the
day it is added) is given one legal non-default value on a small baseline, and the command
must either refuse it (exit 2, one ``parosim: error:`` line naming the flag) or return a JSON
that differs from the baseline's in something other than the ``settings`` echo, wall-time
fields and the echo of the flag itself. A flag with no entry in :data:`TABLE` fails the test:
a new flag is added here deliberately, with the outcome it must have.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from cli_harness import run_case

from parosim.cli.commands import COMMANDS
from parosim.cli.parser import build_parser

ROOT = Path(__file__).resolve().parents[1]
NCCL_LOG = str(ROOT / "tests/data/nccl-tests/aws-p4de-2node-all_reduce.txt")
NCCL_LOG_1NODE = str(ROOT / "tests/data/nccl-tests/abci-a-1node-all_reduce.txt")
STEPS_CSV = str(ROOT / "experiments/09_calibrate_steps/runs_example.csv")

# Keys never compared: the settings echo and the run's own wall time.
NOT_COMPARED = {"settings", "wall_s", "elapsed_s"}


@dataclass(frozen=True)
class P:
    """One probe: ``args`` added to the baseline (``{tmp}`` is the test's temporary
    directory). ``want``: ``diff`` (exit 0, the JSON differs), ``err`` (exit 2, one line
    naming the flag, and ``needle`` where given) or ``file`` (exit 0 and ``{tmp}/out.*`` was
    written). ``with_``: flags the probe needs to have an effect (its prerequisites), added to
    both runs. ``echo``: more output keys that only echo the flag."""

    args: tuple[str, ...]
    want: str = "diff"
    with_: tuple[str, ...] = ()
    needle: str = ""
    echo: tuple[str, ...] = field(default_factory=tuple)


def d(*args, with_=(), echo=()):
    return P(tuple(args), "diff", tuple(with_), "", tuple(echo))


def err(*args, needle="", with_=()):
    return P(tuple(args), "err", tuple(with_), needle)


def f(*args, with_=()):
    return P(tuple(args), "file", tuple(with_))


# The only flags whose TABLE entry may be None (no effect by design where the entry says so;
# a key "COMMAND FLAG" for one command, "FLAG" for all), with the reason. Kept short.
ALLOWED_NIL = {
    "--fidelity": "[moe] a MoE step runs the paper fidelity's models whatever is asked (the "
                  "accurate ones have no MoE form): settings.fidelity says paper either way",
    "--json": "selects the output format the probe reads",
    "--workers": "process count: the same results by contract (bit-identical in parallel)",
    "--no-progress": "the progress bar on stderr only",
    "memory --accum": "memory per GPU does not depend on the accumulation steps (the "
                      "gradient buffer is there either way)",
    "memory --global-batch": "it sets the accumulation steps (see memory --accum)",
    "run --memory-model": "run reports no memory: the model only decides fitting and "
                          "recomputation, which the baseline does not reach",
    "run --logit-bytes": "as run --memory-model",
    "simulate --dp-comm-overlap": "[moe-tp] the closed form always overlaps the distributed "
                                  "optimizer's DP traffic (Megatron-Bridge's published "
                                  "configurations); settings.dp_comm_overlap says true either "
                                  "way",
    "simulate --sequence-parallel": "[moe-tp] in that baseline already (a MoE step with TP "
                                    "needs it)",
    "cluster --group-nodes": "cluster show lists nodes and links, which the PaRO grouping "
                             "does not change; it echoes group_nodes as the cluster's key",
}

# -- baselines ---------------------------------------------------------------------------------
DENSE = ["--model", "mpt-125m", "--nodes", "1", "--seq-len", "512"]
MOE = ["--model", "mixtral-8x7b", "--cluster", "dgx-h100-ib", "--nodes", "2", "--ep", "8",
       "--seq-len", "512", "--micro-batch", "1"]

BASES: dict[str, dict[str, list[str]]] = {
    "simulate": {"dense": ["simulate", *DENSE, "--mode", "analytic"],
                 "moe": ["simulate", *MOE, "--mode", "analytic", "--strategy", "GGG",
                         "--expert-strategy", "GGG"],
                 # the closed form of a MoE step with TP (Megatron-Core's schedule)
                 "moe-tp": ["simulate", *MOE, "--mode", "analytic", "--tp", "2",
                            "--sequence-parallel"]},
    "compare": {"dense": ["compare", *DENSE, "--mode", "analytic"],
                "moe": ["compare", *MOE, "--mode", "analytic", "--expert-strategy", "GGG"]},
    "memory": {"dense": ["memory", *DENSE],
               "moe": ["memory", *MOE, "--expert-strategy", "GGG"]},
    "run": {"dense": ["run", *DENSE, "--mode", "analytic", "--replications", "10",
                      "--search-points", "5", "--tokens", "1T"]},
    "advise": {"dense": ["advise", *DENSE, "--global-batch", "64", "--max-micro-batch", "4",
                         "--engine-top", "0"],
               "moe": ["advise", "--model", "mixtral-8x7b", "--cluster", "dgx-h100-ib",
                       "--nodes", "2", "--seq-len", "512", "--global-batch", "32",
                       "--engine-top", "0", "--max-micro-batch", "1", "--ep", "8",
                       "--expert-strategies", "GGG", "--strategy", "GGG"]},
    "collective": {"dense": ["collective", "--nodes", "2"]},
    "experts": {"moe": ["experts", "--model", "mixtral-8x7b", "--cluster", "dgx-h100-ib",
                        "--nodes", "1", "--ep", "8", "--seq-len", "512"]},
    "model": {"dense": ["model", "--model", "mpt-125m", "--seq-len", "512"]},
    "cluster": {"dense": ["cluster", "show", "paper-a100-roce", "--nodes", "2"]},
    "calibrate": {"dense": ["calibrate", "--nccl-tests", NCCL_LOG, "--cluster", "aws-p4de",
                            "-o", "{tmp}/base.yaml", "--params", "nic.bandwidth",
                            "--min-size", "64M"]},
}
# Commands with --json not probed here, and why.
NOT_PROBED = {
    "validate": "runs torch.distributed ranks in processes (seconds to minutes a run); its "
                "flags are checked in tests/test_validate*.py",
    "sweep": "its flags are a spec path, an output folder, process count, a dask scheduler "
             "address and --fresh; checked in tests/test_sweep*.py",
}

# -- the table: command -> flag -> probe (or {baseline: probe}) ----------------------------------
# a MoE step's default algorithm is HO-Ring (paper fidelity); one node's collectives are the
# same rings whatever the algorithm
ALGO = {"dense": d("--algo", "ho-ring", with_=("--nodes", "2")), "moe": d("--algo", "ring")}
DP_OVERLAP = (err("--dp-comm-overlap"),
              d("--dp-comm-overlap", with_=("--tp", "2", "--strategy", "NNG")))
ENGINE_JITTER = ("--mode", "engine", "--jitter-cv", "0.1", "--repeats", "3")
TRAINING = {
    "--model": {"dense": d("--model", "mpt-350m"), "moe": d("--model", "qwen3-30b-a3b")},
    "--micro-batch": d("--micro-batch", "2"),
    "--accum": d("--accum", "5"),
    "--global-batch": d("--global-batch", "32"),
    "--seq-len": d("--seq-len", "1024"),
    "--trainable-ratio": d("--trainable-ratio", "peft"),
    "--recompute": {"dense": d("--recompute", "on"), "moe": err("--recompute", "on")},
    "--fidelity": {"dense": d("--fidelity", "paper"), "moe": None},
    "--efficiency": d("--efficiency", "0.4"),
    "--overlap-slowdown": d("--overlap-slowdown", "1.5"),
    "--runtime": {"dense": d("--runtime", "deepspeed", with_=("--strategy", "GGG")),
                  "moe": err("--runtime", "deepspeed")},
    "--deepspeed-config": {"dense": d("--deepspeed-config", "{tmp}/ds.json"),
                           "moe": err("--deepspeed-config", "{tmp}/ds.json")},
    # a MoE step runs the paper fidelity's models (flat compute, eager attention, Korthikanti
    # memory; docs/moe.md): it is probed with the other value
    "--compute-model": {"dense": d("--compute-model", "flat"),
                        "moe": err("--compute-model", "kernel")},
    "--attention": {"dense": d("--attention", "eager"), "moe": d("--attention", "flash")},
    "--memory-model": {"dense": d("--memory-model", "korthikanti"),
                       "moe": d("--memory-model", "runtime")},
    "--precision": {"dense": err("--precision", "fp8"), "moe": err("--precision", "fp8"),
                    "moe-tp": d("--precision", "fp8")},
    "--logit-bytes": d("--logit-bytes", "2"),
    "--gpu-memory": {"dense": d("--gpu-memory", "40GB"), "moe": d("--gpu-memory", "70GB")},
    # a node's NIC is on the critical path only where a collective crosses nodes: two nodes;
    # in the MoE closed form with TP the DP traffic is hidden (distributed optimizer) and the
    # all-to-alls stay in a node, so a stage that spans the nodes (--pp 2) carries it
    "--nic-bandwidth": {"dense": d("--nic-bandwidth", "50Gbps", with_=("--nodes", "2")),
                        "moe": d("--nic-bandwidth", "50Gbps"),
                        "moe-tp": d("--nic-bandwidth", "50Gbps", with_=("--pp", "2"))},
    "--intra-bandwidth": d("--intra-bandwidth", "400Gbps"),
    "--tp": {"dense": d("--tp", "2"), "moe": err("--tp", "2"), "moe-tp": d("--tp", "4")},
    "--pp": {"dense": d("--pp", "2"), "moe": err("--pp", "2"), "moe-tp": d("--pp", "2")},
    "--cp": {"dense": d("--cp", "2"), "moe": err("--cp", "2"), "moe-tp": d("--cp", "2")},
    # refused without their prerequisites, honoured with them (dense)
    "--pp-schedule": {"dense": (err("--pp-schedule", "interleaved"),
                                d("--pp-schedule", "interleaved", with_=("--pp", "2"))),
                      "moe": err("--pp-schedule", "interleaved")},
    "--virtual-stages": {"dense": (err("--virtual-stages", "3"),
                                   d("--virtual-stages", "3",
                                     with_=("--pp", "2", "--pp-schedule", "interleaved"))),
                         "moe": err("--virtual-stages", "3")},
    "--sequence-parallel": {"dense": (err("--sequence-parallel"),
                                      d("--sequence-parallel", with_=("--tp", "2"))),
                            "moe": err("--sequence-parallel"), "moe-tp": None},
    # fixed: accepted and ignored where the TP group is within a node (rings on NVLink)
    "--tp-algo": {"dense": err("--tp-algo", "ring", needle="cross nodes", with_=("--tp", "2")),
                  "moe": err("--tp-algo", "ring")},
    "--tp-comm-overlap": {"dense": (err("--tp-comm-overlap"),
                                    d("--tp-comm-overlap", with_=("--tp", "2",
                                                                  "--sequence-parallel"))),
                          "moe": err("--tp-comm-overlap")},
    "--dp-comm-overlap": {"dense": (err("--dp-comm-overlap"),
                                    d("--dp-comm-overlap", with_=("--tp", "2"))),
                          "moe": err("--dp-comm-overlap"),
                          "moe-tp": None},
    "--cluster": {"dense": d("--cluster", "dgx-a100-ib"), "moe": d("--cluster", "dgx-b200-ib")},
    "--set": d("--set", "intra_node.bandwidth=1000Gbps"),
    "--nodes": {"dense": d("--nodes", "2"), "moe": d("--nodes", "4")},
    # fixed: [moe-tp] the PaRO grouping was accepted by the MoE closed form, which has none
    "--group-nodes": {"dense": d("--group-nodes", "2", with_=("--nodes", "2")),
                      "moe": d("--group-nodes", "2"),
                      "moe-tp": err("--group-nodes", "2", needle="PaRO groups do not apply")},
    "--json": None,
}
MOE_FLAGS = {
    "--ep": {"dense": err("--ep", "8"), "moe": d("--ep", "4")},
    "--expert-strategy": {"dense": err("--expert-strategy", "GGG"),
                          "moe": d("--expert-strategy", "IIG")},
    "--a2a-algo": {"dense": err("--a2a-algo", "deepep-normal"),
                   "moe": d("--a2a-algo", "deepep-normal")},
}
ROUTING = {
    "--routing": {"dense": err("--routing", "uniform"), "moe": d("--routing", "uniform")},
    # fixed: accepted and ignored without --routing skew / zipf (and on a dense model)
    "--max-over-mean": {"dense": err("--max-over-mean", "2", needle="mixture-of-experts"),
                        "moe": err("--max-over-mean", "2", needle="--routing skew")},
    "--zipf": {"dense": err("--zipf", "2", needle="mixture-of-experts"),
               "moe": err("--zipf", "2", needle="--routing zipf")},
}

TABLE: dict[str, dict[str, object]] = {
    "simulate": {
        **TRAINING, **MOE_FLAGS, **ROUTING,
        "--strategy": d("--strategy", "IIG"),
        "--dp-comm-overlap": {**TRAINING["--dp-comm-overlap"], "dense": DP_OVERLAP},
        "--algo": ALGO,
        "--mode": d("--mode", "engine"),
        "--trace": {"dense": f("--trace", "{tmp}/out.json", with_=("--mode", "engine")),
                    "moe": f("--trace", "{tmp}/out.json", with_=("--mode", "engine"))},
        # fixed: --repeats without jitter drew the same step N times; --seed seeded nothing
        "--seed": {"dense": (err("--seed", "7", needle="has neither"),
                             d("--seed", "7", with_=ENGINE_JITTER)),
                   "moe": d("--seed", "7", with_=("--routing", "uniform", "--repeats", "2"))},
        "--repeats": {"dense": (err("--repeats", "3", needle="every step is the same"),
                                d("--repeats", "3", with_=ENGINE_JITTER[:4])),
                      "moe": d("--repeats", "3", with_=("--routing", "uniform"))},
        "--jitter-cv": {"dense": d("--jitter-cv", "0.1", with_=("--mode", "engine")),
                        "moe": err("--jitter-cv", "0.1")},
        "--plot": {"dense": f("--plot", "{tmp}/out.png", with_=ENGINE_JITTER),
                   "moe": f("--plot", "{tmp}/out.png", with_=("--routing", "uniform",
                                                              "--repeats", "3"))},
        "--link-timeline": {"dense": f("--link-timeline", "{tmp}/out.csv",
                                       with_=("--mode", "engine")),
                            "moe": err("--link-timeline", "{tmp}/out.csv")},
        "--jobs": err("--jobs", "{tmp}/jobs.yaml"),
    },
    "compare": {
        **TRAINING, **MOE_FLAGS,
        "--algo": ALGO,
        "--runtime": {"dense": d("--runtime", "deepspeed"), "moe": err("--runtime", "deepspeed")},
        "--mode": d("--mode", "engine"),
        "--workers": None,
    },
    "memory": {
        **{k: v for k, v in TRAINING.items() if k in (
            "--model", "--micro-batch", "--accum", "--global-batch", "--seq-len",
            "--trainable-ratio", "--recompute", "--fidelity", "--runtime", "--deepspeed-config",
            "--attention", "--memory-model", "--precision", "--logit-bytes", "--gpu-memory",
            "--tp", "--pp", "--cp", "--pp-schedule", "--virtual-stages", "--sequence-parallel",
            "--tp-comm-overlap", "--cluster", "--set", "--nodes", "--group-nodes", "--json")},
        "--strategy": d("--strategy", "NIG"),
        "--accum": None,
        "--global-batch": None,
        "--cluster": d("--cluster", "abci-a100"),
        "--set": d("--set", "gpu.memory=40GB"),
        "--ep": {"dense": err("--ep", "8"), "moe": d("--ep", "4")},
        "--expert-strategy": {"dense": err("--expert-strategy", "GGG"),
                              "moe": d("--expert-strategy", "IIG")},
    },
    "run": {
        **TRAINING,
        "--strategy": d("--strategy", "IIG"),
        "--dp-comm-overlap": DP_OVERLAP,
        "--algo": ALGO["dense"],
        "--mode": d("--mode", "engine"),
        "--tokens": d("--tokens", "2T"),
        "--memory-model": None,
        "--logit-bytes": None,
        "--gpu-memory": d("--gpu-memory", "3GB"),
        "--gpu-mtbf": d("--gpu-mtbf", "10000h"),
        "--node-mtbf": d("--node-mtbf", "1000h"),
        "--checkpoint-time": d("--checkpoint-time", "5min"),
        "--checkpoint-interval": d("--checkpoint-interval", "1h"),
        "--restart-time": d("--restart-time", "1h"),
        "--gpu-hour-price": d("--gpu-hour-price", "2.5"),
        "--replications": d("--replications", "20"),
        "--search-points": d("--search-points", "9"),
        "--seed": d("--seed", "7", with_=("--gpu-mtbf", "1000h")),
        "--repeats": (err("--repeats", "3", needle="every step is the same"),
                      d("--repeats", "3", with_=ENGINE_JITTER[:4])),
        "--jitter-cv": d("--jitter-cv", "0.1", with_=("--mode", "engine")),
    },
    "advise": {
        "--model": d("--model", "mpt-350m"),
        "--global-batch": d("--global-batch", "128"),
        "--seq-len": d("--seq-len", "1024"),
        "--top": d("--top", "3"),
        "--engine-top": d("--engine-top", "1"),
        "--max-micro-batch": d("--max-micro-batch", "2"),
        "--attention": d("--attention", "eager"),
        "--precision": err("--precision", "fp8"),
        "--runtime": d("--runtime", "deepspeed"),
        "--recompute": d("--recompute", "full"),
        "--tp": d("--tp", "2"),
        "--pp": d("--pp", "2"),
        "--cp": d("--cp", "2"),
        "--strategy": d("--strategy", "GGG"),
        "--group-nodes": d("--group-nodes", "2", with_=("--nodes", "2")),
        "--micro-batch": d("--micro-batch", "2"),
        "--algo": d("--algo", "ho-ring", with_=("--nodes", "2")),
        "--ep": err("--ep", "8"),
        "--expert-strategies": err("--expert-strategies", "GGG"),
        "--compute-model": d("--compute-model", "flat"),
        "--efficiency": d("--efficiency", "0.4"),
        "--gpu-memory": d("--gpu-memory", "4GB"),
        "--tp-comm-overlap": d("--tp-comm-overlap", with_=("--tp", "2")),
        "--dp-comm-overlap": d("--dp-comm-overlap", with_=("--tp", "2", "--strategy", "NNG")),
        "--tokens": d("--tokens", "2B"),
        "--gpu-hour-price": d("--gpu-hour-price", "2.5"),
        "--plot": f("--plot", "{tmp}/out.png"),
        # dense: kernel compute hides the NIC on one node, so another GPU; MoE: its baseline is H100
        "--cluster": {"dense": d("--cluster", "dgx-h100-ib"), "moe": d("--cluster", "dgx-a100-ib")},
        "--nodes": d("--nodes", "2"),
        "--set": {"dense": d("--set", "gpu.hbm_bandwidth=1TB/s"),
                  "moe": d("--set", "intra_node.bandwidth=1000Gbps")},
        "--json": None,
    },
    "collective": {
        "--op": d("--op", "all-reduce"),
        "--size": d("--size", "128MiB"),
        "--scope": d("--scope", "intra"),
        "--algo": d("--algo", "ring"),
        "--fidelity": {"dense": d("--fidelity", "paper"), "moe": None},
        "--minbytes": d("-b", "1M", "-e", "8M"),
        "--maxbytes": d("-e", "8M", with_=("-b", "1M")),
        "--stepfactor": d("-f", "4", with_=("-b", "1M", "-e", "16M")),
        "--compare": d("--compare", NCCL_LOG),
        "--plot": f("--plot", "{tmp}/out.png", with_=("-b", "1M", "-e", "8M")),
        "--in-place": d("--in-place", with_=("--compare", NCCL_LOG)),
        # fixed: the ECMP hash seed was accepted on a fabric that does not hash
        "--seed": {"dense": err("--seed", "3", needle="does not hash")},
        "--cluster": d("--cluster", "dgx-a100-ib"),
        "--set": d("--set", "nic.bandwidth=50Gbps"),
        "--nodes": d("--nodes", "4"),
        "--group-nodes": d("--group-nodes", "2", with_=("--algo", "hierarchical")),
        "--json": None,
    },
    "experts": {
        "--model": d("--model", "qwen3-30b-a3b"),
        "--cluster": d("--cluster", "dgx-b200-ib"),
        "--nodes": d("--nodes", "2"),
        "--group-nodes": d("--group-nodes", "2", with_=("--nodes", "2")),
        "--tp": d("--tp", "2"),
        "--pp": d("--pp", "2", with_=("--ep", "4")),
        "--cp": d("--cp", "2"),
        "--ep": d("--ep", "4"),
        "--etp": d("--etp", "2", with_=("--ep", "4")),
        "--strategy": d("--strategy", "GGG"),
        "--expert-strategy": d("--expert-strategy", "IIG"),
        "--micro-batch": d("--micro-batch", "2"),
        "--seq-len": d("--seq-len", "1024"),
        "--accum": d("--accum", "4", with_=("--nodes", "2")),
        "--routing": d("--routing", "uniform"),
        "--a2a-algo": d("--a2a-algo", "deepep-normal"),
        # fixed: these four were accepted and ignored without a (matching) --routing
        "--max-over-mean": err("--max-over-mean", "2", needle="--routing skew"),
        "--zipf": err("--zipf", "2", needle="--routing zipf"),
        "--seed": err("--seed", "3", needle="no --routing"),
        "--draws": err("--draws", "5", needle="no --routing"),
        "--plot": err("--plot", "{tmp}/out.png"),
        "--json": None,
    },
    "model": {
        "--model": d("--model", "mpt-350m"),
        "--seq-len": d("--seq-len", "1024"),
        "--json": None,
    },
    "cluster": {
        "--set": d("--set", "nic.bandwidth=100Gbps"),
        "--nodes": d("--nodes", "4"),
        "--group-nodes": None,
        "--json": None,
    },
    "calibrate": {
        "--steps": err("--steps", STEPS_CSV),
        "--nccl-tests": d("--nccl-tests", NCCL_LOG_1NODE, "--min-size", "1"),
        "--cluster": d("--cluster", "paper-a100-roce"),
        "--set": d("--set", "nic.latency=20us"),
        "--output": f("-o", "{tmp}/out.yaml"),
        "--nodes": err("--nodes", "4", needle="16 ranks but --nodes 4"),
        "--algo": d("--algo", "ring"),
        "--params": d("--params", "nic.bandwidth,nic.latency"),
        "--holdout": d("--holdout", "every-other"),
        "--min-size": d("--min-size", "128M"),
        "--name": d("--name", "probe"),
        # fixed: --mode engine was accepted and ignored by a --nccl-tests fit
        "--mode": err("--mode", "engine", needle="--nccl-tests"),
        "--json": None,
    },
}
# [moe-tp]: the flags the MoE closed form with TP / PP refuses (its one line names the flag)
MOE_TP_REFUSED = {
    "--strategy": "IIG", "--algo": "ring", "--mode": "engine", "--trace": "{tmp}/out.json",
    "--seed": "7", "--repeats": "3", "--plot": "{tmp}/out.png", "--expert-strategy": "IIG",
    "--a2a-algo": "deepep-normal", "--routing": "uniform", "--trainable-ratio": "peft",
    "--efficiency": "0.4", "--overlap-slowdown": "1.5", "--attention": "flash",
    "--memory-model": "runtime", "--logit-bytes": "2", "--gpu-memory": "70GB"}
for _flag, _value in MOE_TP_REFUSED.items():
    _e = TABLE["simulate"][_flag]
    TABLE["simulate"][_flag] = {**(_e if isinstance(_e, dict) else {"dense": _e, "moe": _e}),
                                "moe-tp": err(_flag, _value)}

# advise [moe]: the search is EP x DP (bf16, the ideal runtime); the other dimensions are
# refused in one line naming the flag
ADVISE_MOE_REFUSED = {
    "--runtime": "deepspeed", "--recompute": "full", "--tp": "2", "--pp": "2", "--cp": "2",
    "--group-nodes": "2", "--algo": "ho-ring", "--compute-model": "kernel",
    "--tp-comm-overlap": None, "--dp-comm-overlap": None, "--tokens": "2B",
    "--gpu-hour-price": "2.5", "--plot": "{tmp}/out.png"}
for _flag, _value in ADVISE_MOE_REFUSED.items():
    TABLE["advise"][_flag] = {"dense": TABLE["advise"][_flag],
                              "moe": err(_flag, *([] if _value is None else [_value]))}
TABLE["advise"].update({
    "--model": {"dense": d("--model", "mpt-350m"), "moe": d("--model", "qwen3-30b-a3b")},
    "--top": {"dense": d("--top", "3"), "moe": d("--top", "1")},
    "--strategy": {"dense": d("--strategy", "GGG"), "moe": d("--strategy", "NGG")},
    "--ep": {"dense": err("--ep", "8"), "moe": d("--ep", "4")},
    "--expert-strategies": {"dense": err("--expert-strategies", "GGG"),
                            "moe": d("--expert-strategies", "NGG")},
    "--nodes": {"dense": d("--nodes", "2"), "moe": d("--nodes", "4")},
})

# heavier probes, marked slow (the default run stays near a minute on two cores): the engine
# runs, advise's two-node searches, the 14 MoE rows of compare (the MoE step is probed
# through simulate in the default run) and calibrate's fits
SLOW = {("compare", "dense", "--mode"), ("run", "dense", "--mode"),
        ("advise", "dense", "--engine-top"), ("advise", "dense", "--algo"),
        ("advise", "dense", "--group-nodes"), ("advise", "dense", "--nodes"),
        ("compare", "moe", "*"), ("calibrate", "dense", "*")}


def _slow(cmd: str, base: str, flag: str) -> bool:
    entry = TABLE.get(cmd, {}).get(flag)
    if isinstance(entry, dict):
        entry = entry.get(base)
    if isinstance(entry, P) and entry.want == "err":
        return False  # a refusal is quick
    return bool({(cmd, base, flag), (cmd, base, "*")} & SLOW)


def _sub_actions(cmd: str) -> list[argparse.Action]:
    p = build_parser(cmd)
    sub = next(x for x in p._actions if isinstance(x, argparse._SubParsersAction))
    acts = sub.choices[cmd]._actions
    if cmd == "cluster":
        acts = next(x for x in acts if isinstance(x, argparse._SubParsersAction))
        acts = acts.choices["show"]._actions
    return acts


def _flags(cmd: str) -> list[tuple[str, tuple[str, ...]]]:
    """(the flag's longest spelling, all spellings) of every optional flag of ``cmd``."""
    return [(next(s for s in a.option_strings if s.startswith("--")), tuple(a.option_strings))
            for a in _sub_actions(cmd) if a.option_strings and a.dest != "help"]


def _has_json(cmd: str) -> bool:
    return any(a.dest == "json" for a in _sub_actions(cmd))


def _cases():
    for cmd in COMMANDS:
        if cmd in NOT_PROBED:
            continue
        for flag, spellings in _flags(cmd):
            for base in BASES.get(cmd, {"dense": []}):
                marks = [pytest.mark.slow] if _slow(cmd, base, flag) else []
                yield pytest.param(cmd, flag, spellings, base, marks=marks,
                                   id=f"{cmd}-{base}-{flag.lstrip('-')}")


def test_every_json_command_is_probed_or_excused():
    json_cmds = {c for c in COMMANDS if _has_json(c)}
    assert json_cmds == set(BASES) | set(NOT_PROBED), json_cmds ^ (set(BASES) | set(NOT_PROBED))
    assert not set(BASES) & set(NOT_PROBED)


def _fill(args, tmp: Path) -> list[str]:
    return [a.replace("{tmp}", str(tmp)) for a in args]


def _strip(x, drop: set[str]):
    if isinstance(x, dict):
        return {k: _strip(v, drop) for k, v in x.items() if k not in drop}
    if isinstance(x, list):
        return [_strip(v, drop) for v in x]
    return x


def _inputs(tmp: Path) -> None:
    (tmp / "ds.json").write_text(json.dumps({
        "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4,
        "bf16": {"enabled": True}, "zero_optimization": {"stage": 2}}))
    (tmp / "jobs.yaml").write_text(
        "cluster: paper-a100-roce\nnodes: 2\njobs:\n"
        "  - {name: a, model: mpt-125m, strategy: GGG, accum: 1, nodes: [0]}\n"
        "  - {name: b, model: mpt-125m, strategy: IIG, accum: 1, nodes: [1]}\n")


def _run_json(argv, capsys):
    rc, out, errtext = run_case([*argv, "--json"], capsys)
    assert "Traceback" not in errtext + out, errtext
    return rc, (json.loads(out) if rc == 0 and out.strip() else None), errtext


@pytest.mark.parametrize("cmd,flag,spellings,base", list(_cases()))
def test_flag_changes_the_result_or_is_refused(cmd, flag, spellings, base, tmp_path, capsys):
    table = TABLE.get(cmd, {})
    entry = next((table[s] for s in spellings if s in table), "missing")
    assert entry != "missing", (f"{cmd} {flag} has no entry in TABLE: give it a legal "
                                "non-default value and the outcome it must have")
    if isinstance(entry, dict):
        entry = entry[base] if base in entry else entry[base.split("-")[0]]
    if entry is None:
        assert flag in ALLOWED_NIL or f"{cmd} {flag}" in ALLOWED_NIL, (
            f"{cmd} {flag}: None only for ALLOWED_NIL flags")
        return
    _inputs(tmp_path)
    for probe in (entry if isinstance(entry, tuple) else (entry,)):
        _check(cmd, flag, spellings, base, probe, tmp_path, capsys)


# baseline results by (command, baseline, prerequisites): a baseline is a pure function of its
# arguments (wall times are not compared), so it runs once; one naming a temporary file is not
# kept (its path differs from test to test)
_BASELINES: dict[tuple, tuple] = {}


def _baseline(cmd, base, with_, argv0, capsys):
    key = (cmd, base, tuple(with_))
    if key in _BASELINES:
        return _BASELINES[key]
    res = _run_json(argv0, capsys)
    if not any("{tmp}" in a for a in (*BASES[cmd][base], *with_)):
        _BASELINES[key] = res
    return res


def _check(cmd, flag, spellings, base, entry: P, tmp_path: Path, capsys) -> None:
    """One probe of ``flag`` on ``cmd``'s ``base`` baseline (see :class:`P`)."""
    for old in tmp_path.glob("out.*"):
        old.unlink()
    argv0 = _fill([*BASES[cmd][base], *entry.with_], tmp_path)
    argv1 = [*argv0, *_fill(entry.args, tmp_path)]
    rc1, res1, err1 = _run_json(argv1, capsys)
    if entry.want == "err":
        lines = [ln for ln in err1.strip("\n").split("\n")
                 if ln and not ln.startswith("parosim: note:")]
        assert rc1 == 2, f"{cmd} {flag} was accepted (exit {rc1}); expected a refusal"
        assert len(lines) == 1 and lines[0].startswith("parosim: error:"), err1
        assert any(s in lines[0] for s in spellings), f"{lines[0]!r} does not name {flag}"
        assert entry.needle in lines[0], (entry.needle, lines[0])
        return
    assert rc1 == 0, f"{cmd} {' '.join(entry.args)} refused: {err1}"
    if entry.want == "file":
        assert list(tmp_path.glob("out.*")), f"{cmd} {flag} wrote no file"
        return
    rc0, res0, err0 = _baseline(cmd, base, entry.with_, argv0, capsys)
    assert rc0 == 0, f"baseline refused: {err0}"
    dest = next(a.dest for a in _sub_actions(cmd) if flag in a.option_strings)
    drop = NOT_COMPARED | {dest, *entry.echo}
    assert _strip(res1, drop) != _strip(res0, drop), (
        f"{cmd} [{base}] {' '.join(entry.args)} accepted and changed nothing but its echo")
