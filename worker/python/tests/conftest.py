"""Fixtures for the asyncps Python tests: real ps_server processes on
127.0.0.1 (ephemeral ports), real Fashion-MNIST, the C++ cross-check helper.
Binaries come from $ASYNCPS_BIN_DIR (ctest sets it) or build/bin."""
import os
import subprocess
import sys
import threading
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
EXAMPLES = os.path.join(REPO, "worker", "python", "examples")
DATA = "/usr/share/datasets/fashion-mnist"


def bin_dir():
    return os.path.abspath(os.environ.get("ASYNCPS_BIN_DIR") or os.path.join(REPO, "build", "bin"))


def binary(name):
    path = os.path.join(bin_dir(), name)
    if not os.access(path, os.X_OK):
        pytest.skip("%s not built in %s" % (name, bin_dir()))
    return path


class Shard:
    """One ps_server process; stop() ends it (only it)."""

    def __init__(self, tmp, flags=(), name="shard", shard_id=0, num_shards=1, num_workers=1,
                 endpoint="tcp://127.0.0.1:0"):
        self.ready = os.path.join(str(tmp), "%s-%d.ready" % (name, time.monotonic_ns()))
        self.log_path = os.path.join(str(tmp), "%s.log" % name)
        self.argv = [binary("ps_server"), "--endpoint=" + endpoint, "--ready_file=" + self.ready,
                     "--shard_id=%d" % shard_id, "--num_shards=%d" % num_shards,
                     "--num_workers=%d" % num_workers, "--checkpoint_every_s=0"] + list(flags)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL)
        deadline = time.time() + 20
        while time.time() < deadline:
            if os.path.exists(self.ready):
                with open(self.ready) as f:
                    ep = f.read().strip()
                if ep:
                    self.endpoint = ep
                    return
            if self.proc.poll() is not None:
                raise RuntimeError("ps_server exited: " + open(self.log_path).read()[-2000:])
            time.sleep(0.01)
        self.stop()
        raise RuntimeError("ps_server not ready")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def shards(tmp_path):
    """shards(n=1, flags=...) -> list of running Shard; all stopped at the end."""
    started = []

    def make(n=1, flags=(), num_workers=1):
        group = [Shard(tmp_path, flags, "shard%d-%d" % (len(started), i), i, n, num_workers)
                 for i in range(n)]
        started.extend(group)
        return group

    yield make
    for s in started:
        s.stop()


def endpoints(group):
    return [s.endpoint for s in group]


def on_threads(n, fn, timeout=120):
    """fn(r) for r in range(n), each on its own thread; returns their results
    and raises the first exception one of them raised."""
    out, errors = [None] * n, []

    def run(r):
        try:
            out[r] = fn(r)
        except Exception as e:  # noqa: BLE001 (raised below)
            errors.append(e)

    threads = [threading.Thread(target=run, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    if errors:
        raise errors[0]
    return out


def need_data():
    if not os.path.exists(DATA):
        pytest.skip("dataset-fashion-mnist not installed")


# ctest runs one pytest per file: a file where nothing ran exits 77, which ctest
# (SKIP_RETURN_CODE) shows as Skipped, not Passed; every skip is printed as
# `SKIP: <test>: <reason>` for run_tests.sh's skip report (as
# tests/unittest_main.py does for the unittest scripts).
def pytest_terminal_summary(terminalreporter):
    for rep in terminalreporter.stats.get("skipped", []):
        reason = rep.longrepr[2] if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
        terminalreporter.write_line("SKIP: %s: %s" % (rep.nodeid,
                                                       reason.replace("Skipped: ", "", 1)))


def pytest_sessionfinish(session, exitstatus):
    rep = session.config.pluginmanager.get_plugin("terminalreporter")
    stats = rep.stats if rep else {}
    if exitstatus == 0 and stats.get("skipped") and not stats.get("passed"):
        session.exitstatus = 77


def python_env():
    """Environment for child Python processes: this package on the path."""
    env = dict(os.environ)
    pkg = os.path.dirname(os.path.dirname(sys.modules["asyncps"].__file__))
    env["PYTHONPATH"] = pkg + (":" + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["ASYNCPS_BIN_DIR"] = bin_dir()
    return env


import asyncps  # noqa: E402  (after the helpers: a missing build fails loudly here)
