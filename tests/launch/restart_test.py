#!/usr/bin/env python3
"""--max_restarts: a shard killed with SIGKILL mid-run comes back at the same
endpoint from its RocksDB store and training completes."""
import json
import os
import signal

import launch_test_util as u


class RestartTest(u.FleetTestCase):
    def test_killed_shard_restarts_and_training_completes(self):
        out = os.path.join(self.tmp.name, "psrun.out")
        argv = u.psrun_argv(self.run_dir, servers=2, workers=2, extra=["--max_restarts", "2"],
                            server_flags=u.TINY_SERVER + " --durable --checkpoint_every_s=1",
                            worker_flags=["--max_steps=400", "--slowdown=2"])
        self.psrun = u.start_psrun(argv, out)
        self.pids = u.read_pids(self.run_dir, want=4)
        self.assertTrue(u.wait_log(os.path.join(self.run_dir, "worker-0.log"), "step 30/"),
                        self.output())
        victim = [p for p in self.pids["procs"] if p["name"] == "server-0"][0]
        os.kill(victim["pid"], signal.SIGKILL)
        rc = self.psrun.wait(timeout=90)
        text = self.output()
        self.assertEqual(rc, 0, text)
        self.assertIn("server-0 killed by signal 9 (SIGKILL); restarting", text)
        with open(os.path.join(self.run_dir, "summary.json")) as f:
            s = json.load(f)
        self.assertEqual(s["restarts"], {"server-0": 1})
        self.assertEqual(s["totals"]["steps"], 800)
        self.assertGreater(s["totals"]["final_test_acc"], 0.5)
        after = u.read_pids(self.run_dir)
        new = [p for p in after["procs"] if p["name"] == "server-0"][0]
        self.assertNotEqual(new["pid"], victim["pid"])
        self.assertEqual(new["endpoint"], victim["endpoint"])  # same endpoint
        with open(os.path.join(self.run_dir, "server-0.log")) as f:
            log = f.read()
        self.assertIn("# psrun: restart 1 of 2, endpoint %s" % victim["endpoint"], log)
        u.assert_no_orphans(self, after)
        u.assert_no_orphans(self, self.pids)


if __name__ == "__main__":
    u.main()
