#!/usr/bin/env python3
"""launch/pslaunch/etcd.py: a real local etcd per test, started and stopped by PID.

Exits 77 (ctest: skipped) when /usr/bin/etcd ($ASYNCPS_TEST_ETCD if set) is not
installed.
"""
import base64
import json
import os
import stat
import sys
import tempfile
import time
import unittest
import urllib.request

from pslaunch import etcd

# $ASYNCPS_TEST_ETCD: another etcd binary (or a missing path, to see the skip).
BINARY = os.environ.get("ASYNCPS_TEST_ETCD") or etcd.ETCD_BINARY


def call(endpoint, path, body):
    req = urllib.request.Request(endpoint + path, data=json.dumps(body).encode(), method="POST")
    with urllib.request.urlopen(req, timeout=5) as r:
        return json.loads(r.read().decode())


def b64(s):
    return base64.b64encode(s.encode()).decode()


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead too.
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


class EtcdTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="asyncps_etcd_test.")
        self.handles = []

    def tearDown(self):
        for h in self.handles:
            h.stop()
        self.tmp.cleanup()

    def start(self, **kw):
        h = etcd.start_local_etcd(self.tmp.name, binary=BINARY, **kw)
        self.handles.append(h)
        return h

    def test_start_serve_stop(self):
        h = self.start()
        self.assertRegex(h.endpoints, r"^http://127\.0\.0\.1:\d+$")
        self.assertTrue(alive(h.pid))
        self.assertTrue(h.healthy())
        call(h.endpoints, "/v3/kv/put", {"key": b64("k"), "value": b64("v")})
        got = call(h.endpoints, "/v3/kv/range", {"key": b64("k")})
        self.assertEqual(base64.b64decode(got["kvs"][0]["value"]).decode(), "v")
        self.assertTrue(os.path.isdir(os.path.join(self.tmp.name, "etcd", "data")))
        with open(os.path.join(self.tmp.name, "etcd", "etcd.log")) as f:
            log = f.read()
        self.assertIn("--election-timeout=%d" % etcd.ELECTION_MS, log)
        pid = h.pid
        h.stop()
        self.assertFalse(alive(pid))
        self.assertFalse(h.healthy())
        h.stop()  # idempotent

    def test_one_second_leases(self):
        h = self.start()
        lease = call(h.endpoints, "/v3/lease/grant", {"TTL": 1})
        self.assertEqual(lease["TTL"], "1")  # not raised to 2 s
        call(h.endpoints, "/v3/kv/put", {"key": b64("m"), "value": b64("x"), "lease": lease["ID"]})
        t0 = time.monotonic()
        while call(h.endpoints, "/v3/kv/range", {"key": b64("m")}).get("kvs"):
            self.assertLess(time.monotonic() - t0, 4.0, "1 s lease outlived 4 s")
            time.sleep(0.02)

    def test_restart_keeps_data(self):
        h = self.start()
        call(h.endpoints, "/v3/kv/put", {"key": b64("k"), "value": b64("kept")})
        h.stop()
        h2 = self.start(port=h.client_port, peer_port=h.peer_port)
        got = call(h2.endpoints, "/v3/kv/range", {"key": b64("k")})
        self.assertEqual(base64.b64decode(got["kvs"][0]["value"]).decode(), "kept")
        h2.stop()
        h3 = self.start()  # other ports: a single member starts on them too
        got = call(h3.endpoints, "/v3/kv/range", {"key": b64("k")})
        self.assertEqual(base64.b64decode(got["kvs"][0]["value"]).decode(), "kept")

    def test_explicit_port(self):
        port = etcd._free_port("127.0.0.1")
        h = self.start(port=port)
        self.assertEqual(h.endpoints, "http://127.0.0.1:%d" % port)
        self.assertTrue(h.healthy())

    def test_tls_and_auth(self):
        """tls_prefix: https only, client certificates required, users with
        their roles; files private; a start again on the run dir keeps the
        CA and the users (their passwords still sign in)."""
        from pslaunch import etcd_tls
        if not etcd_tls.tools_available():
            self.skipTest("openssl / etcdctl not installed (Debian's openssl, etcd-client)")
        import launch_test_util as u
        h = self.start(tls_prefix="/asyncps/t")
        self.assertRegex(h.endpoints, r"^https://127\.0\.0\.1:\d+$")
        self.assertTrue(h.healthy())
        tls = os.path.join(self.tmp.name, "etcd", "tls")
        self.assertEqual(stat.S_IMODE(os.stat(tls).st_mode), 0o700)
        for name in os.listdir(tls):
            if name.endswith((".key", ".password")):
                self.assertEqual(stat.S_IMODE(os.stat(os.path.join(tls, name)).st_mode), 0o600,
                                 name)
        with open(os.path.join(self.tmp.name, "etcd", "etcd.log")) as f:
            self.assertIn("--client-cert-auth", f.read())
        status, why = u.etcd_request("http" + h.endpoints[5:], "/health", {})
        self.assertIsNone(status, why)
        server = u.etcd_session(h.endpoints, h.security)
        self.assertEqual(server("/v3/kv/put", {"key": b64("/asyncps/t/layout"),
                                               "value": b64("v")})[0], 200)
        self.assertEqual(server("/v3/kv/put", {"key": b64("/other"), "value": b64("v")})[0],
                         403)  # nothing outside the prefix
        with open(os.path.join(tls, "ca.pem")) as f:
            ca = f.read()
        h.stop()
        t0 = time.monotonic()
        h2 = self.start(port=h.client_port, peer_port=h.peer_port, tls_prefix="/asyncps/t")
        restart_s = time.monotonic() - t0
        with open(os.path.join(tls, "ca.pem")) as f:
            self.assertEqual(f.read(), ca)
        worker = u.etcd_session(h2.endpoints, etcd_tls.Security(tls, etcd_tls.WORKER_USER))
        self.assertEqual(worker("/v3/kv/range", {"key": b64("/asyncps/t/layout")})[0], 403)
        status, got = u.etcd_session(h2.endpoints, h2.security)(
            "/v3/kv/range", {"key": b64("/asyncps/t/layout")})
        self.assertEqual(base64.b64decode(got["kvs"][0]["value"]).decode(), "v")
        self.assertLess(restart_s, 10.0)

    def test_tls_without_openssl_is_refused(self):
        from pslaunch import etcd_tls
        saved = etcd_tls.OPENSSL
        etcd_tls.OPENSSL = "/nonexistent/openssl"
        try:
            with self.assertRaises(etcd.EtcdError) as e:
                etcd.start_local_etcd(self.tmp.name, binary=BINARY, tls_prefix="/asyncps/t")
        finally:
            etcd_tls.OPENSSL = saved
        self.assertIn("etcd with TLS needs /nonexistent/openssl", str(e.exception))
        self.assertIn("--etcd_tls off", str(e.exception))
        self.assertFalse(os.path.exists(os.path.join(self.tmp.name, "etcd", "data")))

    def test_missing_binary(self):
        with self.assertRaises(etcd.EtcdError) as e:
            etcd.start_local_etcd(self.tmp.name, binary="/nonexistent/etcd")
        self.assertIn("etcd not found at /nonexistent/etcd", str(e.exception))
        self.assertFalse(etcd.etcd_available("/nonexistent/etcd"))

    def fake_binary(self, body):
        path = os.path.join(self.tmp.name, "fake_etcd")
        with open(path, "w") as f:
            f.write("#!/bin/sh\n" + body + "\n")
        os.chmod(path, stat.S_IRWXU)
        return path

    def test_exit_during_start(self):
        fake = self.fake_binary("echo fake etcd failing; exit 3")
        with self.assertRaises(etcd.EtcdError) as e:
            etcd.start_local_etcd(self.tmp.name, binary=fake, port=1, peer_port=2)
        self.assertIn("exited during start (exit code 3)", str(e.exception))
        self.assertIn("fake etcd failing", str(e.exception))

    def test_timeout_kills_it(self):
        pid_file = os.path.join(self.tmp.name, "fake.pid")
        fake = self.fake_binary("echo $$ > %s; exec sleep 30" % pid_file)
        t0 = time.monotonic()
        with self.assertRaises(etcd.EtcdError) as e:
            etcd.start_local_etcd(self.tmp.name, binary=fake, timeout=0.5)
        self.assertLess(time.monotonic() - t0, 5.0)
        self.assertIn("not healthy", str(e.exception))
        with open(pid_file) as f:
            self.assertFalse(alive(int(f.read())))


if __name__ == "__main__":
    if not etcd.etcd_available(BINARY):
        print("SKIP: %s not installed (Debian package etcd-server)" % BINARY)
        sys.exit(77)  # ctest SKIP_RETURN_CODE; unittest's own skips exit 0
    result = unittest.main(exit=False, verbosity=2).result
    sys.exit(0 if result.wasSuccessful() else 1)
