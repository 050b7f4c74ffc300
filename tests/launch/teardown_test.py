#!/usr/bin/env python3
"""Teardown: a killed worker or a Ctrl-C stops the whole fleet, no orphans remain."""
import os
import signal

import launch_test_util as u

LONG = ["--max_steps=100000", "--slowdown=2"]


class TeardownTest(u.FleetTestCase):
    def start_long_fleet(self):
        out = os.path.join(self.tmp.name, "psrun.out")
        self.psrun = u.start_psrun(u.psrun_argv(self.run_dir, servers=2, workers=2,
                                                worker_flags=LONG), out)
        self.pids = None
        self.pids = u.read_pids(self.run_dir, want=4)
        # Training is under way once a worker has logged progress.
        self.assertTrue(u.wait_log(os.path.join(self.run_dir, "worker-0.log"), "step 10/"),
                        self.output())

    def test_killed_worker_tears_down_fleet(self):
        self.start_long_fleet()
        victim = [p for p in self.pids["procs"] if p["name"] == "worker-1"][0]
        os.kill(victim["pid"], signal.SIGKILL)
        rc = self.psrun.wait(timeout=40)
        text = self.output()
        self.assertNotEqual(rc, 0, text)
        self.assertIn("FAILED worker-1", text)
        self.assertIn("killed by signal 9 (SIGKILL)", text)
        self.assertIn("worker-1.log", text)
        u.assert_no_orphans(self, self.pids)

    def test_sigint_tears_down_fleet(self):
        self.start_long_fleet()
        os.kill(self.psrun.pid, signal.SIGINT)
        rc = self.psrun.wait(timeout=40)
        text = self.output()
        self.assertEqual(rc, 128 + signal.SIGINT, text)
        self.assertIn("interrupted by SIGINT", text)
        u.assert_no_orphans(self, self.pids)

    def test_stubborn_process_gets_sigkill(self):
        # A worker that ignores SIGTERM: psrun must SIGKILL it after --grace.
        fake_bin = os.path.join(self.tmp.name, "bin")
        os.makedirs(fake_bin)
        for n in ("ps_server", "ps_ctl"):
            os.symlink(os.path.join(u.bin_dir(), n), os.path.join(fake_bin, n))
        with open(os.path.join(fake_bin, "ps_worker"), "w") as f:
            f.write("#!/bin/sh\ntrap '' TERM\necho stubborn worker $$\n"
                    "if echo \"$@\" | grep -q -- --rank=1; then sleep 1; exit 3; fi\n"
                    "sleep 1000 & wait; sleep 1000\n")
        os.chmod(os.path.join(fake_bin, "ps_worker"), 0o755)
        out = os.path.join(self.tmp.name, "psrun.out")
        self.psrun = u.start_psrun(u.psrun_argv(self.run_dir, workers=2, bin_dir_=fake_bin), out)
        rc = self.psrun.wait(timeout=40)
        self.pids = u.read_pids(self.run_dir)
        text = self.output()
        self.assertEqual(rc, 1, text)
        self.assertIn("FAILED worker-1: failed (exit code 3)", text)
        self.assertIn("SIGKILL", text)  # worker-0 ignored SIGTERM
        u.assert_no_orphans(self, self.pids)


if __name__ == "__main__":
    u.main()
