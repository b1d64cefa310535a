"""Bad input: one clear line on stderr, exit code 2, never a traceback."""

import subprocess
import sys

import pytest

from parosim.cli.commands import main


def run(argv, capsys):
    rc = main(argv)
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.fixture
def yaml_file(tmp_path):
    def make(text):
        p = tmp_path / "c.yaml"
        p.write_text(text)
        return str(p)
    return make


GOOD = """name: t
gpus_per_node: 4
nodes: 2
gpu: {model: A100-SXM4-80GB}
intra_node: {fabric: nvswitch, bandwidth: 2000Gbps, latency: 2us}
nic: {per_node: 1, bandwidth: 100Gbps, latency: 5us}
network: {fabric: single-switch}
"""


@pytest.mark.parametrize("argv,needle", [
    (["collective", "--cluster", "no-such-preset"], "unknown cluster preset 'no-such-preset'"),
    (["collective", "--size", "12XB"], "'12XB' is not a size"),
    (["collective", "--size", "0"], "must be positive"),
    (["collective", "--op", "gather"], "--op 'gather' is not known"),
    (["collective", "--scope", "world"], "--scope 'world' is not known"),
    (["collective", "--algo", "tree"], "--algo 'tree' is not known"),
    (["collective", "--nodes", "3", "--group-nodes", "2"], "does not divide the 3 nodes"),
    (["collective", "--nodes", "0"], "--nodes = 0 must be a positive integer"),
])
def test_bad_cli_values(argv, needle, capsys):
    rc, out, err = run(argv, capsys)
    assert rc == 2
    assert needle in err
    assert err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.parametrize("text,needle", [
    (GOOD.replace("nodes: 2\n", "nodes: 2\nbogus: 1\n"), "unknown key 'bogus'"),
    (GOOD.replace("gpus_per_node: 4\n", ""), "missing required key 'gpus_per_node'"),
    (GOOD.replace("100Gbps", "100Gigabits"), "'100Gigabits' is not a bandwidth"),
    (GOOD.replace("100Gbps", "0Gbps"), "must be positive"),
    (GOOD.replace("single-switch", "torus"), "network.fabric = 'torus' is not known"),
    (GOOD.replace("per_node: 1", "per_node: 0"), "disconnected"),
    (GOOD.replace("network: {fabric: single-switch}", "network: {fabric: leaf-spine}"),
     "nodes_per_leaf"),
    ("name: [unclosed\n", "malformed YAML"),
    ("- just\n- a list\n", "must hold a mapping"),
])
def test_bad_cluster_yaml(text, needle, yaml_file, capsys):
    rc, out, err = run(["collective", "--cluster", yaml_file(text)], capsys)
    assert rc == 2, err
    assert needle in err
    assert err.count("\n") == 1


def test_missing_yaml_file(capsys):
    rc, _, err = run(["collective", "--cluster", "/nonexistent/c.yaml"], capsys)
    assert rc == 2 and "does not exist" in err


def test_good_yaml_runs(yaml_file, capsys):
    rc, out, err = run(["collective", "--cluster", yaml_file(GOOD), "--json"], capsys)
    assert rc == 0, err
    assert '"time_s"' in out


def test_real_process_exit_code_and_no_traceback():
    p = subprocess.run([sys.executable, "-m", "parosim.cli", "collective", "--size", "1XB"],
                       capture_output=True, text=True)
    assert p.returncode == 2
    assert p.stderr.startswith("parosim: error:") and "Traceback" not in p.stderr
    p = subprocess.run([sys.executable, "-m", "parosim.cli", "collective", "--unknown-flag"],
                       capture_output=True, text=True)
    assert p.returncode == 2 and p.stderr.count("\n") == 1
