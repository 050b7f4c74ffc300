#!/usr/bin/env python3
"""Training with replicated shards against the same training without: psrun
fleets of S shards and W workers training the MLP on Fashion-MNIST, with
--replicas 2 (every update applied by a backup before it is acknowledged; a
local etcd) and with --replicas 1 (the static fleet), alternating, --repeats
times each. One JSON line: samples/s of both (median and spread), ratio =
replicated / single (median of the per-repeat ratios).

  experiments/bench/bench_replication.py --repeats 5
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

import bench_stats

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))
PSRUN = os.path.join(REPO, "launch", "psrun")


def run(bin_dir, work, replicas, servers, workers, steps, layers):
    run_dir = os.path.join(work, "r%d-%d" % (replicas, len(os.listdir(work))))
    argv = [sys.executable, PSRUN, "--servers", str(servers), "--workers", str(workers),
            "--run_dir", run_dir, "--bin_dir", bin_dir, "--progress", "off", "--quiet",
            "--server_flags", "--consistency=asp --optimizer=sgd --lr=0.05"]
    if replicas > 1:
        argv += ["--replicas", str(replicas)]
    argv += ["--", "--layers=" + layers, "--batch=64", "--epochs=1", "--max_steps=%d" % steps,
             "--log_every=1000", "--threads=1", "--eval=false"]
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   timeout=600)
    with open(os.path.join(run_dir, "summary.json")) as f:
        return json.load(f)["totals"]["samples_per_s"]


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
        one, two = [], []
        for _ in range(a.repeats):
            one.append(run(a.bin_dir, work, 1, a.servers, a.workers, a.steps, a.layers))
            two.append(run(a.bin_dir, work, 2, a.servers, a.workers, a.steps, a.layers))
    ratios = [t / o for t, o in zip(two, one)]
    print(json.dumps({
        "bench": "replication", "op": "train", "mode": "replicas2", "layers": a.layers,
        "servers": a.servers, "workers": a.workers, "steps": a.steps,
        "samples_per_s": round(statistics.median(two), 1), "samples_per_s_spread": spread(two),
        "baseline": "replicas1", "baseline_samples_per_s": round(statistics.median(one), 1),
        "baseline_spread": spread(one), "ratio_metric": "samples_per_s",
        "ratio": round(statistics.median(ratios), 3), "ratio_spread": spread(ratios),
        "load": os.getloadavg()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
