"""Several jobs on one fabric (parosim/studies/jobs.py, ``parosim simulate --jobs``)."""

import json

import pytest

from parosim.cli.commands import main
from parosim.collectives.types import Algo, Op, Scope
from parosim.io import load_cluster
from parosim.plan.dataparallel import CollectiveOp, Plan
from parosim.simulate.step import simulate_step
from parosim.spec.model import preset
from parosim.spec.strategy import parse_strategy
from parosim.spec.system import ClusterSpec, LinkSpec, NetworkFabric, NetworkSpec, NICSpec
from parosim.spec.training import TrainingSpec
from parosim.studies.jobs import Job, make_job, run_jobs

TRAIN = TrainingSpec(accum_steps=2)


def test_identical_jobs_disjoint_nodes_one_switch_no_slowdown():
    # one non-blocking switch: the two jobs share no link, so nothing changes, bit for bit
    c = load_cluster("paper-a100-roce", nodes=8)
    jobs = [make_job(n, preset("llama-7b"), "GGG", c, nodes, TRAIN, "ho-ring")
            for n, nodes in (("a", range(4)), ("b", range(4, 8)))]
    r = run_jobs(c, jobs)
    for j in r.jobs:
        assert j.step_time_shared_s == j.step_time_alone_s and j.slowdown == 1.0
    # and a job alone on 4 of 8 nodes takes what the 4-node cluster takes (symmetry-reduced)
    ref = simulate_step(preset("llama-7b"), load_cluster("paper-a100-roce", nodes=4), "GGG",
                        TRAIN, "ho-ring").step_time_s
    assert r.jobs[0].step_time_alone_s == pytest.approx(ref, rel=1e-9)
    assert all(ln["jobs"] in (["a"], ["b"]) for ln in r.busiest_links)


def _ag_job(name: str, nodes: tuple[int, ...], spec: ClusterSpec, size: float) -> Job:
    """A job whose step is one ring all-gather of ``size`` bytes over its GPUs."""
    op = CollectiveOp(0, "ag", Op.ALL_GATHER, Scope.GLOBAL, size, "param-gather", None, None,
                      "comm-param")
    strat = parse_strategy("GGG")
    plan = Plan((op,), strat, len(nodes), 1, "none", 1, 1, 1, 1.0, 1, 0.0)
    from dataclasses import replace
    return Job(name, nodes, plan, replace(spec, nodes=len(nodes)), Algo.RING, strat, "none")


@pytest.mark.parametrize("oversub,expected", [(2.0, "halved"), (1.0, "same")])
def test_shared_oversubscribed_uplink_fair_share(oversub, expected):
    # 4 nodes of 1 GPU, 2 nodes per leaf, 100 Gbps NICs. Job a = nodes 0, 2 and job b =
    # nodes 1, 3: each job's 2-rank ring sends S/2 bytes each way across the leaf uplinks.
    # Uplink capacity = 2 x 100 Gbps / oversubscription. Alone, a flow gets min(NIC, uplink)
    # = 100 Gbps; shared, the uplink's two flows (one per job) get C_up / 2 each (max-min):
    # 50 Gbps at 2:1 (the time's bandwidth part doubles), 100 Gbps at 1:1 (no slowdown).
    nic = 12.5e9
    spec = ClusterSpec(name="t", nodes=4, gpus_per_node=1, pcie=LinkSpec(32e9, 0.0),
                       nic=NICSpec(1, nic, 5e-6),
                       network=NetworkSpec(NetworkFabric.LEAF_SPINE, 2, oversub, 1e-6))
    size = 1e9
    r = run_jobs(spec, [_ag_job("a", (0, 2), spec, size), _ag_job("b", (1, 3), spec, size)])
    alpha = 2.5e-6 + 1e-6 + 1e-6 + 2.5e-6  # NIC->leaf, leaf->spine, spine->leaf, leaf->NIC
    up = 2 * nic / oversub
    alone = size / 2 / min(nic, up) + alpha
    shared = size / 2 / min(nic, up / 2) + alpha
    for j in r.jobs:
        assert j.step_time_alone_s == pytest.approx(alone, rel=1e-9)
        assert j.step_time_shared_s == pytest.approx(shared, rel=1e-9)
        assert j.slowdown == pytest.approx(shared / alone, rel=1e-9)
    if expected == "halved":
        assert r.jobs[0].slowdown == pytest.approx((0.08 + alpha) / (0.04 + alpha), rel=1e-9)
        top = r.busiest_links[0]
        assert top["link_class"] == "uplink" and top["jobs"] == ["a", "b"]
        assert top["utilization"] == pytest.approx(1.0, rel=1e-3)
    else:
        assert r.jobs[0].slowdown == pytest.approx(1.0, rel=1e-12)


def test_placement_decides_sharing_on_a_leaf_spine_cluster():
    # eth-2tier-a100: 8 nodes per leaf, 4:1 uplinks. One job per leaf shares nothing; the
    # same jobs interleaved across both leaves contend for the uplinks (at most 2x: each
    # job keeps at least half of every link it shares with one other job).
    c = load_cluster("eth-2tier-a100")
    t = TrainingSpec(accum_steps=1)
    per_leaf = [make_job(n, preset("llama-7b"), "GGG", c, nd, t, "ho-ring")
                for n, nd in (("a", range(8)), ("b", range(8, 16)))]
    r1 = run_jobs(c, per_leaf)
    assert [j.slowdown for j in r1.jobs] == [1.0, 1.0]
    mixed = [make_job(n, preset("llama-7b"), "GGG", c, nd, t, "ho-ring")
             for n, nd in (("a", (0, 8, 1, 9, 2, 10, 3, 11)), ("b", (4, 12, 5, 13, 6, 14, 7, 15)))]
    r2 = run_jobs(c, mixed)
    for j in r2.jobs:
        assert 1.5 < j.slowdown <= 2.0 + 1e-9
    assert r2.busiest_links[0]["link_class"] == "uplink"


JOBS = """cluster: paper-a100-roce
nodes: 4
jobs:
  - {name: a, model: llama-7b, strategy: GGG, accum: 1, nodes: [0, 1]}
  - {name: b, model: llama-7b, strategy: IIG, algo: ring, accum: 1, nodes: [2, 3]}
"""


@pytest.fixture
def jobs_file(tmp_path):
    def make(text):
        p = tmp_path / "jobs.yaml"
        p.write_text(text)
        return str(p)
    return make


def test_cli_jobs_json(jobs_file, capsys, tmp_path):
    trace = tmp_path / "t.json"
    rc = main(["simulate", "--jobs", jobs_file(JOBS), "--json", "--trace", str(trace)])
    out = capsys.readouterr().out
    assert rc == 0
    r = json.loads(out)
    assert [j["name"] for j in r["jobs"]] == ["a", "b"]
    for j in r["jobs"]:
        for k in ("step_time_alone_s", "step_time_shared_s", "slowdown", "gpus", "nodes"):
            assert k in j
        assert j["slowdown"] == pytest.approx(1.0, rel=1e-9)  # ps rounding only
        assert {"micro_batch", "accum_steps", "seq_len", "trainable_ratio",
                "recompute"} <= set(j["settings"])  # each job's inputs are echoed
    assert r["jobs"][1]["strategy"] == "PaRO-IIG" and r["jobs"][1]["algo"] == "ring"
    assert r["busiest_links"] and "utilization" in r["busiest_links"][0]
    lanes = {e["args"]["name"] for e in json.loads(trace.read_text())["traceEvents"]
             if e["name"] == "thread_name"}
    assert "a/compute" in lanes and "b/compute" in lanes


@pytest.mark.parametrize("text,needle", [
    (JOBS.replace("[2, 3]", "[1, 2]"), "node 1 is in job 'a' and job 'b'"),
    (JOBS.replace("[2, 3]", "[2, 9]"), "node 9 is not a node of the 4-node cluster"),
    (JOBS.replace("[2, 3]", "[2, 2]"), "job 'b' lists node 2 twice"),
    (JOBS.replace("[2, 3]", "[]"), "must be a non-empty list of node indices"),
    (JOBS.replace("name: b", "name: a"), "job name 'a' appears twice"),
    (JOBS.replace("algo: ring", "algo: tree"), "algo 'tree' is not known"),
    (JOBS.replace("accum: 1, nodes: [0", "acum: 1, nodes: [0"), "unknown key 'acum'"),
    (JOBS.replace("name: b, ", ""), "missing required key 'name'"),
    (JOBS.replace("nodes: 4\n", "nodes: 4\nbogus: 1\n"), "unknown key 'bogus'"),
    (JOBS.replace("strategy: GGG", "strategy: NNN"), "does not fit in GPU memory"),
    (JOBS.replace("accum: 1, nodes: [0", "memory_model: foo, accum: 1, nodes: [0"),
     "memory_model = 'foo' is not known"),
    ("cluster: paper-a100-roce\njobs: []\n", "'jobs' must be a non-empty list"),
    ("jobs: [{name: a, nodes: [0]}]\n", "missing required key 'cluster'"),
    (JOBS.replace("nodes: 4\n", "nodes: 4\nsteps: 1000\n"), "steps = 1000 must be an integer"),
])
def test_cli_jobs_bad_inputs(text, needle, jobs_file, capsys):
    rc = main(["simulate", "--jobs", jobs_file(text)])
    err = capsys.readouterr().err
    assert rc == 2
    assert needle in err, err
    assert err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.parametrize("argv,needle", [
    (["--strategy", "IIG"], "--strategy cannot be combined with --jobs; expected it in the"),
    (["--memory-model", "runtime"], "--memory-model cannot be combined with --jobs; expected"),
    (["--nodes", "8"], "--nodes cannot be combined with --jobs; expected it in the jobs file"),
    (["--repeats", "3"], "--repeats cannot be combined with --jobs; it is not modelled"),
    (["--mode", "analytic"], "--mode cannot be combined with --jobs; it is not modelled"),
])
def test_cli_jobs_refuses_other_flags(argv, needle, jobs_file, capsys):
    rc = main(["simulate", "--jobs", jobs_file(JOBS), *argv])
    err = capsys.readouterr().err
    assert rc == 2 and needle in err, err


HETERO = """name: h
gpus_per_node: 2
nodes: 4
gpu: {model: A100-SXM4-80GB}
intra_node: {fabric: nvswitch, bandwidth: 2000Gbps, latency: 2us}
nic: {per_node: 1, bandwidth: 100Gbps, latency: 5us}
network: {fabric: single-switch}
overrides:
  - {nodes: [3], nic: {bandwidth: 25Gbps}}
"""


def test_link_overrides_act_on_the_shared_graph(tmp_path, jobs_file, capsys):
    # node 3's NIC at 25 Gbps: the job on nodes 2, 3 is slower than the one on 0, 1, alone
    # and shared (a single non-blocking switch: still no slowdown)
    c = tmp_path / "h.yaml"
    c.write_text(HETERO)
    text = (f"cluster: {c}\njobs:\n"
            "  - {name: a, strategy: GGG, accum: 1, nodes: [0, 1]}\n"
            "  - {name: b, strategy: GGG, accum: 1, nodes: [2, 3]}\n")
    assert main(["simulate", "--jobs", jobs_file(text), "--json"]) == 0
    a, b = json.loads(capsys.readouterr().out)["jobs"]
    assert b["step_time_alone_s"] > 1.2 * a["step_time_alone_s"]
    assert a["slowdown"] == pytest.approx(1.0, rel=1e-9)
    assert b["slowdown"] == pytest.approx(1.0, rel=1e-9)


def test_gpu_overrides_on_a_job_are_refused(tmp_path, jobs_file, capsys):
    c = tmp_path / "h.yaml"
    c.write_text(HETERO + "  - {gpus: [n2/gpu1], speed: 0.8}\n")
    text = (f"cluster: {c}\njobs:\n"
            "  - {name: a, strategy: GGG, accum: 1, nodes: [0, 1]}\n"
            "  - {name: b, strategy: GGG, accum: 1, nodes: [2, 3]}\n")
    assert main(["simulate", "--jobs", jobs_file(text)]) == 2
    err = capsys.readouterr().err
    assert "job 'b': overrides[1] changes the GPUs of node 2" in err and err.count("\n") == 1


def test_a_job_with_a_runtime_profile(jobs_file, capsys):
    # a runtime profile shapes the job's Plan as in `simulate --runtime`: alone, the job on
    # nodes 0, 1 takes what simulate takes on a 2-node cluster
    text = ("cluster: paper-a100-roce\nnodes: 4\njobs:\n"
            "  - {name: a, strategy: GGG, runtime: deepspeed, accum: 1, nodes: [0, 1]}\n"
            "  - {name: b, strategy: GGG, accum: 1, nodes: [2, 3]}\n")
    assert main(["simulate", "--jobs", jobs_file(text), "--json"]) == 0
    a, b = json.loads(capsys.readouterr().out)["jobs"]
    assert a["runtime"] == "deepspeed" and b["runtime"] == "ideal"
    # the job's default fidelity is simulate's (accurate): the same step as the command
    assert main(["simulate", "--cluster", "paper-a100-roce", "--nodes", "2", "--strategy",
                 "GGG", "--runtime", "deepspeed", "--accum", "1", "--json"]) == 0
    ref = json.loads(capsys.readouterr().out)["step_time_s"]
    assert a["step_time_alone_s"] == pytest.approx(ref, rel=1e-6)
    # and at the paper fidelity, the paper's closed forms as simulate_step's defaults
    assert main(["simulate", "--jobs", jobs_file(text.replace("nodes: [0, 1]}",
                                                                "fidelity: paper, nodes: [0, 1]}")),
                 "--json"]) == 0
    a = json.loads(capsys.readouterr().out)["jobs"][0]
    ref = simulate_step(preset("llama-7b"), load_cluster("paper-a100-roce", nodes=2), "GGG",
                        TrainingSpec(accum_steps=1), runtime="deepspeed").step_time_s
    assert a["step_time_alone_s"] == pytest.approx(ref, rel=1e-6)
    assert a["step_time_alone_s"] != pytest.approx(b["step_time_alone_s"], rel=1e-3)
