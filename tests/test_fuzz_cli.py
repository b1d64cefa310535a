"""Fuzz suite: bad and extreme input to every command and YAML field.

Every case below runs ``parosim.cli.main`` in this process under a wall-clock alarm
(``CASE_TIMEOUT_S``) and checks one of two outcomes:

* ``ERR(needle)``: exit code 2, exactly one line on stderr, starting ``parosim: error:``,
  containing ``needle``, and no traceback (an out-of-domain value is never accepted);
* ``OK``: exit code 0 (an extreme value inside the documented domain, docs/limits.md).

Any other exception is a failure (a traceback), and so is a case that runs past its alarm (a
hang). A few cases need a real process (SIGKILL of a sweep, a sweep racing another one); they
are at the end. Hypothesis adds random strings for the unit parsers and random cluster YAML
values.

The table (``CASES``) is the list of cases; ``{d}`` in an argument is the folder of the YAML
files written by ``files`` (``FILES``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from parosim.cli.commands import main
from parosim.errors import InputError

CASE_TIMEOUT_S = 30

CL = """name: t
gpus_per_node: 8
nodes: 4
gpu: {model: A100-SXM4-80GB}
intra_node: {fabric: nvswitch, bandwidth: 2000Gbps, latency: 2us}
nic: {per_node: 1, bandwidth: 100Gbps, latency: 5us}
network: {fabric: single-switch}
"""


def _cl(old: str, new: str) -> str:
    assert old in CL
    return CL.replace(old, new)


SWEEP = """name: s
kind: collective
mode: analytic
grid:
  nodes: [2, 4]
fixed: {cluster: paper-a100-roce, op: all-gather, size: 64MB, algo: ring}
"""

# file name -> content (str or bytes)
FILES: dict[str, str | bytes] = {
    "good.yaml": CL,
    "h100.yaml": _cl("A100-SXM4-80GB", "H100-SXM5-80GB"),
    "fp8_neg.yaml": _cl("{model: A100-SXM4-80GB}", "{model: A100-SXM4-80GB, peak_fp8_tflops: -1}"),
    "fp8_str.yaml": _cl("{model: A100-SXM4-80GB}",
                        "{model: A100-SXM4-80GB, peak_fp8_tflops: fast}"),
    "fp8_a100.yaml": _cl("{model: A100-SXM4-80GB}",
                         "{model: A100-SXM4-80GB, peak_fp8_tflops: 624}"),
    "bad_utf8.yaml": CL.encode() + b"sources: caf\xe9 \xff\n",
    "dup_top.yaml": CL + "name: u\n",
    "dup_nested.yaml": _cl("per_node: 1,", "per_node: 1, per_node: 2,"),
    "bare_nic_bw.yaml": _cl("bandwidth: 100Gbps", "bandwidth: 100"),
    "bare_intra_bw.yaml": _cl("bandwidth: 2000Gbps", "bandwidth: 2000"),
    "bare_latency.yaml": _cl("latency: 5us", "latency: 5"),
    "bare_memory.yaml": _cl("{model: A100-SXM4-80GB}", "{model: A100-SXM4-80GB, memory: 80}"),
    "no_nic.yaml": _cl("nic: {per_node: 1, bandwidth: 100Gbps, latency: 5us}\n", ""),
    "no_gpu.yaml": _cl("gpu: {model: A100-SXM4-80GB}\n", ""),
    "unknown_gpu.yaml": _cl("A100-SXM4-80GB", "MI300X"),
    "unknown_gpu_full.yaml": _cl("{model: A100-SXM4-80GB}",
                                 "{model: X1, memory: 64GB, peak_tflops: 400, "
                                 "hbm_bandwidth: 3TB/s}"),
    "nic16.yaml": _cl("per_node: 1", "per_node: 16"),
    "nic3.yaml": _cl("per_node: 1", "per_node: 3"),
    "nic_neg.yaml": _cl("per_node: 1", "per_node: -1"),
    "leaf_5_2.yaml": _cl("nodes: 4", "nodes: 5").replace(
        "{fabric: single-switch}", "{fabric: leaf-spine, nodes_per_leaf: 2}"),
    "leaf_ok.yaml": _cl("{fabric: single-switch}", "{fabric: leaf-spine, nodes_per_leaf: 2}"),
    "leaf_zero.yaml": _cl("{fabric: single-switch}", "{fabric: leaf-spine, nodes_per_leaf: 0}"),
    "leaf_str.yaml": _cl("{fabric: single-switch}", "{fabric: leaf-spine, nodes_per_leaf: x}"),
    "single_leaf.yaml": _cl("{fabric: single-switch}",
                            "{fabric: single-switch, nodes_per_leaf: 2}"),
    "rail_leaf.yaml": _cl("{fabric: single-switch}", "{fabric: rail, nodes_per_leaf: 2}"),
    "oversub_zero.yaml": _cl("{fabric: single-switch}",
                             "{fabric: single-switch, oversubscription: 0}"),
    "oversub_inf.yaml": _cl("{fabric: single-switch}",
                            "{fabric: single-switch, oversubscription: .inf}"),
    "oversub_str.yaml": _cl("{fabric: single-switch}",
                            "{fabric: single-switch, oversubscription: lots}"),
    "fabric_torus.yaml": _cl("single-switch", "torus"),
    "intra_fabric.yaml": _cl("fabric: nvswitch", "fabric: nvlink9"),
    "nodes_zero.yaml": _cl("nodes: 4", "nodes: 0"),
    "nodes_neg.yaml": _cl("nodes: 4", "nodes: -3"),
    "nodes_float.yaml": _cl("nodes: 4", "nodes: 1.5"),
    "nodes_str.yaml": _cl("nodes: 4", "nodes: '4'"),
    "nodes_bool.yaml": _cl("nodes: 4", "nodes: true"),
    "nodes_huge.yaml": _cl("nodes: 4", "nodes: 1000000000000000000000000000000"),
    "gpn_zero.yaml": _cl("gpus_per_node: 8", "gpus_per_node: 0"),
    "gpn_float.yaml": _cl("gpus_per_node: 8", "gpus_per_node: 3.5"),
    "gpn_huge.yaml": _cl("gpus_per_node: 8", "gpus_per_node: 100000"),
    "chunks_zero.yaml": CL + "collective: {ho_ring_max_chunks: 0}\n",
    "chunks_bool.yaml": CL + "collective: {ho_ring_max_chunks: true}\n",
    "chunks_huge.yaml": CL + "collective: {ho_ring_max_chunks: 1000000000}\n",
    "serial_str.yaml": CL + "collective: {serial_progress: 'yes'}\n",
    "step_lat_neg.yaml": CL + "collective: {step_latency: -5us}\n",
    "pcie_zero.yaml": CL + "pcie: {bandwidth: 0GB/s}\n",
    "lat_neg.yaml": _cl("latency: 5us", "latency: -5us"),
    "lat_inf.yaml": _cl("latency: 5us", "latency: 1e400us"),
    "lat_2h.yaml": _cl("latency: 5us", "latency: 1e10s"),
    "bw_empty.yaml": _cl("bandwidth: 100Gbps", "bandwidth: ''"),
    "bw_tiny.yaml": _cl("bandwidth: 100Gbps", "bandwidth: 1e-30Gbps"),
    "mem_zero.yaml": _cl("{model: A100-SXM4-80GB}", "{model: A100-SXM4-80GB, memory: 0GB}"),
    "tflops_neg.yaml": _cl("{model: A100-SXM4-80GB}",
                           "{model: A100-SXM4-80GB, peak_tflops: -1}"),
    "tflops_str.yaml": _cl("{model: A100-SXM4-80GB}",
                           "{model: A100-SXM4-80GB, peak_tflops: fast}"),
    "gpu_unknown_key.yaml": _cl("{model: A100-SXM4-80GB}", "{model: A100-SXM4-80GB, sm: 108}"),
    "no_name.yaml": CL.replace("name: t\n", ""),
    "unknown_top.yaml": CL + "bogus: 1\n",
    "nic_list.yaml": _cl("nic: {per_node: 1, bandwidth: 100Gbps, latency: 5us}",
                         "nic: [1, 2]"),
    "python_tag.yaml": CL + "sources: !!python/object/apply:os.system ['true']\n",
    "bad_date.yaml": CL + "sources: 2001-02-30\n",
    "list.yaml": "- a\n- b\n",
    "empty.yaml": "",
    "scalar.yaml": "42\n",
    "unclosed.yaml": "name: [x\n",
    # models
    "m_params_inf.yaml": "name: m\nparams: 1e400\n",
    "m_params_inf2.yaml": "name: m\nparams: 1.0e+400\n",
    "m_params_neg.yaml": "name: m\nparams: -5\n",
    "m_params_zero.yaml": "name: m\nparams: 0\n",
    "m_params_str.yaml": "name: m\nparams: many\n",
    "m_params_bool.yaml": "name: m\nparams: true\n",
    "m_params_huge.yaml": "name: m\nparams: 1e20\n",
    "m_params_ok.yaml": "name: m\nparams: 7.5B\n",
    "m_shape_part.yaml": "name: m\nlayers: 2\nhidden: 64\n",
    "m_layers_zero.yaml": "name: m\nlayers: 0\nhidden: 64\nffn_hidden: 172\nheads: 4\n"
                          "vocab: 100\n",
    "m_layers_huge.yaml": "name: m\nlayers: 1000000000\nhidden: 64\nffn_hidden: 172\n"
                          "heads: 4\nvocab: 100\n",
    "m_heads.yaml": "name: m\nlayers: 2\nhidden: 64\nffn_hidden: 172\nheads: 5\nvocab: 100\n",
    "m_tiny.yaml": "name: m\nlayers: 2\nhidden: 64\nffn_hidden: 172\nheads: 4\nvocab: 100\n",
    "m_unknown.yaml": "name: m\nparams: 7e9\ndepth: 3\n",
    "m_dup.yaml": "name: m\nparams: 7e9\nparams: 8e9\n",
    "m_utf8.yaml": b"name: m\xff\nparams: 7e9\n",
    "m_noname.yaml": "params: 7e9\n",
    # sweeps
    "s_ok.yaml": SWEEP,
    "s_utf8.yaml": SWEEP.encode() + b"description: \xfe\n",
    "s_dup.yaml": SWEEP + "mode: engine\n",
    "s_grid_empty.yaml": SWEEP.replace("nodes: [2, 4]", "nodes: []"),
    "s_no_grid.yaml": SWEEP.replace("grid:\n  nodes: [2, 4]\n", ""),
    "s_grid_key.yaml": SWEEP.replace("nodes: [2, 4]", "nodez: [2, 4]"),
    "s_kind.yaml": SWEEP.replace("kind: collective", "kind: training"),
    "s_mode.yaml": SWEEP.replace("mode: analytic", "mode: fast"),
    "s_nodes_bad.yaml": SWEEP.replace("nodes: [2, 4]", "nodes: [2, 0]"),
    "s_size_bad.yaml": SWEEP.replace("size: 64MB", "size: 1e400GB"),
    "s_both.yaml": SWEEP.replace("algo: ring}", "algo: ring, nodes: 2}"),
    "s_huge.yaml": SWEEP.replace("nodes: [2, 4]", "nodes: [" + ", ".join(
        str(i) for i in range(1, 1002)) + "]\n  size: [" + ", ".join(
        f"{i}MB" for i in range(1, 1002)) + "]").replace("size: 64MB, ", ""),
    "s_fig_plot.yaml": SWEEP + "figures: [pie]\n",
    "s_fig_metric.yaml": SWEEP + "figures: [{plot: collectives, metric: speed}]\n",
    "s_fig_x.yaml": SWEEP + "figures: [{plot: collectives, x: when}]\n",
    "s_fig_by.yaml": SWEEP + "figures: [{plot: collectives, by: [colour]}]\n",
    "s_fig_key.yaml": SWEEP + "figures: [{plot: collectives, colour: red}]\n",
    "s_step_strategy.yaml": "name: s\nkind: step\nmode: analytic\ngrid: {strategy: [NIG, XYZ]}"
                            "\nfixed: {model: llama-7b}\n",
    "s_step_nomodel.yaml": "name: s\nkind: step\nmode: analytic\ngrid: {strategy: [NIG]}\n",
    "s_step_ratio.yaml": "name: s\nkind: step\nmode: analytic\ngrid: {trainable_ratio: [2]}"
                         "\nfixed: {model: llama-7b}\n",
    "s_step_cluster.yaml": "name: s\nkind: step\nmode: analytic\ngrid: {cluster: [nope]}"
                           "\nfixed: {model: llama-7b}\n",
}


def OK() -> tuple:
    return ("ok", "")


def ERR(needle: str) -> tuple:
    return ("err", needle)


A = ["--mode", "analytic"]
BIG = "1000000000000000000000000000000"

CASES: list[tuple[str, list[str], tuple]] = [
    # --- the tracebacks --------------------------------------------------------------
    ("size-1e20B", ["collective", "--size", "1e20B"], ERR("--size '1e20B' is outside")),
    ("nic-bw-1e-30", ["simulate", "--nic-bandwidth", "1e-30Gbps", *A], ERR("--nic-bandwidth")),
    ("nic-bw-1e-30-engine", ["simulate", "--nic-bandwidth", "1e-30Gbps"], ERR("outside")),
    ("efficiency-1e-300", ["simulate", "--efficiency", "1e-300"], ERR("exceeds")),
    ("efficiency-1e-300-an", ["simulate", "--efficiency", "1e-300", *A], ERR("exceeds")),
    ("overlap-1e300", ["simulate", "--overlap-slowdown", "1e300"], ERR("exceeds")),
    ("cluster-utf8", ["collective", "--cluster", "{d}/bad_utf8.yaml"], ERR("not UTF-8")),
    ("model-utf8", ["memory", "--model", "{d}/m_utf8.yaml"], ERR("not UTF-8")),
    ("sweep-utf8", ["sweep", "{d}/s_utf8.yaml", "--out", "{o}"], ERR("not UTF-8")),
    ("model-params-1e400", ["memory", "--model", "{d}/m_params_inf.yaml"], ERR("finite")),
    ("model-params-1e400b", ["memory", "--model", "{d}/m_params_inf2.yaml"], ERR("finite")),
    ("scheduler-notaurl", ["sweep", "{d}/s_ok.yaml", "--out", "{o}", "--scheduler", "notaurl"],
     ERR("--scheduler 'notaurl'")),
    ("scheduler-empty", ["sweep", "{d}/s_ok.yaml", "--out", "{o}", "--scheduler", ""],
     ERR("--scheduler is empty")),
    ("results-csv-dir", ["sweep", "{d}/s_ok.yaml", "--out", "{d}/outdir_with_csv_dir"],
     ERR("is a directory")),
    # --- the hangs ---------------------------------------------------------------------
    ("nodes-1e9-collective", ["collective", "--nodes", "1000000000"], ERR("131072 GPUs")),
    ("nodes-1e9-simulate", ["simulate", "--nodes", "1000000000"], ERR("131072 GPUs")),
    ("nodes-1e9-analytic", ["simulate", "--nodes", "1000000000", *A], ERR("131072 GPUs")),
    ("nodes-1e30", ["collective", "--nodes", BIG], ERR("131072 GPUs")),
    ("nodes-1e30-memory", ["memory", "--nodes", BIG], ERR("131072 GPUs")),
    ("nodes-16385", ["compare", "--nodes", "16385", *A], ERR("at most 16384 nodes")),
    ("accum-1e7-engine", ["simulate", "--accum", "10000000"], ERR("engine's limit")),
    ("accum-1e7-analytic", ["simulate", "--accum", "10000000", *A], ERR("exceeds")),
    ("accum-1e5-analytic", ["simulate", "--accum", "100000", *A], OK()),
    ("sweep-1e6-grid", ["sweep", "{d}/s_huge.yaml", "--out", "{o}"], ERR("more than the limit")),
    # --- the silent acceptances --------------------------------------------------------
    ("nic-bw-empty", ["simulate", "--nic-bandwidth", "", *A], ERR("--nic-bandwidth is empty")),
    ("gpu-mem-empty", ["simulate", "--gpu-memory", "", *A], ERR("--gpu-memory is empty")),
    ("intra-bw-empty", ["compare", "--intra-bandwidth", " ", *A], ERR("is empty")),
    ("compare-workers-0", ["compare", "--workers", "0", *A], ERR("--workers = 0")),
    ("compare-workers-neg", ["compare", "--workers", "-2", *A], ERR("--workers = -2")),
    ("compare-workers-huge", ["compare", "--workers", "100000", *A], ERR("more than 256")),
    ("sweep-workers-huge", ["sweep", "{d}/s_ok.yaml", "--out", "{o}", "--workers", "100000"],
     ERR("more than 256")),
    ("sweep-workers-0", ["sweep", "{d}/s_ok.yaml", "--out", "{o}", "--workers", "0"],
     ERR("--workers")),
    ("sweep-workers-neg", ["sweep", "{d}/s_ok.yaml", "--out", "{o}", "--workers", "-2"],
     ERR("--workers")),
    ("leaf-not-dividing", ["collective", "--cluster", "{d}/leaf_5_2.yaml"],
     ERR("does not divide the 5 nodes")),
    ("leaf-not-dividing-nodes", ["collective", "--cluster", "{d}/leaf_ok.yaml", "--nodes", "3"],
     ERR("does not divide the 3 nodes")),
    ("nic-more-than-gpus", ["collective", "--cluster", "{d}/nic16.yaml"],
     ERR("nic.per_node = 16 is more than")),
    ("leaf-on-single-switch", ["collective", "--cluster", "{d}/single_leaf.yaml"],
     ERR("only for a leaf-spine")),
    ("leaf-on-rail", ["collective", "--cluster", "{d}/rail_leaf.yaml"],
     ERR("only for a leaf-spine")),
    ("bare-nic-bandwidth", ["collective", "--cluster", "{d}/bare_nic_bw.yaml"],
     ERR("nic.bandwidth = 100 has no unit")),
    ("bare-intra-bandwidth", ["collective", "--cluster", "{d}/bare_intra_bw.yaml"],
     ERR("intra_node.bandwidth = 2000 has no unit")),
    ("bare-latency", ["collective", "--cluster", "{d}/bare_latency.yaml"], ERR("has no unit")),
    ("bare-memory", ["collective", "--cluster", "{d}/bare_memory.yaml"],
     ERR("gpu.memory = 80 has no unit")),
    ("dup-key-top", ["collective", "--cluster", "{d}/dup_top.yaml"], ERR("duplicate key 'name'")),
    ("dup-key-nested", ["collective", "--cluster", "{d}/dup_nested.yaml"],
     ERR("duplicate key 'per_node'")),
    ("dup-key-model", ["memory", "--model", "{d}/m_dup.yaml"], ERR("duplicate key 'params'")),
    ("dup-key-sweep", ["sweep", "{d}/s_dup.yaml", "--out", "{o}"], ERR("duplicate key 'mode'")),
    ("figure-metric-not-column", ["sweep", "{d}/s_fig_metric.yaml", "--out", "{o}"],
     ERR("metric 'speed' is not a column")),
    ("no-nic-section", ["collective", "--cluster", "{d}/no_nic.yaml"],
     ERR("missing required section 'nic'")),
    ("gpu-h100-filled", ["memory", "--cluster", "{d}/h100.yaml", *A[:0]], OK()),
    ("gpu-unknown-model", ["collective", "--cluster", "{d}/unknown_gpu.yaml"],
     ERR("'MI300X' is not in the table")),
    ("size-1e400GB", ["collective", "--size", "1e400GB"], ERR("must be finite")),
    ("gpu-mem-1e400GB", ["simulate", "--gpu-memory", "1e400GB", *A], ERR("must be finite")),
    # --- more: collective ----------------------------------------------------------------------
    ("size-empty", ["collective", "--size", ""], ERR("--size is empty")),
    ("size-neg", ["collective", "--size=-1GB"], ERR("is not a size")),
    ("size-zero", ["collective", "--size", "0"], ERR("must be positive")),
    ("size-nan", ["collective", "--size", "nan"], ERR("is not a size")),
    ("size-unit", ["collective", "--size", "12XB"], ERR("is not a size")),
    ("size-2EiB", ["collective", "--size", "2048PiB"], ERR("outside")),
    ("size-half-byte", ["collective", "--size", "0.5B"], ERR("whole number of bytes")),
    ("size-1EiB-ok", ["collective", "--size", "1GiB", "--nodes", "2"], OK()),
    ("op-empty", ["collective", "--op", ""], ERR("--op")),
    ("op-bad", ["collective", "--op", "gather"], ERR("--op 'gather' is not known")),
    ("scope-bad", ["collective", "--scope", "world"], ERR("--scope")),
    ("algo-bad", ["collective", "--algo", "tree"], ERR("--algo")),
    ("algo-empty", ["collective", "--algo", ""], ERR("--algo")),
    ("coll-nodes-0", ["collective", "--nodes", "0"], ERR("--nodes = 0")),
    ("coll-nodes-neg", ["collective", "--nodes", "-4"], ERR("--nodes = -4")),
    ("coll-nodes-word", ["collective", "--nodes", "four"], ERR("invalid int value")),
    ("coll-group-0", ["collective", "--group-nodes", "0"], ERR("--group-nodes = 0")),
    ("coll-group-3", ["collective", "--group-nodes", "3"], ERR("does not divide the 4 nodes")),
    ("coll-cluster-empty", ["collective", "--cluster", ""], ERR("--cluster is empty")),
    ("coll-cluster-dir", ["collective", "--cluster", "{d}"], ERR("")),
    ("coll-cluster-missing", ["collective", "--cluster", "{d}/nope.yaml"], ERR("does not exist")),
    ("coll-nodes-1024", ["collective", "--nodes", "1024"], OK()),
    # --- more: cluster YAML fields -------------------------------------------------------------
    ("yaml-good", ["collective", "--cluster", "{d}/good.yaml"], OK()),
    ("yaml-leaf-ok", ["collective", "--cluster", "{d}/leaf_ok.yaml"], OK()),
    ("yaml-unknown-gpu-full", ["collective", "--cluster", "{d}/unknown_gpu_full.yaml"], OK()),
    ("yaml-no-gpu", ["collective", "--cluster", "{d}/no_gpu.yaml"], ERR("gpu.model")),
    ("yaml-nic3", ["collective", "--cluster", "{d}/nic3.yaml"], ERR("divide")),
    ("yaml-nic-neg", ["collective", "--cluster", "{d}/nic_neg.yaml"], ERR("nic.per_node = -1")),
    ("yaml-leaf-zero", ["collective", "--cluster", "{d}/leaf_zero.yaml"], ERR("nodes_per_leaf")),
    ("yaml-leaf-str", ["collective", "--cluster", "{d}/leaf_str.yaml"], ERR("nodes_per_leaf")),
    ("yaml-oversub-zero", ["collective", "--cluster", "{d}/oversub_zero.yaml"],
     ERR("oversubscription")),
    ("yaml-oversub-inf", ["collective", "--cluster", "{d}/oversub_inf.yaml"],
     ERR("oversubscription")),
    ("yaml-oversub-str", ["collective", "--cluster", "{d}/oversub_str.yaml"],
     ERR("oversubscription")),
    ("yaml-fabric", ["collective", "--cluster", "{d}/fabric_torus.yaml"], ERR("'torus'")),
    ("yaml-intra-fabric", ["collective", "--cluster", "{d}/intra_fabric.yaml"], ERR("nvlink9")),
    ("yaml-nodes-zero", ["collective", "--cluster", "{d}/nodes_zero.yaml"], ERR("nodes = 0")),
    ("yaml-nodes-neg", ["collective", "--cluster", "{d}/nodes_neg.yaml"], ERR("nodes = -3")),
    ("yaml-nodes-float", ["collective", "--cluster", "{d}/nodes_float.yaml"], ERR("nodes = 1.5")),
    ("yaml-nodes-str", ["collective", "--cluster", "{d}/nodes_str.yaml"], ERR("nodes = '4'")),
    ("yaml-nodes-bool", ["collective", "--cluster", "{d}/nodes_bool.yaml"], ERR("nodes = True")),
    ("yaml-nodes-huge", ["collective", "--cluster", "{d}/nodes_huge.yaml"], ERR("131072")),
    ("yaml-gpn-zero", ["collective", "--cluster", "{d}/gpn_zero.yaml"], ERR("gpus_per_node")),
    ("yaml-gpn-float", ["collective", "--cluster", "{d}/gpn_float.yaml"], ERR("gpus_per_node")),
    ("yaml-gpn-huge", ["collective", "--cluster", "{d}/gpn_huge.yaml"], ERR("131072")),
    ("yaml-chunks-zero", ["collective", "--cluster", "{d}/chunks_zero.yaml"],
     ERR("ho_ring_max_chunks")),
    ("yaml-chunks-bool", ["collective", "--cluster", "{d}/chunks_bool.yaml"],
     ERR("ho_ring_max_chunks")),
    ("yaml-chunks-huge", ["collective", "--cluster", "{d}/chunks_huge.yaml"],
     ERR("ho_ring_max_chunks")),
    ("yaml-serial-str", ["collective", "--cluster", "{d}/serial_str.yaml"],
     ERR("serial_progress")),
    ("yaml-step-lat-neg", ["collective", "--cluster", "{d}/step_lat_neg.yaml"],
     ERR("step_latency")),
    ("yaml-pcie-zero", ["collective", "--cluster", "{d}/pcie_zero.yaml"], ERR("pcie.bandwidth")),
    ("yaml-lat-neg", ["collective", "--cluster", "{d}/lat_neg.yaml"], ERR("nic.latency")),
    ("yaml-lat-inf", ["collective", "--cluster", "{d}/lat_inf.yaml"], ERR("must be finite")),
    ("yaml-lat-2h", ["collective", "--cluster", "{d}/lat_2h.yaml"], ERR("at most 1e9 s")),
    ("yaml-bw-empty", ["collective", "--cluster", "{d}/bw_empty.yaml"], ERR("is empty")),
    ("yaml-bw-tiny", ["collective", "--cluster", "{d}/bw_tiny.yaml"], ERR("outside")),
    ("yaml-mem-zero", ["collective", "--cluster", "{d}/mem_zero.yaml"], ERR("gpu.memory")),
    ("yaml-tflops-neg", ["collective", "--cluster", "{d}/tflops_neg.yaml"], ERR("peak_tflops")),
    ("yaml-tflops-str", ["collective", "--cluster", "{d}/tflops_str.yaml"], ERR("peak_tflops")),
    ("yaml-gpu-key", ["collective", "--cluster", "{d}/gpu_unknown_key.yaml"],
     ERR("unknown key 'sm'")),
    ("yaml-no-name", ["collective", "--cluster", "{d}/no_name.yaml"], ERR("'name'")),
    ("yaml-unknown-top", ["collective", "--cluster", "{d}/unknown_top.yaml"],
     ERR("unknown key 'bogus'")),
    ("yaml-nic-list", ["collective", "--cluster", "{d}/nic_list.yaml"], ERR("must be a mapping")),
    ("yaml-python-tag", ["collective", "--cluster", "{d}/python_tag.yaml"],
     ERR("malformed YAML")),
    ("yaml-bad-date", ["collective", "--cluster", "{d}/bad_date.yaml"], ERR("cannot read")),
    ("yaml-list", ["collective", "--cluster", "{d}/list.yaml"], ERR("must hold a mapping")),
    ("yaml-empty", ["collective", "--cluster", "{d}/empty.yaml"], ERR("must hold a mapping")),
    ("yaml-scalar", ["collective", "--cluster", "{d}/scalar.yaml"], ERR("must hold a mapping")),
    ("yaml-unclosed", ["collective", "--cluster", "{d}/unclosed.yaml"], ERR("malformed YAML")),
    # --- more: simulate / compare / memory flags -----------------------------------------------
    ("nic-bw-zero", ["simulate", "--nic-bandwidth", "0Gbps", *A], ERR("must be positive")),
    ("nic-bw-neg", ["simulate", "--nic-bandwidth=-1Gbps", *A], ERR("is not a bandwidth")),
    ("nic-bw-huge", ["simulate", "--nic-bandwidth", "1e20Gbps", *A], ERR("outside")),
    ("nic-bw-word", ["simulate", "--nic-bandwidth", "fast", *A], ERR("is not a bandwidth")),
    ("nic-bw-nounit", ["simulate", "--nic-bandwidth", "100", *A], ERR("is not a bandwidth")),
    ("nic-bw-inf", ["simulate", "--nic-bandwidth", "1e999Gbps", *A], ERR("must be finite")),
    ("intra-bw-zero", ["simulate", "--intra-bandwidth", "0GB/s", *A], ERR("must be positive")),
    ("gpu-mem-zero", ["memory", "--gpu-memory", "0GB"], ERR("must be positive")),
    ("gpu-mem-word", ["memory", "--gpu-memory", "lots"], ERR("is not a size")),
    ("gpu-mem-tiny", ["simulate", "--gpu-memory", "1GB", *A], ERR("does not fit")),
    ("efficiency-0", ["simulate", "--efficiency", "0", *A], ERR("--efficiency = 0")),
    ("efficiency-neg", ["simulate", "--efficiency", "-0.5", *A], ERR("--efficiency")),
    ("efficiency-1.5", ["simulate", "--efficiency", "1.5", *A], ERR("--efficiency")),
    ("efficiency-nan", ["simulate", "--efficiency", "nan", *A], ERR("--efficiency")),
    ("efficiency-inf", ["simulate", "--efficiency", "inf", *A], ERR("--efficiency")),
    ("efficiency-word", ["simulate", "--efficiency", "half", *A], ERR("invalid float value")),
    ("overlap-0.5", ["simulate", "--overlap-slowdown", "0.5", *A], ERR("--overlap-slowdown")),
    ("overlap-nan", ["simulate", "--overlap-slowdown", "nan", *A], ERR("--overlap-slowdown")),
    ("overlap-inf", ["simulate", "--overlap-slowdown", "inf", *A], ERR("--overlap-slowdown")),
    ("micro-batch-0", ["simulate", "--micro-batch", "0", *A], ERR("--micro-batch = 0")),
    ("micro-batch-neg", ["simulate", "--micro-batch", "-1", *A], ERR("--micro-batch = -1")),
    ("micro-batch-huge", ["simulate", "--micro-batch", "1000000000000", *A], ERR("does not fit")),
    ("accum-0", ["simulate", "--accum", "0", *A], ERR("--accum = 0")),
    ("accum-float", ["simulate", "--accum", "2.5", *A], ERR("invalid int value")),
    ("seq-len-0", ["simulate", "--seq-len", "0", *A], ERR("--seq-len = 0")),
    ("seq-len-huge", ["simulate", "--seq-len", "1000000000", *A], ERR("does not fit")),
    ("ratio-0", ["simulate", "--trainable-ratio", "0", *A], ERR("--trainable-ratio")),
    ("ratio-1.5", ["simulate", "--trainable-ratio", "1.5", *A], ERR("--trainable-ratio")),
    ("ratio-neg", ["simulate", "--trainable-ratio", "-1", *A], ERR("--trainable-ratio")),
    ("ratio-word", ["simulate", "--trainable-ratio", "half", *A], ERR("--trainable-ratio")),
    ("ratio-div0", ["simulate", "--trainable-ratio", "1/0", *A], ERR("--trainable-ratio")),
    ("ratio-nan", ["simulate", "--trainable-ratio", "nan", *A], ERR("--trainable-ratio")),
    ("ratio-empty", ["simulate", "--trainable-ratio", "", *A], ERR("--trainable-ratio")),
    ("ratio-fraction-ok", ["simulate", "--trainable-ratio", "1/16", *A], OK()),
    ("strategy-bad", ["simulate", "--strategy", "XYZ", *A], ERR("XYZ")),
    ("strategy-empty", ["simulate", "--strategy", "", *A], ERR("strategy")),
    ("memory-strategy-bad", ["memory", "--strategy", "ZZZ"], ERR("ZZZ")),
    ("model-unknown", ["simulate", "--model", "gpt-9", *A], ERR("unknown model 'gpt-9'")),
    ("model-empty", ["simulate", "--model", "", *A], ERR("unknown model ''")),
    ("model-dir", ["memory", "--model", "{d}/dir.yaml"], ERR("is a directory")),
    ("model-params-neg", ["memory", "--model", "{d}/m_params_neg.yaml"], ERR("params")),
    ("model-params-zero", ["memory", "--model", "{d}/m_params_zero.yaml"], ERR("params")),
    ("model-params-str", ["memory", "--model", "{d}/m_params_str.yaml"], ERR("params")),
    ("model-params-bool", ["memory", "--model", "{d}/m_params_bool.yaml"], ERR("params")),
    ("model-params-huge", ["memory", "--model", "{d}/m_params_huge.yaml"], ERR("limit")),
    ("model-params-ok-memory", ["memory", "--model", "{d}/m_params_ok.yaml"], OK()),
    ("model-params-only-simulate", ["simulate", "--model", "{d}/m_params_ok.yaml", *A],
     ERR("shape")),
    ("model-shape-part", ["memory", "--model", "{d}/m_shape_part.yaml"], ERR("incomplete")),
    ("model-layers-zero", ["memory", "--model", "{d}/m_layers_zero.yaml"], ERR("layers = 0")),
    ("model-layers-huge", ["simulate", "--model", "{d}/m_layers_huge.yaml", *A],
     ERR("layers = 1000000000 is more than")),
    ("model-heads", ["memory", "--model", "{d}/m_heads.yaml"], ERR("not divisible")),
    ("model-unknown-key", ["memory", "--model", "{d}/m_unknown.yaml"], ERR("unknown key 'depth'")),
    ("model-no-name", ["memory", "--model", "{d}/m_noname.yaml"], ERR("'name'")),
    ("model-tiny-ok", ["simulate", "--model", "{d}/m_tiny.yaml", "--nodes", "1"], OK()),
    ("mode-bad", ["simulate", "--mode", "fast"], ERR("invalid choice")),
    ("trace-analytic", ["simulate", "--trace", "{o}/t.json", *A], ERR("--trace needs")),
    ("simulate-algo-all", ["simulate", "--algo", "all", *A], ERR("for 'parosim compare'")),
    ("simulate-algo-list", ["simulate", "--algo", "ring,ho-ring", *A],
     ERR("names 2 algorithms")),
    ("compare-algo-list", ["compare", "--algo", "ring,ho-ring", *A], OK()),
    ("compare-algo-list-bad", ["compare", "--algo", "ring,tree", *A], ERR("'tree'")),
    ("recompute-bad", ["simulate", "--recompute", "maybe", *A], ERR("invalid choice")),
    ("sim-group-2-of-3", ["simulate", "--nodes", "3", "--group-nodes", "2", *A],
     ERR("does not divide the 3 nodes")),
    ("sim-nodes-8192-ok", ["simulate", "--nodes", "8192", *A], OK()),
    ("compare-nodes-64", ["compare", "--nodes", "64", *A], OK()),
    ("compare-cluster-bad", ["compare", "--cluster", "{d}/nic16.yaml", *A], ERR("per_node")),
    ("memory-nodes-0", ["memory", "--nodes", "0"], ERR("--nodes = 0")),
    ("memory-ok", ["memory", "--model", "llama-65b"], OK()),
    # --- more: sweep specs ---------------------------------------------------------------------
    ("sweep-ok", ["sweep", "{d}/s_ok.yaml", "--out", "{o}", "--no-progress", "--workers", "1"],
     OK()),
    ("sweep-missing", ["sweep", "{d}/nope.yaml", "--out", "{o}"], ERR("does not exist")),
    ("sweep-out-is-file", ["sweep", "{d}/s_ok.yaml", "--out", "{d}/good.yaml"],
     ERR("not writable")),
    ("sweep-grid-empty", ["sweep", "{d}/s_grid_empty.yaml", "--out", "{o}"], ERR("empty list")),
    ("sweep-no-grid", ["sweep", "{d}/s_no_grid.yaml", "--out", "{o}"], ERR("'grid'")),
    ("sweep-grid-key", ["sweep", "{d}/s_grid_key.yaml", "--out", "{o}"], ERR("'nodez'")),
    ("sweep-kind", ["sweep", "{d}/s_kind.yaml", "--out", "{o}"], ERR("kind 'training'")),
    ("sweep-mode", ["sweep", "{d}/s_mode.yaml", "--out", "{o}"], ERR("mode 'fast'")),
    ("sweep-nodes-bad", ["sweep", "{d}/s_nodes_bad.yaml", "--out", "{o}"], ERR("nodes = 0")),
    ("sweep-size-bad", ["sweep", "{d}/s_size_bad.yaml", "--out", "{o}"], ERR("finite")),
    ("sweep-grid-and-fixed", ["sweep", "{d}/s_both.yaml", "--out", "{o}"], ERR("both")),
    ("sweep-fig-plot", ["sweep", "{d}/s_fig_plot.yaml", "--out", "{o}"], ERR("'pie'")),
    ("sweep-fig-x", ["sweep", "{d}/s_fig_x.yaml", "--out", "{o}"], ERR("x 'when'")),
    ("sweep-fig-by", ["sweep", "{d}/s_fig_by.yaml", "--out", "{o}"], ERR("'colour'")),
    ("sweep-fig-key", ["sweep", "{d}/s_fig_key.yaml", "--out", "{o}"], ERR("'colour'")),
    ("sweep-step-strategy", ["sweep", "{d}/s_step_strategy.yaml", "--out", "{o}"], ERR("XYZ")),
    ("sweep-step-nomodel", ["sweep", "{d}/s_step_nomodel.yaml", "--out", "{o}"],
     ERR("needs 'model'")),
    ("sweep-step-ratio", ["sweep", "{d}/s_step_ratio.yaml", "--out", "{o}"], ERR("ratio")),
    ("sweep-step-cluster", ["sweep", "{d}/s_step_cluster.yaml", "--out", "{o}"],
     ERR("'nope'")),
    ("sweep-spec-is-dir", ["sweep", "{d}", "--out", "{o}"], ERR("")),
    # --- more: --global-batch ------------------------------------------------------------------
    ("global-batch-seqs", ["simulate", "--global-batch", "1280", *A], OK()),
    ("global-batch-tokens", ["simulate", "--global-batch", "1Mitok", *A], OK()),
    ("global-batch-not-multiple", ["simulate", "--global-batch", "1000", *A],
     ERR("not a positive multiple")),
    ("global-batch-too-small", ["simulate", "--global-batch", "64", *A],
     ERR("not a positive multiple")),
    ("global-batch-tokens-not-seqs", ["simulate", "--global-batch", "4Mtok", *A],
     ERR("not a whole number of 512-token")),
    ("global-batch-empty", ["simulate", "--global-batch", "", *A], ERR("not a batch size")),
    ("global-batch-word", ["simulate", "--global-batch", "lots", *A], ERR("not a batch size")),
    ("global-batch-neg", ["simulate", "--global-batch=-128", *A], ERR("not a batch size")),
    ("global-batch-inf", ["simulate", "--global-batch", "1e400", *A], ERR("whole number")),
    ("global-batch-vs-accum", ["simulate", "--global-batch", "1280", "--accum", "4", *A],
     ERR("--accum 4 disagrees")),
    ("global-batch-memory", ["memory", "--global-batch", "2560"], OK()),
    # --- more: run and calibrate -----------------------------------------------------------------
    ("run-replications-1e9", ["run", "--replications", "1000000000", *A], ERR("limit")),
    ("run-tokens-1e30", ["run", "--tokens", "1e30", *A], ERR("limit")),
    ("run-tokens-1e400", ["run", "--tokens", "1e400", *A], ERR("must be finite")),
    ("run-tokens-0", ["run", "--tokens", "0", *A], ERR("at least 1")),
    ("run-tokens-word", ["run", "--tokens", "many", *A], ERR("not a count")),
    ("run-mtbf-0", ["run", "--gpu-mtbf", "0h", *A], ERR("must be positive")),
    ("run-mtbf-both-none", ["run", "--gpu-mtbf", "none", "--node-mtbf", "none", *A],
     ERR("both 'none'")),
    ("run-ckpt-empty", ["run", "--checkpoint-time", "", *A], ERR("is empty")),
    ("run-search-points-0", ["run", "--search-points", "0", *A], ERR("at least 3")),
    ("run-search-points-huge", ["run", "--search-points", "1000000000", *A],
     ERR("more than 10000")),
    ("run-repeats-0", ["run", "--repeats", "0", *A], ERR("--repeats = 0")),
    ("run-repeats-huge", ["run", "--repeats", "100000000", *A], ERR("more than 10000")),
    ("run-ok", ["run", *A], OK()),
    ("calibrate-no-args", ["calibrate"], ERR("required")),
    ("calibrate-missing-log", ["calibrate", "--nccl-tests", "{d}/nope.log", "--cluster",
                               "paper-a100-roce", "-o", "{o}/c.yaml"], ERR("")),
    ("calibrate-bad-cluster", ["calibrate", "--nccl-tests", "{d}/good.yaml", "--cluster",
                               "{d}/nic16.yaml", "-o", "{o}/c.yaml"], ERR("")),
    # --- more: advise ---------------------------------------------------------------------------
    ("advise-global-batch-0", ["advise", "--global-batch", "0"], ERR("--global-batch '0'")),
    ("advise-global-batch-empty", ["advise", "--global-batch="], ERR("--global-batch ''")),
    ("advise-global-batch-inf", ["advise", "--global-batch", "1e400"], ERR("--global-batch")),
    ("advise-nodes-16385", ["advise", "--global-batch", "2048", "--nodes", "16385"],
     ERR("131072 GPUs")),
    ("advise-top-0", ["advise", "--global-batch", "2048", "--top", "0"], ERR("--top = 0")),
    ("advise-strategy-bad", ["advise", "--global-batch", "2048", "--strategies", "XYZ"],
     ERR("'XYZ'")),
    ("advise-efficiency-2", ["advise", "--global-batch", "2048", "--efficiency", "2"],
     ERR("--efficiency")),
    ("advise-no-batch", ["advise"], ERR("required")),
    # --- more: the parser ----------------------------------------------------------------------
    ("no-command", [], ERR("required")),
    ("unknown-command", ["train"], ERR("invalid choice")),
    ("unknown-flag", ["collective", "--sise", "1GB"], ERR("unrecognized")),
    ("version", ["--version"], OK()),
    ("help", ["compare", "--help"], OK()),
    # --- --precision (FP8 training) -----------------------------------------------------------
    ("precision-fp16", ["simulate", "--precision", "fp16", *A], ERR("--precision")),
    ("precision-empty", ["simulate", "--precision", "", *A], ERR("--precision")),
    ("precision-upper", ["memory", "--precision", "FP8"], ERR("--precision")),
    ("precision-fp8-a100", ["simulate", "--precision", "fp8", *A],
     ERR("--precision fp8 needs FP8 tensor cores; GPU A100-SXM4-80GB")),
    ("precision-fp8-a100-memory", ["memory", "--precision", "fp8"], ERR("A100-SXM4-80GB")),
    ("precision-fp8-a100-compare", ["compare", "--precision", "fp8", *A], ERR("FP8")),
    ("precision-fp8-h100", ["simulate", "--precision", "fp8", "--cluster", "{d}/h100.yaml", *A],
     OK()),
    ("precision-fp8-yaml", ["simulate", "--precision", "fp8", "--cluster",
                            "{d}/fp8_a100.yaml", *A], OK()),
    ("yaml-fp8-neg", ["collective", "--cluster", "{d}/fp8_neg.yaml"], ERR("peak_fp8_tflops")),
    ("yaml-fp8-str", ["collective", "--cluster", "{d}/fp8_str.yaml"], ERR("peak_fp8_tflops")),
]


@pytest.fixture(scope="module")
def d(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("fuzz")
    for name, text in FILES.items():
        (root / name).write_bytes(text if isinstance(text, bytes) else text.encode())
    (root / "dir.yaml").mkdir()
    (root / "outdir_with_csv_dir" / "results.csv").mkdir(parents=True)
    return root


class _Timeout(Exception):
    pass


def _alarm(signum, frame):
    raise _Timeout


def run_case(argv: list[str], capsys) -> tuple[int, str, str]:
    """``main(argv)`` with a wall-clock bound; (exit code, stdout, stderr)."""
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(CASE_TIMEOUT_S)
    try:
        try:
            rc = main(argv)
        except SystemExit as e:  # argparse: --help, --version, usage errors
            rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
    except _Timeout:
        pytest.fail(f"hang: {argv} ran past {CASE_TIMEOUT_S} s")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_case_table_is_large_and_unique():
    names = [c[0] for c in CASES]
    assert len(names) == len(set(names))
    assert len(CASES) >= 32 + 60  # the cases and at least 60 more


@pytest.mark.parametrize("name,argv,expect", CASES, ids=[c[0] for c in CASES])
def test_case(name, argv, expect, d, tmp_path, capsys):
    argv = [a.replace("{d}", str(d)).replace("{o}", str(tmp_path / "out")) for a in argv]
    rc, out, err = run_case(argv, capsys)
    assert "Traceback" not in err + out
    kind, needle = expect
    if kind == "ok":
        assert rc == 0, f"{name}: expected success, got rc {rc}: {err}"
        return
    assert rc == 2, f"{name}: expected exit 2 (refused), got rc {rc}; stderr {err!r}"
    lines = err.strip("\n").split("\n")
    if argv and argv[0] == "sweep" or "usage" not in err:
        assert len(lines) == 1, f"{name}: expected one line on stderr, got {err!r}"
    assert lines[-1].startswith("parosim: error:") or "parosim" in lines[-1], err
    assert needle in err, f"{name}: {needle!r} not in {err!r}"


def test_run_point_refuses_a_misspelled_key_and_defaults_to_engine():
    from parosim.simulate.point import POINT_DEFAULTS, run_point

    row = run_point({"strategy": "IIG", "micro_bach": 2, "mode": "analytic"})
    assert row["status"] == "error" and "'micro_bach'" in row["reason"]
    assert "did you mean 'micro_batch'" in row["reason"]
    assert POINT_DEFAULTS["mode"] == "engine"  # as `parosim simulate`


def test_text_outputs_state_their_settings_and_json_echoes_them(capsys):
    argv = ["--micro-batch", "2", "--accum", "3", "--seq-len", "256", "--trainable-ratio",
            "peft", "--nic-bandwidth", "200Gbps", "--mode", "analytic"]
    for cmd in ("simulate", "compare"):
        rc, out, _ = run_case([cmd, *argv], capsys)
        assert rc == 0
        assert ("micro-batch 2, accum 3, seq-len 256, global batch 192 seqs = 49152 tokens, "
                "trainable ratio 0.003 (peft), recompute auto") in out
        assert "overrides: nic-bandwidth 200Gbps" in out and "recomp" in out
        rc, out, _ = run_case([cmd, *argv, "--json"], capsys)
        s = __import__("json").loads(out)["settings"]
        assert (s["micro_batch"], s["accum_steps"], s["seq_len"]) == (2, 3, 256)
        assert s["trainable_ratio"] == 0.003 and s["overrides"] == {"nic_bandwidth": "200Gbps"}
        assert s["nic_bandwidth_Bps"] == 25e9
    run_argv = ["run", "--tokens", "1e8", "--replications", "3", *argv]
    rc, out, _ = run_case(run_argv, capsys)
    assert rc == 0 and "micro-batch 2, accum 3, seq-len 256" in out
    rc, out, _ = run_case([*run_argv, "--json"], capsys)
    s = __import__("json").loads(out)["settings"]
    assert (s["micro_batch"], s["accum_steps"], s["trainable_ratio"]) == (2, 3, 0.003)
    rc, out, _ = run_case(["memory", "--model", "llama-65b"], capsys)
    assert "llama-65b on paper-a100-roce" in out and "recomp" in out
    assert "PaRO-GGG (ZeRO-3 / FSDP)" in out


def test_compare_columns_never_run_together(capsys):
    rc, out, _ = run_case(["compare", "--nodes", "64", "--mode", "analytic"], capsys)
    assert rc == 0
    import re

    for line in out.splitlines():
        assert not re.search(r"\d\.\d{3}\d+\.\d+ GiB", line), line
        assert not re.search(r"[0-9]GiB|B[0-9]", line), line


def test_collective_size_in_the_users_prefix_family(capsys):
    rc, out, _ = run_case(["collective", "--size", "1GB", "--nodes", "2"], capsys)
    assert rc == 0 and "all-gather of 1 GB over scope global" in out
    assert "ranks per collective instance" in out and "per ring" not in out
    rc, out, _ = run_case(["collective", "--size", "1GiB", "--nodes", "2"], capsys)
    assert "all-gather of 1 GiB" in out


def test_help_has_defaults_examples_presets_and_version(capsys):
    rc, out, _ = run_case(["compare", "--help"], capsys)
    assert rc == 0
    assert "(default: 4)" in out and "examples:" in out and "paper-a100-roce" in out
    assert "dgx-h100-ib" in out and "analytic: closed form" in out
    rc, out, _ = run_case(["--version"], capsys)
    assert rc == 0 and out.startswith("parosim ")


def test_h100_gets_its_own_datasheet_values(d):
    from parosim.io import load_cluster

    spec = load_cluster(d / "h100.yaml")
    assert spec.gpu.peak_flops == 989e12 and spec.gpu.hbm_bandwidth_Bps == 3.35e12


def test_validate_without_torch_is_one_line(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` raises ImportError
    rc, _, err = run_case(["validate"], capsys)
    assert rc == 2 and err.count("\n") == 1
    assert 'pip install -e ".[validate]"' in err


def test_second_sweep_into_the_same_out_is_refused(d, tmp_path, capsys):
    from parosim.io.sweep import ResultsLog

    out = tmp_path / "o"
    out.mkdir()
    log = ResultsLog(out / "other.csv", ["point_id", "x"])  # a running sweep holds the lock
    try:
        rc, _, err = run_case(["sweep", str(d / "s_ok.yaml"), "--out", str(out)], capsys)
        assert rc == 2 and "another parosim sweep is writing" in err
    finally:
        log.release()
    rc, _, err = run_case(["sweep", str(d / "s_ok.yaml"), "--out", str(out), "--no-progress",
                           "--workers", "1"], capsys)
    assert rc == 0, err
    assert not list(out.glob("*.tmp"))


# ---------------------------------------------------------------------------------------------
# Real processes.
# ---------------------------------------------------------------------------------------------

SLOW_SWEEP = """name: slow
kind: step
mode: engine
grid:
  strategy: [GGG, NNG, NGG, NIG, IIG, IGG, ING, III]
  nodes: [16, 8]
fixed: {model: llama-65b, accum: 40}
"""


def _descendants(pid: int) -> list[int]:
    import psutil

    return [p.pid for p in psutil.Process(pid).children(recursive=True)]


def test_sweep_workers_die_with_a_killed_sweep(tmp_path):
    import psutil

    spec = tmp_path / "slow.yaml"
    spec.write_text(SLOW_SWEEP)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    p = subprocess.Popen([sys.executable, "-m", "parosim.cli", "sweep", str(spec), "--out",
                          str(tmp_path / "out"), "--workers", "2", "--no-progress"],
                         env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        kids: list[int] = []
        while time.monotonic() < deadline and len(kids) < 3:  # fork server + 2 workers
            time.sleep(0.2)
            kids = _descendants(p.pid)
        assert len(kids) >= 3, "the sweep did not start its workers"
        p.kill()
        p.wait(10)
        deadline = time.monotonic() + 10
        alive = kids
        while time.monotonic() < deadline and alive:
            time.sleep(0.2)
            alive = [k for k in kids if psutil.pid_exists(k)
                     and psutil.Process(k).status() != psutil.STATUS_ZOMBIE]
        assert not alive, f"workers outlived the killed sweep: {alive}"
    finally:
        if p.poll() is None:
            p.kill()


def test_real_process_one_line_for_a_limit():
    p = subprocess.run([sys.executable, "-m", "parosim.cli", "simulate", "--nodes",
                        "1000000000"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "131072" in p.stderr


# ---------------------------------------------------------------------------------------------
# Hypothesis: unit parsers and cluster fields never raise anything but InputError, and what
# they accept is finite and inside the documented range.
# ---------------------------------------------------------------------------------------------

_texts = st.one_of(
    st.text(max_size=12),
    st.from_regex(r"-?[0-9]{0,4}(\.[0-9]{0,3})?(e-?[0-9]{1,3})?\s?[kKMGTPE]?i?"
                  r"(B|bps|B/s|Bps|s|us|ms|ns)?", fullmatch=True),
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-10**30, max_value=10**30),
    st.booleans(),
)


@settings(max_examples=300, deadline=None)
@given(_texts)
def test_unit_parsers_total(v):
    from parosim import units

    for fn, lo, hi in ((units.parse_size, 1, units.MAX_SIZE_BYTES),
                       (units.parse_bandwidth, units.MIN_BANDWIDTH_Bps,
                        units.MAX_BANDWIDTH_Bps),
                       (units.parse_time, 0.0, units.MAX_TIME_S)):
        try:
            x = fn(v)
        except InputError:
            continue
        assert lo <= x <= hi, (fn.__name__, v, x)


_FIELDS = {
    "nodes": st.one_of(st.integers(-3, 10**7), st.text(max_size=4), st.floats()),
    "gpus_per_node": st.one_of(st.integers(-3, 10**6), st.floats()),
    "nic_bw": _texts,
    "latency": _texts,
    "per_node": st.one_of(st.integers(-2, 20), st.text(max_size=3)),
    "fabric": st.sampled_from(["single-switch", "leaf-spine", "rail", "mesh", ""]),
    "nodes_per_leaf": st.one_of(st.none(), st.integers(-2, 40), st.text(max_size=3)),
    "oversub": st.one_of(st.floats(), st.integers(-2, 10), st.text(max_size=3)),
}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.fixed_dictionaries(_FIELDS))
def test_cluster_fields_total(f):
    from parosim.io.cluster import cluster_from_dict
    from parosim.spec.system import MAX_GPUS

    net = {"fabric": f["fabric"], "oversubscription": f["oversub"]}
    if f["nodes_per_leaf"] is not None:
        net["nodes_per_leaf"] = f["nodes_per_leaf"]
    data = {"name": "h", "nodes": f["nodes"], "gpus_per_node": f["gpus_per_node"],
            "gpu": {"model": "A100-SXM4-80GB"},
            "intra_node": {"bandwidth": "2000Gbps"},
            "nic": {"per_node": f["per_node"], "bandwidth": f["nic_bw"],
                    "latency": f["latency"]},
            "network": net}
    try:
        spec = cluster_from_dict(data)
    except InputError:
        return
    assert 1 <= spec.gpus <= MAX_GPUS
    assert 1 <= spec.nic.per_node <= spec.gpus_per_node or spec.nodes == 1
    assert 0 < spec.network.oversubscription < float("inf")


_FLAG_VALUES = {
    "--nodes": st.one_of(st.integers(-2, 10**6).map(str), st.text(max_size=4)),
    "--micro-batch": st.one_of(st.integers(-2, 10**9).map(str), st.text(max_size=3)),
    "--accum": st.one_of(st.integers(-2, 10**8).map(str), st.text(max_size=3)),
    "--seq-len": st.one_of(st.integers(-2, 10**8).map(str), st.text(max_size=3)),
    "--efficiency": st.one_of(st.floats().map(repr), st.text(max_size=4)),
    "--overlap-slowdown": st.one_of(st.floats().map(repr), st.text(max_size=4)),
    "--trainable-ratio": st.one_of(st.floats().map(repr), st.sampled_from(
        ["full", "partial", "peft", "1/16", "0/0", ""])),
    "--nic-bandwidth": _texts.map(str),
    "--gpu-memory": _texts.map(str),
    "--global-batch": st.one_of(st.integers(-5, 10**7).map(str), st.text(max_size=6)),
}


@settings(max_examples=int(os.environ.get("PAROSIM_FUZZ_EXAMPLES", 150)), deadline=None,
          suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(flags=st.dictionaries(st.sampled_from(sorted(_FLAG_VALUES)), st.none(), min_size=1,
                       max_size=3).flatmap(
    lambda keys: st.fixed_dictionaries({k: _FLAG_VALUES[k] for k in keys})))
def test_random_flag_values_exit_0_or_2_and_never_raise(flags, capsys):
    """Random values of the numeric and unit flags: exit 0 (and then the JSON echoes what was
    asked for) or exit 2 with one line; nothing else, never a hang."""
    argv = ["simulate", "--mode", "analytic", "--json"]
    for k, v in flags.items():
        argv.append(f"{k}={v}")
    rc, out, err = run_case(argv, capsys)
    assert rc in (0, 2), (argv, rc, err)
    assert "Traceback" not in err
    if rc == 2:
        assert err.count("\n") == 1 and err.startswith("parosim: error:"), (argv, err)
        return
    import json

    s = json.loads(out)["settings"]
    if "--micro-batch" in flags:
        assert s["micro_batch"] == int(flags["--micro-batch"])
    if "--nodes" in flags:
        assert s["nodes"] == int(flags["--nodes"])
    assert 1 <= s["nodes"] * s["gpus_per_node"] <= 131072
    assert 0 < s["trainable_ratio"] <= 1 and 0 < s.get("compute_efficiency", 1) <= 1
    # the efficiency is echoed exactly when the flat compute model ran
    assert ("compute_efficiency" in s) == (s["compute_model"] == "flat")
