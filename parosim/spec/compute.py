"""How compute is costed: the compute profile of a cluster (``compute:`` in the cluster YAML).

The kernel model itself (what the profile's parameters mean, how a layer is costed) is
:mod:`parosim.cost.kernels`; this module holds only the frozen input and the sourced defaults.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from ..errors import InputError

COMPUTE_MODELS = ("flat", "kernel")
ATTENTION_KINDS = ("flash", "eager")

# SuperBench v0.4 gemm-flops (cutlass profiler), Azure NDmv4 A100 80GB, bf16 tensor cores:
# 261227.8 GFLOPS, golden data averaged over 729 nodes (microsoft/superbench-results
# v0.4.0/Azure-NDmv4-A100/baseline.json @5e77aa78). 261.2278 / 312 (datasheet peak).
A100_GEMM_CEILING = 261.2278258330158 / 312.0

# Fitted with scipy least squares on 31 of the 61 llm-foundry MPT configurations (A100 80GB,
# FSDP; experiments/07_compute_model/fit_compute.py; held-out errors in docs/compute.md).
# Rounded to 3 significant digits. hbm_efficiency ends on its upper bound 1.0: our itemised
# bytes of the memory-bound kernels are an upper bound (fused kernels move fewer).
FITTED_GEMM_K_HALF = 948.0
FITTED_ATTENTION_EFFICIENCY = 0.327
FITTED_HBM_EFFICIENCY = 1.0

# Eager attention's batched QKᵀ / AV GEMMs (K = head_dim, M = N = sequence): their depth is
# small but their output tiles are many and large, a regime the weight GEMMs' depth term
# (``gemm_k_half``, fitted on FlashAttention runs, which launch no such GEMM) does not cover.
# Fraction of the GEMM ceiling they reach (times tile/wave quantization; never faster than
# their HBM traffic). Fitted with scipy least squares on the even-numbered rows of the two
# Megatron-LM tables of the calibration set (Narayanan et al. 2021 Table 1, Korthikanti et
# al. 2022 Tables 3-5; eager attention, A100 80GB), the odd rows held out:
# experiments/07_compute_model/fit_eager_attention.py, docs/compute.md. It ends on its upper
# bound 1.0: these GEMMs then run at the tile-quantized GEMM ceiling, and most of them are
# bound by their HBM traffic anyway.
FITTED_EAGER_ATTENTION_EFFICIENCY = 1.0

# FP8 weight GEMMs (precision fp8): the fraction of the bf16 GEMM efficiency (ceiling x depth
# term) they reach against the FP8 peak. No FP8 GEMM ceiling is in the calibration set;
# fitted with scipy least squares on the even-numbered rows of the NeMo 24.07 / Megatron-
# Bridge 25.11 FP8 table on DGX-H100 (7 rows), the odd rows held out
# (experiments/defaults_accuracy/fit_fp8.py, docs/compute.md "FP8"). It also absorbs what the
# A100-fitted parameters miss on H100.
FITTED_FP8_GEMM_EFFICIENCY = 0.716

# Per-kernel launch latency: SuperBench kernel-launch on Azure NDmv4 A100 measures 5.5 us
# (GPU time; 9.4 us CPU wall time) per launch (microsoft/superbench-results v0.4.0/
# Azure-NDmv4-A100/baseline.json @1c985995, kernel-launch/event_time, wall_time); "about
# 4-6 us" of driver and runtime calls per launch (https://susun-blog.com/blog/
# pegainfer-3-cuda-graph). A stream of kernels shorter than this is launch-bound. Kept
# fixed, not fitted: the published rows we fit on use kernels of milliseconds, which cannot
# tell its value, and the held-out tables must not set it (docs/compute.md, SuperBench).
DEFAULT_KERNEL_OVERHEAD_S = 5e-6

# Streaming multiprocessors per GPU (datasheets): wave quantization. H100 PCIe: 114 SMs
# (NVIDIA H100 Tensor Core GPU Architecture whitepaper, Table 3); the longest matching key wins.
SM_COUNTS = {"A100": 108, "H100": 132, "H200": 132, "V100": 80, "A10": 72, "L40": 142,
             "H100-PCIE": 114}

@dataclass(frozen=True)
class ComputeProfile:
    """How compute is costed. ``model``: ``"flat"`` (FLOPs at ``TrainingSpec.
    compute_efficiency`` of peak, the default) or ``"kernel"`` (this module).

    Every other field is a kernel-model parameter (fractions of the GPU's datasheet peak
    FLOP/s or HBM bandwidth; ``gemm_k_half`` in elements; ``kernel_overhead_s`` in seconds;
    ``sm_count`` 0 = from the GPU model name).
    """

    model: str = "flat"
    gemm_ceiling: float = A100_GEMM_CEILING
    gemm_k_half: float = FITTED_GEMM_K_HALF
    attention_efficiency: float = FITTED_ATTENTION_EFFICIENCY
    hbm_efficiency: float = FITTED_HBM_EFFICIENCY
    kernel_overhead_s: float = DEFAULT_KERNEL_OVERHEAD_S
    sm_count: int = 0
    eager_attention_efficiency: float = FITTED_EAGER_ATTENTION_EFFICIENCY
    fp8_gemm_efficiency: float = FITTED_FP8_GEMM_EFFICIENCY
    # True when the cluster YAML states ``model`` itself: then it decides the compute model
    # under every fidelity (an unset one is the fidelity's: kernel, or flat for "paper")
    model_given: bool = False
    source: str = ("gemm_ceiling: SuperBench v0.4 cutlass bf16 GEMM, A100 80GB; other "
                   "kernel parameters fitted on llm-foundry MFU rows (docs/compute.md)")

    def __post_init__(self) -> None:
        if self.model not in COMPUTE_MODELS:
            raise InputError(f"compute.model = {self.model!r} is not known; expected one of "
                             f"{', '.join(COMPUTE_MODELS)}")
        for f in ("gemm_ceiling", "attention_efficiency", "hbm_efficiency",
                  "eager_attention_efficiency", "fp8_gemm_efficiency"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= 1:
                raise InputError(f"compute.{f} = {v!r} must be a fraction in (0, 1]")
        for f in ("gemm_k_half", "kernel_overhead_s"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not (
                    math.isfinite(v) and v >= 0):
                raise InputError(f"compute.{f} = {v!r} must be a non-negative number")
        if isinstance(self.sm_count, bool) or not isinstance(self.sm_count, int) or \
                self.sm_count < 0:
            raise InputError(f"compute.sm_count = {self.sm_count!r} must be a non-negative "
                             "integer (0: from the GPU model)")

    def sms(self, gpu_model: str) -> int:
        """SM count: the field, else looked up by GPU model name (A100 108 if unknown)."""
        if self.sm_count:
            return self.sm_count
        name = gpu_model.upper()
        for key in sorted(SM_COUNTS, key=len, reverse=True):
            if key in name:
                return SM_COUNTS[key]
        return SM_COUNTS["A100"]

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}
