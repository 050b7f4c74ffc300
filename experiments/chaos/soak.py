#!/usr/bin/env python3
"""Soak: a fleet (2 shards, 3 workers, Fashion-MNIST, --durable) runs for
--minutes (default 30) with random kill -9s of workers (restarted) and, less
often, shards (restarted from RocksDB); every 10 s it samples each shard's
RSS from /proc/PID/status. Reports per shard slot the RSS at start (first
sample after warm-up) and at the end, per incarnation, and the growth of the
longest-lived incarnation.

  experiments/chaos/soak.py --build build --minutes 30
"""
import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from chaos import Fleet  # noqa: E402


def rss_kib(pid):
    try:
        for line in open("/proc/%d/status" % pid):
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("--minutes", type=float, default=30)
    ap.add_argument("--worker_kill_every_s", type=float, default=20)
    ap.add_argument("--shard_kill_every_s", type=float, default=90)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    # Fleet options (the chaos defaults).
    fa = argparse.Namespace(build=a.build, shards=2, workers=3, lr=0.05, durable=True,
                            worker_timeout_s=5.0, seed=a.seed, log_every=200,
                            timeout_s=120, max_steps=0, epochs=1000)
    run_dir = tempfile.mkdtemp(prefix="asyncps-soak-")
    f = Fleet(fa, run_dir, "soak")
    rng = random.Random(a.seed)
    for s in range(fa.shards):
        f.start_shard(s)
    for s in range(fa.shards):
        f.wait_ready(s, time.time() + 20)
    for r in range(fa.workers):
        f.start_worker(r)
    t0 = time.time()
    end = t0 + a.minutes * 60
    samples = {s: [] for s in range(fa.shards)}  # (t, pid, rss_kib)
    kills = {"shard": 0, "worker": 0}
    next_sample = t0 + 10
    next_wkill = t0 + a.worker_kill_every_s
    next_skill = t0 + a.shard_kill_every_s
    while time.time() < end:
        now = time.time()
        for r, p in list(f.workers.items()):
            if p.poll() is not None:  # finished or died: start again
                f.start_worker(r)
        if now >= next_sample:
            for s in range(fa.shards):
                pid = f.shards[s].pid
                samples[s].append((round(now - t0, 1), pid, rss_kib(pid)))
            next_sample = now + 10
        if now >= next_wkill:
            r = rng.randrange(fa.workers)
            f.workers[r].send_signal(signal.SIGKILL)
            f.workers[r].wait()
            f.start_worker(r)
            kills["worker"] += 1
            next_wkill = now + rng.uniform(0.5, 1.5) * a.worker_kill_every_s
        if now >= next_skill:
            s = rng.randrange(fa.shards)
            f.shards[s].send_signal(signal.SIGKILL)
            f.shards[s].wait()
            f.start_shard(s)
            kills["shard"] += 1
            next_skill = now + rng.uniform(0.5, 1.5) * a.shard_kill_every_s
        time.sleep(0.2)
    stats = f.ctl(f.eps, "stats")
    f.ctl(f.eps, "shutdown")
    for r, p in f.workers.items():
        p.send_signal(signal.SIGKILL)
    for p in f.started:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    out = {"minutes": a.minutes, "kills": kills, "run_dir": run_dir, "shards": []}
    for s in range(fa.shards):
        by_pid = {}
        for t, pid, rss in samples[s]:
            if rss is not None:
                by_pid.setdefault(pid, []).append((t, rss))
        inc = [{"pid": pid, "from_s": v[0][0], "to_s": v[-1][0],
                "rss_start_kib": v[0][1], "rss_end_kib": v[-1][1],
                "rss_max_kib": max(x[1] for x in v)} for pid, v in by_pid.items()]
        longest = max(inc, key=lambda i: i["to_s"] - i["from_s"]) if inc else None
        out["shards"].append({
            "shard": s,
            "rss_start_kib": samples[s][0][2] if samples[s] else None,
            "rss_end_kib": samples[s][-1][2] if samples[s] else None,
            "incarnations": inc,
            "longest_growth_pct": None if not longest else round(
                100.0 * (longest["rss_end_kib"] - longest["rss_start_kib"]) /
                longest["rss_start_kib"], 1),
            "pushes": (stats or {}).get("shards", [{}] * fa.shards)[s].get(
                "stats", {}).get("pushes")})
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
