"""The allocator margin of the Korthikanti memory estimate, fitted on published runs that trained.

The Korthikanti et al. estimate (``parosim.plan.memory3d``) is the memory model of every
TP / PP / CP / sequence-parallel / selective-recomputation layout, at every fidelity. Its total
is ``rest + margin``, ``margin = f · rest + 1 GiB`` (rest: model states + activations +
buffers; 1 GiB: the runtime reserve, kept). ``f`` was 10 %, a choice; this script measures it
the way the runtime memory model's fragmentation fraction is measured
(experiments/08_memory/check_memory.py):

* **rows**: every published run that trained and that parosim's defaults send through that
  estimate — the rows with a TP / PP / CP / SP / selective layout of the tables
  ``experiments/defaults_accuracy/evaluate_defaults.py`` evaluates (Narayanan et al. 2021
  Table 1, Korthikanti et al. 2022, BigScience tr11-176B, torchtitan's Llama 3.1 405B table,
  the NeMo / Megatron-Bridge FP8 table), plus the four Llama 3 70B rows of torchtitan's async-TP
  benchmark (the same fleet, ``all_tables.torchtitan_calibration_rows``, on its own preset).
  Their data-parallel rows (TP = PP = CP = 1) use the runtime memory model by default and are
  not rows of this fit. Each run is expressed exactly as ``evaluate_defaults`` expresses it
  (``--fidelity accurate``: the published layout, micro-batch, recomputation, precision and
  attention kernel; no modelling flag);
* **split**: per table, the even rows (0, 2, 4, ... of the table, as the per-table calibration
  splits them) fit, the odd rows are held out;
* **rule** (one-sided, as for the runtime model): every run trained, so the estimate plus its
  margin must not exceed the GPU; the fitted ``f`` is the largest fraction, in 0.5 % steps
  from 0 to 30 %, under which every fit-row run still fits. It is an upper bound that the
  data allow, not a measured fragmentation: a smaller margin fits those runs too.

Prints each run's "rest" and the largest ``f`` under which it alone fits, the fitted value,
and per table the held-out share that fits with it (writes ``out/korthikanti_margin.md``).

Run: ``PYTHONPATH=$PWD python experiments/08_memory/fit_korthikanti_margin.py``
(``tests/test_memory_margin.py`` asserts that the committed
``parosim.spec.training.KORTHIKANTI_MARGIN_FRACTION`` is what this rule gives).
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "experiments" / "defaults_accuracy"))
sys.path.insert(0, str(ROOT / "experiments" / "07_compute_model"))

import evaluate_defaults as ed  # noqa: E402

STEP = 200          # fractions i / STEP: 0.5 % steps
TOP = 60            # ... up to 30 %
FLEET = ("pytorch/torchtitan benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md @b5bcd76c "
         "— Llama 3 70B, FSDP 32 x TP 8, H100 500 W")


def tables() -> dict[str, list[dict]]:
    """Every published table with runs on the Korthikanti path, in full (rows as published,
    so that the even / odd split is the table's own)."""
    out = dict(ed.tables())
    out[FLEET] = ed.all_tables.torchtitan_calibration_rows()
    return out


def on_path(row: dict) -> bool:
    """True when the defaults send the run through the Korthikanti estimate (a layered
    layout: ``evaluate_defaults.training_of`` passes ``layered`` to ``for_fidelity``)."""
    return not ed.all_tables.parallel_spec(row).trivial


def split(rows: list[dict]) -> tuple[list[dict], list[dict]]:
    """(fit, held-out): the table's even and odd rows that take the Korthikanti path."""
    return ([r for r in rows[0::2] if on_path(r)], [r for r in rows[1::2] if on_path(r)])


def memory(row: dict, fraction: float | None = None):
    """The memory breakdown of the run's most loaded GPU under the defaults, with the
    margin fraction ``fraction`` (None: the committed one)."""
    from parosim.plan.threed import memory_3d

    cluster = ed.cluster_of(row)
    training = ed.training_of(row, cluster)
    if fraction is not None:
        training = replace(training, korthikanti_margin=fraction)
    return memory_3d(row["model"], row["strategy"], cluster, training,
                     ed.all_tables.parallel_spec(row))


def fit_fraction(rows: list[dict]) -> float:
    """The largest fraction (0.5 % steps, up to 30 %) under which every run of ``rows`` fits."""
    best = None
    for i in range(TOP + 1):
        f = i / STEP
        if all(memory(r, f).fits for r in rows):
            best = f
        else:
            break
    if best is None:
        raise SystemExit("a fit-row run does not fit even with no margin fraction")
    return best


def largest_fraction(row: dict) -> float:
    """The margin fraction at which the run exactly fills its GPU (capacity - 1 GiB) / rest - 1
    (printed for reading; the fit uses :func:`fit_fraction`)."""
    from parosim.cost.memory import RUNTIME_RESERVE_BYTES

    m = memory(row)
    rest = m.model_states_bytes + m.activations_bytes + m.buffers_bytes
    return (m.capacity_bytes - RUNTIME_RESERVE_BYTES) / rest - 1


def main() -> int:
    from parosim.spec.training import KORTHIKANTI_MARGIN_FRACTION

    which = tables()
    fit_rows = [r for rows in which.values() for r in split(rows)[0]]
    f = fit_fraction(fit_rows)
    lines = [f"Korthikanti-estimate margin fitted on {len(fit_rows)} runs (even rows): "
             f"{100 * f:.1f} % (committed: {100 * KORTHIKANTI_MARGIN_FRACTION:.1f} %)", "",
             "| table | fit rows (fit) | held-out rows that fit | run | half | rest GiB | "
             "GPU GiB | largest fraction that fits | fits |",
             "|---|---:|---:|---|---|---:|---:|---:|---|"]
    for table, rows in which.items():
        fit, held = split(rows)
        if not fit and not held:
            continue
        name = table.split(" — ")[0].split(" (")[0]
        n_fit = sum(memory(r, f).fits for r in fit)
        n_held = sum(memory(r, f).fits for r in held)
        lines.append(f"| **{name}** | {n_fit} of {len(fit)} | {n_held} of {len(held)} | | | | "
                     "| | |")
        for i, r in enumerate(rows):
            if not on_path(r):
                continue
            m = memory(r, f)
            rest = m.model_states_bytes + m.activations_bytes + m.buffers_bytes
            lines.append(f"| | | | {r['config']} | {'fit' if i % 2 == 0 else 'held out'} | "
                         f"{rest / 2**30:.2f} | {m.capacity_bytes / 2**30:.2f} | "
                         f"{100 * largest_fraction(r):.2f} % | {'yes' if m.fits else 'NO'} |")
    (HERE / "out").mkdir(exist_ok=True)
    (HERE / "out" / "korthikanti_margin.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
