#!/usr/bin/env python3
"""Replicated shards on emulated hosts (experiments/chaos/failover.py, one
repeat each): psrun --emulate_hosts 3 --shard_hosts 2 --link 100mbit runs a
local etcd in the hub (--etcd_tls on: https on the hub's address, a
certificate for it, authentication) and 2 shards x 2 replicas on hosts h0 and h1 (a
group's replicas on different hosts; h0 holds group 0's primary and group
1's backup), 2 workers on h2 train the tiny MLP.
  - host kill: every process of the host holding group 0's primary is killed
    with SIGKILL and their RocksDB folders deleted;
  - partition: that host's link is cut (eth0 down) for 4 s, then healed.
Either way the run must finish, and no acknowledged push may be lost: for
every group, its primary and backups at the end applied exactly the distinct
pushes the workers' logs (--push_log) say were acknowledged; after the
partition the old primary does not lead any more. Exit 77 without root, ip,
tc, etcd, openssl, etcdctl or the binaries."""
import os
import unittest

import launch_test_util as u

from pslaunch import netns

import failover  # experiments/chaos (PYTHONPATH: tests/launch/CMakeLists.txt)

ETCD = "/usr/bin/etcd"
FLEET = dict(servers=2, workers=2, epochs=2, hosts=3, shard_hosts=2, link="100mbit",
             psrun_args=("--etcd_tls", "on"))


class ReplicationHostsTest(u.LaunchTestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        if not os.access(ETCD, os.X_OK):
            raise unittest.SkipTest("etcd not installed (Debian's etcd-server)")
        if not u.have_etcd_tls():
            raise unittest.SkipTest("openssl / etcdctl not installed (Debian's openssl, "
                                    "etcd-client)")
        why = netns.unavailable("psrh%d-probe" % os.getpid())
        if why:
            raise unittest.SkipTest(why)

    def check(self, rec):
        self.assertEqual(rec["rc"], 0, rec)
        self.assertTrue(rec["ok"], rec)
        self.assertEqual(rec["victim"], "h0", rec)
        self.assertEqual(rec["victims"], ["server-0-r0", "server-1-r1"], rec)
        self.assertEqual(rec["victim_groups"], [0], rec)
        self.assertEqual(rec["missing_groups"], [], rec)
        self.assertEqual(rec["lost"], 0, rec)
        self.assertEqual(rec["primary_lost"], 0, rec)
        self.assertEqual(rec["extra"], 0, rec)
        self.assertGreater(rec["accuracy"], 0.6)
        self.assertIsNotNone(rec["gap_s"], "no push acknowledged by group 0 after the event")
        self.assertLess(rec["gap_s"], 15.0)
        self.assertEqual(rec["namespaces_left"], [], rec)

    def test_host_killed(self):
        rec = failover.run_once(u.bin_dir(), os.path.join(self.tmp.name, "k"), **FLEET)
        self.check(rec)
        with open(os.path.join(self.tmp.name, "k", "psrun.out")) as f:
            self.assertIn("local etcd at https://10.213.0.254:", f.read())
        u.note("launch.replication_hosts: kill -9 of host h0 (%s, disks deleted), 2 groups x 2 "
               "replicas on 2 hosts at 100mbit, 2 workers on a third: %s pushes acknowledged "
               "per group, all applied by every primary and backup; first acknowledgement of "
               "group 0 after %.3f s (stall %.3f s)" % (", ".join(rec["victims"]), rec["acked"],
                                                      rec["gap_s"], rec["stall_s"]))

    def test_host_partitioned(self):
        rec = failover.run_once(u.bin_dir(), os.path.join(self.tmp.name, "p"), partition_s=4.0,
                                **FLEET)
        self.check(rec)
        old = rec["views"].get("server-0-r0")
        self.assertFalse(old and old.startswith("primary"), rec)
        u.note("launch.replication_hosts: h0 cut off for 4 s and healed: %s acknowledged per "
               "group, all applied by every primary and backup (old primary now %s); first "
               "acknowledgement of group 0 after %.3f s (stall %.3f s)" % (
                   rec["acked"], old or "gone", rec["gap_s"], rec["stall_s"]))


if __name__ == "__main__":
    u.main()
