#!/usr/bin/env python3
"""bench_pytorch: PyTorch models trained through asyncps (the Python
package) next to same-run PyTorch baselines. One JSON object per line; each
figure is the median of --repeats runs with its spread (min, max).

  1. one process vs 1 shard + 1 worker (ASP, --prefetch_ahead): the example
     script (worker/python/examples/{mlp,cnn}.py) with --local (PyTorch SGD
     in the process) and through the shard; ratio = PS / local (target 0.85);
  2. 1 shard + 2 workers (ASP, prefetch_ahead) vs PyTorch DDP (gloo, 2
     processes on 127.0.0.1, torch_baseline.py): total samples/s, ratio
     (targets: MLP 1.2, CNN 1.05);
  3. the per-step time of the parameter-server calls without compute for
     ps_worker's MLP (784-256-128-10), 1 shard: the C++ store
     (ps_py_crosscheck --mode=loop), asyncps.Store with numpy buffers and
     asyncps.torch.ParameterServer.step(); python_overhead_us = difference.

Every process uses one thread. Usage:
  PYTHONPATH=build/python /usr/bin/python3 experiments/bench/bench_pytorch.py \\
      [--bin_dir build/bin] [--repeats 5] [--quick] [--only mlp,cnn,overhead]
--quick (CI): few steps and one repeat, figures only indicative.
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
REPO = os.path.dirname(os.path.dirname(HERE))
EXAMPLES = os.path.join(REPO, "worker", "python", "examples")
import bench_stats
import bench_worker  # start_server, stop, summary, emit

PY = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
MLP_SPECS = "fc0.weight:784x256:he_normal:0:1,fc0.bias:256:zeros:0:1," \
            "fc1.weight:256x128:he_normal:0:1,fc1.bias:128:zeros:0:1," \
            "fc2.weight:128x10:he_normal:0:1,fc2.bias:10:zeros:0:1"


def env():
    e = dict(os.environ, OMP_NUM_THREADS="1")
    pkg = os.path.join(os.path.dirname(os.path.abspath(bench_worker.__file__)), "..", "..",
                       "build", "python")
    if "PYTHONPATH" not in e and os.path.isdir(pkg):
        e["PYTHONPATH"] = os.path.abspath(pkg)
    return e


def spread(values):
    return bench_stats.spread(values, 1)


def ratio_spread(values):
    return bench_stats.spread(values, 3, count=None)


def script_args(model, steps):
    return [PY, os.path.join(EXAMPLES, model + ".py"), "--eval=false", "--log_every=0",
            "--threads=1"] + (["--max_steps=%d" % steps] if steps else ["--epochs=1"])


def run_local(model, steps):
    out = subprocess.run(script_args(model, steps) + ["--local"], capture_output=True, text=True,
                         check=True, env=env(), timeout=3600)
    return bench_worker.summary(out.stdout)["samples_per_s"]


def run_ps(bin_dir, tmp, model, workers, steps):
    server, ep = bench_worker.start_server(bin_dir, tmp, workers)
    try:
        procs = [subprocess.Popen(script_args(model, steps) + [
            "--servers=" + ep, "--rank=%d" % r, "--num_workers=%d" % workers,
            "--prefetch_ahead"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
            env=env()) for r in range(workers)]
        total = 0.0
        for p in procs:
            out, _ = p.communicate(timeout=3600)
            if p.returncode != 0:
                raise RuntimeError("%s worker failed" % model)
            total += bench_worker.summary(out)["samples_per_s"]
        return total
    finally:
        bench_worker.stop(server)


def run_ddp(model, steps, port):
    out = subprocess.run([PY, os.path.join(HERE, "torch_baseline.py"), "--mode", "ddp",
                          "--model", model, "--max_steps", str(steps or 0), "--port", str(port)],
                         capture_output=True, text=True, env=env(), timeout=3600)
    if out.returncode != 0:
        raise RuntimeError("torch_baseline.py failed:\n" + out.stderr[-2000:])
    return float(re.search(r"samples_per_s=([0-9.]+)", out.stdout).group(1))


OVERHEAD_PY = r"""
import sys, time, numpy as np, torch, asyncps, asyncps.torch as apt
sys.path.insert(0, sys.argv[3])
import mlp
torch.set_num_threads(1)
ep, steps, mode = sys.argv[1], int(sys.argv[2]), sys.argv[4]
layers = [784, 256, 128, 10]
warm = 10
if mode == "store":
    specs = [asyncps.TensorSpec(n, s, i, 0.0, 1) for n, s, i in [
        ("fc0.weight", [784, 256], "he_normal"), ("fc0.bias", [256], "zeros"),
        ("fc1.weight", [256, 128], "he_normal"), ("fc1.bias", [128], "zeros"),
        ("fc2.weight", [128, 10], "he_normal"), ("fc2.bias", [10], "zeros")]]
    st = asyncps.Store(asyncps.Client([ep], rank=0), specs, prefetch_ahead=True)
    w = [np.zeros(s.shape, np.float32) for s in specs]
    g = [np.zeros(s.shape, np.float32) for s in specs]
    for c in range(warm + steps):
        if c == warm:
            t0 = time.perf_counter()
        st.pull(c, w); st.push(c, g); st.clock(c + 1)
    dt = time.perf_counter() - t0
    st.close()
else:
    m = mlp.Mlp(layers)
    ps = apt.ParameterServer(m, servers=[ep], rank=0, num_workers=1, prefetch_ahead=True,
                             init=mlp.init(layers))
    for p in m.parameters():
        p.grad = torch.zeros_like(p)
    for c in range(warm + steps):
        if c == warm:
            t0 = time.perf_counter()
        ps.step()
    dt = time.perf_counter() - t0
    ps.close()
print("us_per_step=%.2f" % (dt / steps * 1e6))
"""


def overhead_once(bin_dir, tmp, steps):
    out = {}
    for kind in ("cpp", "store", "torch"):
        server, ep = bench_worker.start_server(bin_dir, tmp, 1)
        try:
            if kind == "cpp":
                argv = [os.path.join(bin_dir, "ps_py_crosscheck"), "--mode=loop",
                        "--servers=" + ep, "--tensors=" + MLP_SPECS, "--steps=%d" % steps,
                        "--prefetch_ahead"]
            else:
                argv = [PY, "-c", OVERHEAD_PY, ep, str(steps), EXAMPLES, kind]
            r = subprocess.run(argv, capture_output=True, text=True, env=env(), timeout=600)
            if r.returncode != 0:
                raise RuntimeError("%s loop failed:\n%s" % (kind, r.stderr[-2000:]))
            out[kind] = float(re.search(r"us_per_step=([0-9.]+)", r.stdout).group(1))
        finally:
            bench_worker.stop(server)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin_dir", default=os.path.join(REPO, "build", "bin"))
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="CI: few steps, one repeat")
    ap.add_argument("--only", default="mlp,cnn,overhead")
    a = ap.parse_args()
    repeats = 1 if a.quick else a.repeats
    only = set(a.only.split(","))
    targets = {"mlp": (0.85, 1.2), "cnn": (0.85, 1.05)}
    steps = {"mlp": 60 if a.quick else 0, "cnn": 20 if a.quick else 300}
    port = 29600 + os.getpid() % 300
    with tempfile.TemporaryDirectory(prefix="bench_pytorch.") as tmp:
        for model in ("mlp", "cnn"):
            if model not in only:
                continue
            n = steps[model]
            local, one, two, ddp = [], [], [], []
            for _ in range(repeats):  # interleaved: drifts in machine load hit all alike
                local.append(run_local(model, n))
                one.append(run_ps(a.bin_dir, tmp, model, 1, n))
                two.append(run_ps(a.bin_dir, tmp, model, 2, n))
                ddp.append(run_ddp(model, n, port))
            for config, got, baseline, base, target in (
                    ("1 shard + 1 worker (asp, prefetch_ahead) vs one process", one,
                     "pytorch_one_process", local, targets[model][0]),
                    ("1 shard + 2 workers (asp, prefetch_ahead) vs pytorch ddp (gloo, 2 "
                     "processes)", two, "pytorch_ddp_gloo_2proc", ddp, targets[model][1])):
                bench_worker.emit({
                    "bench": "pytorch", "model": model, "config": config, "batch": 64,
                    "threads": 1, "steps_per_worker": n or "1 epoch",
                    "samples_per_s": spread(got), "baseline": baseline,
                    "baseline_samples_per_s": spread(base),
                    "ratio": ratio_spread([g / b for g, b in zip(got, base)]),
                    "target": target})
        if "overhead" in only:
            runs = [overhead_once(a.bin_dir, tmp, 200 if a.quick else 2000)
                    for _ in range(repeats)]
            cpp = [r["cpp"] for r in runs]
            for kind, what in (("store", "asyncps.Store (numpy)"),
                               ("torch", "asyncps.torch.ParameterServer.step()")):
                vals = [r[kind] for r in runs]
                extra = [r[kind] - r["cpp"] for r in runs]
                # ratio: time per step against the C++ store's (lower is faster).
                bench_worker.emit({
                    "bench": "pytorch", "model": "mlp 784-256-128-10", "config":
                    "pull+push+clock per step without compute, 1 shard, prefetch_ahead",
                    "python_layer": what, "us_per_step": spread(vals),
                    "baseline": "c++ PsParameterStore", "baseline_us_per_step": spread(cpp),
                    "ratio_metric": "us_per_step (lower is faster)",
                    "ratio": ratio_spread([r[kind] / r["cpp"] for r in runs]),
                    "python_overhead_us": spread(extra)})


if __name__ == "__main__":
    main()
