"""Kernel compute model vs the published MFU tables it can express
(experiments/07_compute_model/all_tables.py, analytic mode).

What each table is checked on (docs/accuracy.md, "Every published MFU table"):

* Narayanan et al. Table 1 and Korthikanti et al. Tables 3-5 (Megatron-LM, eager attention):
  ``eager_attention_efficiency`` is fitted on their even-numbered rows
  (fit_eager_attention.py); the odd rows are held out and asserted <= 10 % median.
* BigScience (Jean Zay): the kernel parameters fitted elsewhere miss by ~25 % (asserted to be
  a miss, so a silent improvement or regression shows); a one-factor cluster calibration on
  the even rows (``parosim calibrate --steps``' scale) brings the held-out odd rows within
  10 % median (asserted).
* NeMo 24.07 / Megatron-Bridge 25.11 FP8 runs on DGX-H100: ``fp8_gemm_efficiency`` is fitted
  on the even rows (experiments/defaults_accuracy/fit_fp8.py); the odd rows are held out and within
  10 % median, uncalibrated and after a one-factor calibration on the even rows.
* torchtitan Llama 3.1 405B (bf16, Float8, Float8 + async TP): on its fleet's own preset
  (500 W HBM2e H100s, compute scale fitted on a separate benchmark of the same fleet: its
  four Llama 3 70B rows parosim can express), within 10 % median.
"""

import statistics
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments" / "07_compute_model"))
import all_tables  # noqa: E402


@pytest.fixture(scope="module")
def calibrated():
    return {c["table"]: c for c in all_tables.calibrated()}


def _abs_errors(rows):
    results, _ = all_tables.run(rows)
    assert all(r["fits"] for r in results), [r["config"] for r in results if not r["fits"]]
    return [abs(r["error_pct"]) for r in results]


@pytest.mark.parametrize("table", ["narayanan", "korthikanti"])
def test_megatron_tables_held_out_rows_within_10pct(table):
    rows = getattr(all_tables, f"{table}_rows")()
    held = rows[1::2]                          # eager_attention_efficiency saw rows[0::2]
    errs = _abs_errors(held)
    print(f"{table}: held-out median |error| {statistics.median(errs):.1f} %")
    assert len(errs) == len(rows) // 2 and statistics.median(errs) <= 10.0


# a refit (15 s on a quiet 2-core machine); the held-out check above runs by default
@pytest.mark.slow
def test_committed_eager_attention_efficiency_is_the_fit():
    import fit_eager_attention

    from parosim.cost.kernels import FITTED_EAGER_ATTENTION_EFFICIENCY

    e = fit_eager_attention.fit()["eager_attention_efficiency"]
    assert FITTED_EAGER_ATTENTION_EFFICIENCY == pytest.approx(round(e, 2), abs=0.011)


def test_bigscience_misses_uncalibrated_and_meets_after_cluster_calibration(calibrated):
    c = calibrated[all_tables.BIGSCIENCE]
    assert c["fit_rows"] == 4 and c["held_out_rows"] == 4
    assert c["held_out_zero_shot_median_pct"] > 15.0      # the known miss, stated in docs
    assert 0.6 < c["scale"] < 0.95                        # Jean Zay computed slower
    assert c["held_out_calibrated_median_pct"] <= 10.0


def test_nemo_fp8_table_meets_after_cluster_calibration(calibrated):
    # 14 FP8 runs on DGX-H100 (NeMo 24.07, Megatron-Bridge 25.11): with fp8_gemm_efficiency
    # fitted on the even rows (without it the A100-fitted parameters missed by ~24 %), the odd
    # rows are within 10 % median; a cluster scale fitted on the even rows keeps them there
    c = calibrated[all_tables.NEMO]
    assert c["fit_rows"] == 7 and c["held_out_rows"] == 7
    assert c["held_out_zero_shot_median_pct"] <= 10.0
    assert c["held_out_calibrated_median_pct"] <= 10.0


def test_torchtitan_meets_on_its_fleet_preset(calibrated):
    # The 405B rows run on their fleet's preset (topologies/h100-hbm2e-500w.yaml), whose
    # compute scale was fitted on the four expressible Llama 3 70B rows of a later benchmark
    # on the same 500 W H100 fleet (experiments/defaults_accuracy/fit_fleet.py); checked on
    # the three Llama 3.1 405B rows of docs/accuracy.md. A further k fitted on the 70B rows
    # over the preset stays ~1 (it is the same fit).
    c = calibrated[all_tables.TORCHTITAN]
    assert c["fit_rows"] == 4 and c["held_out_rows"] == 3
    print(f"torchtitan 405B: {c['held_out_zero_shot_median_pct']:.1f} % uncalibrated, "
          f"{c['held_out_calibrated_median_pct']:.1f} % calibrated (k = {c['scale']:.3f})")
    assert c["held_out_zero_shot_median_pct"] <= 10.0
    assert 0.97 < c["scale"] < 1.03
    assert c["held_out_calibrated_median_pct"] <= 10.0


def test_every_published_3d_run_fits_in_memory():
    # Megatron-LM, Megatron-DeepSpeed, torchtitan and NeMo runs that trained
    res = all_tables.memory_check()
    assert len(res) == 48
    bf16 = [r for r in res if r["precision"] == "bf16"]
    assert len(bf16) == 30 and all(r["fits"] for r in bf16)
    # FP8 rows with their documented memory settings (nemo_rows: dropout, fp8 primary
    # weights, Nemotron-340B's bf16 optimizer states): 13 of the 14 NeMo / Megatron-Bridge
    # runs fit on the H100's nvidia-smi total (81559MiB; 12 of 14 before Nemotron-340B ran with
    # NVIDIA's benchmark recipe; 10 of 14 on the former 80e9 bytes, which also missed GPT3-175B
    # on 512 GPUs and LLAMA3-8B CP2); the miss docs/accuracy.md ("FP8") explains. torchtitan's
    # Float8 405B rows (FSDP2, parameters sharded 16 ways) fit since the fp8 weight cache is of the
    # rank's parameter shard and the gathered layers (they were a miss when it counted the
    # whole model on every GPU).
    assert [r["config"] for r in res if not r["fits"]] == ["GPT3-20B TP2 PP1"]
    # with the data-parallel runs of experiments/08_memory (all fit, tests/test_kernels.py
    # and tests/test_runtime_memory.py): 61 llm-foundry + 2 SuperBench (its Megatron-Bridge
    # Llama-3-8B run is the one in nemo_rows, counted once): 110 of 111 published runs
    fit = 63 + sum(r["fits"] for r in res)
    assert (fit, 63 + len(res)) == (110, 111) and fit / 111 >= 0.95


def test_calibration_never_sees_its_check_rows():
    for table, (fit_rows, held) in all_tables.calibration_split().items():
        assert not {r["config"] for r in fit_rows} & {r["config"] for r in held}, table


def test_superbench_step_times_are_the_documented_host_bound_miss():
    # Not an MFU table (a step-time benchmark); the model predicts these host-bound eager
    # GPT-2 steps far too fast (docs/compute.md): a change of that shows here.
    errs = _abs_errors(all_tables.superbench_rows())
    assert len(errs) == 2 and all(e > 50.0 for e in errs)


def test_excluded_tables_name_their_reason():
    assert all(why for _, why in all_tables.EXCLUDED)
    names = " ".join(w for w, _ in all_tables.EXCLUDED)
    for t in ("Megatron-Bridge", "Offload", "FSDP blog"):
        assert t in names
    # FP8 (--precision fp8) and context parallelism (--cp) are expressible now: only the
    # uneven 405B pipeline keeps a NeMo-family row out
    assert [w for w, _ in all_tables.EXCLUDED if "NeMo" in w or "Megatron-Bridge" in w] == [
        "Megatron-Bridge performance summary (@00b7660b), LLAMA3.1_405B TP8 PP8 CP2 VP8"]


def test_readme_states_todays_held_out_medians_of_the_megatron_tables():
    meds = [statistics.median(_abs_errors(getattr(all_tables, f"{t}_rows")()[1::2]))
            for t in ("narayanan", "korthikanti")]
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    assert (f"| Megatron-LM, Korthikanti et al. MFU tables (held-out rows) | median "
            f"{min(meds):.1f}-{max(meds):.1f} % |") in readme
