#!/usr/bin/env python3
"""Slurm backend: the rendered srun commands (--dry_run), the batch script, and a
whole run through a fake srun (tests/launch/fake_srun.py) against the real binaries."""
import json
import os
import shlex
import subprocess
import sys

import launch_test_util as u

TASK = os.path.join(u.REPO, "launch", "slurm", "task.sh")


class SlurmRenderTest(u.LaunchTestCase):
    needs_binaries = False

    def test_dry_run_commands(self):
        r = subprocess.run(
            [sys.executable, u.PSRUN, "--backend", "slurm", "--dry_run", "--servers", "2",
             "--workers", "3", "--run_dir", self.run_dir, "--bin_dir", "/opt/bin",
             "--srun_opts", "--overcommit --mem=0", "--server_flags", "--lr=0.1",
             "--config", os.path.join(u.REPO, "launch", "configs", "fashion_ssp.flags"),
             "--", "--max_steps=10"], capture_output=True, text=True, timeout=30)
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = r.stdout.strip().splitlines()
        self.assertEqual(len(lines), 2, r.stdout)
        srv, wrk = (shlex.split(l) for l in lines)
        self.assertEqual(srv[0], "srun")
        self.assertIn("--ntasks=2", srv)
        self.assertIn("--kill-on-bad-exit=1", srv)
        self.assertIn("--output=%s/server-%%t.log" % self.run_dir, srv)
        self.assertIn("--overcommit", srv)
        self.assertIn("--mem=0", srv)
        i = srv.index(TASK)
        self.assertEqual(srv[i + 1:], ["server", self.run_dir, "/opt/bin", "2", "3", "--lr=0.1"])
        self.assertIn("--ntasks=3", wrk)
        self.assertIn("--output=%s/worker-%%t.log" % self.run_dir, wrk)
        i = wrk.index(TASK)
        self.assertEqual(wrk[i + 1:i + 6], ["worker", self.run_dir, "/opt/bin", "2", "3"])
        self.assertIn("ready/server-*.endpoint", wrk[i + 6])
        self.assertEqual(wrk[i + 7:], ["--max_steps=10"])
        # The flag files the tasks read are in the run folder.
        with open(os.path.join(self.run_dir, "flags", "server.flags")) as f:
            self.assertIn("--consistency=ssp", f.read())

    def test_task_script_maps_procid_to_rank(self):
        fake_bin = os.path.join(self.tmp.name, "bin")
        os.makedirs(fake_bin)
        for n in ("ps_server", "ps_worker"):
            with open(os.path.join(fake_bin, n), "w") as f:
                f.write("#!/bin/sh\necho ARGS \"$@\"\n")
            os.chmod(os.path.join(fake_bin, n), 0o755)
        env = dict(os.environ, SLURM_PROCID="1", SLURM_NTASKS="2", PSRUN_ADVERTISE_HOST="h1")
        r = subprocess.run([TASK, "server", self.run_dir, fake_bin, "2", "4", "--lr=0.3"],
                           env=env, capture_output=True, text=True, timeout=10)
        self.assertEqual(r.returncode, 0, r.stderr)
        args = [l for l in r.stdout.splitlines() if l.startswith("ARGS")][0].split()
        for want in ("--shard_id=1", "--num_shards=2", "--num_workers=4", "--lr=0.3",
                     "--ready_file=%s/ready/server-1.endpoint" % self.run_dir,
                     "--db_path=%s/db/server-1" % self.run_dir, "--endpoint=tcp://*:*"):
            self.assertIn(want, args)
        with open(os.path.join(self.run_dir, "ready", "server-1.host")) as f:
            self.assertEqual(f.read().strip(), "h1")
        env["SLURM_PROCID"] = "3"
        r = subprocess.run([TASK, "worker", self.run_dir, fake_bin, "2", "4", "tcp://a:1,tcp://b:2",
                            "--max_steps=5"], env=env, capture_output=True, text=True, timeout=10)
        args = [l for l in r.stdout.splitlines() if l.startswith("ARGS")][0].split()
        for want in ("--rank=3", "--num_workers=4", "--servers=tcp://a:1,tcp://b:2",
                     "--max_steps=5", "--metrics_csv=%s/metrics-3.csv" % self.run_dir):
            self.assertIn(want, args)
        self.assertIn("# psrun: worker-3 started", r.stdout)

    def test_sbatch_script(self):
        path = os.path.join(u.REPO, "launch", "slurm", "asyncps.sbatch")
        with open(path) as f:
            text = f.read()
        self.assertTrue(text.startswith("#!/bin/bash"))
        self.assertIn("#SBATCH --ntasks=", text)
        self.assertIn("--backend slurm", text)
        self.assertEqual(subprocess.run(["bash", "-n", path]).returncode, 0)

    def test_whole_run_through_fake_srun(self):
        if not (u.have_binaries() and u.have_data()):
            self.skipTest("binaries or Fashion-MNIST missing")
        fake = os.path.join(self.tmp.name, "path")
        os.makedirs(fake)
        os.symlink(os.path.join(os.path.dirname(os.path.realpath(__file__)), "fake_srun.py"),
                   os.path.join(fake, "srun"))
        env = dict(os.environ, PATH=fake + os.pathsep + os.environ["PATH"],
                   FAKE_SRUN_LOG=os.path.join(self.tmp.name, "srun.calls"))
        argv = [sys.executable, u.PSRUN, "--backend", "slurm", "--servers", "2", "--workers", "2",
                "--run_dir", self.run_dir, "--bin_dir", u.bin_dir(), "--server_flags",
                u.TINY_SERVER, "--"] + u.TINY_WORKER + ["--max_steps=30"]
        r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=90)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        with open(os.path.join(self.run_dir, "summary.json")) as f:
            s = json.load(f)
        self.assertEqual(s["totals"]["steps"], 60)
        self.assertTrue(all(e.startswith("tcp://127.0.0.1:") for e in s["endpoints"]))
        with open(os.path.join(self.tmp.name, "srun.calls")) as f:
            calls = f.read().splitlines()
        self.assertEqual(len(calls), 2)
        self.assertIn(" worker %s %s 2 2 %s " % (self.run_dir, u.bin_dir(), ",".join(s["endpoints"])),
                      calls[1])
        for name in ("server-0", "server-1", "worker-0", "worker-1"):
            with open(os.path.join(self.run_dir, name + ".log")) as f:
                self.assertTrue(f.read().startswith("# psrun: %s started" % name))


if __name__ == "__main__":
    u.main()
