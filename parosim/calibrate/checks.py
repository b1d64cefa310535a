"""Checks of a ``calibrate --nccl-tests`` fit against its base cluster: does the log come
from hardware like the base, and is the fitted cluster plausible? (docs/calibration.md,
"Warnings").

A least-squares fit always returns numbers: fitted onto a base with other GPUs, another NIC
count or other links, it moves whatever parameters it may until the curve matches, and the
result predicts other layouts wrongly. Each check below returns a :class:`Warning` with what
it found and what it means; :func:`check_fit` runs them all. What the log says about its
hardware comes from its header (``# Rank 0 ... device 0 [..] NVIDIA H100 80GB HBM3``: the
GPU; the hosts: nodes and ranks per node) and from parosim's metadata line
``# parosim: hardware = 2 x AWS p4de.24xlarge (8 x NVIDIA A100 80GB; EFA 4 x 100 Gbps per
instance)`` (GPUs per node, NIC count and line rate).

>>> gpu_family("NVIDIA H100 80GB HBM3"), gpu_family("A100-SXM4-80GB"), gpu_family("x")
('H100', 'A100', None)
>>> nics_stated("2 x AWS p4de.24xlarge (8 x NVIDIA A100 80GB; EFA 4 x 100 Gbps per instance)")
(4, 100000000000.0, 400000000000.0)
>>> nics_stated("2 x AWS p5.48xlarge (EFA v2 32 interfaces, 3200 Gbps per instance)")
(32, None, 3200000000000.0)
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

from ..spec.system import NCCL_VERSIONS, ClusterSpec
from .scale import SE_FACTOR, se_span

#: worst |error| (%) above which a fit is called poor
POOR_FIT_PCT = 25.0
#: a fitted link bandwidth this many times above or below the base's is implausible
FAR_FROM_BASE = 2.0
#: NVLink bandwidth per GPU and direction (B/s), by GPU family: the line rate an intra-node
#: fit cannot exceed. NVIDIA datasheets: V100 NVLink2 300 GB/s, A100 NVLink3 600 GB/s,
#: H100 / H200 NVLink4 900 GB/s, B200 NVLink5 1.8 TB/s (both directions together).
NVLINK_BPS = {"V100": 150e9, "A100": 300e9, "H100": 450e9, "H200": 450e9, "B200": 900e9}
#: what a measurement may exceed a stated line rate by before it is called impossible
LINE_RATE_SLACK = 1.05

_FAMILY = re.compile(r"(?<![A-Z0-9])(GH200|GB200|[ABHLV]\d{2,3}S?|MI\d{3}X?)(?![0-9])", re.I)


@dataclass(frozen=True)
class Warning:   # noqa: A001  (a calibration warning, not Python's builtin)
    """One finding: ``kind`` (gpu, ranks_per_node, nic_count, nccl_version, poor_fit,
    not_identified, poorly_identified, one_node, far_from_base, above_line_rate),
    ``message`` (what was found)
    and ``meaning`` (what it implies for the calibrated cluster)."""

    kind: str
    message: str
    meaning: str

    def to_dict(self) -> dict:
        return asdict(self)


def gpu_family(name: str | None) -> str | None:
    """``A100``, ``H100``, ... from a device or model name; None when none is named."""
    m = _FAMILY.search(name or "")
    return m.group(1).upper() if m else None


def nics_stated(hardware: str | None) -> tuple[int | None, float | None, float | None]:
    """(NICs per node, line rate per NIC in bit/s, per node in bit/s) as the log's hardware
    metadata states them; None where it does not."""
    text = hardware or ""
    count = per = total = None
    m = re.search(r"(\d+)\s*x\s*(\d+(?:\.\d+)?)\s*G(?:b/s|bps)", text, re.I)
    if m:
        count, per = int(m.group(1)), float(m.group(2)) * 1e9
        total = count * per
    m = re.search(r"(\d+)\s*(?:interfaces|NICs|HCAs|rails)\b", text, re.I)
    if m and count is None:
        count = int(m.group(1))
    m = re.search(r"(\d+(?:\.\d+)?)\s*G(?:b/s|bps)\s*per\s*(?:instance|node|host)", text, re.I)
    if m and per is None:
        total = float(m.group(1)) * 1e9
    return count, per, total


def tuner_profile(release: str) -> str:
    """The tuner profile (``collective.nccl_version``) of an NCCL release: its own series
    where parosim has one, else the default 2.20 (the nearest tables parosim has).

    >>> tuner_profile("2.8.4"), tuner_profile("2.18.5")
    ('2.8', '2.20')
    """
    series = ".".join(release.split(".")[:2])
    return series if series in NCCL_VERSIONS else "2.20"


def gpus_per_node_stated(hardware: str | None) -> int | None:
    """``8`` from ``(8 x NVIDIA A100 80GB`` in the hardware metadata."""
    m = re.search(r"(\d+)\s*x\s*(?:NVIDIA\s+)?(?:Tesla\s+)?(?:GH200|GB200|[ABHLV]\d{2,3})",
                  hardware or "", re.I)
    return int(m.group(1)) if m else None


def check_hardware(base: ClusterSpec, log, nodes: int | None = None) -> list[Warning]:
    """The log against the base: GPU model, ranks per node, NIC count."""
    out: list[Warning] = []
    hw = log.meta.get("hardware")
    name = f"{log.path}"
    logged = [gpu_family(d) for d in log.devices] or [gpu_family(hw)]
    fams = {f for f in logged if f}
    base_fam = gpu_family(base.gpu.model)
    if fams and base_fam and base_fam not in fams:
        out.append(Warning(
            "gpu", f"{name} ran on {', '.join(sorted(fams))} GPUs; the base cluster "
            f"{base.name!r} has {base.gpu.model}",
            "the fitted links stand in for another machine's (NVLink generation, NICs, "
            "PCIe); expected a base with the log's GPUs"))
    stated = gpus_per_node_stated(hw)
    if stated and stated != base.gpus_per_node:
        out.append(Warning(
            "ranks_per_node", f"{name} states {stated} GPUs per node; the base cluster "
            f"{base.name!r} has {base.gpus_per_node}",
            "ranks were placed on nodes the way the base has them, so intra- and inter-node "
            "traffic are split wrongly and fitted into the wrong links"))
    elif log.gpus_per_node is None and nodes is None and stated is None:
        out.append(Warning(
            "ranks_per_node", f"{name} states neither its node count nor its GPUs per node; "
            f"assumed the base's {base.gpus_per_node} GPUs per node "
            f"({log.nranks} ranks = {log.nranks // base.gpus_per_node} nodes)",
            "if the run had another layout, intra- and inter-node traffic are split wrongly; "
            "give --nodes"))
    if log.nccl_release and base.collective.model == "nccl":
        profile = tuner_profile(log.nccl_release)
        if profile != base.collective.nccl_version:
            out.append(Warning(
                "nccl_version", f"{name} ran NCCL {log.nccl_release} (tuner profile "
                f"{profile}); the base cluster {base.name!r} has collective.nccl_version "
                f"{base.collective.nccl_version}",
                "the protocol costs and the algorithm / protocol switch points are another "
                f"release's; set collective.nccl_version: '{profile}' in the base"))
    count, per, total = nics_stated(hw)
    base_total = base.nic.per_node * base.nic.bandwidth_Bps * 8
    # 32 EFA interfaces at 3200 Gbps are a base's 8 x 400 Gbps: another count at the same
    # per-node rate (within the factor a fit may move a link, FAR_FROM_BASE) is a match
    if count is not None and count != base.nic.per_node and (
            total is None or not 1 / FAR_FROM_BASE <= total / base_total <= FAR_FROM_BASE):
        rate = f", {total / 1e9:.0f} Gbps per node" if total else ""
        out.append(Warning(
            "nic_count", f"{name} states {count} NICs per node{rate}; the base cluster "
            f"{base.name!r} has {base.nic.per_node} x {base.nic.bandwidth_Bps * 8 / 1e9:.0f} "
            f"Gbps = {base_total / 1e9:.0f} Gbps",
            "the fit spreads the measured inter-node traffic over the base's NICs, so the "
            "fitted per-NIC bandwidth (or, where it cannot move, NVLink) absorbs the "
            "difference; expected a base with the log's NICs"))
    return out


def check_fit(base: ClusterSpec, logs: list, fit, fit_stats: dict, held_stats: dict,
              nodes: int | None = None) -> list[Warning]:
    """Every check: the hardware of each log (:func:`check_hardware`), then the fit's error,
    the parameters it did not identify and fitted values far from the base or beyond the
    line rate. ``fit``: a :class:`parosim.calibrate.links.Fit`; ``fit_stats`` /
    ``held_stats``: its |error| statistics (``max_abs_error_pct``)."""
    out: list[Warning] = []
    for lg in logs:
        out += check_hardware(base, lg, nodes)
    for what, st in (("fit", fit_stats), ("held-out", held_stats)):
        worst = st.get("max_abs_error_pct")
        if worst is not None and worst > POOR_FIT_PCT:
            out.append(Warning(
                "poor_fit", f"{what} worst |error| {worst:.0f} % (> {POOR_FIT_PCT:.0f} %)",
                "the base's topology and collective model cannot reproduce these "
                "measurements; the fitted values are not the hardware's and predictions "
                "from them are unreliable"))
    multi = any(lg.nodes is None or lg.nodes > 1 for lg in logs) if nodes is None else nodes > 1
    key = "nic.bandwidth" if multi else "intra_node.bandwidth"
    if key in fit.values and not fit.identified.get(key, True):
        out.append(Warning(
            "not_identified", f"{key} was not identified by the logs (it stays "
            f"{fit.values[key] / 1e9:.1f} GB/s)",
            f"{'an inter-node' if multi else 'a one-node'} collective is bound by this link; "
            "if the fit could not move it, another parameter carries the measured time and "
            "the base's links do not match the log's hardware"))
    se = (getattr(fit, "standard_errors", None) or {}).get(key)
    if se and fit.identified.get(key, False) and getattr(fit, "dof", 0) > 0 and \
            (se["factor"] is None or se["factor"] > SE_FACTOR):
        out.append(Warning(
            "poorly_identified", f"{key} fitted at {fit.values[key] / 1e9:.3g} GB/s, but one "
            f"standard error {se_span(key, se)} (more than x{SE_FACTOR:g} either side)",
            "the logs barely move the link that bounds their collectives: other parameters "
            "trade off against it, so its value is not the hardware's"))
    for name, get in (("intra_node.bandwidth", lambda s: s.intra.bandwidth_Bps),
                      ("nic.bandwidth", lambda s: s.nic.bandwidth_Bps)):
        if name not in fit.values or not fit.identified.get(name, False):
            continue
        v, b = fit.values[name], get(base)
        if b > 0 and not 1 / FAR_FROM_BASE <= v / b <= FAR_FROM_BASE:
            out.append(Warning(
                "far_from_base", f"{name} fitted at {v / 1e9:.1f} GB/s, {v / b:.2g}x the "
                f"base's {b / 1e9:.1f} GB/s",
                "a link that far from its datasheet value is compensating for something the "
                "base does not have (another NIC count, topology or GPU)"))
    fam = gpu_family(base.gpu.model)
    line = {"intra_node.bandwidth": NVLINK_BPS.get(fam or "")}
    per = [nics_stated(lg.meta.get("hardware"))[1] for lg in logs]
    if per and all(per):
        line["nic.bandwidth"] = min(per) / 8
    for name, rate in line.items():
        v = fit.values.get(name)
        if rate and v is not None and fit.identified.get(name, False) and \
                v > rate * LINE_RATE_SLACK:
            out.append(Warning(
                "above_line_rate", f"{name} fitted at {v / 1e9:.1f} GB/s, above the "
                f"hardware's line rate {rate / 1e9:.1f} GB/s",
                "no link runs faster than its line rate: the base has fewer or slower links "
                "than the hardware, or the log's rank layout differs"))
    return out


def format_warnings(warnings: list[Warning]) -> list[str]:
    """One ``warning: ... (means: ...)`` line per finding."""
    return [f"warning [{w.kind}]: {w.message}. Means: {w.meaning}." for w in warnings]
