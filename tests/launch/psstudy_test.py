#!/usr/bin/env python3
"""launch/psstudy end to end, with real psrun fleets (launch/psstudy_lib):
  - a 2-configuration study (bsp vs asp, tiny MLP, 2 seeds, a straggler):
    stopped with SIGTERM once its first run has finished, then run again: the
    finished run is skipped (resumed), every run ends ok, runs.csv has a row
    per configuration and seed, REPORT.md a comparison with a verdict, PNGs;
  - a worker script that crashes in one configuration: that run is recorded
    as failed with its log tail (runs.csv, REPORT.md) and the study goes on;
  - study files with a bad key or value: exit 2 naming the key (no binaries
    needed), and the grid's expansion and flags (unit);
  - --report_only over runs on disk, the study and its configurations named
    with backticked commands: none runs (gnuplot ran backticked text in the
    plots' titles and legends), the PNGs are written (needs gnuplot).
Exit 77 without the binaries or Fashion-MNIST (the fleet tests)."""
import csv
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import unittest

import launch_test_util as u

from psstudy_lib import execute, grid, plots, rankwrap

PSSTUDY = os.path.join(u.REPO, "launch", "psstudy")
MLP = os.path.join(u.REPO, "worker", "python", "examples", "mlp.py")
TINY = ("--layers=784,32,10 --batch=32 --epochs=0 --max_steps=40 --eval_every=10 "
        "--log_every=10 --threads=1 --timeout_s=30")


def write_study(path, doc):
    with open(path, "w") as f:
        f.write("# a psstudy test study\n" + json.dumps(doc, indent=1) + "\n")
    return path


def read(path):
    with open(path, errors="replace") as f:
        return f.read()


def rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


class GridTest(unittest.TestCase):
    """Study files: errors name the key; the expansion and flags."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="psstudy-test-")

    def tearDown(self):
        self.tmp.cleanup()

    def psstudy(self, doc):
        path = write_study(os.path.join(self.tmp.name, "s.json"), doc)
        return subprocess.run([sys.executable, PSSTUDY, path, "--out",
                               os.path.join(self.tmp.name, "out")],
                              capture_output=True, text=True, timeout=60)

    def test_bad_keys_are_named(self):
        cases = [({"grid": {"consistancy": ["bsp"]}}, "consistancy"),
                 ({"grid": {"consistency": ["ssp"]}}, "grid key 'consistency'"),
                 ({"grid": {"straggler": ["0.5"]}, "workers": 2}, "grid key 'straggler'"),
                 ({"grid": {"link": ["100mbit"]}}, "grid key 'link'"),
                 ({"grid": {"workers": [0]}}, "grid key 'workers'"),
                 ({"grid": {"codec": ["none", "none"]}}, "grid key 'codec'"),
                 ({"seeds": "1,2"}, "key 'seeds'"),
                 ({"wokers": 2}, "'wokers'"),
                 ({"overrides": [{"when": {"consistenc": "bsp"}}]}, "consistenc")]
        for doc, needle in cases:
            with self.subTest(doc=doc):
                r = self.psstudy(doc)
                self.assertEqual(r.returncode, 2, r.stderr)
                self.assertIn(needle, r.stderr)
                self.assertFalse(os.path.exists(os.path.join(self.tmp.name, "out")))

    def test_expansion_and_flags(self):
        s = grid.Study({"workers": 4, "server_flags": "--lr=0.1",
                        "grid": {"consistency": ["bsp", "ssp:4", "asp"],
                                 "codec": ["none", "topk:ratio=0.01,ef=1"],
                                 "straggler": ["3"]},
                        "overrides": [{"when": {"consistency": "bsp"},
                                       "server_flags": "--lr=0.4"}]})
        self.assertEqual(len(s.configs), 6)
        self.assertEqual(s.varying, ["consistency", "codec"])
        c = s.configs[0]
        self.assertEqual(c.server_flags(), ["--lr=0.1", "--consistency=bsp", "--lr=0.4"])
        self.assertEqual(s.configs[2].server_flags(),
                         ["--lr=0.1", "--consistency=ssp", "--staleness=4"])
        self.assertEqual(s.configs[1].worker_flags(7),
                         ["--codec=topk:ratio=0.01,ef=1", "--seed=7"])
        self.assertEqual(c.straggler, (3.0, 3))
        self.assertEqual(len({x.slug() for x in s.configs}), 6)

    def test_hosts_need_emulation(self):
        from psstudy_lib import cli
        s = grid.Study({"workers": 2, "link": "100mbit", "grid": {"hosts": [2, 4]}})
        with self.assertRaisesRegex(grid.GridError, "grid key 'hosts'.*no --emulate_hosts"):
            cli.check_hosts(s, "usage: psrun --servers S --workers W")
        cli.check_hosts(grid.Study({"workers": 2}), "")  # loopback only: nothing to check

    def test_committed_study_files_parse(self):
        for name in ("study_any", "sync_vs_async", "compression_study"):
            path = os.path.join(u.REPO, "experiments", name, "study.json")
            with self.subTest(path=path):
                s = grid.load(path)
                self.assertGreaterEqual(len(s.configs), 6)

    def test_rankwrap(self):
        env = {"ASYNCPS_RANK": "1", "ASYNCPS_SERVERS": "tcp://a:1", "ASYNCPS_NUM_WORKERS": "2",
               "ASYNCPS_METRICS_CSV": "/r/metrics-1.csv"}
        argv, e = rankwrap.wrapped_argv(["1", "3", "--slowdown={factor}", "--",
                                         "/b/ps_worker", "--epochs=1"], env)
        self.assertEqual(argv, ["/b/ps_worker", "--servers=tcp://a:1", "--rank=1",
                                "--num_workers=2", "--metrics_csv=/r/metrics-1.csv",
                                "--epochs=1", "--slowdown=3"])
        self.assertEqual(e["ASYNCPS_SLOWDOWN"], "3")
        argv, e = rankwrap.wrapped_argv(["0", "3", "", "--", "python3", "t.py"], env)
        self.assertEqual(argv, ["python3", "t.py"])
        self.assertNotIn("ASYNCPS_SLOWDOWN", e)


class ReportOnlyTest(unittest.TestCase):
    """--report_only: rewrites the report from the runs on disk, runs nothing."""

    def setUp(self):
        if not plots.have_gnuplot():
            self.skipTest("gnuplot not installed")
        self.tmp = tempfile.TemporaryDirectory(prefix="psstudy-test-")

    def tearDown(self):
        self.tmp.cleanup()

    def test_names_with_commands_run_nothing(self):
        d = self.tmp.name
        path = write_study(os.path.join(d, "s.json"), {
            "name": "s `touch %s/PWNED-name` $(touch %s/PWNED-name2)\n!touch %s/PWNED-name3"
                    % (d, d, d),
            "workers": 2, "seeds": [1, 2], "target": 0.5,
            "grid": {"worker_flags": ["--a=`touch %s/PWNED-cfg1`" % d,
                                      "--b=\"'.system(\\\"touch %s/PWNED-cfg2\\\").'\"" % d,
                                      "--c=\\\n!touch %s/PWNED-cfg3\n@foo" % d]}})
        out = os.path.join(d, "out")
        study = grid.load(path)
        for c in study.configs:
            for seed in study.seeds:
                rdir = execute.run_dir(out, c, seed)
                os.makedirs(rdir)
                row = {"final_test_acc": 0.6 + 0.01 * seed, "best_test_acc": 0.7,
                       "time_to_target_s": 2.0 + seed, "wall_s": 5.0, "bytes_wire": 1e6 * seed}
                curves = [{"rank": 0, "name": "test_acc", "wall_s": t, "step": 10 * t,
                           "value": 0.1 * t, "bytes_wire_est": 1e5 * t} for t in range(1, 6)]
                execute.write_result(rdir, {
                    "settings": c.settings(seed), "status": "ok", "exit_code": 0,
                    "wall_s_total": 5.0, "run_dir": os.path.relpath(rdir, out), "row": row,
                    "curves": curves})
        r = subprocess.run([sys.executable, PSSTUDY, path, "--out", out, "--report_only"],
                           capture_output=True, text=True, timeout=120)
        self.assertEqual(sorted(n for _, _, fs in os.walk(d) for n in fs
                                if n.startswith("PWNED")), [], "commands ran")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("6 finished on disk (skipped), 0 to run", r.stdout)
        for png in ("test_acc_vs_time.png", "test_acc_vs_bytes.png", "time_to_target.png",
                    "final_test_acc.png", "bytes_wire.png"):
            self.assertGreater(os.path.getsize(os.path.join(out, png)), 1000, png)
        self.assertIn("## Comparisons", read(os.path.join(out, "REPORT.md")))


class StudyTest(u.LaunchTestCase):
    def start(self, study_path, out, log_name):
        self.log_path = os.path.join(self.tmp.name, log_name)
        with open(self.log_path, "wb") as f:
            return subprocess.Popen([sys.executable, PSSTUDY, study_path, "--out", out,
                                     "--bin_dir", u.bin_dir()], stdout=f,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True)

    def test_quick_study_killed_and_resumed(self):
        path = write_study(os.path.join(self.tmp.name, "quick.json"), {
            "name": "quick", "workers": 2, "seeds": [1, 2], "target": 0.5,
            "server_flags": "--optimizer=sgd --lr=0.05 --worker_timeout_s=10",
            "worker_flags": TINY,
            "grid": {"consistency": ["bsp", "asp"], "straggler": ["2"]}})
        out = os.path.join(self.tmp.name, "out")
        p = self.start(path, out, "first.log")
        try:
            deadline = time.time() + 120
            while time.time() < deadline and p.poll() is None:
                if any(n == "result.json" for _, _, fs in os.walk(out) for n in fs):
                    break
                time.sleep(0.2)
            time.sleep(1.0)  # into the second run
            p.send_signal(signal.SIGTERM)
            rc = p.wait(60)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
        first = read(self.log_path)
        self.assertEqual(rc, 128 + signal.SIGTERM, first)
        self.assertIn("stopped by signal", first)
        finished = [os.path.join(d, "result.json") for d, _, fs in os.walk(out)
                    if "result.json" in fs]
        self.assertGreaterEqual(len(finished), 1, first)
        mtimes = {f: os.path.getmtime(f) for f in finished}

        p = self.start(path, out, "second.log")
        rc = p.wait(240)
        second = read(self.log_path)
        self.assertEqual(rc, 0, second)
        m = re.search(r"(\d+) finished on disk \(skipped\), (\d+) to run", second)
        self.assertTrue(m, second)
        self.assertEqual(int(m.group(1)), len(finished))
        self.assertEqual(int(m.group(1)) + int(m.group(2)), 4)
        for f, t in mtimes.items():
            self.assertEqual(os.path.getmtime(f), t, "%s was run again" % f)
        self.assertRegex(second, r"left \(\d+ s per run\)")

        rs = rows(os.path.join(out, "runs.csv"))
        self.assertEqual(len(rs), 4)
        self.assertEqual({r["status"] for r in rs}, {"ok"}, rs)
        self.assertEqual({r["consistency"] for r in rs}, {"bsp", "asp"})
        for r in rs:
            self.assertGreater(float(r["final_test_acc"]), 0.3)
            self.assertGreater(float(r["bytes_wire"]), 0)
        report = read(os.path.join(out, "REPORT.md"))
        self.assertRegex(report, r"consistency = asp vs bsp.*\n(  - .*\n)*  - final test_acc: "
                                 r".*difference [-+][0-9.]+ \[[-+][0-9.]+, [-+][0-9.]+\]: \*\*")
        for png in ("test_acc_vs_time.png", "time_to_target.png", "bytes_wire.png"):
            self.assertGreater(os.path.getsize(os.path.join(out, png)), 1000, png)
        curves = rows(os.path.join(out, "curves.csv"))
        self.assertTrue(any(c["name"] == "test_acc" for c in curves))
        # The straggler rank got the slowdown; psrun left nothing running.
        for d, _, fs in os.walk(out):
            if "worker-1.log" in fs:
                self.assertIn("--slowdown=2", read(os.path.join(d, "worker-1.log")))
        u.note("launch.psstudy: 2 configs x 2 seeds; killed after %d finished run(s), resumed"
               % len(finished))

    def test_crashing_script_is_recorded(self):
        script = os.path.join(self.tmp.name, "train.py")
        with open(script, "w") as f:
            f.write("import os, sys\n"
                    "if '--boom' in sys.argv:\n"
                    "    raise RuntimeError('boom: this worker script crashes on purpose')\n"
                    "os.execv(sys.executable, [sys.executable, %r] + sys.argv[1:])\n" % MLP)
        path = write_study(os.path.join(self.tmp.name, "crash.json"), {
            "name": "crash", "workers": 2, "seeds": [1],
            "worker_cmd": "%s %s" % (sys.executable, script),
            "server_flags": "--optimizer=sgd --lr=0.05 --worker_timeout_s=10",
            "worker_flags": "--batch=32 --max_steps=20 --eval_every=10 --log_every=10",
            "grid": {"worker_flags": ["--boom", ""]}})
        out = os.path.join(self.tmp.name, "out")
        p = self.start(path, out, "crash.log")
        rc = p.wait(240)
        log = read(self.log_path)
        self.assertEqual(rc, 0, log)
        rs = rows(os.path.join(out, "runs.csv"))
        self.assertEqual([r["status"] for r in rs], ["failed", "ok"], rs)
        self.assertIn("worker-", rs[0]["error"])
        report = read(os.path.join(out, "REPORT.md"))
        self.assertIn("boom: this worker script crashes on purpose", report)
        self.assertIn("1 ok, 1 failed", report)
        self.assertGreater(float(rs[1]["final_test_acc"]), 0.2)


if __name__ == "__main__":
    u.main()
