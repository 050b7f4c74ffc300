"""Shared helpers for the launcher tests (real processes, Python 3 stdlib)."""
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import unittest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))
PSRUN = os.path.join(REPO, "launch", "psrun")
sys.path.insert(0, os.path.join(REPO, "launch"))
sys.path.append(os.path.join(REPO, "tests"))
import unittest_main  # noqa: E402  (tests/, put on the path just above)
from unittest_main import SKIP, note  # noqa: E402,F401  (for the test scripts)


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
