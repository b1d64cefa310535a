"""Cluster specs from YAML files or preset names (``topologies/*.yaml``).

The YAML (units as strings, converted to SI here, once)::

    name: paper-a100-roce
    gpus_per_node: 8
    nodes: 4                    # default; --nodes overrides
    gpu: {model: A100-SXM4-80GB, memory: 80GB, peak_tflops: 312, hbm_bandwidth: 2.0TB/s}
    intra_node: {fabric: nvswitch, bandwidth: 2000Gbps, latency: 2us}   # per GPU
    pcie: {bandwidth: 32GB/s, latency: 0us}                            # optional
    nic: {per_node: 1, bandwidth: 100Gbps, latency: 5us}
    network: {fabric: single-switch}   # or leaf-spine (nodes_per_leaf, oversubscription,
                                       # uplink_latency) or rail (oversubscription)
    collective: {step_latency: 0us, call_overhead: 0us, phase_overhead: 0us}  # optional
    # NCCL model (optional; docs/collectives.md): model: nccl | ideal, channels (0 = auto),
    # protocols: [ll, ll128, simple], algorithms: [ring, tree], reduction_hbm_factor, and per
    # (algorithm, protocol) ring_ll ... tree_simple: {bw_efficiency, base_latency,
    # nvlink_latency, pcie_latency, net_latency, max_bw_per_channel, max_bw (> 2 nodes; and
    # the 1- and 2-node rows max_bw_per_channel_1node/_2node, max_bw_1node/_2node)}
    compute: {overlap_slowdown: 1.189,    # optional: compute slowdown beside collectives
              model: kernel, gemm_k_half: 948, attention_efficiency: 0.327,
              hbm_efficiency: 1.0, kernel_overhead: 5us}   # optional (docs/compute.md)
    group_nodes: 1                                                     # optional
    sources: free text saying where the numbers come from

``base: PRESET`` (or a YAML path) extends another cluster: its keys, this file's merged on
top; ``sets`` (``--set KEY=VALUE``) change keys after that (:mod:`parosim.io.cluster_base`).

Heterogeneity (docs/heterogeneity.md), all optional::

    network: {fabric: leaf-spine, nodes_per_leaf: 2, spines: 2, ecmp: hash, ecmp_seed: 0}
    jitter: {distribution: lognormal, cv: 0.05}   # per compute op, per rank
    overrides:                                    # applied in order
      - {nodes: [3], nic: {bandwidth: 25Gbps}}    # also latency; intra_node; gpu; speed; memory
      - {gpus: [n2/gpu5], speed: 0.8}             # also gpu: {...}, memory
      - {links: [[n1/nic0, switch]], failed: true}   # or bandwidth / latency; names:
                                                     # parosim cluster show
      - {nodes: [4, 5], gpu: {model: H100-SXM5-80GB, peak_tflops: 989, memory: 80GB,
                              hbm_bandwidth: 3.35TB/s}}

``compute`` sets how compute is costed: ``model: flat`` (the default; FLOPs at the
training's efficiency) or ``kernel`` (:mod:`parosim.cost.kernels`, whose parameters the other keys
override: ``gemm_ceiling``, ``gemm_k_half``, ``attention_efficiency``, ``hbm_efficiency``,
``kernel_overhead``, ``sm_count``, ``source``).

``gpu.peak_fp8_tflops`` (optional): dense FP8 tensor-core TFLOP/s, used by ``--precision fp8``
(docs/compute.md, "FP8"); a known ``gpu.model`` takes it from :mod:`parosim.spec.gpus` (H100 /
H200: 1979), ``0`` (the default for other GPUs) = no FP8. In an override's ``gpu`` it is
inherited from the cluster's GPU only when the model is the same.
"""

from __future__ import annotations

import math
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..errors import InputError
from ..spec.compute import ComputeProfile
from ..spec.gpus import KNOWN_GPUS, known_gpu
from ..spec.system import (
    EP_KERNELS,
    NCCL_VERSIONS,
    ClusterSpec,
    CollectiveTuning,
    EPKernelCost,
    GPUSpec,
    IntraFabric,
    LinkSpec,
    NetworkFabric,
    NetworkSpec,
    NICSpec,
    Override,
    ProtocolCost,
    nccl_tables,
)
from ..units import parse_bandwidth, parse_flops, parse_size, parse_time
from .cluster_base import MAX_BASE_DEPTH, apply_sets, merge
from .yamlspec import check_keys, name_value, number, positive_int, read_yaml, section

_TOP = {"name", "gpus_per_node", "nodes", "gpu", "intra_node", "pcie", "nic", "network",
        "collective", "group_nodes", "sources", "notes", "compute", "overrides",
        "jitter", "calibrated_nodes"}
_INTRA_KEYS = {"fabric", "bandwidth", "latency"}
_PCIE_KEYS = {"bandwidth", "latency"}
_NIC_KEYS = {"per_node", "bandwidth", "latency"}
_NETWORK_KEYS = {"fabric", "nodes_per_leaf", "oversubscription", "uplink_latency", "spines",
                 "ecmp", "ecmp_seed"}
_JITTER_KEYS = {"distribution", "cv"}
_COMPUTE_KEYS = {"model", "gemm_ceiling", "gemm_k_half", "attention_efficiency",
                 "hbm_efficiency", "eager_attention_efficiency", "kernel_overhead",
                 "sm_count", "source", "overlap_slowdown"}


def topologies_dir() -> Path:
    """Where presets live: ``$PAROSIM_TOPOLOGIES`` or the repository's ``topologies/``."""
    env = os.environ.get("PAROSIM_TOPOLOGIES")
    return Path(env) if env else Path(__file__).resolve().parents[2] / "topologies"


def available_presets() -> list[str]:
    d = topologies_dir()
    return sorted(p.stem for p in d.glob("*.yaml")) if d.is_dir() else []


def _enum(cls, value: Any, name: str):
    try:
        return cls(value)
    except ValueError:
        raise InputError(f"{name} = {value!r} is not known; expected one of "
                         f"{', '.join(e.value for e in cls)}") from None


_GPU_KEYS = {"model", "memory", "peak_tflops", "hbm_bandwidth", "peak_fp8_tflops"}


def _fp8_flops(gpu: dict, default: float) -> float:
    """``gpu.peak_fp8_tflops``: dense FP8 TFLOP/s (or '1979TFLOPS'); 0 or none = no FP8."""
    v = gpu.get("peak_fp8_tflops", None)
    if "peak_fp8_tflops" not in gpu:
        return default
    if v is None or (isinstance(v, (int, float)) and not isinstance(v, bool) and v == 0) or (
            isinstance(v, str) and v.strip().lower() in ("none", "0")):
        return 0.0
    return parse_flops(v, "gpu.peak_fp8_tflops")


def cluster_from_dict(data: dict[str, Any], where: str = "cluster") -> ClusterSpec:
    """Build a :class:`ClusterSpec` from a parsed YAML mapping (unit strings allowed)."""
    check_keys(data, _TOP, where)
    for key in ("name", "gpus_per_node"):
        if key not in data:
            raise InputError(f"{where}: missing required key {key!r}")
    gpu = section(data, "gpu", _GPU_KEYS, where)
    intra = section(data, "intra_node", _INTRA_KEYS, where, True)
    pcie = section(data, "pcie", _PCIE_KEYS, where)
    nic = section(data, "nic", _NIC_KEYS, where)
    net = section(data, "network", _NETWORK_KEYS, where)
    jitter = section(data, "jitter", _JITTER_KEYS, where)
    if jitter.get("distribution", "lognormal") != "lognormal":
        raise InputError(f"{where}: jitter.distribution = {jitter['distribution']!r} is not "
                         "known; expected lognormal")
    coll = section(data, "collective", {"step_latency", "call_overhead", "phase_overhead",
                                          "ho_ring_max_chunks", "serial_progress", "chain_chunk",
                                          *_NCCL_KEYS},
                   where)
    comp = section(data, "compute", _COMPUTE_KEYS, where)
    if "bandwidth" not in intra:
        raise InputError(f"{where}: intra_node needs 'bandwidth' (per GPU, e.g. 2000Gbps)")
    if "bandwidth" not in nic:
        raise InputError(f"{where}: missing required section 'nic' with 'bandwidth' (per NIC, "
                         "e.g. nic: {per_node: 1, bandwidth: 100Gbps, latency: 5us})")
    for sec_name, sec, keys in (("gpu", gpu, ("memory", "hbm_bandwidth")),
                                ("intra_node", intra, ("bandwidth", "latency")),
                                ("pcie", pcie, ("bandwidth", "latency")),
                                ("nic", nic, ("bandwidth", "latency")),
                                ("network", net, ("uplink_latency",)),
                                ("collective", coll, ("step_latency", "call_overhead",
                                                      "phase_overhead"))):
        for k in keys:
            _with_unit(sec.get(k), f"{where}: {sec_name}.{k}")
    if net.get("fabric", "single-switch") != "leaf-spine" and "nodes_per_leaf" in net:
        raise InputError(f"{where}: network.nodes_per_leaf is only for a leaf-spine fabric, "
                         f"not {net.get('fabric', 'single-switch')!r}; remove it or set "
                         "fabric: leaf-spine")
    nodes = data.get("nodes", 1)
    spec = ClusterSpec(
        name=name_value(data["name"], where),
        nodes=positive_int(nodes, f"{where}: nodes"),
        gpus_per_node=positive_int(data["gpus_per_node"], f"{where}: gpus_per_node"),
        gpu=_gpu(gpu, where),
        intra_fabric=_enum(IntraFabric, intra.get("fabric", "nvswitch"), "intra_node.fabric"),
        intra=LinkSpec(parse_bandwidth(intra["bandwidth"], "intra_node.bandwidth"),
                       parse_time(intra.get("latency", 0), "intra_node.latency")),
        pcie=LinkSpec(parse_bandwidth(pcie.get("bandwidth", "32GB/s"), "pcie.bandwidth"),
                      parse_time(pcie.get("latency", 0), "pcie.latency")),
        nic=NICSpec(per_node=_nic_count(nic.get("per_node", 1)),
                    bandwidth_Bps=parse_bandwidth(nic.get("bandwidth", "100Gbps"),
                                                  "nic.bandwidth"),
                    latency_s=parse_time(nic.get("latency", "5us"), "nic.latency")),
        network=NetworkSpec(
            fabric=_enum(NetworkFabric, net.get("fabric", "single-switch"), "network.fabric"),
            nodes_per_leaf=net.get("nodes_per_leaf", 0),
            oversubscription=number(net.get("oversubscription", 1.0),
                                    "network.oversubscription"),
            uplink_latency_s=parse_time(net.get("uplink_latency", "1us"),
                                        "network.uplink_latency"),
            spines=net.get("spines", 0), ecmp=net.get("ecmp", "ideal"),
            ecmp_seed=net.get("ecmp_seed", 0)),
        collective=CollectiveTuning(
            step_latency_s=parse_time(coll.get("step_latency", 0), "collective.step_latency"),
            call_overhead_s=parse_time(coll.get("call_overhead", 0),
                                       "collective.call_overhead"),
            ho_ring_max_chunks=coll.get("ho_ring_max_chunks", 64),
            phase_overhead_s=parse_time(coll.get("phase_overhead", 0),
                                        "collective.phase_overhead"),
            serial_progress=_flag(coll.get("serial_progress", False),
                                  "collective.serial_progress"),
            chain_chunk_bytes=float(parse_size(coll.get("chain_chunk", 0),
                                               "collective.chain_chunk", allow_zero=True)),
            **_nccl_fields(coll, where), **_ep_fields(coll, where)),
        group_nodes=positive_int(data.get("group_nodes", 1), f"{where}: group_nodes"),
        notes=str(data.get("sources", data.get("notes", ""))),
        overlap_slowdown=(None if comp.get("overlap_slowdown") is None else
                          number(comp["overlap_slowdown"], "compute.overlap_slowdown")),
        compute=_compute_profile(comp, where),
        jitter_cv=number(jitter.get("cv", 0.0), "jitter.cv"),
        calibrated_nodes=_node_counts(data.get("calibrated_nodes", []),
                                      f"{where}: calibrated_nodes"),
    )
    raw = data.get("overrides", [])
    if not isinstance(raw, list):
        raise InputError(f"{where}: overrides must be a list of mappings, got {raw!r}")
    if raw:
        spec = replace(spec, overrides=tuple(_override(o, spec.gpu, f"{where}: overrides[{k}]")
                                             for k, o in enumerate(raw)))
    return spec


def _with_unit(v: Any, name: str) -> None:
    """A bandwidth, size or time in a YAML file must carry its unit (a bare 100 would be
    100 B/s); a bare 0 is allowed (zero in any unit)."""
    if isinstance(v, (int, float)) and not isinstance(v, bool) and v != 0:
        raise InputError(f"{name} = {v!r} has no unit; expected a string with one, e.g. "
                         "'100Gbps', '25GB/s', '80GB' or '5us'")


def _gpu(gpu: dict[str, Any], where: str) -> GPUSpec:
    """The ``gpu`` section: a known model fills what is left out from the datasheet table
    (:mod:`parosim.spec.gpus`); an unknown one must give memory, peak_tflops and hbm_bandwidth."""
    if "model" not in gpu:
        raise InputError(f"{where}: missing required key gpu.model (one of "
                         f"{', '.join(sorted(KNOWN_GPUS))}, or any name with memory, "
                         "peak_tflops and hbm_bandwidth)")
    model = str(gpu["model"])
    base = known_gpu(model)
    if base is None:
        missing = [k for k in ("memory", "peak_tflops", "hbm_bandwidth") if k not in gpu]
        if missing:
            raise InputError(f"{where}: gpu.model {model!r} is not in the table of known GPUs "
                             f"({', '.join(sorted(KNOWN_GPUS))}); expected it to give "
                             f"{', '.join(missing)} too")
        base = GPUSpec(model=model)
    return GPUSpec(
        model=model,
        memory_bytes=parse_size(gpu.get("memory", base.memory_bytes), "gpu.memory"),
        peak_flops=parse_flops(gpu.get("peak_tflops", base.peak_flops / 1e12)),
        hbm_bandwidth_Bps=parse_bandwidth(gpu.get("hbm_bandwidth", base.hbm_bandwidth_Bps),
                                          "gpu.hbm_bandwidth"),
        peak_fp8_flops=_fp8_flops(gpu, base.peak_fp8_flops))


_PROTO_FIELDS = ("ring_ll", "ring_ll128", "ring_simple", "tree_ll", "tree_ll128", "tree_simple")
_NCCL_KEYS = ("model", "channels", "protocols", "algorithms", "reduction_hbm_factor",
              "reduction_overlap", "net_overhead", "nccl_version", "choice",
              "tuner_intra_bandwidth", "tuner_net_bandwidth", *_PROTO_FIELDS, *EP_KERNELS)
_EP_KEYS = {"nvlink_efficiency", "rdma_efficiency", "latency"}
_PROTO_KEYS = {"bw_efficiency", "base_latency", "nvlink_latency", "pcie_latency", "net_latency",
               "max_bw_per_channel", "max_bw", "max_bw_per_channel_1node",
               "max_bw_per_channel_2node", "max_bw_1node", "max_bw_2node"}


def _cap(v: Any, name: str) -> float:
    if isinstance(v, str) and v.strip().lower() in ("inf", "none", "unlimited"):
        return math.inf
    if isinstance(v, float) and math.isinf(v):
        return v
    return parse_bandwidth(v, name)


def _names(v: Any, name: str) -> tuple[str, ...]:
    if isinstance(v, str):
        v = [x for x in v.replace(" ", "").split(",") if x]
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise InputError(f"{name} = {v!r} must be a list of names")
    return tuple(x.strip().lower() for x in v)


def _nccl_fields(coll: dict[str, Any], where: str) -> dict[str, Any]:
    """The NCCL-model fields of ``collective`` (docs/collectives.md); absent ones keep the
    :class:`CollectiveTuning` defaults (NCCL 2.20.3 tuning.cc)."""
    out: dict[str, Any] = {}
    version = _nccl_version(coll.get("nccl_version", "2.20"))
    tables = nccl_tables(version)
    if version != "2.20":
        out["nccl_version"] = version
        out.update(tables)  # the profile's tables; the keys below override them
    if "choice" in coll:
        out["choice"] = str(coll["choice"]).strip().lower()
    for key in ("tuner_intra_bandwidth", "tuner_net_bandwidth"):
        if key in coll:
            out[f"{key}_Bps"] = parse_bandwidth(coll[key], f"collective.{key}")
    if "model" in coll:
        out["model"] = str(coll["model"]).strip().lower()
    if "channels" in coll:
        ch = coll["channels"]
        if isinstance(ch, bool) or not isinstance(ch, int):
            raise InputError(f"collective.channels = {ch!r} must be an integer (0 = auto)")
        out["channels"] = ch
    for key in ("protocols", "algorithms"):
        if key in coll:
            out[key] = _names(coll[key], f"collective.{key}")
    if "reduction_hbm_factor" in coll:
        out["reduction_hbm_factor"] = number(coll["reduction_hbm_factor"],
                                             "collective.reduction_hbm_factor")
    if "net_overhead" in coll:
        out["net_overhead_s"] = parse_time(coll["net_overhead"], "collective.net_overhead")
    if "reduction_overlap" in coll:
        out["reduction_overlap"] = _flag(coll["reduction_overlap"],
                                         "collective.reduction_overlap")
    for key in _PROTO_FIELDS:
        sub = section(coll, key, _PROTO_KEYS, f"{where}: collective")
        if not sub:
            continue
        d = tables[key]
        n = f"collective.{key}"
        out[key] = ProtocolCost(
            bw_efficiency=number(sub.get("bw_efficiency", d.bw_efficiency),
                                 f"{n}.bw_efficiency"),
            base_latency_s=parse_time(sub.get("base_latency", d.base_latency_s),
                                      f"{n}.base_latency"),
            nvlink_latency_s=parse_time(sub.get("nvlink_latency", d.nvlink_latency_s),
                                        f"{n}.nvlink_latency"),
            pcie_latency_s=parse_time(sub.get("pcie_latency", d.pcie_latency_s),
                                      f"{n}.pcie_latency"),
            net_latency_s=parse_time(sub.get("net_latency", d.net_latency_s),
                                     f"{n}.net_latency"),
            max_bw_per_channel_Bps=_cap(sub.get("max_bw_per_channel",
                                                d.max_bw_per_channel_Bps),
                                        f"{n}.max_bw_per_channel"),
            max_bw_Bps=_cap(sub.get("max_bw", d.max_bw_Bps), f"{n}.max_bw"),
            **{f"{k}_Bps": _cap(sub.get(k, getattr(d, f"{k}_Bps")), f"{n}.{k}")
               for k in ("max_bw_per_channel_1node", "max_bw_per_channel_2node",
                         "max_bw_1node", "max_bw_2node")})
    return out


def _ep_fields(coll: dict[str, Any], where: str) -> dict[str, Any]:
    """The expert-parallel kernel sections of ``collective`` (``ep_normal``, ``ep_ll``:
    :class:`EPKernelCost`); absent keys keep the defaults."""
    out: dict[str, Any] = {}
    for key in EP_KERNELS:
        sub = section(coll, key, _EP_KEYS, f"{where}: collective")
        if not sub:
            continue
        d = getattr(CollectiveTuning(), key)
        n = f"collective.{key}"
        eff = {k: number(sub.get(k, getattr(d, k)), f"{n}.{k}")
               for k in ("nvlink_efficiency", "rdma_efficiency")}
        for k, v in eff.items():
            if not 0 < v <= 1:
                raise InputError(f"{where}: {n}.{k} = {v!r} must be in (0, 1]")
        out[key] = EPKernelCost(**eff, latency_s=parse_time(sub.get("latency", d.latency_s),
                                                            f"{n}.latency"))
    return out


def _ep_yaml(c: CollectiveTuning) -> dict[str, Any]:
    """The EP kernel sections that differ from the defaults (none: nothing written)."""
    return {key: {"nvlink_efficiency": p.nvlink_efficiency,
                  "rdma_efficiency": p.rdma_efficiency, "latency": f"{p.latency_s!r}s"}
            for key in EP_KERNELS if (p := getattr(c, key)) != EPKernelCost()}
def _nccl_version(v: Any) -> str:
    """``collective.nccl_version``: a release ("2.8", "2.8.4", "2.20.3") -> its tuner profile
    (:data:`~parosim.spec.system.NCCL_VERSIONS`)."""
    text = str(v).strip()
    parts = text.split(".")
    mm = ".".join(parts[:2]) if len(parts) >= 2 else text
    if isinstance(v, str) and mm in NCCL_VERSIONS:
        return mm
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        # unquoted, YAML reads 2.8 as the number 2.8 and 2.20 as 2.2 (no NCCL 2.2 profile)
        text = {"2.2": "2.20"}.get(text, text)
        if text in NCCL_VERSIONS:
            return text
    raise InputError(f"collective.nccl_version = {v!r} is not a known tuner profile; expected "
                     f"one of {', '.join(NCCL_VERSIONS)} (a release such as '2.8.4' selects "
                     "its series)")


def _compute_profile(comp: dict[str, Any], where: str) -> ComputeProfile:
    """The ``compute`` section (unknown keys were refused by :func:`section`)."""
    kw: dict[str, Any] = {}
    if "model" in comp:
        kw["model"] = str(comp["model"]).strip().lower()
        kw["model_given"] = True
    for k in ("gemm_ceiling", "gemm_k_half", "attention_efficiency", "hbm_efficiency",
              "eager_attention_efficiency"):
        if k in comp:
            kw[k] = number(comp[k], f"{where}: compute.{k}")
    if "kernel_overhead" in comp:
        kw["kernel_overhead_s"] = parse_time(comp["kernel_overhead"], "compute.kernel_overhead")
    if "sm_count" in comp:
        kw["sm_count"] = positive_int(comp["sm_count"], "compute.sm_count")
    if "source" in comp:
        kw["source"] = str(comp["source"])
    return ComputeProfile(**kw)


_OVERRIDE_KEYS = {"nodes": {"nic", "intra_node", "gpu", "speed", "memory"},
                  "gpus": {"gpu", "speed", "memory"},
                  "links": {"bandwidth", "latency", "failed"}}


def _override(o: Any, base_gpu: GPUSpec, where: str) -> Override:
    """One ``overrides:`` entry (YAML names, unit strings) -> :class:`Override`."""
    if not isinstance(o, dict):
        raise InputError(f"{where} must be a mapping like {{nodes: [3], nic: {{bandwidth: "
                         f"25Gbps}}}}, got {o!r}")
    sel = [k for k in _OVERRIDE_KEYS if k in o]
    if len(sel) != 1:
        raise InputError(f"{where} selects {' and '.join(sel) or 'nothing'}; expected exactly "
                         "one of nodes, gpus or links")
    kind = sel[0]
    check_keys(o, {kind} | _OVERRIDE_KEYS[kind], where)
    what = o[kind]
    if not isinstance(what, list) or not what:
        raise InputError(f"{where}: {kind} must be a non-empty list, got {what!r}")
    kw: dict[str, Any] = {}
    if kind == "nodes":
        for i in what:
            if isinstance(i, bool) or not isinstance(i, int) or i < 0:
                raise InputError(f"{where}: node {i!r} must be a non-negative integer index")
        kw["nodes"] = tuple(what)
    elif kind == "gpus":
        kw["gpus"] = tuple(str(x) for x in what)
    else:
        pairs = []
        for pr in what:
            if not (isinstance(pr, list) and len(pr) == 2):
                raise InputError(f"{where}: link {pr!r} must be a pair [a, b] of graph node "
                                 "names, e.g. [n1/nic0, switch]")
            pairs.append((str(pr[0]), str(pr[1])))
        kw["links"] = tuple(pairs)
    def unit(v: Any, name: str) -> Any:   # a bare number is refused, as at the top level
        _with_unit(v, f"{where}.{name}")
        return v

    for key, prefix in (("nic", "nic"), ("intra_node", "intra")):
        if key in o:
            sub = section(o, key, {"bandwidth", "latency"}, where)
            if "bandwidth" in sub:
                kw[f"{prefix}_bandwidth_Bps"] = _positive_bw(
                    unit(sub["bandwidth"], f"{key}.bandwidth"), f"{where}.{key}.bandwidth")
            if "latency" in sub:
                kw[f"{prefix}_latency_s"] = parse_time(unit(sub["latency"], f"{key}.latency"),
                                                       f"{where}.{key}.latency")
    if "gpu" in o:

        g = section(o, "gpu", _GPU_KEYS, where)
        model = str(g.get("model", base_gpu.model))
        ref = base_gpu
        if model != base_gpu.model:   # another GPU type: its datasheet, never the base's
            ref = known_gpu(model)
            missing = [k for k in ("memory", "peak_tflops", "hbm_bandwidth") if k not in g]
            if ref is None and missing:
                raise InputError(f"{where}.gpu.model {model!r} is not in the table of known "
                                 f"GPUs ({', '.join(sorted(KNOWN_GPUS))}); expected it to "
                                 f"give {', '.join(missing)} too")
            ref = ref or GPUSpec(model=model)
        kw["gpu"] = GPUSpec(
            model=model,
            memory_bytes=parse_size(unit(g["memory"], "gpu.memory"), f"{where}.gpu.memory")
            if "memory" in g else ref.memory_bytes,
            peak_flops=parse_flops(g["peak_tflops"], f"{where}.gpu.peak_tflops")
            if "peak_tflops" in g
            else ref.peak_flops,
            hbm_bandwidth_Bps=parse_bandwidth(unit(g["hbm_bandwidth"], "gpu.hbm_bandwidth"),
                                              f"{where}.gpu.hbm_bandwidth")
            if "hbm_bandwidth" in g else ref.hbm_bandwidth_Bps,
            peak_fp8_flops=_fp8_flops(g, _override_fp8_default(g, base_gpu)))
    if "speed" in o:
        kw["speed"] = number(o["speed"], f"{where}: speed")
    if "memory" in o:
        kw["memory_bytes"] = parse_size(unit(o["memory"], "memory"), f"{where}.memory")
    if "bandwidth" in o:
        kw["bandwidth_Bps"] = _positive_bw(unit(o["bandwidth"], "bandwidth"),
                                           f"{where}.bandwidth")
    if "latency" in o:
        kw["latency_s"] = parse_time(unit(o["latency"], "latency"), f"{where}.latency")
    if "failed" in o:
        kw["failed"] = _flag(o["failed"], f"{where}.failed")
    try:
        return Override(**kw)
    except InputError as e:
        raise InputError(f"{where}: {e}") from None


def _positive_bw(v: Any, name: str) -> float:
    """An override's bandwidth: parsed, and > 0 (a dead link is ``failed: true``)."""
    bw = parse_bandwidth(v, name)
    if not bw > 0:
        raise InputError(f"{name} = {v!r} must be positive; expected e.g. 25Gbps (a link that "
                         "carries nothing is 'failed: true')")
    return bw


def _flag(v: Any, name: str) -> bool:
    if not isinstance(v, bool):
        raise InputError(f"{name} = {v!r} must be true or false")
    return v


def _nic_count(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise InputError(f"nic.per_node = {v!r} must be a non-negative integer")
    return v


def _nccl_yaml(c: CollectiveTuning) -> dict[str, Any]:
    def bw(v: float) -> str:
        return "inf" if math.isinf(v) else f"{v!r}B/s"

    out: dict[str, Any] = {"model": c.model, "channels": c.channels,
                           "protocols": list(c.protocols), "algorithms": list(c.algorithms),
                           "reduction_hbm_factor": c.reduction_hbm_factor,
                           "reduction_overlap": c.reduction_overlap,
                           "net_overhead": f"{c.net_overhead_s!r}s",
                           **({"nccl_version": c.nccl_version}
                              if c.nccl_version != "2.20" else {}),
                           **({"choice": c.choice} if c.choice != "fastest" else {}),
                           **{k: bw(getattr(c, f"{k}_Bps"))
                              for k in ("tuner_intra_bandwidth", "tuner_net_bandwidth")
                              if getattr(c, f"{k}_Bps")}}
    for key in _PROTO_FIELDS:
        p = c.protocol(*key.split("_"))
        out[key] = {"bw_efficiency": p.bw_efficiency,
                    "base_latency": f"{p.base_latency_s!r}s",
                    "nvlink_latency": f"{p.nvlink_latency_s!r}s",
                    "pcie_latency": f"{p.pcie_latency_s!r}s",
                    "net_latency": f"{p.net_latency_s!r}s",
                    "max_bw_per_channel": bw(p.max_bw_per_channel_Bps),
                    "max_bw": bw(p.max_bw_Bps),
                    **{k: bw(getattr(p, f"{k}_Bps"))
                       for k in ("max_bw_per_channel_1node", "max_bw_per_channel_2node",
                                 "max_bw_1node", "max_bw_2node")}}
    return out


def cluster_file(name_or_path: str | Path) -> Path:
    """The file :func:`load_cluster` reads for ``name_or_path``: the path itself (a ``.yaml``
    name or an existing file), else the preset ``topologies_dir() / NAME.yaml`` (which may
    not exist). Sweeps key their points on its contents (:mod:`parosim.io.sweep`)."""
    text = str(name_or_path)
    path = Path(text)
    if not (text.endswith((".yaml", ".yml")) or path.exists()):
        path = topologies_dir() / f"{text}.yaml"
    return path


def cluster_schema() -> dict[str, Any]:
    """The cluster YAML's keys (a section maps to its keys, a value to None): what ``--set``
    accepts (:mod:`parosim.io.cluster_base`)."""
    leaf = dict.fromkeys
    coll: dict[str, Any] = leaf(("step_latency", "call_overhead", "phase_overhead",
                                 "ho_ring_max_chunks", "serial_progress", *_NCCL_KEYS))
    coll.update({k: leaf(_PROTO_KEYS) for k in _PROTO_FIELDS})
    coll.update({k: leaf(_EP_KEYS) for k in EP_KERNELS})
    return {**leaf(_TOP), "gpu": leaf(_GPU_KEYS), "intra_node": leaf(_INTRA_KEYS),
            "pcie": leaf(_PCIE_KEYS), "nic": leaf(_NIC_KEYS), "network": leaf(_NETWORK_KEYS),
            "jitter": leaf(_JITTER_KEYS), "compute": leaf(_COMPUTE_KEYS), "collective": coll}


def cluster_data(name_or_path: str | Path, sets: tuple[str, ...] | list[str] = ()
                 ) -> tuple[dict[str, Any], list[Path]]:
    """The mapping a cluster is built from: the file's keys over its ``base:`` chain, then
    every ``--set`` item (the merge rule: :mod:`parosim.io.cluster_base`), and the files read
    (the file first, then its bases). Sweeps key their points on these contents."""
    path = cluster_file(name_or_path)
    files: list[Path] = []
    data = _with_bases(path, files)
    if sets:
        data = apply_sets(data, tuple(sets), cluster_schema())
    return data, files


def _with_bases(path: Path, files: list[Path]) -> dict[str, Any]:
    """The file's mapping merged over its ``base:`` (recursively); ``files`` collects the
    files read."""
    if len(files) >= MAX_BASE_DEPTH:
        chain = " -> ".join(str(f) for f in files)
        raise InputError(f"cluster {str(files[0])!r}: base chain {chain} -> {str(path)} is "
                         f"longer than {MAX_BASE_DEPTH} files (a cycle?); expected a base "
                         "that does not extend itself")
    if path.resolve() in {f.resolve() for f in files}:
        raise InputError(f"cluster {str(files[-1])!r}: base {str(path)!r} extends itself "
                         "(a cycle); expected a base chain that ends in a file without base")
    where = f"cluster {str(files[-1])!r}" if files else "cluster"
    if not path.exists() and files:
        raise InputError(f"{where}: base {path.stem!r} is neither a preset nor a YAML file; "
                         f"expected a YAML path or one of "
                         f"{', '.join(available_presets()) or '(none found)'}")
    files.append(path)
    data = read_yaml(path, "cluster")
    if "base" not in data:
        return data
    base = data["base"]
    if not isinstance(base, str) or not base.strip():
        raise InputError(f"cluster {str(path)!r}: base = {base!r} must name a preset or a "
                         "YAML path, e.g. base: dgx-h100-ib")
    bpath = cluster_file(base)
    if base.endswith((".yaml", ".yml")) and not Path(base).is_absolute():
        bpath = path.parent / base   # a relative base is relative to the file that names it
    own = {k: v for k, v in data.items() if k != "base"}
    return merge(_with_bases(bpath, files), own)


def load_cluster(name_or_path: str | Path, nodes: int | None = None,
                 group_nodes: int | None = None,
                 sets: tuple[str, ...] | list[str] = ()) -> ClusterSpec:
    """A preset name (``paper-a100-roce``) or a YAML path, optionally resized.

    The YAML may extend a preset (``base: NAME``) and ``sets`` (``--set KEY=VALUE`` items)
    change keys on top (:mod:`parosim.io.cluster_base`). ``nodes`` and ``group_nodes``
    (``--nodes``, ``--group-nodes``) size the cluster before anything is checked against the
    node count, so an override of node 5 holds on a 4-node preset resized to 16.

    >>> load_cluster("paper-a100-roce", nodes=16).gpus
    128
    >>> load_cluster("dgx-h100-ib", sets=["nic.bandwidth=100Gbps"]).nic.bandwidth_Bps
    12500000000.0
    """
    text = str(name_or_path)
    if not text.strip():
        raise InputError(f"--cluster is empty; expected a YAML path or one of "
                         f"{', '.join(available_presets()) or '(none found)'}")
    path = cluster_file(text)
    if not path.exists() and not (text.endswith((".yaml", ".yml"))):
        raise InputError(f"unknown cluster preset {text!r}; expected a YAML path or one of "
                         f"{', '.join(available_presets()) or '(none found)'}")
    data, _ = cluster_data(text, sets)
    if nodes is not None:
        data["nodes"] = positive_int(nodes, "--nodes")
    if group_nodes is not None:
        data["group_nodes"] = positive_int(group_nodes, "--group-nodes")
    where = f"cluster {str(path)!r}" + (" with --set " + " ".join(sets) if sets else "")
    return cluster_from_dict(data, where=where)


def _override_fp8_default(g: dict, base_gpu: GPUSpec) -> float:
    """An override's FP8 peak when it gives none: the base GPU's if the model is the same;
    for another model, the known-GPU table's (0 if unknown): an FP8 figure is never carried
    over to a different GPU."""

    model = str(g.get("model", base_gpu.model))
    if model == base_gpu.model:
        return base_gpu.peak_fp8_flops
    known = known_gpu(model)
    return known.peak_fp8_flops if known is not None else 0.0


def _node_counts(raw, where: str) -> tuple[int, ...]:
    """``calibrated_nodes``: a node count or a list of them, sorted and without repeats."""
    values = raw if isinstance(raw, list) else [raw]
    out = set()
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise InputError(f"{where} = {raw!r}: expected node counts (positive integers), "
                             "e.g. [1, 2, 4]")
        out.add(v)
    return tuple(sorted(out))


def cluster_to_yaml(spec: ClusterSpec) -> str:
    """Serialise a spec back to the YAML format (SI numbers with explicit units)."""
    data = {
        "name": spec.name, "gpus_per_node": spec.gpus_per_node, "nodes": spec.nodes,
        "gpu": {"model": spec.gpu.model, "memory": f"{spec.gpu.memory_bytes}B",
                "peak_tflops": spec.gpu.peak_flops / 1e12,
                "hbm_bandwidth": f"{spec.gpu.hbm_bandwidth_Bps!r}B/s",
                **({"peak_fp8_tflops": spec.gpu.peak_fp8_flops / 1e12}
                   if spec.gpu.peak_fp8_flops else {})},
        "intra_node": {"fabric": spec.intra_fabric.value,
                       "bandwidth": f"{spec.intra.bandwidth_Bps!r}B/s",
                       "latency": f"{spec.intra.latency_s!r}s"},
        "pcie": {"bandwidth": f"{spec.pcie.bandwidth_Bps!r}B/s",
                 "latency": f"{spec.pcie.latency_s!r}s"},
        "nic": {"per_node": spec.nic.per_node, "bandwidth": f"{spec.nic.bandwidth_Bps!r}B/s",
                "latency": f"{spec.nic.latency_s!r}s"},
        "network": {"fabric": spec.network.fabric.value,
                    "oversubscription": spec.network.oversubscription,
                    "uplink_latency": f"{spec.network.uplink_latency_s!r}s"},
        "collective": {"step_latency": f"{spec.collective.step_latency_s!r}s",
                       "call_overhead": f"{spec.collective.call_overhead_s!r}s",
                       "phase_overhead": f"{spec.collective.phase_overhead_s!r}s",
                       "serial_progress": spec.collective.serial_progress,
                       "ho_ring_max_chunks": spec.collective.ho_ring_max_chunks,
                       **({"chain_chunk": f"{int(spec.collective.chain_chunk_bytes)}B"}
                          if spec.collective.chain_chunk_bytes else {}),
                       **_nccl_yaml(spec.collective), **_ep_yaml(spec.collective)},
        "group_nodes": spec.group_nodes,
        "sources": spec.notes,
    }
    if spec.calibrated_nodes:
        data["calibrated_nodes"] = list(spec.calibrated_nodes)
    if spec.compute != ComputeProfile():
        c = spec.compute
        data["compute"] = {"model": c.model, "gemm_ceiling": c.gemm_ceiling,
                           "gemm_k_half": c.gemm_k_half,
                           "attention_efficiency": c.attention_efficiency,
                           "eager_attention_efficiency": c.eager_attention_efficiency,
                           "hbm_efficiency": c.hbm_efficiency,
                           "kernel_overhead": f"{c.kernel_overhead_s!r}s", "source": c.source}
        if c.sm_count:
            data["compute"]["sm_count"] = c.sm_count
        if c.model == "flat" and not c.model_given:   # unset: the fidelity's (as read)
            del data["compute"]["model"]
    if spec.overlap_slowdown is not None:
        data.setdefault("compute", {})["overlap_slowdown"] = spec.overlap_slowdown
    if spec.network.fabric is NetworkFabric.LEAF_SPINE:
        data["network"]["nodes_per_leaf"] = spec.network.nodes_per_leaf
        if spec.network.spines:
            data["network"].update(spines=spec.network.spines, ecmp=spec.network.ecmp,
                                   ecmp_seed=spec.network.ecmp_seed)
    if spec.jitter_cv:
        data["jitter"] = {"distribution": "lognormal", "cv": spec.jitter_cv}
    if spec.overrides:
        data["overrides"] = [_override_to_dict(o) for o in spec.overrides]
    import yaml  # deferred: PyYAML is imported only when a spec is written (start-up)

    return yaml.safe_dump(data, sort_keys=False)


def _override_to_dict(o: Override) -> dict:
    d: dict[str, Any] = {}
    if o.nodes:
        d["nodes"] = list(o.nodes)
    if o.gpus:
        d["gpus"] = list(o.gpus)
    if o.links:
        d["links"] = [list(p) for p in o.links]
    for key, prefix in (("nic", "nic"), ("intra_node", "intra")):
        sub = {}
        if getattr(o, f"{prefix}_bandwidth_Bps") is not None:
            sub["bandwidth"] = f"{getattr(o, f'{prefix}_bandwidth_Bps')!r}B/s"
        if getattr(o, f"{prefix}_latency_s") is not None:
            sub["latency"] = f"{getattr(o, f'{prefix}_latency_s')!r}s"
        if sub:
            d[key] = sub
    if o.gpu is not None:
        d["gpu"] = {"model": o.gpu.model, "memory": f"{o.gpu.memory_bytes}B",
                    "peak_tflops": o.gpu.peak_flops / 1e12,
                    "hbm_bandwidth": f"{o.gpu.hbm_bandwidth_Bps!r}B/s",
                    "peak_fp8_tflops": o.gpu.peak_fp8_flops / 1e12}
    if o.speed is not None:
        d["speed"] = o.speed
    if o.memory_bytes is not None:
        d["memory"] = f"{o.memory_bytes}B"
    if o.bandwidth_Bps is not None:
        d["bandwidth"] = f"{o.bandwidth_Bps!r}B/s"
    if o.latency_s is not None:
        d["latency"] = f"{o.latency_s!r}s"
    if o.failed:
        d["failed"] = True
    return d
