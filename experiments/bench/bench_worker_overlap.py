#!/usr/bin/env python3
"""bench_worker_overlap: the C++ ps_worker with --overlap (pushes per shard or
layer during backward, per-shard clocks, pulls by layer groups waited for
on first use; worker/overlap.h) against the same fleet without it, measured
in the same run. One JSON object per line; each figure is the median of
--repeats runs with its spread (min, max), plain and overlapped runs
interleaved; load1 is the 1-minute load average before each repeat.

Fleet: --shards ps_server shards (--consistency, SGD) + 2 ps_worker
processes (CPU backend, 1 BLAS thread, the MLP --layers on Fashion-MNIST),
each --steps steps (--max_steps; the SUMMARY line's samples/s, which leaves
out loading the data); samples/s = the two workers' sum.

Settings (the test beds of bench_overlap.py):
  loopback  every process on 127.0.0.1, unshaped (goal: >= 0.97x);
  link      4 emulated hosts (launch/pslaunch/netns.py; root): shards on
            h0, h1 (shard i on h(i % 2)), the workers on h2, h3, each host's
            link shaped to --rate both ways (communication-bound).

Usage (as root for `link`):
  /usr/bin/python3 experiments/bench/bench_worker_overlap.py \\
      [--bin_dir build/bin] [--repeats 5] [--settings loopback,link] \\
      [--rate 100mbit] [--shards 4] [--pipeline_shards 2] [--batches 64]
--codec SPEC gives every ps_worker --codec=SPEC (push compression).
--compare_sender_thread: both runs overlap, the measured one with
--overlap_sender_thread (compression, pushes and stage waits on a thread of
their own while backward goes on), the baseline without; with a
compressing --codec that is where the thread pays:
  /usr/bin/python3 experiments/bench/bench_worker_overlap.py --settings loopback \
      --compare_sender_thread --codec topk:ratio=0.01,ef=1 --shards 2 \
      --pipeline_shards 0 --repeats 7 --steps 600
--quick (CI): loopback only, few steps, one repeat: figures only indicative.
Results: experiments/results/overlap/ (REPORT.md, bench_worker_overlap.jsonl).
"""
import argparse
import os
import re
import statistics
import subprocess
import sys

import bench_overlap  # Fleet, start_shards, stop_all, emit (and launch/, the examples on sys.path)
import bench_stats
import bench_worker  # summary, step_time

WORKERS = bench_overlap.WORKERS
SHARD_HOSTS = bench_overlap.SHARD_HOSTS


def run_fleet(fleet, tmp, a, batch, overlap, sender_thread=False):
    """Sum of the workers' samples/s and their STEP_TIME lines."""
    shards, eps = bench_overlap.start_shards(fleet, tmp, a.bin_dir, a.consistency, a.shards)
    try:
        procs = []
        for r in range(WORKERS):
            argv = [os.path.join(a.bin_dir, "ps_worker"), "--servers=" + ",".join(eps),
                    "--rank=%d" % r, "--num_workers=%d" % WORKERS, "--device=cpu",
                    "--threads=1", "--layers=" + a.layers, "--batch=%d" % batch,
                    "--epochs=0", "--max_steps=%d" % a.steps, "--eval=false",
                    "--log_every=0", "--chunk_elems=%d" % a.chunk_elems]
            if a.codec:
                argv.append("--codec=" + a.codec)
            if overlap:
                argv += ["--overlap", "--pipeline_shards=%d" % a.pipeline_shards]
            if sender_thread:
                argv.append("--overlap_sender_thread")
            host = SHARD_HOSTS + r if fleet.net else 0
            procs.append(subprocess.Popen(fleet.prefix(host) + argv, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True,
                                          env=fleet.env()))
        total, steps, errors = 0.0, [], []
        for p in procs:
            try:
                out, err = p.communicate(timeout=900)
            except subprocess.TimeoutExpired:
                bench_overlap.stop_all(procs)
                raise
            if p.returncode != 0:
                errors.append(err[-3000:])
                continue
            total += bench_worker.summary(out)["samples_per_s"]
            step = bench_worker.step_time(out)
            m = re.search(r"^OVERLAP (.*)$", out, re.M)
            if step and m:  # stage waits, ms per step (in STEP_TIME's other_ms)
                ov = dict(kv.split("=") for kv in m.group(1).split())
                step["stage_wait_ms"] = float(ov["stage_wait_ms"]) / max(1.0, step["steps"])
            steps.append(step)
        if errors:
            raise RuntimeError("a ps_worker failed:\n" + "\n".join(errors))
        return total, steps
    finally:
        bench_overlap.stop_all(shards)


def median_step_time(runs):
    """Median over repeats and workers of each STEP_TIME field (ms/step)."""
    rows = [s for run in runs for s in run if s]
    keys = [k for k in rows[0] if k.endswith("_ms")] if rows else []
    return {k: round(statistics.median(r[k] for r in rows), 3) for k in keys}


def bench_setting(setting, fleet, tmp, a):
    for batch in [int(b) for b in a.batches.split(",")]:
        plain, over, plain_st, over_st, loads = [], [], [], [], []
        for _ in range(a.repeats):  # interleaved: load drifts hit both alike
            loads.append(round(os.getloadavg()[0], 2))
            # --compare_sender_thread: the baseline overlaps too.
            rate, st = run_fleet(fleet, tmp, a, batch, a.compare_sender_thread)
            plain.append(rate)
            plain_st.append(st)
            rate, st = run_fleet(fleet, tmp, a, batch, True, a.compare_sender_thread)
            over.append(rate)
            over_st.append(st)
        bench_overlap.emit({
            "bench": "worker_overlap", "model": "mlp-" + a.layers.replace(",", "-"),
            "setting": setting, "link": a.rate if setting == "link" else "loopback",
            "consistency": a.consistency, "shards": a.shards, "workers": WORKERS,
            "batch": batch, "threads": 1, "chunk_elems": a.chunk_elems,
            "pipeline_shards": a.pipeline_shards, "steps_per_worker": a.steps,
            "codec": a.codec or "none",
            "sender_thread": a.compare_sender_thread,
            "samples_per_s": bench_stats.spread(over, 1),
            "baseline": ("ps_worker_overlap_no_sender_thread" if a.compare_sender_thread
                         else "ps_worker_no_overlap"),
            "baseline_samples_per_s": bench_stats.spread(plain, 1),
            "ratio": bench_stats.spread([o / p for o, p in zip(over, plain)], 3),
            "target": (None if a.compare_sender_thread
                       else 0.97 if setting == "loopback" else 1.3),
            "step_time_ms": median_step_time(over_st),
            "baseline_step_time_ms": median_step_time(plain_st),
            "load1": loads})


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    bench_overlap.add_fleet_args(ap)
    ap.add_argument("--batches", default="64")
    ap.add_argument("--layers", default="784,256,128,10")
    ap.add_argument("--shards", type=int, default=4,
                    help="ps_server shards (link: shard i on host i %% 2)")
    ap.add_argument("--pipeline_shards", type=int, default=2,
                    help="the overlapped runs' --pipeline_shards (0: no stages)")
    ap.add_argument("--chunk_elems", type=int, default=1 << 20)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--codec", default="", help="every ps_worker's --codec (push compression)")
    ap.add_argument("--compare_sender_thread", action="store_true",
                    help="overlap with --overlap_sender_thread vs overlap without")
    ap.add_argument("--quick", action="store_true", help="CI: loopback, few steps, 1 repeat")
    a = ap.parse_args()
    if a.quick:
        a.settings, a.repeats, a.steps = "loopback", 1, 30
    bench_overlap.run_settings(ap, a, "wov", bench_setting)

if __name__ == "__main__":
    sys.exit(main())
