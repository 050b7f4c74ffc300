#!/usr/bin/env python3
"""Replicated shards with failover, for real (experiments/chaos/failover.py,
one repeat): psrun starts a local etcd and 2 shards x 2 replicas (each
group's primary hands every update to its backup before acknowledging it),
2 workers train; the primary of group 0 is killed with SIGKILL and its
RocksDB folder deleted while they train. Training must go on and finish, and
no acknowledged push may be lost: for every group, the pushes each surviving
replica applied equal the distinct pushes the workers' own logs
(--push_log) say were acknowledged. Exit 77 without etcd or the binaries."""
import os
import re
import signal
import sys
import time

import elastic_test
import launch_test_util as u

sys.path.insert(0, os.path.join(u.REPO, "experiments", "chaos"))
sys.path.insert(0, os.path.join(u.REPO, "launch"))
import failover  # noqa: E402

ETCD = "/usr/bin/etcd"


class ReplicationTest(elastic_test.ElasticRuns, u.LaunchTestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        if not os.access(ETCD, os.X_OK):
            raise u.unittest.SkipTest("etcd not installed (Debian's etcd-server)")

    def test_primary_killed_and_disk_deleted(self):
        rec = failover.run_once(u.bin_dir(), os.path.join(self.tmp.name, "f"))
        self.assertEqual(rec["rc"], 0, rec)
        self.assertTrue(rec["ok"], rec)
        self.assertGreater(rec["accuracy"], 0.6)
        self.assertEqual(len(rec["applied"]["0"]), 1, rec)  # the promoted backup
        self.assertEqual(len(rec["applied"]["1"]), 2, rec)  # primary and backup
        self.assertEqual(rec["lost"], 0, rec)
        self.assertEqual(rec["extra"], 0, rec)
        self.assertIsNotNone(rec["gap_s"], "no push acknowledged by group 0 after the kill")
        self.assertLess(rec["gap_s"], 10.0)
        u.note("launch.replication: 2 groups x 2 replicas, 2 workers, %s pushes acknowledged "
               "per group, all applied by every survivor; kill -9 of group 0's primary to its "
               "first acknowledged push: %.3f s; test accuracy %.4f" % (
                   rec["acked"], rec["gap_s"], rec["accuracy"]))

    def test_etcd_killed_and_restarted(self):
        """etcd gone for 3 s while 2 workers train: the groups go on with the
        layout they hold (each primary has its backup, whose refusal of a
        stale epoch is what fences it), no layout change happens, nothing
        acknowledged is lost; etcd comes back on its data dir and port."""
        from pslaunch import etcd as etcd_mod
        run_dir = os.path.join(self.tmp.name, "e")
        os.makedirs(run_dir)
        e = etcd_mod.start_local_etcd(run_dir)
        try:
            def outage():
                os.kill(e.pid, signal.SIGKILL)
                time.sleep(3.0)
                e2 = etcd_mod.start_local_etcd(run_dir, port=e.client_port,
                                               peer_port=e.peer_port)
                outage.etcd = e2
            try:
                rec = failover.run_once(u.bin_dir(), os.path.join(self.tmp.name, "f"),
                                        etcd=e.endpoints, disrupt=outage)
            except RuntimeError:
                with open(os.path.join(self.tmp.name, "f", "psrun.out")) as f:
                    print(f.read()[-3000:])  # why the fleet did not train
                raise
        finally:
            for h in (e, getattr(outage, "etcd", None)):
                if h is not None:
                    h.stop()
        self.assertEqual(rec["rc"], 0, rec)
        self.assertEqual(rec["lost"], 0, rec)
        self.assertEqual(rec["extra"], 0, rec)
        for g, ns in rec["applied"].items():
            self.assertEqual(len(ns), 2, rec)  # both replicas of every group
        self.assertEqual(rec["promotions"], 0, rec)
        u.note("launch.replication: etcd killed for 3 s while 2 workers trained: %s pushes "
               "acknowledged per group, no promotion, none lost" % rec["acked"])

    def test_overlap_stages_on_replicas_are_bitwise(self):
        """ps_worker --overlap --pipeline_shards=1 on 2 groups x 2 replicas
        (BSP, rounds handed on aggregated): a stage waits for receipts (a
        heartbeat right behind each push), not for the acknowledgements the
        primaries hold until the round's record reached the backups. The
        final weights are bitwise those of plain steps on unreplicated
        shards."""
        steps = 600
        over = self.elastic_psrun(
            "overlap_r2", None, backend=["--replicas", "2"], steps=steps,
            server_extra="--replicate_after_aggregation=true",
            worker_extra=["--overlap", "--pipeline_shards=1"])
        plain = self.elastic_psrun("plain_r1", None, steps=steps)
        self.assertEqual(self.weights(over), self.weights(plain),
                         "overlap stages on replicas changed the weights:\n"
                         + self.clues(over))
        waits = []
        for r in (0, 1):
            with open(os.path.join(over, "worker-%d.log" % r), errors="replace") as f:
                m = re.search(r"^OVERLAP .*stage_waits=(\d+)", f.read(), re.M)
            self.assertIsNotNone(m, "worker %d printed no OVERLAP line" % r)
            waits.append(int(m.group(1)))
        # One stage wait per step from the second on (2 shards, k=1).
        self.assertTrue(all(w >= steps - 1 for w in waits), waits)
        u.note("launch.replication: --overlap --pipeline_shards=1 on 2 groups x 2 replicas "
               "(BSP, aggregated), 2 workers x %d steps: final weights bitwise those of plain "
               "steps on 2 unreplicated shards; stage waits %s" % (steps, waits))


if __name__ == "__main__":
    u.main()
