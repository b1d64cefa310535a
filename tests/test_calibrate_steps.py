"""parosim calibrate --steps: recovers a known compute scale, reports held-out error, writes a
cluster YAML that loads, refuses bad CSVs with one line."""

from dataclasses import replace

import pytest

from parosim.calibrate_steps import StepRun, _scaled, read_steps, simulate_run
from parosim.cli import main
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
