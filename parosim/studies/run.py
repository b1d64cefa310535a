"""A whole training run with failures: checkpoints, restarts, goodput, the best interval.

The run is a simpy process over *segments*: a segment is ``k`` training steps followed by a
blocking checkpoint write of ``checkpoint_s`` seconds (``k`` steps = the checkpoint interval).
A failure process, independent of the trainer, draws the times between job-killing failures
from an exponential distribution whose rate is the sum of every component's rate::

    rate = gpus / gpu_mtbf + nodes / node_mtbf          (failures per second)

(a synchronous data-parallel job dies when any one GPU or node dies). A failure interrupts
whatever is running: the work since the last *completed* checkpoint (compute and a partial
checkpoint write) is lost, the job restarts (``restart_s`` seconds, during which a failure
restarts the restart) and resumes from the last checkpoint. The run ends with a final
checkpoint (the trained model must be saved). The step time comes from the step simulation
(:func:`parosim.simulate.simulate_step`), run once: steps are identical, so the run is
simulated at segment granularity, never step by step.

Definitions (seconds unless said otherwise)
    ``useful_s`` (T_s): steps x step time, the compute the run needs without failures;
    ``wall_clock_s`` (T_w): mean over replications of the simulated elapsed time;
    ``goodput`` = T_s / T_w, the fraction of wall-clock time spent on work that is kept
    (Meta's "effective training time");
    ``lost_work_s``: compute and checkpoint-write time thrown away by failures (mean per run);
    ``restart_s_total``: time spent restarting (mean per run);
    ``checkpoint_s_total``: time spent writing checkpoints that completed (mean per run).
    T_w = T_s + checkpoint_s_total + lost_work_s + restart_s_total, per replication.

Closed forms it is checked against (tests, ``docs/runs-and-jobs.md``), with M = 1/rate the
job's mean time between failures, C = checkpoint time, R = restart time, tau = compute
between checkpoints:

* Young (1974), "A first order approximation to the optimum checkpoint interval",
  CACM 17(9) 530-531: tau_opt = sqrt(2 C M).
* Daly (2006), "A higher order estimate of the optimum checkpoint interval for restart
  dumps", Future Generation Computer Systems 22(3) 303-312: expected wall clock
  T_w(tau) = M e^{R/M} (e^{(tau + C)/M} - 1) T_s / tau (exact for this model when T_s / tau
  is an integer) and tau_opt = sqrt(2 C M) [1 + (1/3) sqrt(C/(2M)) + (1/9) C/(2M)] - C for
  C < 2M, else M.

The best interval is searched, not taken from the formulas: every candidate interval (a whole
number of steps) is simulated on the *same* failure times (common random numbers), and the
minimum of a least-squares parabola in log(interval) fitted to the mean wall clock around the
grid's best point is reported (the Monte-Carlo curve is flat at its minimum, so the raw
argmin would wander with the noise).

>>> spec = RunSpec(step_time_s=1.0, steps=36_000, checkpoint_s=30.0, restart_s=60.0,
...                gpus=8, nodes=1, gpu_mtbf_s=8 * 3600.0)
>>> round(spec.mtbf_s)
3600
>>> r = simulate_run(spec, interval_steps=600, replications=4, seed=1)
>>> 0.8 < r.goodput < 1.0
True
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import numpy as np
import simpy

from ..errors import InputError


@dataclass(frozen=True)
class RunSpec:
    """One run: its steps, the checkpoint and restart costs, the failure rates (seconds)."""

    step_time_s: float
    steps: int
    checkpoint_s: float
    restart_s: float
    gpus: int
    nodes: int
    gpu_mtbf_s: float | None = None    # mean time between failures of ONE GPU
    node_mtbf_s: float | None = None   # of ONE node (host, NIC, cables, ...)
    # simulated step times (jitter, stragglers): steps are drawn from them; () = every step
    # takes step_time_s
    step_times_s: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if not (self.step_time_s > 0 and math.isfinite(self.step_time_s)):
            raise InputError(f"step time {self.step_time_s!r} s must be positive")
        if self.steps < 1:
            raise InputError(f"steps = {self.steps} must be at least 1")
        for name in ("checkpoint_s", "restart_s"):
            v = getattr(self, name)
            if not (v >= 0 and math.isfinite(v)):
                raise InputError(f"{name} = {v!r} must be a non-negative number of seconds")
        for name in ("gpu_mtbf_s", "node_mtbf_s"):
            v = getattr(self, name)
            if v is not None and not (v > 0 and math.isfinite(v)):
                raise InputError(f"{name} = {v!r} must be a positive number of seconds")
        if any(not (t > 0 and math.isfinite(t)) for t in self.step_times_s):
            raise InputError("step_times_s must hold positive step times")
        if self.gpu_mtbf_s is None and self.node_mtbf_s is None:
            raise InputError("no failure rate given; expected a GPU MTBF, a node MTBF or both")

    @property
    def gpu_rate(self) -> float:
        """Job-killing failures per second caused by GPUs."""
        return self.gpus / self.gpu_mtbf_s if self.gpu_mtbf_s else 0.0

    @property
    def node_rate(self) -> float:
        return self.nodes / self.node_mtbf_s if self.node_mtbf_s else 0.0

    @property
    def mtbf_s(self) -> float:
        """M: the job's mean time between failures (any component)."""
        return 1.0 / (self.gpu_rate + self.node_rate)

    @property
    def useful_s(self) -> float:
        return self.steps * self.step_time_s


@dataclass
class RunResult:
    """Monte-Carlo result at one checkpoint interval (means over replications)."""

    interval_steps: int
    interval_s: float
    replications: int
    wall_clock_s: float
    wall_clock_std_s: float
    goodput: float
    lost_work_s: float
    restart_s_total: float
    checkpoint_s_total: float
    failures: float
    failures_gpu: float
    failures_node: float
    wall_clock_samples_s: list[float] = field(default_factory=list, repr=False)

    def to_dict(self) -> dict:
        return {"interval_s": self.interval_s, "interval_steps": self.interval_steps,
                "wall_clock_s": self.wall_clock_s, "wall_clock_std_s": self.wall_clock_std_s,
                "goodput": self.goodput, "lost_work_s": self.lost_work_s,
                "restart_s_total": self.restart_s_total,
                "checkpoint_s_total": self.checkpoint_s_total, "failures": self.failures,
                "failures_gpu": self.failures_gpu, "failures_node": self.failures_node}


# -- closed forms -------------------------------------------------------------------------
def young_interval(checkpoint_s: float, mtbf_s: float) -> float:
    """Young (1974): tau_opt = sqrt(2 C M).

    >>> young_interval(50.0, 3600.0)
    600.0
    """
    return math.sqrt(2.0 * checkpoint_s * mtbf_s)


def daly_interval(checkpoint_s: float, mtbf_s: float) -> float:
    """Daly (2006) higher-order optimum, eq. (37): sqrt(2CM)[1 + sqrt(C/2M)/3 + C/(18M)] - C
    for C < 2M, else M.

    >>> round(daly_interval(50.0, 3600.0), 2)
    567.13
    """
    c, m = checkpoint_s, mtbf_s
    if c >= 2.0 * m:
        return m
    x = c / (2.0 * m)
    return math.sqrt(2.0 * c * m) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - c


def daly_wall_clock(useful_s: float, interval_s: float, checkpoint_s: float, restart_s: float,
                    mtbf_s: float) -> float:
    """Daly (2006) eq. (13): T_w = M e^{R/M} (e^{(tau+C)/M} - 1) T_s / tau (failures may strike
    during compute, checkpoint writes and restarts; exponential times between failures)."""
    m = mtbf_s
    return m * math.exp(restart_s / m) * math.expm1((interval_s + checkpoint_s) / m) \
        * useful_s / interval_s


def expected_wall_clock(spec: RunSpec, interval_steps: int) -> float:
    """Daly's per-segment expectation M e^{R/M} (e^{(L + C)/M} - 1) summed over the run's
    actual segments (the last one holds the remaining steps and may be shorter): the exact
    expected wall clock of the model :func:`simulate_run` simulates.

    >>> s = RunSpec(1.0, 1000, 10.0, 5.0, gpus=1, nodes=1, gpu_mtbf_s=1e4)
    >>> expected_wall_clock(s, 100) == daly_wall_clock(1000, 100, 10.0, 5.0, 1e4)
    True
    """
    k = interval_steps
    full, rest = divmod(spec.steps, k)
    m, c, t = spec.mtbf_s, spec.checkpoint_s, spec.step_time_s
    seg = math.expm1((k * t + c) / m) * full
    if rest:
        seg += math.expm1((rest * t + c) / m)
    return m * math.exp(spec.restart_s / m) * seg


# -- what a simulation would cost (never a hang) -----------------------------------------
MAX_EVENTS = 20_000_000   # segments + failures one search may simulate (~30 s of CPU)
MAX_SLOWDOWN = 1000.0     # an interval whose expected wall clock exceeds this x T_s is skipped


def _expected(spec: RunSpec, k: int) -> float:
    try:
        return expected_wall_clock(spec, k)
    except OverflowError:
        return math.inf


def feasible_intervals(spec: RunSpec, ks: list[int], replications: int) -> list[int]:
    """The intervals of ``ks`` worth simulating (expected wall clock at most
    :data:`MAX_SLOWDOWN` x the compute, from Daly's exact expectation); raises
    :class:`InputError` when none is, or when simulating them all would take more than
    :data:`MAX_EVENTS` segments and failures."""
    walls = {k: _expected(spec, k) for k in ks}
    ok = [k for k in ks if walls[k] <= MAX_SLOWDOWN * spec.useful_s]
    if not ok:
        raise InputError(
            f"failures are too frequent for the run to finish: a job MTBF of "
            f"{spec.mtbf_s:.3g} s (--gpu-mtbf, --node-mtbf) with a --checkpoint-time of "
            f"{spec.checkpoint_s:g} s and a --restart-time of {spec.restart_s:g} s gives an "
            "expected wall clock over "
            f"{MAX_SLOWDOWN:g} x the compute at every interval tried; expected a longer MTBF "
            "(--gpu-mtbf, --node-mtbf) or shorter checkpoint and restart times")
    cost = replications * sum(spec.steps / k + 2.0 * walls[k] / spec.mtbf_s for k in ok)
    if cost > MAX_EVENTS:
        raise InputError(
            f"the Monte-Carlo would simulate about {cost:.2g} segments and failures (limit "
            f"{MAX_EVENTS:.0e}); expected fewer --replications or --search-points, or a "
            "shorter run (--tokens)")
    return ok


# -- the simulation -----------------------------------------------------------------------
# a segment of more steps than this takes n x mean + sqrt(n) x std x N(0, 1) (the central
# limit theorem) instead of n draws from the simulated step times
_CLT_STEPS = 64


def _segment_sampler(spec: RunSpec, rng: np.random.Generator | None):
    """n -> the duration of n steps: n x step time, or a draw from the step distribution."""
    if not spec.step_times_s or rng is None:
        t = spec.step_time_s
        return lambda n: n * t
    samples = np.asarray(spec.step_times_s, dtype=float)
    mu, sd = float(samples.mean()), float(samples.std())

    def draw(n: int) -> float:
        if n <= _CLT_STEPS:
            return float(rng.choice(samples, size=n).sum())
        return max(0.0, n * mu + math.sqrt(n) * sd * float(rng.standard_normal()))

    return draw


def _one_run(spec: RunSpec, k: int, rng: np.random.Generator,
             step_rng: np.random.Generator | None = None) -> tuple:
    """One replication: (wall, lost, restart, checkpoint, failures, gpu failures)."""
    env = simpy.Environment()
    segment = _segment_sampler(spec, step_rng)
    c, r = spec.checkpoint_s, spec.restart_s
    rate = spec.gpu_rate + spec.node_rate
    p_gpu = spec.gpu_rate / rate
    acc = {"lost": 0.0, "restart": 0.0, "ckpt": 0.0, "fail": 0, "gpu": 0}

    def trainer():
        done = 0
        while done < spec.steps:
            n = min(k, spec.steps - done)
            seg = segment(n)
            start = env.now
            try:
                yield env.timeout(seg + c)  # n steps, then the checkpoint write
            except simpy.Interrupt:
                acc["lost"] += env.now - start
                while True:  # restart; a failure during it starts it again
                    t0 = env.now
                    try:
                        yield env.timeout(r)
                        acc["restart"] += r
                        break
                    except simpy.Interrupt:
                        acc["restart"] += env.now - t0
                continue
            done += n
            acc["ckpt"] += c

    def failures(job):
        while True:
            yield env.timeout(float(rng.exponential(1.0 / rate)))
            gpu = bool(rng.random() < p_gpu)
            if not job.is_alive:
                return
            acc["fail"] += 1
            acc["gpu"] += gpu
            job.interrupt()

    job = env.process(trainer())
    env.process(failures(job))
    env.run(until=job)
    return env.now, acc["lost"], acc["restart"], acc["ckpt"], acc["fail"], acc["gpu"]


def _seeds(seed: int, replications: int) -> list[np.random.SeedSequence]:
    return np.random.SeedSequence(seed).spawn(replications)


def simulate_run(spec: RunSpec, interval_steps: int, replications: int = 20,
                 seed: int = 0) -> RunResult:
    """Monte-Carlo over ``replications`` independent runs at one checkpoint interval.

    Replication i draws its failures from ``SeedSequence(seed).spawn(replications)[i]``, so
    two intervals with the same seed see the same failure times (common random numbers).
    """
    if interval_steps < 1:
        raise InputError(f"checkpoint interval of {interval_steps} steps must be at least 1")
    if replications < 1:
        raise InputError(f"--replications = {replications} must be a positive integer")
    feasible_intervals(spec, [interval_steps], replications)
    # failures from the replication's own seed; step draws (if any) from its first child,
    # so the failure times stay the same whatever the step distribution
    rows = np.array([_one_run(spec, interval_steps, np.random.default_rng(s),
                              np.random.default_rng(s.spawn(1)[0]) if spec.step_times_s
                              else None)
                     for s in _seeds(seed, replications)], dtype=float)
    wall = rows[:, 0]
    mean = rows.mean(axis=0)
    return RunResult(
        interval_steps=interval_steps, interval_s=interval_steps * spec.step_time_s,
        replications=replications, wall_clock_s=float(mean[0]),
        wall_clock_std_s=float(wall.std(ddof=1)) if replications > 1 else 0.0,
        goodput=spec.useful_s / float(mean[0]), lost_work_s=float(mean[1]),
        restart_s_total=float(mean[2]), checkpoint_s_total=float(mean[3]),
        failures=float(mean[4]), failures_gpu=float(mean[5]),
        failures_node=float(mean[4] - mean[5]), wall_clock_samples_s=wall.tolist())


def candidate_intervals(spec: RunSpec, points: int = 17, span: float = 4.0) -> list[int]:
    """Checkpoint intervals to search, in steps: ``points`` geometric from Young's interval /
    ``span`` to x ``span`` (whole steps, at least one, at most the whole run), deduplicated."""
    if points < 3:
        raise InputError(f"--search-points = {points} must be at least 3")
    young = young_interval(spec.checkpoint_s, spec.mtbf_s) if spec.checkpoint_s > 0 \
        else spec.step_time_s
    taus = young * np.geomspace(1.0 / span, span, points)
    ks = sorted({min(spec.steps, max(1, round(t / spec.step_time_s))) for t in taus})
    return ks


def _fit_minimum(taus: np.ndarray, walls: np.ndarray) -> float:
    """Minimiser of a least-squares parabola in log(tau) over the points within a factor 2 of
    the best grid point (at least 3 points); the best grid point when the fit has no interior
    minimum there."""
    i = int(np.argmin(walls))
    u = np.log(taus)
    sel = np.abs(u - u[i]) <= math.log(2.0) + 1e-12
    if sel.sum() < 3:
        lo, hi = max(0, i - 1), min(len(u), i + 2)
        sel = np.zeros(len(u), bool)
        sel[lo:hi] = True
    if sel.sum() < 3:
        return float(taus[i])
    a, b, _ = np.polyfit(u[sel], walls[sel] / walls[i], 2)
    if not a > 0:
        return float(taus[i])
    u_min = -b / (2 * a)
    if not (u[sel].min() <= u_min <= u[sel].max()):
        return float(taus[i])
    return float(math.exp(u_min))


@dataclass
class RunSearch:
    """The result of :func:`best_interval`: every searched interval and the best one."""

    spec: RunSpec
    results: list[RunResult]
    best_interval_s: float
    best: RunResult           # simulated at the best interval (rounded to whole steps)


def best_interval(spec: RunSpec, replications: int = 20, seed: int = 0,
                  points: int = 17, span: float = 4.0) -> RunSearch:
    """Search the checkpoint interval that minimises the expected wall clock."""
    ks = feasible_intervals(spec, candidate_intervals(spec, points, span), replications)
    results = [simulate_run(spec, k, replications, seed) for k in ks]
    taus = np.array([r.interval_s for r in results])
    walls = np.array([r.wall_clock_s for r in results])
    tau = _fit_minimum(taus, walls) if len(ks) >= 3 else float(taus[int(np.argmin(walls))])
    k = min(spec.steps, max(1, round(tau / spec.step_time_s)))
    best = next((r for r in results if r.interval_steps == k), None)
    if best is None:
        best = simulate_run(spec, k, replications, seed)
    return RunSearch(spec, results, tau, best)


# -- from a configuration -----------------------------------------------------------------
# Default failure rates: Meta's LLaMA 3 405B pre-training (Grattafiori et al., "The Llama 3
# Herd of Models", arXiv 2407.21783, sec. 3.3.4 and Table 5): 419 unexpected interruptions
# in a 54-day snapshot on 16,384 H100 GPUs (2,048 nodes of 8), 58.7 % of them GPU issues
# (GPU, HBM3, SRAM, GPU processor, ...). We attribute those 246 to GPUs and the other 173
# (network, host, software, ...) to nodes (our choice: they scale with the node count).
LLAMA3_HOURS = 54 * 24
LLAMA3_GPU_MTBF_S = 16384 * LLAMA3_HOURS / 246 * 3600.0   # 86,316 h per GPU
LLAMA3_NODE_MTBF_S = 2048 * LLAMA3_HOURS / 173 * 3600.0   # 15,342 h per node


def run_from_step(step, tokens_per_step: int, tokens: int, gpus: int, nodes: int,
                  checkpoint_s: float, restart_s: float, gpu_mtbf_s: float | None,
                  node_mtbf_s: float | None, step_times_s=()) -> RunSpec:
    """A :class:`RunSpec` from a simulated step (``step_time_s`` of a ``StepResult``, the
    mean when several steps were simulated; their times in ``step_times_s``):
    ceil(tokens / tokens per step) steps."""
    steps = -(-tokens // tokens_per_step)
    return RunSpec(step_time_s=step, steps=steps, checkpoint_s=checkpoint_s,
                   restart_s=restart_s, gpus=gpus, nodes=nodes, gpu_mtbf_s=gpu_mtbf_s,
                   node_mtbf_s=node_mtbf_s, step_times_s=tuple(float(t) for t in step_times_s))


# -- inputs -------------------------------------------------------------------------------
_COUNT_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([kKMBGT]?)\s*$")
_COUNT = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12}


def parse_count(text: str | int | float, what: str = "--tokens") -> int:
    """A positive count from ``"1.4T"``, ``"300B"`` (billion), ``"2M"``, ``"5e9"`` or a number.

    >>> parse_count("1.4T"), parse_count("300B"), parse_count(1000)
    (1400000000000, 300000000000, 1000)
    """
    if isinstance(text, bool):
        raise InputError(f"{what} {text!r} is not a count; expected e.g. '1.4T' or '300B'")
    if isinstance(text, (int, float)):
        value = float(text)
    else:
        m = _COUNT_RE.match(str(text))
        if not m:
            raise InputError(f"{what} {text!r} is not a count; expected a number with an "
                             "optional K, M, B (billion) or T suffix, e.g. '1.4T'")
        value = float(m.group(1)) * _COUNT[m.group(2)]
    if not math.isfinite(value):
        raise InputError(f"{what} {text!r} must be finite")
    if not value >= 1:
        raise InputError(f"{what} {text!r} must be at least 1")
    return int(round(value))


def run_report(search: RunSearch, tokens: int, tokens_per_step: int,
               fixed: RunResult | None = None) -> dict:
    """The ``parosim run --json`` object (keys and units in ``docs/runs-and-jobs.md``)."""
    spec, best = search.spec, search.best
    m = spec.mtbf_s
    daly_tau = daly_interval(spec.checkpoint_s, m)
    k_daly = min(spec.steps, max(1, round(daly_tau / spec.step_time_s)))
    daly_wall = expected_wall_clock(spec, k_daly)
    walls = np.array(best.wall_clock_samples_s)
    out = {
        "goodput": best.goodput,
        "wall_clock_s": best.wall_clock_s,
        "best_checkpoint_interval_s": search.best_interval_s,
        "best_checkpoint_interval_steps": best.interval_steps,
        "wall_clock_p50_s": float(np.percentile(walls, 50)),
        "wall_clock_p90_s": float(np.percentile(walls, 90)),
        "wall_clock_std_s": best.wall_clock_std_s,
        "lost_work_s": best.lost_work_s,
        "restart_s_total": best.restart_s_total,
        "checkpoint_s_total": best.checkpoint_s_total,
        "failures": best.failures, "failures_gpu": best.failures_gpu,
        "failures_node": best.failures_node,
        "tokens": tokens, "tokens_per_step": tokens_per_step, "steps": spec.steps,
        "step_time_s": spec.step_time_s, "useful_s": spec.useful_s,
        "step_time_samples": len(spec.step_times_s),
        "step_time_std_s": float(np.std(spec.step_times_s)) if spec.step_times_s else 0.0,
        "gpus": spec.gpus, "nodes": spec.nodes,
        "gpu_mtbf_s": spec.gpu_mtbf_s, "node_mtbf_s": spec.node_mtbf_s,
        "job_mtbf_s": m, "checkpoint_s": spec.checkpoint_s, "restart_s": spec.restart_s,
        "young_interval_s": young_interval(spec.checkpoint_s, m),
        "daly_interval_s": daly_tau,
        "daly_wall_clock_s": daly_wall, "daly_goodput": spec.useful_s / daly_wall,
        "expected_wall_clock_s": expected_wall_clock(spec, best.interval_steps),
        "replications": best.replications,
        "failures_simulated": best.failures * best.replications,
        "searched": [r.to_dict() for r in search.results],
    }
    if fixed is not None:
        out["at_interval"] = fixed.to_dict()
    return out
