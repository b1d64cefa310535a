"""The harness of the table-driven command-line robustness tests: run ``parosim`` in-process
under a time bound (a hang fails the case), and check a refusal (exit 2, one line naming the
flag or field, no traceback)."""

from __future__ import annotations

import os
import signal

import pytest

from parosim.cli.commands import main

CASE_TIMEOUT_S = int(os.environ.get("R3_TIMEOUT", "60"))


class _Timeout(Exception):
    pass


def _alarm(signum, frame):
    raise _Timeout


def run_case(argv: list[str], capsys, timeout: int = CASE_TIMEOUT_S) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of ``parosim ARGV``; fails the test past ``timeout`` s."""
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(timeout)
    try:
        try:
            rc = main(argv)
        except SystemExit as e:
            rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
    except _Timeout:
        pytest.fail(f"hang: {argv} ran past {timeout} s")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    out = capsys.readouterr()
    return rc, out.out, out.err


def check_err(rc: int, out: str, err: str, needle: str) -> None:
    """Exit 2, no traceback, one ``parosim: error:`` line (notes aside) containing ``needle``."""
    assert "Traceback" not in err + out
    assert rc == 2, f"expected exit 2, got {rc}; stderr {err!r}"
    lines = [ln for ln in err.strip("\n").split("\n") if not ln.startswith("parosim: note:")]
    assert len(lines) == 1, err
    assert lines[0].startswith("parosim: error:"), err
    assert needle in lines[0], f"{needle!r} not in {err!r}"


def OK() -> tuple:
    """A table case that must succeed."""
    return ("ok", "")


def ERR(needle: str) -> tuple:
    """A table case that must be refused with ``needle`` in its one line."""
    return ("err", needle)


def cluster_yaml(nodes: int) -> str:
    """A small single-switch A100 cluster YAML of ``nodes`` nodes for the table cases."""
    return f"""name: t
gpus_per_node: 8
nodes: {nodes}
gpu: {{model: A100-SXM4-80GB}}
intra_node: {{fabric: nvswitch, bandwidth: 2000Gbps, latency: 2us}}
nic: {{per_node: 1, bandwidth: 100Gbps, latency: 5us}}
network: {{fabric: single-switch}}
"""


def with_overrides(cl: str, *entries: str) -> str:
    """``cl`` with an ``overrides:`` list of the given entries."""
    return cl + "overrides:\n" + "".join(f"  - {e}\n" for e in entries)
