#!/usr/bin/env python3
"""psrun --backend slurm against a real slurmctld + slurmd on localhost
(Debian's slurmctld, slurmd, slurm-client, munge, which run_tests.sh installs;
see /work/shared/TESTBEDS.md). Daemons are started here and stopped by PID.
Also psrun --elastic on Slurm: 2 -> 3 -> 2 shards under BSP, the added shard
a step of its own, etcd a step; final weights bitwise those of a fixed run
(skipped without etcd). Exit 77 when those packages are not installed."""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import elastic_test
import launch_test_util as u

CONF = """ClusterName=psrun
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
ReturnToService=2
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd.log
NodeName=localhost NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
"""


class SlurmRealTest(elastic_test.ElasticRuns, u.LaunchTestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        need = ["/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/sbin/munged"]
        if not all(os.access(p, os.X_OK) for p in need) or not shutil.which("srun"):
            import unittest
            raise unittest.SkipTest("slurmctld/slurmd/munge not installed")
        cls.started = []
        cls.d = tempfile.mkdtemp(prefix="psrun-slurm-")
        d = cls.d
        for sub in ("state", "spool"):
            os.makedirs(os.path.join(d, sub))
        cls.conf = os.path.join(d, "slurm.conf")
        with open(cls.conf, "w") as f:
            f.write(CONF.format(d=d, cpus=os.cpu_count() or 2, ctld_port=u_port(), d_port=u_port()))
        cls.env = dict(os.environ, SLURM_CONF=cls.conf)
        # munged: reuse a running one, else start ours (and stop it by its PID).
        if subprocess.run(["munge", "-n"], capture_output=True).returncode != 0:
            os.makedirs("/run/munge", exist_ok=True)
            shutil.chown("/run/munge", "munge", "munge")
            subprocess.run(["runuser", "-u", "munge", "--", "/usr/sbin/munged"], check=True)
            with open("/run/munge/munged.pid") as f:
                cls.munged_pid = int(f.read())
        else:
            cls.munged_pid = None
        for argv in (["/usr/sbin/slurmctld", "-D", "-f", cls.conf],
                     ["/usr/sbin/slurmd", "-D", "-f", cls.conf, "-N", "localhost"]):
            log = open(os.path.join(d, os.path.basename(argv[0]) + ".out"), "wb")
            cls.started.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                                env=cls.env, start_new_session=True))
            log.close()
        deadline = time.time() + 30
        while True:
            r = subprocess.run(["sinfo", "-h", "-o", "%T"], env=cls.env, capture_output=True,
                               text=True)
            if r.returncode == 0 and r.stdout.split() and set(r.stdout.split()) == {"idle"}:
                break
            if time.time() > deadline:
                cls.tearDownClass()
                raise AssertionError("slurm not idle: %s %s" % (r.stdout, r.stderr))
            time.sleep(0.3)

    @classmethod
    def tearDownClass(cls):
        for p in getattr(cls, "started", []):
            p.terminate()
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        if getattr(cls, "munged_pid", None):
            try:
                os.kill(cls.munged_pid, 15)
            except ProcessLookupError:
                pass
        shutil.rmtree(getattr(cls, "d", ""), ignore_errors=True)

    def test_fleet_on_slurm(self):
        argv = [sys.executable, u.PSRUN, "--backend", "slurm", "--servers", "2", "--workers", "2",
                "--run_dir", self.run_dir, "--bin_dir", u.bin_dir(), "--srun_opts",
                "--overcommit", "--server_flags", u.TINY_SERVER, "--start_timeout", "40",
                "--"] + u.TINY_WORKER + ["--max_steps=30"]
        env = dict(self.env, PSRUN_BIND_HOST="127.0.0.1", PSRUN_ADVERTISE_HOST="127.0.0.1")
        t0 = time.monotonic()
        r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=150)
        wall = time.monotonic() - t0
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        with open(os.path.join(self.run_dir, "summary.json")) as f:
            s = json.load(f)
        self.assertEqual(s["totals"]["steps"], 60)
        with open(os.path.join(self.run_dir, "worker-1.log")) as f:
            log = f.read()
        self.assertIn("slurm job", log)
        self.assertIn("--rank=1", log)
        job = re.search(r"slurm job [^)]*", log)
        u.note("launch.slurm_real: trained %d steps (2 workers, 2 shards) through slurmctld + "
               "slurmd on localhost in %.1f s, %.0f samples/s (worker-1: %s)"
               % (s["totals"]["steps"], wall, s["totals"]["samples_per_s"],
                  job.group(0) if job else "?"))

    def test_replicated_fleet_on_slurm(self):
        """--replicas 2 --etcd_tls on: an etcd step (https, its certificates
        made by task.sh for its host, users and authentication on before it
        serves), then 2 shards x 2 replicas as one step of 4 tasks signed in
        as asyncps-server; the workers train through the primaries, every
        update reaches the backups."""
        if not u.have_etcd_tls():
            self.skipTest("etcd / openssl / etcdctl not installed")
        run_dir = self.run_dir + "-replicated"
        argv = [sys.executable, u.PSRUN, "--backend", "slurm", "--servers", "2", "--workers", "2",
                "--replicas", "2", "--etcd_tls", "on", "--run_dir", run_dir,
                "--bin_dir", u.bin_dir(),
                "--srun_opts", "--overcommit", "--server_flags", u.TINY_SERVER,
                "--start_timeout", "60", "--"] + u.TINY_WORKER + ["--max_steps=30"]
        env = dict(self.env, PSRUN_BIND_HOST="127.0.0.1", PSRUN_ADVERTISE_HOST="127.0.0.1")
        t0 = time.monotonic()
        r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=170)
        wall = time.monotonic() - t0
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        with open(os.path.join(run_dir, "summary.json")) as f:
            s = json.load(f)
        self.assertEqual(s["totals"]["steps"], 60)
        with open(os.path.join(run_dir, "stats.json")) as f:
            stats = [sh["stats"] for sh in json.load(f)["shards"]]
        roles = sorted(st["replication"]["role"] for st in stats)
        self.assertEqual(roles, ["backup", "backup", "primary", "primary"])
        for g in (0, 1):
            versions = {st["version"] for st in stats if st["shard"] == g}
            self.assertEqual(len(versions), 1, stats)  # the backup holds what the primary does
        with open(os.path.join(run_dir, "etcd-0.log")) as f:
            log = f.read()
        self.assertIn("slurm job", log)
        self.assertIn("--client-cert-auth", log)
        self.assertIn("--listen-client-urls=https://127.0.0.1:", log)
        self.assertTrue(os.path.exists(os.path.join(run_dir, "etcd", "tls", "auth.enabled")))
        logs = [os.path.join(run_dir, "server-%d.log" % t) for t in range(4)]
        for p in logs:
            with open(p) as f:
                self.assertIn("--etcd_user=asyncps-server", f.read())
        self.assertEqual(u.etcd_errors(logs), [])
        u.note("launch.slurm_real: 2 shards x 2 replicas (an etcd step with TLS and "
               "authentication, 4 server tasks) trained %d steps through slurm in %.1f s; each "
               "backup at its primary's version" % (s["totals"]["steps"], wall))

    def test_elastic_on_slurm(self):
        """psrun --elastic on Slurm (elastic_test.PLAN: add shard 2, then
        remove shard 0): etcd as a step, shards 0-1 one step, shard 2 a step
        of one task of its own; shard 0's task leaves its step while shard 1
        serves on. Final weights bitwise those of a fixed 2-shard run on
        Slurm."""
        if not os.access(elastic_test.ETCD, os.X_OK):
            self.skipTest("etcd not installed (Debian's etcd-server)")
        backend = ["--backend", "slurm", "--srun_opts", "--overcommit", "--start_timeout", "40"]
        env = dict(self.env, PSRUN_BIND_HOST="127.0.0.1", PSRUN_ADVERTISE_HOST="127.0.0.1")
        t0 = time.monotonic()
        elastic = self.elastic_psrun("elastic", elastic_test.PLAN, backend, env=env)
        t1 = time.monotonic()
        fixed = self.elastic_psrun("fixed", None, backend, env=env)
        t2 = time.monotonic()
        add, remove, steps = self.check_steps(elastic, [[0, 1, 2], [1, 2]])
        with open(os.path.join(elastic, "server-2.log")) as f:
            log = f.read()
        self.assertIn("slurm job", log)
        self.assertIn("task 0 of 1", log)  # a step of its own
        self.assertIn("--shard_id=2 --num_shards=3", log)
        self.assertTrue(os.path.exists(os.path.join(elastic, "srun-server-2.log")))
        with open(os.path.join(elastic, "etcd-0.log")) as f:
            self.assertIn("slurm job", f.read())
        self.assert_same_weights(elastic, fixed, "launch.slurm_real-elastic")
        u.note("launch.slurm_real: --elastic '%s' on Slurm: 2 -> 3 -> 2 shards (shard 2 a step "
               "of its own, %d chunks / %.2f MiB moved on; shard 0 removed, %d moved off), "
               "2 ps_workers x %d steps under BSP; final weights bitwise equal to a fixed "
               "2-shard run's; %.1f s elastic run, %.1f s fixed"
               % (elastic_test.PLAN, add["moved_chunks"], add["moved_bytes"] / 2**20,
                  remove["moved_chunks"], elastic_test.STEPS, t1 - t0, t2 - t1))

        # Replica groups (--replicas 2): groups 0-1 one step of 4 tasks, the
        # group that joins a step of 2 tasks of its own; group 0 leaves.
        t3 = time.monotonic()
        groups = self.elastic_psrun("elastic_replicas", elastic_test.PLAN,
                                    backend + ["--replicas", "2"], env=env)
        t4 = time.monotonic()
        add, remove, steps = self.check_steps(groups, [[0, 1, 2], [1, 2]])
        self.assertEqual(steps[0]["endpoint"].count("|"), 1, steps[0])
        for r in (0, 1):
            with open(os.path.join(groups, "server-2-r%d.log" % r)) as f:
                log = f.read()
            self.assertIn("task %d of 2" % r, log)  # the group's step of its own
            self.assertIn("--shard_id=2 --num_shards=3", log)
            self.assertIn("--replica=%d" % r, log)
        self.assertTrue(os.path.exists(os.path.join(groups, "srun-server-2.log")))
        self.assert_same_weights(groups, fixed, "launch.slurm_real-elastic-replicas")
        u.note("launch.slurm_real: the same plan with --replicas 2 on Slurm: group 2 (%s) a step "
               "of 2 tasks of its own, group 0 left; final weights bitwise equal to the fixed "
               "run's; %.1f s" % (steps[0]["endpoint"], t4 - t3))


def u_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    u.main()
