#!/usr/bin/env python3
"""The lost-push scenario of issue 13, as a user runs it: one durable shard
and one worker with --prefetch_ahead under launch/psrun, the shard killed
with SIGKILL --kills times (psrun restarts it from RocksDB). Then the store
is opened by a fresh ps_server and compared with what the worker was told:

  acked   pushes the shard acknowledged to the worker: its SUMMARY steps
          (one push per step, all acknowledged before the worker exits 0)
          and, where the worker supports --push_log, its acknowledgement log
  stored  the version the recovered store holds (one per applied push)
  lost    acked - stored (the worker is never killed: no push goes
          unacknowledged)

  experiments/chaos/psrun_kills.py --build build
  experiments/chaos/psrun_kills.py --build /tmp/old-build --no_push_log
"""
import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SUMMARY = re.compile(r"SUMMARY rank=0 .* steps=(\d+)")


def shard_pid(run_dir):
    try:
        j = json.load(open(os.path.join(run_dir, "pids.json")))
    except (OSError, ValueError):
        return None
    for p in j.get("procs", []):
        if p.get("role") == "server":
            return p.get("pid")
    return None


def alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except OSError:
        return False


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("--kills", type=int, default=8)
    ap.add_argument("--first_kill_s", type=float, default=8)
    ap.add_argument("--interval_s", type=float, default=6)
    ap.add_argument("--max_steps", type=int, default=15000)
    ap.add_argument("--no_push_log", dest="push_log", action="store_false")
    a = ap.parse_args()
    bin_dir = os.path.abspath(os.path.join(a.build, "bin"))
    run_dir = tempfile.mkdtemp(prefix="asyncps-psrun-kills-")
    worker_flags = ["--epochs=30", "--max_steps=%d" % a.max_steps, "--prefetch_ahead",
                    "--eval=false"]
    if a.push_log:
        worker_flags.append("--push_log=" + os.path.join(run_dir, "push.log"))
    cmd = [sys.executable, os.path.join(REPO, "launch", "psrun"), "--servers", "1",
           "--workers", "1", "--max_restarts", "20", "--bin_dir", bin_dir,
           "--run_dir", os.path.join(run_dir, "run"), "--quiet",
           "--server_flags", "--consistency=asp --durable --lr=0.001", "--"] + worker_flags
    t0 = time.time()
    psrun = subprocess.Popen(cmd, stdout=open(os.path.join(run_dir, "psrun.out"), "wb"),
                             stderr=subprocess.STDOUT)
    kills = 0
    next_kill = t0 + a.first_kill_s
    while psrun.poll() is None:
        if kills < a.kills and time.time() >= next_kill:
            pid = shard_pid(os.path.join(run_dir, "run"))
            if pid and alive(pid):
                os.kill(pid, signal.SIGKILL)
                kills += 1
                next_kill = time.time() + a.interval_s
        time.sleep(0.1)
    wall = round(time.time() - t0, 1)
    run = os.path.join(run_dir, "run")
    wlog = open(os.path.join(run, "worker-0.log"), errors="replace").read()
    m = SUMMARY.search(wlog)
    steps = int(m.group(1)) if m else None
    acked_log = None
    if a.push_log and os.path.exists(os.path.join(run_dir, "push.log")):
        acked_log = len({l.split()[2] for l in open(os.path.join(run_dir, "push.log"))
                         if l.startswith("acked ")})
    # The store, opened afresh.
    ready = os.path.join(run_dir, "reopen.ready")
    server = subprocess.Popen(
        [os.path.join(bin_dir, "ps_server"), "--endpoint=tcp://127.0.0.1:*",
         "--ready_file=" + ready, "--checkpoint_every_s=0",
         "--db_path=" + os.path.join(run, "db", "server-0")],
        stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    stored = duplicates = None
    try:
        end = time.time() + 60
        while time.time() < end and not (os.path.exists(ready) and open(ready).read().strip()):
            time.sleep(0.05)
        ep = open(ready).read().strip()
        out = subprocess.run([os.path.join(bin_dir, "ps_ctl"), "--servers=" + ep, "stats"],
                             capture_output=True, text=True)
        st = json.loads(out.stdout)["shards"][0]["stats"]
        stored = st["version"]
        duplicates = st.get("duplicate_pushes")
        subprocess.run([os.path.join(bin_dir, "ps_ctl"), "--servers=" + ep, "shutdown"],
                       capture_output=True)
    finally:
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    acked = acked_log if acked_log is not None else steps
    out = {"build": a.build, "psrun_rc": psrun.returncode, "kills": kills, "wall_s": wall,
           "worker_steps": steps, "acked_pushes_logged": acked_log,
           "store_version": stored, "duplicate_pushes_in_store": duplicates,
           "lost_acked_pushes": None if acked is None or stored is None else acked - stored,
           "run_dir": run_dir}
    print(json.dumps(out))
    if out["lost_acked_pushes"] == 0 and psrun.returncode == 0:
        shutil.rmtree(run_dir, ignore_errors=True)
        return 0
    return 1


if __name__ == "__main__":
    sys.exit(main())
