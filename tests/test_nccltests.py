"""nccl-tests round trip: parsing published logs, the nccl-tests table, --compare, calibrate."""

import json
import math
from pathlib import Path

import pytest

from parosim.cli.commands import main
from parosim.errors import InputError
from parosim.io.nccltests import parse_nccl_tests, read_nccl_tests

DATA = Path(__file__).parent / "data" / "nccl-tests"
FIXTURES = sorted(DATA.glob("*.txt"))

# file -> (op, nranks, nodes, rows, (size, time_oop_us) of the last row, as published)
EXPECTED = {
    "abci-a-1node-all_reduce.txt": ("all-reduce", 8, 1, 24, (33554432, 370.7)),
    "aws-p4de-2node-all_reduce.txt": ("all-reduce", 16, 2, 29, (2147483648, 51406)),
    "aws-p5-2node-all_reduce.txt": ("all-reduce", 16, 2, 32, (17179869184, 66132)),
    "aws-p5-batch-all_reduce.txt": ("all-reduce", 8, 1, 32, (17179869184, 62239)),
    "aws-p5-eks-excerpt-all_reduce.txt": ("all-reduce", 16, 2, 7, (2147483648, 9197.5)),
    "azure-ndmv4-msccl-all_gather.txt": ("all-gather", 8, 1, 21, (1073741824, 2663.8)),
    "azure-ndmv4-msccl-all_reduce.txt": ("all-reduce", 8, 1, 21, (1073741824, 4028.7)),
    "azure-ndmv4-superbench-all_reduce.txt": ("all-reduce", 8, 1, 31, (8589934592, 63790.19)),
    "azure-ndv4-superbench-all_reduce.txt": ("all-reduce", 8, 1, 31, (8589934592, 65263.02)),
    "gcp-a3mega-h100-2node-all_reduce.txt": ("all-reduce", 16, 2, 31, (8589934592, 47535)),
    "oci-a100-2node-all_reduce.txt": ("all-reduce", 16, 2, 31, (8589934592, 67689)),
}


def run(argv, capsys):
    rc = main(argv)
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_every_fixture_is_expected_and_has_a_source():
    assert {p.name for p in FIXTURES} == set(EXPECTED)
    sources = (DATA / "SOURCES.md").read_text()
    for p in FIXTURES:
        assert p.name in sources
        assert read_nccl_tests(p).meta.get("source"), p.name


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_published_logs_parse(name):
    log = read_nccl_tests(DATA / name)
    op, nranks, nodes, nrows, (size, t_us) = EXPECTED[name]
    assert (log.op, log.nranks, log.nodes, len(log.rows)) == (op, nranks, nodes, nrows)
    last = log.rows[-1]
    assert last.size_bytes == size
    assert math.isclose(last.time_s, t_us * 1e-6, rel_tol=1e-12)
    # what the log prints agrees with nccl-tests' formulas: algbw = size / time,
    # busbw = algbw x factor(nranks) (to the printed 2 decimals); SuperBench's numbers are
    # averages over many nodes of each column apart, which need not obey the formula
    for r in ([] if "superbench" in name else log.rows):
        if r.algbw_oop_GBps is not None and r.size_bytes > 0:
            assert r.algbw_oop_GBps == pytest.approx(r.size_bytes / r.time_oop_s / 1e9,
                                                     abs=0.006, rel=2e-3)
            assert r.busbw_oop_GBps == pytest.approx(
                r.size_bytes / r.time_oop_s / 1e9 * log.busbw_factor(), abs=0.006, rel=2e-3)


def test_header_gives_devices_and_hosts():
    log = read_nccl_tests(DATA / "oci-a100-2node-all_reduce.txt")
    assert log.nranks_from == "header"
    assert log.devices == ("NVIDIA A100-SXM4-40GB",)
    assert log.gpus_per_node == 8
    assert log.avg_busbw_GBps == pytest.approx(66.4834)
    assert read_nccl_tests(DATA / "aws-p4de-2node-all_reduce.txt").nranks_from == "busbw/algbw"


GOOD_ROW = ("     1048576        262144     float     sum      -1    85.58   12.25   22.97      0"
            "    84.50   12.41   23.27      0")
HEADER = ("#       size         count      type   redop    root     time   algbw   busbw #wrong"
          "     time   algbw   busbw #wrong\n")
RANKS = "".join(f"#  Rank {i:2d} Group  0 Pid  {i} on host{i // 8} device  {i % 8} [0x0f] "
                "NVIDIA A100\n" for i in range(16))


@pytest.mark.parametrize("text,needle", [
    ("hello\nworld\n", "no table header"),
    (HEADER, "the table has no rows"),
    (HEADER + GOOD_ROW[:40] + "\n", "expected a table row of 13 columns"),
    (HEADER + GOOD_ROW.replace("85.58", "fast") + "\n", "time 'fast' is not a number"),
    (HEADER + GOOD_ROW.replace("85.58", "-1.0") + "\n", "must be positive"),
    (RANKS + HEADER + GOOD_ROW.replace("22.97", "21.44") + "\n", "gives 16 ranks but"),
    (HEADER + GOOD_ROW.replace("22.97", "14.00") + "\n", "is no all-reduce factor"),
    ("$ broadcast_perf -b 8\n" + HEADER + GOOD_ROW + "\n", "broadcast_perf is not supported"),
    ("$ alltoall_perf -b 8\n" + HEADER + GOOD_ROW + "\n", "is no all-to-all factor"),
    ("# parosim: op = broadcast\n" + HEADER + GOOD_ROW + "\n", "is not known"),
    (HEADER.replace("busbw #wrong", "busbw #wrong foo", 1) + GOOD_ROW + "\n",
     "unknown column 'foo'"),
])
def test_malformed_logs_raise_one_clear_error(text, needle):
    with pytest.raises(InputError, match=needle):
        parse_nccl_tests(text, "bad.txt")


def test_malformed_log_on_the_command_line_is_one_line_exit_2(tmp_path, capsys):
    bad = tmp_path / "bad.txt"
    bad.write_text(HEADER + "   12  oops\n")
    for argv in (["collective", "--compare", str(bad)],
                 ["collective", "--compare", str(tmp_path / "missing.txt")],
                 ["calibrate", "--nccl-tests", str(bad), "--cluster", "dgx-a100-ib", "-o",
                  str(tmp_path / "c.yaml")]):
        rc, out, err = run(argv, capsys)
        assert rc == 2, argv
        assert err.startswith("parosim: error: nccl-tests log") and err.count("\n") == 1, err
        assert "Traceback" not in err


def test_size_sweep_table_and_json(capsys):
    rc, out, _ = run(["collective", "--op", "all-reduce", "-b", "8", "-e", "8G", "-f", "16",
                      "--algo", "ring,ho-ring", "--cluster", "dgx-a100-ib"], capsys)
    assert rc == 0
    rows = [ln for ln in out.splitlines() if ln and not ln.startswith("#")]
    assert [int(r.split()[0]) for r in rows] == [8 * 16**i for i in range(8)]
    assert all(len(r.split()) == 5 + 3 * 2 for r in rows)
    rc, out, _ = run(["collective", "--op", "all-reduce", "-b", "1M", "-e", "4M",
                      "--algo", "ring,ho-ring", "--cluster", "dgx-a100-ib", "--json"], capsys)
    res = json.loads(out)
    assert res["algos"] == ["ring", "ho-ring"] and len(res["rows"]) == 3 * 2
    for r in res["rows"]:
        for k in ("op", "algo", "scope", "gpus", "size_bytes", "time_s", "algbw_GBps",
                  "busbw_GBps"):
            assert k in r
        assert r["algbw_GBps"] == pytest.approx(r["size_bytes"] / r["time_s"] / 1e9)


def test_single_size_form_still_works_with_a_comma_list(capsys):
    rc, out, _ = run(["collective", "--op", "all-gather", "--size", "64MiB", "--algo",
                      "ring,ho-ring", "--json"], capsys)
    res = json.loads(out)
    assert rc == 0 and [r["algo"] for r in res["results"]] == ["ring", "ho-ring"]
    rc, out, _ = run(["collective", "--json"], capsys)
    r = json.loads(out)   # the default: NCCL's tuner (fidelity accurate)
    assert (r["op"], r["algo"], r["size_bytes"]) == ("all-gather", "nccl", 2**30)
    rc, out, _ = run(["collective", "--json", "--fidelity", "paper"], capsys)
    r = json.loads(out)
    assert (r["op"], r["algo"], r["size_bytes"]) == ("all-gather", "ho-ring", 2**30)


@pytest.mark.parametrize("argv,needle", [
    (["collective", "--size", "1GiB", "-b", "8"], "either --size or -b/-e/-f"),
    (["collective", "-b", "8", "-e", "4"], "must be >= -b"),
    (["collective", "-b", "8", "-e", "16", "-f", "1"], "-f 1.0 must be > 1"),
    (["collective", "-b", "8", "-e", "16", "-f", "two"], "-f 'two' is not a number"),
    (["collective", "--algo", "ring,bogus"], "--algo 'bogus' is not known"),
    (["collective", "--plot", "x.png"], "--plot and --in-place go with"),
    (["collective", "--compare", str(DATA / "aws-p4de-2node-all_reduce.txt"), "--nodes", "3",
      "--cluster", "dgx-a100-ib"], "has 16 ranks but --nodes 3 x 8 GPUs = 24"),
    (["collective", "--compare", str(DATA / "aws-p4de-2node-all_reduce.txt"), "--cluster",
      "paper-a100-roce", "--op", "all-gather"], "is all-reduce"),
])
def test_collective_bad_flags(argv, needle, capsys):
    rc, _, err = run(argv, capsys)
    assert rc == 2 and needle in err and err.count("\n") == 1, err


def test_compare_rows_and_plot(tmp_path, capsys):
    png = tmp_path / "cmp.png"
    log = DATA / "azure-ndmv4-msccl-all_gather.txt"
    rc, out, _ = run(["collective", "--compare", str(log), "--cluster", "dgx-a100-ib",
                      "--algo", "ring", "--json", "--plot", str(png)], capsys)
    assert rc == 0
    res = json.loads(out)
    assert len(res["rows"]) == 21 and res["logs"][0]["nodes"] == 1
    for r in res["rows"]:
        assert r["op"] == "all-gather"
        assert r["error_pct"] == pytest.approx(100 * (r["simulated_s"] - r["measured_s"])
                                               / r["measured_s"])
    s = res["logs"][0]["summary"]
    assert s["large_n"] + s["small_n"] == 21
    assert png.stat().st_size > 10_000 and png.read_bytes()[:4] == b"\x89PNG"
