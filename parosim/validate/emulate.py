"""An emulated multi-node cluster on one Linux machine: network namespaces, veths, a bridge, tc.

Layout for ``nodes = N`` (all names carry a per-run prefix ``psim<pid>x<k>``)::

    <prefix>-n0  ... <prefix>-n{N-1}     one namespace per node: eth0 (10.213.0.{i+1}/24), lo
    <prefix>-sw                          the switch: bridge br0 with ports p0 .. p{N-1}
    veth pair  n{i}:eth0  <->  sw:p{i}   the node's NIC cable

Shaping (``tc``), per direction, like a full-duplex NIC of ``nic_rate_Bps``:
node -> switch on ``eth0`` egress, switch -> node on ``p{i}`` egress; each an HTB class at the
rate with a ``netem`` leaf adding half the one-way NIC latency. Traffic between ranks of one node
uses the node's loopback (a node-local address routes over ``lo``), shaped to ``intra_rate_Bps``
(shared by all ranks of the node: one HTB class on ``lo``).

The addresses exist only inside these namespaces; nothing is added to the host's namespace,
so the veths never appear there and deleting the namespaces deletes everything.

Teardown always runs: on leaving the ``with`` block (normally or by exception), on SIGINT /
SIGTERM (turned into exceptions while the block runs) and at interpreter exit. It kills the
processes inside the namespaces (started by us), then deletes the namespaces.
:func:`cleanup_stale` removes leftovers of runs whose process died.

>>> with EmulatedCluster(nodes=2, nic_rate_Bps=37.5e6) as emu:   # doctest: +SKIP
...     subprocess.run(emu.exec_prefix(0) + ["ping", "-c1", emu.address(1)])
"""

from __future__ import annotations

import atexit
import itertools
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass

from ..errors import InputError

PREFIX = "psim"
SUBNET = "10.213.0"  # only ever configured inside our own namespaces
_counter = itertools.count()
# TCP inside the emulated nodes behaves like a fabric that streams at link rate: no slow start
# after each idle gap between ring steps, and little data parked in the node's own shaped queue
# (the default TSQ limit of MBs per socket inflates the RTT of the reverse direction's ACKs by
# ~100 ms at a few hundred Mbit/s, and the ramp-up then dominates).
TCP_SYSCTLS = {"net.ipv4.tcp_slow_start_after_idle": os.environ.get("PAROSIM_EMU_SSAI", "0"),
               "net.ipv4.tcp_limit_output_bytes": os.environ.get("PAROSIM_EMU_TSQ", "65536"),
               "net.ipv4.tcp_congestion_control": os.environ.get("PAROSIM_EMU_CC", "cubic")}
_NAME_RE = re.compile(rf"^{PREFIX}(\d+)x(\d+)-(n\d+|sw)$")


class EmulationUnavailable(InputError):
    """This machine cannot create network namespaces (not root, or no ``ip`` / ``tc``)."""


def check_capability() -> None:
    """Raise :class:`EmulationUnavailable` with a clear reason if emulation cannot run here."""
    missing = [t for t in ("ip", "tc") if shutil.which(t) is None]
    if missing:
        raise EmulationUnavailable(
            f"cluster emulation needs iproute2 ({' and '.join(missing)} not found on PATH); "
            "install iproute2, or run without --emulate (all ranks on this host's loopback)")
    if os.geteuid() != 0:
        raise EmulationUnavailable(
            "cluster emulation needs root to create network namespaces (ip netns add); "
            "run as root (or in a container with CAP_NET_ADMIN and CAP_SYS_ADMIN), or run "
            "without --emulate (all ranks on this host's loopback)")
    probe = f"{PREFIX}{os.getpid()}x{next(_counter)}-sw"
    r = _ip("netns", "add", probe, check=False)
    if r.returncode != 0:
        raise EmulationUnavailable(
            f"cannot create a network namespace ({r.stderr.strip() or 'ip netns add failed'}); "
            "cluster emulation needs CAP_SYS_ADMIN and CAP_NET_ADMIN; run without --emulate "
            "(all ranks on this host's loopback)")
    _ip("netns", "del", probe, check=False)


def netem_available() -> bool:
    """Whether this kernel has the ``netem`` qdisc (needed for an added link delay)."""
    probe = f"{PREFIX}{os.getpid()}x{next(_counter)}-sw"
    if _ip("netns", "add", probe, check=False).returncode != 0:
        return False
    try:
        r = _run(["ip", "netns", "exec", probe, "tc", "qdisc", "add", "dev", "lo", "root",
                  "netem", "delay", "1ms"], check=False)
        return r.returncode == 0
    finally:
        _ip("netns", "del", probe, check=False)


def available() -> tuple[bool, str]:
    """``(True, "")`` when emulation can run here, else ``(False, reason)``."""
    try:
        check_capability()
    except EmulationUnavailable as e:
        return False, str(e)
    return True, ""


def _run(args: list[str], check: bool = True, timeout: float = 20) -> subprocess.CompletedProcess:
    r = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed: {r.stderr.strip()}")
    return r


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return _run(["ip", *args], check=check)


def _tc(ns: str, *args: str) -> None:
    _run(["ip", "netns", "exec", ns, "tc", *args])


def list_namespaces(prefix: str = PREFIX) -> list[str]:
    """Names of existing network namespaces starting with ``prefix``."""
    if shutil.which("ip") is None:
        return []
    r = _ip("netns", "list", check=False)
    return sorted(line.split()[0] for line in r.stdout.splitlines()
                  if line.strip() and line.split()[0].startswith(prefix))


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _kill_namespace_pids(ns: str, grace_s: float = 2.0) -> None:
    """SIGTERM, then SIGKILL, every process running in namespace ``ns`` (all started by us)."""
    deadline = time.monotonic() + grace_s
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = [int(p) for p in _ip("netns", "pids", ns, check=False).stdout.split()
                if p.isdigit()]
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        while time.monotonic() < deadline and sig == signal.SIGTERM:
            if not _ip("netns", "pids", ns, check=False).stdout.split():
                return
            time.sleep(0.05)
        deadline = time.monotonic() + grace_s


def delete_namespaces(names: list[str]) -> None:
    """Kill what runs inside each namespace, then delete it (veths and bridge go with it)."""
    for ns in names:
        _kill_namespace_pids(ns)
    for ns in names:
        _ip("netns", "del", ns, check=False)


def cleanup_stale(prefix: str = PREFIX, only_dead: bool = True) -> list[str]:
    """Delete leftover namespaces named ``<prefix>...`` and return their names.

    With ``only_dead`` (default) only namespaces whose creating process (the pid in the name)
    no longer runs are removed, so a concurrent run is left alone.
    """
    stale = []
    for ns in list_namespaces(prefix):
        m = _NAME_RE.match(ns)
        if only_dead and m and _pid_alive(int(m.group(1))):
            continue
        stale.append(ns)
    delete_namespaces(stale)
    return stale


@dataclass(frozen=True)
class Shaping:
    """Link shaping of the emulated cluster (bytes/s and seconds)."""

    nic_rate_Bps: float = 37.5e6      # 300 Mbit/s per direction
    nic_latency_s: float = 0.0        # added one-way delay node to node (half on each side of
    #                                   the switch); needs tc netem; 0 = the stack's own latency
    intra_rate_Bps: float = 150e6     # loopback of a node, shared by its ranks
    intra_latency_s: float = 0.0

    def __post_init__(self) -> None:
        for name in ("nic_rate_Bps", "intra_rate_Bps"):
            if not getattr(self, name) > 0:
                raise InputError(f"{name} = {getattr(self, name)!r} must be positive")
        for name in ("nic_latency_s", "intra_latency_s"):
            if not getattr(self, name) >= 0:
                raise InputError(f"{name} = {getattr(self, name)!r} must be non-negative")


def _bits(rate_Bps: float) -> str:
    return f"{int(rate_Bps * 8)}bit"


def _shape(ns: str, dev: str, rate_Bps: float, delay_s: float) -> None:
    """HTB at ``rate_Bps`` with a netem leaf adding ``delay_s`` on egress of ``dev``."""
    burst = int(os.environ.get("PAROSIM_EMU_BURST", "3200"))  # bytes; small: see docstring
    _tc(ns, "qdisc", "replace", "dev", dev, "root", "handle", "1:", "htb", "default", "10")
    _tc(ns, "class", "add", "dev", dev, "parent", "1:", "classid", "1:10", "htb",
        "rate", _bits(rate_Bps), "ceil", _bits(rate_Bps), "burst", str(burst),
        "cburst", str(burst))
    if delay_s > 0:  # netem is a kernel module some kernels lack: checked in check_capability
        _tc(ns, "qdisc", "add", "dev", dev, "parent", "1:10", "handle", "10:", "netem",
            "limit", "100000", "delay", f"{int(round(delay_s * 1e6))}us")


class EmulatedCluster:
    """Context manager: ``nodes`` namespaces joined by a shaped switch; see module docstring."""

    def __init__(self, nodes: int, shaping: Shaping | None = None, **shaping_kw: float):
        if not isinstance(nodes, int) or nodes < 1 or nodes > 200:
            raise InputError(f"nodes = {nodes!r} must be an integer in 1..200 for emulation")
        self.nodes = nodes
        self.shaping = shaping or Shaping(**shaping_kw)
        self.prefix = f"{PREFIX}{os.getpid()}x{next(_counter)}"
        self.switch_ns = f"{self.prefix}-sw"
        self.node_ns = [f"{self.prefix}-n{i}" for i in range(nodes)]
        self._created: list[str] = []
        self._procs: list[subprocess.Popen] = []
        self._old_handlers: dict[int, object] = {}
        self._closed = False
        self._lock = threading.Lock()

    # -- addresses and commands -----------------------------------------------------------
    ifname = "eth0"

    def address(self, node: int) -> str:
        return f"{SUBNET}.{node + 1}"

    def exec_prefix(self, node: int) -> list[str]:
        """Prefix a command with this to run it inside node ``node``'s namespace."""
        return ["ip", "netns", "exec", self.node_ns[node]]

    def popen(self, node: int, args: list[str], **kw) -> subprocess.Popen:
        """Start a process inside node ``node``; it is killed at teardown."""
        p = subprocess.Popen(self.exec_prefix(node) + list(args), start_new_session=True, **kw)
        self._procs.append(p)
        return p

    # -- lifecycle ------------------------------------------------------------------------
    def __enter__(self) -> EmulatedCluster:
        check_capability()
        s = self.shaping
        if (s.nic_latency_s > 0 or s.intra_latency_s > 0) and not netem_available():
            raise EmulationUnavailable(
                "an added link delay needs the tc 'netem' qdisc, which this kernel lacks "
                "(tc: 'Specified qdisc kind is unknown'); use a delay of 0 (the emulated links "
                "then have the network stack's own latency, which calibration measures)")
        cleanup_stale()
        atexit.register(self.close)
        self._install_signal_handlers()
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _install_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return

        def handler(signum, frame):  # teardown happens in __exit__ as the exception unwinds
            raise KeyboardInterrupt(f"signal {signum}")

        for sig in (signal.SIGINT, signal.SIGTERM):
            self._old_handlers[sig] = signal.signal(sig, handler)

    def _restore_signal_handlers(self) -> None:
        for sig, old in self._old_handlers.items():
            try:
                signal.signal(sig, old)
            except (ValueError, TypeError):
                pass
        self._old_handlers.clear()

    def _add_ns(self, name: str) -> None:
        _ip("netns", "add", name)
        self._created.append(name)
        _ip("-n", name, "link", "set", "lo", "up")
        for key, value in TCP_SYSCTLS.items():  # per-namespace settings; the host's are untouched
            _run(["ip", "netns", "exec", name, "sysctl", "-q", "-w", f"{key}={value}"],
                 check=False)

    def _build(self) -> None:
        s = self.shaping
        self._add_ns(self.switch_ns)
        _ip("-n", self.switch_ns, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch_ns, "link", "set", "br0", "up")
        for i, ns in enumerate(self.node_ns):
            self._add_ns(ns)
            port = f"p{i}"
            _ip("link", "add", "eth0", "netns", ns, "type", "veth", "peer", "name", port,
                "netns", self.switch_ns)
            _ip("-n", self.switch_ns, "link", "set", port, "master", "br0")
            _ip("-n", self.switch_ns, "link", "set", port, "up")
            gso = os.environ.get("PAROSIM_EMU_GSO", "16384")
            if gso != "0":  # smaller super-packets: less store-and-forward delay per shaper
                for n_, dev in ((ns, "eth0"), (self.switch_ns, port)):
                    _ip("-n", n_, "link", "set", dev, "gso_max_size", gso, check=False)
            _ip("-n", ns, "addr", "add", f"{self.address(i)}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _shape(ns, "eth0", s.nic_rate_Bps, s.nic_latency_s / 2)
            _shape(self.switch_ns, port, s.nic_rate_Bps, s.nic_latency_s / 2)
            _shape(ns, "lo", s.intra_rate_Bps, s.intra_latency_s)

    def close(self) -> None:
        """Kill rank processes and delete every namespace; safe to call more than once."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        for p in self._procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        for p in self._procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        delete_namespaces(list(reversed(self._created)))
        self._restore_signal_handlers()
        atexit.unregister(self.close)
