"""Read the text output of nccl-tests (``all_reduce_perf``, ``all_gather_perf``,
``reduce_scatter_perf``, ``alltoall_perf``) and write the same table for simulated collectives.

What a log gives (see https://github.com/NVIDIA/nccl-tests, ``src/common.cu``):

* a header: ``# nThread 1 nGpus 1 minBytes 8 maxBytes ...`` and one line per rank
  ``#  Rank  0 Group  0 Pid 43 on HOST device  0 [0x0f] NVIDIA A100-SXM4-40GB``
  (nranks, hosts = nodes, device names); the header may be missing in posted excerpts;
* a column header ``# size count type redop root time algbw busbw #wrong time algbw busbw
  #wrong`` (out-of-place, then in-place; times in us, bandwidths in GB/s = 1e9 B/s);
* one row per size; a footer ``# Avg bus bandwidth : X``.

Launcher prefixes (``0: `` from srun, ``[1,0]<stdout>:`` from Open MPI) are removed, NCCL
``INFO``/``WARN`` lines and a literal ``...`` (rows elided in a posted excerpt) are skipped;
anything else inside the table is an error: a malformed log raises
:class:`~parosim.errors.InputError` naming the file and line.

The collective comes from the log when it says so (the command line ``all_gather_perf``, a
``# Collective test concluded: ...`` footer), else from ``busbw / algbw`` (nccl-tests' factor:
2(n-1)/n > 1 for all-reduce, (n-1)/n < 1 for all-gather and reduce-scatter, told apart by redop
``none`` vs a reduction). The number of ranks comes from the header, else from the same ratio;
both must agree when both are present. An ``alltoall_perf`` log has the all-gather's factor
(n-1)/n and redop ``none``: it is recognised by its command line, its footer or
``# parosim: op = all-to-all`` only (busbw / algbw alone reads it as an all-gather).

Lines ``# parosim: key = value`` are parosim's own metadata for logs posted without a header
(``source``, ``hardware``, ``op``, ``nodes``, ``nranks``, ``columns = in-place`` when a table
holds only in-place columns, ``note``). nccl-tests ignores ``#`` lines, and so do other readers.

>>> log = parse_nccl_tests(EXAMPLE, "example")
>>> log.op, log.nranks, log.nodes, len(log.rows), log.rows[-1].time_s
('all-reduce', 2, 2, 2, 0.0001053)
"""

# ruff: noqa: E501  (EXAMPLE is nccl-tests output, whose rows are 116 characters wide)
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import InputError

EXAMPLE = """\
$ flux run -n 2 -N 2 -g 1 ./build/all_reduce_perf -b 8 -e 16 -f 2 -g 1
# nThread 1 nGpus 1 minBytes 8 maxBytes 16 step: 2(factor) warmup iters: 5 iters: 20
#
# Using devices
#  Rank  0 Group  0 Pid    167 on flux-sample-0 device  0 [0000:00:04] Tesla V100-SXM2-16GB
#  Rank  1 Group  0 Pid     91 on flux-sample-1 device  0 [0000:00:04] Tesla V100-SXM2-16GB
#
#                                                out-of-place                       in-place
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
           8             2     float     sum      -1    110.1    0.00    0.00      0    110.1    0.00    0.00      0
          16             4     float     sum      -1    105.3    0.00    0.00      0    101.0    0.00    0.00      0
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 0.0001
"""

OPS = {"all_reduce": "all-reduce", "all_gather": "all-gather", "reduce_scatter": "reduce-scatter",
       "alltoall": "all-to-all"}
_PREFIX = re.compile(r"^\s*(?:\[\d+,\d+\]<std(?:out|err)>:|\d+:(?=\s|#))")
# ``Group N`` is absent in older nccl-tests (e.g. the ABCI 2.0 logs): the host is still there
_RANK = re.compile(r"^#\s*Rank\s+(\d+)\s+(?:Group\s+\d+\s+)?Pid\s+\d+\s+on\s+(\S+)\s+device\s+\d+"
                   r"\s+\[[^\]]*\]\s+(.*?)\s*$")
_META = re.compile(r"^#\s*parosim:\s*([A-Za-z_]+)\s*=\s*(.*?)\s*$")
_OPNAME = re.compile(r"\b(all_reduce|all_gather|reduce_scatter|alltoall|broadcast|reduce|"
                     r"gather|scatter|sendrecv|hypercube)_perf\b")
#: an NCCL release named in the header: "NCCL version 2.8.4+cuda11.2" (NCCL_DEBUG=INFO),
#: "NCCL 2.8.4-1", "nccl-library=2.18.5" style mentions; the first one wins
_NCCL_RELEASE = re.compile(r"\bNCCL(?:\s+version|[-_ ]library\s*=?)?\s*v?(\d+\.\d+\.\d+)", re.I)
_AVG = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*([0-9.eE+-]+)")
_COLS = {"size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "error",
         "wrong"}


@dataclass(frozen=True)
class NcclTestsRow:
    """One size of a log. Times in s, bandwidths in GB/s (1e9 B/s), as printed; ``None``
    where the log has no such column (e.g. a table of in-place numbers only)."""

    size_bytes: int
    count: int
    dtype: str
    redop: str
    time_oop_s: float | None
    algbw_oop_GBps: float | None
    busbw_oop_GBps: float | None
    time_ip_s: float | None = None
    algbw_ip_GBps: float | None = None
    busbw_ip_GBps: float | None = None

    @property
    def time_s(self) -> float:
        """The measured time parosim compares with: out-of-place, else in-place."""
        return self.time_oop_s if self.time_oop_s is not None else self.time_ip_s  # type: ignore


@dataclass(frozen=True)
class NcclTestsLog:
    """A parsed nccl-tests log."""

    path: str
    op: str                       # all-reduce | all-gather | reduce-scatter | all-to-all
    nranks: int
    nranks_from: str              # header | busbw/algbw | parosim metadata
    nodes: int | None             # distinct hosts in the header, or metadata; None if unknown
    devices: tuple[str, ...]      # device names from the header (may be empty)
    rows: tuple[NcclTestsRow, ...]
    avg_busbw_GBps: float | None = None
    meta: dict = field(default_factory=dict)
    nccl_release: str | None = None  # "2.8.4" when the header names one (_NCCL_RELEASE)

    @property
    def source(self) -> str:
        return self.meta.get("source", self.path)

    @property
    def gpus_per_node(self) -> int | None:
        return self.nranks // self.nodes if self.nodes and self.nranks % self.nodes == 0 else None

    def busbw_factor(self) -> float:
        n = self.nranks
        return 2 * (n - 1) / n if self.op == "all-reduce" else (n - 1) / n


def _num(tok: str, what: str, where: str) -> float:
    try:
        return float(tok)
    except ValueError:
        raise InputError(f"{where}: {what} {tok!r} is not a number") from None


def _count_runs(text: str, path: str) -> None:
    """One run per file: a second table header (concatenated runs, with or without their
    command lines) is refused, never merged into one log."""
    heads = []
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = _PREFIX.sub("", raw, count=1).strip()
        if line.startswith("#"):
            toks = line.lstrip("#").split()
            if "algbw" in toks and "busbw" in toks and "size" in toks:
                heads.append(lineno)
    if len(heads) > 1:
        raise InputError(f"nccl-tests log {path!r} holds {len(heads)} runs (table headers at "
                         f"lines {', '.join(map(str, heads))}); expected one run per file "
                         "(split the file)")


def parse_nccl_tests(text: str, path: str = "<text>") -> NcclTestsLog:
    """Parse nccl-tests output (see the module docstring); errors name ``path`` and the line."""
    _count_runs(text, path)
    meta: dict[str, str] = {}
    ranks: dict[int, tuple[str, str]] = {}
    columns: list[str] | None = None
    rows: list[NcclTestsRow] = []
    op_named: str | None = None
    avg = None
    release: str | None = None
    for lineno, raw in enumerate(text.splitlines(), 1):
        where = f"nccl-tests log {path!r} line {lineno}"
        line = _PREFIX.sub("", raw, count=1).strip()
        if not line:
            continue
        if release is None and (columns is None or line.startswith("#") or " NCCL INFO " in
                                f" {line} "):
            m = _NCCL_RELEASE.search(line)
            release = m.group(1) if m else None
        m = _META.match(line)
        if m:
            meta[m.group(1).lower()] = m.group(2)
            continue
        m = _OPNAME.search(line)
        if m and op_named is None:
            op_named = m.group(1)
        if line.startswith("#"):
            m = _RANK.match(line)
            if m:
                ranks[int(m.group(1))] = (m.group(2), m.group(3))
                continue
            m = _AVG.match(line)
            if m:
                avg = float(m.group(1))
                continue
            toks = line.lstrip("#").split()
            if "algbw" in toks and "busbw" in toks and "size" in toks:
                unknown = [t for t in toks if t not in _COLS]
                if unknown:
                    raise InputError(f"{where}: unknown column {unknown[0]!r} in the table "
                                     "header; expected nccl-tests columns size count type "
                                     "redop root time algbw busbw #wrong")
                columns = toks
            continue
        if columns is None:
            continue  # command lines, launcher chatter before the table
        if line == "..." or " NCCL INFO " in f" {line} " or "NCCL WARN" in line:
            continue
        toks = line.split()
        if len(toks) != len(columns):
            raise InputError(f"{where}: expected a table row of {len(columns)} columns "
                             f"({' '.join(columns)}), got {line[:60]!r}")
        rows.append(_row(columns, toks, meta.get("columns", "").strip(), where))
    if columns is None:
        raise InputError(f"nccl-tests log {path!r}: no table header (a '#  size  count  type "
                         "... time  algbw  busbw' line); expected the output of all_reduce_perf, "
                         "all_gather_perf or reduce_scatter_perf")
    if not rows:
        raise InputError(f"nccl-tests log {path!r}: the table has no rows")
    if not any(r.size_bytes > 0 for r in rows):
        raise InputError(f"nccl-tests log {path!r}: the table has no row of size > 0 (only "
                         "size-0 rows, which time no transfer); expected a log with sizes > 0")
    op = _op(path, rows, meta, op_named)
    nranks, nranks_from = _nranks(path, op, rows, ranks, meta)
    hosts = {h for h, _ in ranks.values()}
    nodes = None
    if ranks and len(ranks) == nranks:
        nodes = len(hosts)
    if "nodes" in meta:
        try:
            nodes_meta = int(meta["nodes"])
        except ValueError:
            raise InputError(f"nccl-tests log {path!r}: '# parosim: nodes = {meta['nodes']}' "
                             "is not an integer") from None
        if nodes is not None and nodes != nodes_meta:
            raise InputError(f"nccl-tests log {path!r}: the header shows {nodes} hosts but "
                             f"'# parosim: nodes' says {nodes_meta}")
        nodes = nodes_meta
    if nodes is not None and (nodes < 1 or nranks % nodes):
        raise InputError(f"nccl-tests log {path!r}: {nranks} ranks do not split evenly over "
                         f"{nodes} nodes")
    devices = tuple(dict.fromkeys(d for _, d in ranks.values()))
    return NcclTestsLog(path, op, nranks, nranks_from, nodes, devices, tuple(rows), avg, meta,
                        release)


def _row(columns: list[str], toks: list[str], which: str, where: str) -> NcclTestsRow:
    groups: list[dict[str, float]] = []
    base: dict[str, str] = {}
    for c, t in zip(columns, toks, strict=True):
        if c in ("time", "algbw", "busbw"):
            if c == "time":
                groups.append({})
            v = _num(t, c, where)
            if not math.isfinite(v):
                raise InputError(f"{where}: {c} {t!r} must be finite; expected a number as "
                                 "nccl-tests prints it")
            if v < 0 or (c == "time" and v <= 0):
                raise InputError(f"{where}: {c} {t!r} must be positive")
            groups[-1][c] = v
        elif c not in base:
            base[c] = t
    size = _num(base.get("size", ""), "size", where)
    if size < 0 or size != int(size):
        raise InputError(f"{where}: size {base.get('size')!r} must be a non-negative integer "
                         "number of bytes")
    count = _num(base.get("count", "0"), "count", where)
    if not groups or len(groups) > 2:
        raise InputError(f"{where}: expected one or two groups of time/algbw/busbw columns")
    oop = groups[0] if (len(groups) == 2 or which != "in-place") else {}
    ip = groups[1] if len(groups) == 2 else (groups[0] if which == "in-place" else {})

    def s(g, k):
        return g[k] * 1e-6 if k in g else None

    return NcclTestsRow(int(size), int(count), base.get("type", "?"), base.get("redop", "?"),
                        s(oop, "time"), oop.get("algbw"), oop.get("busbw"),
                        s(ip, "time"), ip.get("algbw"), ip.get("busbw"))


#: half the last printed digit of algbw and busbw (nccl-tests prints both with 2 decimals)
PRINT_HALF_UNIT = 0.005


def _ratio_row(rows: list[NcclTestsRow]) -> tuple[float, float] | None:
    """(busbw, algbw) as printed in the row with the most precision (largest algbw)."""
    best = max(rows, key=lambda r: (r.algbw_oop_GBps or r.algbw_ip_GBps or 0.0))
    alg = best.algbw_oop_GBps if best.algbw_oop_GBps else best.algbw_ip_GBps
    bus = best.busbw_oop_GBps if best.algbw_oop_GBps else best.busbw_ip_GBps
    if not alg or alg < 1.0 or bus is None:
        return None
    return bus, alg


def _ratio(rows: list[NcclTestsRow]) -> float | None:
    """busbw / algbw from the rows printed with the most precision (largest algbw)."""
    ba = _ratio_row(rows)
    return None if ba is None else ba[0] / ba[1]


def ratio_bounds(bus: float, alg: float) -> tuple[float, float]:
    """The interval the true busbw / algbw lies in when both are printed with 2 decimals:
    each printed value is within :data:`PRINT_HALF_UNIT` of the true one, so the true ratio is
    in [(bus - h) / (alg + h), (bus + h) / (alg - h)] (``alg >= 1``; widened by 1e-9 for the
    float arithmetic). At algbw ~ 100 GB/s this is +-1e-4 relative: 16 ranks (factor 1.875 vs
    1.867 / 1.882) are told apart, 128 from 129 (1.98438 vs 1.98450) are not.

    >>> lo, hi = ratio_bounds(22.97, 12.25)
    >>> round(lo, 5), round(hi, 5)
    (1.87393, 1.87628)
    """
    h = PRINT_HALF_UNIT
    return (bus - h) / (alg + h) * (1 - 1e-9), (bus + h) / (alg - h) * (1 + 1e-9)


def _factor(op: str, n: int) -> float:
    return 2 * (n - 1) / n if op == "all-reduce" else (n - 1) / n


def _rank_candidates(op: str, lo: float, hi: float) -> tuple[int, int | None]:
    """The whole rank counts n >= 2 whose busbw factor lies in [lo, hi]: (first, last), last
    None when unbounded (the factor's limit is inside); first > last when there is none."""
    k = 2.0 if op == "all-reduce" else 1.0
    flo, fhi = lo / k, hi / k            # = 1 - 1/n
    if flo >= 1:                         # above the factor's limit: no rank count
        return 2, 1
    n_lo = 2 if flo < 0.5 else math.ceil(1 / (1 - flo) - 1e-9)
    n_hi = None if fhi >= 1 else math.floor(1 / (1 - fhi) + 1e-9)
    return n_lo, n_hi


def _op(path: str, rows, meta, named: str | None) -> str:
    if "op" in meta:
        op = meta["op"].strip().lower().replace("_", "-")
        if op not in OPS.values():
            raise InputError(f"nccl-tests log {path!r}: '# parosim: op = {meta['op']}' is not "
                             f"known; expected one of {', '.join(OPS.values())}")
        return op
    if named is not None:
        if named not in OPS:
            raise InputError(f"nccl-tests log {path!r}: {named}_perf is not supported; expected "
                             "all_reduce_perf, all_gather_perf, reduce_scatter_perf or "
                             "alltoall_perf")
        return OPS[named]
    r = _ratio(rows)
    redop = rows[-1].redop
    if r is None:
        raise InputError(f"nccl-tests log {path!r}: cannot tell the collective (no command line "
                         "and no row with algbw >= 1 GB/s); expected a log of all_reduce_perf, "
                         "all_gather_perf or reduce_scatter_perf")
    if r > 1.0:
        return "all-reduce"
    return "all-gather" if redop == "none" else "reduce-scatter"


def _nranks(path: str, op: str, rows, ranks: dict, meta) -> tuple[int, str]:
    """(nranks, where it came from). A header (``# Rank`` lines) or ``# parosim: nranks``
    decides; busbw / algbw is then only a consistency check within the printed rounding
    (:func:`ratio_bounds`). Without them the ratio must single out one rank count."""
    found: list[tuple[int, str]] = []
    if ranks and max(ranks) + 1 == len(ranks):
        found.append((len(ranks), "header"))
    elif ranks:  # an excerpt ('#  ...' between ranks): the highest rank is the last
        found.append((max(ranks) + 1, "header"))
    if "nranks" in meta:
        try:
            found.append((int(meta["nranks"]), "parosim metadata"))
        except ValueError:
            raise InputError(f"nccl-tests log {path!r}: '# parosim: nranks = {meta['nranks']}' "
                             "is not an integer") from None
    for n, src in found[1:]:
        if n != found[0][0]:
            raise InputError(f"nccl-tests log {path!r}: {found[0][1]} gives {found[0][0]} "
                             f"ranks but {src} gives {n}")
    ba = _ratio_row(rows)
    if ba is not None:
        bus, alg = ba
        lo, hi = ratio_bounds(bus, alg)
        n_lo, n_hi = _rank_candidates(op, lo, hi)
        said = (f"busbw/algbw = {bus:.2f}/{alg:.2f} (true ratio in {lo:.5f}..{hi:.5f} at the "
                "printed 2 decimals)")
        if n_hi is not None and n_lo > n_hi:
            raise InputError(f"nccl-tests log {path!r}: {said} is no {op} factor of a whole "
                             "number of ranks; expected busbw = algbw x 2(n-1)/n (all-reduce) "
                             "or (n-1)/n")
        if found:
            n0, src0 = found[0]
            if not (n_lo <= n0 and (n_hi is None or n0 <= n_hi)):
                gives = (str(n_lo) if n_lo == n_hi else f"{n_lo} or more" if n_hi is None
                         else f"{n_lo} to {n_hi}")
                raise InputError(f"nccl-tests log {path!r}: {src0} gives {n0} ranks but "
                                 f"busbw/algbw gives {gives} ({said}; {src0}'s factor "
                                 f"{_factor(op, n0):.5f})")
        elif n_lo == n_hi:
            found.append((n_lo, "busbw/algbw"))
        else:
            fits = f"{n_lo} or more" if n_hi is None else f"any of {n_lo} to {n_hi}"
            raise InputError(f"nccl-tests log {path!r}: cannot tell the number of ranks: no "
                             f"'#  Rank N ...' header, and {said} fits {fits} ranks; expected "
                             "the log's '#  Rank' lines or a line '# parosim: nranks = N'")
    if not found:
        raise InputError(f"nccl-tests log {path!r}: cannot tell the number of ranks (no "
                         "'#  Rank N ...' header and no row with algbw >= 1 GB/s)")
    n0, src0 = found[0]
    if n0 < 2:
        raise InputError(f"nccl-tests log {path!r}: {n0} rank; a collective needs at least 2")
    return n0, src0


def read_nccl_tests(path: str | Path) -> NcclTestsLog:
    """Read and parse one nccl-tests log file."""
    p = Path(path)
    try:
        text = p.read_text(errors="replace")
    except FileNotFoundError:
        raise InputError(f"nccl-tests log {str(p)!r} does not exist") from None
    except OSError as e:
        raise InputError(f"nccl-tests log {str(p)!r} cannot be read: {e.strerror}") from None
    return parse_nccl_tests(text, str(p))


_DTYPE_BYTES = {"float": 4, "half": 2, "bfloat16": 2, "double": 8, "int8": 1, "uint8": 1,
                "int32": 4, "uint32": 4, "int64": 8, "uint64": 8}


def format_table(op: str, rows: list[dict], algos: list[str], dtype: str = "float") -> str:
    """The nccl-tests table for simulated rows: one block of time/algbw/busbw per algorithm.

    ``rows``: dicts with ``size_bytes`` and, per algorithm ``a``, ``time_s[a]``,
    ``algbw_GBps[a]``, ``busbw_GBps[a]``. Times printed in us like nccl-tests.
    """
    redop = "none" if op in ("all-gather", "all-to-all") else "sum"
    tb = _DTYPE_BYTES.get(dtype, 4)
    head1 = "#" + " " * 46 + "".join(f"{a:^25}" for a in algos)
    head2 = (f"#{'size':>11} {'count':>13} {'type':>9} {'redop':>7} {'root':>7}"
             + "".join(f" {'time':>8} {'algbw':>7} {'busbw':>7}" for _ in algos))
    head3 = (f"#{'(B)':>11} {'(elements)':>13} {'':>9} {'':>7} {'':>7}"
             + "".join(f" {'(us)':>8} {'(GB/s)':>7} {'(GB/s)':>7}" for _ in algos))
    out = [head1, head2, head3]
    for r in rows:
        line = (f" {r['size_bytes']:>11} {r['size_bytes'] // tb:>13} {dtype:>9} {redop:>7} "
                f"{-1:>7}")
        for a in algos:
            t_us = r["time_s"][a] * 1e6
            tt = f"{t_us:8.1f}" if t_us >= 1e4 else f"{t_us:8.2f}"
            line += f" {tt} {r['algbw_GBps'][a]:7.2f} {r['busbw_GBps'][a]:7.2f}"
        out.append(line)
    return "\n".join(out)
