"""Emulated hosts on one machine: network namespaces joined by shaped links.

A Network is a hub namespace holding a bridge (br0) and, per emulated host, a
namespace of its own whose only link is a veth pair: `eth0` in the host's
namespace, its peer `h<i>` on the hub's bridge. Addresses exist only inside
these namespaces (SUBNET.0/24 by default: host i is .(i+1), the hub's bridge
.254) and no route leads out of them: nothing reaches the machine's own
network. With a rate, each link gets `tc qdisc ... tbf` on both ends, so a
host's uplink (eth0) and its downlink (h<i>) are each limited to the rate;
with a latency, a netem delay of half of it on each end (host to host one way:
the latency), where the kernel has netem (checked at start; not on every
kernel: then NetnsError says so).

Ownership: a Network deletes every namespace it made in delete() (also on a
failed create); deleting a namespace removes its veth ends and qdiscs.
Processes are put into a host with exec_argv(host) (`ip netns exec NS`, which
exec()s the command: its PID is the command's). call_in(ns, fn) runs a Python
function in a thread that joined the namespace (sockets it opens stay there).
Needs root, iproute2's `ip` and `tc`: missing_tools() says what is missing.
"""
import ctypes
import os
import re
import shutil
import socket
import subprocess
import threading
import time

from . import procs

SUBNET = "10.213.0"
HUB_HOST = 254
_CLONE_NEWNET = 0x40000000
_UNITS = {"": 1, "k": 10 ** 3, "m": 10 ** 6, "g": 10 ** 9, "t": 10 ** 12}
_RATE_RE = re.compile(r"^\s*(\d+(?:\.\d*)?)\s*([kmgt]?)(bit|bps)?\s*$", re.I)
MIN_RATE = 10 ** 4       # 10kbit
MAX_RATE = 100 * 10 ** 9  # 100gbit


class NetnsError(RuntimeError):
    """A namespace, link or qdisc could not be made (the command and its error)."""


def parse_rate(text):
    """Bits per second from tc-style text: '100mbit', '1gbit', '1.5gbit', '500kbit'
    (SI units, as tc: 1mbit = 10^6 bit/s). Raises ValueError with a clear message."""
    m = _RATE_RE.match(text or "")
    if not m:
        raise ValueError("link rate %r: expected a number and a unit in bits per second, "
                         "e.g. 100mbit, 1gbit, 500kbit" % text)
    number, prefix, unit = m.group(1), m.group(2).lower(), (m.group(3) or "").lower()
    if unit == "bps":
        raise ValueError("link rate %r: tc's 'bps' means bytes per second; give bits per "
                         "second, e.g. %s%sbit" % (text, number, prefix))
    if not unit:
        raise ValueError("link rate %r: give a unit, e.g. %s%sbit" % (text, number,
                                                                      prefix or "m"))
    bits = int(round(float(number) * _UNITS[prefix]))
    if not MIN_RATE <= bits <= MAX_RATE:
        raise ValueError("link rate %r: must be between 10kbit and 100gbit" % text)
    return bits


def format_rate(bits):
    """'100mbit' for 10^8 (the largest unit that divides it), else 'Nbit'."""
    for prefix in ("t", "g", "m", "k"):
        if bits % _UNITS[prefix] == 0:
            return "%d%sbit" % (bits // _UNITS[prefix], prefix)
    return "%dbit" % bits


def missing_tools():
    """Why namespaces cannot be made here (not root, no ip/tc), or None."""
    if os.geteuid() != 0:
        return "needs root (network namespaces and tc): run psrun as root"
    for tool, pkg in (("ip", "iproute2"), ("tc", "iproute2")):
        if not shutil.which(tool):
            return "`%s` not found (Debian: apt-get install %s)" % (tool, pkg)
    return None


def unavailable(tag):
    """Why no Network can be made here (missing_tools(), or a hub with a
    bridge and one host failed: namespace `tag`-hub/-h0 made and deleted), or None."""
    why = missing_tools()
    if why:
        return why
    try:
        Network.create(1, tag=tag).delete()
    except NetnsError as e:
        return "network namespaces cannot be made here: %s" % e
    return None


def _run(argv, check=True):
    try:
        r = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                           timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise NetnsError("%s: %s" % (" ".join(argv), e))
    if check and r.returncode != 0:
        raise NetnsError("%s: exit %d: %s" % (" ".join(argv), r.returncode,
                                              (r.stderr or r.stdout).strip()))
    return r


class Host:
    """One emulated host: `name` (h0, h1, ...), its namespace, its address."""

    def __init__(self, index, name, netns, address):
        self.index = index
        self.name = name
        self.netns = netns
        self.address = address
        self.dev = "eth0"              # in the host's namespace
        self.hub_dev = "h%d" % index   # its peer, on the hub's bridge


class Network:
    """The hub and the hosts of one run (see the module doc). Not thread-safe."""

    def __init__(self, tag, subnet=SUBNET):
        self.tag = tag
        self.subnet = subnet
        self.hub = tag + "-hub"
        self.hub_address = "%s.%d" % (subnet, HUB_HOST)
        self.hosts = []
        self.rate = None
        self.latency_ms = None
        self._made = []  # namespaces made, deleted by delete()

    @classmethod
    def create(cls, count, rate=None, latency_ms=None, tag=None, subnet=SUBNET):
        """A hub and `count` hosts, each link limited to `rate` bit/s (None:
        unshaped) with `latency_ms` one way host to host (None: none). On any
        failure everything made so far is deleted and NetnsError raised."""
        if not 0 <= count < HUB_HOST - 1:
            raise NetnsError("%d hosts: between 0 and %d" % (count, HUB_HOST - 2))
        net = cls(tag or "psrun%d" % os.getpid(), subnet)
        net.rate, net.latency_ms = rate, latency_ms
        try:
            net._add_netns(net.hub)
            _run(["ip", "-n", net.hub, "link", "add", "br0", "type", "bridge"])
            _run(["ip", "-n", net.hub, "addr", "add", net.hub_address + "/24", "dev", "br0"])
            _run(["ip", "-n", net.hub, "link", "set", "br0", "up"])
            for _ in range(count):
                net.add_host()
        except BaseException:
            net.delete()
            raise
        return net

    def _add_netns(self, name):
        if os.path.exists(os.path.join("/run/netns", name)):
            raise NetnsError("network namespace %s exists already" % name)
        _run(["ip", "netns", "add", name])
        self._made.append(name)
        _run(["ip", "-n", name, "link", "set", "lo", "up"])

    def add_host(self):
        """One more host (also while processes run on the others: psrun
        --elastic adds one per new shard)."""
        i = len(self.hosts)
        if i >= HUB_HOST - 1:
            raise NetnsError("%d hosts already: no address left in %s.0/24" % (i, self.subnet))
        h = Host(i, "h%d" % i, "%s-h%d" % (self.tag, i), "%s.%d" % (self.subnet, i + 1))
        self._add_netns(h.netns)
        # Both ends made inside the namespaces: no interface in the machine's own.
        _run(["ip", "link", "add", h.dev, "netns", h.netns, "type", "veth",
              "peer", "name", h.hub_dev, "netns", self.hub])
        _run(["ip", "-n", self.hub, "link", "set", h.hub_dev, "master", "br0", "up"])
        _run(["ip", "-n", h.netns, "addr", "add", h.address + "/24", "dev", h.dev])
        _run(["ip", "-n", h.netns, "link", "set", h.dev, "up"])
        self.hosts.append(h)
        if self.rate or self.latency_ms:
            self._shape(h.netns, h.dev)
            self._shape(self.hub, h.hub_dev)
        return h

    def _shape(self, ns, dev):
        tc = ["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev]
        parent = ["root"]
        if self.latency_ms:
            r = _run(tc + ["root", "handle", "1:", "netem", "delay",
                           "%gms" % (self.latency_ms / 2.0)], check=False)
            if r.returncode != 0:
                raise NetnsError(
                    "latency cannot be emulated on this kernel: `tc qdisc add ... netem` "
                    "failed (%s); tbf limits bandwidth only: run without --latency"
                    % (r.stderr or r.stdout).strip())
            parent = ["parent", "1:1"]
        if self.rate:
            # burst: at least an MTU-sized packet and one timer tick (4 ms) of the rate.
            burst = max(32 * 1024, self.rate // 8 // 250)
            _run(tc + parent + ["handle", "10:", "tbf", "rate", "%dbit" % self.rate,
                                "burst", str(burst), "latency", "50ms"])

    def exec_argv(self, host_or_ns):
        """The argv prefix that runs a command inside a host (or namespace name)."""
        ns = host_or_ns if isinstance(host_or_ns, str) else host_or_ns.netns
        return ["ip", "netns", "exec", ns]

    def set_link(self, host, up):
        """set_link_state for one of this Network's hosts."""
        set_link_state(host.netns, up, host.dev)

    def delete(self):
        """Deletes every namespace this Network made (idempotent); returns the
        errors of those that could not be deleted."""
        errors = []
        for ns in reversed(self._made):
            r = _run(["ip", "netns", "del", ns], check=False)
            if r.returncode != 0 and os.path.exists(os.path.join("/run/netns", ns)):
                errors.append("%s: %s" % (ns, r.stderr.strip()))
        self._made = []
        return errors

    def namespaces(self):
        return list(self._made)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.delete()


class NetnsProc(procs.LocalProc):
    """A LocalProc run inside emulated Host `host` (`ip netns exec`, which
    exec()s the command: pid is the command's). record() adds the host's
    name and namespace (pids.json), so a test can kill all of one host."""

    def __init__(self, name, argv, log_path, host, env=None):
        super().__init__(name, ["ip", "netns", "exec", host.netns] + list(argv), log_path, env)
        self.host = host.address
        self.emulated = host

    def start(self, header_lines=()):
        return super().start(["emulated host %s (namespace %s, %s)" % (
            self.emulated.name, self.emulated.netns, self.emulated.address)]
            + list(header_lines))

    def record(self):
        r = super().record()
        r.update({"emulated_host": self.emulated.name, "netns": self.emulated.netns})
        return r


def set_link_state(netns, up, dev="eth0"):
    """Cuts an emulated host off (up=False: its eth0 down, so the hub's end
    loses carrier too) or heals it (up=True: addresses and qdiscs stay)."""
    _run(["ip", "-n", netns, "link", "set", dev, "up" if up else "down"])


def list_namespaces(prefix=""):
    """Names of the network namespaces under /run/netns starting with `prefix`."""
    try:
        return sorted(n for n in os.listdir("/run/netns") if n.startswith(prefix))
    except FileNotFoundError:
        return []


_libc = None


def _setns(netns):
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL("libc.so.6", use_errno=True)
    fd = os.open(os.path.join("/run/netns", netns), os.O_RDONLY)
    try:
        if _libc.setns(fd, _CLONE_NEWNET) != 0:
            e = ctypes.get_errno()
            raise OSError(e, "setns(%s): %s" % (netns, os.strerror(e)))
    finally:
        os.close(fd)


class NsThread:
    """fn(*args) in a thread of its own that first joined network namespace
    `netns` (setns changes only the calling thread's namespace); result()
    waits and returns its value or raises its exception."""

    def __init__(self, netns, fn, *args):
        self._out = {}

        def target():
            try:
                _setns(netns)
                self._out["value"] = fn(*args)
            except BaseException as e:  # handed to result()
                self._out["error"] = e

        self._thread = threading.Thread(target=target, daemon=True)
        self._thread.start()

    def result(self, timeout=None):
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError("still running after %ss" % timeout)
        if "error" in self._out:
            raise self._out["error"]
        return self._out["value"]


def call_in(netns, fn, *args):
    """fn(*args) run inside network namespace `netns` (see NsThread)."""
    return NsThread(netns, fn, *args).result()


def measure_throughput(src_ns, dst_ns, dst_address, seconds=3.0, timeout=30.0):
    """Bits per second of one TCP stream from namespace src_ns to dst_address
    (in dst_ns) over `seconds`: bytes received between the receiver's first and
    last byte. Used to check a shaped link against its rate."""
    listener = call_in(dst_ns, lambda: socket.create_server((dst_address, 0)))
    port = listener.getsockname()[1]
    listener.settimeout(timeout)

    def receive():
        with listener:
            conn, _ = listener.accept()
        with conn:
            conn.settimeout(timeout)
            total, first, last = 0, None, None
            while True:
                data = conn.recv(1 << 16)
                if not data:
                    break
                now = time.monotonic()
                if first is None:
                    first = now
                total += len(data)
                last = now
        return total, first, last

    def send():
        with socket.create_connection((dst_address, port), timeout=timeout) as s:
            chunk = b"\0" * (1 << 16)
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                s.sendall(chunk)

    # The listener is already in dst_ns: its accepting thread may be any.
    got = {}

    def run_receiver():
        got["r"] = receive()

    rt = threading.Thread(target=run_receiver, daemon=True)
    rt.start()
    try:
        call_in(src_ns, send)
    finally:
        rt.join(timeout)
    if "r" not in got:
        raise NetnsError("throughput: the receiver did not finish")
    total, first, last = got["r"]
    if not total or last <= first:
        raise NetnsError("throughput: nothing received")
    return total * 8.0 / (last - first)
