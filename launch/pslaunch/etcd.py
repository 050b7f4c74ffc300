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

With tls_prefix=PREFIX (psrun --etcd_tls) etcd runs as a secured deployment
does (etcd_tls.py): https client URLs, its certificate and the run's CA made
in <run_dir>/etcd/tls (mode 700; kept when a run starts again on its run dir),
client certificates required; its health is asked over TLS with the
asyncps-server user's certificate, and once healthy the users root,
asyncps-server (read/write under PREFIX) and asyncps-worker (read
PREFIX/elastic) are created and authentication turned on (once per data
dir). .security is then the asyncps-server user's etcd_tls.Security.

Flags: --heartbeat-interval=50 --election-timeout=250. etcd's smallest lease
TTL is ceil(1.5 * election timeout) seconds, so with its default 1000 ms a 1 s
lease is silently granted as 2 s; with 250 ms leases of 1 s work, and a 1 s
lease's keys are gone 1.0 to 1.5 s (median 1.5 s) after its last keep-alive
(etcd checks for expired leases every 500 ms). Measured numbers and the client:
common/etcd_client.h. These timings suit one member on one host only.
"""
import os
import signal
import socket
import subprocess
import time

from . import etcd_tls
from . import netns as netns_mod
from . import procs
from .etcd_tls import healthy

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


class LocalEtcd:
    """A running local etcd. endpoints: its client URL; pid: its process id;
    security: with TLS, the asyncps-server user's etcd_tls.Security (else None)."""

    def __init__(self, proc, endpoints, data_dir, log_path, client_port, peer_port,
                 netns=None, security=None):
        self._proc = proc
        self.netns = netns
        self.security = security
        self._context = security.ssl_context() if security else None
        self.endpoints = endpoints
        self.pid = proc.pid
        self.data_dir = data_dir
        self.log_path = log_path
        self.client_port = client_port
        self.peer_port = peer_port

    def running(self):
        return self._proc.poll() is None

    def healthy(self, timeout=0.5):
        return self.running() and _in(self.netns, healthy, self.endpoints, timeout,
                                      self._context)

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
                     binary=ETCD_BINARY, name="asyncps", netns=None, tls_prefix=None):
    """Starts etcd for a run and waits until it is healthy; returns a LocalEtcd.

    port / peer_port: client and peer ports; 0 picks free ones (retried with
    other ports if etcd loses one to another process). netns: run it inside
    this network namespace (`host` is then an address there). tls_prefix:
    TLS and authentication, the users' permissions under this key prefix
    (see the module doc). Raises EtcdError, with the log's tail, when the
    binary (or with TLS openssl / etcdctl) is missing, etcd exits, it is not
    healthy within `timeout` seconds (it is killed then), or its users cannot
    be made (it is stopped then).
    """
    if not etcd_available(binary):
        raise EtcdError("etcd not found at %s (Debian: apt-get install etcd-server)" % binary)
    etcd_dir = os.path.join(os.path.abspath(run_dir), "etcd")
    data_dir = os.path.join(etcd_dir, "data")
    log_path = os.path.join(etcd_dir, "etcd.log")
    os.makedirs(etcd_dir, exist_ok=True)
    security, context, tls_dir = None, None, os.path.join(etcd_dir, "tls")
    if tls_prefix:
        if not etcd_tls.tools_available():
            raise EtcdError("etcd with TLS needs %s and %s (Debian: apt-get install openssl "
                            "etcd-client; or psrun --etcd_tls off)" % (etcd_tls.OPENSSL,
                                                                      etcd_tls.ETCDCTL))
        try:
            etcd_tls.ensure_certs(tls_dir, [host])
        except etcd_tls.TlsError as e:
            raise EtcdError("certificates for etcd: %s" % e)
        security = etcd_tls.Security(tls_dir, etcd_tls.SERVER_USER)
        context = security.ssl_context()
    attempts = 3 if port == 0 or peer_port == 0 else 1
    for attempt in range(attempts):
        cport = port or _in(netns, _free_port, host)
        pport = peer_port or _in(netns, _free_port, host)
        if cport == pport:
            continue
        client = "%s://%s:%d" % ("https" if tls_prefix else "http", _url_host(host), cport)
        peer = "http://%s:%d" % (_url_host(host), pport)
        argv = [binary, "--name=" + name, "--data-dir=" + data_dir,
                "--listen-client-urls=" + client, "--advertise-client-urls=" + client,
                "--listen-peer-urls=" + peer, "--initial-advertise-peer-urls=" + peer,
                "--initial-cluster=%s=%s" % (name, peer),
                "--heartbeat-interval=%d" % HEARTBEAT_MS,
                "--election-timeout=%d" % ELECTION_MS]
        if tls_prefix:
            argv += etcd_tls.etcd_server_flags(tls_dir)
        if netns:
            argv = ["ip", "netns", "exec", netns] + argv  # exec()s etcd: same PID
        procs.write_header(log_path, "etcd", argv)
        log_start = os.path.getsize(log_path)
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT, close_fds=True,
                                    preexec_fn=procs._die_with_parent)
        handle = LocalEtcd(proc, client, data_dir, log_path, cport, pport, netns, security)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                break
            if _in(netns, healthy, client, 0.5, context):
                if tls_prefix:
                    _enable_auth(handle, tls_dir, tls_prefix)
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


def _enable_auth(handle, tls_dir, prefix):
    """etcd_tls.enable_auth from inside etcd's namespace; stops etcd on failure."""
    try:
        _in(handle.netns, etcd_tls.enable_auth, tls_dir, handle.endpoints, prefix)
    except etcd_tls.TlsError as e:
        handle.stop(timeout=2.0)
        raise EtcdError("etcd's users and authentication: %s; log %s" % (e, handle.log_path))
