"""The parser of the ``parosim`` command line: the shared argument groups (cluster,
training, parallel layout), the help formatter, ``--version``, and every subcommand's flags.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from pathlib import Path

from .actions import Explicit


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Shows each option's default (unless None/False or already in the help text) and keeps
    the examples in the epilog as written."""

    def _get_help_string(self, action):
        h = action.help or ""
        if ("default" in h or action.default in (None, False, argparse.SUPPRESS)
                or not action.option_strings):
            return h
        return h + " (default: %(default)s)"


class Parser(argparse.ArgumentParser):
    def __init__(self, *args, **kw):
        kw.setdefault("formatter_class", HelpFormatter)
        # no abbreviations: --mode on a command without it must not be read as --model
        kw.setdefault("allow_abbrev", False)
        super().__init__(*args, **kw)

    def error(self, message: str):  # one clear line, exit 2
        self.exit(2, f"parosim: error: {message}\n")


def preset_names() -> list[str]:
    """Preset names for --help (a directory listing; nothing is parsed)."""
    env = os.environ.get("PAROSIM_TOPOLOGIES")
    return _preset_names(env or str(Path(__file__).resolve().parents[2] / "topologies"))


@functools.lru_cache(maxsize=4)
def _preset_names(d: str) -> list[str]:  # once per directory: every command's --cluster
    p = Path(d)
    return sorted(x.stem for x in p.glob("*.yaml")) if p.is_dir() else []


MODE_HELP = ("engine: replay every operation of the step on the simpy flow-level network "
              "(overlap and link sharing exact; slower); analytic: closed form of one "
              "micro-step times --accum (fast; concurrent collectives do not share links)")


EXAMPLES = {
    "collective": "examples:\n  parosim collective --op all-gather --size 1GB --algo all\n"
                  "  parosim collective --op all-reduce --size 256MiB --nodes 16 --json",
    "simulate": "examples:\n  parosim simulate --model llama-7b --strategy NIG\n"
                "  parosim simulate --model llama-65b --strategy IIG --global-batch 1Mitok "
                "--mode analytic",
    "compare": "examples:\n  parosim compare --model llama-13b --nodes 8\n"
               "  parosim compare --model llama-65b --trainable-ratio peft --mode analytic",
    "memory": "examples:\n  parosim memory --model llama-65b\n"
              "  parosim memory --model llama-13b --strategy zero3 --gpu-memory 40GB",
    "sweep": "examples:\n  parosim sweep experiments/03_allgather_1gb/sweep.yaml --out "
             "/tmp/ag",
    "advise": "examples:\n  parosim advise --model llama-7b --nodes 2 --global-batch 256\n"
              "  parosim advise --model llama-65b --cluster dgx-a100-ib --nodes 128 "
              "--global-batch 2048 --seq-len 2k --plot pareto.png",
    "run": "examples:\n  parosim run --model llama-7b --nodes 4 --tokens 10B --mode analytic\n"
           "  parosim run --nodes 64 --tokens 1T --gpu-mtbf 50000h --checkpoint-time 2min "
           "--checkpoint-interval 3h",
    "calibrate": "examples:\n  parosim calibrate --nccl-tests "
                 "tests/data/nccl-tests/aws-p4de-2node-all_reduce.txt --cluster aws-p4de -o "
                 "/tmp/p4de.yaml\n"
                 "  parosim calibrate --steps experiments/09_calibrate_steps/runs_example.csv "
                 "--cluster llm-foundry-a100-roce -o /tmp/steps.yaml",
    "validate": "examples:\n  parosim validate --nodes 1 --ranks-per-node 2 --sizes 1MiB "
                "--ops all-reduce --algos ring\n"
                "  parosim validate --emulate --json    # root: namespaces, a bridge and tc",
}


def seq_len_type(text: str) -> int:
    """``--seq-len``: a whole number of tokens, or ``4k`` / ``32K`` (x 1024, as context
    lengths are named: 4k = 4096)."""
    t = str(text).strip()
    mul = 1
    if t[-1:] in ("k", "K"):
        t, mul = t[:-1], 1024
    try:
        return int(t) * mul
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a token count; expected a whole number such as 2048 "
            "or 4k (= 4096)") from None


def cluster_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cluster", default="paper-a100-roce",
                   help=f"preset name ({', '.join(preset_names()) or 'none found'}) or a YAML "
                   "path (default: paper-a100-roce)")
    p.add_argument("--set", action="append", default=None, metavar="KEY=VALUE",
                   help="change one key of the cluster YAML for this run, with its unit (e.g. "
                   "--set nic.bandwidth=100Gbps --set collective.model=ideal); repeatable; "
                   "docs/cluster-yaml.md")
    p.add_argument("--nodes", type=int, default=None, help="override the node count")
    p.add_argument("--group-nodes", type=int, default=None,
                   help="nodes per PaRO group (default 1: a group is a node)")
    p.add_argument("--json", action="store_true", help="machine-readable result on stdout")


# flags of training_args that cannot change a memory breakdown: not offered by `memory`
NOT_MEMORY = {"efficiency": None, "overlap_slowdown": None, "compute_model": None,
              "nic_bandwidth": None, "intra_bandwidth": None, "tp_algo": None,
              "dp_comm_overlap": False}


def moe_step_args(p: argparse.ArgumentParser) -> None:
    """The flags of a mixture-of-experts step (docs/moe.md, "A MoE training step")."""
    g = p.add_argument_group("mixture of experts (MoE models only)")
    g.add_argument("--ep", type=int, default=None,
                   help="expert parallelism: the routed experts split over EP ranks (default 1)")
    g.add_argument("--expert-strategy", default=None,
                   help="PaRO strategy of the routed experts over the expert-data-parallel "
                   "group (default: --strategy's)")
    g.add_argument("--a2a-algo", default=None,
                   help="dispatch / combine all-to-all: p2p (default) | hierarchical-a2a | "
                   "deepep-normal | deepep-ll | hybridep (DeepEP's kernels, bf16 tokens, costs "
                   "collective.ep_normal / ep_ll / ep_hybrid: fitted in dgx-h800-ib, ideal "
                   "defaults elsewhere; docs/moe.md)")
    g.add_argument("--routing", default=None,
                   help="token routing drawn per step (--repeats steps): balanced | uniform | "
                   "skew | zipf (default: every expert its mean load)")
    g.add_argument("--max-over-mean", type=float, default=1.5, action=Explicit,
                   help="--routing skew only: the hot rank's load over the mean")
    g.add_argument("--zipf", type=float, default=1.0, action=Explicit,
                   help="--routing zipf only: the exponent")


def training_args(p: argparse.ArgumentParser, memory: bool = False) -> None:
    """The training, override and layout flags; ``memory``: without the flags that cannot
    change memory (:data:`NOT_MEMORY`, set to their defaults)."""
    if memory:
        p.set_defaults(**NOT_MEMORY)
        p = _Filtered(p, NOT_MEMORY)
    p.add_argument("--model", default="llama-7b",
                   help="a preset (llama-7b/13b/30b/65b, llama-2-7b/13b/70b, llama-3-8b/70b, "
                        "gpt3-175b, mpt-125m ... mpt-70b) or a YAML path")
    p.add_argument("--micro-batch", type=int, default=4, action=Explicit,
                   help="sequences per GPU per micro-step")
    p.add_argument("--accum", "--accum-steps", dest="accum", type=int, default=10,
                   action=Explicit, help="accumulation micro-steps s (JSON: accum_steps)")
    p.add_argument("--global-batch", default=None, metavar="SEQS|TOKENS",
                   help="global batch per optimizer step, in sequences (2048) or tokens "
                   "(1Mitok = 2**20, 4Mtok = 4e6); sets --accum = global / (micro-batch x "
                   "data-parallel GPUs), as DeepSpeed's train_batch_size does")
    p.add_argument("--seq-len", type=seq_len_type, default=512,
                   help="tokens per sequence, e.g. 2048 or 4k (= 4096)")
    p.add_argument("--trainable-ratio", default="full",
                   help="full | partial (1/16) | peft (3/1000) | a number in (0, 1]")
    p.add_argument("--recompute", default="auto",
                   choices=["auto", "on", "off", "full", "none", "selective"],
                   help="activation recomputation (auto: full only when needed to fit; "
                   "on = full, off = none; selective: the attention core only, with the "
                   "--tp/--pp model)")
    p.add_argument("--fidelity", default="accurate", choices=["accurate", "paper"],
                   help="accurate: each modelling setting left unset takes the most accurate "
                        "model (kernel compute, FlashAttention, memory as frameworks keep it, "
                        "NCCL's tuner; docs/accuracy.md); paper: the PaRO paper's closed forms "
                        "(flat 50 %% efficiency, eager attention, Korthikanti memory with fp32 "
                        "logits, HO-Ring)")
    p.add_argument("--efficiency", "--compute-efficiency", dest="efficiency", type=float,
                   default=None,
                   help="fraction of peak FLOP/s that compute achieves with the flat compute "
                        "model; given, it selects that model (default 0.5)")
    p.add_argument("--overlap-slowdown", type=float, default=None,
                   help="compute slowdown factor while a collective runs beside it (>= 1; "
                   "default: the cluster YAML's compute.overlap_slowdown, else the runtime's)")
    p.add_argument("--runtime", default=None,
                   help="framework schedule: ideal (default) | deepspeed | fsdp | paro | "
                   "internlm | a YAML path (see runtimes/ and docs/runtimes.md)")
    p.add_argument("--deepspeed-config", default=None, metavar="DS_CONFIG_JSON",
                   help="a DeepSpeed JSON config: stage, buckets, overlap_comm, micro-batch, "
                   "accumulation (implies --runtime deepspeed)")
    p.add_argument("--compute-model", default=None, choices=["flat", "kernel"],
                   help="flat: FLOPs at --efficiency of peak; kernel: per-kernel costs "
                        "(docs/compute.md); default: kernel (--fidelity paper: the cluster "
                        "YAML's compute.model, flat unless it says otherwise)")
    p.add_argument("--attention", default=None, choices=["eager", "flash"],
                   help="attention kernel: eager (s x s scores stored) or flash "
                        "(FlashAttention / SDPA); default: the runtime's (flash for ideal and "
                        "fsdp, eager for deepspeed and paro; --fidelity paper: eager for "
                        "ideal)")
    p.add_argument("--memory-model", default=None, choices=["korthikanti", "runtime"],
                   help="korthikanti: Korthikanti et al. 2022 estimate; runtime: memory as "
                        "PyTorch runtimes keep it (docs/memory.md); default: runtime "
                        "(korthikanti with --tp / --pp / --cp and with --fidelity paper)")
    p.add_argument("--precision", default="bf16", choices=["bf16", "fp8"],
                   help="training precision: bf16, or fp8 (Transformer Engine style: the "
                        "decoder layers' weight GEMMs at the GPU's FP8 peak, attention and LM "
                        "head in bf16; needs a GPU with FP8, e.g. H100; docs/compute.md)")
    p.add_argument("--logit-bytes", type=int, default=None,
                   help="bytes per logit live at the loss (default: the runtime's, else 4 "
                        "korthikanti, 10 runtime; 2 for a fused bf16 cross-entropy)")
    p.add_argument("--gpu-memory", default=None, help="override GPU memory, e.g. 16GB")
    p.add_argument("--nic-bandwidth", default=None, help="override NIC bandwidth, e.g. 200Gbps")
    p.add_argument("--intra-bandwidth", default=None,
                   help="override per-GPU intra-node bandwidth, e.g. 2400Gbps")
    g = p.add_argument_group("tensor / pipeline parallelism (docs/parallelism.md)")
    if memory:
        g = _Filtered(g, NOT_MEMORY)
    g.add_argument("--tp", type=int, default=1, help="tensor-parallel degree (default 1)")
    g.add_argument("--pp", type=int, default=1, help="pipeline stages (default 1); --accum "
                   "is then the micro-batches per step")
    g.add_argument("--cp", type=int, default=1,
                   help="context-parallel degree (Megatron-Core context_parallel_size, ring "
                   "attention; default 1; needs --seq-len divisible by 2 x cp; "
                   "docs/parallelism.md)")
    g.add_argument("--pp-schedule", default="1f1b", help="1f1b | interleaved")
    g.add_argument("--virtual-stages", type=int, default=None,
                   help="model chunks per stage of the interleaved schedule (default 2)")
    g.add_argument("--sequence-parallel", action="store_true",
                   help="Megatron sequence parallelism (needs --tp >= 2)")
    g.add_argument("--tp-algo", default=None,
                   help="algorithm of TP collectives that cross nodes, with --tp above the "
                   "GPUs per node (default: --algo)")
    g.add_argument("--tp-comm-overlap", action="store_true",
                   help="Megatron-Core / Transformer Engine tp_comm_overlap: the sequence-"
                   "parallel all-gathers / reduce-scatters run in chunks beside their GEMMs "
                   "(needs --sequence-parallel; docs/parallelism.md)")
    g.add_argument("--dp-comm-overlap", action="store_true",
                   help="Megatron-Core overlap_grad_reduce + overlap_param_gather: the data-"
                   "parallel gradient reduction / parameter all-gather run bucket by bucket "
                   "beside the last backward / first forward (needs --tp or --pp >= 2 and "
                   "PaRO NNN, NNI or NNG; docs/parallelism.md)")


class _Sink:
    """Takes any parser call and builds nothing: the parser of a command that is not run."""

    def __getattr__(self, name):
        return lambda *args, **kw: self


class _OneCommand:
    """The subcommands action where only ``command`` is run: the other commands' parsers are
    :class:`_Sink` (their flags cost start-up time and cannot be used)."""

    def __init__(self, sub, command: str):
        self.sub, self.command = sub, command

    def add_parser(self, name: str, **kw):
        return self.sub.add_parser(name, **kw) if name == self.command else _Sink()


class _Filtered:
    """An argument container that skips the flags whose dest is in ``skip``."""

    def __init__(self, inner, skip):
        self.inner, self.skip = inner, skip

    def add_argument(self, *names, **kw):
        dest = kw.get("dest") or names[0].lstrip("-").replace("-", "_")
        if dest not in self.skip:
            self.inner.add_argument(*names, **kw)

    def add_argument_group(self, *args, **kw):
        return _Filtered(self.inner.add_argument_group(*args, **kw), self.skip)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser; ``command`` (the subcommand about to run, if known) skips building the
    options of the others that would cost imports."""
    p = Parser(prog="parosim", description="Simulate data-parallel LLM training with PaRO "
                "strategies and Ring / hierarchical / HO-Ring collectives.")
    p.add_argument("--version", action=VersionAction)  # reads the metadata only when asked
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser)
    if command is not None:  # only that command's parser is built (start-up)
        sub = _OneCommand(sub, command)
    c = sub.add_parser("collective", epilog=EXAMPLES["collective"],
                       help="simulate one collective")
    c.add_argument("--op", default=None,
                   help="all-gather (default) | reduce-scatter | all-reduce | all-to-all")
    c.add_argument("--size", default=None,
                   help="full buffer as nccl-tests counts it (AG output, RS input, AR buffer); "
                   "default 1GiB")
    c.add_argument("--scope", default="global", help="global | intra | inter")
    c.add_argument("--algo", default=None,
                   help="ring | hierarchical | ho-ring | nccl | all, or a comma list (default "
                   "nccl; --fidelity paper: ho-ring; with --compare: nccl); for --op "
                   "all-to-all: p2p (= nccl, the default) | hierarchical-a2a | all")
    c.add_argument("--fidelity", default="accurate", choices=["accurate", "paper"],
                   help="accurate: an unset --algo is NCCL's tuner; paper: HO-Ring, the PaRO "
                        "paper's (docs/accuracy.md)")
    if command in (None, "collective"):  # its module is imported only for it (start-up)
        from .nccl import (  # deferred: loaded when the command runs (start-up)
            add_arguments as _nccl_args,  # deferred: loaded when the command runs (start-up)
        )

        _nccl_args(c)
    c.add_argument("--seed", type=int, default=None,
                   help="ECMP hash seed (leaf-spine with ecmp: hash; default the cluster's)")
    cluster_args(c)

    s = sub.add_parser("simulate", epilog=EXAMPLES["simulate"],
                       help="simulate one training step of one strategy")
    s.add_argument("--strategy", default=None,
                   help="e.g. NIG, PaRO-NIG, zero3, ddp (default NIG)")
    s.add_argument("--algo", "--collective", dest="algo", default=None,
                   help="ring | hierarchical | ho-ring | nccl (default nccl, with --fidelity "
                   "paper ho-ring; set by --runtime deepspeed / fsdp / paro)")
    s.add_argument("--mode", default="engine", choices=["engine", "analytic"], help=MODE_HELP)
    s.add_argument("--trace", default=None, help="write a Chrome-trace JSON (Perfetto); per "
                   "rank and with link-utilisation counters for per-rank runs")
    s.add_argument("--seed", type=int, default=0,
                   help="seed of the jitter draws and of ECMP hashing (default 0)")
    s.add_argument("--repeats", type=int, default=1,
                   help="steps to simulate (jitter): report mean, p50, p90, p99")
    s.add_argument("--jitter-cv", type=float, default=None,
                   help="lognormal compute jitter per op and rank, coefficient of variation "
                   "(default: the cluster's jitter.cv, else 0)")
    s.add_argument("--plot", default=None, help="write a PNG of the step-time distribution")
    s.add_argument("--link-timeline", default=None,
                   help="write per-link utilisation over time (CSV) of the hottest links")
    s.add_argument("--jobs", default=None, help="a YAML of several jobs on one cluster: each "
                   "job's step alone and shared (see docs/runs-and-jobs.md)")
    moe_step_args(s)
    training_args(s)
    cluster_args(s)

    cmp_ = sub.add_parser("compare", epilog=EXAMPLES["compare"],
                       help="all 14 strategies ranked (the main job)")
    cmp_.add_argument("--algo", "--collective", dest="algo", default=None,
                      help="ring | hierarchical | ho-ring | nccl | all (default nccl, with "
                      "--fidelity paper ho-ring; set by --runtime deepspeed / fsdp / paro)")
    cmp_.add_argument("--mode", default=None, choices=["engine", "analytic"],
                      help=MODE_HELP + " (default: engine; analytic for a MoE model, whose "
                      "196 dense x expert pairs the engine runs on request)")
    cmp_.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1),
                      help="processes to simulate in (default: up to 2)")
    g = cmp_.add_argument_group("mixture of experts (MoE models only)")
    g.add_argument("--ep", type=int, default=None,
                   help="expert parallelism: the routed experts split over EP ranks (default 1)")
    g.add_argument("--expert-strategy", default=None,
                   help="PaRO strategies of the routed experts to pair with every dense one: "
                   "one, a comma list, or 'all' (the default)")
    g.add_argument("--a2a-algo", default=None,
                   help="dispatch / combine all-to-all: p2p (default) | hierarchical-a2a | "
                   "deepep-normal | deepep-ll | hybridep (DeepEP's kernels, bf16 tokens, costs "
                   "collective.ep_normal / ep_ll / ep_hybrid: fitted in dgx-h800-ib, ideal "
                   "defaults elsewhere; docs/moe.md)")
    training_args(cmp_)
    cluster_args(cmp_)

    sw = sub.add_parser("sweep", epilog=EXAMPLES["sweep"],
                       help="a grid of configurations, parallel and resumable")
    sw.add_argument("spec", help="sweep spec YAML (see experiments/)")
    sw.add_argument("--out", required=True, help="output directory (results.csv, figures/)")
    sw.add_argument("--workers", type=int, default=2, help="local worker processes")
    sw.add_argument("--scheduler", default=None,
                    help="address of a running dask.distributed scheduler (tcp://host:8786)")
    sw.add_argument("--fresh", action="store_true",
                    help="recompute every point, overwriting results.csv in --out (default: "
                    "resume the points whose values, input file contents and parosim "
                    "version match a row there)")
    sw.add_argument("--no-progress", action="store_true", help="no progress bar")
    sw.add_argument("--json", action="store_true", help="summary as JSON")

    v = sub.add_parser("validate", epilog=EXAMPLES["validate"],
                       help="run the same schedule on real torch.distributed "
                       "ranks and report simulated vs measured")
    if command in (None, "validate"):  # its options import the harness: only when needed
        from ..validate.cli import (
            add_arguments as _validate_args,  # deferred: loaded when the command runs (start-up)
        )

        _validate_args(v)
    v.add_argument("--json", action="store_true", help="the result as JSON")

    rn = sub.add_parser("run", epilog=EXAMPLES["run"],
                        help="a whole training run with failures: goodput, wall clock, "
                        "best checkpoint interval (Monte-Carlo, see docs/runs-and-jobs.md)")
    rn.add_argument("--strategy", default=None,
                    help="e.g. NIG, PaRO-NIG, zero3, ddp (default NIG)")
    rn.add_argument("--algo", "--collective", dest="algo", default=None,
                    help="ring | hierarchical | ho-ring | nccl (default nccl, with --fidelity "
                    "paper ho-ring; set by --runtime deepspeed / fsdp / paro)")
    rn.add_argument("--mode", default="engine", choices=["engine", "analytic"],
                    help="how the one step is simulated")
    rn.add_argument("--tokens", default="10B", help="run length in tokens, e.g. 1.4T, 300B")
    rn.add_argument("--gpu-mtbf", default=None, help="mean time between failures of one GPU, "
                    "e.g. 50000h, or none (default 86316h: LLaMA 3 405B run)")
    rn.add_argument("--node-mtbf", default=None, help="of one node (host, NIC, cables), or "
                    "none (default 15342h: LLaMA 3 405B run)")
    rn.add_argument("--checkpoint-time", default="60s",
                    help="blocking checkpoint write time (default 60s, an assumption)")
    rn.add_argument("--checkpoint-interval", default=None,
                    help="also report this interval (compute time between checkpoints)")
    rn.add_argument("--restart-time", default="10min",
                    help="time to restart after a failure (default 10min, an assumption)")
    rn.add_argument("--gpu-hour-price", type=float, default=None,
                    help="price of one GPU-hour (any currency): adds the run's cost")
    rn.add_argument("--replications", type=int, default=100, help="Monte-Carlo replications")
    rn.add_argument("--search-points", type=int, default=17,
                    help="checkpoint intervals searched (Young's / 4 to x 4)")
    rn.add_argument("--seed", type=int, default=0,
                    help="seed of the failure times (and of the step's jitter and ECMP)")
    rn.add_argument("--repeats", type=int, default=1,
                    help="steps simulated (with jitter): the run draws its step times from "
                    "their distribution")
    rn.add_argument("--jitter-cv", type=float, default=None,
                    help="lognormal compute jitter of the simulated steps (see simulate)")
    training_args(rn)
    cluster_args(rn)

    cal = sub.add_parser("calibrate", epilog=EXAMPLES["calibrate"],
                         help="fit a cluster to measurements (nccl-tests logs) "
                         "and write a cluster YAML")
    if command in (None, "calibrate"):  # its options import calibrate_steps: only when needed
        from .calibrate import (
            add_arguments as _calibrate_args,  # deferred: loaded when the command runs (start-up)
        )

        _calibrate_args(cal)

    ad = sub.add_parser("advise", epilog=EXAMPLES["advise"],
                        help="the fastest configurations for a global batch: "
                        "attention, precision, runtime, TP / PP / CP, PaRO strategy and group, "
                        "micro-batch, recomputation, algorithm")
    ad.add_argument("--model", default="llama-7b", help="preset name or YAML path")
    ad.add_argument("--global-batch", required=True,
                    help="sequences (2048, 2048seq) or tokens (4Mtok, 4194304tokens)")
    ad.add_argument("--seq-len", type=seq_len_type, default=512,
                    help="tokens per sequence, e.g. 2048 or 4k (= 4096) (default 512, as "
                    "every command)")
    ad.add_argument("--top", type=int, default=5, help="configurations to print (default 5)")
    ad.add_argument("--engine-top", type=int, default=None,
                    help="replay only the best N on the engine and show the closed-form "
                    "rest apart (default: replay until the --top shown are all engine "
                    "results)")
    ad.add_argument("--max-micro-batch", type=int, default=16,
                    help="largest micro-batch tried (powers of 2; default 16)")
    s_ = ad.add_argument_group("search space: each flag fixes a dimension to one value or a "
                               "comma list (default: all of it searched; docs/advise.md)")
    s_.add_argument("--attention", default=None, help="eager | flash (default: both)")
    s_.add_argument("--precision", default=None,
                    help="bf16 | fp8 (default: bf16, and fp8 where the GPU has FP8)")
    s_.add_argument("--runtime", default=None,
                    help="ideal | deepspeed | fsdp | paro | a YAML path (default: ideal and "
                    "every bundled profile)")
    s_.add_argument("--recompute", default=None,
                    help="none | selective | full (off = none, on = full; default: all three)")
    s_.add_argument("--tp", default=None, help="tensor-parallel degree (default: the divisors "
                    "of the GPUs per node)")
    s_.add_argument("--pp", default=None, help="pipeline stages (default: the divisors of the "
                    "layer count)")
    s_.add_argument("--cp", default=None, help="context-parallel degree (default: 1, 2, 4, 8 "
                    "where the sequence splits; flash attention only)")
    s_.add_argument("--strategy", "--strategies", dest="strategies", default="all",
                    help="PaRO strategies, e.g. GGG or NNN,NNG,IIG (default: all 14)")
    s_.add_argument("--group-nodes", default=None,
                    help="nodes per PaRO group (default: 1, 2, 4, 8 that divide the nodes)")
    s_.add_argument("--micro-batch", default=None,
                    help="sequences per GPU per micro-step (default: 1, 2, 4, ... "
                    "--max-micro-batch)")
    s_.add_argument("--algo", default=None, help="ring | hierarchical | ho-ring (default: "
                    "those that differ for the layout)")
    g = ad.add_argument_group("mixture of experts (MoE models only; docs/moe.md)")
    g.add_argument("--ep", default=None, help="expert-parallel degrees to search, e.g. 8 or "
                   "8,16 (default: every one dividing the GPUs and the experts)")
    g.add_argument("--expert-strategies", default="all",
                   help="PaRO strategies of the routed experts (default: all 14)")
    ad.add_argument("--compute-model", default=None, choices=["flat", "kernel"],
                    help="flat: FLOPs at --efficiency of peak; kernel: per-kernel costs "
                    "(default: kernel, as simulate's accurate default; flat when "
                    "--efficiency is given; a cluster YAML's own compute.model is kept; MoE "
                    "models run flat)")
    ad.add_argument("--efficiency", "--compute-efficiency", dest="efficiency", type=float,
                    default=None,
                    help="fraction of peak FLOP/s compute achieves (default 0.5)")
    ad.add_argument("--gpu-memory", default=None, help="override GPU memory, e.g. 40GB")
    ad.add_argument("--tp-comm-overlap", action="store_true",
                    help="sequence-parallel configurations run with Megatron-Core's TP "
                    "communication overlap (a fixed setting, not searched)")
    ad.add_argument("--dp-comm-overlap", action="store_true",
                    help="TP/PP configurations with PaRO NNN, NNI or NNG run with Megatron-"
                    "Core's DP communication overlap (a fixed setting, not searched)")
    ad.add_argument("--tokens", default=None,
                    help="token budget GPU-hours (and cost) are given for, e.g. 1.4T, 300B "
                    "(default 1B)")
    ad.add_argument("--gpu-hour-price", type=float, default=None,
                    help="price of one GPU-hour (any currency): adds the cost of the token "
                    "budget")
    ad.add_argument("--plot", default=None, help="write the memory-vs-throughput Pareto "
                    "plot to FILE (.png, .svg, .pdf)")
    ad.add_argument("--cluster", default="paper-a100-roce",
                    help="preset name or YAML path (default: paper-a100-roce, as every "
                    "command)")
    ad.add_argument("--nodes", type=int, default=None, help="override the node count")
    ad.add_argument("--set", action="append", default=None, metavar="KEY=VALUE",
                    help="change one key of the cluster YAML (e.g. nic.bandwidth=100Gbps); "
                    "repeatable")
    ad.add_argument("--json", action="store_true", help="machine-readable result on stdout")

    if command in (None, "cluster"):  # its module is imported only for it (start-up)
        from .cluster import add_parser as _cluster_parser  # deferred: the command's own module

        _cluster_parser(sub, Parser)

    m = sub.add_parser("memory", epilog=EXAMPLES["memory"],
                       help="memory breakdown per GPU, fits or not")
    m.add_argument("--strategy", default="all", help="a strategy or 'all'")
    g = m.add_argument_group("mixture of experts (MoE models only)")
    g.add_argument("--ep", type=int, default=None,
                   help="expert parallelism: the routed experts split over EP ranks (default 1)")
    g.add_argument("--expert-strategy", default=None,
                   help="PaRO strategy of the routed experts over the expert-data-parallel "
                   "group, or 'all' (default: each row's --strategy)")
    training_args(m, memory=True)
    cluster_args(m)
    if command in (None, "model"):  # its module is imported only for it (start-up)
        from .model import (  # deferred: loaded when the command runs (start-up)
            add_arguments as _model_args,  # deferred: loaded when the command runs (start-up)
        )

        _model_args(sub)
    if command in (None, "experts"):  # its module is imported only for it (start-up)
        from .experts import (  # deferred: loaded when the command runs (start-up)
            add_arguments as _experts_args,  # deferred: loaded when the command runs
        )

        _experts_args(sub)
    return p


class VersionAction(argparse.Action):
    """``--version``: like argparse's ``version`` action, the version read when used."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS,
                 help="show program's version number and exit"):
        super().__init__(option_strings=option_strings, dest=dest, default=default, nargs=0,
                         help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        parser._print_message(f"parosim {version_string()}\n", sys.stdout)
        parser.exit()


def version_string() -> str:
    """The package's version (``parosim.__version__``, the one ``pyproject.toml`` installs)."""
    from .. import __version__  # deferred: read only when asked

    return __version__
