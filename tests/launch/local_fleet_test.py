#!/usr/bin/env python3
"""A tiny local fleet through psrun: 2 shards, 2 workers, a few dozen steps."""
import json
import os
import subprocess
import sys

import launch_test_util as u


class LocalFleetTest(u.LaunchTestCase):
    def test_tiny_fleet(self):
        out = os.path.join(self.tmp.name, "psrun.out")
        cfg = os.path.join(self.tmp.name, "exp.flags")
        with open(cfg, "w") as f:
            f.write("[psrun]\n--servers=2\n[server]\n--optimizer=momentum\n"
                    "[worker]\n--batch=32\nworker: --seed=7\n")
        argv = [sys.executable, u.PSRUN, "--config", cfg, "--workers", "2", "--run_dir",
                self.run_dir, "--bin_dir", u.bin_dir(), "--server_flags", u.TINY_SERVER,
                "--progress", "on", "--"] + u.TINY_WORKER + ["--max_steps=40"]
        with open(out, "wb") as f:
            rc = subprocess.run(argv, stdout=f, stderr=subprocess.STDOUT, timeout=90).returncode
        text = self.output()
        self.assertEqual(rc, 0, text)
        self.assertIn("final test accuracy", text)
        self.assertIn("steps", text)  # progress display
        with open(os.path.join(self.run_dir, "summary.json")) as f:
            s = json.load(f)
        self.assertTrue(s["ok"])
        self.assertEqual(s["servers"], 2)  # from the config's [psrun] section
        self.assertEqual(len(s["endpoints"]), 2)
        t = s["totals"]
        self.assertEqual(t["workers_reported"], 2)
        self.assertEqual(t["steps"], 80)
        self.assertGreater(t["final_test_acc"], 0.3)
        self.assertGreater(t["samples_per_s"], 0)
        self.assertGreater(t["bytes_pushed_raw"], 0)
        self.assertAlmostEqual(t["compression_ratio"], 1.0, places=1)
        # Logs start with the command line and the flag file; flag files kept.
        for name in ("server-0", "server-1", "worker-0", "worker-1"):
            with open(os.path.join(self.run_dir, name + ".log")) as f:
                head = f.read(4096)
            self.assertTrue(head.startswith("# psrun: %s started" % name), head[:200])
            self.assertIn("# psrun: command: ", head)
        with open(os.path.join(self.run_dir, "worker-1.log")) as f:
            w1 = f.read()
        self.assertIn("--rank=1", w1)
        self.assertIn("--num_workers=2", w1)
        self.assertIn("SUMMARY rank=1", w1)
        for name in ("config.flags", "server.flags", "worker.flags"):
            self.assertTrue(os.path.exists(os.path.join(self.run_dir, "flags", name)), name)
        with open(os.path.join(self.run_dir, "flags", "server.flags")) as f:
            self.assertIn("--optimizer=momentum", f.read())
        with open(os.path.join(self.run_dir, "flags", "worker.flags")) as f:
            wf = f.read()
        self.assertIn("--batch=32", wf)
        self.assertIn("--seed=7", wf)
        for r in (0, 1):
            with open(os.path.join(self.run_dir, "metrics-%d.csv" % r)) as f:
                self.assertTrue(f.readline().startswith("wall_s,rank,step"))
        self.assertTrue(os.path.isdir(os.path.join(self.run_dir, "db", "server-1")))
        with open(os.path.join(self.run_dir, "stats.json")) as f:
            self.assertEqual(len(json.load(f)["shards"]), 2)
        u.assert_no_orphans(self, u.read_pids(self.run_dir))


if __name__ == "__main__":
    u.main()
