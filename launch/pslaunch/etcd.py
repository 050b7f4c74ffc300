"""A local etcd for a run: one member on loopback, its data and log in the run dir.

start_local_etcd(run_dir) starts Debian's /usr/bin/etcd (package etcd-server),
waits until its /health answers true and returns a LocalEtcd whose .endpoints
("http://127.0.0.1:PORT") the shards and workers are given. The process is
owned by the handle: .stop() ends it by PID (SIGTERM, then SIGKILL), and it
gets SIGTERM if the launcher dies. Files, under <run_dir>/etcd/:
  data/      etcd's data dir: starting again on the same run dir keeps the keys
  etcd.log   a '# psrun' header per start, then etcd's output (appended)

With netns=NAME (psrun --emulate_hosts: etcd in the hub namespace, on its
address) etcd runs under `ip netns exec NAME`, and psrun picks its ports and
checks its health from a thread inside that namespace (netns.call_in).

Flags: --heartbeat-interval=50 --election-timeout=250. etcd's smallest lease
TTL is ceil(1.5 * election timeout) seconds, so with its default 1000 ms a 1 s
lease is silently granted as 2 s; with 250 ms leases of 1 s work, and a 1 s
lease's keys are gone 1.0 to 1.5 s (median 1.5 s) after its last keep-alive
(etcd checks for expired leases every 500 ms). Measured numbers and the client:
common/etcd_client.h. These timings suit one member on one host only.
"""
import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request

from . import netns as netns_mod
from . import procs

ETCD_BINARY = "/usr/bin/etcd"
HEARTBEAT_MS = 50
ELECTION_MS = 250


class EtcdError(RuntimeError):
    """etcd could not be started (missing binary, exited, not healthy in time)."""


def etcd_available(binary=ETCD_BINARY):
    """True when the etcd binary exists and is executable."""
    return os.path.isfile(binary) and os.access(binary, os.X_OK)


def _url_host(host):
    return "[%s]" % host if ":" in host else host


def _free_port(host):
    """A port free on `host` now (the kernel's pick); etcd may lose it to a race."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _healthy(endpoint, timeout=0.5):
    try:
        with urllib.request.urlopen(endpoint + "/health", timeout=timeout) as r:
            return json.loads(r.read().decode()).get("health") == "true"
    except (OSError, ValueError, urllib.error.URLError):
        return False


class LocalEtcd:
    """A running local etcd. endpoints: its client URL; pid: its process id."""

    def __init__(self, proc, endpoints, data_dir, log_path, client_port, peer_port,
                 netns=None):
        self._proc = proc
        self.netns = netns
        self.endpoints = endpoints
        self.pid = proc.pid
        self.data_dir = data_dir
        self.log_path = log_path
        self.client_port = client_port
        self.peer_port = peer_port

    def running(self):
        return self._proc.poll() is None

    def healthy(self, timeout=0.5):
        return self.running() and _in(self.netns, _healthy, self.endpoints, timeout)

    def stop(self, timeout=10.0):
        """SIGTERM, SIGKILL after `timeout` s; waits for the exit. Idempotent."""
        if self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)
            try:
                self._proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        return self._proc.returncode

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def _in(netns, fn, *args):
    """fn(*args) here, or inside network namespace `netns`."""
    return fn(*args) if netns is None else netns_mod.call_in(netns, fn, *args)


def start_local_etcd(run_dir, host="127.0.0.1", port=0, peer_port=0, timeout=15.0,
                     binary=ETCD_BINARY, name="asyncps", netns=None):
    """Starts etcd for a run and waits until it is healthy; returns a LocalEtcd.

    port / peer_port: client and peer ports; 0 picks free ones (retried with
    other ports if etcd loses one to another process). netns: run it inside
    this network namespace (`host` is then an address there). Raises EtcdError, with
    the log's tail, when the binary is missing, etcd exits, or it is not
    healthy within `timeout` seconds (it is killed then).
    """
    if not etcd_available(binary):
        raise EtcdError("etcd not found at %s (Debian: apt-get install etcd-server)" % binary)
    etcd_dir = os.path.join(os.path.abspath(run_dir), "etcd")
    data_dir = os.path.join(etcd_dir, "data")
    log_path = os.path.join(etcd_dir, "etcd.log")
    os.makedirs(etcd_dir, exist_ok=True)
    attempts = 3 if port == 0 or peer_port == 0 else 1
    for attempt in range(attempts):
        cport = port or _in(netns, _free_port, host)
        pport = peer_port or _in(netns, _free_port, host)
        if cport == pport:
            continue
        client = "http://%s:%d" % (_url_host(host), cport)
        peer = "http://%s:%d" % (_url_host(host), pport)
        argv = [binary, "--name=" + name, "--data-dir=" + data_dir,
                "--listen-client-urls=" + client, "--advertise-client-urls=" + client,
                "--listen-peer-urls=" + peer, "--initial-advertise-peer-urls=" + peer,
                "--initial-cluster=%s=%s" % (name, peer),
                "--heartbeat-interval=%d" % HEARTBEAT_MS,
                "--election-timeout=%d" % ELECTION_MS]
        if netns:
            argv = ["ip", "netns", "exec", netns] + argv  # exec()s etcd: same PID
        procs.write_header(log_path, "etcd", argv)
        log_start = os.path.getsize(log_path)
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT, close_fds=True,
                                    preexec_fn=procs._die_with_parent)
        handle = LocalEtcd(proc, client, data_dir, log_path, cport, pport, netns)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                break
            if _in(netns, _healthy, client):
                return handle
            time.sleep(0.02)
        if proc.poll() is None:
            handle.stop(timeout=2.0)
            raise EtcdError("etcd (pid %d) not healthy at %s after %.1f s; log %s:\n%s"
                            % (proc.pid, client, timeout, log_path, procs.tail(log_path)))
        with open(log_path, "rb") as f:
            f.seek(log_start)
            output = f.read().decode("utf-8", "replace")
        if "address already in use" in output and attempt + 1 < attempts:
            continue
        raise EtcdError("etcd exited during start (%s); log %s:\n%s"
                        % (procs.describe_status(proc.returncode), log_path,
                           procs.tail(log_path)))
    raise EtcdError("etcd: no free port pair on %s" % host)
