"""Unit parsing: strings like ``"100Gbps"``, ``"80GB"``, ``"1GiB"``, ``"5us"`` to SI numbers.

Everything inside parosim is SI: bytes, bytes per second, seconds. Conversion happens once, at
load time, here. Decimal prefixes are powers of 1000 (``GB`` = 1e9 bytes) and binary prefixes
powers of 1024 (``GiB`` = 2**30 bytes), as nccl-tests and vendors use them. Bit rates end in
``bps`` (``100Gbps`` = 100e9 bits/s = 12.5e9 bytes/s); byte rates in ``B/s`` or ``Bps``.

>>> parse_bandwidth("100Gbps")
12500000000.0
>>> parse_size("1GiB")
1073741824
>>> parse_time("5us")
5e-06
"""

from __future__ import annotations

import math
import re

from .errors import InputError

_DEC = {"": 1, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}
_BIN = {"Ki": 2**10, "ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50}
_NUM = r"([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)"
_SIZE_RE = re.compile(rf"^\s*{_NUM}\s*([kKmMgGtTpP][iI]?)?(B|b|bytes?)?\s*$")
_BW_RE = re.compile(rf"^\s*{_NUM}\s*([kKMGTP]i?)?(bps|bit/s|b/s|Bps|B/s)\s*$")
_TIME_RE = re.compile(rf"^\s*{_NUM}\s*(ps|ns|us|µs|ms|s|min|h)\s*$")
# seconds = value * mul / div (dividing by 1e6 gives 5us == 5e-06 exactly, multiplying does not)
_TIME = {"ps": (1.0, 1e12), "ns": (1.0, 1e9), "us": (1.0, 1e6), "µs": (1.0, 1e6),
         "ms": (1.0, 1e3), "s": (1.0, 1.0), "min": (60.0, 1.0), "h": (3600.0, 1.0)}


def _prefix(p: str | None) -> float:
    if not p:
        return 1.0
    return float(_BIN[p]) if p in _BIN else float(_DEC[p])


# Documented domain of every unit-carrying input (docs/limits.md). Values outside are refused
# with one line: beyond them the simulator's integer-picosecond clock (2**63 ps ~ 107 days)
# would overflow or the value cannot describe real hardware.
MAX_SIZE_BYTES = 2**60              # 1 EiB: a buffer, a GPU memory
MIN_BANDWIDTH_Bps = 1e3             # 8 kbps
MAX_BANDWIDTH_Bps = 1e15            # 1 PB/s (8 Pbps)
MAX_TIME_S = 1e9                    # ~32 years: a latency, an overhead, an MTBF


def _positive(value: float, text: object, what: str, allow_zero: bool) -> None:
    if math.isnan(value) or math.isinf(value):
        raise InputError(f"{what} {text!r} must be finite")
    if value < 0 or (value == 0 and not allow_zero):
        need = "non-negative" if allow_zero else "positive"
        raise InputError(f"{what} {text!r} must be {need}")


def _within(value: float, text: object, what: str, lo: float | None, hi: float,
            expected: str) -> None:
    if value > hi or (lo is not None and 0 < value < lo):
        raise InputError(f"{what} {text!r} is outside the supported range; expected {expected}")


def _empty(text: object, what: str, example: str) -> None:
    if isinstance(text, str) and not text.strip():
        raise InputError(f"{what} is empty; expected a value such as {example!r}")


def parse_size(text: str | int | float, what: str = "size", allow_zero: bool = False) -> int:
    """Bytes from ``"80GB"``, ``"1GiB"``, ``"512KiB"``, ``"4096"`` or a number. The unit's
    letters may be in any case (``40gb`` = ``40GB``; a size is never in bits).

    >>> parse_size("2KiB"), parse_size("1.5GB"), parse_size(64)
    (2048, 1500000000, 64)
    """
    if isinstance(text, bool):
        raise InputError(f"{what} {text!r} is not a size; expected e.g. '80GB', '1GiB', 4096")
    _empty(text, what, "80GB")
    if isinstance(text, (int, float)):
        value = float(text)
    else:
        m = _SIZE_RE.match(str(text))
        if not m:
            raise InputError(
                f"{what} {text!r} is not a size; expected a number with an optional unit "
                "B, KB, MB, GB, TB (powers of 1000) or KiB, MiB, GiB, TiB (powers of 1024), "
                "e.g. '80GB' or '1GiB'")
        p = m.group(2)   # any case: a size is counted in bytes, never bits
        value = float(m.group(1)) * _prefix(p and (p[0].upper() + p[1:].lower()))
    _positive(value, text, what, allow_zero)
    _within(value, text, what, None, MAX_SIZE_BYTES, "at most 1EiB (2**60 bytes)")
    n = int(round(value))
    if abs(value - n) > 1e-9 * max(1.0, value) or (n == 0 and value > 0):
        raise InputError(f"{what} {text!r} is not a whole number of bytes; expected e.g. "
                         "'512B', '1.5GB' or '1GiB'")
    return n


def parse_bandwidth(text: str | int | float, what: str = "bandwidth") -> float:
    """Bytes per second from ``"100Gbps"`` (bits), ``"25GB/s"`` (bytes) or a number (bytes/s).

    >>> parse_bandwidth("2000Gbps"), parse_bandwidth("300GB/s")
    (250000000000.0, 300000000000.0)
    """
    if isinstance(text, bool):
        raise InputError(f"{what} {text!r} is not a bandwidth; expected e.g. '100Gbps' or "
                         "'25GB/s'")
    _empty(text, what, "100Gbps")
    if isinstance(text, (int, float)):
        value = float(text)
    else:
        m = _BW_RE.match(str(text))
        if not m:
            raise InputError(
                f"{what} {text!r} is not a bandwidth; expected a number with a unit in bits "
                "('100Gbps', '400Mbps') or bytes ('25GB/s', '300GBps')")
        value = float(m.group(1)) * _prefix(m.group(2))
        if m.group(3) in ("bps", "bit/s", "b/s"):
            value /= 8.0
    _positive(value, text, what, allow_zero=False)
    _within(value, text, what, MIN_BANDWIDTH_Bps, MAX_BANDWIDTH_Bps,
            "between 8kbps (1kB/s) and 1PB/s")
    return value


def parse_time(text: str | int | float, what: str = "latency", allow_zero: bool = True,
               example: str = "5us") -> float:
    """Seconds from ``"5us"``, ``"2ms"``, ``"0s"`` or a number (seconds).

    >>> parse_time("2us"), parse_time("1.5ms")
    (2e-06, 0.0015)
    """
    if isinstance(text, bool):
        raise InputError(f"{what} {text!r} is not a time; expected e.g. '5us' or '2ms'")
    _empty(text, what, "5us")
    if isinstance(text, (int, float)):
        value = float(text)
    else:
        m = _TIME_RE.match(str(text))
        if not m:
            raise InputError(f"{what} {text!r} is not a time; expected a number with a unit "
                             f"ps, ns, us, ms, s, min or h, e.g. {example!r}")
        mul, div = _TIME[m.group(2)]
        value = float(m.group(1)) * mul / div
    _positive(value, text, what, allow_zero)
    _within(value, text, what, None, MAX_TIME_S, "at most 1e9 s (~32 years)")
    return value


def parse_flops(text: str | int | float, what: str = "peak_tflops") -> float:
    """FLOP/s from a number of TFLOP/s (``312``) or a string (``"312TFLOPS"``)."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value = float(text) * 1e12
    else:
        m = re.match(rf"^\s*{_NUM}\s*([kMGTP]?)(FLOPS|FLOP/s|flops)\s*$", str(text))
        if not m:
            raise InputError(f"{what} {text!r} is not a compute rate; expected a number of "
                             "TFLOP/s (e.g. 312) or '312TFLOPS'")
        value = float(m.group(1)) * _prefix(m.group(2))
    _positive(value, text, what, allow_zero=False)
    _within(value, text, what, 1e9, 1e18, "between 0.001 and 1e6 TFLOP/s")
    return value


def fmt_bytes(n: float) -> str:
    """Human-readable binary size: ``fmt_bytes(3 * 2**30) == '3.00 GiB'``."""
    for unit, f in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= f:
            return f"{n / f:.2f} {unit}"
    return f"{n:.0f} B"


def fmt_size(n: float) -> str:
    """A size in the prefix family it is round in: ``1e9`` -> ``'1 GB'``, ``2**30`` ->
    ``'1 GiB'``; otherwise :func:`fmt_bytes`.

    >>> fmt_size(1e9), fmt_size(2**30), fmt_size(3 * 2**20), fmt_size(12345)
    ('1 GB', '1 GiB', '3 MiB', '12.06 KiB')
    """
    if n == int(n) and n > 0:
        i = int(n)
        for k, b, d in ((5, "PiB", "PB"), (4, "TiB", "TB"), (3, "GiB", "GB"),
                        (2, "MiB", "MB"), (1, "KiB", "kB")):
            if i % 1024**k == 0:
                return f"{i // 1024**k} {b}"
            if i % 1000**k == 0:
                return f"{i // 1000**k} {d}"
    return fmt_bytes(n)


def fmt_time(s: float) -> str:
    """Human-readable time: ``fmt_time(0.0123) == '12.300 ms'``."""
    if s >= 1:
        return f"{s:.3f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.3f} ms"
    return f"{s * 1e6:.3f} us"


def fmt_count(n: float) -> str:
    """A large count with a decimal suffix (K, M, B = billion, T = trillion), as token budgets
    are written: ``fmt_count(2e10) == '20B'``, ``fmt_count(1.4e12) == '1.4T'``; three
    significant digits at most, below 1000 the number itself.

    >>> fmt_count(2e10), fmt_count(1.4e12), fmt_count(4194304), fmt_count(512)
    ('20B', '1.4T', '4.19M', '512')
    """
    for suffix, f in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= f * (1 - 5e-4):
            v = float(f"{n / f:.3g}")
            return (f"{v:g}" if v < 1000 else f"{v:,.0f}") + suffix
    return f"{n:.3g}" if n != int(n) else f"{int(n)}"
