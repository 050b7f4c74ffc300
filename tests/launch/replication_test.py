#!/usr/bin/env python3
"""Replicated shards with failover, for real: psrun starts a local etcd and 2
shards x 2 replicas (each group's primary hands every update to its backup
before acknowledging it), 2 workers train; the test SIGKILLs the primary of
group 0 and deletes its RocksDB folder while they train. Training must go on
and finish, and no acknowledged push may be lost: for every group, the
pushes its surviving replicas applied equal the distinct pushes the workers'
own logs (--push_log) say were acknowledged, and the two replicas of the
untouched group agree exactly. Exit 77 without etcd or the binaries."""
import json
import os
import shutil
import signal
import sys
import time

import launch_test_util as u

ETCD = "/usr/bin/etcd"


def read_push_logs(run_dir, workers):
    """{shard: set of (rank, incarnation, id) acknowledged} and
    {shard: [ack times in s]} from the workers' push logs."""
    acked, times = {}, {}
    for r in range(workers):
        inc = None
        with open(os.path.join(run_dir, "push-%d.log" % r)) as f:
            for line in f:
                w = line.split()
                if len(w) == 4 and w[0] == "incarnation":
                    inc = int(w[1])
                elif len(w) == 4 and w[0] == "acked":
                    s = int(w[1])
                    acked.setdefault(s, set()).add((r, inc, int(w[2])))
                    times.setdefault(s, []).append(int(w[3]) / 1e6)
    return acked, times


class ReplicationTest(u.LaunchTestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        if not os.access(ETCD, os.X_OK):
            raise u.unittest.SkipTest("etcd not installed (Debian's etcd-server)")

    def test_primary_killed_and_disk_deleted(self):
        workers = 2
        run_dir = os.path.join(self.tmp.name, "run")
        argv = u.psrun_argv(
            run_dir, servers=2, workers=workers,
            extra=["--replicas", "2", "--lease_ms", "1000"],
            server_flags="--consistency=asp --optimizer=sgd --lr=0.05 "
                         "--worker_timeout_s=20",
            worker_flags=["--epochs=3", "--log_every=200", "--attempt_timeout_ms=300",
                          "--push_log=" + os.path.join(run_dir, "push-{rank}.log")])
        # TINY_WORKER's --epochs=0 is overridden by the later --epochs=3.
        out = os.path.join(self.tmp.name, "psrun.out")
        self.proc = u.start_psrun(argv, out)
        pids = u.read_pids(run_dir, want=4 + workers, timeout=60)
        victim = [p for p in pids["procs"] if p.get("name") == "server-0-r0"][0]
        # Kill once the workers are well into training.
        deadline = time.time() + 90
        while time.time() < deadline:
            logs = [os.path.join(run_dir, "push-%d.log" % r) for r in range(workers)]
            if all(os.path.exists(p) and os.path.getsize(p) > 20000 for p in logs):
                break
            time.sleep(0.1)
        else:
            with open(out) as f:
                self.fail("workers did not start pushing: %s" % f.read()[-2000:])
        t_kill = time.time()
        os.kill(victim["pid"], signal.SIGKILL)
        shutil.rmtree(os.path.join(run_dir, "db", "server-0-r0"), ignore_errors=True)
        try:
            rc = self.proc.wait(timeout=240)
        except Exception:
            self.proc.kill()
            raise
        with open(out) as f:
            text = f.read()
        self.assertEqual(rc, 0, text[-3000:])
        with open(os.path.join(run_dir, "summary.json")) as f:
            summary = json.load(f)
        self.assertTrue(summary["ok"])
        self.assertIn("server-0-r0", summary["replicas_stopped"])
        self.assertGreater(summary["totals"]["final_test_acc"], 0.6)

        # Every acknowledged push is in the survivors, exactly once.
        acked, times = read_push_logs(run_dir, workers)
        with open(os.path.join(run_dir, "stats.json")) as f:
            stats = json.load(f)
        by_group = {}
        for sh in stats["shards"]:
            st = sh["stats"]
            by_group.setdefault(st["shard"], []).append(st)
        self.assertEqual(len(by_group[0]), 1)  # the promoted backup
        self.assertEqual(len(by_group[1]), 2)  # primary and backup
        for g, sts in by_group.items():
            for st in sts:
                self.assertEqual(st["pushes"], len(acked[g]),
                                 "group %d: a replica applied %d pushes, the workers saw %d "
                                 "acknowledged" % (g, st["pushes"], len(acked[g])))
        a, b = by_group[1]
        self.assertEqual(a["version"], b["version"])
        # The failover: first acknowledgement of group 0 after the kill.
        after = [t for t in times[0] if t > t_kill]
        self.assertTrue(after, "no push acknowledged by group 0 after the kill")
        gap = min(after) - t_kill
        self.assertLess(gap, 10.0)
        u.note("launch.replication: 2 groups x 2 replicas, %d workers, %d pushes acknowledged "
               "(group 0: %d, all applied by the promoted backup); kill -9 of group 0's primary "
               "to its first acknowledged push: %.3f s; test accuracy %.4f" % (
                   workers, sum(len(v) for v in acked.values()), len(acked[0]), gap,
                   summary["totals"]["final_test_acc"]))
        u.assert_no_orphans(self, u.read_pids(run_dir))


if __name__ == "__main__":
    u.main()
