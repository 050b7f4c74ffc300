#!/usr/bin/env python3
"""psrun --prometheus with a real Prometheus: a short fleet (1 shard, 2 ps_worker ranks)
is scraped while it trains; every process's exposition passes `promtool check metrics`;
afterwards Prometheus, started again on the run's stored data, answers queries whose
values agree with `ps_ctl stats` (stats.json) and the metrics CSVs, and every query of
the Grafana dashboard runs."""
import json
import os
import shutil
import subprocess
import time
import urllib.request

import launch_test_util as u

from pslaunch import monitoring
import make_dashboard  # launch/monitoring (PYTHONPATH: tests/launch/CMakeLists.txt)

PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"


def scrape(target):
    with urllib.request.urlopen("http://%s/metrics" % target, timeout=5) as r:
        return r.read().decode()


def value(result):
    """The single sample of an instant-vector query result."""
    assert len(result["result"]) == 1, result
    return float(result["result"][0]["value"][1])


class MonitoringTest(u.LaunchTestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        if not (os.path.exists(monitoring.PROMETHEUS_BIN) and os.path.exists(PROMTOOL)):
            raise u.unittest.SkipTest("Debian's prometheus package is not installed")

    def test_prometheus_scrapes_the_fleet(self):
        out = os.path.join(self.tmp.name, "psrun.out")
        argv = u.psrun_argv(self.run_dir, servers=1, workers=2,
                            extra=["--prometheus", "--scrape_interval", "0.5"],
                            worker_flags=["--max_steps=600", "--slowdown=3", "--eval_every=200"])
        proc = u.start_psrun(argv, out)
        pids = None
        try:
            # While it runs: every target appears and its exposition is valid.
            targets_file = os.path.join(self.run_dir, "metrics", "targets.json")
            checked = set()
            deadline = time.time() + 90
            while len(checked) < 3 and time.time() < deadline and proc.poll() is None:
                try:
                    with open(targets_file) as f:
                        groups = json.load(f)
                except (OSError, ValueError):
                    groups = []
                for g in groups:
                    name = g["labels"]["instance_name"]
                    if name in checked:
                        continue
                    text = scrape(g["targets"][0])
                    r = subprocess.run([PROMTOOL, "check", "metrics"], input=text.encode(),
                                       capture_output=True, timeout=30)
                    self.assertEqual(r.returncode, 0, "%s: %s" % (name, r.stdout + r.stderr))
                    self.assertEqual((r.stdout + r.stderr).strip(), b"", name)
                    prefix = "asyncps_shard_" if g["labels"]["job"] == "asyncps_server" else \
                        "asyncps_worker_"
                    self.assertIn(prefix, text)
                    checked.add(name)
                time.sleep(0.2)
            self.assertEqual(checked, {"server-0", "worker-0", "worker-1"}, self.output())
            rc = proc.wait(timeout=180)
            pids = u.read_pids(self.run_dir)
            self.assertEqual(rc, 0, self.output())
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            u.kill_leftovers(pids)
        text = self.output()
        self.assertIn("prometheus data", text)
        with open(os.path.join(self.run_dir, "summary.json")) as f:
            summary = json.load(f)
        self.assertIn("prometheus_data", summary["monitoring"])
        with open(os.path.join(self.run_dir, "stats.json")) as f:
            stats = json.load(f)["shards"][0]["stats"]

        # The stored data, served again as launch/psmon does.
        config = os.path.join(self.tmp.name, "view.yml")
        monitoring.write_json_atomic(config, {"global": {"scrape_interval": "1m"},
                                              "scrape_configs": []})
        prom = monitoring.Prometheus(config, os.path.join(self.run_dir, "prometheus", "data"),
                                     os.path.join(self.tmp.name, "view.log"))
        prom.start()
        try:
            now = time.time()
            last = lambda expr: value(prom.query("max_over_time(%s[10m])" % expr, at=now))
            # Counts equal where they count the same thing.
            self.assertEqual(last("asyncps_shard_staleness_count"),
                             stats["staleness"]["count"])
            self.assertEqual(last("asyncps_shard_pushes_total"), stats["pushes"])
            self.assertEqual(stats["rejected_total"], 0)
            self.assertEqual(last("asyncps_shard_requests_total{kind=\"push\"}"),
                             stats["pushes"] + stats["duplicate_pushes"])
            self.assertEqual(last("asyncps_shard_worker_clock{rank=\"1\"}"),
                             stats["worker_clocks"][1])
            for rank in (0, 1):
                with open(os.path.join(self.run_dir, "metrics-%d.csv" % rank)) as f:
                    rows = [l.split(",") for l in f.read().splitlines()[1:]]
                self.assertEqual(last("asyncps_worker_steps_total{rank=\"%d\"}" % rank),
                                 float(rows[-1][2]))  # CSV column `step`
                self.assertEqual(last("asyncps_worker_samples_total{rank=\"%d\"}" % rank),
                                 float(rows[-1][4]))  # CSV column `samples`
                self.assertEqual(last("asyncps_worker_pushed_bytes_total{rank=\"%d\","
                                      "kind=\"raw\"}" % rank), float(rows[-1][7]))
                loss = last("asyncps_worker_train_loss{rank=\"%d\"}" % rank)
                self.assertTrue(0 < loss < 3, loss)
            acc = last("asyncps_worker_test_accuracy{rank=\"0\"}")
            self.assertAlmostEqual(acc, summary["per_worker"]["0"]["final_test_acc"], places=3)
            # The shard's push rate was seen while the fleet ran.
            rate = value(prom.query("max_over_time(rate(asyncps_shard_pushes_total[2s])[10m:500ms])",
                                    at=now))
            self.assertGreater(rate, 1)
            quantile = prom.query("max_over_time(histogram_quantile(0.99, sum by (le) "
                                  "(rate(asyncps_shard_staleness_bucket[5s])))[10m:1s])", at=now)
            self.assertGreaterEqual(value(quantile), 0)
            # Every dashboard query parses and runs against the real data.
            for expr in make_dashboard.queries(make_dashboard.dashboard()):
                prom.query("max_over_time((%s)[10m:1s])" % expr, at=now)
            # The committed dashboard is the generated one.
            with open(os.path.join(u.REPO, "launch", "monitoring",
                                   "asyncps-dashboard.json")) as f:
                self.assertEqual(json.load(f), make_dashboard.dashboard())
        finally:
            prom.stop()

    def test_metrics_without_prometheus_writes_targets(self):
        out = os.path.join(self.tmp.name, "psrun.out")
        argv = u.psrun_argv(self.run_dir, servers=2, workers=1, extra=["--metrics"],
                            worker_flags=["--max_steps=30"])
        with open(out, "wb") as f:
            rc = subprocess.run(argv, stdout=f, stderr=subprocess.STDOUT, timeout=120).returncode
        self.assertEqual(rc, 0, self.output())
        with open(os.path.join(self.run_dir, "metrics", "targets.json")) as f:
            groups = json.load(f)
        labels = sorted((g["labels"]["job"], g["labels"].get("shard", g["labels"].get("rank")))
                        for g in groups)
        self.assertEqual(labels, [("asyncps_server", "0"), ("asyncps_server", "1"),
                                  ("asyncps_worker", "0")])
        for g in groups:
            host, port = g["targets"][0].rsplit(":", 1)
            self.assertEqual(host, "127.0.0.1")
            self.assertTrue(0 < int(port) < 65536)
        self.assertFalse(os.path.exists(os.path.join(self.run_dir, "prometheus")))


if __name__ == "__main__":
    u.main()
