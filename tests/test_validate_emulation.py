"""Acceptance of the validation harness on emulated clusters (network namespaces, a bridge,
tc-shaped 300 Mbit/s NICs): collectives and whole steps, simulated vs measured, and teardown.

Needs root and iproute2; skipped with the reason otherwise.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from parosim.validate import emulate
from parosim.validate.emulate import EmulatedCluster, Shaping, list_namespaces

pytest.importorskip("torch")
pytestmark = [pytest.mark.emulation]


@pytest.fixture(scope="module", autouse=True)
def emulation_available():
    """Probe for namespaces when the tests run, not when the file is collected (collecting
    must create nothing)."""
    ok, why = emulate.available()
    if not ok:
        pytest.skip(f"cluster emulation unavailable: {why}")

NIC = 37.5e6  # 300 Mbit/s


def _ours() -> list[str]:
    return list_namespaces(f"{emulate.PREFIX}{os.getpid()}x")


def _veths_on_host() -> list[str]:
    out = subprocess.run(["ip", "-o", "link", "show", "type", "veth"], capture_output=True,
                         text=True).stdout
    return [line for line in out.splitlines() if emulate.PREFIX in line]


@pytest.fixture(autouse=True)
def nothing_left_behind():
    before = set(list_namespaces())
    yield
    assert _ours() == [], "namespaces left behind"
    assert set(list_namespaces()) - before == set()
    assert _veths_on_host() == []
    ranks = [p for p in psutil.Process().children(recursive=True)
             if "parosim.validate.worker" in " ".join(p.cmdline())]
    assert ranks == [], "rank processes left behind"


def test_links_are_shaped_and_isolated():
    """The NIC runs at the shaped rate; addresses exist only inside our namespaces."""
    with EmulatedCluster(nodes=2, shaping=Shaping(nic_rate_Bps=NIC)) as emu:
        assert len(_ours()) == 3
        host = subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True).stdout
        assert emulate.SUBNET not in host
        code = ("import socket,time,sys\n"
                "s=socket.socket();s.bind((sys.argv[1],5555));s.listen(1);c,_=s.accept()\n"
                "n=0;t=None\n"
                "while n<8_000_000:\n"
                "  b=c.recv(1<<20)\n"
                "  if not b: break\n"
                "  t=t or time.perf_counter();n+=len(b)\n"
                "print(n/(time.perf_counter()-t))\n")
        srv = emu.popen(1, [sys.executable, "-c", code, emu.address(1)],
                        stdout=subprocess.PIPE, text=True)
        time.sleep(0.5)
        cli = emu.popen(0, [sys.executable, "-c",
                            "import socket,sys;c=socket.create_connection((sys.argv[1],5555));"
                            "c.sendall(b'x'*8_000_000)", emu.address(1)])
        out, _ = srv.communicate(timeout=60)
        cli.wait(timeout=10)
        rate = float(out.strip())
        assert 0.8 * NIC < rate < 1.1 * NIC


def test_teardown_on_exception():
    with pytest.raises(RuntimeError, match="boom"):
        with EmulatedCluster(nodes=2) as emu:
            emu.popen(0, ["sleep", "30"])
            assert len(_ours()) == 3
            raise RuntimeError("boom")


def test_teardown_on_sigterm_and_stale_cleanup():
    """A run killed by SIGTERM tears down; one killed by SIGKILL leaves namespaces that
    cleanup_stale removes (its creator is dead)."""
    script = textwrap.dedent("""
        import sys, time
        from parosim.validate.emulate import EmulatedCluster
        with EmulatedCluster(nodes=2) as emu:
            emu.popen(0, ["sleep", "60"])
            print("up", flush=True)
            time.sleep(60)
    """)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGKILL):
        p = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                             cwd=os.path.dirname(os.path.dirname(__file__)))
        assert p.stdout.readline().strip() == "up"
        prefix = f"{emulate.PREFIX}{p.pid}x"
        assert len(list_namespaces(prefix)) == 3
        p.send_signal(sig)
        p.wait(timeout=30)
        if sig is signal.SIGKILL:
            assert len(list_namespaces(prefix)) == 3
            assert sorted(emulate.cleanup_stale()) >= sorted(list_namespaces(prefix))
        assert list_namespaces(prefix) == []
    assert not [q for q in psutil.process_iter(["cmdline"])
                if q.info["cmdline"] == ["sleep", "60"]]


def test_timeout_tears_down_ranks():
    from parosim.collectives import Algo, Op, Scope, lower
    from parosim.validate.calibrate import emulated_spec
    from parosim.validate.executor import Launch, collective_task, run_tasks

    spec = emulated_spec(2, 1, Shaping(nic_rate_Bps=NIC))
    task = collective_task("slow", lower(spec, Op.ALL_REDUCE, Scope.GLOBAL, 64 * 2**20,
                                         Algo.RING), "explicit", 0, 10)
    with EmulatedCluster(nodes=2, shaping=Shaping(nic_rate_Bps=NIC)) as emu:
        with pytest.raises(TimeoutError):
            run_tasks(Launch(nodes=2, ranks_per_node=1, emulated=emu, timeout_s=4), [task])


def _measure(opts: dict, check):
    """Run the harness once and check the bounds: no re-take (a miss is a failure; timings on
    a busy shared machine are noisy, so the bounds leave room for that, not a second try)."""
    from parosim.validate.cli import run_validate

    res = run_validate(opts)
    check(res)
    return res


def _check_collectives(res):
    rows = [r for r in res["rows"] if r["what"] == "collective"]
    assert len(rows) == 27  # 3 ops x 3 algorithms x 3 sizes
    assert {r["measured_by"] for r in rows} == {"explicit-ring"}
    table = "\n".join(f"{r['op']} {r['algo']} {r['size_bytes']:.0f}: sim {r['simulated_s']:.4f}"
                      f" meas {r['measured_s']:.4f} err {r['error_pct']:+.1f}%" for r in rows)
    # every evaluated collective is a program the calibration never ran (other sizes, the
    # reduce-scatter op, HO-Ring): the bounds apply to held-out numbers
    assert not any(r["seen_in_calibration"] for r in rows), table
    s = res["held_out_collectives"]
    print(f"\nheld-out collectives: median {s['median_error_pct']:.1f} %, max "
          f"{s['max_error_pct']:.1f} %; uncalibrated: median "
          f"{res['uncalibrated']['median_error_pct']:.1f} %, max "
          f"{res['uncalibrated']['max_error_pct']:.1f} % (n = {res['uncalibrated']['n_rows']})")
    assert s["n_rows"] == 27
    # measured once (no re-take) on a shared 2-core host: HO-Ring and the flat ring at 1 MiB,
    # the shortest held-out items, vary by up to ~25 % from run to run there
    # (parosim/validate/README.md), hence 30 % for the worst row; the median bound is tight
    assert s["median_error_pct"] <= 10, table
    assert s["max_error_pct"] <= 30, table
    # the uncalibrated (nominal spec) error is reported beside it, on the same rows
    assert res["uncalibrated"]["n_rows"] == len(res["rows"])
    assert all("error_nominal_pct" in r for r in rows)
    assert [m for m in res["ordering_mismatches"] if "step" not in m] == [], table


def test_collectives_2x2():
    res = _measure({"emulate": True, "nodes": 2, "ranks_per_node": 2}, _check_collectives)
    cal = res["calibration"]["params"]
    assert 0.75 * NIC < 1 / cal["nic_s_per_B"] < 1.1 * NIC  # fitted NIC ~ the shaped rate


def test_collectives_and_steps_4x2():
    """Collectives, then whole-step Plans of GGG, IIG, NIG (s = 4) on the 4 x 2 emulation:
    step error <= 15% and the measured ranking equals the simulated one."""
    def check(res):
        _check_collectives(res)
        steps = [r for r in res["rows"] if r["what"] == "step"]
        assert [r["strategy"] for r in steps] == ["PaRO-GGG", "PaRO-IIG", "PaRO-NIG"]
        table = "\n".join(f"{r['strategy']}: sim {r['simulated_s']:.3f} meas "
                          f"{r['measured_s']:.3f} err {r['error_pct']:+.1f}%" for r in steps)
        assert all(abs(r["error_pct"]) <= 15 for r in steps), table
        by_sim = sorted(steps, key=lambda r: r["simulated_s"])
        by_meas = sorted(steps, key=lambda r: r["measured_s"])
        assert [r["strategy"] for r in by_sim] == [r["strategy"] for r in by_meas], table

    _measure({"emulate": True, "nodes": 4, "ranks_per_node": 2, "strategies": "GGG,IIG,NIG"},
             check)


def test_steps_3d_2x2():
    """TP = 2 x DP = 2 and PP = 2 x DP = 2 Plans (issue 11) on the 2 x 2 emulation, predicted
    with the calibrated spec (the steps are held out of the fit): pipeline step within 15 %,
    TP step within 20 % (measured: +7 % and +2 %; docs/accuracy.md). One attempt, no
    retake."""
    def check(res):
        steps = {r["strategy"]: r for r in res["rows"] if r["what"] == "step"}
        assert set(steps) == {"TP2xPP1 NNN", "TP1xPP2 NNN"}
        table = "\n".join(f"{k}: sim {r['simulated_s']:.3f} meas {r['measured_s']:.3f} err "
                          f"{r['error_pct']:+.1f}%" for k, r in steps.items())
        assert abs(steps["TP1xPP2 NNN"]["error_pct"]) <= 15, table
        assert abs(steps["TP2xPP1 NNN"]["error_pct"]) <= 20, table

    _measure({"emulate": True, "nodes": 2, "ranks_per_node": 2, "parallel": "2x1,1x2",
              "sizes": "1MiB"}, check)  # measured once: _measure never re-takes
