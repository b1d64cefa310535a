"""All-to-all (parosim.collectives.alltoall, docs/collectives.md "All-to-all"): NCCL's p2p
algorithm and the hierarchical RDMA + NVLink variant, by hand on 8 GPUs in a node and on
2 x 8 GPUs, the engine against the closed form, contention on the graph, the nccl-tests
alltoall_perf round trip through --compare and calibrate, and the refusals."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from parosim.cli.commands import main
from parosim.collectives import simulate_program
from parosim.collectives.alltoall import P2P_LL_THRESHOLD, lower_alltoall, lower_hierarchical
from parosim.collectives.cost import program_time
from parosim.collectives.lowering import lower
from parosim.collectives.simulate import simulate_concurrent
from parosim.errors import InputError
from parosim.io import load_cluster
from parosim.spec.collective import Algo, Op, Scope
from parosim.spec.system import CollectiveTuning

S = 256 * 2**20


def _ideal(nodes):
    spec = load_cluster("dgx-h100-ib", nodes)
    return replace(spec, collective=CollectiveTuning())


def test_eight_gpus_in_a_node_by_hand():
    spec = _ideal(1)
    # 7 peers per GPU, S/8 each, all on the GPU's own NVLink port: 7 flows share it
    hand = spec.intra.latency_s + (S / 8) / (spec.intra.bandwidth_Bps / 7)
    prog = lower(spec, Op.ALL_TO_ALL, Scope.GLOBAL, S, Algo.P2P)
    assert program_time(spec, prog) == pytest.approx(hand, rel=1e-12)
    # NCCL's protocol: Simple above 16 KiB per peer, its efficiency, base and NVLink latency
    nccl = load_cluster("dgx-h100-ib", 1)
    pc = nccl.collective.protocol("ring", "simple")
    hand_nccl = (nccl.intra.latency_s + (S / 8) / (nccl.intra.bandwidth_Bps * pc.bw_efficiency
                                                   / 7)
                 + pc.base_latency_s + max(0.0, pc.nvlink_latency_s - nccl.intra.latency_s))
    p = lower(nccl, Op.ALL_TO_ALL, Scope.GLOBAL, S, Algo.NCCL)
    assert p.phases[0].proto == "simple" and p.choice == "p2p"
    assert program_time(nccl, p) == pytest.approx(hand_nccl, rel=1e-12)
    small = lower(nccl, Op.ALL_TO_ALL, Scope.GLOBAL, 8 * P2P_LL_THRESHOLD, Algo.P2P)
    assert small.phases[0].proto == "ll"


def test_two_by_eight_gpus_by_hand():
    spec = _ideal(2)
    n = 16
    per_flow = S / n
    # GPU j's 8 flows to the other node leave through its PCIe link and its NIC (one NIC per
    # GPU: 8 flows); 7 intra flows share its NVLink port; on the rail fabric a flow to another
    # local index crosses the spine: 2 nodes x 7 other rails = 14 flows on a rail's uplink of
    # nodes x NIC bandwidth
    bw = min(spec.intra.bandwidth_Bps / 7, spec.pcie.bandwidth_Bps / 8,
             spec.nic.bandwidth_Bps / 8, 2 * spec.nic.bandwidth_Bps / 14)
    assert bw == spec.nic.bandwidth_Bps / 8
    alpha = 2 * spec.pcie.latency_s + spec.nic.latency_s + 2 * spec.network.uplink_latency_s
    hand = alpha + per_flow / bw
    prog = lower(spec, Op.ALL_TO_ALL, Scope.GLOBAL, S, Algo.P2P)
    assert program_time(spec, prog) == pytest.approx(hand, rel=1e-12)
    # busbw = algbw x (n-1)/n, comparable with the NIC: 8/16 of S crosses it at 50 GB/s
    r = simulate_program(spec, prog)
    assert r.busbw_GBps == pytest.approx(S / r.time_s / 1e9 * 15 / 16)


def test_hierarchical_moves_rail_matched_rdma_then_nvlink():
    spec = _ideal(2)
    p = lower_alltoall(spec, Scope.GLOBAL, S, Algo.HIERARCHICAL_A2A)
    k = p.chunks
    rdma = [ph for ph in p.phases if ph.name.startswith("rdma")]
    nvl = [ph for ph in p.phases if ph.name.startswith("nvlink")]
    assert len(rdma) == len(nvl) == k
    # RDMA: to the same local index of the other node, everything meant for that node
    assert all(a % 8 == b % 8 and a // 8 != b // 8 for a, b in rdma[0].ringset.hops())
    assert rdma[0].buffer_bytes * k == pytest.approx(8 * S / 16)
    # NVLink: to each other local GPU, what came for it from the 2 nodes (own block included)
    assert nvl[0].buffer_bytes * k == pytest.approx(2 * S / 16)
    times = [program_time(spec, lower_hierarchical(spec, Scope.GLOBAL, S, chunks=c))
             for c in range(1, spec.collective.ho_ring_max_chunks + 1)]
    assert program_time(spec, p) == min(times)   # the chosen K is the closed form's best
    intra_only = lower_alltoall(_ideal(1), Scope.GLOBAL, S, Algo.HIERARCHICAL_A2A)
    assert len(intra_only.phases) == 1   # no hierarchy inside one node: p2p


@pytest.mark.parametrize("nodes", [1, 2, 4])
@pytest.mark.parametrize("algo", [Algo.P2P, Algo.HIERARCHICAL_A2A])
def test_engine_equals_closed_form_within_one_percent(nodes, algo):
    spec = load_cluster("dgx-h100-ib", nodes)
    prog = lower(spec, Op.ALL_TO_ALL, Scope.GLOBAL, 64 * 2**20, algo)
    r = simulate_program(spec, prog)
    assert abs(r.time_s / r.closed_form_s - 1) < 0.01, (r.time_s, r.closed_form_s)


def test_scopes_group_the_ranks():
    spec = _ideal(2)
    intra = lower(spec, Op.ALL_TO_ALL, Scope.INTRA, S, Algo.P2P)
    inter = lower(spec, Op.ALL_TO_ALL, Scope.INTER, S, Algo.P2P)
    assert intra.gpus == 8 and inter.gpus == 2
    assert all(a // 8 == b // 8 for a, b in intra.phases[0].ringset.hops())
    assert all(a % 8 == b % 8 for a, b in inter.phases[0].ringset.hops())


def test_all_to_all_contends_on_the_graph():
    spec = load_cluster("dgx-h100-ib", 2)
    a2a = lower(spec, Op.ALL_TO_ALL, Scope.GLOBAL, S, Algo.P2P)
    ag = lower(spec, Op.ALL_GATHER, Scope.INTER, S, Algo.RING)
    alone = simulate_program(spec, a2a).time_s
    both = simulate_concurrent(spec, [a2a, ag])
    assert both[0] > 1.05 * alone   # the NICs are shared with the inter all-gather


def test_cli_and_refusals(capsys):
    assert main(["collective", "--op", "all-to-all", "--cluster", "dgx-h100-ib", "--nodes",
                 "2", "--size", "64MiB", "--algo", "all", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert [r["algo"] for r in d["results"]] == ["p2p", "hierarchical-a2a"]
    assert all(abs(r["time_s"] / r["closed_form_s"] - 1) < 0.01 for r in d["results"])
    for argv in (["--op", "all-to-all", "--algo", "ring"],
                 ["--op", "all-gather", "--algo", "p2p"]):
        assert main(["collective", *argv]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "--algo" in err
    with pytest.raises(InputError):
        lower(_ideal(1), Op.ALL_REDUCE, Scope.GLOBAL, S, Algo.HIERARCHICAL_A2A)




def test_alltoall_perf_log_round_trip_compare_and_calibrate(tmp_path, capsys):
    import pathlib

    base = pathlib.Path(__file__).resolve().parents[1] / "topologies" / "dgx-h100-ib.yaml"
    slow = tmp_path / "h100-200g.yaml"
    slow.write_text(base.read_text().replace("bandwidth: 400Gbps", "bandwidth: 200Gbps"))
    assert main(["collective", "--op", "all-to-all", "--cluster", str(slow), "--nodes", "2",
                 "-b", "4M", "-e", "64M", "-f", "4"]) == 0
    table = capsys.readouterr().out.splitlines()[1:]   # the table without parosim's title
    log = tmp_path / "alltoall.log"
    log.write_text("\n".join(["$ mpirun -np 16 ./build/alltoall_perf -b 4M -e 64M -f 4 -g 1",
                              "# parosim: nodes = 2", "# parosim: nranks = 16", *table]) + "\n")
    # compared on the cluster it was simulated on: no error; on the 400 Gb/s one: faster
    assert main(["collective", "--compare", str(log), "--cluster", str(slow), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["logs"][0]["op"] == "all-to-all"
    assert max(abs(r["error_pct"]) for r in d["rows"]) < 0.01
    assert main(["collective", "--compare", str(log), "--cluster", "dgx-h100-ib",
                 "--json"]) == 0
    assert all(r["error_pct"] < -30 for r in json.loads(capsys.readouterr().out)["rows"])
    # calibrate recovers the NIC bandwidth the log was made with
    out = tmp_path / "cal.yaml"
    assert main(["calibrate", "--nccl-tests", str(log), "--cluster", "dgx-h100-ib", "-o",
                 str(out), "--params", "nic.bandwidth", "--json"]) == 0
    capsys.readouterr()
    assert load_cluster(str(out)).nic.bandwidth_Bps == pytest.approx(25e9, rel=1e-3)


@pytest.mark.parametrize("size,measured_s", [(1024, 9.34e-6), (2**30, 2**30 / (254.69e9 * 8 / 7))])
def test_published_ndmv4_alltoall_within_the_checks_bound(size, measured_s):
    """microsoft/mscclpp docs/performance-ndmv4.md @7f3f3669 (NCCL 2.17.1, 8 x A100 on
    NVSwitch, in place): alltoall 1K 9.34 us; 1G 254.69 GB/s busbw. A check, never fitted."""
    spec = load_cluster("azure-ndmv4", 1)
    t = simulate_program(spec, lower(spec, Op.ALL_TO_ALL, Scope.GLOBAL, size, Algo.NCCL)).time_s
    assert abs(t / measured_s - 1) < 0.25, (t, measured_s)


@pytest.mark.parametrize("nodes", [1, 2, 4])
@pytest.mark.parametrize("size", [1, 4096, 2**20, 2**28])
def test_never_faster_than_the_bandwidth_bound_and_monotone(nodes, size):
    spec = load_cluster("paper-a100-roce", nodes)
    n = spec.gpus
    for algo in (Algo.P2P, Algo.HIERARCHICAL_A2A):
        t = program_time(spec, lower(spec, Op.ALL_TO_ALL, Scope.GLOBAL, size, algo))
        # a rank sends (n-1)/n of S, at most over its NVLink port and its PCIe link at once
        egress = spec.intra.bandwidth_Bps + spec.pcie.bandwidth_Bps
        assert t >= (n - 1) / n * size / egress * (1 - 1e-9)
        assert program_time(spec, lower(spec, Op.ALL_TO_ALL, Scope.GLOBAL, 2 * size,
                                        algo)) >= t


def test_too_many_flows_is_refused_in_one_line(capsys):
    assert main(["collective", "--op", "all-to-all", "--cluster", "dgx-h100-ib", "--nodes",
                 "128", "--size", "1GiB"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "1,047,552 point-to-point flows" in err


def test_hierarchical_avoids_oversubscribed_rail_uplinks():
    """On a rail fabric a p2p flow between two local indices crosses the spine; the
    hierarchical algorithm's RDMA stage stays on its rail. With 4:1 uplinks the p2p
    all-to-all is uplink-bound and the hierarchical one NIC-bound."""
    spec = load_cluster("dgx-h100-ib", 4)
    slow = replace(spec, network=replace(spec.network, oversubscription=4.0))
    p2p = simulate_program(slow, lower(slow, Op.ALL_TO_ALL, Scope.GLOBAL, S, Algo.P2P))
    hier = simulate_program(slow, lower(slow, Op.ALL_TO_ALL, Scope.GLOBAL, S,
                                        Algo.HIERARCHICAL_A2A))
    assert hier.link_bytes.get("uplink", 0.0) == 0.0 < p2p.link_bytes["uplink"]
    assert hier.time_s < p2p.time_s / 2
    # NIC-bound: (ng-1)·m·S/n bytes leave each GPU through its own NIC
    nic_s = 3 * 8 * S / 32 / spec.nic.bandwidth_Bps
    assert nic_s < hier.time_s < 1.2 * nic_s
