"""Sweeps: spec validation, row semantics, resume after SIGINT / SIGKILL / a torn line.

Collective sweeps (fast, engine mode) exercise the machinery; the step sweeps of the
experiments are covered in test_sweep_step.py.
"""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from parosim.errors import InputError
from parosim.io.sweep import COLUMNS, ResultsLog, load_sweep_spec, point_id, sweep_from_dict
from parosim.sweep.runner import evaluate, run_sweep

ROOT = Path(__file__).resolve().parents[1]

SMALL = {
    "name": "small", "kind": "collective", "mode": "engine",
    "grid": {"nodes": [2, 4], "algo": ["ring", "hierarchical", "ho-ring"]},
    "fixed": {"cluster": "paper-a100-roce", "op": "all-gather", "size": "64MB"},
}
# Long enough (144 engine points, a few seconds) that a kill lands in the middle.
LONG = {
    "name": "long", "kind": "collective", "mode": "engine",
    "grid": {"nodes": [2, 4, 8, 16], "size": ["1MB", "4MB", "16MB", "64MB", "256MB", "1GB"],
             "op": ["all-gather", "all-reduce"],
             "algo": ["ring", "hierarchical", "ho-ring"]},
    "fixed": {"cluster": "paper-a100-roce"},
}


def _write_spec(tmp_path: Path, data: dict, name: str = "spec.yaml") -> Path:
    p = tmp_path / name
    p.write_text(yaml.safe_dump(data, sort_keys=False))
    return p


def _rows(path: Path) -> list[list[str]]:
    with open(path, newline="") as fh:
        return list(csv.reader(fh))


# --- the spec ----------------------------------------------------------------------------------

def test_points_are_the_grid_product_in_order():
    spec = sweep_from_dict(SMALL)
    pts = spec.points()
    assert [(p["nodes"], p["algo"]) for p in pts] == [
        (2, "ring"), (2, "hierarchical"), (2, "ho-ring"),
        (4, "ring"), (4, "hierarchical"), (4, "ho-ring")]
    assert all(p["cluster"] == "paper-a100-roce" and p["kind"] == "collective" for p in pts)
    assert len({point_id(p) for p in pts}) == 6


def test_point_id_is_stable_and_order_free():
    a = {"kind": "step", "model": "llama-7b", "nodes": 4}
    assert point_id(a) == point_id(dict(reversed(list(a.items()))))
    assert point_id(a) != point_id({**a, "nodes": 8})
    assert len(point_id(a)) == 16


@pytest.mark.parametrize("mutate, needle", [
    (lambda d: d.update(colour="red"), "unknown key 'colour'"),
    (lambda d: d["grid"].update(nodez=[2]), "unknown key 'nodez'"),
    (lambda d: d.update(grid={}), "'grid' must be a non-empty mapping"),
    (lambda d: d["grid"].update(nodes=[]), "empty list"),
    (lambda d: d["fixed"].update(cluster="no-such-cluster"), "unknown cluster preset"),
    (lambda d: d["grid"].update(algo=["ring", "butterfly"]), "'butterfly' is not known"),
    (lambda d: d["fixed"].update(size="lots"), "is not a size"),
    (lambda d: d.update(kind="stepz"), "kind 'stepz'"),
    (lambda d: d.update(mode="fast"), "mode 'fast'"),
    (lambda d: d.update(figures=["piechart"]), "'piechart' is not known"),
    (lambda d: d["fixed"].update(nodes=2), "in both grid and fixed"),
])
def test_bad_spec_is_an_input_error(mutate, needle):
    data = yaml.safe_load(yaml.safe_dump(SMALL))
    mutate(data)
    with pytest.raises(InputError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        sweep_from_dict(data)


def test_bad_step_spec_names_the_strategy():
    data = {"kind": "step", "grid": {"strategy": ["NIG", "GIN"]},
            "fixed": {"model": "llama-7b"}}
    with pytest.raises(InputError, match="GIN is invalid"):
        sweep_from_dict(data)
    data["grid"]["strategy"] = ["NIG", "XYZ"]
    with pytest.raises(InputError, match="strategy 'XYZ' is not known"):
        sweep_from_dict(data)
    with pytest.raises(InputError, match="unknown model"):
        sweep_from_dict({"kind": "step", "grid": {"model": ["llama-7b", "llama-8t"]}})


def test_missing_spec_file_and_unwritable_out_dir(tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        load_sweep_spec(tmp_path / "nope.yaml")
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    with pytest.raises(InputError, match="not writable"):
        run_sweep(sweep_from_dict(SMALL), blocker / "out", workers=1, progress=False)
    assert not list(tmp_path.glob("**/results.csv"))  # no work started


def test_bad_spec_exits_2_with_one_line(tmp_path):
    spec = _write_spec(tmp_path, {**SMALL, "colour": "red"})
    r = subprocess.run([sys.executable, "-m", "parosim.sweep", str(spec), "--out",
                        str(tmp_path / "o")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "unknown key 'colour'" in lines[0]
    assert not (tmp_path / "o").exists()


def test_cli_sweep_subcommand_when_wired(tmp_path):
    from parosim import cli

    if "sweep" not in cli.COMMANDS:
        pytest.skip("parosim sweep not wired into the CLI yet")
    spec = _write_spec(tmp_path, {**SMALL, "grid": {"nodes": [2], "algo": ["nope"]}})
    r = subprocess.run([sys.executable, "-m", "parosim.cli", "sweep", str(spec), "--out",
                        str(tmp_path / "o")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    assert "'nope' is not known" in r.stderr


# --- rows --------------------------------------------------------------------------------------

def test_bad_combination_is_an_error_row_not_an_exception():
    row = evaluate({"kind": "collective", "mode": "engine", "cluster": "paper-a100-roce",
                    "nodes": 4, "group_nodes": 3, "op": "all-gather", "size": "1MB",
                    "algo": "ring"})
    assert row["status"] == "error" and "does not divide" in row["reason"]


def test_analytic_and_engine_rows_agree_for_a_ring():
    p = {"kind": "collective", "cluster": "paper-a100-roce", "nodes": 4, "op": "all-gather",
         "scope": "global", "size": "1GB", "algo": "ring"}
    eng = evaluate({**p, "mode": "engine"})
    ana = evaluate({**p, "mode": "analytic"})
    assert eng["status"] == ana["status"] == "ok"
    assert ana["time_s"] == pytest.approx(eng["time_s"], rel=1e-6)
    assert ana["events"] == 0 and eng["events"] > 0
    # busbw of a flat ring over n GPUs is bounded by the NIC's 100 Gbps shared by 8 GPUs ...
    # times n / ... : the bottleneck hop is one NIC per node, 12.5 GB/s.
    assert eng["busbw_GBps"] == pytest.approx(12.5, rel=0.01)


def test_bandwidth_override_changes_the_nic():
    p = {"kind": "collective", "mode": "analytic", "cluster": "paper-a100-roce", "nodes": 4,
         "op": "all-gather", "size": "1GB", "algo": "ring"}
    slow, fast = evaluate(p), evaluate({**p, "nic_bandwidth": "200Gbps"})
    assert fast["busbw_GBps"] == pytest.approx(2 * slow["busbw_GBps"], rel=0.01)


def test_sweep_writes_documented_columns_and_rows_in_grid_order(tmp_path):
    spec = sweep_from_dict({**SMALL, "figures": ["collectives"]})
    res = run_sweep(spec, tmp_path, workers=1, progress=False)
    assert (res["points"], res["done"], res["skipped"], res["failed"]) == (6, 6, 0, 0)
    rows = _rows(tmp_path / "results.csv")
    assert rows[0] == list(COLUMNS["collective"])
    assert [r[0] for r in rows[1:]] == [point_id(p) for p in spec.points()]
    doc = (tmp_path / "columns.md").read_text()
    for col in COLUMNS["collective"]:
        assert f"`{col}`" in doc
    assert all(c for c in COLUMNS["collective"].values())
    assert sorted(Path(p).suffix for p in res["figures"]) == [".png", ".svg"]
    again = run_sweep(spec, tmp_path, workers=1, progress=False)
    assert (again["done"], again["skipped"]) == (0, 6)
    assert _rows(tmp_path / "results.csv") == rows


def test_local_pool_gives_the_same_rows_as_serial(tmp_path):
    spec = sweep_from_dict(SMALL)
    run_sweep(spec, tmp_path / "a", workers=1, progress=False)
    run_sweep(spec, tmp_path / "b", workers=2, progress=False)
    assert _rows(tmp_path / "a" / "results.csv") == _rows(tmp_path / "b" / "results.csv")


# --- resume ------------------------------------------------------------------------------------

def test_torn_last_line_and_lost_rows_are_recomputed(tmp_path):
    spec = sweep_from_dict(SMALL)
    run_sweep(spec, tmp_path / "ref", workers=1, progress=False)
    ref = (tmp_path / "ref" / "results.csv").read_text()
    lines = ref.splitlines(keepends=True)
    # rows 1, 4 and 2 finished (completion order differs from grid order), row 5 was torn
    torn = lines[0] + lines[1] + lines[4] + lines[2] + lines[5][: len(lines[5]) // 2]
    out = tmp_path / "resumed"
    out.mkdir()
    (out / "results.csv").write_text(torn)
    res = run_sweep(spec, out, workers=1, progress=False)
    assert (res["skipped"], res["done"], res["dropped_lines"]) == (3, 3, 1)
    assert (out / "results.csv").read_text() == ref


def test_results_of_another_sweep_kind_are_refused(tmp_path):
    run_sweep(sweep_from_dict(SMALL), tmp_path, workers=1, progress=False)
    with pytest.raises(InputError, match="different sweep"):
        ResultsLog(tmp_path / "results.csv", list(COLUMNS["step"]))


def _data_rows(path: Path) -> int:
    try:
        return max(0, path.read_text().count("\n") - 1)
    except FileNotFoundError:
        return 0


@pytest.fixture(scope="module")
def long_reference(tmp_path_factory) -> str:
    """results.csv of the LONG sweep run once, uninterrupted, in this process."""
    out = tmp_path_factory.mktemp("ref")
    run_sweep(sweep_from_dict(LONG), out, workers=1, progress=False)
    return (out / "results.csv").read_text()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["SIGINT", "SIGKILL"])
def test_killed_sweep_resumes_to_the_same_file(tmp_path, sig, long_reference):
    spec_path = _write_spec(tmp_path, LONG)
    total = len(sweep_from_dict(LONG).points())
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "parosim.sweep", str(spec_path), "--out", str(out),
           "--workers", "2", "--no-progress"]
    proc = subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while _data_rows(out / "results.csv") < 5 and time.monotonic() < deadline:
        time.sleep(0.02)
    os.killpg(proc.pid, sig)  # like Ctrl-C / kill -9 of the whole job
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == (130 if sig == signal.SIGINT else -signal.SIGKILL), err
    done_before = _data_rows(out / "results.csv")
    assert 5 <= done_before < total, "the kill should land mid-sweep"
    r = subprocess.run(cmd + ["--json"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    summary = yaml.safe_load(r.stdout)
    assert summary["skipped"] >= 5 and summary["skipped"] + summary["done"] == total
    assert (out / "results.csv").read_text() == long_reference


# --- keys: input file contents and the parosim version ------------------------------------------

def _small_cluster(path: Path, nic_bandwidth: str) -> None:
    text = (ROOT / "topologies" / "paper-a100-roce.yaml").read_text()
    assert "  bandwidth: 100Gbps" in text  # the NIC line the edit below rewrites
    path.write_text(text.replace("  bandwidth: 100Gbps", f"  bandwidth: {nic_bandwidth}"))


def _sweep_cli(args: list[str], capsys) -> tuple[int, str]:
    from parosim.cli.commands import main

    rc = main(["sweep", *args, "--workers", "1", "--no-progress"])
    return rc, capsys.readouterr().out


def test_sweep_reruns_points_whose_cluster_yaml_changed_and_says_so(tmp_path, capsys):
    cluster = tmp_path / "my-cluster.yaml"
    _small_cluster(cluster, "100Gbps")
    spec = _write_spec(tmp_path, {
        "name": "edit", "kind": "step", "mode": "analytic",
        "grid": {"strategy": ["IIG", "GGG"]},
        "fixed": {"model": "llama-7b", "cluster": str(cluster), "nodes": 4}})
    out = tmp_path / "out"
    rc, msg = _sweep_cli([str(spec), "--out", str(out)], capsys)
    assert rc == 0 and "(0 resumed, 2 run" in msg and "changed" not in msg
    before = _rows(out / "results.csv")
    col = before[0].index("step_time_s")

    _small_cluster(cluster, "25Gbps")  # a quarter of the NIC bandwidth: slower steps
    rc, msg = _sweep_cli([str(spec), "--out", str(out)], capsys)
    assert rc == 0 and "(0 resumed, 2 run" in msg, msg
    assert f"1 input changed since the last run (cluster {str(cluster)!r}): re-ran 2 points" \
        in msg
    after = _rows(out / "results.csv")
    assert len(after) == 3
    for old, new in zip(before[1:], after[1:], strict=True):
        assert old[0] != new[0] and float(new[col]) > float(old[col])
    # the same as a sweep that never saw the old file
    rc, _ = _sweep_cli([str(spec), "--out", str(tmp_path / "clean")], capsys)
    assert _rows(tmp_path / "clean" / "results.csv") == after

    rc, msg = _sweep_cli([str(spec), "--out", str(out)], capsys)  # unchanged: all resumed
    assert rc == 0 and "(2 resumed, 0 run" in msg and "changed" not in msg, msg
    assert _rows(out / "results.csv") == after

    rc, msg = _sweep_cli([str(spec), "--out", str(out), "--fresh"], capsys)
    assert rc == 0 and "(0 resumed, 2 run" in msg and "--fresh" in msg, msg
    assert _rows(out / "results.csv") == after


def test_sweep_same_inputs_give_byte_identical_results(tmp_path):
    spec = sweep_from_dict(SMALL)
    for d in ("a", "b"):
        run_sweep(spec, tmp_path / d, workers=1, progress=False)
    run_sweep(spec, tmp_path / "b", workers=2, progress=False, fresh=True)
    for name in ("results.csv", "inputs.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


@pytest.mark.parametrize("key,name,text", [
    ("cluster", "c.yaml", None),
    ("model", "m.yaml", "layers: 2\nhidden: 64\nheads: 2\nvocab: 100\n"),
    ("model", "config.json", '{"model_type": "llama"}'),
    ("runtime", "r.yaml", "name: r\n"),
], ids=["cluster-yaml", "model-yaml", "model-config-json", "runtime-yaml"])
def test_sweep_point_id_follows_every_input_files_contents(tmp_path, key, name, text):
    f = tmp_path / name
    f.write_text(text if text is not None
                 else (ROOT / "topologies" / "paper-a100-roce.yaml").read_text())
    point = {"kind": "step", "mode": "analytic", key: str(f)}
    first = point_id(point)
    assert point_id(point) == first
    f.write_text(f.read_text() + "\n# edited\n")
    assert point_id(point) != first, f"{key} file contents are not in the key"


@pytest.mark.parametrize("key,env,preset", [("cluster", "PAROSIM_TOPOLOGIES", "paper-a100-roce"),
                                            ("runtime", "PAROSIM_RUNTIMES", "ideal")])
def test_sweep_point_id_follows_preset_file_contents(tmp_path, monkeypatch, key, env, preset):
    src = ROOT / ("topologies" if key == "cluster" else "runtimes") / f"{preset}.yaml"
    (tmp_path / f"{preset}.yaml").write_text(src.read_text())
    monkeypatch.setenv(env, str(tmp_path))
    given, defaulted = {"kind": "step", key: preset}, {"kind": "step"}
    ids = point_id(given), point_id(defaulted)
    (tmp_path / f"{preset}.yaml").write_text(src.read_text() + "\n# edited\n")
    assert point_id(given) != ids[0] and point_id(defaulted) != ids[1]


def test_sweep_point_id_follows_the_parosim_version_and_says_so(tmp_path, monkeypatch):
    import parosim

    spec = sweep_from_dict({**SMALL, "mode": "analytic"})
    first = point_id(spec.points()[0])
    run_sweep(spec, tmp_path, workers=1, progress=False)
    monkeypatch.setattr(parosim, "__version__", parosim.__version__ + ".post1")
    assert point_id(spec.points()[0]) != first
    res = run_sweep(spec, tmp_path, workers=1, progress=False)
    assert (res["done"], res["skipped"], res["rerun_changed"]) == (6, 0, 6)
    assert res["inputs_changed"] == ["parosim version"] and res["stale"] == 6


def test_sweep_fresh_is_in_help_and_docs(capsys):
    from parosim.cli.commands import main

    with pytest.raises(SystemExit):
        main(["sweep", "--help"])
    assert "--fresh" in capsys.readouterr().out
    assert "--fresh" in (ROOT / "docs" / "sweeps.md").read_text()


def test_run_all_sh_writes_into_a_new_directory(tmp_path):
    """experiments/run_all.sh with a stub python: every --out is under one new directory
    outside the repository, never a committed experiments/*/out."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "calls.txt"
    (bin_dir / "python").write_text(f'#!/bin/sh\necho "$@" >> {log}\n')
    (bin_dir / "python").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "TMPDIR": str(tmp_path)}
    outs = []
    for _ in range(2):
        log.unlink(missing_ok=True)
        r = subprocess.run(["bash", "experiments/run_all.sh", "3"], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        calls = [c.split() for c in log.read_text().splitlines()]
        assert len(calls) == len(list(ROOT.glob("experiments/[0-9]*/sweep.yaml"))) > 0
        dirs = [Path(c[c.index("--out") + 1]) for c in calls]
        assert all(c[c.index("--workers") + 1] == "3" for c in calls)
        root = {d.parent for d in dirs}
        assert len(root) == 1 and root.pop().parent == tmp_path
        outs.append(dirs[0].parent)
    assert outs[0] != outs[1]  # each run a new directory
    r = subprocess.run(["bash", "experiments/run_all.sh", "2", str(tmp_path / "mine")],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and str(tmp_path / "mine" / "01_paper_32gpu") in log.read_text()
