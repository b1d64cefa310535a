"""Datasheet figures of known GPU models, used to fill a cluster YAML's ``gpu`` section.

A cluster YAML that names a known ``gpu.model`` may leave out ``memory``, ``peak_tflops`` and
``hbm_bandwidth``: they come from this table. An unknown model must give all three (nothing is
guessed). ``peak_tflops`` is dense bf16/fp16 tensor-core throughput (no sparsity);
``peak_fp8_tflops`` is dense FP8 tensor-core throughput (Hopper only; 0 = no FP8 tensor
cores: A100, V100). NVIDIA's datasheets print the FP8 and bf16 figures "with sparsity"; the
dense figure is half of it: H100 SXM5 3,958 -> 1,979 FP8 and 1,979 -> 989 bf16 TFLOP/s;
H100 PCIe 3,026 -> 1,513 FP8 and 1,513 -> 756 bf16 TFLOP/s; H200 SXM 3,958 -> 1,979 FP8.

Sources: NVIDIA A100 Tensor Core GPU datasheet (2021, 80GB and 40GB SXM4), NVIDIA H100 Tensor
Core GPU datasheet (2023, SXM5 and PCIe: https://resources.nvidia.com/en-us-tensor-core/
nvidia-tensor-core-gpu-datasheet), NVIDIA H200 Tensor Core GPU datasheet (2024, SXM), NVIDIA
V100 datasheet (2020, SXM2).

Memory is the total ``nvidia-smi`` reports (MiB), not the datasheet's marketing figure: an
"80GB" A100 or H100 has 80 GiB-class memory, not 80e9 bytes. Sources (public nvidia-smi
printouts): A100-SXM4-80GB 81920MiB (github.com/allenai/PeerRead/issues/40), A100 40GB
40960MiB and H100 81559MiB / A100 80GB 81920MiB (github.com/modal-labs/modal-client/pull/2797),
H100 80GB HBM3 (SXM5) 81559MiB (github.com/NVIDIA/nccl/issues/1264,
github.com/wilicc/gpu-burn/issues/114); H100 PCIe 81559MiB and H200 143771MiB: nvidia-smi
printouts found in public repositories' text (several independent ones, same total; the
repository of each could not be pinned). V100-SXM2-32GB: no public nvidia-smi total found,
so it keeps the datasheet's decimal 32 GB.

>>> known_gpu("h100-sxm5-80gb").peak_flops
989000000000000.0
>>> known_gpu("h100-sxm5-80gb").peak_fp8_flops, known_gpu("A100-SXM4-80GB").peak_fp8_flops
(1979000000000000.0, 0.0)
>>> sorted(KNOWN_GPUS)[0]
'A100-SXM4-40GB'
"""

from __future__ import annotations

from .system import GPUSpec

_MiB = 2**20   # nvidia-smi prints memory.total in MiB

KNOWN_GPUS: dict[str, GPUSpec] = {
    g.model: g for g in (
        # HBM 2,039 GB/s, written ~2.0 TB/s as in the presets
        GPUSpec("A100-SXM4-80GB", 81920 * _MiB, 312e12, 2.0e12),
        GPUSpec("A100-SXM4-40GB", 40960 * _MiB, 312e12, 1.555e12),
        GPUSpec("H100-SXM5-80GB", 81559 * _MiB, 989e12, 3.35e12, peak_fp8_flops=1979e12),
        # H100 PCIe: 80GB HBM2e, 2.0 TB/s; 1,513 bf16 / 3,026 FP8 TFLOP/s with sparsity
        GPUSpec("H100-PCIe-80GB", 81559 * _MiB, 756e12, 2.0e12, peak_fp8_flops=1513e12),
        GPUSpec("H200-SXM-141GB", 143771 * _MiB, 989e12, 4.8e12, peak_fp8_flops=1979e12),
        GPUSpec("V100-SXM2-32GB", 32 * 10**9, 125e12, 0.9e12),
    )
}


def known_gpu(model: str) -> GPUSpec | None:
    """The datasheet spec of ``model`` (case-insensitive), or None if it is not in the table."""
    for name, spec in KNOWN_GPUS.items():
        if name.lower() == str(model).strip().lower():
            return spec
    return None
