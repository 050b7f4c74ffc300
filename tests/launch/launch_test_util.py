"""Shared helpers for the launcher tests (real processes, Python 3 stdlib).

The tests import pslaunch (launch/) and unittest_main (tests/) from the
PYTHONPATH ctest gives them (tests/launch/CMakeLists.txt); by hand:
  PYTHONPATH=launch:tests python3 tests/launch/<name>_test.py"""
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import unittest

import unittest_main  # tests/
from unittest_main import SKIP, note  # noqa: F401  (for the test scripts)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))
PSRUN = os.path.join(REPO, "launch", "psrun")


def bin_dir():
    d = os.environ.get("ASYNCPS_BIN_DIR") or os.path.join(REPO, "build", "bin")
    return os.path.abspath(d)


def have_binaries(names=("ps_server", "ps_worker", "ps_ctl")):
    return all(os.access(os.path.join(bin_dir(), n), os.X_OK) for n in names)


def have_data():
    return os.path.exists("/usr/share/datasets/fashion-mnist")


# Small and fast: a 784-32-10 MLP, a few dozen steps.
TINY_WORKER = ["--layers=784,32,10", "--batch=32", "--epochs=0", "--log_every=10",
               "--threads=1", "--timeout_s=30"]
TINY_SERVER = "--consistency=ssp --staleness=2 --optimizer=sgd --lr=0.05 --worker_timeout_s=10"


def psrun_argv(run_dir, servers=1, workers=2, extra=(), worker_flags=(), server_flags=TINY_SERVER,
               bin_dir_=None):
    return ([sys.executable, PSRUN, "--servers", str(servers), "--workers", str(workers),
             "--run_dir", run_dir, "--bin_dir", bin_dir_ or bin_dir(), "--grace", "3",
             "--start_timeout", "20", "--server_flags", server_flags, "--progress", "off"]
            + list(extra) + ["--"] + TINY_WORKER + list(worker_flags))


def start_psrun(argv, out_path):
    # Own session: the test can signal psrun alone, as a terminal's Ctrl-C would.
    with open(out_path, "wb") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)


def read_pids(run_dir, want=None, timeout=30):
    """pids.json once it lists `want` processes (or exists)."""
    path = os.path.join(run_dir, "pids.json")
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with open(path) as f:
                d = json.load(f)
            if want is None or len(d["procs"]) >= want:
                return d
        except (OSError, ValueError):
            pass
        time.sleep(0.1)
    raise AssertionError("pids.json with %s processes not written in %ds" % (want, timeout))


def pid_alive(pid):
    """True if `pid` exists and is not a zombie."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        return state != "Z"
    except OSError:
        return False


def group_alive(pgid):
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # Zombies still count for killpg; look for a live member.
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open("/proc/%s/stat" % entry) as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                if int(fields[2]) == pgid and fields[0] != "Z":
                    return True
            except OSError:
                continue
    return False


def wait_log(path, needle, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with open(path, errors="replace") as f:
                if needle in f.read():
                    return True
        except OSError:
            pass
        time.sleep(0.1)
    return False


def assert_no_orphans(tc, pids_doc):
    left = []
    for p in pids_doc["procs"]:
        if pid_alive(p["pid"]) or group_alive(p["pgid"]):
            left.append("%s pid %d" % (p["name"], p["pid"]))
    tc.assertEqual(left, [], "processes left running after psrun exited")


def kill_leftovers(pids_doc):
    """Cleanup after a failed assertion: only the PIDs psrun recorded."""
    for p in (pids_doc or {}).get("procs", []):
        try:
            os.killpg(p["pgid"], signal.SIGKILL)
        except (ProcessLookupError, PermissionError, TypeError):
            pass


def have_etcd_tls():
    """etcd, openssl and etcdctl installed (psrun --etcd_tls)."""
    from pslaunch import etcd, etcd_tls
    return etcd.etcd_available() and etcd_tls.tools_available()


def etcd_request(endpoint, path, doc, context=None, token=None, timeout=5):
    """POSTs `doc` (JSON) to etcd's v3 JSON gateway at endpoint + path (an
    https endpoint with ssl `context`). Returns (HTTP status, the answer's
    JSON or text); status None when the connection or the TLS handshake was
    refused."""
    import ssl
    import urllib.error
    import urllib.request
    headers = {"Authorization": token} if token else {}
    req = urllib.request.Request(endpoint + path, data=json.dumps(doc).encode(), headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=context) as r:
            status, body = r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        status, body = e.code, e.read().decode()
    except (OSError, ssl.SSLError, urllib.error.URLError) as e:
        return None, str(e)
    try:
        return status, json.loads(body)
    except ValueError:
        return status, body


def etcd_session(endpoint, security):
    """A function (path, doc) -> etcd_request(...) over TLS as
    etcd_tls.Security `security`'s user, signed in (its auth token)."""
    context = security.ssl_context()
    status, answer = etcd_request(endpoint, "/v3/auth/authenticate",
                                  {"name": security.user, "password": security.password()},
                                  context)
    if status != 200:
        raise AssertionError("etcd: %s could not sign in: %s %s" % (security.user, status, answer))
    return lambda path, doc: etcd_request(endpoint, path, doc, context, answer["token"])


def b64(text):
    import base64
    return base64.b64encode(text.encode()).decode()


def check_etcd_secured(tc, endpoint, tls_dir, prefix, secret=True):
    """The fleet's etcd at `endpoint` runs as psrun --etcd_tls makes it (its
    files in `tls_dir`, the fleet's keys under `prefix`): plain http, https
    without a client certificate, and a certificate without a user are
    refused; the asyncps-worker user reads <prefix>/elastic but cannot read
    <prefix>/secrets/g0 (which the asyncps-server user reads, when `secret`:
    a fleet without CURVE has one) nor the layout, nor write the layout.
    Reads only: nothing of a running fleet is changed."""
    import ssl
    from pslaunch import etcd_tls
    tc.assertTrue(endpoint.startswith("https://"), endpoint)
    layout = {"key": b64(prefix + "/layout")}
    status, why = etcd_request("http://" + endpoint[len("https://"):], "/v3/kv/range", layout)
    tc.assertIsNone(status, "plain http answered: %s" % why)
    server = etcd_tls.Security(tls_dir, etcd_tls.SERVER_USER)
    worker = etcd_tls.Security(tls_dir, etcd_tls.WORKER_USER)
    no_cert = ssl.create_default_context(cafile=server.ca_file)
    status, why = etcd_request(endpoint, "/v3/kv/range", layout, no_cert)
    tc.assertIsNone(status, "https without a client certificate answered: %s" % why)
    status, why = etcd_request(endpoint, "/v3/kv/range", layout, server.ssl_context())
    tc.assertEqual(status, 403, "a certificate without a user: %s" % why)
    as_server, as_worker = etcd_session(endpoint, server), etcd_session(endpoint, worker)
    status, answer = as_server("/v3/kv/range", layout)
    tc.assertEqual(status, 200, answer)
    tc.assertIn("kvs", answer, "no layout in etcd at %s/layout" % prefix)
    secret_key = {"key": b64(prefix + "/secrets/g0")}
    if secret:
        status, answer = as_server("/v3/kv/range", secret_key)
        tc.assertEqual((status, "kvs" in answer), (200, True), answer)
    for what, path, doc in (("read the replica secret", "/v3/kv/range", secret_key),
                            ("read the layout", "/v3/kv/range", layout),
                            ("write the layout", "/v3/kv/put",
                             dict(layout, value=b64("{}")))):
        status, answer = as_worker(path, doc)
        tc.assertEqual(status, 403, "asyncps-worker could %s: %s" % (what, answer))
    status, answer = as_worker("/v3/kv/range", {"key": b64(prefix + "/elastic")})
    tc.assertEqual(status, 200, answer)


def etcd_errors(log_paths, grace_s=2.0):
    """glog warnings and errors about etcd (or its TLS / authentication) in
    the logs, past each log's first `grace_s` seconds: [line]."""
    import re
    line_re = re.compile(r"^[WEF](\d{8} \d\d:\d\d:\d\d\.\d+) ")
    first_re = re.compile(r"^[IWEF](\d{8} \d\d:\d\d:\d\d\.\d+) ")
    words = re.compile(r"etcd|permission denied|unauthenticated|certificate|tls|ssl",
                       re.IGNORECASE)

    def when(stamp):
        day, clock = stamp.split()
        return time.mktime(time.strptime(day + " " + clock.split(".")[0], "%Y%m%d %H:%M:%S")) + \
            float("0." + clock.split(".")[1])

    found = []
    for path in log_paths:
        start = None
        with open(path, errors="replace") as f:
            for line in f:
                m = first_re.match(line)
                if m and start is None:
                    start = when(m.group(1))
                m = line_re.match(line)
                if m and words.search(line) and when(m.group(1)) - start > grace_s:
                    found.append("%s: %s" % (os.path.basename(path), line.rstrip()))
    return found


class LaunchTestCase(unittest.TestCase):
    needs_binaries = True

    @classmethod
    def setUpClass(cls):
        if cls.needs_binaries and not have_binaries():
            raise unittest.SkipTest("ps_server/ps_worker/ps_ctl not built in %s" % bin_dir())
        if cls.needs_binaries and not have_data():
            raise unittest.SkipTest("Fashion-MNIST not installed")

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="psrun-test-")
        self.run_dir = os.path.join(self.tmp.name, "run")

    def tearDown(self):
        self.tmp.cleanup()

    def output(self, name="psrun.out"):
        with open(os.path.join(self.tmp.name, name), errors="replace") as f:
            return f.read()


class FleetTestCase(LaunchTestCase):
    """A test that starts psrun in the background as self.psrun and reads its
    pids into self.pids: whatever is left running is killed afterwards."""

    def tearDown(self):
        if getattr(self, "psrun", None) and self.psrun.poll() is None:
            self.psrun.kill()
            self.psrun.wait()
        kill_leftovers(getattr(self, "pids", None))
        super().tearDown()


def main():
    """Runs the calling script's tests; exit 0, 1, or 77 when nothing could run
    (ctest SKIP_RETURN_CODE), skips printed as `SKIP: ...` (tests/unittest_main.py)."""
    unittest_main.main()
