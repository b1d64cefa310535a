"""GPU memory capacities are the totals nvidia-smi reports, not the marketing "80GB" as 80e9
bytes (sources in parosim/spec/gpus.py); the unit "GB" itself stays decimal."""

from __future__ import annotations

from pathlib import Path

import pytest

from parosim.io import load_cluster
from parosim.spec.gpus import known_gpu
from parosim.spec.system import GPUSpec
from parosim.units import parse_size

MiB = 2**20
A100_80, A100_40, H100 = 81920 * MiB, 40960 * MiB, 81559 * MiB   # nvidia-smi memory.total
TOPOLOGIES = Path(__file__).resolve().parents[1] / "topologies"


def test_gb_unit_is_still_decimal():
    assert parse_size("80GB") == 80 * 10**9
    assert parse_size("81920MiB") == A100_80 == 85_899_345_920


def test_known_gpus_carry_nvidia_smi_totals():
    assert known_gpu("A100-SXM4-80GB").memory_bytes == A100_80
    assert known_gpu("A100-SXM4-40GB").memory_bytes == A100_40
    assert known_gpu("H100-SXM5-80GB").memory_bytes == H100
    assert known_gpu("H100-PCIe-80GB").memory_bytes == H100
    assert known_gpu("H200-SXM-141GB").memory_bytes == 143771 * MiB
    assert GPUSpec().memory_bytes == A100_80      # the default GPU is an A100-SXM4-80GB


@pytest.mark.parametrize("path", sorted(TOPOLOGIES.glob("*.yaml")), ids=lambda p: p.stem)
def test_a100_h100_presets_state_the_nvidia_smi_total(path):
    expected = {"A100-SXM4-80GB": A100_80, "H100-SXM5-80GB": H100}
    for g, _, mem in load_cluster(str(path), nodes=None).gpu_specs():
        if g.model in expected:
            assert mem == expected[g.model], (path.stem, g.model, mem)


def test_mixed_preset_h100_nodes_have_the_h100_total():
    c = load_cluster("mixed-a100-h100")
    mems = [mem for _, _, mem in c.gpu_specs()]
    gpn = c.gpus_per_node
    assert mems == [A100_80] * 2 * gpn + [H100] * 2 * gpn
    assert c.min_gpu_memory_bytes == H100
