#!/usr/bin/env python3
"""bench_asp_link: where the step of an ASP + prefetch_ahead worker goes on a
shaped link (issue 22: asyncps.torch ASP + prefetch_ahead against DDP). One
JSON object per line: per mode, the median step time and pull wait of the
workers over --repeats runs (runs interleaved), with their spread.

Same fleet and test bed as bench_overlap.py's `link` setting: 2 ASP shards on
emulated hosts h0, h1, 2 workers on h2, h3, every host's link shaped to
--rate both ways (launch/pslaunch/netns.py; root). Each worker runs the
CNN's tensors (worker/python/examples/cnn.py, 1.8 MB) through asyncps.Store
with prefetch_ahead and no compute of its own: the compute is a sleep
(--compute_ms, the CNN's forward + backward at batch 64 on one thread here),
so the figures are the network's and the store's, not the CPU's. Modes:

  pull_only    clock and pull, no push: the link's one-way floor per step
  late         sleep, then push every chunk, clock, pull (prefetch_ahead)
  early        the large layer's chunks pushed --early_ms into the sleep
               (as asyncps.overlap's first bucket leaves during backward),
               the rest at its end
  late_lane,   as late / early, with the pulls on a second connection per
  early_lane   shard (a second asyncps.Client of the same rank): the pull
               request no longer waits behind the previous push's bytes on
               the one connection. Not a mode asyncps offers: a measurement
               of what such a lane would buy (it would also let the pull of
               step c + 1 overtake the push of step c - 1)

Usage (as root):
  PYTHONPATH=build/python /usr/bin/python3 experiments/bench/bench_asp_link.py \\
      [--repeats 3] [--steps 40] [--rate 100mbit] [--compute_ms 57] [--early_ms 25] \\
      [--send_buffer_kb 0]
--quick (CI): one run of 4 steps per mode, figures only indicative; without
root, ip or tc it exits 77 (skipped), as every test bed's test does.
Results and analysis: experiments/results/overlap/REPORT.md.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import bench_overlap as bo  # the fleet and its test bed (and launch/, the examples on sys.path)
import bench_stats

MODES = ("pull_only", "late", "early", "late_lane", "early_lane")
LARGE_TENSOR = 8  # cnn.make_cnn()'s '9.weight', 1.6 of its 1.8 MB


def worker_main(a):
    """One worker: prints a JSON object with its step times (ms)."""
    import numpy as np
    import asyncps
    import asyncps.torch as apt
    import cnn
    _, params, specs = apt.tensor_specs(cnn.make_cnn())
    servers = a.servers.split(",")
    client = asyncps.Client(servers, rank=a.rank, heartbeat_s=1.0,
                            send_buffer_kb=a.send_buffer_kb)
    client.register(specs)
    store = asyncps.Store(client, specs, prefetch_ahead=True)
    pulls = store
    if a.mode.endswith("_lane"):
        lane = asyncps.Client(servers, rank=a.rank, send_buffer_kb=a.send_buffer_kb)
        lane.register(specs)
        pulls = asyncps.Store(lane, specs, prefetch_ahead=True)
    chunks = client.chunks()
    large = [c for c, t, *_ in chunks if t == LARGE_TENSOR]
    rest = [c for c, t, *_ in chunks if t != LARGE_TENSOR]
    bufs = [np.zeros(s.shape, np.float32) for s in specs]
    grads = [np.zeros(s.shape, np.float32) for s in specs]
    pulls.pull(0, bufs)
    steps, waits, last = [], [], time.perf_counter()
    for c in range(a.warmup + a.steps):
        if a.mode.startswith("early"):
            time.sleep(a.early_ms / 1e3)
            store.push_chunks(c, large, grads)
            time.sleep(max(0.0, a.compute_ms - a.early_ms) / 1e3)
            store.push_chunks(c, rest, grads)
        else:
            time.sleep(a.compute_ms / 1e3)
            if a.mode != "pull_only":
                store.push(c, grads)
        store.clock(c + 1)
        if pulls is not store and c % 16 == 15:
            store.wait_acks()  # this store's pull, which collects them, is not called
        t = time.perf_counter()
        pulls.pull(c + 1, bufs)
        now = time.perf_counter()
        if c >= a.warmup:
            steps.append((now - last) * 1e3)
            waits.append((now - t) * 1e3)
        last = now
    store.close()
    if pulls is not store:
        pulls.close()
    print(json.dumps({"step_ms": steps, "wait_ms": waits}), flush=True)


def run_mode(fleet, tmp, a, mode):
    shards, eps = bo.start_shards(fleet, tmp, a.bin_dir, "asp", 2, a.send_buffer_kb)
    try:
        procs = [subprocess.Popen(
            fleet.prefix(bo.SHARD_HOSTS + r) +
            [bo.PY, os.path.abspath(__file__), "--worker", "--servers", ",".join(eps),
             "--rank", str(r), "--mode", mode, "--steps", str(a.steps),
             "--warmup", str(a.warmup), "--compute_ms", str(a.compute_ms),
             "--early_ms", str(a.early_ms), "--send_buffer_kb", str(a.send_buffer_kb)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=fleet.env())
            for r in range(bo.WORKERS)]
        out = []
        for p in procs:
            o, e = p.communicate(timeout=600)
            if p.returncode != 0:
                raise RuntimeError("worker failed (%s):\n%s" % (mode, e[-3000:]))
            out.append(json.loads(o.strip().splitlines()[-1]))
        return out
    finally:
        bo.stop_all(shards)


def bench(setting, fleet, tmp, a):
    if setting != "link":
        raise SystemExit("bench_asp_link measures the shaped link only (--settings link)")
    got = {m: {"step": [], "wait": []} for m in a.modes}
    for _ in range(a.repeats):
        for mode in a.modes:  # interleaved: load drifts hit every mode alike
            for w in run_mode(fleet, tmp, a, mode):
                got[mode]["step"].append(statistics.median(w["step_ms"]))
                got[mode]["wait"].append(statistics.median(w["wait_ms"]))
    for mode, g in got.items():  # every worker of every run reported; a wait is part of a step
        if len(g["step"]) != a.repeats * bo.WORKERS or not all(
                0 < w <= s for w, s in zip(g["wait"], g["step"])):
            raise RuntimeError("%s: bad step figures %s" % (mode, g))
    floor = statistics.median(got["pull_only"]["step"]) if "pull_only" in got else None
    for mode in a.modes:
        row = {"bench": "asp_link", "model": "cnn tensors (1.8 MB)", "setting": "link",
               "link": a.rate, "consistency": "asp", "prefetch_ahead": True, "shards": 2,
               "workers": bo.WORKERS, "mode": mode, "compute_ms": a.compute_ms,
               "early_ms": a.early_ms if mode.startswith("early") else None,
               "send_buffer_kb": a.send_buffer_kb,
               "steps_per_worker": a.steps,
               "step_ms": bench_stats.spread(got[mode]["step"], 1, "samples"),
               "pull_wait_ms": bench_stats.spread(got[mode]["wait"], 1, "samples"),
               "samples_note": "one per worker and run (its median step)"}
        if floor:
            row["baseline"] = "pull_only"
            row["ratio_to_pull_only"] = round(statistics.median(got[mode]["step"]) / floor, 3)
        bo.emit(row)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    bo.add_fleet_args(ap)
    ap.set_defaults(settings="link", repeats=3, consistency="asp")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--compute_ms", type=float, default=57.0,
                    help="the worker's compute per step, a sleep (the CNN's forward + "
                    "backward at batch 64, one thread, on this machine)")
    ap.add_argument("--early_ms", type=float, default=25.0,
                    help="early modes: when the large layer's gradient is pushed")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--send_buffer_kb", type=int, default=0,
                    help="ps_server --send_buffer_kb and Client(send_buffer_kb=) (0: the OS's)")
    ap.add_argument("--quick", action="store_true",
                    help="CI: 1 repeat of 4 steps; exits 77 (skipped) without the test bed")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--servers", help=argparse.SUPPRESS)
    ap.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--mode", default="late", help=argparse.SUPPRESS)
    a = ap.parse_args()
    a.modes = a.modes.split(",")
    unknown = [m for m in a.modes if m not in MODES]
    if unknown:
        ap.error("unknown mode(s) %s; known: %s" % (", ".join(unknown), ", ".join(MODES)))
    if a.worker:
        return worker_main(a)
    if a.quick:
        a.repeats, a.steps, a.warmup = 1, 4, 1
    from pslaunch import netns
    missing = netns.unavailable("aspl%d" % os.getpid())
    if missing:
        print("SKIP: %s" % missing, file=sys.stderr)
        return 77
    bo.run_settings(ap, a, "aspl", bench)


if __name__ == "__main__":
    sys.exit(main())
