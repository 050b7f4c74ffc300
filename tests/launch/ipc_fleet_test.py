#!/usr/bin/env python3
"""--transport ipc: shards bind Unix domain sockets in RUN_DIR/sock, workers and
psrun's ps_ctl reach them there, and a shard killed mid-run comes back at the
same socket (its stale file rebound) and training completes."""
import json
import os
import signal
import stat

import launch_test_util as u


class IpcFleetTest(u.FleetTestCase):
    def test_fleet_over_ipc_with_a_shard_restart(self):
        out = os.path.join(self.tmp.name, "psrun.out")
        argv = u.psrun_argv(self.run_dir, servers=2, workers=2,
                            extra=["--transport", "ipc", "--max_restarts", "1"],
                            server_flags=u.TINY_SERVER + " --durable --checkpoint_every_s=1",
                            worker_flags=["--max_steps=300", "--slowdown=2"])
        self.psrun = u.start_psrun(argv, out)
        self.pids = u.read_pids(self.run_dir, want=4)
        sock = os.path.join(self.run_dir, "sock")
        for p in self.pids["procs"]:
            if p["role"] == "server":
                self.assertEqual(p["endpoint"], "ipc://" + os.path.join(sock, p["name"]))
                self.assertTrue(stat.S_ISSOCK(os.stat(os.path.join(sock, p["name"])).st_mode))
        self.assertTrue(u.wait_log(os.path.join(self.run_dir, "worker-0.log"), "step 30/"),
                        self.output())
        with open(os.path.join(self.run_dir, "worker-1.log")) as f:
            self.assertIn("--servers=ipc://" + os.path.join(sock, "server-0") + ",ipc://",
                          f.read())
        victim = [p for p in self.pids["procs"] if p["name"] == "server-1"][0]
        os.kill(victim["pid"], signal.SIGKILL)  # leaves its socket file behind
        rc = self.psrun.wait(timeout=90)
        text = self.output()
        self.assertEqual(rc, 0, text)
        self.assertIn("server-1 killed by signal 9 (SIGKILL); restarting", text)
        with open(os.path.join(self.run_dir, "summary.json")) as f:
            s = json.load(f)
        self.assertEqual(s["restarts"], {"server-1": 1})
        self.assertEqual(s["endpoints"], ["ipc://" + os.path.join(sock, "server-%d" % i)
                                          for i in range(2)])
        self.assertEqual(s["totals"]["steps"], 600)
        self.assertGreater(s["totals"]["final_test_acc"], 0.5)
        with open(os.path.join(self.run_dir, "stats.json")) as f:
            shards = json.load(f)["shards"]
        self.assertEqual(len(shards), 2)
        # Pulls went through the workers' shared memory (psrun turns it on
        # with ipc), on the restarted shard too (the workers re-attached).
        for sh in shards:
            self.assertGreater(sh["stats"]["shm_bytes_out"], 0, sh["endpoint"])
        with open(os.path.join(self.run_dir, "worker-1.log")) as f:
            self.assertIn("--shared_memory_mb=1024", f.read())
        after = u.read_pids(self.run_dir)
        new = [p for p in after["procs"] if p["name"] == "server-1"][0]
        self.assertNotEqual(new["pid"], victim["pid"])
        self.assertEqual(new["endpoint"], victim["endpoint"])
        u.assert_no_orphans(self, after)
        u.assert_no_orphans(self, self.pids)
        self.assertEqual(os.listdir(sock), [])  # socket files removed


if __name__ == "__main__":
    u.main()
