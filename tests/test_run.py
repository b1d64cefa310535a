"""A whole run with failures (parosim/studies/run.py) against Young (1974) and Daly (2006).

Where their assumptions hold (exponential failures, checkpoint time << MTBF) the simulated
goodput and the searched best interval must lie within 5 % of the closed forms; beyond them
(checkpoint time a quarter of the MTBF) the simulation must follow the exact optimum of
Daly's wall-clock model, which Young's first-order rule misses.
"""

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parosim.cli.commands import main
from parosim.errors import InputError
from parosim.studies.run import (
    RunSpec,
    best_interval,
    daly_interval,
    daly_wall_clock,
    simulate_run,
    young_interval,
)

M = 3600.0  # job MTBF, s


def spec_for(c: float, r: float = 60.0, failures: int = 2000, step: float = 1.0) -> RunSpec:
    """A run whose failure-free length is ``failures`` MTBFs (so ~that many failures)."""
    return RunSpec(step_time_s=step, steps=int(failures * M / step), checkpoint_s=c,
                   restart_s=r, gpus=4, nodes=1, gpu_mtbf_s=4 * M)


def test_rates_add_per_component():
    s = RunSpec(1.0, 10, 1.0, 1.0, gpus=16, nodes=2, gpu_mtbf_s=1600.0, node_mtbf_s=200.0)
    assert s.gpu_rate == pytest.approx(0.01) and s.node_rate == pytest.approx(0.01)
    assert s.mtbf_s == pytest.approx(50.0)


def test_goodput_matches_daly_closed_form():
    # C/M = 1 %, R = 60 s; interval = Daly's optimum (486 s), 1 s steps: T_s/tau is whole
    s = spec_for(36.0)
    k = round(daly_interval(36.0, M))
    s = RunSpec(s.step_time_s, k * 15, s.checkpoint_s, s.restart_s, s.gpus, s.nodes,
                s.gpu_mtbf_s)  # 15 * k steps = 2 MTBFs per replication
    res = simulate_run(s, k, replications=600, seed=3)
    daly = s.useful_s / daly_wall_clock(s.useful_s, k, 36.0, 60.0, M)
    assert res.goodput == pytest.approx(daly, rel=0.02)
    assert res.failures == pytest.approx(res.wall_clock_s / M, rel=0.05)


def test_wall_clock_is_the_sum_of_its_parts():
    s = spec_for(36.0, failures=50)
    res = simulate_run(s, 400, replications=5, seed=1)
    parts = s.useful_s + res.checkpoint_s_total + res.lost_work_s + res.restart_s_total
    assert res.wall_clock_s == pytest.approx(parts, rel=1e-9)
    assert res.failures_gpu == res.failures and res.failures_node == 0


@pytest.mark.parametrize("c,closed", [(36.0, "daly"), (3.6, "young")])
def test_best_interval_within_5pct_of_young_daly(c, closed):
    s = spec_for(c)
    search = best_interval(s, replications=3, seed=0, points=13, span=3.0)
    tau = search.best_interval_s
    ref = daly_interval(c, M) if closed == "daly" else young_interval(c, M)
    assert abs(tau / ref - 1) < 0.05, (tau, ref)
    # and the goodput there agrees with Daly's expected wall clock
    daly = s.useful_s / daly_wall_clock(s.useful_s, search.best.interval_s, c, 60.0, M)
    assert abs(search.best.goodput / daly - 1) < 0.05


def test_beyond_first_order_follows_the_exact_optimum():
    # C = M/4: Young's sqrt(2CM) = 0.71 M is far off; the optimum of Daly's exact T_w is 0.53 M
    c = M / 4
    s = spec_for(c, failures=1500, step=10.0)
    taus = np.linspace(0.05 * M, 3 * M, 200_001)  # Daly's exact T_w on a fine grid
    exact = float(taus[np.argmin([daly_wall_clock(1.0, t, c, 60.0, M) for t in taus])])
    search = best_interval(s, replications=2, seed=0, points=13, span=3.0)
    assert abs(search.best_interval_s / exact - 1) < 0.05, (search.best_interval_s, exact)
    assert abs(young_interval(c, M) / exact - 1) > 0.2  # Young's assumptions do not hold
    assert abs(daly_interval(c, M) / exact - 1) < 0.05


def test_seeded_and_reproducible():
    s = spec_for(36.0, failures=20)
    a = simulate_run(s, 300, replications=3, seed=7)
    b = simulate_run(s, 300, replications=3, seed=7)
    c = simulate_run(s, 300, replications=3, seed=8)
    assert a.wall_clock_samples_s == b.wall_clock_samples_s
    assert a.wall_clock_samples_s != c.wall_clock_samples_s


def test_bad_spec_values():
    with pytest.raises(InputError, match="no failure rate"):
        RunSpec(1.0, 10, 1.0, 1.0, gpus=1, nodes=1)
    with pytest.raises(InputError, match="gpu_mtbf_s"):
        RunSpec(1.0, 10, 1.0, 1.0, gpus=1, nodes=1, gpu_mtbf_s=-1.0)


def test_cli_run_json(capsys):
    rc = main(["run", "--mode", "analytic", "--tokens", "20B", "--gpu-mtbf", "2000h",
               "--node-mtbf", "none", "--replications", "10", "--checkpoint-interval",
               "30min", "--json"])
    out = capsys.readouterr().out
    assert rc == 0
    r = json.loads(out)
    for key in ("goodput", "wall_clock_s", "best_checkpoint_interval_s", "lost_work_s",
                "daly_interval_s", "young_interval_s", "at_interval", "searched"):
        assert key in r
    assert 0 < r["goodput"] <= 1 and r["wall_clock_s"] >= r["useful_s"]
    assert r["job_mtbf_s"] == pytest.approx(2000 * 3600 / 32)
    assert r["steps"] == math.ceil(20e9 / r["tokens_per_step"])
    assert r["at_interval"]["interval_s"] == pytest.approx(1800, abs=r["step_time_s"])


@pytest.mark.parametrize("argv,needle", [
    (["--tokens", "0"], "--tokens '0' must be at least 1"),
    (["--tokens", "lots"], "--tokens 'lots' is not a count"),
    (["--gpu-mtbf=-5h"], "--gpu-mtbf '-5h' is not a time"),
    (["--gpu-mtbf", "0h"], "--gpu-mtbf '0h' must be positive"),
    (["--gpu-mtbf", "none", "--node-mtbf", "none"], "expected at least one failure rate"),
    (["--checkpoint-time", "fast"], "--checkpoint-time 'fast' is not a time"),
    (["--restart-time=-1s"], "--restart-time '-1s' is not a time"),
    (["--replications", "0"], "--replications = 0 must be a positive integer"),
    (["--search-points", "2"], "--search-points = 2 must be at least 3"),
    (["--checkpoint-interval", "0s"], "--checkpoint-interval '0s' must be positive"),
    (["--seed", "-1"], "--seed = -1 must be a non-negative integer"),
    # never a hang: a run that cannot finish, or a search too large to simulate, is refused
    (["--gpu-mtbf", "1s"], "failures are too frequent for the run to finish"),
    (["--tokens", "1e17"], "the Monte-Carlo would simulate about"),
])
def test_cli_run_bad_inputs(argv, needle, capsys):
    rc = main(["run", "--mode", "analytic", "--replications", "2", *argv])
    err = capsys.readouterr().err
    assert rc == 2
    assert needle in err, err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_step_time_distribution():
    # identical samples: segments of > 64 steps take n x mean exactly, so the run is the
    # deterministic one bit for bit (the failure times come from the same stream)
    base = spec_for(36.0, failures=20)
    same = RunSpec(**{**base.__dict__, "step_times_s": (1.0,) * 8})
    a = simulate_run(base, 300, replications=3, seed=5)
    b = simulate_run(same, 300, replications=3, seed=5)
    assert a.wall_clock_samples_s == b.wall_clock_samples_s
    # a spread of step times with the same mean: the same goodput within 1 %, short segments
    # (drawn step by step) and long ones (central limit) alike
    spread = RunSpec(**{**base.__dict__, "step_times_s": (0.8, 1.0, 1.2)})
    for k in (40, 300):
        d = simulate_run(base, k, replications=20, seed=5)
        s = simulate_run(spread, k, replications=20, seed=5)
        assert s.goodput == pytest.approx(d.goodput, rel=0.01)
        assert s.wall_clock_samples_s != d.wall_clock_samples_s


def test_cli_run_draws_from_the_jittered_step(capsys):
    rc = main(["run", "--mode", "engine", "--accum", "1", "--repeats", "4", "--jitter-cv",
               "0.1", "--seed", "3", "--replications", "4", "--tokens", "2B", "--json"])
    r = json.loads(capsys.readouterr().out)
    assert rc == 0 and r["step_time_samples"] == 4 and r["step_time_std_s"] > 0



@settings(max_examples=25, deadline=None)
@given(steps=st.integers(1, 400), k=st.integers(1, 50), c=st.floats(0, 20),
       r=st.floats(0, 50), mtbf=st.floats(50, 5000), seed=st.integers(0, 2**16))
def test_run_accounting_invariants(steps, k, c, r, mtbf, seed):
    s = RunSpec(2.0, steps, c, r, gpus=1, nodes=1, gpu_mtbf_s=mtbf)
    try:
        res = simulate_run(s, k, replications=2, seed=seed)
    except InputError:  # refused as too failure-prone to finish: fine, never a hang
        return
    n_ckpt = -(-steps // min(k, steps))
    assert res.checkpoint_s_total == pytest.approx(n_ckpt * c)  # every segment once
    assert res.wall_clock_s == pytest.approx(s.useful_s + res.checkpoint_s_total
                                             + res.lost_work_s + res.restart_s_total)
    assert 0 < res.goodput <= 1 and res.lost_work_s >= 0 and res.restart_s_total >= 0
    if res.failures == 0:  # no failure in any replication: nothing lost, no restart
        assert res.lost_work_s == 0 and res.restart_s_total == 0
        assert res.wall_clock_s == pytest.approx(s.useful_s + n_ckpt * c)
