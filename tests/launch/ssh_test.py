#!/usr/bin/env python3
"""SSH backend on loopback: a private sshd on 127.0.0.1-3 (Debian's openssh-server,
generated keys, started and stopped by PID), psrun placing shards and workers over
a hostfile, logs streamed back, teardown over SSH, and psrun --elastic over ssh
(2 -> 3 -> 2 shards under BSP, the added shard on a host of its own; final
weights bitwise those of a fixed run; skipped without etcd). Exit 77 without
openssh-server."""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import elastic_test
import launch_test_util as u

SSHD = "/usr/sbin/sshd"
# Three "hosts" on loopback, each an address sshd listens on.
HOSTS = ("127.0.0.1", "127.0.0.2", "127.0.0.3")
ELASTIC_PLAN = "+1@3s,-1@6s"  # 2 -> 3 -> 2: the added shard is removed again


def free_port(preferred=2222):
    for port in (preferred, 0):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
                return s.getsockname()[1]
            except OSError:
                continue


class SshTest(elastic_test.ElasticRuns, u.LaunchTestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        if not os.access(SSHD, os.X_OK) or not shutil.which("ssh"):
            raise unittest_skip("openssh-server / ssh not installed")
        cls.dir = __import__("tempfile").mkdtemp(prefix="psrun-sshd-")
        d = cls.dir
        for k in ("host_key", "user_key"):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f",
                            os.path.join(d, k)], check=True)
        shutil.copyfile(os.path.join(d, "user_key.pub"), os.path.join(d, "authorized_keys"))
        cls.port = free_port()
        with open(os.path.join(d, "sshd_config"), "w") as f:
            f.write("Port %d\n%sHostKey %s/host_key\nPidFile %s/sshd.pid\n"
                    "AuthorizedKeysFile %s/authorized_keys\nStrictModes no\n"
                    "PermitRootLogin prohibit-password\nPasswordAuthentication no\nUsePAM no\n"
                    "AcceptEnv *\nMaxStartups 50\nMaxSessions 50\nLogLevel ERROR\n"
                    % (cls.port, "".join("ListenAddress %s\n" % h for h in HOSTS), d, d, d))
        os.makedirs("/run/sshd", exist_ok=True)
        with open(os.path.join(d, "sshd.log"), "wb") as log:
            cls.sshd = subprocess.Popen([SSHD, "-D", "-e", "-f", os.path.join(d, "sshd_config")],
                                        stdout=subprocess.DEVNULL, stderr=log,
                                        start_new_session=True)
        cls.ssh_opts = ("-p %d -i %s/user_key -o BatchMode=yes -o StrictHostKeyChecking=no "
                        "-o UserKnownHostsFile=/dev/null -o LogLevel=ERROR" % (cls.port, d))
        deadline = time.time() + 15
        for host in HOSTS:
            while True:
                r = subprocess.run(["ssh"] + cls.ssh_opts.split() + [host, "true"],
                                   stdin=subprocess.DEVNULL, capture_output=True)
                if r.returncode == 0:
                    break
                if time.time() > deadline or cls.sshd.poll() is not None:
                    cls.tearDownClass()
                    raise AssertionError("sshd did not come up on %s: %s" % (host, r.stderr))
                time.sleep(0.2)

    @classmethod
    def tearDownClass(cls):
        if getattr(cls, "sshd", None):
            cls.sshd.terminate()
            try:
                cls.sshd.wait(timeout=5)
            except subprocess.TimeoutExpired:
                cls.sshd.kill()
                cls.sshd.wait()
        if getattr(cls, "dir", None):
            shutil.rmtree(cls.dir, ignore_errors=True)

    def argv(self, worker_flags):
        hostfile = os.path.join(self.tmp.name, "hosts")
        with open(hostfile, "w") as f:
            f.write("127.0.0.1 slots=2\nlocalhost slots=2\n")
        return u.psrun_argv(self.run_dir, servers=2, workers=2, worker_flags=worker_flags,
                            extra=["--backend", "ssh", "--hostfile", hostfile,
                                   "--ssh_opts", self.ssh_opts])

    def remote_pids(self, doc):
        return [p["remote_pid"] for p in doc["procs"] if p.get("remote_pid")]

    def assert_all_gone(self, doc, count):
        """pids.json lists `count` remote PIDs, and within 10 s none of them,
        nor any local ssh client, is left running. Returns the remote PIDs."""
        pids = self.remote_pids(doc)
        self.assertEqual(len(pids), count, doc)
        deadline = time.time() + 10
        while time.time() < deadline and any(u.pid_alive(p) for p in pids):
            time.sleep(0.2)
        self.assertEqual([p for p in pids if u.pid_alive(p)], [])
        u.assert_no_orphans(self, doc)
        return pids

    def test_fleet_over_ssh(self):
        out = os.path.join(self.tmp.name, "psrun.out")
        t0 = time.monotonic()
        with open(out, "wb") as f:
            rc = subprocess.run(self.argv(["--max_steps=30"]), stdout=f,
                                stderr=subprocess.STDOUT, timeout=120).returncode
        wall = time.monotonic() - t0
        text = self.output()
        self.assertEqual(rc, 0, text)
        with open(os.path.join(self.run_dir, "summary.json")) as f:
            s = json.load(f)
        self.assertEqual(s["totals"]["steps"], 60)
        doc = u.read_pids(self.run_dir)
        hosts = {p["name"]: p["host"] for p in doc["procs"]}
        # Round-robin over slots: 127.0.0.1 x2 for the shards, localhost x2 for the workers.
        self.assertEqual(hosts, {"server-0": "127.0.0.1", "server-1": "127.0.0.1",
                                 "worker-0": "localhost", "worker-1": "localhost"})
        for name in hosts:
            with open(os.path.join(self.run_dir, name + ".log")) as f:
                log = f.read()
            self.assertIn("# psrun: remote pid ", log)  # streamed back through ssh
        with open(os.path.join(self.run_dir, "worker-0.log")) as f:
            self.assertIn("SUMMARY rank=0", f.read())
        self.assertEqual(len(self.remote_pids(doc)), 4)
        for pid in self.remote_pids(doc):
            self.assertFalse(u.pid_alive(pid), pid)
        u.assert_no_orphans(self, doc)
        u.note("launch.ssh: trained %d steps (2 workers, 2 shards) on %d hosts (%s) through "
               "sshd on 127.0.0.1:%d in %.1f s, %.0f samples/s"
               % (s["totals"]["steps"], len(set(hosts.values())),
                  ", ".join(sorted(set(hosts.values()))), self.port, wall,
                  s["totals"]["samples_per_s"]))

    def test_teardown_over_ssh_kills_remote_processes(self):
        out = os.path.join(self.tmp.name, "psrun.out")
        t0 = time.monotonic()
        psrun = u.start_psrun(self.argv(["--max_steps=100000", "--slowdown=2"]), out)
        try:
            self.assertTrue(u.wait_log(os.path.join(self.run_dir, "worker-0.log"), "step 10/",
                                       timeout=60), self.output())
            # Every ssh client has reported its remote PID (worker-1 may start later
            # than worker-0 reaches step 10 on a slow machine).
            deadline = time.time() + 30
            doc = u.read_pids(self.run_dir, want=4)
            while len(self.remote_pids(doc)) < 4 and time.time() < deadline:
                time.sleep(0.1)
                doc = u.read_pids(self.run_dir, want=4)
            os.kill(psrun.pid, signal.SIGTERM)
            rc = psrun.wait(timeout=60)
        finally:
            if psrun.poll() is None:
                psrun.kill()
        self.assertEqual(rc, 128 + signal.SIGTERM, self.output())
        # The remote processes (here: on this machine) are gone, not just the ssh clients.
        doc = u.read_pids(self.run_dir)
        pids = self.assert_all_gone(doc, 4)
        u.note("launch.ssh: SIGTERM to psrun after step 10 ended all %d remote processes "
               "over ssh (%.1f s in all)" % (len(pids), time.monotonic() - t0))

    def test_elastic_over_ssh(self):
        """psrun --elastic over ssh: 2 -> 3 -> 2 shards while 2 ps_workers
        train under BSP. Shards on 127.0.0.1, workers on 127.0.0.2, the
        added shard on the next slot, 127.0.0.3 (started and stopped over
        ssh), removed again; the final weights bitwise those of a fixed
        2-shard run over ssh. Then the same with replica groups."""
        if not os.access(elastic_test.ETCD, os.X_OK):
            self.skipTest("etcd not installed (Debian's etcd-server)")
        hostfile = os.path.join(self.tmp.name, "hosts-elastic")
        with open(hostfile, "w") as f:
            f.write("%s slots=2\n%s slots=2\n%s slots=1\n" % HOSTS)
        backend = ["--backend", "ssh", "--hostfile", hostfile, "--ssh_opts", self.ssh_opts]
        t0 = time.monotonic()
        elastic = self.elastic_psrun("elastic", ELASTIC_PLAN, backend)
        t1 = time.monotonic()
        fixed = self.elastic_psrun("fixed", None, backend)
        t2 = time.monotonic()
        add, remove, steps = self.check_steps(elastic, [[0, 1, 2], [0, 1]])
        self.assertTrue(steps[0]["endpoint"].startswith("tcp://127.0.0.3:"), steps[0])
        self.assertEqual((steps[0]["shard"], steps[1]["shard"]), (2, 2), steps)
        doc = u.read_pids(elastic)
        hosts = {p["name"]: p["host"] for p in doc["procs"]}
        self.assertEqual(hosts, {"server-0": HOSTS[0], "server-1": HOSTS[0],
                                 "worker-0": HOSTS[1], "worker-1": HOSTS[1],
                                 "server-2": HOSTS[2]})
        with open(os.path.join(elastic, "server-2.log")) as f:
            self.assertIn("# psrun: remote pid ", f.read())
        self.assert_all_gone(doc, 5)
        self.assert_same_weights(elastic, fixed, "launch.ssh-elastic")
        u.note("launch.ssh: --elastic '%s' over ssh: 2 -> 3 -> 2 shards (shard 2 on %s, %d chunks "
               "/ %.2f MiB moved on, %d moved off), 2 ps_workers x %d steps under BSP; final "
               "weights bitwise equal to a fixed 2-shard run's; %.1f s elastic run, %.1f s fixed"
               % (ELASTIC_PLAN, HOSTS[2], add["moved_chunks"], add["moved_bytes"] / 2**20,
                  remove["moved_chunks"], elastic_test.STEPS, t1 - t0, t2 - t1))

        # Replica groups (--replicas 2): both groups on 127.0.0.1, the
        # workers on 127.0.0.2, the group that joins on the next two slots
        # (127.0.0.3) and leaves again; bitwise the fixed run's weights.
        # psrun's etcd with TLS and authentication (--etcd_tls on): the
        # shards over ssh sign in as asyncps-server, the workers (given etcd
        # by --elastic) as asyncps-worker, psrun's ps_ctl add-shard /
        # remove-shard as asyncps-server.
        if not u.have_etcd_tls():
            self.skipTest("openssl / etcdctl not installed (Debian's openssl, etcd-client)")
        with open(hostfile, "w") as f:
            f.write("%s slots=4\n%s slots=2\n%s slots=2\n" % HOSTS)
        t3 = time.monotonic()
        groups = self.elastic_psrun("elastic_replicas", ELASTIC_PLAN,
                                    backend + ["--replicas", "2", "--etcd_tls", "on"])
        t4 = time.monotonic()
        add, remove, steps = self.check_steps(groups, [[0, 1, 2], [0, 1]])
        self.assertEqual([e.rsplit(":", 1)[0] for e in steps[0]["endpoint"].split("|")],
                         ["tcp://127.0.0.3"] * 2, steps[0])
        doc = u.read_pids(groups)
        hosts = {p["name"]: p["host"] for p in doc["procs"]}
        self.assertEqual((hosts["server-2-r0"], hosts["server-2-r1"], hosts["worker-0"]),
                         (HOSTS[2], HOSTS[2], HOSTS[1]), hosts)
        self.assert_all_gone(doc, 8)
        self.assert_same_weights(groups, fixed, "launch.ssh-elastic-replicas")
        self.assertIn("local etcd at https://", self.output("elastic_replicas.out"))
        logs = {}
        for name in hosts:
            with open(os.path.join(groups, name + ".log"), errors="replace") as f:
                logs[name] = f.read()
        for name, user in (("server-0-r1", "asyncps-server"), ("server-2-r0", "asyncps-server"),
                           ("worker-1", "asyncps-worker")):
            self.assertIn("--etcd_user=%s " % user, logs[name])
        self.assertNotIn("asyncps-server", logs["worker-0"])
        self.assertEqual(u.etcd_errors([os.path.join(groups, n + ".log") for n in hosts
                                        if n.startswith("server-")]), [])
        u.note("launch.ssh: the same plan with --replicas 2 and --etcd_tls on over ssh: group 2 "
               "(%s) joined and left; final weights bitwise equal to the fixed run's; %.1f s"
               % (steps[0]["endpoint"], t4 - t3))


def unittest_skip(msg):
    import unittest
    return unittest.SkipTest(msg)


if __name__ == "__main__":
    u.main()
