"""What-ifs on the real presets: overrides checked after --nodes resizes, one NIC down relayed
over NVLink (PXN), ``parosim cluster show``, ``base: PRESET`` and ``--set``, and the hottest
links being the ones that set the step time (docs/heterogeneity.md, docs/cluster-yaml.md)."""

import contextlib
import io
import json
import subprocess
import sys
import textwrap

import pytest

from parosim.cli import main
from parosim.collectives import Algo, Op, Scope, simulate_collective
from parosim.errors import InputError
from parosim.fabric.network import Router
from parosim.fabric.topology import cluster_graph
from parosim.io.cluster import cluster_data, load_cluster
from parosim.io.cluster_base import merge
from parosim.io.sweep import point_id, point_inputs


def run(*argv):
    """(exit code, stdout, stderr) of the command line, in process."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(list(argv))
        except SystemExit as e:   # argparse
            rc = e.code
    return rc, out.getvalue(), err.getvalue()


def one_line_error(rc, err, *words):
    assert rc == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("parosim: error:"), err
    for w in words:
        assert w in lines[0], (w, lines[0])


def write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


# -- overrides are checked after --nodes resizes ------------------------------------------

def test_override_beyond_the_yaml_nodes_holds_after_resize(tmp_path):
    p = write(tmp_path, "c.yaml", """\
        base: dgx-h100-ib
        overrides:
          - {nodes: [5], memory: 40GB}
        """)
    spec = load_cluster(p, nodes=16)
    assert spec.nodes == 16
    mems = [m for _, _, m in spec.gpu_specs()]
    assert mems[5 * 8:6 * 8] == [40 * 10**9] * 8 and mems[0] == spec.gpu.memory_bytes
    rc, out, err = run("memory", "--cluster", str(p), "--nodes", "16", "--strategy", "NIG",
                       "--json")
    assert rc == 0, err
    assert json.loads(out)["capacity_bytes"] == 40 * 10**9
    # the YAML's own 4 nodes (no --nodes): node 5 does not exist, one line
    rc, _, err = run("memory", "--cluster", str(p), "--strategy", "NIG")
    one_line_error(rc, err, "node 5", "4 nodes")
    # and --nodes shrinking below the override is refused too
    rc, _, err = run("memory", "--cluster", str(p), "--nodes", "5", "--strategy", "NIG")
    one_line_error(rc, err, "node 5", "5 nodes")


def test_link_override_on_a_resized_cluster(tmp_path):
    p = write(tmp_path, "c.yaml", """\
        base: dgx-h100-ib
        overrides:
          - {links: [[n9/nic2, rail2]], bandwidth: 100Gbps}
        """)
    g = cluster_graph(load_cluster(p, nodes=12))
    assert g.edges["n9/nic2", "rail2"]["bandwidth_Bps"] == 12.5e9
    with pytest.raises(InputError, match="n9/nic2"):
        cluster_graph(load_cluster(p))


# -- one NIC down: relayed through a peer GPU over NVLink ---------------------------------

def nic_down(tmp_path, base="dgx-h100-ib", link="[n0/nic0, rail0]", nodes=2):
    return write(tmp_path, "down.yaml", f"""\
        base: {base}
        nodes: {nodes}
        collective: {{model: ideal}}     # the wire model: the hand case below is alpha-beta
        overrides:
          - {{links: [{link}], failed: true}}
        """)


def test_nic_down_routes_through_a_peer_gpu(tmp_path):
    spec = load_cluster(nic_down(tmp_path))
    r = Router(cluster_graph(spec))
    # out of the GPU whose NIC is down: NVLink to the next GPU, its NIC, across the rails
    assert r.path("n0/gpu0", "n1/gpu0") == ["n0/gpu0", "n0/nvswitch", "n0/gpu1", "n0/nic1",
                                            "rail1", "spine", "rail0", "n1/nic0", "n1/gpu0"]
    # into it: the same peer, backwards
    assert r.path("n1/gpu0", "n0/gpu0") == ["n1/gpu0", "n1/nic0", "rail0", "spine", "rail1",
                                            "n0/nic1", "n0/gpu1", "n0/nvswitch", "n0/gpu0"]
    # a GPU whose NIC works keeps its own path; GPUs never relay otherwise
    assert r.path("n0/gpu1", "n1/gpu1") == ["n0/gpu1", "n0/nic1", "rail1", "n1/nic1",
                                            "n1/gpu1"]


def test_relay_when_the_pcie_link_or_a_shared_nic_is_down(tmp_path):
    # the GPU-NIC (PCIe) link down: the same relay as the NIC's own link
    r = Router(cluster_graph(load_cluster(nic_down(tmp_path, link="[n0/gpu0, n0/nic0]"))))
    assert r.path("n0/gpu0", "n1/gpu0")[:5] == ["n0/gpu0", "n0/nvswitch", "n0/gpu1",
                                                "n0/nic1", "rail1"]
    # aws-p4de: 4 NICs for 8 GPUs (GPUs 0 and 1 on nic0); nic0 down: both relay, and the
    # next GPU with a working NIC is GPU 2 for GPU 0 as for GPU 1
    p = write(tmp_path, "p4.yaml", """\
        base: aws-p4de
        overrides:
          - {links: [[n0/nic0, switch]], failed: true}
        """)
    r = Router(cluster_graph(load_cluster(p)))
    assert r.path("n0/gpu0", "n1/gpu0")[:5] == ["n0/gpu0", "n0/nvswitch", "n0/gpu2",
                                                "n0/nic1", "switch"]
    assert r.path("n0/gpu1", "n1/gpu1")[:5] == ["n0/gpu1", "n0/nvswitch", "n0/gpu2",
                                                "n0/nic1", "switch"]
    assert r.path("n0/gpu2", "n1/gpu2") == ["n0/gpu2", "n0/nic1", "switch", "n1/nic1",
                                            "n1/gpu2"]


def test_nic_down_hand_case(tmp_path):
    """Inter-scope ring all-gather of S = 1 GB on 2 DGX H100 nodes (ideal wire model): ring
    j joins n0/gpu{j} and n1/gpu{j}; each GPU sends S/2 to its peer. n0/nic0's link is down,
    so ring 0 goes through n0/gpu1 and n0/nic1 both ways: nic1's link carries 2 flows each
    way (ring 1's and the relayed one) at 400 Gbps / 2 = 25 GB/s each, and the ring advances
    at its slowest hop. Time = (S/2) / 25 GB/s + the ring's mean hop latency (7 us: NVLink
    1 + 1, PCIe 0.5 + 0.5, NIC 1 + 1, rail-spine 1 + 1) = 20.007 ms; healthy 10.003 ms."""
    S = 1e9
    healthy = simulate_collective(load_cluster("dgx-h100-ib", nodes=2,
                                               sets=["collective.model=ideal"]),
                                  Op.ALL_GATHER, Scope.INTER, S, Algo.RING)
    assert healthy.time_s == pytest.approx(S / 2 / 50e9 + 3e-6, rel=1e-9)
    down = simulate_collective(load_cluster(nic_down(tmp_path)), Op.ALL_GATHER, Scope.INTER,
                               S, Algo.RING)
    assert down.time_s == pytest.approx(S / 2 / 25e9 + 7e-6, rel=1e-9)
    assert down.closed_form_s is None     # links differ: the closed form does not apply
    hot = {h["link"]: h for h in down.hot_links}
    for link in ("n0/nic1->rail1", "rail1->n0/nic1"):   # the peer's NIC: two flows of S/2
        assert hot[link]["bytes"] == pytest.approx(S, rel=1e-9)
    # NVLink carries the relayed S/2 on 4 hops (gpu0 -> switch -> gpu1 and back); the
    # healthy inter-scope all-gather uses no NVLink at all
    assert down.link_bytes["nvlink"] == pytest.approx(4 * S / 2, rel=1e-9)
    assert healthy.link_bytes.get("nvlink", 0.0) == 0.0
    # uplinks: only the relayed flow crosses the spine (S/2 each way, rail1 <-> rail0)
    assert down.link_bytes["uplink"] == pytest.approx(4 * S / 2, rel=1e-9)


@pytest.mark.parametrize("preset", ["dgx-a100-ib", "dgx-h100-ib"])
def test_nic_down_simulates_a_step(tmp_path, preset):
    p = nic_down(tmp_path, preset, "[n3/nic5, rail5]", nodes=4)
    args = ["simulate", "--cluster", str(p), "--strategy", "IIG", "--accum", "2", "--json"]
    rc, out, err = run(*args)
    assert rc == 0, err
    down = json.loads(out)
    rc, out, err = run("simulate", "--cluster", preset, "--set", "collective.model=ideal",
                       "--strategy", "IIG", "--accum", "2", "--json")
    ok = json.loads(out)
    assert down["step_time_s"] > ok["step_time_s"]     # one NIC fewer is never faster
    assert down["symmetry_period_nodes"] == 4          # nothing folded away
    assert down["bytes_intra"] > ok["bytes_intra"]     # the relay's NVLink hops


def test_a_gpu_cut_off_entirely_is_still_refused(tmp_path):
    p = write(tmp_path, "cut.yaml", """\
        base: dgx-h100-ib
        overrides:
          - {links: [[n0/nic0, rail0], [n0/gpu0, n0/nvswitch]], failed: true}
        """)
    rc, _, err = run("collective", "--cluster", str(p), "--op", "all-gather", "--size", "1MB")
    one_line_error(rc, err, "disconnected")


def test_docs_failed_link_examples_run_on_the_rail_presets():
    """Every links override the docs show names a link of dgx-a100-ib and dgx-h100-ib, and
    failing it leaves a cluster that simulates (the GPU's traffic is relayed)."""
    import re
    from pathlib import Path

    docs = Path(__file__).resolve().parents[1] / "docs"
    text = (docs / "heterogeneity.md").read_text() + (docs / "cluster-yaml.md").read_text()
    found = set(re.findall(r"\{links: \[\[([\w/]+), ([\w/]+)\]\], failed: true\}", text))
    assert ("n1/nic0", "rail0") in found and len(found) >= 2
    for preset in ("dgx-a100-ib", "dgx-h100-ib"):
        rc, out, _ = run("cluster", "show", preset, "--json")
        pairs = {(x["a"], x["b"]) for x in json.loads(out)["links"]}
        for a, b in sorted(found):
            assert (a, b) in pairs, (preset, a, b)
            item = f"overrides=[{{links: [[{a}, {b}]], failed: true}}]"
            rc, out, err = run("collective", "--cluster", preset, "--set", item, "--op",
                               "all-reduce", "--size", "64MB", "--json")
            assert rc == 0, err
            assert json.loads(out)["time_s"] > 0


# -- parosim cluster show ----------------------------------------------------------------

def test_cluster_show_lists_nodes_and_links(tmp_path):
    rc, out, err = run("cluster", "show", "dgx-h100-ib", "--json")
    assert rc == 0, err
    r = json.loads(out)
    assert (r["nodes"], r["gpus"], r["network_fabric"]) == (4, 32, "rail")
    kinds = [x["kind"] for x in r["graph_nodes"]]
    assert kinds.count("gpu") == 32 and kinds.count("nic") == 32
    assert kinds.count("switch") == 9           # rail0..rail7 and the spine
    assert r["links_per_class"] == {"nvlink": 32, "pcie": 32, "nic": 32, "uplink": 8}
    link = next(x for x in r["links"] if (x["a"], x["b"]) == ("n2/nic3", "rail3"))
    assert link["bandwidth_Gbps"] == pytest.approx(400) and link["link_class"] == "nic"
    assert link["bandwidth_GBps"] == pytest.approx(50) and link["latency_s"] == 1e-6
    gpu = next(x for x in r["graph_nodes"] if x["name"] == "n1/gpu2")
    assert (gpu["rank"], gpu["gpu_model"], gpu["speed"]) == (10, "H100-SXM5-80GB", 1.0)
    # every listed pair is accepted by a links override
    for x in r["links"][::17]:
        spec = load_cluster("dgx-h100-ib", sets=[
            f"overrides=[{{links: [[{x['a']}, {x['b']}]], bandwidth: 1Gbps}}]"])
        assert cluster_graph(spec).edges[x["a"], x["b"]]["bandwidth_Bps"] == 1.25e8


def test_cluster_show_resized_set_failed_and_text(tmp_path):
    p = nic_down(tmp_path, nodes=4)
    rc, out, err = run("cluster", "show", str(p), "--nodes", "16", "--set",
                       "nic.bandwidth=200Gbps", "--json")
    assert rc == 0, err
    r = json.loads(out)
    assert r["nodes"] == 16 and r["failed_links"] == 1
    failed = [x for x in r["links"] if x["failed"]]
    assert [(x["a"], x["b"]) for x in failed] == [("n0/nic0", "rail0")]
    assert {x["bandwidth_Gbps"] for x in r["links"] if x["link_class"] == "nic"} == {200}
    rc, out, err = run("cluster", "show", str(p))
    assert rc == 0, err
    assert "[n0/nic0, rail0" in out and "FAILED" in out and "n0/gpu0 .. n0/gpu7" in out


@pytest.mark.parametrize("argv,words", [
    (["cluster", "show", "no-such-preset"], ["no-such-preset"]),
    (["cluster", "show", "dgx-h100-ib", "--nodes", "0"], ["--nodes", "0"]),
    (["cluster", "show", "dgx-h100-ib", "--set", "nic.speed=1"], ["nic.speed"]),
    (["cluster", "show"], ["cluster"]),
    (["cluster", "list"], ["list"]),
])
def test_cluster_show_refusals(argv, words):
    rc, _, err = run(*argv)
    one_line_error(rc, err, *words)


# -- base: PRESET and --set ----------------------------------------------------------------

def test_merge_rule():
    base = {"nic": {"per_node": 8, "bandwidth": "200Gbps", "latency": "2us"},
            "overrides": [{"nodes": [1], "speed": 0.5}], "name": "a"}
    over = {"nic": {"bandwidth": "100Gbps"}, "overrides": [{"nodes": [2], "speed": 0.9}]}
    m = merge(base, over)
    assert m["nic"] == {"per_node": 8, "bandwidth": "100Gbps", "latency": "2us"}
    assert m["overrides"] == [{"nodes": [2], "speed": 0.9}]    # lists replace
    assert m["name"] == "a" and base["nic"]["bandwidth"] == "200Gbps"   # no mutation


def test_base_extends_a_preset(tmp_path):
    p = write(tmp_path, "x.yaml", """\
        base: dgx-h100-ib
        name: h100-slow-nics
        nic: {bandwidth: 100Gbps}
        collective: {model: ideal}
        """)
    spec, ref = load_cluster(p), load_cluster("dgx-h100-ib")
    assert spec.name == "h100-slow-nics" and spec.nic.bandwidth_Bps == 12.5e9
    assert spec.nic.per_node == ref.nic.per_node == 8           # nested keys merge
    assert spec.nic.latency_s == ref.nic.latency_s
    assert spec.collective.model == "ideal" and spec.gpu == ref.gpu
    # a base of a base, relative to the file naming it
    q = write(tmp_path, "y.yaml", "base: x.yaml\nnodes: 8\n")
    spec2 = load_cluster(q)
    assert (spec2.name, spec2.nodes, spec2.nic.bandwidth_Bps) == ("h100-slow-nics", 8, 12.5e9)
    _, files = cluster_data(q)
    assert [f.name for f in files] == ["y.yaml", "x.yaml", "dgx-h100-ib.yaml"]


@pytest.mark.parametrize("text,words", [
    ("base: no-such-preset\n", ["base", "no-such-preset"]),
    ("base: [a]\n", ["base"]),
    ("base: self.yaml\n", ["extends itself"]),
    ("base: dgx-h100-ib\nnic: {bandwith: 1Gbps}\n", ["bandwith"]),
])
def test_base_refusals(tmp_path, text, words):
    p = write(tmp_path, "self.yaml", text)
    rc, _, err = run("memory", "--cluster", str(p), "--strategy", "NIG")
    one_line_error(rc, err, *words)


@pytest.mark.parametrize("item,words", [
    ("nic.bandwith=100Gbps", ["nic.bandwith", "bandwidth"]),
    ("nick.bandwidth=100Gbps", ["nick.bandwidth"]),
    ("nic.bandwidth.x=1", ["nic.bandwidth.x"]),
    ("nic.bandwidth", ["nic.bandwidth", "KEY=VALUE"]),
    ("nic.bandwidth=", ["nic.bandwidth", "no value"]),
    ("=100Gbps", ["unknown cluster key"]),
    ("nic.bandwidth=100", ["nic.bandwidth", "unit"]),
    ("nic.bandwidth=fast", ["nic.bandwidth"]),
    ("collective.protocols=[ll", ["collective.protocols"]),
    ("base=dgx-a100-ib", ["base"]),
    ("nodes=0", ["--set nodes=0", "nodes = 0"]),
    ("nic=5", ["--set nic=5", "'nic' must be a mapping"]),
    ("overrides=[{nodes: [7], speed: 0.5}]", ["node 7", "4 nodes"]),
])
def test_set_refusals(item, words):
    rc, _, err = run("memory", "--cluster", "dgx-h100-ib", "--set", item)
    one_line_error(rc, err, *words)


@pytest.mark.parametrize("argv", [
    ["simulate"], ["compare"], ["memory"], ["collective"], ["run"], ["advise",
                                                                      "--global-batch", "64"],
    ["collective", "-b", "1M", "-e", "2M"], ["cluster", "show", "dgx-h100-ib"],
])
def test_set_on_every_command_with_cluster(argv):
    """Each command that takes --cluster reads --set (an unknown key is refused there)."""
    extra = [] if argv[0] == "cluster" else ["--cluster", "dgx-h100-ib"]
    rc, _, err = run(*argv, *extra, "--set", "nic.bogus=1")
    one_line_error(rc, err, "nic.bogus")


def test_calibrate_reads_set(tmp_path):
    rc, _, err = run("calibrate", "--nccl-tests", "x.log", "--cluster", "dgx-h100-ib",
                     "--set", "gpu.bogus=1", "-o", str(tmp_path / "o.yaml"))
    one_line_error(rc, err, "gpu.bogus")


def test_set_values_take_units_and_change_results():
    base = json.loads(run("collective", "--cluster", "dgx-h100-ib", "--nodes", "2", "--op",
                          "all-gather", "--size", "1GB", "--algo", "ring", "--set",
                          "collective.model=ideal", "--json")[1])
    rc, out, err = run("collective", "--cluster", "dgx-h100-ib", "--nodes", "2", "--op",
                       "all-gather", "--size", "1GB", "--algo", "ring", "--set",
                       "collective.model=ideal", "--set", "nic.bandwidth=200Gbps",
                       "--set", "intra_node.bandwidth=900GB/s", "--json")
    assert rc == 0, err
    slow = json.loads(out)
    assert slow["settings"]["nodes"] == 2
    assert slow["time_s"] > base["time_s"]
    spec = load_cluster("dgx-h100-ib", sets=["nic.bandwidth=200Gbps", "jitter.cv=0.05",
                                             "collective.protocols=[ll, simple]",
                                             "overrides=[{nodes: [1], speed: 0.5}]"])
    assert spec.nic.bandwidth_Bps == 25e9 and spec.jitter_cv == 0.05
    assert spec.collective.protocols == ("ll", "simple")
    assert spec.gpu_specs()[8][1] == 0.5
    # later items win; --nodes wins over a --set nodes
    assert load_cluster("dgx-h100-ib", sets=["nic.bandwidth=1Gbps",
                                             "nic.bandwidth=2Gbps"]).nic.bandwidth_Bps == 2.5e8
    assert load_cluster("dgx-h100-ib", nodes=3, sets=["nodes=6"]).nodes == 3


def test_simulate_echoes_set():
    rc, out, err = run("simulate", "--cluster", "dgx-h100-ib", "--set", "nic.bandwidth=200Gbps",
                       "--mode", "analytic", "--json")
    assert rc == 0, err
    s = json.loads(out)["settings"]
    assert s["cluster_set"] == ["nic.bandwidth=200Gbps"] and s["nic_bandwidth_Bps"] == 25e9


def test_sweep_key_follows_the_base_chain(tmp_path):
    base = tmp_path / "b.yaml"
    base.write_text((load_cluster.__globals__["topologies_dir"]() / "dgx-h100-ib.yaml")
                    .read_text())
    write(tmp_path, "x.yaml", "base: b.yaml\nnic: {bandwidth: 100Gbps}\n")
    point = {"kind": "collective", "cluster": str(tmp_path / "x.yaml"), "op": "all-gather"}
    before = point_id(point, point_inputs(point))
    assert point_id(point, point_inputs(point)) == before           # stable
    base.write_text(base.read_text().replace("bandwidth: 450GB/s", "bandwidth: 300GB/s"))
    assert point_id(point, point_inputs(point)) != before           # an edited base re-runs
    # a file without base keys exactly as before: the sha256 of its bytes
    plain = {"kind": "collective", "cluster": str(base)}
    import hashlib
    assert point_inputs(plain)["cluster"][1] == hashlib.sha256(base.read_bytes()).hexdigest()


def test_sweep_points_take_cluster_set(tmp_path):
    spec = write(tmp_path, "s.yaml", """\
        name: set-sweep
        kind: collective
        mode: engine
        fixed: {cluster: dgx-h100-ib, nodes: 2, op: all-gather, size: 1GB, algo: ring,
                scope: inter}
        grid: {cluster_set: ["collective.model=ideal",
                             "collective.model=ideal; nic.bandwidth=200Gbps"]}
        """)
    out = tmp_path / "out"
    rc, _, err = run("sweep", str(spec), "--out", str(out), "--workers", "1", "--no-progress")
    assert rc == 0, err
    import csv
    rows = list(csv.DictReader((out / "results.csv").open()))
    t = [float(r["time_s"]) for r in rows]
    assert t[0] == pytest.approx(0.5e9 / 50e9 + 3e-6, rel=1e-9)   # 400 Gbps NICs
    assert t[1] == pytest.approx(0.5e9 / 25e9 + 3e-6, rel=1e-9)   # --set to 200 Gbps
    assert "cluster_set" in (out / "columns.md").read_text()
    # another value is another point: only it runs again
    spec.write_text(spec.read_text().replace("200Gbps", "100Gbps"))
    rc, stdout, err = run("sweep", str(spec), "--out", str(out), "--workers", "1",
                          "--no-progress")
    assert rc == 0 and "1 resumed, 1 run" in stdout + err, stdout + err
    # a step point reads it too
    from parosim.simulate.point import point_setup
    cluster = point_setup({"cluster": "dgx-h100-ib", "mode": "analytic",
                           "cluster_set": "nic.bandwidth=100Gbps"})[1]
    assert cluster.nic.bandwidth_Bps == 12.5e9
    bad = write(tmp_path, "bad.yaml", spec.read_text().replace("nic.bandwidth=100Gbps",
                                                               "nic.bandwith=1Gbps"))
    rc, _, err = run("sweep", str(bad), "--out", str(tmp_path / "o2"))
    one_line_error(rc, err, "cluster_set", "nic.bandwith")


# -- the hottest links set the step time ---------------------------------------------------

def slow_nic_case(tmp_path):
    return write(tmp_path, "slow.yaml", """\
        base: dgx-h100-ib
        nodes: 8
        overrides:
          - {nodes: [5], nic: {bandwidth: 100Gbps}}
        """)


def test_hot_links_put_the_slow_nic_first(tmp_path):
    args = ["simulate", "--strategy", "IIG", "--accum", "2", "--json"]
    ok = json.loads(run(*args, "--cluster", "dgx-h100-ib", "--nodes", "8")[1])
    rc, out, err = run(*args, "--cluster", str(slow_nic_case(tmp_path)))
    assert rc == 0, err
    slow = json.loads(out)
    assert slow["exposed_comm_s"] > ok["exposed_comm_s"] * 1.5   # the slow NIC shows
    hot = slow["hot_links"]
    assert hot[0]["link"].startswith("n5/nic") and hot[0]["link_class"] == "nic"
    assert hot[0]["critical_s"] > 0
    assert hot[0]["critical_s"] <= slow["step_time_s"]
    # before, utilisation put NVLink first: it is not the link that sets the step time
    nvlink = [h for h in hot if h["link_class"] == "nvlink"]
    assert all(h["critical_s"] < hot[0]["critical_s"] for h in nvlink)
    # per-rank timelines (jitter) rank the same link first
    rc, out, err = run(*args, "--cluster", str(slow_nic_case(tmp_path)), "--jitter-cv",
                       "0.01")
    assert rc == 0, err
    assert json.loads(out)["hot_links"][0]["link"].startswith("n5/nic")
    # and the text says so
    rc, out, err = run(*args[:-1], "--cluster", str(slow_nic_case(tmp_path)))
    line = next(ln for ln in out.splitlines() if ln.startswith("hottest links"))
    assert line.split(": ", 1)[1].startswith("n5/nic"), line


def test_critical_time_counts_only_critical_transfers():
    """Two transfers at once: op 1 bottlenecked on node 0's NIC, op 2 on NVLink with more
    bytes per capacity. With op 1 critical, the NIC link ranks first; with every transfer
    counted both have bottleneck time."""
    import simpy

    from parosim.collectives.types import RingSet
    from parosim.fabric.network import PS, Network
    from parosim.spec.system import ClusterSpec, LinkSpec

    spec = ClusterSpec(nodes=2, gpus_per_node=2, intra=LinkSpec(10e9, 0.0))
    env = simpy.Environment()
    net = Network(env, cluster_graph(spec), spec.nodes, None, spec.gpus_per_node)
    inter = net.flowset(RingSet(((0, 2),), "inter"))
    intra = net.flowset(RingSet(((0, 1),), "intra"))

    def go():
        yield env.all_of([net.transfer(inter, 1e9, owner=1),
                          net.transfer(intra, 4e9, owner=2)])

    env.process(go())
    env.run()
    end = env.now
    names = net.link_names()
    crit = net.critical_link_s([(1, 0, end)])
    nic = names.index("n0/nic0->switch")
    nv = names.index("n0/gpu0->n0/nvswitch")
    assert crit[nic] == pytest.approx(1e9 / 12.5e9, rel=1e-6) and crit[nv] == 0
    hot = net.hot_links(end / PS, 3, [(1, 0, end)])
    assert hot[0]["link"] in ("n0/nic0->switch", "switch->n0/nic0")
    assert hot[0]["utilization"] < max(h["utilization"] for h in net.hot_links(end / PS))
    every = net.critical_link_s(None)
    assert every[nv] == pytest.approx(4e9 / 10e9, rel=1e-6) and every[nic] > 0


def test_cluster_show_help_runs():
    r = subprocess.run([sys.executable, "-m", "parosim", "cluster", "show", "--help"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "parosim cluster show dgx-h100-ib" in r.stdout
