"""Chrome-trace JSON (opens in Perfetto / chrome://tracing): one track per stream."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from ..errors import InputError


def chrome_trace(records: Iterable, process_name: str = "parosim",
                 counters: list | None = None) -> dict:
    """Trace Event Format: complete events ("ph": "X"), times in microseconds.

    >>> from parosim.fabric.engine import Record
    >>> t = chrome_trace([Record("compute", "fwd L0", 0.0, 1e-3, "fwd")])
    >>> [e["ph"] for e in t["traceEvents"]], t["traceEvents"][-1]["dur"]
    (['M', 'M', 'X'], 1000.0)
    """
    recs = list(records)
    lanes = sorted({r.lane for r in recs}, key=lambda x: (x != "compute", x))
    tid = {lane: i for i, lane in enumerate(lanes)}
    events: list[dict] = [{"name": "process_name", "ph": "M", "pid": 0, "tid": 0,
                           "args": {"name": process_name}}]
    events += [{"name": "thread_name", "ph": "M", "pid": 0, "tid": tid[lane],
                "args": {"name": lane}} for lane in lanes]
    for r in sorted(recs, key=lambda r: (r.start_s, tid[r.lane], r.name)):
        events.append({"name": r.name, "cat": r.kind or r.lane, "ph": "X", "pid": 0,
                       "tid": tid[r.lane], "ts": r.start_s * 1e6,
                       "dur": (r.end_s - r.start_s) * 1e6})
    if counters:  # per-link utilisation over time: counter tracks of process 1
        events.append({"name": "process_name", "ph": "M", "pid": 1, "tid": 0,
                       "args": {"name": "link utilization (0..1)"}})
        for t, util in counters:
            for link, u in util.items():
                events.append({"name": link, "ph": "C", "pid": 1, "tid": 0, "ts": t * 1e6,
                               "args": {"utilization": u}})
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def write_chrome_trace(path: str | Path, records: Iterable, process_name: str = "parosim",
                       counters: list | None = None) -> Path:
    """Write the trace; an unwritable path is an :class:`InputError`. ``counters``: (time s,
    {link: utilisation}) pairs, written as Perfetto counter tracks."""
    p = Path(path)
    try:
        p.write_text(json.dumps(chrome_trace(records, process_name, counters)))
    except OSError as e:
        raise InputError(f"--trace file {str(p)!r} cannot be written: {e.strerror}") from None
    return p


def read_chrome_trace(path: str | Path) -> list[dict]:
    """The complete events of a trace written by :func:`write_chrome_trace`, with ``lane``,
    ``name``, ``kind``, ``start_s``, ``end_s`` (for the timeline plot)."""
    data = json.loads(Path(path).read_text())
    names = {e["tid"]: e["args"]["name"] for e in data["traceEvents"]
             if e.get("ph") == "M" and e["name"] == "thread_name"}
    return [{"lane": names[e["tid"]], "name": e["name"], "kind": e.get("cat", ""),
             "start_s": e["ts"] / 1e6, "end_s": (e["ts"] + e["dur"]) / 1e6}
            for e in data["traceEvents"] if e.get("ph") == "X"]


def write_link_timeline(path: str | Path, timeline: list) -> Path:
    """CSV ``time_s,link,utilization`` (utilisation = carried rate / capacity from that
    time on) from :meth:`parosim.fabric.network.Network.link_timeline`."""
    p = Path(path)
    lines = ["time_s,link,utilization"]
    for t, util in timeline:
        lines += [f"{t!r},{link},{u!r}" for link, u in util.items()]
    try:
        p.write_text("\n".join(lines) + "\n")
    except OSError as e:
        raise InputError(f"--link-timeline file {str(p)!r} cannot be written: "
                         f"{e.strerror}") from None
    return p
