"""Start-up of the command line: what a command imports, and the exit-time garbage collector
(docs/performance.md)."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
from pathlib import Path

from parosim.cli import main

ROOT = Path(__file__).resolve().parents[1]


def test_collective_imports_only_what_it_runs():
    """A collective on a preset imports neither PyYAML (the preset's parsed copy), networkx
    (the network runs on graphlite), pandas, matplotlib nor the other commands' modules."""
    code = ("import sys, io, contextlib; from parosim.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    rc = main(['collective', '--op', 'all-reduce', '--size', '1MiB', '--nodes', "
            "'2', '--algo', 'hierarchical', '--json'])\n"
            "print(rc, sorted(m for m in sys.modules if m.split('.')[0] in ('yaml', 'networkx', "
            "'pandas', 'matplotlib') or m in ('parosim.cli.model', 'parosim.cli.experts', "
            "'parosim.cli.cluster', 'parosim.collectives.alltoall', 'parosim.io.model')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, check=True)
    assert out.stdout.split(None, 1) == ["0", "[]\n"]


def test_process_command_line_freezes_the_collector_at_exit(monkeypatch, capsys):
    """``main()`` run as the process's command line (no argument list) freezes the collector's
    objects before returning (the interpreter exits next); called with a list, as a library
    function, it leaves the collector alone."""
    args = ["model", "--model", "llama-7b", "--json"]
    before = gc.get_freeze_count()
    try:
        assert main(args) == 0
        assert gc.get_freeze_count() == before
        listed = json.loads(capsys.readouterr().out)
        monkeypatch.setattr(sys, "argv", ["parosim", *args])
        assert main() == 0
        assert gc.get_freeze_count() > before
        assert json.loads(capsys.readouterr().out) == listed   # the same output
    finally:
        gc.unfreeze()


def test_a_frozen_exit_still_writes_files(tmp_path):
    """Files a command writes are complete when the process ends (a step's trace)."""
    trace = tmp_path / "t.json"
    subprocess.run([sys.executable, "-m", "parosim", "simulate", "--model", "llama-7b",
                    "--nodes", "1", "--strategy", "NIG", "--trace", str(trace), "--json"],
                   capture_output=True, text=True, cwd=ROOT, check=True)
    assert json.loads(trace.read_text())["traceEvents"]
