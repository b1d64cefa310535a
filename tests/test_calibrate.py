"""parosim.calibrate: the fit recovers known parameters, hold-out splits, the written YAML."""

import json
from dataclasses import replace
from pathlib import Path

import pytest

from parosim.calibrate.links import Measurement, fit, make_param, split_holdout
from parosim.cli.commands import main
from parosim.collectives import Algo, Op, Scope, closed_form_time
from parosim.errors import InputError
from parosim.io import load_cluster

DATA = Path(__file__).parent / "data" / "nccl-tests"
SIZES = [8 * 4**i for i in range(15)]  # 8 B .. 2 GiB


def _truth():
    base = load_cluster("dgx-a100-ib")
    truth = replace(base, intra=replace(base.intra, bandwidth_Bps=180e9, latency_s=3e-6),
                    nic=replace(base.nic, bandwidth_Bps=19e9, latency_s=7e-6),
                    collective=replace(base.collective, call_overhead_s=12e-6))
    return base, truth


def _measure(truth, nodes, op=Op.ALL_REDUCE, algo=Algo.RING):
    spec = truth.with_nodes(nodes)
    return [Measurement(op, s, closed_form_time(spec, op, Scope.GLOBAL, s, algo), spec,
                        f"synthetic-{nodes}node-{op.value}") for s in SIZES]


def test_fit_recovers_the_parameters_that_generated_the_data():
    base, truth = _truth()
    meas = []
    # all-gather (k-1 steps) beside all-reduce (2(k-1)) separates per-step latency from the
    # per-call cost; one node identifies the NVLink, two nodes the NIC
    for nodes, op in ((1, Op.ALL_REDUCE), (1, Op.ALL_GATHER), (2, Op.ALL_REDUCE)):
        for m in _measure(truth, nodes, op):
            meas.append(replace(m, spec=base.with_nodes(nodes)))  # the fit starts from base
    names = ["intra_node.bandwidth", "intra_node.latency", "nic.bandwidth", "nic.latency",
             "collective.call_overhead"]
    f = fit(base, meas, Algo.RING, names, starts=(0.0, -1.0))
    assert f.summary()["fit"]["max_abs_error_pct"] < 0.1
    for name in names:
        assert f.identified[name], name
        assert f.values[name] == pytest.approx(make_param(name).get(truth), rel=0.02), name
    # deterministic: the same inputs give the same numbers, bit for bit
    assert fit(base, meas, Algo.RING, names, starts=(0.0, -1.0)).values == f.values


def test_nic_is_not_identified_by_one_node_logs():
    base, truth = _truth()
    meas = [replace(m, spec=base.with_nodes(1)) for m in _measure(truth, 1)]
    f = fit(base, meas, Algo.RING, params=["intra_node.bandwidth", "nic.bandwidth"])
    assert f.identified == {"intra_node.bandwidth": True, "nic.bandwidth": False}
    assert f.values["nic.bandwidth"] == base.nic.bandwidth_Bps


def test_held_out_error_is_computed_on_unseen_sizes():
    # one protocol (Simple): with all three the tuner's LL/LL128/Simple switch points fall
    # between the fitted sizes (16x apart) and every-other-size interpolation is ambiguous
    base, truth = (replace(s, collective=replace(s.collective, protocols=("simple",)))
                   for s in _truth())
    meas = [replace(m, spec=base.with_nodes(1)) for m in _measure(truth, 1)]
    fitted, held = split_holdout(meas, "every-other")
    assert [m.size_bytes for m in fitted] == SIZES[0::2]
    assert [m.size_bytes for m in held] == SIZES[1::2]
    f = fit(base, fitted, Algo.RING, held=held, holdout="every-other")
    assert {r["size_bytes"] for r in f.held_rows} == set(SIZES[1::2])
    assert f.summary()["held_out"]["max_abs_error_pct"] < 0.5


def test_holdout_kinds_and_errors():
    base, truth = _truth()
    meas = [replace(m, spec=base.with_nodes(1)) for m in _measure(truth, 1)]
    meas += [replace(m, spec=base.with_nodes(1)) for m in _measure(truth, 1, Op.ALL_GATHER)]
    fitted, held = split_holdout(meas, "op:all-gather")
    assert {m.op for m in held} == {Op.ALL_GATHER} and {m.op for m in fitted} == {Op.ALL_REDUCE}
    fitted, held = split_holdout(meas, "sizes:64KiB-1MiB")
    assert {m.size_bytes for m in held} == {131072, 524288}  # 8 x 4^i in [64 KiB, 1 MiB]
    for how, needle in (("bogus", "is not known"), ("sizes:1TiB-2TiB", "holds out nothing"),
                        ("sizes:0-", "holds out everything"), ("sizes:12", "expected sizes")):
        with pytest.raises(InputError, match=needle):
            split_holdout(meas, how)


def test_unknown_parameter_is_refused():
    with pytest.raises(InputError, match="not a fittable parameter"):
        make_param("nic.per_node")


def test_calibrate_cli_writes_a_cluster_every_command_accepts(tmp_path, capsys):
    out = tmp_path / "my-cluster.yaml"
    log = DATA / "azure-ndmv4-msccl-all_gather.txt"
    rc = main(["calibrate", "--nccl-tests", str(log), "--cluster", "dgx-a100-ib", "-o",
               str(out), "--algo", "ring", "--holdout", "every-other", "--json"])
    res = json.loads(capsys.readouterr().out)
    assert rc == 0 and res["held_out"]["n"] == 10 and res["fit"]["n"] == 11
    text = out.read_text()
    assert "fitted from azure-ndmv4-msccl-all_gather.txt" in text
    assert "Azure/msccl" in text  # the source travels with the numbers
    spec = load_cluster(str(out))
    assert spec.intra.bandwidth_Bps == pytest.approx(res["params"]["intra_node.bandwidth"])
    # the written YAML predicts what the fit reported
    for r in res["rows"]:
        sim = closed_form_time(spec.with_nodes(1), Op(r["op"]), Scope.GLOBAL, r["size_bytes"],
                               Algo.RING)
        assert sim == pytest.approx(r["simulated_s"], rel=1e-9)
    # and other commands take it
    assert main(["collective", "--cluster", str(out), "--nodes", "1", "--json"]) == 0
    capsys.readouterr()


@pytest.mark.parametrize("extra,needle", [
    (["--holdout", "op:all-reduce"], "holds out nothing"),
    (["--params", "nic.per_node"], "not a fittable parameter"),
    (["--algo", "ring,ho-ring"], "fits one algorithm"),
    (["--min-size", "16GiB"], "no measurement of the logs is that large"),
])
def test_calibrate_cli_errors(extra, needle, tmp_path, capsys):
    rc = main(["calibrate", "--nccl-tests", str(DATA / "azure-ndmv4-msccl-all_gather.txt"),
               "--cluster", "dgx-a100-ib", "-o", str(tmp_path / "c.yaml"), *extra])
    err = capsys.readouterr().err
    assert rc == 2 and needle in err and err.count("\n") == 1, err
