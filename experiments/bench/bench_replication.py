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

--consistency bsp trains under BSP instead of ASP (rows "op": "train_bsp").
--compare_aggregation (BSP) runs three fleets per repeat, interleaved in a
rotating order: R=2 with replication after aggregation (ps_server
--replicate_after_aggregation, one record per round to the backup), R=2
handing on every push (--replicate_after_aggregation=false) and R=1; three
JSON lines: each R=2 mode against R=1, and aggregated against per-push, with
load1 at the start of every repeat.

--compare_overlap (BSP) runs the C++ worker with and without --overlap
--pipeline_shards=K (pushes per shard during backward, per-shard clocks,
pushes in stages that wait until K clocked shards received their pushes:
worker/overlap.h), with R=2 and R=1, four fleets per repeat in a rotating
order, on --emulate_hosts N hosts (--shard_hosts M of them for the shards,
each replica of a group on another host, --link RATE both ways; root):
a stage waits for arrival (a heartbeat behind the pushes), not for the
acknowledgements a replicated primary holds until the round closed and its
backups have the record (rows before commit b621656 waited for those, and
lost: 0.969x of plain with R=2). Rows: R=2
overlap vs R=2 plain, R=1 overlap vs R=1 plain, R=2 overlap vs R=1 overlap,
R=2 plain vs R=1 plain, plus the workers' median stage wait per step.

--model cnn trains the PyTorch CNN of worker/python/examples/cnn.py
(psrun --worker_cmd, Debian's python3; --layers unused; rows carry "model")
instead of ps_worker's MLP: about 20x the worker compute per sample, so the
shards' and backups' share of the cores is small.

Each worker runs --steps steps (--epochs=0 --max_steps; rows committed
before 2026-12-05 ran --epochs=1, which ended each worker after its share of
one epoch: 468 steps with 2 workers, 234 with 4).

  experiments/bench/bench_replication.py --repeats 5
  experiments/bench/bench_replication.py --baseline_bin_dir OLD/bin --repeats 5
  experiments/bench/bench_replication.py --model cnn --workers 4 --steps 150 --repeats 5
  experiments/bench/bench_replication.py --consistency bsp --compare_aggregation --repeats 5
  experiments/bench/bench_replication.py --consistency bsp --compare_overlap --servers 4 \
      --emulate_hosts 4 --shard_hosts 2 --link 100mbit --steps 100 --repeats 5
"""
import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile

import bench_stats

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))
PSRUN = os.path.join(REPO, "launch", "psrun")
CNN_CMD = "/usr/bin/python3 " + os.path.join(REPO, "worker", "python", "examples", "cnn.py")
BATCH = 64  # default of --batch


def run(bin_dir, work, replicas, servers, workers, steps, layers, consistency="asp",
        aggregate=True, psrun_flags=(), worker_flags=(), stage_waits=None, batch=BATCH,
        model="mlp"):
    run_dir = os.path.join(work, "r%d-%d" % (replicas, len(os.listdir(work))))
    server_flags = "--consistency=%s --optimizer=sgd --lr=0.05" % consistency
    server_flags += " --replicate_after_aggregation=%s" % ("true" if aggregate else "false")
    argv = [sys.executable, PSRUN, "--servers", str(servers), "--workers", str(workers),
            "--run_dir", run_dir, "--bin_dir", bin_dir, "--progress", "off", "--quiet",
            "--server_flags", server_flags]
    if replicas > 1:
        argv += ["--replicas", str(replicas)]
    argv += list(psrun_flags)
    if model == "cnn":
        argv += ["--worker_cmd", CNN_CMD, "--"]
    else:
        argv += ["--", "--layers=" + layers]
    argv += ["--batch=%d" % batch, "--epochs=0",
             "--max_steps=%d" % steps,
             "--log_every=1000", "--threads=1", "--eval=false"] + list(worker_flags)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   timeout=600)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    # CPU of psrun and every process it started and waited for (shards,
    # workers, etcd): they count toward psrun's children, and so ours.
    cpu_s = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    with open(os.path.join(run_dir, "summary.json")) as f:
        totals = json.load(f)["totals"]
    if stage_waits is not None:
        # The overlap scheduler's OVERLAP line: stage waits per step, each worker.
        for w in range(workers):
            with open(os.path.join(run_dir, "worker-%d.log" % w)) as f:
                m = re.search(r"OVERLAP .*steps=(\d+) .*stage_wait_ms=([0-9.]+)", f.read())
            if m and int(m.group(1)) > 0:
                stage_waits.append(float(m.group(2)) / int(m.group(1)))
    return totals["samples_per_s"], cpu_s / max(1, totals["steps"] * batch) * 1e6


def spread(v):
    return bench_stats.spread(v, count="n")


def row(a, mode, baseline, runs, base_runs, loads):
    """One JSON line: `runs` (rate, cpu) against `base_runs`, same repeats."""
    rates, cpus = [r for r, _ in runs], [c for _, c in runs]
    base_rates, base_cpus = [r for r, _ in base_runs], [c for _, c in base_runs]
    ratios = [t / o for t, o in zip(rates, base_rates)]
    # Where the cores are the limit, `mode` reaches at most cpu(base) / cpu(mode).
    ceilings = [c1 / c2 for c1, c2 in zip(base_cpus, cpus)]
    out = {
        "bench": "replication", "op": "train" if a.consistency == "asp" else "train_bsp",
        "mode": mode, "consistency": a.consistency, "model": a.model,
        "layers": a.layers if a.model == "mlp" else "",
        "servers": a.servers, "workers": a.workers, "steps": a.steps, "batch": a.batch,
        "samples_per_s": round(statistics.median(rates), 1), "samples_per_s_spread": spread(rates),
        "baseline": baseline, "baseline_samples_per_s": round(statistics.median(base_rates), 1),
        "baseline_spread": spread(base_rates), "ratio_metric": "samples_per_s",
        "ratio": round(statistics.median(ratios), 3), "ratio_spread": spread(ratios),
        "cpu_us_per_sample": round(statistics.median(cpus), 2),
        "baseline_cpu_us_per_sample": round(statistics.median(base_cpus), 2),
        "cpu_ceiling": round(statistics.median(ceilings), 3),
        "ratio_vs_cpu_ceiling": round(statistics.median(ratios) / statistics.median(ceilings), 3),
        "load": os.getloadavg()}
    if loads:
        out["load1_per_repeat"] = loads
    return json.dumps(out)


def interleaved(a, modes):
    """Runs every mode (name, run()'s keyword arguments) once per repeat, in
    an order rotating by one each repeat: {name: [(rate, cpu)]}, load1 at the
    start of each repeat."""
    runs = {m: [] for m, _ in modes}
    loads = []
    with tempfile.TemporaryDirectory(prefix="bench-replication-") as work:
        for i in range(a.repeats):
            loads.append(round(os.getloadavg()[0], 2))
            k = i % len(modes)
            for m, kw in modes[k:] + modes[:k]:
                kw = dict(kw)
                bin_dir = kw.pop("bin_dir", a.bin_dir)
                runs[m].append(run(bin_dir, work, servers=a.servers, workers=a.workers,
                                   steps=a.steps, layers=a.layers,
                                   consistency=a.consistency, batch=a.batch, model=a.model,
                                   **kw))
    return runs, loads


def compare_aggregation(a):
    """R=2 aggregated, R=2 per push and R=1, interleaved (rotating order)."""
    runs, loads = interleaved(a, [
        ("replicas2_aggregated", {"replicas": 2, "aggregate": True}),
        ("replicas2_per_push", {"replicas": 2, "aggregate": False}),
        ("replicas1", {"replicas": 1})])
    print(row(a, "replicas2_aggregated", "replicas1", runs["replicas2_aggregated"],
              runs["replicas1"], loads))
    print(row(a, "replicas2_per_push", "replicas1", runs["replicas2_per_push"],
              runs["replicas1"], loads))
    print(row(a, "replicas2_aggregated", "replicas2_per_push", runs["replicas2_aggregated"],
              runs["replicas2_per_push"], loads))
    return 0


def compare_builds(a):
    """R=2 with --bin_dir against R=2 with --baseline_bin_dir (another build,
    e.g. one without replica authentication), interleaved."""
    runs, loads = interleaved(a, [
        ("replicas2", {"replicas": 2}),
        ("replicas2_baseline_build", {"replicas": 2, "bin_dir": a.baseline_bin_dir})])
    out = json.loads(row(a, "replicas2", "replicas2_baseline_build", runs["replicas2"],
                         runs["replicas2_baseline_build"], loads))
    out["baseline_bin_dir"] = a.baseline_bin_dir
    print(json.dumps(out))
    return 0


def compare_overlap(a):
    """R=2 and R=1, each with and without --overlap, interleaved (rotating)."""
    psrun_flags = []
    if a.emulate_hosts:
        psrun_flags += ["--emulate_hosts", str(a.emulate_hosts)]
        if a.shard_hosts:
            psrun_flags += ["--shard_hosts", str(a.shard_hosts)]
        if a.link:
            psrun_flags += ["--link", a.link]
    overlap = ["--overlap", "--pipeline_shards=%d" % a.pipeline_shards]
    waits = {}
    modes = []
    for name, replicas, flags in (("replicas2_overlap", 2, overlap), ("replicas2_plain", 2, []),
                                  ("replicas1_overlap", 1, overlap), ("replicas1_plain", 1, [])):
        waits[name] = []
        modes.append((name, {"replicas": replicas, "psrun_flags": psrun_flags,
                             "worker_flags": flags, "stage_waits": waits[name]}))
    runs, loads = interleaved(a, modes)
    setting = {"emulate_hosts": a.emulate_hosts, "shard_hosts": a.shard_hosts,
               "link": a.link, "pipeline_shards": a.pipeline_shards}
    for mode, base in (("replicas2_overlap", "replicas2_plain"),
                       ("replicas1_overlap", "replicas1_plain"),
                       ("replicas2_overlap", "replicas1_overlap"),
                       ("replicas2_plain", "replicas1_plain")):
        out = json.loads(row(a, mode, base, runs[mode], runs[base], loads))
        out["op"] = "train_bsp_overlap"
        out.update(setting)
        for name, m in (("stage_wait_ms_per_step", mode), ("baseline_stage_wait_ms_per_step",
                                                            base)):
            if waits[m]:
                out[name] = spread([round(x, 2) for x in waits[m]])
        print(json.dumps(out))
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin_dir", default=os.path.join(REPO, "build", "bin"))
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--baseline_bin_dir",
                    help="compare R=2 of --bin_dir against R=2 of this build's binaries "
                         "(rows mode replicas2, baseline replicas2_baseline_build)")
    ap.add_argument("--servers", type=int, default=2)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--batch", type=int, default=BATCH, help="per worker and step")
    ap.add_argument("--layers", default="784,256,128,10")
    ap.add_argument("--model", choices=["mlp", "cnn"], default="mlp",
                    help="mlp: ps_worker --layers; cnn: worker/python/examples/cnn.py")
    ap.add_argument("--consistency", choices=["asp", "bsp"], default="asp")
    ap.add_argument("--compare_aggregation", action="store_true",
                    help="BSP: R=2 aggregated, R=2 per push and R=1 (see above)")
    ap.add_argument("--compare_overlap", action="store_true",
                    help="BSP: R=2 and R=1, each with and without ps_worker --overlap")
    ap.add_argument("--pipeline_shards", type=int, default=2,
                    help="--compare_overlap: ps_worker --pipeline_shards")
    ap.add_argument("--emulate_hosts", type=int, help="psrun --emulate_hosts (root)")
    ap.add_argument("--shard_hosts", type=int, help="psrun --shard_hosts")
    ap.add_argument("--link", help="psrun --link, e.g. 100mbit")
    ap.add_argument("--quick", action="store_true", help="1 repeat, 200 steps")
    a = ap.parse_args()
    if a.quick:
        a.repeats, a.steps = 1, 200
    if a.compare_overlap:
        if a.consistency != "bsp":
            ap.error("--compare_overlap needs --consistency bsp")
        return compare_overlap(a)
    if a.baseline_bin_dir:
        return compare_builds(a)
    if a.compare_aggregation:
        if a.consistency != "bsp":
            ap.error("--compare_aggregation needs --consistency bsp")
        return compare_aggregation(a)
    with tempfile.TemporaryDirectory(prefix="bench-replication-") as work:
        one, two = [], []
        for _ in range(a.repeats):
            one.append(run(a.bin_dir, work, 1, a.servers, a.workers, a.steps, a.layers,
                           a.consistency, batch=a.batch, model=a.model))
            two.append(run(a.bin_dir, work, 2, a.servers, a.workers, a.steps, a.layers,
                           a.consistency, batch=a.batch, model=a.model))
    print(row(a, "replicas2", "replicas1", two, one, None))
    return 0


if __name__ == "__main__":
    sys.exit(main())
