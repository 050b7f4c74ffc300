#!/usr/bin/env python3
"""psrun --emulate_hosts for real: each emulated host a network namespace of
its own, joined to a hub by a link shaped with tc tbf (launch/pslaunch/netns.py).
  - a link made by the same code carries 100mbit within 10% (one TCP stream
    from one host's namespace to another's, through both hosts' shaped ends);
  - a 2-host fleet at 100mbit trains the tiny MLP to completion, each process
    in its host's namespace (pids.json says which), shards at their host's
    address; no namespace is left after psrun exits;
  - SIGTERM to psrun while the workers train: exit 143, no process and no
    namespace left;
  - --latency where the kernel has no netem: a clear error, exit 2;
  - psrun not run as root: a clear error, exit 2.
Needs root, ip and tc (exit 77 without them, or where namespaces cannot be made)."""
import json
import os
import shutil
import signal
import subprocess
import time
import unittest

import launch_test_util as u

from pslaunch import netns

RATE = 100 * 10 ** 6


class EmulateHostsTest(u.FleetTestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        why = netns.unavailable("pseh%d-probe" % os.getpid())
        if why:
            raise unittest.SkipTest(why)

    def psrun_argv(self, hosts=2, workers=2, worker_flags=(), extra=()):
        return u.psrun_argv(self.run_dir, servers=2, workers=workers,
                            extra=["--emulate_hosts", str(hosts), "--link", "100mbit"]
                            + list(extra), worker_flags=worker_flags)

    def assert_no_namespaces(self, psrun_pid):
        left = netns.list_namespaces("psrun%d-" % psrun_pid)
        self.assertEqual(left, [], "namespaces left after psrun exited")

    def test_link_carries_its_rate(self):
        with netns.Network.create(2, rate=RATE, tag="pseh%d" % os.getpid()) as net:
            a, b = net.hosts
            bps = netns.measure_throughput(a.netns, b.netns, b.address, seconds=3.0)
        self.assertEqual(netns.list_namespaces("pseh%d-" % os.getpid()), [])
        self.assertLess(abs(bps - RATE) / RATE, 0.10, "%.1f Mbit/s on a 100mbit link" % (bps / 1e6))
        u.note("launch.emulate_hosts: host-to-host TCP over two 100mbit tbf ends: %.1f Mbit/s"
               % (bps / 1e6))

    def test_two_hosts_train(self):
        out = os.path.join(self.tmp.name, "psrun.out")
        self.psrun = u.start_psrun(self.psrun_argv(worker_flags=["--max_steps=60"]), out)
        rc = self.psrun.wait(timeout=120)
        self.assertEqual(rc, 0, self.output())
        self.assert_no_namespaces(self.psrun.pid)
        self.pids = u.read_pids(self.run_dir, want=4, timeout=1)
        procs = {p["name"]: p for p in self.pids["procs"]}
        self.assertEqual(sorted(procs), ["server-0", "server-1", "worker-0", "worker-1"])
        hosts = {n: p["emulated_host"] for n, p in procs.items()}
        self.assertEqual(hosts, {"server-0": "h0", "server-1": "h1",
                                 "worker-0": "h0", "worker-1": "h1"})
        for name, p in procs.items():
            self.assertEqual(p["netns"], "psrun%d-%s" % (self.psrun.pid, p["emulated_host"]))
        self.assertTrue(procs["server-0"]["endpoint"].startswith("tcp://10.213.0.1:"), procs)
        self.assertTrue(procs["server-1"]["endpoint"].startswith("tcp://10.213.0.2:"), procs)
        self.assertIn("links 100mbit", self.output())
        u.assert_no_orphans(self, self.pids)
        with open(os.path.join(self.run_dir, "summary.json")) as f:
            summary = json.load(f)
        self.assertTrue(summary["ok"])
        self.assertEqual(sorted(summary["per_worker"]), ["0", "1"])
        u.note("launch.emulate_hosts: 2 emulated hosts at 100mbit, 2 shards + 2 workers trained "
               "(final test accuracy %.4f); no namespace left"
               % summary["totals"]["final_test_acc"])

    def test_sigterm_removes_everything(self):
        out = os.path.join(self.tmp.name, "psrun.out")
        self.psrun = u.start_psrun(self.psrun_argv(worker_flags=["--epochs=5", "--timeout_s=120"]),
                                   out)
        self.pids = u.read_pids(self.run_dir, want=4, timeout=60)
        self.assertTrue(u.wait_log(os.path.join(self.run_dir, "worker-0.log"), "step", 60),
                        self.output())
        self.assertEqual(len(netns.list_namespaces("psrun%d-" % self.psrun.pid)), 3)
        self.psrun.send_signal(signal.SIGTERM)
        rc = self.psrun.wait(timeout=60)
        self.assertEqual(rc, 128 + signal.SIGTERM, self.output())
        self.assert_no_namespaces(self.psrun.pid)
        u.assert_no_orphans(self, u.read_pids(self.run_dir, want=4, timeout=1))

    def test_latency_needs_netem(self):
        """--latency: trained where the kernel has netem, else a clear error
        (tbf cannot delay) and nothing left behind."""
        out = os.path.join(self.tmp.name, "psrun.out")
        self.psrun = u.start_psrun(self.psrun_argv(worker_flags=["--max_steps=20"],
                                                   extra=["--latency", "10"]), out)
        rc = self.psrun.wait(timeout=120)
        self.assert_no_namespaces(self.psrun.pid)
        if rc == 2:
            self.assertIn("latency cannot be emulated on this kernel", self.output())
            u.note("launch.emulate_hosts: --latency refused here (no netem in this kernel)")
        else:
            self.assertEqual(rc, 0, self.output())
            self.assertIn("latency 10 ms", self.output())

    def test_not_root_is_refused(self):
        if not shutil.which("runuser") or not os.access("/usr/bin/python3", os.X_OK):
            self.skipTest("no runuser or /usr/bin/python3")
        # The system python: the test's own may be under root's home.
        argv = ["/usr/bin/python3"] + self.psrun_argv()[1:]
        r = subprocess.run(["runuser", "-u", "nobody", "--"] + argv,
                           capture_output=True, text=True, timeout=60, cwd="/")
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("needs root", r.stderr)
        self.assertFalse(os.path.exists(self.run_dir))


if __name__ == "__main__":
    u.main()
