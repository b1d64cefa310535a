"""parosim calibrate --steps: recovers a known compute scale, reports held-out error, writes a
cluster YAML that loads, refuses bad CSVs with one line."""

from dataclasses import replace

import pytest

from parosim.calibrate.steps import StepRun, _scaled, read_steps, simulate_run
from parosim.cli.commands import main
from parosim.io import load_cluster

ROWS = [("mpt-1b", "GGG", 1, 8, 4, 2048), ("mpt-7b", "GGG", 1, 4, 2, 2048),
        ("llama-7b", "NIG", 2, 4, 4, 2048), ("mpt-350m", "NNN", 1, 16, 1, 2048)]


@pytest.fixture()
def runs_csv(tmp_path):
    base = load_cluster("llm-foundry-a100-roce")
    true = _scaled(replace(base.compute, model="kernel"), 0.7)
    lines = ["model,strategy,nodes,micro_batch,accum,seq_len,step_time_s"]
    for m, s, n, b, acc, sl in ROWS:
        t = simulate_run(StepRun(0, m, s, n, b, acc, sl, 1.0), base, true)
        lines.append(f"{m},{s},{n},{b},{acc},{sl},{t!r}")
    p = tmp_path / "runs.csv"
    p.write_text("\n".join(lines) + "\n")
    return p


def test_recovers_known_scale_and_writes_loadable_yaml(runs_csv, tmp_path, capsys):
    out = tmp_path / "cal.yaml"
    assert main(["calibrate", "--steps", str(runs_csv), "--cluster", "llm-foundry-a100-roce",
                 "--holdout", "every-other", "-o", str(out), "--json"]) == 0
    import json
    res = json.loads(capsys.readouterr().out)
    assert res["scale"] == pytest.approx(0.7, rel=1e-3)
    assert res["held_out"]["n"] == 2 and res["held_out"]["max_abs_error_pct"] < 0.5
    c = load_cluster(str(out))
    assert c.compute.model == "kernel"
    assert c.compute.attention_efficiency == pytest.approx(0.7 * 0.327, rel=1e-3)


def test_errors_are_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    bad.write_text("model,strategy,nodes\nllama-7b,GGG,1\n")
    assert main(["calibrate", "--steps", str(bad), "--cluster", "paper-a100-roce",
                 "-o", str(tmp_path / "x.yaml")]) == 2
    err = capsys.readouterr().err.strip()
    assert "missing column" in err and "micro_batch" in err and len(err.splitlines()) == 1
    bad.write_text("model,strategy,nodes,micro_batch,accum,seq_len,step_time_s\n"
                   "llama-7b,GGG,1,4,1,512,-3\n")
    with pytest.raises(Exception, match="step_time_s"):
        read_steps(bad)
    bad.write_text("model,strategy,nodes,micro_batch,accum,seq_len,step_time_s,color\n")
    with pytest.raises(Exception, match="unknown column"):
        read_steps(bad)


def test_3d_rows_tp_pp_selective_recover_known_scale(tmp_path, capsys):
    """Megatron-style rows (tp, pp, virtual, sequence_parallel, recompute selective) are
    simulated on the 3D path; a scale of 0.8 is recovered and rows held out match."""
    base = load_cluster("dgx-a100-ib")
    true = _scaled(replace(base.compute, model="kernel"), 0.8)
    rows = [("llama-13b", "NNN", 2, 1, 16, 2048, dict(tp=8, pp=2)),
            ("llama-7b", "NNN", 1, 2, 8, 2048, dict(tp=4, pp=2, virtual=2)),
            ("llama-13b", "NNG", 2, 1, 8, 2048, dict(tp=8, pp=1, sequence_parallel=True,
                                                      recompute="selective")),
            ("llama-7b", "NNN", 1, 4, 4, 2048, dict(tp=2, pp=4, recompute="on"))]
    lines = ["model,strategy,nodes,micro_batch,accum,seq_len,step_time_s,tp,pp,virtual,"
             "sequence_parallel,recompute,attention"]
    for m, s, n, b, acc, sl, kw in rows:
        r = StepRun(0, m, s, n, b, acc, sl, 1.0, attention="eager", **kw)
        assert r.is_3d
        t = simulate_run(r, base, true)
        lines.append(f"{m},{s},{n},{b},{acc},{sl},{t!r},{kw['tp']},{kw['pp']},"
                     f"{kw.get('virtual', 1)},{'on' if kw.get('sequence_parallel') else 'off'},"
                     f"{kw.get('recompute', 'auto')},eager")
    p = tmp_path / "mega.csv"
    p.write_text("\n".join(lines) + "\n")
    assert main(["calibrate", "--steps", str(p), "--cluster", "dgx-a100-ib", "--holdout",
                 "every-other", "-o", str(tmp_path / "c.yaml"), "--json"]) == 0
    import json
    res = json.loads(capsys.readouterr().out)
    assert res["scale"] == pytest.approx(0.8, rel=1e-3)
    assert res["held_out"]["n"] == 2 and res["held_out"]["max_abs_error_pct"] < 0.5
    # the 3D path really ran: a TP 8 step differs from the same row without TP
    r3 = StepRun(0, "llama-13b", "NNN", 2, 1, 16, 2048, 1.0, tp=8, pp=2)
    r1 = StepRun(0, "llama-13b", "NNN", 2, 1, 16, 2048, 1.0)
    assert simulate_run(r3, base, true) != simulate_run(r1, base, true)


def test_3d_columns_refuse_bad_values(tmp_path):
    head = "model,strategy,nodes,micro_batch,accum,seq_len,step_time_s,tp,sequence_parallel\n"
    bad = tmp_path / "bad.csv"
    bad.write_text(head + "llama-7b,NNN,1,1,4,2048,3.0,2,maybe\n")
    with pytest.raises(Exception, match="sequence_parallel = 'maybe'"):
        read_steps(bad)
    bad.write_text(head + "llama-7b,NNN,1,1,4,2048,3.0,0,off\n")
    with pytest.raises(Exception, match="tp = '0'"):
        read_steps(bad)
    bad.write_text(head.replace(",sequence_parallel", ",runtime")
                   + "llama-7b,NNN,1,1,4,2048,3.0,2,fsdp\n")
    (run,) = read_steps(bad)
    base = load_cluster("dgx-a100-ib")
    # a runtime on a TP row is the 3D path's: fsdp's per-micro-step sync is refused there,
    # naming the line
    with pytest.raises(Exception, match="line 2: --runtime fsdp synchronises gradients"):
        simulate_run(run, base, replace(base.compute, model="kernel"))


def test_standard_errors_closed_form_and_unseparable_parameters():
    """One standard error is s^2 (J^T J)^-1 in log space: a straight line's closed form; two
    parameters the rows move only together are unbounded, a third one is not affected."""
    import numpy as np

    from parosim.calibrate.scale import se_warnings, standard_errors

    x = np.array([0.0, 1.0, 2.0, 3.0, 4.0])
    r = np.array([0.01, -0.02, 0.015, -0.005, 0.0])
    jac = np.stack([np.ones(5), x], axis=1)      # d resid / d ln(a), d resid / d ln(b)
    se = standard_errors(jac, r, {"a": 2.0, "b": 3.0}, [False, False])
    s2 = float(r @ r) / 3
    sxx = float(((x - x.mean()) ** 2).sum())
    assert se["dof"] == 3
    assert se["params"]["b"]["factor"] == pytest.approx(np.exp(np.sqrt(s2 / sxx)), rel=1e-9)
    assert se["params"]["a"]["factor"] == pytest.approx(
        np.exp(np.sqrt(s2 * (1 / 5 + x.mean() ** 2 / sxx))), rel=1e-9)
    assert se["params"]["b"]["low"] == pytest.approx(3.0 / se["params"]["b"]["factor"])
    # a linear parameter: its column times its value gives the log-space column
    lin = standard_errors(jac * [1.0, 1 / 3.0], r, {"a": 2.0, "b": 3.0}, [False, True])
    assert lin["params"]["b"]["factor"] == pytest.approx(se["params"]["b"]["factor"])
    # c and d enter only as their product: both unbounded, a keeps its error; c warns
    jac3 = np.stack([np.ones(5), x, x], axis=1)
    un = standard_errors(jac3, r, {"a": 2.0, "c": 1.0, "d": 1.0}, [False] * 3)
    assert un["params"]["c"]["factor"] is None and un["params"]["d"]["low"] is None
    assert un["params"]["a"]["factor"] > 1
    ws = se_warnings(un, {"a": True, "c": True, "d": False})
    assert len(ws) == 1 and ws[0].startswith("c poorly identified: one standard error is "
                                             "unbounded")
    # more parameters than rows: said once, no range
    few = standard_errors(jac3[:2], r[:2], {"a": 2.0, "c": 1.0, "d": 1.0}, [False] * 3)
    assert few["dof"] == -1 and few["params"]["a"]["factor"] is None
    ws = se_warnings(few, {})
    assert len(ws) == 1 and "dof = -1" in ws[0] and "undefined" in ws[0]


def test_steps_at_many_node_counts_identify_known_parameters(tmp_path, capsys):
    """Rows simulated with a known compute scale (0.8), NIC bandwidth (15 GB/s) and ring step
    cost (20 us) at 1-64 nodes, with +-1.2 % noise: every parameter is well identified (no
    warning) and each one-standard-error range contains the truth."""
    import json

    from parosim.calibrate.links import make_param

    base = load_cluster("llm-foundry-a100-roce")
    bw, sl = make_param("nic.bandwidth"), make_param("collective.step_latency")
    truth = sl.set(bw.set(base, 15e9), 20e-6)
    prof = _scaled(replace(base.compute, model="kernel"), 0.8)
    noise = [0.01, -0.012, 0.006, -0.004, 0.009, -0.008, 0.003, -0.01, 0.007, -0.005, 0.0,
             0.011, -0.006, 0.004]
    lines = ["model,strategy,nodes,micro_batch,accum,seq_len,step_time_s"]
    for s in ("GGG", "NNG"):
        for n in (1, 2, 4, 8, 16, 32, 64):
            t = simulate_run(StepRun(0, "mpt-7b", s, n, 2, 1, 2048, 1.0), truth, prof)
            lines.append(f"mpt-7b,{s},{n},2,1,2048,{t * (1 + noise[len(lines) - 1])!r}")
    p = tmp_path / "scales.csv"
    p.write_text("\n".join(lines) + "\n")
    argv = ["calibrate", "--steps", str(p), "--cluster", "llm-foundry-a100-roce", "-o",
            str(tmp_path / "c.yaml"), "--params", "nic.bandwidth,collective.step_latency"]
    assert main([*argv, "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["warnings"] == [] and res["dof"] == 14 - 4
    se = res["standard_errors"]
    for name, true in (("compute.scale", 0.8), ("compute.overlap_slowdown", 1.0),
                       ("nic.bandwidth", 15e9), ("collective.step_latency", 20e-6)):
        assert se[name]["low"] <= true <= se[name]["high"], name
        assert se[name]["factor"] < 1.1, name      # measured 1.006-1.038
    assert se["nic.bandwidth"]["value"] == res["cluster_params"]["nic.bandwidth"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "one standard error (s^2 (J^T J)^-1 in log space, dof 10):" in out
    assert "collective.step_latency: 20 us (one standard error: 19.6 us-20.3 us" in out
    assert "warning" not in out
    assert "# nic.bandwidth = 14.7 GB/s (one standard error:" in (tmp_path / "c.yaml").read_text()


def test_calibrated_nodes_written_and_runs_beyond_them_cautioned(tmp_path, capsys):
    """calibrate writes the node counts its fit saw; simulate on more nodes says the
    scale-dependent costs are extrapolated there (text and JSON), within them says nothing."""
    import json

    from parosim.cli import main
    from parosim.io import load_cluster

    out = tmp_path / "c.yaml"
    assert main(["calibrate", "--nccl-tests", "tests/data/nccl-tests/aws-p4de-2node-all_reduce.txt",
                 "--cluster", "aws-p4de", "-o", str(out), "--json"]) == 0
    capsys.readouterr()
    assert load_cluster(str(out)).calibrated_nodes == (2,)
    args = ["simulate", "--cluster", str(out), "--strategy", "NNG", "--mode", "analytic"]
    assert main([*args, "--nodes", "2", "--json"]) == 0
    assert not any("calibrated on runs" in w
                   for w in json.loads(capsys.readouterr().out).get("warnings", []))
    assert main([*args, "--nodes", "16", "--json"]) == 0
    warns = json.loads(capsys.readouterr().out)["warnings"]
    assert any("calibrated on runs of 2 nodes; 16 nodes lie 8x beyond" in w for w in warns)
    assert main([*args, "--nodes", "16"]) == 0
    assert "caution: cluster" in capsys.readouterr().out
    # a sweep row says the same in its warnings column
    from parosim.simulate.point import run_point

    point = {"cluster": str(out), "strategy": "NNG", "mode": "analytic"}
    assert "calibrated on runs of 2 nodes" in run_point({**point, "nodes": 16})["warnings"]
    assert run_point({**point, "nodes": 2})["warnings"] == ""
    # the field is checked when read
    bad = tmp_path / "bad.yaml"
    bad.write_text(out.read_text().replace("calibrated_nodes:\n- 2", "calibrated_nodes: [0]"))
    assert main(["simulate", "--cluster", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "calibrated_nodes" in err and "positive integers" in err
