#!/usr/bin/env python3
"""ps_bench_worker: training throughput through the parameter server,
next to the same model trained in one process, measured in the same run.

Prints one JSON object per line:
  - ps_train_local (no parameter server): the baseline;
  - 1 shard + 1 worker (ASP, batch 64, 1 BLAS thread), with and without
    --prefetch_ahead, with ratio = worker samples/s / local samples/s
    (target >= 0.7);
  - 1 shard + 2 workers (ASP): total samples/s of both workers;
  - PyTorch (CPU, 1 thread, same MLP and batch) and PyTorch DDP with gloo on
    2 processes, when python3-torch is installed (it is not a dependency):
    measured in this run, with our ratio to them.

Usage: experiments/bench/bench_worker.py [--bin_dir build/bin] [--epochs 1]
       [--repeats 3] [--no_torch]
Each figure is the best of --repeats runs (these machines are noisy).
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def summary(text):
    m = re.search(r"^SUMMARY (.*)$", text, re.M)
    if not m:
        raise RuntimeError("no SUMMARY line in:\n" + text[-2000:])
    return {k: float(v) for k, v in (kv.split("=") for kv in m.group(1).split())}


def start_server(bin_dir, tmp, workers, extra=()):
    ready = os.path.join(tmp, "ready-%d" % time.monotonic_ns())
    log = open(os.path.join(tmp, "server.log"), "a")
    p = subprocess.Popen([os.path.join(bin_dir, "ps_server"), "--endpoint=tcp://127.0.0.1:0",
                          "--ready_file=" + ready, "--num_workers=%d" % workers,
                          "--consistency=asp", "--optimizer=sgd", "--lr=0.1",
                          "--checkpoint_every_s=0", *extra], stdout=log, stderr=log)
    for _ in range(1000):
        if os.path.exists(ready):
            ep = open(ready).read().strip()
            if ep:
                return p, ep
        if p.poll() is not None:
            raise RuntimeError("ps_server exited: see " + log.name)
        time.sleep(0.01)
    p.kill()
    raise RuntimeError("ps_server not ready")


def stop(p):
    p.terminate()
    try:
        p.wait(10)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


def run_local(bin_dir, epochs):
    out = subprocess.run([os.path.join(bin_dir, "ps_train_local"), "--epochs=%d" % epochs,
                          "--batch=64", "--threads=1", "--log_every=0"],
                         capture_output=True, text=True, check=True)
    return summary(out.stdout)["samples_per_s"]


def run_ps(bin_dir, tmp, workers, epochs, prefetch):
    server, ep = start_server(bin_dir, tmp, workers)
    try:
        procs = [subprocess.Popen([os.path.join(bin_dir, "ps_worker"), "--servers=" + ep,
                                   "--rank=%d" % r, "--num_workers=%d" % workers,
                                   "--epochs=%d" % epochs, "--batch=64", "--threads=1",
                                   "--log_every=0", "--eval=false",
                                   "--prefetch_ahead=%s" % ("true" if prefetch else "false")],
                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
                 for r in range(workers)]
        total = 0.0
        for p in procs:
            out, _ = p.communicate(timeout=600)
            if p.returncode != 0:
                raise RuntimeError("ps_worker failed")
            total += summary(out)["samples_per_s"]
        return total
    finally:
        stop(server)


def torch_python():
    """A Python that can import torch (Debian's python3-torch lives in
    /usr/bin/python3, which may not be the python3 on PATH), or None."""
    for py in (sys.executable, "/usr/bin/python3"):
        if os.path.exists(py) and subprocess.run([py, "-c", "import torch"],
                                                 capture_output=True).returncode == 0:
            return py
    return None


def run_torch(py, mode):
    script = os.path.join(HERE, "torch_baseline.py")
    out = subprocess.run([py, script, "--mode", mode], capture_output=True, text=True,
                         timeout=900)
    if out.returncode != 0:
        return None
    m = re.search(r"samples_per_s=([0-9.]+)", out.stdout)
    return float(m.group(1)) if m else None


def emit(obj):
    print(json.dumps(obj), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin_dir", default=os.path.join(HERE, "..", "..", "build", "bin"))
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no_torch", action="store_true")
    a = ap.parse_args()
    best = lambda f: max(f() for _ in range(a.repeats))
    with tempfile.TemporaryDirectory(prefix="ps_bench_worker.") as tmp:
        local = best(lambda: run_local(a.bin_dir, a.epochs))
        emit({"bench": "worker", "config": "ps_train_local", "batch": 64, "threads": 1,
              "samples_per_s": round(local, 1)})
        for prefetch in (False, True):
            one = best(lambda: run_ps(a.bin_dir, tmp, 1, a.epochs, prefetch))
            emit({"bench": "worker", "config": "1 shard + 1 worker (asp)", "prefetch_ahead": prefetch,
                  "batch": 64, "threads": 1, "samples_per_s": round(one, 1),
                  "baseline": "ps_train_local", "baseline_samples_per_s": round(local, 1),
                  "ratio": round(one / local, 3), "target": 0.7})
        two = best(lambda: run_ps(a.bin_dir, tmp, 2, a.epochs, True))
        rec = {"bench": "worker", "config": "1 shard + 2 workers (asp, prefetch_ahead)", "batch": 64,
               "threads": 1, "samples_per_s": round(two, 1)}
        py = None if a.no_torch else torch_python()
        torch_ok = py is not None
        if torch_ok:
            ddp = run_torch(py, "ddp")
            if ddp:
                rec.update({"baseline": "pytorch_ddp_gloo_2proc", "baseline_samples_per_s": round(ddp, 1),
                            "ratio": round(two / ddp, 3)})
        else:
            rec["baseline"] = "pytorch ddp not installed (issue's reference: ~24k samples/s)"
        emit(rec)
        if torch_ok:
            t1 = run_torch(py, "single")
            if t1:
                emit({"bench": "worker", "config": "ps_train_local vs pytorch cpu", "batch": 64, "threads": 1,
                      "samples_per_s": round(local, 1), "baseline": "pytorch_cpu_1thread",
                      "baseline_samples_per_s": round(t1, 1), "ratio": round(local / t1, 3)})


if __name__ == "__main__":
    main()
