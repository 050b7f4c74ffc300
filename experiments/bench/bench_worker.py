#!/usr/bin/env python3
"""ps_bench_worker: training throughput through the parameter server,
next to the same model trained in one process, measured in the same run.

Prints one JSON object per line, each with its baseline and ratio:
  - ps_train_local (no parameter server): the baseline (its own row: the
    median of the local runs over their median, ratio 1, with the spread);
  - 1 shard + 1 worker (ASP, batch 64, 1 BLAS thread), with and without
    --prefetch_ahead, with ratio = worker samples/s / local samples/s
    (goal in goals.json: >= 0.85 with prefetch);
  - 1 shard + 2 workers (ASP): total samples/s of both workers, against
    PyTorch DDP when torch is installed, else against ps_train_local;
  - PyTorch (CPU, 1 thread, same MLP and batch) and PyTorch DDP with gloo on
    2 processes, when python3-torch is installed (it is not a dependency):
    measured in this run, with our ratio to them.

  - a step breakdown (STEP_TIME of ps_worker: compute, pull wait, pull copy,
    encode, push copy, send, clock, other; median ms per step over the
    repeats) and, with linux-perf installed, a CPU profile of one more worker
    run grouped into the same parts (compute, encode, copy, transport, ...)
    with its top symbols.

Usage: experiments/bench/bench_worker.py [--bin_dir build/bin] [--epochs 1]
       [--repeats 5] [--no_torch] [--no_profile]
Each figure is the median of --repeats runs, local and worker runs
interleaved, with the spread (min, max, quartiles) and the median of the
per-repeat ratios; load1 is the 1-minute load average at each repeat.
"""
import argparse
import json
import os
import re
import shutil
import statistics
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


def step_time(text):
    """The STEP_TIME line of a ps_worker's stdout as a dict (ms per step)."""
    m = re.search(r"^STEP_TIME (.*)$", text, re.M)
    if not m:
        return None
    return {k: float(v) for k, v in (kv.split("=") for kv in m.group(1).split())}


def run_ps(bin_dir, tmp, workers, epochs, prefetch, perf_data=None):
    """Total samples/s of `workers` ps_workers against one shard, and the
    STEP_TIME breakdown of each; with perf_data, worker 0 runs under
    `perf record` writing there."""
    server, ep = start_server(bin_dir, tmp, workers)
    try:
        procs = []
        for r in range(workers):
            argv = [os.path.join(bin_dir, "ps_worker"), "--servers=" + ep,
                    "--rank=%d" % r, "--num_workers=%d" % workers,
                    "--epochs=%d" % epochs, "--batch=64", "--threads=1",
                    "--log_every=0", "--eval=false",
                    "--prefetch_ahead=%s" % ("true" if prefetch else "false")]
            if perf_data and r == 0:
                argv = ["perf", "record", "-q", "-F", "999", "-o", perf_data, "--"] + argv
            procs.append(subprocess.Popen(argv, stdout=subprocess.PIPE,
                                          stderr=subprocess.DEVNULL, text=True))
        total, steps = 0.0, []
        for p in procs:
            out, _ = p.communicate(timeout=600)
            if p.returncode != 0:
                raise RuntimeError("ps_worker failed")
            total += summary(out)["samples_per_s"]
            steps.append(step_time(out))
        return total, steps
    finally:
        stop(server)


# perf symbols and libraries -> the part of a worker step they belong to.
PROFILE_CLASSES = [
    ("compute", re.compile(r"openblas|blas|gemm|Backend|Model|Relu|Softmax|CrossEntropy|"
                           r"ForwardBackward|Sgemm|sgemm|dgemm|kernel_", re.I)),
    ("encode", re.compile(r"compression|Codec|Qsgd|TernGrad|Sign|Bf16|TopK|Encode|Quantis", re.I)),
    ("copy", re.compile(r"memmove|memcpy|copy_user|_copy_to_iter|_copy_from_iter|rep_movs", re.I)),
    ("transport", re.compile(r"libzmq|zmq|tcp_|ip_|skb|sock|net_|__sys_|epoll|poll|"
                             r"libcapnp|capnp|libkj|eventfd|do_syscall", re.I)),
    ("data", re.compile(r"DataPartition|Batch|Shuffle|idx", re.I)),
    # The rest of the kernel's time: scheduling, wake-ups, interrupts.
    ("kernel_other", re.compile(r"kernel\.kallsyms")),
]


def profile_breakdown(perf_data):
    """Share of worker 0's CPU samples per step part, from perf report."""
    out = subprocess.run(["perf", "report", "-i", perf_data, "--stdio", "--no-children",
                          "--sort", "dso,sym", "--percent-limit", "0.01"],
                         capture_output=True, text=True)
    shares = {name: 0.0 for name, _ in PROFILE_CLASSES}
    shares["other"] = 0.0
    top = []
    for line in out.stdout.splitlines():
        m = re.match(r"\s*([0-9.]+)%\s+(\S+)\s+\[.\]\s+(.*)$", line)
        if not m:
            continue
        pct, dso, sym = float(m.group(1)), m.group(2), m.group(3).strip()
        if len(top) < 12:
            top.append({"percent": pct, "dso": dso, "symbol": sym[:80]})
        for name, rx in PROFILE_CLASSES:
            if rx.search(sym) or rx.search(dso):
                shares[name] += pct
                break
        else:
            shares["other"] += pct
    return {k: round(v, 1) for k, v in shares.items()}, top


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


def spread(values):
    v = sorted(values)
    n = len(v)
    q = lambda f: v[min(n - 1, int(round(f * (n - 1))))]
    return {"median": round(statistics.median(v), 3), "min": round(v[0], 3),
            "max": round(v[-1], 3), "p25": round(q(0.25), 3), "p75": round(q(0.75), 3), "n": n}


def median_steps(step_dicts):
    """Per-field median over repeats of worker 0's STEP_TIME breakdown."""
    rows = [d for d in step_dicts if d]
    if not rows:
        return None
    keys = [k for k in rows[0] if k not in ("rank", "steps")]
    return {k: round(statistics.median(r[k] for r in rows), 4) for k in keys}


def load():
    return round(os.getloadavg()[0], 2)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin_dir", default=os.path.join(HERE, "..", "..", "build", "bin"))
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--no_torch", action="store_true")
    ap.add_argument("--no_profile", action="store_true",
                    help="skip the perf profile of a worker step (needs linux-perf)")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="ps_bench_worker.") as tmp:
        # Interleaved: every repeat runs the local baseline and both worker
        # configurations back to back, so a burst of load hits all of them.
        local, ps = [], {False: [], True: []}
        steps = {False: [], True: []}
        loads = []
        for _ in range(a.repeats):
            loads.append(load())
            local.append(run_local(a.bin_dir, a.epochs))
            for prefetch in (False, True):
                sps, st = run_ps(a.bin_dir, tmp, 1, a.epochs, prefetch)
                ps[prefetch].append(sps)
                steps[prefetch].append(st[0])
        local_median = statistics.median(local)
        emit({"bench": "worker", "config": "ps_train_local", "batch": 64, "threads": 1,
              "samples_per_s": round(local_median, 1), "spread": spread(local),
              "baseline": "ps_train_local", "baseline_samples_per_s": round(local_median, 1),
              "ratio": 1.0, "ratio_spread": spread([l / local_median for l in local]),
              "step_ms": round(64e3 / local_median, 4), "load1": loads})
        for prefetch in (False, True):
            ratios = [o / l for o, l in zip(ps[prefetch], local)]
            emit({"bench": "worker", "config": "1 shard + 1 worker (asp)",
                  "prefetch_ahead": prefetch, "batch": 64, "threads": 1,
                  "samples_per_s": round(statistics.median(ps[prefetch]), 1),
                  "spread": spread(ps[prefetch]),
                  "baseline": "ps_train_local",
                  "baseline_samples_per_s": round(statistics.median(local), 1),
                  "ratio": round(statistics.median(ratios), 3), "ratio_spread": spread(ratios),
                  "step_time_ms": median_steps(steps[prefetch]), "load1": loads})
        if not a.no_profile and shutil.which("perf"):
            data = os.path.join(tmp, "worker.perf")
            sps, st = run_ps(a.bin_dir, tmp, 1, a.epochs, True, perf_data=data)
            shares, top = profile_breakdown(data)
            emit({"bench": "worker", "config": "1 shard + 1 worker (asp), prefetch_ahead, "
                  "under perf record", "samples_per_s": round(sps, 1),
                  "baseline": "ps_train_local", "baseline_samples_per_s": round(local_median, 1),
                  "ratio": round(sps / local_median, 3),
                  "step_time_ms": median_steps(st), "cpu_percent_by_part": shares,
                  "top_symbols": top, "load1": load()})
        two = [run_ps(a.bin_dir, tmp, 2, a.epochs, True)[0] for _ in range(a.repeats)]
        rec = {"bench": "worker", "config": "1 shard + 2 workers (asp, prefetch_ahead)", "batch": 64,
               "threads": 1, "samples_per_s": round(statistics.median(two), 1), "spread": spread(two)}
        py = None if a.no_torch else torch_python()
        torch_ok = py is not None
        if torch_ok:
            ddp = run_torch(py, "ddp")
            if ddp:
                rec.update({"baseline": "pytorch_ddp_gloo_2proc", "baseline_samples_per_s": round(ddp, 1),
                            "ratio": round(statistics.median(two) / ddp, 3)})
        if "ratio" not in rec:
            # No PyTorch DDP figure (not installed, or its run failed): the
            # total of two workers against one local process.
            rec.update({"baseline": "ps_train_local",
                        "baseline_samples_per_s": round(local_median, 1),
                        "ratio": round(statistics.median(two) / local_median, 3)})
        emit(rec)
        if torch_ok:
            t1 = run_torch(py, "single")
            if t1:
                emit({"bench": "worker", "config": "ps_train_local vs pytorch cpu", "batch": 64, "threads": 1,
                      "samples_per_s": round(statistics.median(local), 1), "baseline": "pytorch_cpu_1thread",
                      "baseline_samples_per_s": round(t1, 1),
                      "ratio": round(statistics.median(local) / t1, 3)})


if __name__ == "__main__":
    main()
