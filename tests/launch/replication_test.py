#!/usr/bin/env python3
"""Replicated shards with failover, for real (experiments/chaos/failover.py,
one repeat): psrun starts a local etcd and 2 shards x 2 replicas (each
group's primary hands every update to its backup before acknowledging it),
2 workers train; the primary of group 0 is killed with SIGKILL and its
RocksDB folder deleted while they train. Training must go on and finish, and
no acknowledged push may be lost: for every group, the pushes each surviving
replica applied equal the distinct pushes the workers' own logs
(--push_log) say were acknowledged. Every fleet's etcd runs as a secured
deployment runs it (psrun --etcd_tls on, or auto with CurveZMQ keys; an etcd
of the test's own with the same certificates and users for --etcd): checked
while the fleet trains (plain http and a missing client certificate refused,
the workers' user reads neither the replica secret nor the layout and cannot
write it) and in the shards' logs (no etcd errors past their start). Exit 77
without etcd, openssl, etcdctl or the binaries."""
import os
import re
import signal
import subprocess
import time

import json

import elastic_test
import launch_test_util as u

import failover  # experiments/chaos (PYTHONPATH: tests/launch/CMakeLists.txt)

ETCD = "/usr/bin/etcd"


class ReplicationTest(elastic_test.ElasticRuns, u.LaunchTestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        if not os.access(ETCD, os.X_OK):
            raise u.unittest.SkipTest("etcd not installed (Debian's etcd-server)")
        if not u.have_etcd_tls():
            raise u.unittest.SkipTest("openssl / etcdctl not installed (Debian's openssl, "
                                      "etcd-client)")

    def assert_no_etcd_errors(self, run_dir):
        logs = sorted(os.path.join(run_dir, n) for n in os.listdir(run_dir)
                      if n.startswith("server-") and n.endswith(".log"))
        self.assertTrue(logs, run_dir)
        self.assertEqual(u.etcd_errors(logs), [], "etcd errors in the shards' logs")

    def test_primary_killed_and_disk_deleted(self):
        checked = []

        def check_etcd(fleet):
            with open(os.path.join(self.tmp.name, "f", "psrun.out")) as f:
                m = re.search(r"local etcd at (https://\S+)", f.read())
            self.assertIsNotNone(m, "psrun started no etcd with TLS")
            u.check_etcd_secured(self, m.group(1), os.path.join(fleet, "etcd", "tls"),
                                 "/asyncps/run")
            checked.append(m.group(1))

        rec = failover.run_once(u.bin_dir(), os.path.join(self.tmp.name, "f"),
                                psrun_args=["--etcd_tls", "on"], on_training=check_etcd)
        self.assertEqual(len(checked), 1)
        self.assertEqual(rec["rc"], 0, rec)
        self.assertTrue(rec["ok"], rec)
        self.assertGreater(rec["accuracy"], 0.6)
        self.assertEqual(len(rec["applied"]["0"]), 1, rec)  # the promoted backup
        self.assertEqual(len(rec["applied"]["1"]), 2, rec)  # primary and backup
        self.assertEqual(rec["lost"], 0, rec)
        self.assertEqual(rec["extra"], 0, rec)
        self.assertIsNotNone(rec["gap_s"], "no push acknowledged by group 0 after the kill")
        self.assertLess(rec["gap_s"], 10.0)
        self.assert_no_etcd_errors(os.path.join(self.tmp.name, "f", "run"))
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
        # An etcd of the test's own (psrun --etcd) with TLS and users, whose
        # credentials go to the shards (and psrun's ps_ctl) through
        # --server_flags; started again on its data dir, it keeps its
        # certificates and users.
        prefix = "/asyncps/run"
        e = etcd_mod.start_local_etcd(run_dir, tls_prefix=prefix)
        tls_dir = os.path.join(run_dir, "etcd", "tls")
        with open(os.path.join(tls_dir, "ca.pem")) as f:
            ca = f.read()
        try:
            def outage():
                os.kill(e.pid, signal.SIGKILL)
                time.sleep(3.0)
                e2 = etcd_mod.start_local_etcd(run_dir, port=e.client_port,
                                               peer_port=e.peer_port, tls_prefix=prefix)
                outage.etcd = e2
            try:
                rec = failover.run_once(u.bin_dir(), os.path.join(self.tmp.name, "f"),
                                        etcd=e.endpoints, disrupt=outage,
                                        server_extra=" ".join(e.security.etcd_flags()))
            except RuntimeError:
                with open(os.path.join(self.tmp.name, "f", "psrun.out")) as f:
                    print(f.read()[-3000:])  # why the fleet did not train
                raise
            with open(os.path.join(tls_dir, "ca.pem")) as f:
                self.assertEqual(f.read(), ca, "the restart made new certificates")
            u.check_etcd_secured(self, outage.etcd.endpoints, tls_dir, prefix)
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
            "overlap_r2", None, backend=["--replicas", "2", "--etcd_tls", "on"], steps=steps,
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
        self.assert_no_etcd_errors(over)
        u.note("launch.replication: --overlap --pipeline_shards=1 on 2 groups x 2 replicas "
               "(BSP, aggregated), 2 workers x %d steps: final weights bitwise those of plain "
               "steps on 2 unreplicated shards; stage waits %s" % (steps, waits))

    def test_curve_fleet_gets_an_etcd_with_tls_and_auth(self):
        """A fleet with CurveZMQ keys (ps_ctl keygen: the shards', the
        workers', an admin key for psrun's ps_ctl) and --replicas 2 gets its
        etcd with TLS and authentication by default (--etcd_tls auto): the
        shards sign in as asyncps-server, each group has its primary, the
        workers train, psrun's ps_ctl (the admin key through --ctl_flags)
        reads the stats and shuts the shards down."""
        keys = os.path.join(self.tmp.name, "keys")
        os.makedirs(keys)
        for name in ("server", "worker", "admin"):
            subprocess.run([os.path.join(u.bin_dir(), "ps_ctl"), "keygen",
                            "--out=" + os.path.join(keys, name)], check=True,
                           capture_output=True)
        k = lambda name: os.path.join(keys, name)  # noqa: E731
        with open(k("clients.pub"), "w") as out:
            for name in ("worker.pub", "admin.pub"):
                with open(k(name)) as f:
                    out.write(f.read())
        steps = 300
        t0 = time.monotonic()
        run = self.elastic_psrun(
            "curve_r2", None, steps=steps,
            backend=["--replicas", "2", "--ctl_flags", "--curve_secret_key=" + k("admin.key")],
            server_extra="--curve_secret_key=%s --curve_allowed_clients=%s "
                         "--curve_admin_clients=%s" % (k("server.key"), k("clients.pub"),
                                                       k("admin.pub")),
            worker_extra=["--curve_server_key=" + k("server.pub"),
                          "--curve_secret_key=" + k("worker.key")])
        wall = time.monotonic() - t0
        with open(os.path.join(run, "server-0-r1.log"), errors="replace") as f:
            log = f.read()
        self.assertIn("--etcd=https://127.0.0.1:", log)
        self.assertIn("--etcd_user=asyncps-server", log)
        self.assertIn("CURVE on", log)
        with open(os.path.join(run, "flags", "psrun.cmdline")) as f:
            self.assertIn("--etcd_tls=on", f.read())
        with open(os.path.join(run, "stats.json")) as f:
            stats = [sh["stats"] for sh in json.load(f)["shards"]]
        # One primary and one backup per group: the backup takes its
        # primary's replica key although its allowed list holds only the
        # workers' and the admin's (ps_server checks the list when it
        # dispatches, so a primary whose member record the backup has not
        # read yet is not refused in the handshake, which libzmq would not
        # try again reliably).
        for g in (0, 1):
            roles = sorted(st["replication"]["role"] for st in stats if st["shard"] == g)
            self.assertEqual(roles, ["backup", "primary"], stats)
        with open(os.path.join(run, "summary.json")) as f:
            self.assertEqual(json.load(f)["totals"]["steps"], 2 * steps)
        # ps_ctl shutdown let in (the admin key): no shard left for SIGTERM.
        out = self.output("curve_r2.out")
        self.assertIn("local etcd at https://", out)
        self.assertNotIn("psrun: stopping", out)
        self.assert_no_etcd_errors(run)
        u.note("launch.replication: CurveZMQ fleet, 2 groups x 2 replicas, 2 workers x %d "
               "steps: etcd with TLS and authentication by default (auto), shards as "
               "asyncps-server, shut down through psrun's ps_ctl with the admin key; %.1f s"
               % (steps, wall))


if __name__ == "__main__":
    u.main()
