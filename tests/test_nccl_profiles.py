"""NCCL tuner profiles (``collective.nccl_version``) and NCCL's own choice
(``collective.choice: tuner``): the 2.8 tables, the rules that differ from 2.20, the YAML
fields, the release read from an nccl-tests header, and engine == closed form."""

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from parosim.calibrate.checks import check_hardware, tuner_profile
from parosim.collectives import Algo, Op, Scope, lower, program_time, simulate_program
from parosim.collectives.lowering import NCCL
from parosim.collectives.nccl import tuner_bus_Bps, tuner_time
from parosim.io.cluster import cluster_from_dict, cluster_to_yaml, load_cluster
from parosim.io.nccltests import parse_nccl_tests, read_nccl_tests
from parosim.spec.system import (
    NCCL28_RING_SIMPLE,
    NCCL28_TREE_LL128,
    NCCL_RING_SIMPLE,
    CollectiveTuning,
    nccl_tables,
)

KiB, MiB = 2**10, 2**20
DATA = Path(__file__).resolve().parent / "data" / "nccl-tests"


def tuned(spec, **kw):
    return replace(spec, collective=replace(spec.collective, **kw))


def _yaml_with(preset: str, **coll) -> dict:
    d = yaml.safe_load(cluster_to_yaml(load_cluster(preset)))
    d["collective"] = {"model": "nccl", **coll}
    return d


def test_defaults_are_the_2_20_profile_and_fastest_choice():
    c = CollectiveTuning()
    assert (c.nccl_version, c.choice) == ("2.20", "fastest")
    assert (c.tuner_intra_bandwidth_Bps, c.tuner_net_bandwidth_Bps) == (0.0, 0.0)
    t = nccl_tables("2.20")
    assert all(getattr(c, k) == v for k, v in t.items())
    # a preset that names neither writes neither (its YAML is what it was)
    text = cluster_to_yaml(load_cluster("dgx-a100-ib"))
    assert "nccl_version" not in text and "choice" not in text and "tuner_" not in text


def test_2_8_tables_from_nccl_2_8_3():
    """NCCL 2.8.3 tuning.cc: ring Simple 8.4 us base, 3.4 / 9.6 us per NVLink / network step;
    tree LL128 x 0.92 x 0.915, per channel min(0.915 x perChMaxTree, 16.9 GB/s); no
    netOverhead."""
    c = cluster_from_dict(_yaml_with("abci-a100", nccl_version="2.8")).collective
    assert c.nccl_version == "2.8" and c.net_overhead_s == 0.0
    assert c.ring_simple == NCCL28_RING_SIMPLE
    assert (c.ring_simple.base_latency_s, c.ring_simple.nvlink_latency_s,
            c.ring_simple.net_latency_s) == pytest.approx((8.4e-6, 3.4e-6, 9.6e-6))
    assert NCCL_RING_SIMPLE.net_latency_s == pytest.approx(14e-6)   # 2.20.3, for contrast
    assert c.tree_ll128 == NCCL28_TREE_LL128
    assert c.tree_ll128.bw_efficiency == pytest.approx(0.92 * 0.915)
    assert c.tree_ll128.caps(2)[0] == pytest.approx(16.9e9)           # 22.5 x 0.915 > 16.9
    assert c.tree_ll128.caps(4)[0] == pytest.approx(16.0e9 * 0.915)
    assert (c.tree_simple.caps(1)[0], c.tree_simple.caps(2)[0]) == pytest.approx((24e9, 22.5e9))
    # a field given in the file overrides the profile's table, the rest stays 2.8's
    d = _yaml_with("abci-a100", nccl_version="2.8.4", net_overhead="2us",
                   ring_simple={"base_latency": "20us"})
    c = cluster_from_dict(d).collective
    assert c.nccl_version == "2.8" and c.net_overhead_s == pytest.approx(2e-6)
    # unquoted in YAML (or --set): 2.8 and 2.20 arrive as the numbers 2.8 and 2.2
    for number, profile in ((2.8, "2.8"), (2.2, "2.20")):
        d = _yaml_with("abci-a100", nccl_version=number)
        assert cluster_from_dict(d).collective.nccl_version == profile
    assert c.ring_simple.base_latency_s == pytest.approx(20e-6)
    assert c.ring_simple.net_latency_s == pytest.approx(9.6e-6)


def test_yaml_round_trip_keeps_profile_choice_and_tuner_rates():
    spec = load_cluster("abci-a100", nodes=2)
    c = spec.collective
    assert (c.nccl_version, c.choice) == ("2.8", "tuner")
    # unset: NCCL's tuner sees the cluster's links (300 GB/s NVLink, 4 x 200 Gbps), with
    # NCCL's 235 GB/s bus cap on an A100
    assert (c.tuner_intra_bandwidth_Bps, c.tuner_net_bandwidth_Bps) == (0.0, 0.0)
    assert tuner_bus_Bps(spec, 2, 8) == 235e9
    assert tuner_bus_Bps(spec, 4, 8) == pytest.approx(100e9)     # > 2 nodes: the NICs
    assert tuner_bus_Bps(spec, 4, 1) == pytest.approx(25e9)      # one GPU a node: its NIC
    assert cluster_from_dict(yaml.safe_load(cluster_to_yaml(spec))) == spec
    # pinned (as a fit writes them): the links no longer move NCCL's choice
    pinned = tuned(spec, tuner_intra_bandwidth_Bps=200e9, tuner_net_bandwidth_Bps=40e9)
    text = cluster_to_yaml(pinned)
    assert "tuner_intra_bandwidth: 200000000000.0B/s" in text
    assert cluster_from_dict(yaml.safe_load(text)) == pinned
    faster = replace(pinned, nic=replace(pinned.nic, bandwidth_Bps=100e9))
    assert tuner_bus_Bps(faster, 4, 8) == tuner_bus_Bps(pinned, 4, 8) == pytest.approx(40e9)


@pytest.mark.parametrize("field,value,needle", [
    ("nccl_version", "2.5", "collective.nccl_version"),
    ("nccl_version", 2.5, "collective.nccl_version"),
    ("nccl_version", "2.2", "collective.nccl_version"),
    ("choice", "best", "collective.choice"),
    ("tuner_net_bandwidth", "-1GB/s", "tuner_net_bandwidth"),
])
def test_bad_profile_fields_one_line_exit_2(tmp_path, field, value, needle):
    f = tmp_path / "c.yaml"
    f.write_text(yaml.safe_dump(_yaml_with("dgx-a100-ib", **{field: value})))
    r = subprocess.run([sys.executable, "-m", "parosim.cli", "collective", "--cluster", str(f)],
                       capture_output=True, text=True)
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and needle in r.stderr and "Traceback" not in r.stderr


def test_2_8_plateau_and_multinode_ll_latency():
    """2.8.3: the ring Simple all-reduce latency x 1.9 from nRanks / 16 x 64 KiB bytes on (2.20:
    x 1.4 from 64 B per channel and rank); the LL hop latency inside a node x 1.8 when the
    communicator spans several nodes."""
    spec = tuned(load_cluster("abci-a100", nodes=2), choice="fastest", reduction_hbm_factor=0)
    k = 16
    edge = int(k / 16 * 64 * KiB)
    below, at = (lower(tuned(spec, protocols=("simple",)), Op.ALL_REDUCE, Scope.GLOBAL, s,
                       Algo.RING).phases[0] for s in (edge - 1024, edge))
    assert at.fixed_s == pytest.approx(1.9 * below.fixed_s, rel=1e-12)
    ll = {v: lower(tuned(spec, protocols=("ll",), nccl_version=v, net_overhead_s=0.0,
                         ring_ll=nccl_tables("2.8")["ring_ll"]),
                   Op.ALL_GATHER, Scope.GLOBAL, MiB, Algo.RING).phases[0] for v in ("2.8", "2.20")}
    # 14 of the 15 steps of each channel ring are NVLink hops (2 of 16 hops leave a node)
    hop = spec.collective.ring_ll.nvlink_latency_s
    wire = spec.intra.latency_s
    extra = (k - 1) * 14 / 16 * (max(0.0, 1.8 * hop - wire) - max(0.0, hop - wire))
    assert ll["2.8"].fixed_s - ll["2.20"].fixed_s == pytest.approx(extra, rel=1e-9)


def test_tuner_choice_is_nccl_estimate_not_parosims_fastest():
    """ABCI, 2 nodes: NCCL's estimate takes the node's NVLink speed for both algorithms at
    <= 2 nodes, so its tree never halves the NIC bytes and a large all-reduce runs on the
    ring; parosim's fastest candidate at 32 MiB is a tree (half the ring's bytes per NIC)."""
    spec = load_cluster("abci-a100", nodes=2)
    size = 32 * MiB
    chosen = lower(spec, Op.ALL_REDUCE, Scope.GLOBAL, size, Algo.NCCL)
    fastest = lower(tuned(spec, choice="fastest"), Op.ALL_REDUCE, Scope.GLOBAL, size, Algo.NCCL)
    assert chosen.choice.startswith("ring/") and fastest.choice.startswith("tree/")
    assert program_time(spec, chosen) > program_time(spec, fastest)
    cands = NCCL().candidates(spec, Op.ALL_REDUCE, Scope.GLOBAL, size)
    est = {p.choice: tuner_time(spec, *p.choice.split("/"), Op.ALL_REDUCE, size, 16, 2)
           for p in cands}
    assert chosen.choice == min(est, key=est.get)
    # the fitted protocol costs do not enter NCCL's estimate (its tables are constants)
    slow = tuned(spec, ring_simple=replace(spec.collective.ring_simple, base_latency_s=1e-3))
    assert lower(slow, Op.ALL_REDUCE, Scope.GLOBAL, size, Algo.NCCL).choice == chosen.choice
    # small messages: a low-latency protocol
    assert lower(spec, Op.ALL_REDUCE, Scope.GLOBAL, 4 * KiB, Algo.NCCL).choice.endswith("/ll")


@pytest.mark.parametrize("size", [64 * KiB, 2 * MiB, 32 * MiB])
def test_engine_matches_closed_form_with_the_2_8_profile(size):
    spec = load_cluster("abci-a100", nodes=4)
    for p in NCCL().candidates(spec, Op.ALL_REDUCE, Scope.GLOBAL, size):
        assert simulate_program(spec, p).time_s == pytest.approx(program_time(spec, p),
                                                                 rel=0.01), p.choice


def test_release_read_from_the_log_header_and_warned_about():
    log = read_nccl_tests(DATA / "abci-a-1node-all_reduce.txt")
    assert log.nccl_release == "2.8.4" and tuner_profile(log.nccl_release) == "2.8"
    assert read_nccl_tests(DATA / "abci-a-job02-all_reduce.nccl").nccl_release is None
    info = parse_nccl_tests("host:1:1 [0] NCCL INFO NCCL version 2.18.5+cuda12.2\n"
                            + DATA.joinpath("abci-a-job02-all_reduce.nccl").read_text(), "x")
    assert info.nccl_release == "2.18.5" and tuner_profile("2.18.5") == "2.20"
    base = load_cluster("abci-a100")
    assert not [w for w in check_hardware(base, log) if w.kind == "nccl_version"]
    other = tuned(base, nccl_version="2.20")
    (w,) = [w for w in check_hardware(other, log) if w.kind == "nccl_version"]
    assert "2.8.4" in w.message and "nccl_version: '2.8'" in w.meaning
