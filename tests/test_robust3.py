"""Robustness campaign 3: nccl-tests logs of large runs and older formats, DeepSpeed configs
against explicit flags, cluster overrides, errors that name the real input, extreme values,
tiny buckets and repeat caps.

Every CLI case runs ``parosim.cli.main`` in this process under a wall-clock alarm and checks
either ``ERR(needle)`` (exit 2, one stderr line ``parosim: error: ...`` holding ``needle``,
no traceback) or ``OK`` (exit 0). nccl-tests logs are generated here in the real format (one
``# Rank`` line per rank, current and older versions) with the simulator's own times.
"""

from __future__ import annotations

import json
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

from parosim.errors import InputError
from parosim.io.nccltests import parse_nccl_tests, read_nccl_tests

REALDATA = Path(__file__).resolve().parent / "data" / "nccl-tests"   # published logs


# --- nccl-tests logs in the real format -----------------------------------------------------

def _time_str(t_us: float) -> str:
    """nccl-tests' time column: 2 decimals below 100 us, 1 below 10 ms, none above."""
    return f"{t_us:.2f}" if t_us < 100 else f"{t_us:.1f}" if t_us < 1e4 else f"{t_us:.0f}"


def make_log(nranks: int, gpn: int, *, old: bool = False, op: str = "all_reduce",
             sizes=None, command: bool = True, cluster: str = "dgx-a100-ib",
             times: dict | None = None) -> str:
    """An nccl-tests log of ``op`` on ``nranks`` ranks (``gpn`` per host) with parosim's
    closed-form times on ``cluster``; ``old``: the older ``# Rank`` lines without Group."""
    from parosim.collectives import Algo, Op
    from parosim.collectives.bench import collective_time
    from parosim.io import load_cluster

    sizes = sizes or [2**k for k in range(20, 31, 2)]   # 1 MiB .. 1 GiB
    nodes = nranks // gpn
    spec = load_cluster(cluster, nodes) if gpn == 8 else None
    pop = Op(op.replace("_", "-"))
    factor = 2 * (nranks - 1) / nranks if pop is Op.ALL_REDUCE else (nranks - 1) / nranks
    redop = "none" if pop is Op.ALL_GATHER else "sum"
    lines = []
    if command:
        lines.append(f"$ mpirun -np {nranks} ./build/{op}_perf -b {sizes[0]} -e {sizes[-1]} "
                     "-f 4 -g 1")
    lines.append(f"# nThread 1 nGpus 1 minBytes {sizes[0]} maxBytes {sizes[-1]} step: "
                 "4(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0")
    lines += ["#", "# Using devices"]
    for r in range(nranks):
        host, dev = f"node-{r // gpn:04d}", r % gpn
        if old:
            lines.append(f"#   Rank {r:2d} Pid {1000 + r:7d} on {host:>10} device {dev:2d} "
                         f"[0x{dev:02x}] A100-SXM4-80GB")
        else:
            lines.append(f"#  Rank {r:2d} Group  0 Pid {1000 + r:6d} on {host} device {dev:2d} "
                         f"[0x{dev:02x}] NVIDIA A100-SXM4-80GB")
    lines += ["#",
              "#                                                              out-of-place"
              "                       in-place",
              "#       size         count      type   redop    root     time   algbw   busbw "
              "#wrong     time   algbw   busbw #wrong",
              "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)"
              "            (us)  (GB/s)  (GB/s)"]
    for s in sizes:
        if times is not None:
            t = times[s]
        elif spec is not None:
            t = collective_time(spec, pop, s, Algo.RING, engine=False)
        else:
            t = 20e-6 + s / 10e9
        t_us = t * 1e6
        alg = s / t / 1e9
        cell = f"{_time_str(t_us):>8} {alg:7.2f} {alg * factor:7.2f}      0"
        lines.append(f"{s:12d}  {s // 4:12d}     float  {redop:>6}      -1 {cell} {cell}")
    lines += ["# Out of bounds values : 0 OK", "# Avg bus bandwidth    : 100.0", "#"]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("nranks", [128, 256, 512, 1024])
def test_complete_header_of_a_large_run_gives_its_ranks(nranks):
    """busbw/algbw of two 2-decimal numbers cannot tell 128 from 129 ranks: the complete
    header decides, the ratio only has to be consistent within the printed rounding."""
    log = parse_nccl_tests(make_log(nranks, 8), "big.txt")
    assert (log.nranks, log.nranks_from, log.nodes, log.gpus_per_node) == (
        nranks, "header", nranks // 8, 8)
    old = parse_nccl_tests(make_log(nranks, 8, old=True), "big-old.txt")
    assert (old.nranks, old.nodes) == (nranks, nranks // 8)


def test_header_and_ratio_still_must_agree():
    text = make_log(16, 8).replace(" 0    ", " 0    ", 1)
    # a 16-rank header over rows whose busbw / algbw is the 8-rank factor 1.75
    rows = make_log(8, 8).split("#        (B)")[1].split("\n", 1)[1]
    bad = text.split("#        (B)")[0] + "#        (B)" + text.split("#        (B)")[1].split(
        "\n", 1)[0] + "\n" + rows
    with pytest.raises(InputError, match="header gives 16 ranks but busbw/algbw"):
        parse_nccl_tests(bad, "bad.txt")


def test_headerless_large_log_is_refused_not_guessed():
    """Without a header, busbw/algbw of a 128-rank run fits several rank counts: refused."""
    text = "\n".join(ln for ln in make_log(128, 8, command=False).splitlines()
                     if "Rank" not in ln)
    with pytest.raises(InputError, match="cannot tell the number of ranks"):
        parse_nccl_tests(text, "noheader.txt")
    # small counts stay readable from the ratio alone (the published excerpts)
    text16 = "\n".join(ln for ln in make_log(16, 8).splitlines() if "Rank" not in ln)
    log = parse_nccl_tests(text16, "noheader16.txt")
    assert (log.nranks, log.nranks_from) == (16, "busbw/algbw")


def test_1024_rank_log_is_compared(tmp_path, capsys):
    p = tmp_path / "ar1024.txt"
    p.write_text(make_log(1024, 8, sizes=[2**20, 2**26, 2**30]))
    argv = ["collective", "--compare", str(p), "--cluster", "dgx-a100-ib", "--algo", "ring",
            "--json"]
    rc, out, err = run_case(argv, capsys, timeout=120)
    assert rc == 0, err
    res = json.loads(out)
    assert (res["logs"][0]["nranks"], res["logs"][0]["nodes"]) == (1024, 128)
    assert len(res["rows"]) == 3 and all(r["gpus"] == 1024 for r in res["rows"])
    # the log holds parosim's own closed-form ring times; the engine agrees within 10 %
    assert all(abs(r["error_pct"]) < 10 for r in res["rows"]), res["rows"]
    rc2, out2, _ = run_case(argv, capsys, timeout=120)
    assert out2 == out   # byte-identical JSON


def test_old_format_log_keeps_its_hosts(tmp_path, capsys):
    """8 hosts x 1 GPU in the older format (no Group): 8 nodes, refused on an 8-GPU node."""
    text = make_log(8, 1, old=True)
    log = parse_nccl_tests(text, "old8.txt")
    assert (log.nranks, log.nodes, log.gpus_per_node) == (8, 8, 1)
    assert log.devices == ("A100-SXM4-80GB",)
    p = tmp_path / "old8.txt"
    p.write_text(text)
    new = tmp_path / "new8.txt"
    new.write_text(make_log(8, 1))
    for path in (p, new):
        rc, out, err = run_case(["collective", "--compare", str(path), "--cluster",
                                 "dgx-a100-ib"], capsys)
        check_err(rc, out, err, "has 1 GPUs per node (8 ranks on 8 nodes)")
        rc, out, err = run_case(["calibrate", "--nccl-tests", str(path), "--cluster",
                                 "dgx-a100-ib", "-o", str(tmp_path / "c.yaml")], capsys)
        check_err(rc, out, err, "1 GPUs per node")


def test_published_old_format_logs_give_their_hosts():
    for name, nodes in (("abci-a-job02-all_reduce.nccl", 2), ("abci-a-job04-all_reduce.nccl", 4)):
        log = read_nccl_tests(REALDATA / name)
        assert (log.nranks, log.nodes, log.nranks_from) == (8 * nodes, nodes, "header")
        assert log.devices == ("A100-SXM4-40GB",)


def _table_only(text: str) -> str:
    return "\n".join(ln for ln in text.splitlines() if not ln.startswith("$"))


@pytest.mark.parametrize("name,text,needle", [
    ("two-runs-with-commands", make_log(16, 8) + make_log(16, 8, op="all_gather"),
     "holds 2 runs"),
    ("two-tables-no-command", _table_only(make_log(16, 8)) + "\n"
     + _table_only(make_log(16, 8, op="all_gather")), "holds 2 runs"),
    ("same-op-twice", make_log(16, 8) + make_log(16, 8), "holds 2 runs"),
])
def test_concatenated_runs_are_refused(name, text, needle):
    with pytest.raises(InputError, match=needle):
        parse_nccl_tests(text, f"{name}.txt")


def _with_time(text: str, value: str) -> str:
    lines = text.splitlines()
    i = next(k for k, ln in enumerate(lines) if ln.strip().startswith(str(2**26)))
    toks = lines[i].split()
    toks[5] = value
    lines[i] = "  ".join(toks)
    return "\n".join(lines) + "\n", i + 1


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "NaN", "1e400"])
def test_non_finite_times_are_refused_naming_the_line(value, tmp_path, capsys):
    text, lineno = _with_time(make_log(16, 8), value)
    p = tmp_path / "nan.txt"
    p.write_text(text)
    for argv in (["collective", "--compare", str(p), "--cluster", "dgx-a100-ib", "--json"],
                 ["calibrate", "--nccl-tests", str(p), "--cluster", "dgx-a100-ib", "-o",
                  str(tmp_path / "c.yaml")]):
        rc, out, err = run_case(argv, capsys)
        check_err(rc, out, err, f"line {lineno}: time")
        assert "finite" in err


def test_table_of_only_size_zero_rows_is_refused():
    text = make_log(16, 8, sizes=[0], times={0: 1e-6})
    with pytest.raises(InputError, match="no row of size > 0"):
        parse_nccl_tests(text, "zero.txt")


@pytest.mark.parametrize("scope,expect", [("intra", "--scope intra"), ("inter", "--scope inter"),
                                          ("global", None)])
def test_scope_with_compare_is_refused_or_honoured(scope, expect, tmp_path, capsys):
    p = tmp_path / "ar16.txt"
    p.write_text(make_log(16, 8, sizes=[2**20]))
    rc, out, err = run_case(["collective", "--compare", str(p), "--cluster", "dgx-a100-ib",
                             "--scope", scope], capsys)
    if expect is None:
        assert rc == 0, err
    else:
        check_err(rc, out, err, expect)


def test_calibrate_on_a_300_size_log_is_bounded(tmp_path, capsys):
    sizes = sorted({int(2**20 * 1.02**k) for k in range(300)})
    assert len(sizes) == 300
    p = tmp_path / "ar300.txt"
    p.write_text(make_log(16, 8, sizes=sizes))
    rc, out, err = run_case(["calibrate", "--nccl-tests", str(p), "--cluster", "dgx-a100-ib",
                             "-o", str(tmp_path / "c.yaml")], capsys, timeout=60)
    check_err(rc, out, err, "hold 300 sizes")


# --- CLI table --------------------------------------------------------------------------------

CL = cluster_yaml(4)


def _ov(*entries: str) -> str:
    return with_overrides(CL, *entries)


def _ds(d: dict) -> str:
    return json.dumps(d)


FILES: dict[str, str] = {
    "ov_mem_bare.yaml": _ov("{gpus: [n0/gpu1], speed: 1.0}", "{nodes: [1], memory: 80}"),
    "ov_gpu_mem_bare.yaml": _ov("{nodes: [1], gpu: {memory: 80}}"),
    "ov_nic_bw_bare.yaml": _ov("{nodes: [0], nic: {bandwidth: 100}}"),
    "ov_link_bw_bare.yaml": _ov("{nodes: [0], speed: 1.0}", "{nodes: [1], speed: 1.0}",
                                "{links: [[n1/nic0, switch]], bandwidth: 100}"),
    "ov_link_bw_zero.yaml": _ov("{nodes: [0], speed: 1.0}", "{nodes: [1], speed: 1.0}",
                                "{links: [[n1/nic0, switch]], bandwidth: 0Gbps}"),
    "ov_link_bw_neg.yaml": _ov("{links: [[n1/nic0, switch]], bandwidth: -5Gbps}"),
    "ov_link_bw_inf.yaml": _ov("{links: [[n1/nic0, switch]], bandwidth: 1e999Gbps}"),
    "ov_nic_bw_zero.yaml": _ov("{nodes: [0], nic: {bandwidth: 0Gbps}}"),
    "ov_lat_bare.yaml": _ov("{nodes: [0], nic: {latency: 5}}"),
    "ov_gpu_unknown.yaml": _ov("{nodes: [0], gpu: {model: MI300X}}"),
    "ov_gpu_unknown_full.yaml": _ov("{nodes: [0], gpu: {model: X1, memory: 64GB, "
                                    "peak_tflops: 400, hbm_bandwidth: 3TB/s}}"),
    "ov_speed_huge.yaml": _ov("{nodes: [0, 1, 2, 3], speed: 1.0e+300}"),
    "ov_speed_tiny.yaml": _ov("{gpus: [n0/gpu0], speed: 1.0e-12}"),
    "ov_speed_zero.yaml": _ov("{gpus: [n0/gpu0], speed: 0}"),
    "ov_straggler.yaml": _ov("{gpus: [n0/gpu1], speed: 0.8}"),
    "ov_fp8_all.yaml": _ov("{nodes: [0, 1, 2, 3], gpu: {peak_fp8_tflops: 624}}"),
    "ov_fp8_half.yaml": _ov("{nodes: [0, 1], gpu: {peak_fp8_tflops: 624}}"),
    "jitter_huge.yaml": CL + "jitter: {distribution: lognormal, cv: 1e300}\n",
    "jitter_2.yaml": CL + "jitter: {distribution: lognormal, cv: 2}\n",
    "jitter_ok.yaml": CL + "jitter: {distribution: lognormal, cv: 0.1}\n",
    "rt_bucket1.yaml": "name: tiny\nstages: {NGG: ZeRO-2}\ngrad_bucket_elements: 1\n",
    "rt_ag_bucket1.yaml": "name: tiny\nstages: {GGG: ZeRO-3}\nallgather_bucket_elements: 1\n",
    "jobs_eff.yaml": "cluster: paper-a100-roce\nnodes: 4\njobs:\n"
                     "  - {name: a, model: llama-7b, strategy: NIG, nodes: [0, 1], "
                     "efficiency: 2}\n",
    "jobs_accum0.yaml": "cluster: paper-a100-roce\nnodes: 4\njobs:\n"
                        "  - {name: a, model: llama-7b, strategy: NIG, nodes: [0, 1], "
                        "overlap_slowdown: 0.5}\n",
    # DeepSpeed configs (32 GPUs on the default 4-node cluster)
    "ds_tb.json": _ds({"train_batch_size": 192, "zero_optimization": {"stage": 2}}),
    "ds_mb2.json": _ds({"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 2}}),
    "ds_acc3.json": _ds({"gradient_accumulation_steps": 3, "zero_optimization": {"stage": 2}}),
    "ds_acc0.json": _ds({"gradient_accumulation_steps": 0, "zero_optimization": {"stage": 2}}),
    "ds_mb0.json": _ds({"train_micro_batch_size_per_gpu": 0}),
    "ds_dup.json": '{"train_micro_batch_size_per_gpu": 2, "train_micro_batch_size_per_gpu": 4}',
    "ds_dup_nested.json": '{"zero_optimization": {"stage": 1, "stage": 2}}',
    "ds_nan.json": '{"train_micro_batch_size_per_gpu": NaN}',
    "ds_inf.json": '{"zero_optimization": {"stage": 2, "reduce_bucket_size": Infinity}}',
    "ds_offload_none.json": _ds({"zero_optimization": {"stage": 2, "offload_optimizer":
                                                       {"device": "none"}}}),
    "ds_offload_cpu.json": _ds({"zero_optimization": {"stage": 2, "offload_optimizer":
                                                      {"device": "cpu"}}}),
    "ds_param_none.json": _ds({"zero_optimization": {"stage": 3, "offload_param":
                                                     {"device": "none"}}}),
    "ds_bucket0.json": _ds({"zero_optimization": {"stage": 2, "reduce_bucket_size": 0}}),
    "ds_bucket1.json": _ds({"zero_optimization": {"stage": 2, "reduce_bucket_size": 1}}),
    "ds_bucket1000.json": _ds({"zero_optimization": {"stage": 2, "reduce_bucket_size": 1000}}),
    "ds_agbucket0.json": _ds({"zero_optimization": {"stage": 2, "allgather_bucket_size": 0}}),
    "ds_bucket_ok.json": _ds({"zero_optimization": {"stage": 2,
                                                    "reduce_bucket_size": 50000000}}),
}

A = ["--mode", "analytic"]
DS = "--deepspeed-config"

CASES: list[tuple[str, list[str], tuple]] = [
    # --- --deepspeed-config against explicit flags ----------------------------------------------
    ("ds-global-batch-conflict", ["simulate", DS, "{d}/ds_tb.json", "--global-batch", "1280",
                                  *A], ERR("--global-batch 1280")),
    ("ds-global-batch-conflict-names-key", ["simulate", DS, "{d}/ds_tb.json", "--global-batch",
                                            "1280", *A], ERR("train_batch_size = 192")),
    ("ds-global-batch-agree", ["simulate", DS, "{d}/ds_tb.json", "--global-batch", "192",
                               "--micro-batch", "6", *A], OK()),
    ("ds-micro-batch-default-value-explicit", ["simulate", DS, "{d}/ds_mb2.json",
                                               "--micro-batch", "4", *A],
     ERR("--micro-batch 4 disagrees with")),
    ("ds-micro-batch-names-key", ["simulate", DS, "{d}/ds_mb2.json", "--micro-batch", "4", *A],
     ERR("train_micro_batch_size_per_gpu = 2")),
    ("ds-accum-default-value-explicit", ["simulate", DS, "{d}/ds_acc3.json", "--accum", "10",
                                         *A], ERR("gradient_accumulation_steps = 3")),
    ("ds-micro-batch-not-given", ["simulate", DS, "{d}/ds_mb2.json", *A], OK()),
    ("ds-tb-not-given", ["simulate", DS, "{d}/ds_tb.json", *A], OK()),
    ("ds-tb-vs-micro-batch", ["simulate", DS, "{d}/ds_tb.json", "--micro-batch", "4", *A],
     ERR("--micro-batch 4")),
    ("ds-dup-key", ["simulate", DS, "{d}/ds_dup.json", *A],
     ERR("duplicate key 'train_micro_batch_size_per_gpu'")),
    ("ds-dup-key-nested", ["simulate", DS, "{d}/ds_dup_nested.json", *A],
     ERR("duplicate key 'stage'")),
    ("ds-nan", ["simulate", DS, "{d}/ds_nan.json", *A], ERR("NaN")),
    ("ds-inf", ["simulate", DS, "{d}/ds_inf.json", *A], ERR("Infinity")),
    ("ds-offload-none", ["simulate", DS, "{d}/ds_offload_none.json", *A], OK()),
    ("ds-offload-param-none", ["simulate", DS, "{d}/ds_param_none.json", *A], OK()),
    ("ds-offload-cpu", ["simulate", DS, "{d}/ds_offload_cpu.json", *A],
     ERR("offload_optimizer")),
    ("ds-bucket-0", ["simulate", DS, "{d}/ds_bucket0.json", *A], ERR("reduce_bucket_size = 0")),
    ("ds-agbucket-0", ["simulate", DS, "{d}/ds_agbucket0.json", *A],
     ERR("allgather_bucket_size = 0")),
    ("ds-bucket-1", ["simulate", DS, "{d}/ds_bucket1.json", *A], ERR("reduce_bucket_size = 1 ")),
    ("ds-bucket-1000-engine", ["simulate", DS, "{d}/ds_bucket1000.json"],
     ERR("expected reduce_bucket_size >=")),
    ("ds-bucket-ok", ["simulate", DS, "{d}/ds_bucket_ok.json", *A], OK()),
    ("ds-accum-0", ["simulate", DS, "{d}/ds_acc0.json", *A],
     ERR("gradient_accumulation_steps = 0")),
    ("ds-micro-0", ["simulate", DS, "{d}/ds_mb0.json", *A],
     ERR("train_micro_batch_size_per_gpu = 0")),
    ("rt-bucket-1", ["simulate", "--runtime", "{d}/rt_bucket1.yaml", "--strategy", "NGG", *A],
     ERR("grad_bucket_elements = 1 ")),
    ("rt-ag-bucket-1", ["simulate", "--runtime", "{d}/rt_ag_bucket1.yaml", "--strategy", "GGG",
                        *A], ERR("allgather_bucket_elements = 1 ")),
    # --- overrides -------------------------------------------------------------------------------
    ("ov-memory-bare", ["collective", "--cluster", "{d}/ov_mem_bare.yaml"],
     ERR("overrides[1].memory = 80 has no unit")),
    ("ov-gpu-memory-bare", ["collective", "--cluster", "{d}/ov_gpu_mem_bare.yaml"],
     ERR("overrides[0].gpu.memory = 80 has no unit")),
    ("ov-nic-bw-bare", ["collective", "--cluster", "{d}/ov_nic_bw_bare.yaml"],
     ERR("overrides[0].nic.bandwidth = 100 has no unit")),
    ("ov-link-bw-bare", ["collective", "--cluster", "{d}/ov_link_bw_bare.yaml"],
     ERR("overrides[2].bandwidth = 100 has no unit")),
    ("ov-latency-bare", ["collective", "--cluster", "{d}/ov_lat_bare.yaml"],
     ERR("overrides[0].nic.latency = 5 has no unit")),
    ("ov-link-bw-zero", ["collective", "--cluster", "{d}/ov_link_bw_zero.yaml"],
     ERR("overrides[2].bandwidth")),
    ("ov-link-bw-neg", ["collective", "--cluster", "{d}/ov_link_bw_neg.yaml"],
     ERR("overrides[0].bandwidth")),
    ("ov-link-bw-inf", ["collective", "--cluster", "{d}/ov_link_bw_inf.yaml"],
     ERR("overrides[0].bandwidth")),
    ("ov-nic-bw-zero", ["collective", "--cluster", "{d}/ov_nic_bw_zero.yaml"],
     ERR("overrides[0].nic.bandwidth")),
    ("ov-gpu-unknown", ["collective", "--cluster", "{d}/ov_gpu_unknown.yaml"],
     ERR("overrides[0].gpu.model 'MI300X' is not in the table")),
    ("ov-gpu-unknown-full", ["collective", "--cluster", "{d}/ov_gpu_unknown_full.yaml"], OK()),
    # --- errors naming the real input ------------------------------------------------------------
    ("jobs-efficiency-2", ["simulate", "--jobs", "{d}/jobs_eff.yaml"],
     ERR("job 'a': efficiency = 2 must be")),
    ("jobs-overlap-0.5", ["simulate", "--jobs", "{d}/jobs_accum0.yaml"],
     ERR("job 'a': overlap_slowdown = 0.5")),
    ("tp-algo-nccl", ["simulate", "--tp", "16", "--nodes", "4", "--tp-algo", "nccl", *A],
     ERR("--tp-algo nccl")),
    # --- extreme values ---------------------------------------------------------------------------
    ("jitter-1e300-simulate", ["simulate", "--jitter-cv", "1e300"], ERR("--jitter-cv = 1e+300")),
    ("jitter-1e10-simulate", ["simulate", "--jitter-cv", "1e10"], ERR("must be in [0, 1]")),
    ("jitter-1e300-run", ["run", "--jitter-cv", "1e300"], ERR("--jitter-cv = 1e+300")),
    ("jitter-nan", ["simulate", "--jitter-cv", "nan"], ERR("--jitter-cv")),
    ("jitter-yaml-1e300", ["simulate", "--cluster", "{d}/jitter_huge.yaml"], ERR("jitter.cv")),
    ("jitter-yaml-2", ["collective", "--cluster", "{d}/jitter_2.yaml"], ERR("jitter.cv = 2")),
    ("jitter-1-ok", ["simulate", "--jitter-cv", "1", "--nodes", "1", "--accum", "2"], OK()),
    ("speed-1e300", ["simulate", "--cluster", "{d}/ov_speed_huge.yaml"],
     ERR("overrides[0]: speed = 1e+300 must be in [0.01, 2]")),
    ("speed-1e-12", ["simulate", "--cluster", "{d}/ov_speed_tiny.yaml"],
     ERR("overrides[0]: speed = 1e-12 must be in [0.01, 2]")),
    ("speed-0", ["simulate", "--cluster", "{d}/ov_speed_zero.yaml"],
     ERR("speed = 0.0 must be positive")),
    ("speed-0.8-ok", ["simulate", "--cluster", "{d}/ov_straggler.yaml", "--accum", "2"], OK()),
    ("simulate-repeats-huge", ["simulate", "--repeats", "100000000", "--jitter-cv", "0.1"],
     ERR("--repeats 100000000")),
    ("run-repeats-10000", ["run", "--repeats", "10000", "--jitter-cv", "0.1"],
     ERR("--repeats 10000")),
    ("simulate-repeats-3-ok", ["simulate", "--repeats", "3", "--jitter-cv", "0.05", "--nodes",
                               "1", "--accum", "2"], OK()),
    # --- advise, fp8 -----------------------------------------------------------------------------
    ("advise-straggler", ["advise", "--global-batch", "2048", "--cluster",
                          "{d}/ov_straggler.yaml"], ERR("parosim advise")),
    ("fp8-override-all", ["simulate", "--precision", "fp8", "--cluster", "{d}/ov_fp8_all.yaml",
                          "--accum", "2"], OK()),
    ("fp8-override-half", ["simulate", "--precision", "fp8", "--cluster",
                           "{d}/ov_fp8_half.yaml", "--accum", "2"], ERR("A100-SXM4-80GB")),
]


@pytest.fixture(scope="module")
def d(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("robust3")
    for name, text in FILES.items():
        (root / name).write_text(text)
    return root


def test_case_names_are_unique():
    names = [c[0] for c in CASES]
    assert len(names) == len(set(names))


@pytest.mark.parametrize("name,argv,expect", CASES, ids=[c[0] for c in CASES])
def test_case(name, argv, expect, d, capsys):
    argv = [a.replace("{d}", str(d)) for a in argv]
    rc, out, err = run_case(argv, capsys)
    kind, needle = expect
    if kind == "ok":
        assert "Traceback" not in err + out
        assert rc == 0, f"{name}: expected success, got rc {rc}: {err}"
        return
    check_err(rc, out, err, needle)


def test_fp8_through_an_override_of_every_node_equals_the_top_level_fp8(d, capsys):
    """'What if these A100s had FP8': an override of every node giving peak_fp8_tflops 624 is
    the same cluster as gpu.peak_fp8_tflops 624 at the top level (hand value: identical)."""
    top = d / "fp8_top.yaml"
    top.write_text(CL.replace("{model: A100-SXM4-80GB}",
                              "{model: A100-SXM4-80GB, peak_fp8_tflops: 624}"))
    steps = []
    for path in (top, d / "ov_fp8_all.yaml"):
        rc, out, err = run_case(["simulate", "--precision", "fp8", "--cluster", str(path),
                                 "--accum", "2", "--json"], capsys)
        assert rc == 0, err
        steps.append(json.loads(out)["step_time_s"])
    rc, out, _ = run_case(["simulate", "--cluster", str(top), "--accum", "2", "--json"], capsys)
    bf16 = json.loads(out)["step_time_s"]
    assert steps[1] == pytest.approx(steps[0], rel=1e-9) and steps[0] < bf16
