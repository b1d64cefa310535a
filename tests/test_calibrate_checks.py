"""calibrate --nccl-tests checks the log against its base cluster and the fitted values:
each mismatch prints its warning, a matching base prints none."""

import json
from dataclasses import replace
from pathlib import Path

from parosim.calibrate.checks import check_fit, check_hardware, gpus_per_node_stated
from parosim.calibrate.links import Fit
from parosim.cli.commands import main
from parosim.io import load_cluster
from parosim.io.nccltests import read_nccl_tests

DATA = Path(__file__).parent / "data" / "nccl-tests"
P4DE = DATA / "aws-p4de-2node-all_reduce.txt"       # 2 x p4de: 8 A100, EFA 4 x 100 Gbps
H100 = DATA / "gcp-a3mega-h100-2node-all_reduce.txt"  # header names NVIDIA H100 80GB HBM3


def _calibrate(log, cluster, tmp_path, capsys, *extra):
    rc = main(["calibrate", "--nccl-tests", str(log), "--cluster", cluster, "-o",
               str(tmp_path / "c.yaml"), "--json", *extra])
    res = json.loads(capsys.readouterr().out)
    assert rc == 0
    return res, (tmp_path / "c.yaml").read_text()


def test_p4de_log_on_dgx_a100_warns_nic_count_unidentified_nic_and_far_nvlink(tmp_path,
                                                                               capsys):
    """The fit itself is good (1.3 % median); the base is not the log's machine."""
    res, text = _calibrate(P4DE, "dgx-a100-ib", tmp_path, capsys, "--holdout", "every-other")
    kinds = {w["kind"] for w in res["warnings"]}
    assert {"nic_count", "not_identified", "far_from_base"} <= kinds
    assert res["fit"]["max_abs_error_pct"] < 25 and "poor_fit" not in kinds
    nic = next(w for w in res["warnings"] if w["kind"] == "nic_count")
    assert "4 NICs" in nic["message"] and "8 x 200 Gbps" in nic["message"] and nic["meaning"]
    far = next(w for w in res["warnings"] if w["kind"] == "far_from_base")
    assert "intra_node.bandwidth" in far["message"]
    assert res["params"]["intra_node.bandwidth"] < 150e9    # NVLink dragged far below 300 GB/s
    assert "# warning [nic_count]" in text                  # the YAML carries them too
    # the text output prints each warning with its meaning
    assert main(["calibrate", "--nccl-tests", str(P4DE), "--cluster", "dgx-a100-ib", "-o",
                 str(tmp_path / "d.yaml"), "--holdout", "every-other"]) == 0
    out = capsys.readouterr().out
    assert out.count("warning [") == len(res["warnings"]) and "Means:" in out


def test_p4de_log_on_the_matching_base_prints_no_warning(tmp_path, capsys):
    res, text = _calibrate(P4DE, "aws-p4de", tmp_path, capsys, "--holdout", "every-other")
    assert res["warnings"] == [] and "warning" not in text
    # 15 fitted sizes for 22 parameters: no standard error (dof < 0), and no warning for it
    assert res["dof"] == -7 and res["standard_errors"]["nic.bandwidth"]["factor"] is None
    full, _ = _calibrate(P4DE, "aws-p4de", tmp_path, capsys)
    assert full["warnings"] == [] and full["dof"] == 29 - 22
    nic = full["standard_errors"]["nic.bandwidth"]     # measured 11.65 GB/s, x1.04
    assert nic["factor"] < 1.2 and nic["low"] < full["params"]["nic.bandwidth"] < nic["high"]
    assert main(["calibrate", "--nccl-tests", str(P4DE), "--cluster", "aws-p4de", "-o",
                 str(tmp_path / "d.yaml")]) == 0
    assert "warning" not in capsys.readouterr().out


def test_h100_log_on_a_one_nic_a100_base_warns_gpu_and_poor_fit(tmp_path, capsys):
    # the sizes >= 1 MiB keep the fit short; the mismatch shows there as well
    res, _ = _calibrate(H100, "paper-a100-roce", tmp_path, capsys, "--min-size", "1MiB",
                        "--params", "intra_node.bandwidth,nic.bandwidth,nic.latency")
    kinds = [w["kind"] for w in res["warnings"]]
    assert "gpu" in kinds and "poor_fit" in kinds
    gpu = next(w for w in res["warnings"] if w["kind"] == "gpu")
    assert "H100" in gpu["message"] and "A100-SXM4-80GB" in gpu["message"]
    assert res["fit"]["max_abs_error_pct"] > 25


def test_ranks_per_node_stated_by_the_log_against_the_base():
    log = read_nccl_tests(DATA / "aws-p5-batch-all_reduce.txt")   # no node count in the log
    assert gpus_per_node_stated(log.meta["hardware"]) == 8
    p5 = load_cluster("aws-p5")
    assert [w.kind for w in check_hardware(p5, log)] == []
    four = replace(p5, gpus_per_node=4, nic=replace(p5.nic, per_node=4))
    warns = check_hardware(four, log)
    assert [w.kind for w in warns] == ["ranks_per_node"]
    assert "states 8 GPUs per node" in warns[0].message


def test_p5_interfaces_match_the_p5_preset_by_line_rate():
    """32 EFA interfaces at 3200 Gbps per node = the preset's 8 x 400 Gbps: no warning."""
    log = read_nccl_tests(DATA / "aws-p5-2node-all_reduce.txt")
    assert check_hardware(load_cluster("aws-p5"), log) == []
    assert [w.kind for w in check_hardware(load_cluster("dgx-h100-ib"), log)] == []  # 8x400G


def test_fitted_values_beyond_the_line_rate_and_far_from_base():
    base = load_cluster("aws-p4de")
    log = read_nccl_tests(P4DE)
    names = ["intra_node.bandwidth", "nic.bandwidth"]
    good = Fit(base, names, {"intra_node.bandwidth": 280e9, "nic.bandwidth": 11.5e9},
               {"intra_node.bandwidth": True, "nic.bandwidth": True})
    stats = {"max_abs_error_pct": 6.0}
    assert check_fit(base, [log], good, stats, {"max_abs_error_pct": None}) == []
    # 20 GB/s per NIC is above EFA's 100 Gbps = 12.5 GB/s, and 1.7x the base (not far)
    fast = replace(good, values={"intra_node.bandwidth": 280e9, "nic.bandwidth": 20e9})
    kinds = [w.kind for w in check_fit(base, [log], fast, stats, {})]
    assert kinds == ["above_line_rate"]
    # NVLink fitted above A100's 300 GB/s per direction
    nv = replace(good, values={"intra_node.bandwidth": 400e9, "nic.bandwidth": 11.5e9})
    assert [w.kind for w in check_fit(base, [log], nv, stats, {})] == ["above_line_rate"]
    # a held-out error above 25 % is a poor fit as well
    kinds = [w.kind for w in check_fit(base, [log], good, stats, {"max_abs_error_pct": 40})]
    assert kinds == ["poor_fit"]


def test_poorly_identified_link_warns_only_with_residual_degrees_of_freedom():
    """The link that bounds a multi-node log warns ``poorly_identified`` when its one standard
    error reaches beyond x2 either side (docs/calibration.md "Warnings"); not when dof <= 0
    (no standard error), not for a well identified link."""
    base = load_cluster("aws-p4de")
    se = {"value": 10e9, "low": 10e9 / 3, "high": 30e9, "factor": 3.0}
    f = Fit(base, ["nic.bandwidth"], {"nic.bandwidth": 10e9}, {"nic.bandwidth": True},
            dof=5, standard_errors={"nic.bandwidth": se})
    ws = [w for w in check_fit(base, [], f, {}, {}, nodes=2) if w.kind == "poorly_identified"]
    assert len(ws) == 1 and "spans 3.33 GB/s-30 GB/s" in ws[0].message
    assert not [w for w in check_fit(base, [], replace(f, dof=0), {}, {}, nodes=2)
                if w.kind == "poorly_identified"]
    good = replace(f, standard_errors={"nic.bandwidth": {**se, "low": 9e9, "high": 11.1e9,
                                                         "factor": 1.11}})
    assert not [w for w in check_fit(base, [], good, {}, {}, nodes=2)
                if w.kind == "poorly_identified"]
