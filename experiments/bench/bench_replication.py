#!/usr/bin/env python3
"""Training with replicated shards against the same training without: psrun
fleets of S shards and W workers training the MLP on Fashion-MNIST, with
--replicas 2 (every update applied by a backup before it is acknowledged; a
local etcd) and with --replicas 1 (the static fleet), alternating, --repeats
times each. One JSON line: samples/s of both (median and spread), ratio =
replicated / single (median of the per-repeat ratios), and the CPU time of the
whole fleet (psrun's waited-for children: shards, workers, etcd) per sample:
cpu_ceiling = cpu(R=1) / cpu(R=2) is the ratio R=2 can reach where the cores
are the limit.

  experiments/bench/bench_replication.py --repeats 5
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile

import bench_stats

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))
PSRUN = os.path.join(REPO, "launch", "psrun")
BATCH = 64


def run(bin_dir, work, replicas, servers, workers, steps, layers):
    run_dir = os.path.join(work, "r%d-%d" % (replicas, len(os.listdir(work))))
    argv = [sys.executable, PSRUN, "--servers", str(servers), "--workers", str(workers),
            "--run_dir", run_dir, "--bin_dir", bin_dir, "--progress", "off", "--quiet",
            "--server_flags", "--consistency=asp --optimizer=sgd --lr=0.05"]
    if replicas > 1:
        argv += ["--replicas", str(replicas)]
    argv += ["--", "--layers=" + layers, "--batch=%d" % BATCH, "--epochs=1",
             "--max_steps=%d" % steps,
             "--log_every=1000", "--threads=1", "--eval=false"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   timeout=600)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    # CPU of psrun and every process it started and waited for (shards,
    # workers, etcd): they count toward psrun's children, and so ours.
    cpu_s = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    with open(os.path.join(run_dir, "summary.json")) as f:
        totals = json.load(f)["totals"]
    return totals["samples_per_s"], cpu_s / max(1, totals["steps"] * BATCH) * 1e6


def spread(v):
    return bench_stats.spread(v, count="n")


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin_dir", default=os.path.join(REPO, "build", "bin"))
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--servers", type=int, default=2)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--layers", default="784,256,128,10")
    ap.add_argument("--quick", action="store_true", help="1 repeat, 200 steps")
    a = ap.parse_args()
    if a.quick:
        a.repeats, a.steps = 1, 200
    with tempfile.TemporaryDirectory(prefix="bench-replication-") as work:
        one, two, cpu_one, cpu_two = [], [], [], []
        for _ in range(a.repeats):
            rate, cpu = run(a.bin_dir, work, 1, a.servers, a.workers, a.steps, a.layers)
            one.append(rate)
            cpu_one.append(cpu)
            rate, cpu = run(a.bin_dir, work, 2, a.servers, a.workers, a.steps, a.layers)
            two.append(rate)
            cpu_two.append(cpu)
    ratios = [t / o for t, o in zip(two, one)]
    # Where the cores are the limit, R=2 reaches at most cpu(R=1) / cpu(R=2).
    ceilings = [c1 / c2 for c1, c2 in zip(cpu_one, cpu_two)]
    print(json.dumps({
        "bench": "replication", "op": "train", "mode": "replicas2", "layers": a.layers,
        "servers": a.servers, "workers": a.workers, "steps": a.steps,
        "samples_per_s": round(statistics.median(two), 1), "samples_per_s_spread": spread(two),
        "baseline": "replicas1", "baseline_samples_per_s": round(statistics.median(one), 1),
        "baseline_spread": spread(one), "ratio_metric": "samples_per_s",
        "ratio": round(statistics.median(ratios), 3), "ratio_spread": spread(ratios),
        "cpu_us_per_sample": round(statistics.median(cpu_two), 2),
        "baseline_cpu_us_per_sample": round(statistics.median(cpu_one), 2),
        "cpu_ceiling": round(statistics.median(ceilings), 3),
        "ratio_vs_cpu_ceiling": round(statistics.median(ratios) / statistics.median(ceilings), 3),
        "load": os.getloadavg()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
