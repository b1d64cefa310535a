"""``--fidelity accurate`` (the default) and ``--fidelity paper``: which models fill the
unset settings, the settings every output echoes (resolved, never null, only what applied),
the sweep key, and the plausibility notes (docs/accuracy.md, "Defaults")."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from parosim.cli import main
from parosim.simulate.plausible import plausibility_notes
from parosim.simulate.point import run_point
from parosim.spec.training import TrainingSpec, for_fidelity


def _json(argv: list[str]) -> dict:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(argv + ["--json"])
    assert rc == 0, argv
    return json.loads(out.getvalue())


def _nulls(x, path="") -> list[str]:
    if isinstance(x, dict):
        return [p for k, v in x.items() for p in _nulls(v, f"{path}/{k}")]
    return [path] if x is None else []


SMALL = ["--nodes", "2", "--mode", "analytic"]
ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("argv", [
    ["simulate", "--strategy", "NIG", *SMALL],
    ["simulate", "--strategy", "NIG", *SMALL, "--fidelity", "paper"],
    ["compare", *SMALL],
    ["memory", "--nodes", "2", "--strategy", "GGG"],
    ["run", *SMALL, "--tokens", "1B", "--replications", "5"],
    ["simulate", "--model", "llama-13b", "--cluster", "dgx-a100-ib", "--tp", "4",
     "--micro-batch", "1", "--accum", "4", *SMALL],
    ["simulate", "--strategy", "zero2", "--runtime", "deepspeed", *SMALL],
])
def test_settings_name_every_model_and_hold_no_null(argv):
    out = _json(argv)
    s = out["settings"]
    assert not _nulls(s), _nulls(s)
    for k in ("fidelity", "attention", "memory_model", "logit_bytes", "precision"):
        assert k in s, k
    # the memory block names the same settings as the run's (the TP path once said "eager")
    for mem in [out["memory"]] if "memory" in out else []:
        assert {k: mem[k] for k in ("attention", "memory_model", "logit_bytes")} == {
            k: s[k] for k in ("attention", "memory_model", "logit_bytes")}, argv
    if argv[0] == "memory":   # no step is timed: no compute model, efficiency or slowdown
        assert not {"compute_model", "compute_efficiency", "overlap_slowdown"} & set(s)
        return
    assert "compute_model" in s and "overlap_slowdown" in s
    # the efficiency is echoed only where it applied: the flat compute model
    assert ("compute_efficiency" in s) == (s["compute_model"] == "flat")


def test_accurate_defaults_and_the_paper_switch():
    acc = _json(["simulate", "--strategy", "NIG", *SMALL])
    pap = _json(["simulate", "--strategy", "NIG", *SMALL, "--fidelity", "paper"])
    assert acc["settings"]["fidelity"] == "accurate" and pap["settings"]["fidelity"] == "paper"
    assert (acc["algo"], pap["algo"]) == ("nccl", "ho-ring")
    a, p = acc["settings"], pap["settings"]
    assert (a["compute_model"], a["attention"], a["memory_model"], a["logit_bytes"]) == (
        "kernel", "flash", "runtime", 6)
    assert (p["compute_model"], p["attention"], p["memory_model"], p["logit_bytes"]) == (
        "flat", "eager", "korthikanti", 4)
    assert p["compute_efficiency"] == 0.5 and "compute_efficiency" not in a
    # the memory rows say the same models
    assert (acc["memory"]["attention"], acc["memory"]["memory_model"]) == ("flash", "runtime")
    # explicit flags win over the fidelity
    mixed = _json(["simulate", "--strategy", "NIG", *SMALL, "--attention", "eager",
                   "--compute-model", "flat", "--algo", "ring"])
    assert (mixed["settings"]["attention"], mixed["settings"]["compute_model"],
            mixed["algo"]) == ("eager", "flat", "ring")
    assert mixed["settings"]["memory_model"] == "runtime"


def test_layouts_and_runtimes_keep_their_own_memory_settings():
    t = for_fidelity(TrainingSpec(), "accurate", layered=True)
    assert (t.compute_model, t.attention, t.memory_model) == ("kernel", "flash", None)

    class Profile:  # a runtime profile other than the ideal one
        name = "deepspeed"
    t = for_fidelity(TrainingSpec(), "accurate", Profile())
    assert (t.compute_model, t.attention, t.memory_model) == ("kernel", None, None)
    ds = _json(["simulate", "--strategy", "zero2", "--runtime", "deepspeed", *SMALL])
    assert (ds["settings"]["attention"], ds["settings"]["memory_model"]) == ("eager",
                                                                             "runtime")


def test_bad_fidelity_is_one_line_exit_2(capsys):
    with pytest.raises(SystemExit) as e:
        main(["simulate", "--fidelity", "best"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--fidelity" in err and len(err.strip().splitlines()) == 1


def test_sweep_key_matches_the_command_line():
    # a point without the key runs the command line's default (accurate), as simulate does
    cli = _json(["simulate", "--strategy", "NIG", *SMALL])
    for point in ({"strategy": "NIG", "mode": "analytic", "nodes": 2},
                  {"strategy": "NIG", "mode": "analytic", "nodes": 2, "fidelity": "accurate"}):
        row = run_point(point)
        assert row["step_time_s"] == cli["step_time_s"]
        assert row["total_bytes"] == cli["memory"]["total_bytes"]
    paper = _json(["simulate", "--strategy", "NIG", *SMALL, "--fidelity", "paper"])
    row = run_point({"strategy": "NIG", "mode": "analytic", "nodes": 2, "fidelity": "paper"})
    assert row["step_time_s"] == paper["step_time_s"]
    bad = run_point({"strategy": "NIG", "mode": "analytic", "fidelity": "best"})
    assert bad["status"] == "error" and "fidelity" in bad["reason"]


def test_plausibility_notes():
    s = {"precision": "bf16", "micro_batch": 4, "seq_len": 512}
    assert plausibility_notes(s, "A100-SXM4-80GB", [{"mfu": 0.6}]) == []
    assert plausibility_notes(s, "H100-SXM5-80GB", [{"mfu": 0.6}]) == []
    (gpu,) = plausibility_notes(s, "V100-SXM2-32GB", [{"mfu": 0.3}])
    assert "V100" in gpu and "no published run" in gpu
    (fp8,) = plausibility_notes({**s, "precision": "fp8"}, "H200-SXM", compute=True)
    assert "fp8" in fp8
    (mfu,) = plausibility_notes(s, "A100", [{"mfu": 0.71, "label": "IIG"}])
    assert mfu.startswith("MFU 0.71 (IIG) is above 0.70")
    # FP8 MFU is against the bf16 peak: the published FP8 rows reach 0.85 of it
    assert plausibility_notes({**s, "precision": "fp8"}, "H100", [{"mfu": 0.8}]) == []
    assert plausibility_notes({**s, "precision": "fp8"}, "H100", [{"mfu": 0.9}])
    big = {**s, "micro_batch": 512}
    (mb,) = plausibility_notes(big, "A100", compute=False)
    assert "262144 tokens" in mb
    assert plausibility_notes({**s, "micro_batch": 384}, "A100") == []   # 196,608: 2x the row


def test_notes_reach_text_and_json(capsys):
    r = _json(["memory", "--nodes", "2", "--strategy", "GGG", "--micro-batch", "512"])
    assert len(r["warnings"]) == 1 and "micro-batch 512" in r["warnings"][0]
    main(["memory", "--nodes", "2", "--strategy", "GGG", "--micro-batch", "512"])
    out = capsys.readouterr().out
    assert "caution: micro-batch 512" in out
    ok = _json(["simulate", "--strategy", "NIG", *SMALL])
    assert "warnings" not in ok


def test_a_cluster_yaml_that_states_its_compute_model_keeps_it(tmp_path):
    import yaml

    from parosim.io import load_cluster
    from parosim.io.cluster import cluster_to_yaml

    d = yaml.safe_load((ROOT / "topologies" / "paper-a100-roce.yaml").read_text())
    d["compute"] = {"model": "flat"}
    p = tmp_path / "flat.yaml"
    p.write_text(yaml.safe_dump(d))
    s = _json(["simulate", "--cluster", str(p), *SMALL])["settings"]
    assert (s["compute_model"], s["compute_efficiency"], s["attention"]) == ("flat", 0.5,
                                                                             "flash")
    # a cluster without compute.model takes the fidelity's; written back, it stays unset
    from dataclasses import replace

    c = load_cluster("paper-a100-roce")
    assert not c.compute.model_given
    tuned = replace(c, compute=replace(c.compute, gemm_k_half=500.0))
    assert "model" not in yaml.safe_load(cluster_to_yaml(tuned))["compute"]
    given = load_cluster(str(p))
    assert given.compute.model_given
    assert yaml.safe_load(cluster_to_yaml(given))["compute"]["model"] == "flat"


def test_an_efficiency_selects_the_flat_model(capsys):
    s = _json(["simulate", "--strategy", "NIG", *SMALL, "--efficiency", "0.6"])["settings"]
    assert (s["compute_model"], s["compute_efficiency"]) == ("flat", 0.6)
    assert s["attention"] == "flash"          # the other accurate models stay
    assert main(["simulate", *SMALL, "--efficiency", "0.6", "--compute-model", "kernel"]) == 2
    err = capsys.readouterr().err
    assert "--efficiency" in err and len(err.strip().splitlines()) == 1


def test_jobs_fidelity_key(tmp_path):
    """A job with ``fidelity: accurate``, or without the key (simulate's default), runs
    simulate's default models: alone on its two nodes it takes the step ``simulate`` gives
    by default; with ``fidelity: paper``, the paper's closed forms."""
    path = tmp_path / "jobs.yaml"
    path.write_text("cluster: paper-a100-roce\nnodes: 6\njobs:\n"
                    "  - {name: a, strategy: NIG, nodes: [0, 1], fidelity: accurate}\n"
                    "  - {name: b, strategy: NIG, nodes: [2, 3], fidelity: paper}\n"
                    "  - {name: c, strategy: NIG, nodes: [4, 5]}\n")
    jobs = {j["name"]: j for j in _json(["simulate", "--jobs", str(path)])["jobs"]}
    step = _json(["simulate", "--strategy", "NIG", "--nodes", "2"])["step_time_s"]
    assert jobs["a"]["step_time_alone_s"] == pytest.approx(step, rel=1e-9)
    assert jobs["c"]["step_time_alone_s"] == jobs["a"]["step_time_alone_s"]
    assert jobs["c"]["settings"] == jobs["a"]["settings"]
    paper = _json(["simulate", "--strategy", "NIG", "--nodes", "2", "--fidelity", "paper"])
    assert jobs["b"]["step_time_alone_s"] == pytest.approx(paper["step_time_s"], rel=1e-9)
    assert jobs["a"]["algo"] == "nccl" and jobs["b"]["algo"] == "ho-ring"
    a, b = jobs["a"]["settings"], jobs["b"]["settings"]
    assert (a["compute_model"], a["memory_model"], a["logit_bytes"]) == ("kernel", "runtime", 6)
    assert (b["compute_model"], b["memory_model"]) == ("flat", "korthikanti")
    assert "compute_efficiency" not in a and b["compute_efficiency"] == 0.5
    path.write_text(path.read_text().replace("fidelity: accurate", "fidelity: best"))
    assert main(["simulate", "--jobs", str(path)]) == 2


def test_point_id_says_which_fidelity_an_unkeyed_point_runs():
    """A step point without ``fidelity`` runs accurate (it ran paper before): its id covers
    that, so a results.csv of the former default never resumes as the new one; a point that
    names its fidelity (and a collective point) keeps the id of the documented formula."""
    import hashlib

    from parosim import __version__
    from parosim.io.sweep import point_id, point_inputs

    def documented(point):
        key = {"point": point, "inputs": {k: sha for k, (_, sha) in point_inputs(point).items()},
               "parosim_version": __version__}
        text = json.dumps(key, sort_keys=True, separators=(",", ":"), default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    bare = {"strategy": "NIG", "mode": "analytic"}
    assert point_id(bare) != documented(bare)
    for point in ({**bare, "fidelity": "paper"}, {**bare, "fidelity": "accurate"},
                  {"kind": "collective", "op": "all-gather", "size": "1GB"}):
        assert point_id(point) == documented(point)
    assert len({point_id(bare), point_id({**bare, "fidelity": "paper"}),
                point_id({**bare, "fidelity": "accurate"})}) == 3
