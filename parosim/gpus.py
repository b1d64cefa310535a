"""Datasheet figures of known GPU models, used to fill a cluster YAML's ``gpu`` section.

A cluster YAML that names a known ``gpu.model`` may leave out ``memory``, ``peak_tflops`` and
``hbm_bandwidth``: they come from this table. An unknown model must give all three (nothing is
guessed). ``peak_tflops`` is dense bf16/fp16 tensor-core throughput (no sparsity).

Sources: NVIDIA A100 Tensor Core GPU datasheet (2021, 80GB and 40GB SXM4), NVIDIA H100 Tensor
Core GPU datasheet (2023, SXM5), NVIDIA H200 Tensor Core GPU datasheet (2024, SXM), NVIDIA
V100 datasheet (2020, SXM2). Memory in decimal GB, as the datasheets give it.

>>> known_gpu("h100-sxm5-80gb").peak_flops
989000000000000.0
>>> sorted(KNOWN_GPUS)[0]
'A100-SXM4-40GB'
"""

from __future__ import annotations

from .specs import GPUSpec

KNOWN_GPUS: dict[str, GPUSpec] = {
    g.model: g for g in (
        # HBM 2,039 GB/s, written ~2.0 TB/s as in the presets
        GPUSpec("A100-SXM4-80GB", 80 * 10**9, 312e12, 2.0e12),
        GPUSpec("A100-SXM4-40GB", 40 * 10**9, 312e12, 1.555e12),
        GPUSpec("H100-SXM5-80GB", 80 * 10**9, 989e12, 3.35e12),
        GPUSpec("H200-SXM-141GB", 141 * 10**9, 989e12, 4.8e12),
        GPUSpec("V100-SXM2-32GB", 32 * 10**9, 125e12, 0.9e12),
    )
}


def known_gpu(model: str) -> GPUSpec | None:
    """The datasheet spec of ``model`` (case-insensitive), or None if it is not in the table."""
    for name, spec in KNOWN_GPUS.items():
        if name.lower() == str(model).strip().lower():
            return spec
    return None
