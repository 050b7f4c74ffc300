#!/usr/bin/env python3
"""psrun --elastic on emulated hosts (--emulate_hosts 2): 2 -> 3 -> 2 shards
while 2 ps_workers train the MLP under BSP, as launch.elastic does on the
local backend. Shards 0 and 1 on hosts h0 and h1 (workers 0 and 1 after
them), psrun's etcd in the hub namespace on its address (the shards ask it
through --elastic_etcd), psrun's ps_ctl from the hub. The added shard 2 runs
on a new emulated host h2 of its own (its namespace on the same bridge, at
10.213.0.3); then shard 0 is removed (its chunks moved off, `ps_ctl
shutdown`, SIGTERM by PID if that fails). Checked: both steps' reports
(elastic_test.ElasticRuns.check_steps), where each process ran (pids.json),
the final weights bitwise those of a fixed 2-shard run on 2 emulated hosts,
no process of either run alive and no namespace left after psrun exits.
Then the same plan with replica groups (--replicas 2): the group that joins
runs its two members on two new hosts (h2, h3), group 0 (both members)
leaves, and the final weights are again bitwise the fixed run's.
Exit 77 without root, ip, tc, etcd or the binaries."""
import os
import time
import unittest

import elastic_test
import launch_test_util as u

from pslaunch import netns

PLAN = elastic_test.PLAN  # "+1@3s,-#0@6s"
BACKEND = ["--emulate_hosts", "2"]


class ElasticHostsTest(elastic_test.ElasticRuns, u.LaunchTestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        if not os.access(elastic_test.ETCD, os.X_OK):
            raise unittest.SkipTest("etcd not installed (Debian's etcd-server)")
        why = netns.unavailable("psel%d-probe" % os.getpid())
        if why:
            raise unittest.SkipTest(why)

    def assert_gone(self, run_dir, procs):
        """pids.json lists `procs` processes; none alive, no namespace of that
        psrun left."""
        doc = u.read_pids(run_dir)
        self.assertEqual(len(doc["procs"]), procs, doc)
        for p in doc["procs"]:
            self.assertFalse(u.pid_alive(p["pid"]), p)
        self.assertEqual(netns.list_namespaces("psrun%d-" % doc["psrun_pid"]), [],
                         "namespaces left after psrun exited")
        return doc

    def test_two_three_two_on_emulated_hosts(self):
        t0 = time.monotonic()
        elastic = self.elastic_psrun("elastic", PLAN, BACKEND)
        t1 = time.monotonic()
        fixed = self.elastic_psrun("fixed", None, BACKEND)
        t2 = time.monotonic()
        add, remove, steps = self.check_steps(elastic, [[0, 1, 2], [1, 2]])
        self.assertEqual((steps[0]["shard"], steps[1]["shard"]), (2, 0), steps)
        self.assertTrue(steps[0]["endpoint"].startswith("tcp://10.213.0.3:"), steps[0])
        doc = self.assert_gone(elastic, 5)
        where = {p["name"]: p["emulated_host"] for p in doc["procs"]}
        self.assertEqual(where, {"server-0": "h0", "server-1": "h1", "server-2": "h2",
                                 "worker-0": "h0", "worker-1": "h1"})
        tag = "psrun%d" % doc["psrun_pid"]
        self.assertEqual({p["name"]: p["netns"] for p in doc["procs"]}["server-2"],
                         tag + "-h2")
        with open(os.path.join(elastic, "server-2.log")) as f:
            self.assertIn("emulated host h2 (namespace %s-h2, 10.213.0.3)" % tag, f.read())
        # Shard 0 left while the workers trained: `ps_ctl shutdown` ended it (exit 0,
        # its last line written before the workers' last).
        log0 = os.path.join(elastic, "server-0.log")
        with open(log0) as f:
            self.assertIn("ps_server shard 0 exited cleanly", f.read())
        self.assertLess(os.path.getmtime(log0),
                        os.path.getmtime(os.path.join(elastic, "worker-0.log")))
        with open(os.path.join(elastic, "etcd", "etcd.log")) as f:
            self.assertIn("10.213.0.254", f.read())  # etcd in the hub, not on 127.0.0.1
        with open(os.path.join(elastic, "flags", "psrun.cmdline")) as f:
            self.assertIn("--emulate_hosts", f.read())
        self.assert_gone(fixed, 4)
        self.assert_same_weights(elastic, fixed, "launch.elastic_hosts")
        u.note("launch.elastic_hosts: --emulate_hosts 2 --elastic '%s': 2 -> 3 -> 2 shards "
               "(shard 2 on new host h2, %s; %d chunks / %.2f MiB moved on, %d moved off "
               "shard 0), 2 ps_workers x %d steps under BSP; final weights bitwise equal to a "
               "fixed 2-shard run's on 2 emulated hosts; %.1f s elastic run, %.1f s fixed" % (
                   PLAN, steps[0]["endpoint"], add["moved_chunks"], add["moved_bytes"] / 2**20,
                   remove["moved_chunks"], elastic_test.STEPS, t1 - t0, t2 - t1))

        # Replica groups: group 2's members on two new hosts of their own.
        t3 = time.monotonic()
        groups = self.elastic_psrun("elastic_replicas", PLAN, BACKEND + ["--replicas", "2"])
        t4 = time.monotonic()
        add, remove, steps = self.check_steps(groups, [[0, 1, 2], [1, 2]])
        members = steps[0]["endpoint"].split("|")
        self.assertEqual(sorted(e.rsplit(":", 1)[0] for e in members),
                         ["tcp://10.213.0.3", "tcp://10.213.0.4"], steps[0])
        self.assertEqual(steps[1]["endpoint"].count("|"), 1, steps[1])
        doc = self.assert_gone(groups, 8)
        where = {p["name"]: p["emulated_host"] for p in doc["procs"]}
        self.assertEqual(sorted(where[n] for n in ("server-2-r0", "server-2-r1")),
                         ["h2", "h3"], where)
        for n in ("server-0-r0", "server-0-r1"):
            with open(os.path.join(groups, n + ".log")) as f:
                self.assertIn("exited cleanly", f.read(), n)
        self.assert_same_weights(groups, fixed, "launch.elastic_hosts-replicas")
        u.note("launch.elastic_hosts: the same plan with --replicas 2: group 2 on new hosts "
               "(%s), group 0 left (%d chunks moved off); final weights bitwise equal to the "
               "fixed run's; %.1f s" % (steps[0]["endpoint"], remove["moved_chunks"], t4 - t3))


if __name__ == "__main__":
    u.main()
