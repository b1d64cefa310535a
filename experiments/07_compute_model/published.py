"""Published rows used by the compute and memory checks, parsed into simulator inputs.

The rows are copied verbatim (with their ``source`` and original line number ``row``) into
``experiments/data/published_rows.csv`` from the project's calibration data set.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

ROWS = Path(__file__).resolve().parents[1] / "data" / "published_rows.csv"


@dataclass(frozen=True)
class FoundryRow:
    """One configuration of llm-foundry's MPT benchmark table (A100 80GB, FSDP FULL_SHARD)."""

    row: int                 # line of the throughput row in the original calibration csv
    model: str               # mpt-7b ...
    params: int              # as published
    seq_len: int
    gpus: int
    micro_batch: int
    accum: int
    recompute: bool          # activation checkpointing
    pure_bf16: bool          # MP mode PURE (else DEFAULT: fp32 gradient reduction)
    tokens_per_s_per_gpu: float
    mfu: float               # fraction

    @property
    def key(self) -> str:
        return f"{self.model} seq{self.seq_len} {self.gpus}gpu mb{self.micro_batch}"


def foundry_rows() -> list[FoundryRow]:
    d = pd.read_csv(ROWS, dtype=str)
    d = d[d.source.str.contains("llm-foundry")]
    out = []
    for cfg, g in d.groupby("size_or_config", sort=False):
        thr = g[g.metric == "throughput_tokens_per_s_per_GPU"].iloc[0]
        mfu = g[g.metric == "MFU"].iloc[0]
        w = thr.workload
        m = re.match(r"MPT-(\w+) \((\d+) params\), seq (\d+)", w)
        kv = dict(re.findall(r"(\w+)=(\d+)", cfg))
        out.append(FoundryRow(
            row=int(thr.row), model=f"mpt-{m.group(1).lower()}", params=int(m.group(2)),
            seq_len=int(m.group(3)), gpus=int(kv["GPUs"]), micro_batch=int(kv["micro_batch"]),
            accum=int(kv["grad_accum"]), recompute="checkpointing True" in thr.software,
            pure_bf16="MP mode PURE" in thr.software,
            tokens_per_s_per_gpu=float(thr.value), mfu=float(mfu.value) / 100))
    return sorted(out, key=lambda r: (r.model, r.seq_len, r.gpus, r.micro_batch))


SMALL = ("mpt-125m", "mpt-350m", "mpt-760m", "mpt-1b")


def split(rows: list, part: str, by: str = "alternate") -> list:
    """Deterministic halves. ``by="alternate"``: 'fit' = even positions in the sorted list,
    'held-out' = odd. ``by="size"``: 'fit' = models up to 1B, 'held-out' = 3B and larger."""
    if by == "size":
        return [r for r in rows if (r.model in SMALL) == (part == "fit")]
    return rows[0::2] if part == "fit" else rows[1::2]
