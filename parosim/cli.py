"""The ``parosim`` command line: parse, call io and the core, print. Nothing else.

Bad input gives one line on stderr and exit code 2 (never a traceback).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable

from .errors import InputError


class _Explicit(argparse.Action):
    """Stores the value and remembers that the flag was given (``_given_<dest>``)."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
        setattr(namespace, f"_given_{self.dest}", True)


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Shows each option's default (unless None/False or already in the help text) and keeps
    the examples in the epilog as written."""

    def _get_help_string(self, action):
        h = action.help or ""
        if ("default" in h or action.default in (None, False, argparse.SUPPRESS)
                or not action.option_strings):
            return h
        return h + " (default: %(default)s)"


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args, **kw):
        kw.setdefault("formatter_class", _HelpFormatter)
        super().__init__(*args, **kw)

    def error(self, message: str):  # one clear line, exit 2
        self.exit(2, f"parosim: error: {message}\n")


def _presets() -> list[str]:
    """Preset names for --help (a directory listing; nothing is parsed)."""
    from pathlib import Path

    env = os.environ.get("PAROSIM_TOPOLOGIES")
    d = Path(env) if env else Path(__file__).resolve().parents[1] / "topologies"
    return sorted(p.stem for p in d.glob("*.yaml")) if d.is_dir() else []


_MODE_HELP = ("engine: replay every operation of the step on the simpy flow-level network "
              "(overlap and link sharing exact; slower); analytic: closed form of one "
              "micro-step times --accum (fast; concurrent collectives do not share links)")

_EXAMPLES = {
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
}


def _common_cluster(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cluster", default="paper-a100-roce",
                   help=f"preset name ({', '.join(_presets()) or 'none found'}) or a YAML "
                   "path (default: paper-a100-roce)")
    p.add_argument("--nodes", type=int, default=None, help="override the node count")
    p.add_argument("--group-nodes", type=int, default=None,
                   help="nodes per PaRO group (default 1: a group is a node)")
    p.add_argument("--json", action="store_true", help="machine-readable result on stdout")


def _cmd_collective(a: argparse.Namespace) -> dict:
    from .cli_nccl import run as run_bench
    from .cli_nccl import wants_bench
    from .collectives import Op, Scope, parse_enum, simulate_collective
    from .io import load_cluster
    from .ncclbench import parse_algos
    from .units import parse_size

    if wants_bench(a):  # nccl-tests form: -b/-e/-f sweep or --compare LOG...
        if a.seed is not None:
            raise InputError("--seed goes with one collective, not with -b/-e/-f or "
                             "--compare; expected it without them")
        return run_bench(a)
    if a.plot or a.in_place:
        raise InputError("--plot and --in-place go with -b/-e/-f or --compare")
    spec = load_cluster(a.cluster, a.nodes, a.group_nodes)
    if a.seed is not None:  # the ECMP hash seed (a leaf-spine fabric with ecmp: hash)
        spec = _seeded(spec, a.seed)
    op = parse_enum(Op, "all-gather" if a.op is None else a.op, "--op")
    scope = parse_enum(Scope, a.scope, "--scope")
    algos = parse_algos("ho-ring" if a.algo is None else a.algo)
    size = parse_size(a.size if a.size is not None else "1GiB", "--size")
    results = [simulate_collective(spec, op, scope, size, al).to_dict() for al in algos]
    settings = {"nodes": spec.nodes, "gpus_per_node": spec.gpus_per_node,
                "group_nodes": spec.group_nodes, "size": a.size if a.size is not None
                else "1GiB", "nic_bandwidth_Bps": spec.nic.bandwidth_Bps,
                "intra_bandwidth_Bps": spec.intra.bandwidth_Bps}
    for r in results:
        r["cluster"] = spec.name
        r["settings"] = settings
    return results[0] if len(results) == 1 else {"results": results}


def _print_collective(res: dict) -> None:
    from .units import fmt_bytes, fmt_size, fmt_time

    if "rows" in res:  # nccl-tests form (sweep or --compare)
        from .cli_nccl import print_result

        return print_result(res)
    rows = res.get("results", [res])
    r0 = rows[0]
    print(f"{r0['op']} of {fmt_size(r0['size_bytes'])} over scope {r0['scope']} "
          f"(k = {r0['ring_size']} ranks per collective instance, the n of the busbw factor) "
          f"on {r0['cluster']}, {r0['gpus']} GPUs")
    print(f"{'algo':<14}{'time':>14}{'algbw GB/s':>12}{'busbw GB/s':>12}{'chunks':>8}   "
          "link class: bytes (busiest link busy)")
    for r in rows:
        links = ", ".join(f"{c}: {fmt_bytes(v['bytes'])} ({fmt_time(v['busy_s'])})"
                          for c, v in r["links"].items() if v["bytes"] > 0)
        print(f"{r['algo']:<14}{fmt_time(r['time_s']):>14}{r['algbw_GBps']:>12.2f}"
              f"{r['busbw_GBps']:>12.2f}{r['chunks']:>8}   {links}")


def _training_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="llama-7b",
                   help="a preset (llama-7b/13b/30b/65b, llama-2-7b/13b/70b, llama-3-8b/70b, "
                        "gpt3-175b, mpt-125m ... mpt-70b) or a YAML path")
    p.add_argument("--micro-batch", type=int, default=4, action=_Explicit,
                   help="sequences per GPU per micro-step")
    p.add_argument("--accum", type=int, default=10, action=_Explicit,
                   help="accumulation micro-steps s")
    p.add_argument("--global-batch", default=None, metavar="SEQS|TOKENS",
                   help="global batch per optimizer step, in sequences (2048) or tokens "
                   "(1Mitok = 2**20, 4Mtok = 4e6); sets --accum = global / (micro-batch x "
                   "data-parallel GPUs), as DeepSpeed's train_batch_size does")
    p.add_argument("--seq-len", type=int, default=512, help="tokens per sequence")
    p.add_argument("--trainable-ratio", default="full",
                   help="full | partial (1/16) | peft (3/1000) | a number in (0, 1]")
    p.add_argument("--recompute", default="auto",
                   choices=["auto", "on", "off", "full", "none", "selective"],
                   help="activation recomputation (auto: full only when needed to fit; "
                   "on = full, off = none; selective: the attention core only, with the "
                   "--tp/--pp model)")
    p.add_argument("--efficiency", type=float, default=None,
                   help="fraction of peak FLOP/s that compute achieves (default 0.5)")
    p.add_argument("--overlap-slowdown", type=float, default=None,
                   help="compute slowdown factor while a collective runs beside it (>= 1; "
                   "default: the cluster YAML's compute.overlap_slowdown, else the runtime's)")
    p.add_argument("--runtime", default=None,
                   help="framework schedule: ideal (default) | deepspeed | fsdp | paro | a YAML "
                   "path (see runtimes/ and docs/runtimes.md)")
    p.add_argument("--deepspeed-config", default=None, metavar="DS_CONFIG_JSON",
                   help="a DeepSpeed JSON config: stage, buckets, overlap_comm, micro-batch, "
                   "accumulation (implies --runtime deepspeed)")
    p.add_argument("--compute-model", default=None, choices=["flat", "kernel"],
                   help="flat: FLOPs at --efficiency of peak; kernel: per-kernel costs "
                        "(docs/compute.md); default: the cluster YAML's compute.model (flat)")
    p.add_argument("--attention", default=None, choices=["eager", "flash"],
                   help="attention kernel: eager (s x s scores stored) or flash "
                        "(FlashAttention / SDPA); default: the runtime's (eager for ideal, "
                        "deepspeed, paro; flash for fsdp)")
    p.add_argument("--memory-model", default=None, choices=["korthikanti", "runtime"],
                   help="korthikanti: Korthikanti et al. 2022 estimate; runtime: memory as "
                        "PyTorch runtimes keep it (docs/memory.md); default: the runtime's "
                        "(korthikanti for ideal, runtime for deepspeed / fsdp / paro)")
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
                   help="algorithm of TP collectives that cross nodes (default: --algo)")
    g.add_argument("--tp-comm-overlap", action="store_true",
                   help="Megatron-Core / Transformer Engine tp_comm_overlap: the sequence-"
                   "parallel all-gathers / reduce-scatters run in chunks beside their GEMMs "
                   "(needs --sequence-parallel; docs/parallelism.md)")
    g.add_argument("--dp-comm-overlap", action="store_true",
                   help="Megatron-Core overlap_grad_reduce + overlap_param_gather: the data-"
                   "parallel gradient reduction / parameter all-gather run bucket by bucket "
                   "beside the last backward / first forward (needs --tp or --pp >= 2 and "
                   "PaRO NNN, NNI or NNG; docs/parallelism.md)")


def _setup(a: argparse.Namespace):
    """model, cluster, training from the common flags (io + specs only)."""
    from .io import load_cluster
    from .io.model import load_model
    from .simulate import with_overrides
    from .training import DEFAULT_COMPUTE_EFFICIENCY, TrainingSpec, parse_trainable_ratio
    from .units import parse_bandwidth, parse_size

    model = load_model(a.model)
    cluster = load_cluster(a.cluster, a.nodes, a.group_nodes)
    cluster = with_overrides(
        cluster,
        None if a.nic_bandwidth is None else parse_bandwidth(a.nic_bandwidth, "--nic-bandwidth"),
        None if a.intra_bandwidth is None
        else parse_bandwidth(a.intra_bandwidth, "--intra-bandwidth"),
        None if a.gpu_memory is None else parse_size(a.gpu_memory, "--gpu-memory"))
    accum = a.accum
    if getattr(a, "global_batch", None) is not None:
        from .training import accum_for_global_batch

        dp = (cluster.gpus // (getattr(a, "tp", None) or 1) // (getattr(a, "pp", None) or 1)
              // (getattr(a, "cp", None) or 1))
        accum = accum_for_global_batch(a.global_batch, a.micro_batch, dp, a.seq_len)
        if getattr(a, "_given_accum", False) and a.accum != accum:
            raise InputError(f"--accum {a.accum} disagrees with --global-batch "
                             f"{a.global_batch} (which gives accum {accum}); expected one "
                             "of them")
    training = TrainingSpec(
        micro_batch=a.micro_batch, accum_steps=accum, seq_len=a.seq_len,
        trainable_ratio=parse_trainable_ratio(a.trainable_ratio),
        recompute={"auto": None, "on": True, "off": False, "full": True, "none": False,
                   "selective": False}[a.recompute],
        compute_efficiency=(DEFAULT_COMPUTE_EFFICIENCY if a.efficiency is None
                            else a.efficiency),
        overlap_slowdown=a.overlap_slowdown, compute_model=a.compute_model,
        attention=a.attention, memory_model=a.memory_model, logit_bytes=a.logit_bytes,
        precision=getattr(a, "precision", "bf16"))
    return model, cluster, training


def _runtime_setup(a: argparse.Namespace, cluster, training):
    """(runtime, training, strategy from the DeepSpeed config or None, config info)."""
    from dataclasses import replace

    from .io.runtime import deepspeed_config_runtime, load_runtime

    info = None
    name = a.runtime
    ds = getattr(a, "deepspeed_config", None)
    if ds and name not in (None, "deepspeed"):
        raise InputError(f"--deepspeed-config is read into --runtime deepspeed; got --runtime "
                         f"{name!r}; expected no --runtime or --runtime deepspeed")
    rt = load_runtime(name or ("deepspeed" if ds else "ideal"))
    strategy = None
    if ds:
        said: dict = {}
        rt, strategy, tr, no_effect = deepspeed_config_runtime(ds, rt, cluster.gpus, said)
        keys = said.get("keys", "")
        gb = getattr(a, "global_batch", None)
        for key, flag, what in (("micro_batch", "--micro-batch", "micro-batch"),
                                ("accum", "--accum", "accumulation")):
            given = getattr(a, key)
            explicit = getattr(a, f"_given_{key}", False) and not (key == "accum" and gb)
            if key in tr and explicit and given != tr[key]:
                raise InputError(f"{flag} {given} disagrees with --deepspeed-config {ds}: "
                                 f"{keys} (gives {what} {tr[key]}); expected one of them")
        training = replace(training, micro_batch=tr.get("micro_batch", training.micro_batch),
                           accum_steps=tr.get("accum", training.accum_steps))
        if gb is not None and keys:
            from .training import accum_for_global_batch

            seqs = training.micro_batch * training.accum_steps * cluster.gpus
            try:
                ok = accum_for_global_batch(gb, training.micro_batch, cluster.gpus,
                                            training.seq_len) == training.accum_steps
            except InputError:
                ok = False
            if not ok:
                raise InputError(f"--global-batch {gb} disagrees with --deepspeed-config "
                                 f"{ds}: {keys} (gives {seqs} sequences on {cluster.gpus} "
                                 "GPUs); expected one of them")
        if no_effect:
            print("parosim: note: DeepSpeed config keys without effect on the simulated step "
                  f"(not used): {', '.join(no_effect)}", file=sys.stderr)
        info = {"path": str(ds), "strategy": strategy, "no_effect_keys": no_effect}
    if rt.collective_algo is not None and getattr(a, "algo", None) not in (None,):
        raise InputError(f"--algo {a.algo} cannot apply: --runtime {rt.name} fixes each "
                         f"collective's algorithm ({rt.collective_algo}); expected no --algo, "
                         "or --runtime ideal")
    return rt, training, strategy, info


def _parallel(a: argparse.Namespace):
    """The ParallelSpec of the --tp / --pp / ... flags."""
    from .parallel import ParallelSpec

    return ParallelSpec(tp=a.tp, pp=a.pp, schedule=str(a.pp_schedule).strip().lower(),
                        virtual=a.virtual_stages, sequence_parallel=a.sequence_parallel,
                        selective_recompute=a.recompute == "selective", tp_algo=a.tp_algo,
                        tp_comm_overlap=bool(getattr(a, "tp_comm_overlap", False)),
                        dp_comm_overlap=bool(getattr(a, "dp_comm_overlap", False)),
                        cp=getattr(a, "cp", 1))


def _dp_keys(d: dict) -> dict:
    """Plain data parallelism in the 3D vocabulary: tp = pp = 1, dp = GPUs, no bubble."""
    for k, v in (("tp", 1), ("pp", 1), ("dp", d.get("gpus")), ("bubble_fraction", 0.0)):
        d.setdefault(k, v)
    return d


def _algos(text: str | None):
    """``--algo``: one algorithm, ``all``, or a comma list (``ring,ho-ring``)."""
    from .collectives import Algo
    from .ncclbench import parse_algos

    if text is None:
        return [Algo.HO_RING]
    return parse_algos(text)


# with --jobs only these simulate flags apply; every other one given is refused (a jobs file
# sets the per-job and cluster fields; per-step features like --repeats are not modelled)
_JOBS_OWN_FLAGS = ("command", "jobs", "json", "trace", "seed")


def _cmd_jobs(a: argparse.Namespace) -> dict:
    from .io.jobs import JOB_KEYS, TOP_KEYS, load_jobs
    from .io.trace import write_chrome_trace
    from .jobs import run_jobs

    defaults = vars(build_parser().parse_args(["simulate"]))
    for f, default in defaults.items():
        if f in _JOBS_OWN_FLAGS or getattr(a, f) == default:
            continue
        where = ("expected it in the jobs file (per job, or at its top level)"
                 if f in JOB_KEYS | TOP_KEYS else "it is not modelled for several jobs")
        raise InputError(f"--{f.replace('_', '-')} cannot be combined with --jobs; {where}")
    cluster, jobs, steps = load_jobs(a.jobs)
    r = run_jobs(_seeded(cluster, a.seed), jobs, steps, trace=bool(a.trace))
    out = r.to_dict()
    if a.trace:
        out["trace"] = str(write_chrome_trace(a.trace, r.records, f"{len(jobs)} jobs"))
    return out


def _print_jobs(r: dict) -> None:
    from .units import fmt_bytes

    print(f"{len(r['jobs'])} jobs on {r['cluster']} ({r['gpus']} GPUs), step times over "
          f"{r['steps_measured']} steps, all starting together")
    print(f"{'job':<10}{'model':<12}{'strategy':<10}{'algo':<14}{'GPUs':>6}{'alone s':>11}"
          f"{'shared s':>11}{'slowdown':>10}")
    for j in r["jobs"]:
        print(f"{j['name']:<10}{j['model']:<12}{j['strategy']:<10}{j['algo']:<14}"
              f"{j['gpus']:>6}{j['step_time_alone_s']:>11.3f}{j['step_time_shared_s']:>11.3f}"
              f"{j['slowdown']:>10.3f}")
    for j in r["jobs"]:
        st = j.get("settings") or {}
        if st:
            print(f"settings of {j['name']}: " + ", ".join(
                f"{k.replace('_', '-')} {v:g}" if isinstance(v, float) else
                f"{k.replace('_', '-')} {v}" for k, v in st.items()))
    print("busiest links (shared run):")
    for ln in r["busiest_links"]:
        print(f"  {ln['link']:<26}{ln['link_class']:<8}{ln['utilization']:>7.1%} busy, "
              f"{fmt_bytes(ln['bytes'])}, jobs {', '.join(ln['jobs']) or '-'}")
    if r.get("trace"):
        print(f"trace written to {r['trace']} (open in https://ui.perfetto.dev)")


def _seeded(spec, seed: int):
    from dataclasses import replace

    if seed < 0:
        raise InputError(f"--seed = {seed} must be a non-negative integer")
    if spec.network.ecmp == "hash":
        spec = replace(spec, network=replace(spec.network, ecmp_seed=seed))
    return spec


def _cmd_simulate(a: argparse.Namespace) -> dict:
    from .io.trace import write_chrome_trace, write_link_timeline
    from .simulate import simulate_step

    if getattr(a, "jobs", None):
        return _cmd_jobs(a)
    model, cluster, training = _setup(a)
    cluster = _seeded(cluster, a.seed)
    if a.jitter_cv is not None:
        from .specs import check_jitter_cv

        check_jitter_cv(a.jitter_cv, "--jitter-cv")
    if a.repeats < 1:
        raise InputError(f"--repeats = {a.repeats} must be a positive integer")
    rt, training, ds_strategy, info = _runtime_setup(a, cluster, training)
    if ds_strategy and a.strategy is not None:
        from .strategies import parse_strategy

        if parse_strategy(a.strategy).short != ds_strategy:
            raise InputError(f"--strategy {a.strategy} disagrees with the DeepSpeed config's "
                             f"stage ({ds_strategy}); expected one of them")
    strategy = ds_strategy or ("NIG" if a.strategy is None else a.strategy)
    algo = _algos(a.algo)
    if len(algo) != 1:
        raise InputError(f"--algo {a.algo} names {len(algo)} algorithms; a list or 'all' is "
                         "for 'parosim compare'; expected one of ring, hierarchical, ho-ring, "
                         "nccl")
    if a.trace and a.mode != "engine":
        raise InputError("--trace needs --mode engine (the analytic mode has no timeline)")
    per_rank = (cluster.compute_heterogeneous
                or (a.jitter_cv if a.jitter_cv is not None else cluster.jitter_cv) > 0)
    links = bool(a.link_timeline or (a.trace and per_rank))
    if a.link_timeline and a.mode != "engine":
        raise InputError("--link-timeline needs --mode engine (the analytic mode has no "
                         "timeline)")
    par = _parallel(a)
    if not par.trivial and (a.runtime or getattr(a, "deepspeed_config", None)):
        raise InputError("--tp / --pp / --cp / --sequence-parallel / --recompute selective "
                         "model the ideal runtime; expected no --runtime or --deepspeed-config")
    r = simulate_step(model, cluster, strategy, training, algo[0], a.mode,
                      trace=bool(a.trace), runtime=rt if par.trivial else None,
                      repeats=a.repeats, seed=a.seed, jitter_cv=a.jitter_cv,
                      record_links=links, parallel=par)
    out = _dp_keys(r.to_dict())
    out.update(model=model.name, cluster=cluster.name,
               settings=_settings(a, cluster, training, rt))
    if info:
        out["deepspeed_config"] = info
    timeline = [(d["time_s"], d["utilization"]) for d in out.pop("link_timeline", [])]
    if a.trace and r.fits:
        out["trace"] = str(write_chrome_trace(a.trace, r.records,
                                              f"{r.strategy.name} {model.name}",
                                              timeline or None))
    if a.link_timeline and r.fits:
        out["link_timeline"] = str(write_link_timeline(a.link_timeline, timeline))
    if a.plot and r.fits:
        from .plots_hetero import plot_step_distribution

        out["plot"] = str(plot_step_distribution(
            out.get("step_times_s", [r.step_time_s]), a.plot,
            f"{model.name} {r.strategy.name} on {cluster.name} ({cluster.gpus} GPUs)"))
    return out


_COLS = (("strategy", 10, "<"), ("algo", 12, "<"), ("step s", 9, ">"),
         ("tokens/s", 10, ">"), ("TFLOPS", 7, ">"), ("MFU", 6, ">"), ("exposed s", 10, ">"),
         ("inter/GPU", 11, ">"), ("memory/GPU", 11, ">"), ("recomp", 7, ">"))


def _line(cells: list[str], w: int = 10) -> str:
    """Columns of :data:`_COLS` (the strategy column ``w`` wide), two spaces apart: a long
    value never runs into the next."""
    widths = [w] + [c[1] for c in _COLS[1:]]
    return "  ".join(f"{c:{col[2]}{wd}}" for c, col, wd in zip(cells, _COLS, widths,
                                                               strict=False))


def _row(r: dict, w: int = 10) -> str:
    from .units import fmt_bytes

    mem = r["memory"]
    recomp = "yes" if mem.get("recompute") else "no"
    if not r["fits"]:
        lacks = "does not fit: lacks " + fmt_bytes(mem["shortfall_bytes"])
        return (_line([_name(r), r["algo"]], w) + "  " + f"{lacks:<60}" + "  "
                + f"{fmt_bytes(mem['total_bytes']):>11}  {recomp:>7}")
    return _line([_name(r), r["algo"], f"{r['step_time_s']:.3f}", f"{r['tokens_per_s']:.0f}",
                  f"{r['tflops_per_gpu']:.1f}", f"{r['mfu']:.3f}",
                  f"{r['exposed_comm_s']:.3f}", fmt_bytes(r["bytes_inter"]),
                  fmt_bytes(mem["total_bytes"]), recomp], w)


_HEADER = _line([c[0] for c in _COLS])
_FOOTER = ("TFLOPS: hardware FLOP/s per GPU, recomputation included; MFU: model FLOPs (no "
           "recomputation) / peak; recomp: activation recomputation on")


def _name(r: dict) -> str:
    """``NGG (ZeRO-2)``: the framework name beside the PaRO name, when there is one (the
    runtime's stage, else the strategy's usual framework name)."""
    from .strategies import FRAMEWORK_NAMES

    st = r.get("framework_stage")
    short = r["strategy"].replace("PaRO-", "")
    st = st or FRAMEWORK_NAMES.get(short)
    return f"{r['strategy']} ({st})" if st else r["strategy"]


def _settings(a: argparse.Namespace, cluster, training, rt=None) -> dict:
    """Every input that shaped the result (echoed in the JSON and the text header)."""
    dp = (cluster.gpus // (getattr(a, "tp", None) or 1) // (getattr(a, "pp", None) or 1)
          // (getattr(a, "cp", None) or 1))
    out = {"nodes": cluster.nodes, "gpus_per_node": cluster.gpus_per_node,
           "group_nodes": cluster.group_nodes, "micro_batch": training.micro_batch,
           "accum_steps": training.accum_steps, "seq_len": training.seq_len,
           "data_parallel": dp,
           "global_batch_seqs": training.micro_batch * training.accum_steps * dp,
           "global_batch_tokens": (training.micro_batch * training.accum_steps * dp
                                   * training.seq_len),
           "trainable_ratio": training.trainable_ratio,
           "recompute": getattr(a, "recompute", "auto"),
           "compute_efficiency": training.compute_efficiency,
           "overlap_slowdown": training.overlap_slowdown,
           "nic_bandwidth_Bps": cluster.nic.bandwidth_Bps,
           "intra_bandwidth_Bps": cluster.intra.bandwidth_Bps,
           "gpu_memory_bytes": cluster.gpu.memory_bytes,
           "overrides": {k: v for k, v in (("nic_bandwidth", a.nic_bandwidth),
                                           ("intra_bandwidth", a.intra_bandwidth),
                                           ("gpu_memory", a.gpu_memory)) if v is not None}}
    for k in ("compute_model", "attention", "memory_model", "precision"):
        if hasattr(training, k):
            out[k] = getattr(training, k)
    if hasattr(a, "tp_comm_overlap"):
        out["tp_comm_overlap"] = bool(a.tp_comm_overlap)
    if hasattr(a, "dp_comm_overlap"):
        out["dp_comm_overlap"] = bool(a.dp_comm_overlap)
    if (getattr(a, "cp", None) or 1) > 1:   # the key appears only with context parallelism
        out["context_parallel"] = a.cp
    if rt is not None:
        out["runtime"] = rt.name
    return out


def _settings_text(s: dict) -> str:
    ratio = s["trainable_ratio"]
    names = {1.0: "full", 1 / 16: "partial", 3 / 1000: "peft"}
    parts = [f"micro-batch {s['micro_batch']}", f"accum {s['accum_steps']}",
             f"seq-len {s['seq_len']}",
             f"global batch {s['global_batch_seqs']} seqs = {s['global_batch_tokens']} tokens",
             f"trainable ratio {ratio:g}" + (f" ({names[ratio]})" if ratio in names else ""),
             f"recompute {s['recompute']}", f"efficiency {s['compute_efficiency']:g}"]
    if s.get("overlap_slowdown") is not None:
        parts.append(f"overlap slowdown {s['overlap_slowdown']:g}")
    if s.get("tp_comm_overlap"):
        parts.append("TP comm overlap on")
    if s.get("dp_comm_overlap"):
        parts.append("DP comm overlap on")
    if s.get("context_parallel", 1) > 1:
        parts.append(f"context parallel {s['context_parallel']} (ring attention)")
    if s.get("precision", "bf16") != "bf16":
        parts.append(f"precision {s['precision']}")
    if s.get("attention"):
        parts.append(f"compute model {s.get('compute_model') or 'cluster default'}, "
                     f"attention {s['attention']}")
    if s["overrides"]:
        parts.append("overrides: " + ", ".join(f"{k.replace('_', '-')} {v}"
                                                for k, v in s["overrides"].items()))
    return "settings: " + ", ".join(parts)


def _width(rows: list[dict]) -> int:
    """Width of the strategy column: 10, or the longest name with its stage."""
    return max([10] + [len(_name(r)) for r in rows])


def _header(w: int) -> str:
    return _line([c[0] for c in _COLS], w)


def _print_simulate(r: dict) -> None:
    """One row; a configuration that does not fit shows its shortfall (and exits 2)."""
    if "jobs" in r:
        return _print_jobs(r)
    print(f"{r['model']} on {r['cluster']} ({r['gpus']} GPUs), mode {r['mode']}, runtime "
          f"{r.get('runtime', 'ideal')}")
    if "settings" in r:
        print(_settings_text(r["settings"]))
    w = _width([r])
    print(_header(w))
    print(_row(r, w))
    print(_FOOTER)
    if r.get("pp_schedule") and r.get("fits"):   # tensor / pipeline parallelism
        print(f"TP {r['tp']} x PP {r['pp']} ({r['pp_schedule']}, {r['virtual_stages']} "
              f"chunk(s) per stage) x DP {r['dp']}"
              f"{' x CP ' + str(r['cp']) if r.get('cp') else ''}, {r['micro_batches']} "
              "micro-batches, "
              f"bubble {100 * (r['bubble_fraction'] or 0):.1f} %, recompute "
              f"{r['recompute_mode']}{', sequence parallel' if r['sequence_parallel'] else ''}"
              f"{', TP comm overlap' if r.get('tp_comm_overlap') else ''}"
              f"{', DP comm overlap' if r.get('dp_comm_overlap') else ''}")
    if r.get("critical_rank") is not None:
        print(f"over {r['repeats']} step(s) (seed {r['seed']}, jitter cv {r['jitter_cv']}): "
              f"mean {r['step_time_s']:.4f} s, p50 {r['step_time_p50_s']:.4f} s, "
              f"p90 {r['step_time_p90_s']:.4f} s, p99 {r['step_time_p99_s']:.4f} s; "
              f"critical rank {r['critical_rank']} ({r['critical_rank_share']:.0%} of steps)")
    hot = r.get("hot_links") or []
    if hot and r.get("critical_rank") is not None:
        print("hottest links: " + ", ".join(f"{h['link']} {h['utilization']:.0%}"
                                            for h in hot[:3]))
    if r.get("plot"):
        print(f"step-time distribution plotted to {r['plot']}")
    if r.get("trace"):
        print(f"trace written to {r['trace']} (open in https://ui.perfetto.dev)")


def _cmd_compare(a: argparse.Namespace) -> dict:
    from .simulate import compare

    _check_workers(a.workers)
    model, cluster, training = _setup(a)
    rt, training, _, info = _runtime_setup(a, cluster, training)
    par = _parallel(a)
    rows = [_dp_keys(r.to_dict())
            for r in compare(model, cluster, training, _algos(a.algo), a.mode,
                             workers=a.workers, runtime=rt if par.trivial else a.runtime,
                             parallel=par)]
    if not par.trivial and getattr(a, "deepspeed_config", None):
        raise InputError("--tp / --pp / --cp / --sequence-parallel / --recompute selective "
                         "model the ideal runtime; expected no --deepspeed-config")
    out = {"model": model.name, "cluster": cluster.name, "gpus": cluster.gpus,
           "mode": a.mode, "runtime": rt.name,
           "settings": _settings(a, cluster, training, rt), "results": rows}
    if info:
        out["deepspeed_config"] = info
    return out


def _print_compare(res: dict) -> None:
    print(f"{res['model']} on {res['cluster']} ({res['gpus']} GPUs), mode {res['mode']}, "
          f"runtime {res.get('runtime', 'ideal')}, best first")
    if "settings" in res:
        print(_settings_text(res["settings"]))
    w = _width(res["results"])
    print(f"{'#':>3}  " + _header(w))
    for i, r in enumerate(res["results"], 1):
        print(f"{i:>3}  " + _row(r, w))
    print(_FOOTER)


def _cmd_memory(a: argparse.Namespace) -> dict:
    from .memory import max_micro_batch, memory_breakdown
    from .simulate import memory_dict
    from .strategies import ALL_STRATEGIES, parse_strategy

    model, cluster, training = _setup(a)
    rt, training, ds_strategy, info = _runtime_setup(a, cluster, training)
    if ds_strategy and a.strategy not in ("all", None) and \
            parse_strategy(a.strategy).short != ds_strategy:
        raise InputError(f"--strategy {a.strategy} disagrees with the DeepSpeed config's "
                         f"stage ({ds_strategy}); expected one of them")
    if ds_strategy:
        strategies = [parse_strategy(ds_strategy)]
    elif a.strategy == "all":
        strategies = [s for s in ALL_STRATEGIES if rt.supports(s.short)]
    else:
        strategies = [parse_strategy(a.strategy)]
    rows = []
    par = _parallel(a)
    if not par.trivial and (a.runtime or getattr(a, "deepspeed_config", None)):
        raise InputError("--tp / --pp / --cp / --sequence-parallel / --recompute selective "
                         "model the ideal runtime; expected no --runtime or --deepspeed-config")
    for s in strategies:
        if not par.trivial:
            from .parallel import layout_for
            from .plan3d import max_micro_batch_3d, memory_3d

            d = memory_dict(s, cluster.gpus, memory_3d(model, s, cluster, training, par))
            d["max_micro_batch"] = max_micro_batch_3d(model, s, cluster, training, par)
            d.update(tp=par.tp, pp=par.pp,
                     dp=layout_for(cluster, par.tp, par.pp).d // par.cp)
            if par.cp > 1:
                d["cp"] = par.cp
            rows.append(d)
            continue
        rt.require(s.short)
        d = memory_dict(s, cluster.gpus, memory_breakdown(model, s, cluster, training, rt))
        d["max_micro_batch"] = max_micro_batch(model, s, cluster, training, runtime=rt)
        d["runtime"], d["framework_stage"] = rt.name, rt.stage(s.short)
        rows.append(d)
    res = dict(rows[0]) if len(rows) == 1 else {"results": rows}
    res.update(model=model.name, cluster=cluster.name,
               settings=_settings(a, cluster, training, rt))
    return res


def _print_memory(res: dict) -> None:
    from .units import fmt_bytes

    rows = res.get("results", [res])
    if "model" in res:
        print(f"{res['model']} on {res['cluster']} ({rows[0]['gpus']} GPUs), memory per GPU")
    if "settings" in res:
        print(_settings_text(res["settings"]))
    w = _width(rows)
    print(f"{'strategy':<{w}}{'states':>11}{'activ.':>11}{'buffers':>11}{'margin':>11}"
          f"{'total':>11}{'capacity':>11}  fits  recomp  max micro-batch")
    for r in rows:
        print(f"{_name(r):<{w}}{fmt_bytes(r['model_states_bytes']):>11}"
              f"{fmt_bytes(r['activations_bytes']):>11}{fmt_bytes(r['buffers_bytes']):>11}"
              f"{fmt_bytes(r['margin_bytes']):>11}{fmt_bytes(r['total_bytes']):>11}"
              f"{fmt_bytes(r['capacity_bytes']):>11}  {'yes ' if r['fits'] else 'NO  '}"
              f"  {'yes' if r.get('recompute') else 'no':<6}  {r['max_micro_batch']}"
              + ("" if r["fits"] else f"   (lacks {fmt_bytes(r['shortfall_bytes'])})"))


MAX_WORKERS = 256  # local processes (docs/limits.md); a larger pool is a cluster: --scheduler


def _check_workers(n: int) -> None:
    if n < 1:
        raise InputError(f"--workers = {n} must be a positive integer")
    if n > MAX_WORKERS:
        raise InputError(f"--workers = {n} is more than {MAX_WORKERS} local processes; expected "
                         f"at most {MAX_WORKERS} (this machine has {os.cpu_count()} CPUs)")


def _cmd_sweep(a: argparse.Namespace) -> dict:
    from .sweep import run_sweep_cli

    _check_workers(a.workers)
    return run_sweep_cli(a.spec, a.out, a.workers, a.scheduler, progress=not a.no_progress)


def _print_sweep(res: dict) -> None:
    print(f"{res['name']}: {res['points']} points ({res['skipped']} resumed, {res['done']} run, "
          f"{res['failed']} not ok) in {res['wall_s']:.1f} s -> {res['results']}")
    for f in res.get("figures", []):
        print(f"  figure: {f}")


def _cmd_validate(a: argparse.Namespace) -> dict:
    try:
        import torch  # noqa: F401 - only `validate` needs it (the optional extra)
    except ImportError:
        raise InputError("parosim validate needs torch, which is not installed; install the "
                         "extra with: pip install -e \".[validate]\"") from None
    from .validate.cli import run_validate

    return run_validate(a)


def _print_validate(res: dict) -> None:
    from .validate.cli import format_table

    print(format_table(res))


def _cmd_run(a: argparse.Namespace) -> dict:
    from .run import (
        LLAMA3_GPU_MTBF_S,
        LLAMA3_NODE_MTBF_S,
        best_interval,
        parse_count,
        run_from_step,
        run_report,
        simulate_run,
    )
    from .simulate import simulate_step
    from .units import parse_time

    if a.replications < 1:
        raise InputError(f"--replications = {a.replications} must be a positive integer")
    if a.search_points > 10_000:
        raise InputError(f"--search-points = {a.search_points} is more than 10000; expected "
                         "a few tens")
    if a.repeats > 10_000:
        raise InputError(f"--repeats = {a.repeats} is more than 10000 steps; expected fewer")
    if a.seed < 0:
        raise InputError(f"--seed = {a.seed} must be a non-negative integer")
    tokens = parse_count(a.tokens, "--tokens")
    mtbf = {}
    for flag, val, default in (("--gpu-mtbf", a.gpu_mtbf, LLAMA3_GPU_MTBF_S),
                               ("--node-mtbf", a.node_mtbf, LLAMA3_NODE_MTBF_S)):
        if val is None:
            mtbf[flag] = default
        elif str(val).strip().lower() in ("none", "inf", "never"):
            mtbf[flag] = None
        else:
            mtbf[flag] = parse_time(val, flag, allow_zero=False)
    if mtbf["--gpu-mtbf"] is None and mtbf["--node-mtbf"] is None:
        raise InputError("--gpu-mtbf and --node-mtbf are both 'none'; expected at least one "
                         "failure rate (e.g. --gpu-mtbf 50000h)")
    ckpt = parse_time(a.checkpoint_time, "--checkpoint-time")
    restart = parse_time(a.restart_time, "--restart-time")
    if a.repeats < 1:
        raise InputError(f"--repeats = {a.repeats} must be a positive integer")
    if a.jitter_cv is not None:
        from .specs import check_jitter_cv

        check_jitter_cv(a.jitter_cv, "--jitter-cv")
    model, cluster, training = _setup(a)
    cluster = _seeded(cluster, a.seed)
    rt, training, ds_strategy, _ = _runtime_setup(a, cluster, training)
    if ds_strategy and a.strategy is not None:
        from .strategies import parse_strategy

        if parse_strategy(a.strategy).short != ds_strategy:
            raise InputError(f"--strategy {a.strategy} disagrees with the DeepSpeed config's "
                             f"stage ({ds_strategy}); expected one of them")
    strategy = ds_strategy or a.strategy or "NIG"
    algo = _algos(a.algo)
    if len(algo) != 1:
        raise InputError(f"--algo {a.algo} names {len(algo)} algorithms; a list or 'all' is "
                         "for 'parosim compare'; expected one of ring, hierarchical, ho-ring, "
                         "nccl")
    if not _parallel(a).trivial:
        raise InputError("'parosim run' draws data-parallel steps; --tp / --pp / "
                         "--sequence-parallel / --recompute selective are for simulate, compare "
                         "and memory (expected none of them here)")
    r = simulate_step(model, cluster, strategy, training, algo[0], a.mode, runtime=rt,
                      repeats=a.repeats, seed=a.seed, jitter_cv=a.jitter_cv)
    if not r.fits:
        raise InputError(f"{r.strategy.name} does not fit in GPU memory (short by "
                         f"{r.memory.shortfall_bytes:.0f} bytes per GPU); expected a "
                         "configuration that fits, see 'parosim memory'")
    tps = training.tokens_per_gpu_step * cluster.gpus
    samples = tuple((getattr(r, "extra", None) or {}).get("step_times_s") or ())
    spec = run_from_step(r.step_time_s, tps, tokens, cluster.gpus, cluster.nodes, ckpt,
                         restart, mtbf["--gpu-mtbf"], mtbf["--node-mtbf"], samples)
    search = best_interval(spec, a.replications, a.seed, a.search_points)
    fixed = None
    if a.checkpoint_interval is not None:
        tau = parse_time(a.checkpoint_interval, "--checkpoint-interval", allow_zero=False)
        k = max(1, min(spec.steps, round(tau / spec.step_time_s)))
        fixed = simulate_run(spec, k, a.replications, a.seed)
    out = run_report(search, tokens, tps, fixed)
    out.update(model=model.name, cluster=cluster.name, strategy=r.strategy.name,
               algo=r.algo.value, mode=a.mode, seed=a.seed, runtime=rt.name,
               settings=_settings(a, cluster, training, rt))
    return out


def _print_run(r: dict) -> None:
    def dur(s: float) -> str:
        return f"{s / 86400:.2f} days" if s >= 86400 else f"{s / 3600:.2f} h"

    print(f"{r['model']} {r['strategy']} ({r['algo']}) on {r['cluster']}, {r['gpus']} GPUs: "
          f"{r['tokens']:.3g} tokens in {r['steps']} steps of {r['step_time_s']:.3f} s")
    print(f"job MTBF {r['job_mtbf_s'] / 3600:.2f} h, checkpoint {r['checkpoint_s']:g} s, "
          f"restart {r['restart_s']:g} s, {r['replications']} replications, seed {r['seed']}")
    if "settings" in r:
        print(_settings_text(r["settings"]))
    print(f"best checkpoint interval  {r['best_checkpoint_interval_s']:.0f} s "
          f"(Young {r['young_interval_s']:.0f} s, Daly {r['daly_interval_s']:.0f} s)")
    print(f"goodput                   {r['goodput']:.4f} (Daly {r['daly_goodput']:.4f})")
    print(f"wall clock                {dur(r['wall_clock_s'])} (p90 "
          f"{dur(r['wall_clock_p90_s'])}; without failures {dur(r['useful_s'])})")
    print(f"failures                  {r['failures']:.1f} ({r['failures_gpu']:.1f} GPU, "
          f"{r['failures_node']:.1f} node)")
    print(f"lost work                 {dur(r['lost_work_s'])}; restarts "
          f"{dur(r['restart_s_total'])}; checkpoint writes {dur(r['checkpoint_s_total'])}")
    if r["failures_simulated"] < 200:
        print(f"note: only {r['failures_simulated']:.0f} failures were simulated in all; the "
              "best interval is uncertain (raise --replications)")
    if "at_interval" in r:
        f = r["at_interval"]
        print(f"at interval {f['interval_s']:.0f} s: goodput {f['goodput']:.4f}, wall clock "
              f"{dur(f['wall_clock_s'])}")


def _cmd_calibrate(a: argparse.Namespace) -> dict:
    from .cli_calibrate import run

    return run(a)


def _print_calibrate(res: dict) -> None:
    from .cli_calibrate import print_result

    print_result(res)


def _cmd_advise(a: argparse.Namespace) -> dict:
    from .advise import advise, parse_global_batch
    from .io import load_cluster
    from .io.model import load_model
    from .simulate import with_overrides
    from .units import parse_size

    if a.cp != 1:
        raise InputError(f"--cp {a.cp}: advise does not search context parallelism (its "
                         "screen has no ring-attention term); expected --cp 1, and parosim "
                         "simulate --cp N for a given configuration")
    model = load_model(a.model)
    cluster = load_cluster(a.cluster, a.nodes, None)
    if a.gpu_memory:
        cluster = with_overrides(cluster, gpu_memory_bytes=parse_size(a.gpu_memory,
                                                                      "--gpu-memory"))
    if a.seq_len < 1:
        raise InputError(f"--seq-len = {a.seq_len} must be a positive integer")
    batch = parse_global_batch(a.global_batch, a.seq_len)
    strategies = None if a.strategies == "all" else [
        s for s in a.strategies.split(",") if s.strip()]
    if a.efficiency is not None and not 0 < a.efficiency <= 1:
        raise InputError(f"--efficiency = {a.efficiency} must be a fraction in (0, 1]")
    if a.plot:
        from .advise_plot import plot_path

        plot_path(a.plot)
    res = advise(model, cluster, batch, a.seq_len, a.top, a.engine_top, a.max_micro_batch,
                 strategies, a.efficiency, tp_comm_overlap=a.tp_comm_overlap,
                 dp_comm_overlap=a.dp_comm_overlap)
    if a.plot:
        from .advise_plot import save_pareto

        res["plot"] = save_pareto(res, a.plot)
    res["settings"] = {
        "global_batch": a.global_batch, "seq_len": a.seq_len, "top": a.top,
        "engine_top": a.engine_top, "max_micro_batch": a.max_micro_batch,
        "strategies": a.strategies,
        "compute_efficiency": a.efficiency if a.efficiency is not None else "default",
        "tp_comm_overlap": a.tp_comm_overlap,
        "dp_comm_overlap": a.dp_comm_overlap,
        "gpu_memory_bytes": cluster.gpu.memory_bytes,
        "overrides": {"gpu_memory": a.gpu_memory} if a.gpu_memory else {}}
    if a.json:
        res = {k: v for k, v in res.items() if k not in ("points", "top_labels")}
    return res


def _print_advise(res: dict) -> None:
    from .advise import format_advice

    print(format_advice(res))
    s = res.get("settings")
    if s:
        print("settings: " + ", ".join(f"{k.replace('_', '-')} {v}" for k, v in s.items()
                                       if k != "overrides")
              + ("" if not s["overrides"] else
                 ", overrides: " + ", ".join(f"{k.replace('_', '-')} {v}"
                                             for k, v in s["overrides"].items())))


COMMANDS: dict[str, tuple[Callable, Callable | None]] = {
    "advise": (_cmd_advise, _print_advise),
    "calibrate": (_cmd_calibrate, _print_calibrate),
    "sweep": (_cmd_sweep, _print_sweep),
    "validate": (_cmd_validate, _print_validate),
    "collective": (_cmd_collective, _print_collective),
    "simulate": (_cmd_simulate, _print_simulate),
    "compare": (_cmd_compare, _print_compare),
    "memory": (_cmd_memory, _print_memory),
    "run": (_cmd_run, _print_run),
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser; ``command`` (the subcommand about to run, if known) skips building the
    options of the others that would cost imports."""
    p = _Parser(prog="parosim", description="Simulate data-parallel LLM training with PaRO "
                "strategies and Ring / hierarchical / HO-Ring collectives.")
    p.add_argument("--version", action=_VersionAction)  # reads the metadata only when asked
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    c = sub.add_parser("collective", epilog=_EXAMPLES["collective"],
                       help="simulate one collective")
    c.add_argument("--op", default=None,
                   help="all-gather (default) | reduce-scatter | all-reduce")
    c.add_argument("--size", default=None,
                   help="full buffer as nccl-tests counts it (AG output, RS input, AR buffer); "
                   "default 1GiB")
    c.add_argument("--scope", default="global", help="global | intra | inter")
    c.add_argument("--algo", default=None,
                   help="ring | hierarchical | ho-ring | nccl | all, or a comma list (default "
                   "ho-ring; with --compare: nccl)")
    from .cli_nccl import add_arguments as _nccl_args

    _nccl_args(c)
    c.add_argument("--seed", type=int, default=None,
                   help="ECMP hash seed (leaf-spine with ecmp: hash; default the cluster's)")
    _common_cluster(c)

    s = sub.add_parser("simulate", epilog=_EXAMPLES["simulate"],
                       help="simulate one training step of one strategy")
    s.add_argument("--strategy", default=None,
                   help="e.g. NIG, PaRO-NIG, zero3, ddp (default NIG)")
    s.add_argument("--algo", "--collective", dest="algo", default=None,
                   help="ring | hierarchical | ho-ring | nccl (default ho-ring; set by --runtime "
                   "deepspeed / fsdp / paro)")
    s.add_argument("--mode", default="engine", choices=["engine", "analytic"], help=_MODE_HELP)
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
    _training_args(s)
    _common_cluster(s)

    cmp_ = sub.add_parser("compare", epilog=_EXAMPLES["compare"],
                       help="all 14 strategies ranked (the main job)")
    cmp_.add_argument("--algo", "--collective", dest="algo", default=None,
                      help="ring | hierarchical | ho-ring | nccl | all (default ho-ring; set by "
                      "--runtime deepspeed / fsdp / paro)")
    cmp_.add_argument("--mode", default="engine", choices=["engine", "analytic"],
                      help=_MODE_HELP)
    cmp_.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1),
                      help="processes to simulate in (default: up to 2)")
    _training_args(cmp_)
    _common_cluster(cmp_)

    sw = sub.add_parser("sweep", epilog=_EXAMPLES["sweep"],
                       help="a grid of configurations, parallel and resumable")
    sw.add_argument("spec", help="sweep spec YAML (see experiments/)")
    sw.add_argument("--out", required=True, help="output directory (results.csv, figures/)")
    sw.add_argument("--workers", type=int, default=2, help="local worker processes")
    sw.add_argument("--scheduler", default=None,
                    help="address of a running dask.distributed scheduler (tcp://host:8786)")
    sw.add_argument("--no-progress", action="store_true", help="no progress bar")
    sw.add_argument("--json", action="store_true", help="summary as JSON")

    v = sub.add_parser("validate", help="run the same schedule on real torch.distributed "
                       "ranks and report simulated vs measured")
    if command in (None, "validate"):  # its options import the harness: only when needed
        from .validate.cli import add_arguments as _validate_args

        _validate_args(v)
    v.add_argument("--json", action="store_true", help="the result as JSON")

    rn = sub.add_parser("run", help="a whole training run with failures: goodput, wall clock, "
                        "best checkpoint interval (Monte-Carlo, see docs/runs-and-jobs.md)")
    rn.add_argument("--strategy", default=None,
                    help="e.g. NIG, PaRO-NIG, zero3, ddp (default NIG)")
    rn.add_argument("--algo", "--collective", dest="algo", default=None,
                    help="ring | hierarchical | ho-ring (default ho-ring; set by --runtime "
                    "deepspeed / fsdp / paro)")
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
    _training_args(rn)
    _common_cluster(rn)

    cal = sub.add_parser("calibrate", help="fit a cluster to measurements (nccl-tests logs) "
                         "and write a cluster YAML")
    if command in (None, "calibrate"):  # its options import calibrate_steps: only when needed
        from .cli_calibrate import add_arguments as _calibrate_args

        _calibrate_args(cal)

    ad = sub.add_parser("advise", help="the fastest TP / PP / PaRO / micro-batch / "
                        "recomputation / algorithm configurations for a global batch")
    ad.add_argument("--model", default="llama-7b", help="preset name or YAML path")
    ad.add_argument("--global-batch", required=True,
                    help="sequences (2048, 2048seq) or tokens (4Mtok, 4194304tokens)")
    ad.add_argument("--seq-len", type=int, default=2048, help="tokens per sequence "
                    "(default 2048)")
    ad.add_argument("--top", type=int, default=5, help="configurations to print (default 5)")
    ad.add_argument("--engine-top", type=int, default=3,
                    help="best configurations replayed on the engine (default 3)")
    ad.add_argument("--max-micro-batch", type=int, default=16,
                    help="largest micro-batch tried (powers of 2; default 16)")
    ad.add_argument("--strategies", default="all",
                    help="comma-separated PaRO strategies to search (default all 14)")
    ad.add_argument("--efficiency", type=float, default=None,
                    help="fraction of peak FLOP/s compute achieves (default 0.5)")
    ad.add_argument("--gpu-memory", default=None, help="override GPU memory, e.g. 40GB")
    ad.add_argument("--cp", type=int, default=1,
                    help="context parallelism is not searched: only 1 is accepted (use "
                    "simulate --cp)")
    ad.add_argument("--tp-comm-overlap", action="store_true",
                    help="sequence-parallel configurations run with Megatron-Core's TP "
                    "communication overlap (a fixed setting, not searched)")
    ad.add_argument("--dp-comm-overlap", action="store_true",
                    help="TP/PP configurations with PaRO NNN, NNI or NNG run with Megatron-"
                    "Core's DP communication overlap (a fixed setting, not searched)")
    ad.add_argument("--plot", default=None, help="write the memory-vs-throughput Pareto "
                    "plot to FILE (.png, .svg, .pdf)")
    ad.add_argument("--cluster", default="dgx-a100-ib",
                    help="preset name or YAML path (default: dgx-a100-ib)")
    ad.add_argument("--nodes", type=int, default=None, help="override the node count")
    ad.add_argument("--json", action="store_true", help="machine-readable result on stdout")

    m = sub.add_parser("memory", epilog=_EXAMPLES["memory"],
                       help="memory breakdown per GPU, fits or not")
    m.add_argument("--strategy", default="all", help="a strategy or 'all'")
    _training_args(m)
    _common_cluster(m)
    return p


# Internal field names that core modules put in messages -> the flags a CLI user typed.
_FLAGS = {"micro_batch": "--micro-batch", "accum_steps": "--accum", "seq_len": "--seq-len",
          "compute_efficiency": "--efficiency", "overlap_slowdown": "--overlap-slowdown",
          "trainable ratio": "--trainable-ratio", "trainable_ratio": "--trainable-ratio",
          "nodes": "--nodes", "group_nodes": "--group-nodes"}


def _flag_names(msg: str) -> str:
    """``micro_batch = 0 must be ...`` -> ``--micro-batch = 0 must be ...``."""
    for field_name, flag in _FLAGS.items():
        if msg.startswith(field_name + " "):
            return flag + msg[len(field_name):]
    return msg


class _VersionAction(argparse.Action):
    """``--version``: like argparse's ``version`` action, the version read when used."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS,
                 help="show program's version number and exit"):
        super().__init__(option_strings=option_strings, dest=dest, default=default, nargs=0,
                         help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        parser._print_message(f"parosim {_version()}\n", sys.stdout)
        parser.exit()


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("parosim")
    except Exception:  # noqa: BLE001 - not installed (run from a checkout)
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    first = next((x for x in args if not x.startswith("-")), None)
    parser = build_parser(first if first in COMMANDS else None)
    a = parser.parse_args(args)
    run, show = COMMANDS[a.command]
    try:
        res = run(a)
    except InputError as e:
        msg = str(e) if a.command == "sweep" else _flag_names(str(e))  # sweep: YAML keys
        print(f"parosim: error: {msg}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("parosim: interrupted (a sweep resumes when run again)", file=sys.stderr)
        return 130
    try:
        if getattr(a, "json", False) or show is None:
            json.dump(res, sys.stdout, indent=2, sort_keys=False)
            sys.stdout.write("\n")
        else:
            show(res)
        sys.stdout.flush()
    except BrokenPipeError:  # `parosim ... | head`: the reader left; not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    if a.command == "simulate" and res.get("fits") is False:
        # the breakdown is printed above (nothing computed is lost); the step was not
        # simulated, which the exit code says
        from .units import fmt_bytes

        mem = res["memory"]
        print(f"parosim: error: {res['strategy']} does not fit: it needs "
              f"{fmt_bytes(mem['total_bytes'])} per GPU and the GPU has "
              f"{fmt_bytes(mem['capacity_bytes'])} (short by "
              f"{fmt_bytes(mem['shortfall_bytes'])}); expected a configuration that fits, "
              "see 'parosim memory'", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
