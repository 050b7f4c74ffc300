#!/usr/bin/env python3
"""The simulator (experiments/sim/model.py): calibration from real runs,
validation against them, and the scaling studies this machine cannot run.
Every figure it writes is SIMULATED and says so.

  experiments/sim/run.py [--quick] [--runs DIR] [--compression DIR] [--out DIR]
                         [--parts validation,bound,throughput,compression]

1. Traces: every worker's per-step busy time (wall time outside Pull) and
   Pull wait, from the sync-vs-async study's runs (their workers log every
   step: DIR/runs/<run>/seed<k>/metrics-<r>.csv); kept in
   OUT/traces.csv.gz so that validation reruns without the run folders.
2. Calibration: the shard's cost per request (the one free parameter,
   standing for its CPU time, its scheduling delay on the shared cores and
   the loopback) is fitted so that the simulated idle fraction of the ASP
   runs without a straggler equals the measured one (mean over seeds).
3. Validation: every other configuration and seed is replayed (its own
   step-time traces, the calibrated shard) and the simulated idle fraction
   and updates/s are compared with the measured ones: OUT/validation.csv
   (per run) and OUT/validation_summary.csv (per configuration).
4. Scaling (synthetic step times calibrated from the traces: log-normal body
   with the measured median and spread, plus a Pareto tail of transient
   stragglers): OUT/idle_vs_bound.csv (16..1,024 workers, bound 0..16 and
   ASP), OUT/throughput_vs_workers.csv (workers per shard), and
   OUT/compression_vs_link.csv (where compression starts to pay as links
   get slower), with the plots.
"""
import argparse
import csv
import gzip
import math
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
EXP = os.path.dirname(HERE)
sys.path[:0] = [os.path.join(os.path.dirname(EXP), "launch"), EXP]  # expkit/__init__.py

import model as m  # noqa: E402
from expkit import metrics, plots, stats, study  # noqa: E402

SIM = "SIMULATED"
PARTS = ("validation", "bound", "throughput", "compression")
MODEL_BYTES = 4.0 * (784 * 256 + 256 + 256 * 128 + 128 + 128 * 10 + 10)
# Loopback as the simulator sees it here: ZeroMQ over 127.0.0.1 moved
# 1-4 GB/s in ps_bench_transport; one-way latency tens of microseconds.
LOOPBACK = dict(worker_bandwidth=2e9, latency=30e-6)
# A cluster node: 10 Gbit/s NICs, 50 us one way, a shard thread that costs
# 10 us per request and applies / copies at 2 GB/s (SGD apply and snapshot
# memcpy, ps_bench_apply on this machine, one thread).
CLUSTER = dict(worker_bandwidth=1.25e9, latency=50e-6, per_request=10e-6,
               apply_per_byte=0.5e-9, pull_per_byte=0.5e-9)

CONFIGS = {  # the sync-vs-async study's runs
    "bsp": ("bsp", 0), "ssp1": ("ssp", 1), "ssp4": ("ssp", 4),
    "ssp16": ("ssp", 16), "asp": ("asp", 0),
}


# ------------------------------------------------------------------ traces
def read_traces(runs_dir):
    """{(run, seed): {rank: [(busy_s, wait_s)]}} from per-step metrics."""
    out = {}
    root = os.path.join(runs_dir, "runs")
    if not os.path.isdir(root):
        return out
    for run in sorted(os.listdir(root)):
        for sd in sorted(os.listdir(os.path.join(root, run))):
            if not sd.startswith("seed"):
                continue
            d = os.path.join(root, run, sd)
            ranks = {}
            for name in sorted(os.listdir(d)):
                if not (name.startswith("metrics-") and name.endswith(".csv")):
                    continue
                rank = int(name[len("metrics-"):-4])
                rows = metrics.read_csv(os.path.join(d, name))
                ok = all(study._float(r.get("wall_s")) is not None and
                         study._float(r.get("pull_wait_ms")) is not None
                         for r in rows)
                steps = [int(r["step"]) for r in rows] if ok else []
                if not rows or steps != list(range(1, len(rows) + 1)):
                    ranks = {}
                    break  # not logged every step (or cut short): no trace
                seq, t0, w0 = [], 0.0, 0.0
                for r in rows:
                    t, w = float(r["wall_s"]), float(r["pull_wait_ms"]) / 1e3
                    seq.append((max(0.0, (t - t0) - (w - w0)), w - w0))
                    t0, w0 = t, w
                ranks[rank] = seq
            if ranks:
                out[(run, int(sd[4:]))] = ranks
    return out


def write_traces(path, traces):
    with gzip.open(path, "wt", newline="") as f:
        w = csv.writer(f)
        w.writerow(["run", "seed", "rank", "step", "busy_ms", "wait_ms"])
        for (run, seed), ranks in sorted(traces.items()):
            for rank, seq in sorted(ranks.items()):
                for i, (b, wt) in enumerate(seq):
                    w.writerow([run, seed, rank, i, "%.3f" % (1e3 * b),
                                "%.3f" % (1e3 * wt)])


def load_traces(path):
    out = {}
    with gzip.open(path, "rt", newline="") as f:
        for r in csv.DictReader(f):
            key = (r["run"], int(r["seed"]))
            out.setdefault(key, {}).setdefault(int(r["rank"]), []).append(
                (float(r["busy_ms"]) / 1e3, float(r["wait_ms"]) / 1e3))
    return out


def measured(traces_key, ranks):
    """(idle fraction (mean of workers), wall of the slowest) of a trace."""
    fr, walls = [], []
    for seq in ranks.values():
        wall = sum(b + w for b, w in seq)
        walls.append(wall)
        fr.append(sum(w for _, w in seq) / wall if wall else 0.0)
    return sum(fr) / len(fr), max(walls)


def replay(run, ranks, per_request, seed=1):
    base = run.replace("_straggler", "")
    consistency, bound = CONFIGS[base]
    workers = len(ranks)
    steps = min(len(s) for s in ranks.values())
    cfg = m.Config(workers=workers, consistency=consistency, staleness=bound,
                   steps=steps,
                   step_time=m.Trace([[b for b, _ in ranks[r]]
                                      for r in range(workers)]),
                   model_bytes=MODEL_BYTES, per_request=per_request,
                   seed=seed, **LOOPBACK)
    return m.simulate(cfg)


# ------------------------------------------------------------- calibration
def calibrate(traces, runs_rows):
    """Shard cost per request fitted on the ASP runs without a straggler."""
    keys = [k for k in traces if k[0] == "asp"]
    if not keys:
        raise SystemExit("no ASP traces to calibrate on")
    target = statistics.mean(measured(k, traces[k])[0] for k in keys)

    def sim_idle(c):
        return statistics.mean(replay(k[0], traces[k], c).idle_frac_mean
                               for k in keys)
    lo, hi = 0.0, 0.05
    for _ in range(40):
        mid = 0.5 * (lo + hi)
        if sim_idle(mid) < target:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi), target


def validate(traces, runs_rows, per_request):
    by = {(r["run"], int(float(r["seed"]))): r for r in runs_rows}
    rows = []
    for (run, seed), ranks in sorted(traces.items()):
        if run.replace("_straggler", "") not in CONFIGS:
            continue
        meas_idle, meas_wall = measured((run, seed), ranks)
        r = replay(run, ranks, per_request)
        rr = by.get((run, seed), {})
        upd = study._float(rr.get("updates"))
        meas_ups = upd / meas_wall if upd and meas_wall else None
        rows.append({
            "run": run, "seed": seed,
            "role": "calibration" if run == "asp" else "validation",
            "idle_measured": meas_idle, "idle_simulated": r.idle_frac_mean,
            "idle_error_points": 100 * (r.idle_frac_mean - meas_idle),
            "updates_per_s_measured": meas_ups,
            "updates_per_s_simulated": r.updates_per_s,
            "updates_per_s_error_pct": (100 * (r.updates_per_s / meas_ups - 1)
                                        if meas_ups else None),
            "staleness_p50_simulated": r.staleness_p50,
            "staleness_p50_measured": study._float(rr.get("staleness_p50")),
        })
    return rows


VALIDATION_COLUMNS = [
    "run", "seed", "role", "idle_measured", "idle_simulated",
    "idle_error_points", "updates_per_s_measured", "updates_per_s_simulated",
    "updates_per_s_error_pct", "staleness_p50_measured",
    "staleness_p50_simulated"]
VSUM_KEYS = ["idle_measured", "idle_simulated", "idle_error_points",
             "updates_per_s_measured", "updates_per_s_simulated",
             "updates_per_s_error_pct"]


# ----------------------------------------------------------------- scaling
def step_model(traces):
    """(median s, log-spread sigma) of the busy times of the ASP runs
    without a straggler (rank 0's evaluation steps left out: > 3x median)."""
    vals = []
    for k, ranks in traces.items():
        if k[0] != "asp":
            continue
        for seq in ranks.values():
            vals += [b for b, _ in seq[1:]]
    vals.sort()
    med = vals[len(vals) // 2]
    body = [v for v in vals if v <= 3 * med]
    q = lambda p: body[int(p * (len(body) - 1))]  # noqa: E731
    sigma = max(0.05, (math.log(q(0.84)) - math.log(q(0.16))) / 2)
    return med, sigma


TAIL = dict(p=0.05, xm=1.0, alpha=1.5)  # transient stragglers (see README)


def idle_vs_bound(median, sigma, quick):
    """Li et al.'s experiment in simulation: idle fraction vs bound."""
    workers = [16, 64] if quick else [16, 64, 256, 1024]
    bounds = [("bsp", 0), ("ssp", 1), ("ssp", 2), ("ssp", 4), ("ssp", 8),
              ("ssp", 16), ("asp", None)]
    steps = 40 if quick else 120
    rows = []
    for w in workers:
        for cons, s in bounds:
            for seed in (1, 2, 3):
                cfg = m.Config(
                    workers=w, shards=1, shard_replicas=max(1, w // 16),
                    consistency=cons, staleness=s or 0, steps=steps,
                    step_time=m.HeavyTail(median, sigma, **TAIL),
                    model_bytes=MODEL_BYTES, seed=seed, **CLUSTER)
                r = m.simulate(cfg)
                rows.append(dict(r.row(), workers=w, consistency=cons,
                                 bound="inf" if s is None else s, seed=seed,
                                 step_median_s=median))
    return rows


def throughput_vs_workers(median, sigma, quick):
    """Workers per shard: updates/s and samples/s of one shard."""
    counts = [1, 2, 4, 8, 16, 32, 64] if quick else \
        [1, 2, 4, 8, 16, 32, 64, 128, 256]
    rows = []
    for cons, s in (("asp", 0), ("ssp", 4), ("bsp", 0)):
        for w in counts:
            for seed in (1, 2, 3):
                cfg = m.Config(workers=w, shards=1, consistency=cons,
                               staleness=s, steps=60 if quick else 150,
                               step_time=m.HeavyTail(median, sigma, **TAIL),
                               model_bytes=MODEL_BYTES, seed=seed, batch=128,
                               **CLUSTER)
                r = m.simulate(cfg)
                rows.append(dict(r.row(), workers=w, consistency=cons,
                                 bound=s, seed=seed))
    return rows


def codec_table(comp_summary):
    """Codecs with their measured wire ratio and encode cost per element
    (compression study, fast link); decode on the shard costs as much."""
    elems = MODEL_BYTES / 4.0
    out = []
    for r in comp_summary:
        if r.get("link") != "fast" or r["run"] not in (
                "none", "fp16", "int8", "qsgd4", "sign_ef", "topk1_ef"):
            continue
        ratio = study._float(r.get("wire_ratio")) or 1.0
        enc = (study._float(r.get("encode_ms_per_step")) or 0.0) / 1e3 / elems
        out.append(m.Codec(r["run"], ratio, enc, enc))
    if not out:  # no study results: the figures measured earlier
        out = [m.Codec("none"), m.Codec("fp16", 2.0, 0.9e-9, 0.9e-9),
               m.Codec("int8", 3.9, 0.43e-9, 0.43e-9),
               m.Codec("topk1_ef", 45.6, 3.8e-9, 3.8e-9)]
    return out


def compression_vs_link(median, sigma, codecs, quick):
    """Samples/s of 8 workers per codec as the link gets slower. Pulls are
    int8 for every codec (as on the study's shaped link): with fp32 pulls
    the pull traffic alone bounds what any push codec can gain."""
    pull_ratio = next((c.ratio for c in codecs if c.name == "int8"), 3.9)
    rates = [10e9, 1e9, 100e6, 10e6] if quick else \
        [40e9, 10e9, 4e9, 1e9, 400e6, 100e6, 40e6, 10e6]
    rows = []
    for bits in rates:
        for c in codecs:
            for seed in (1, 2):
                cfg = m.Config(workers=8, shards=1, consistency="ssp",
                               staleness=2, steps=30 if quick else 80,
                               step_time=m.HeavyTail(median, sigma, **TAIL),
                               model_bytes=MODEL_BYTES, codec=c, seed=seed,
                               batch=64, worker_bandwidth=bits / 8,
                               pull_ratio=pull_ratio,
                               latency=CLUSTER["latency"],
                               per_request=CLUSTER["per_request"],
                               apply_per_byte=CLUSTER["apply_per_byte"],
                               pull_per_byte=CLUSTER["pull_per_byte"])
                r = m.simulate(cfg)
                rows.append(dict(r.row(), link_bits_per_s=bits, codec=c.name,
                                 wire_ratio=c.ratio, seed=seed))
    return rows


# ------------------------------------------------------------------ output
def mean_rows(rows, keys, group):
    """Mean and 95% half-width of keys over seeds, per group tuple."""
    by = {}
    for r in rows:
        by.setdefault(tuple(r[g] for g in group), []).append(r)
    out = []
    for k, rs in by.items():
        row = dict(zip(group, k))
        row["seeds"] = len(rs)
        for key in keys:
            e = stats.Estimate([r[key] for r in rs if r[key] is not None])
            row[key] = e.mean
            row[key + "_ci"] = e.half if e.half is not None and \
                math.isfinite(e.half) else None
        out.append(row)
    return out


def make_plots(out):
    """The simulator's plots from OUT's CSVs (report.py calls this)."""
    v = metrics.read_csv(os.path.join(out, "validation_summary.csv"))
    if v:
        pts_m, pts_s = [], []
        for i, r in enumerate(v):
            for pts, key in ((pts_m, "idle_measured"), (pts_s, "idle_simulated")):
                y = float(r[key])
                h = float(r[key + "_ci"] or 0)
                pts.append((i + (0.1 if key == "idle_simulated" else -0.1),
                            y, y - h, y + h))
        gp = plots.errorbar_plot(
            os.path.join(out, "validation_idle.png"),
            "%s vs measured: idle fraction of the 4-worker runs (x: %s)" % (
                SIM, ", ".join("%d=%s" % (i, r["run"]) for i, r in enumerate(v))),
            "configuration (index)", "idle fraction (mean over seeds, 95% interval)",
            [("measured", pts_m), ("simulated (" + SIM + ")", pts_s)],
            yrange=("0", "1"), lines_too=False)
        del gp
    rows = metrics.read_csv(os.path.join(out, "idle_vs_bound.csv"))
    if rows:
        series = {}
        for r in rows:
            b = 64 if r["bound"] == "inf" else int(float(r["bound"]))
            y, h = float(r["idle_frac"]), float(r["idle_frac_ci"] or 0)
            series.setdefault(r["workers"], []).append((b + 0.5, y, y - h, y + h))
        plots.errorbar_plot(
            os.path.join(out, "sim_idle_vs_bound.png"),
            "%s: idle fraction vs staleness bound, heavy-tailed step times "
            "(x = s + 0.5; BSP at 0.5, ASP at 64.5)" % SIM,
            "staleness bound s + 0.5", "mean idle fraction of the workers",
            [("%s workers" % w, sorted(p)) for w, p in
             sorted(series.items(), key=lambda kv: int(kv[0]))],
            logx=True, yrange=("0", "1"))
    rows = metrics.read_csv(os.path.join(out, "throughput_vs_workers.csv"))
    if rows:
        series = _series(rows, "consistency", lambda r: int(r["workers"]))
        plots.errorbar_plot(
            os.path.join(out, "sim_throughput_vs_workers.png"),
            "%s: samples/s of one shard's workers (batch 128, MLP, 10 Gbit/s, "
            "shard thread 10 us/request)" % SIM, "workers per shard",
            "samples / s (all workers)",
            [(k, sorted(p)) for k, p in sorted(series.items())],
            logx=True, logy=True, key="top left")
    rows = metrics.read_csv(os.path.join(out, "compression_vs_link.csv"))
    if rows:
        series = _series(rows, "codec",
                         lambda r: float(r["link_bits_per_s"]) / 1e6)
        plots.errorbar_plot(
            os.path.join(out, "sim_compression_vs_link.png"),
            "%s: samples/s of 8 workers (SSP s=2, int8 pulls) by push codec "
            "as the link gets slower" % SIM, "link bandwidth (Mbit/s)",
            "samples / s (all workers)",
            [(k, sorted(p)) for k, p in sorted(series.items())],
            logx=True, logy=True, key="bottom right")


def _series(rows, group, x, key="samples_per_s"):
    """{rows[group]: [(x(row), mean, lo, hi)]} of key (lo kept > 0: log y)."""
    out = {}
    for r in rows:
        y, h = float(r[key]), float(r[key + "_ci"] or 0)
        out.setdefault(r[group], []).append((x(r), y, max(y - h, 1e-9), y + h))
    return out


def crossover(rows):
    """Per codec: the fastest link (Mbit/s) at which it beats uncompressed
    by more than 10% in samples/s (None if never)."""
    by = {}
    for r in rows:
        by.setdefault(r["codec"], {})[float(r["link_bits_per_s"])] = \
            float(r["samples_per_s"])
    base = by.get("none", {})
    out = {}
    for codec, pts in by.items():
        if codec == "none":
            continue
        faster = [bw for bw, sps in pts.items()
                  if bw in base and sps > 1.1 * base[bw]]
        out[codec] = max(faster) / 1e6 if faster else None
    return out


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="fewer workers, steps and points (CI)")
    ap.add_argument("--runs", default=os.path.join(study.RESULTS,
                                                   "sync_vs_async"),
                    help="the sync-vs-async study's folder (runs/ inside)")
    ap.add_argument("--compression",
                    default=os.path.join(study.RESULTS, "compression_study"))
    ap.add_argument("--out", default=os.path.join(study.RESULTS, "sim"))
    ap.add_argument("--parts", default=",".join(PARTS),
                    help="what to (re)compute, comma-separated, of %(default)s; "
                         "the others' CSVs in OUT are kept (e.g. compression "
                         "after a new compression study)")
    args = ap.parse_args(argv)
    parts = set(filter(None, args.parts.split(",")))
    if not parts or parts - set(PARTS):
        ap.error("--parts: a comma-separated subset of " + ",".join(PARTS))
    os.makedirs(args.out, exist_ok=True)
    timer = study.Timer()
    tpath = os.path.join(args.out, "traces.csv.gz")
    traces = read_traces(args.runs)
    if traces:
        write_traces(tpath, traces)
    elif os.path.exists(tpath):
        traces = load_traces(tpath)
    if not traces:
        raise SystemExit("no per-step traces: run experiments/sync_vs_async/"
                         "run.py first (its workers log every step)")
    median, sigma = step_model(traces)
    if "validation" in parts:
        validation(args, traces, median, sigma, timer)
    if "bound" in parts:
        bound_part(args, median, sigma, timer)
    if "throughput" in parts:
        throughput_part(args, median, sigma, timer)
    if "compression" in parts:
        compression_part(args, median, sigma)
    make_plots(args.out)
    print("[sim %6.1fs] wrote %s" % (timer(), args.out), flush=True)
    return 0


def validation(args, traces, median, sigma, timer):
    runs_rows = metrics.read_csv(os.path.join(args.runs, "runs.csv"))
    per_request, target = calibrate(traces, runs_rows)
    print("[sim %6.1fs] calibrated: %.1f us per shard request (ASP idle %.3f)"
          % (timer(), per_request * 1e6, target), flush=True)
    vrows = validate(traces, runs_rows, per_request)
    study.write_csv(os.path.join(args.out, "validation.csv"), vrows,
                    VALIDATION_COLUMNS)
    vsum = mean_rows(vrows, VSUM_KEYS, ("run", "role"))
    study.write_csv(os.path.join(args.out, "validation_summary.csv"), vsum,
                    ["run", "role", "seeds"] + [c for k in VSUM_KEYS
                                                for c in (k, k + "_ci")])
    with open(os.path.join(args.out, "calibration.txt"), "w") as f:
        f.write("shard_cost_per_request_s=%.3e asp_idle_target=%.4f "
                "step_median_s=%.4e step_sigma=%.3f tail_p=%g tail_xm=%g "
                "tail_alpha=%g traces=%d\n" % (
                    per_request, target, median, sigma, TAIL["p"], TAIL["xm"],
                    TAIL["alpha"], len(traces)))
    print("[sim %6.1fs] validation written; step median %.2f ms sigma %.2f"
          % (timer(), median * 1e3, sigma), flush=True)


def bound_part(args, median, sigma, timer):
    # Li et al.'s regime: computation dominates a step (their workers ran
    # seconds per iteration); here 100x the MLP's median, the CNN's order.
    rows = idle_vs_bound(100 * median, sigma, args.quick)
    study.write_csv(os.path.join(args.out, "idle_vs_bound.csv"),
                    mean_rows(rows, ["idle_frac", "updates_per_s",
                                     "staleness_p99", "shard_busy_frac"],
                              ("workers", "consistency", "bound")),
                    ["workers", "consistency", "bound", "seeds", "idle_frac",
                     "idle_frac_ci", "updates_per_s", "updates_per_s_ci",
                     "staleness_p99", "staleness_p99_ci", "shard_busy_frac",
                     "shard_busy_frac_ci"])
    print("[sim %6.1fs] idle vs bound done" % timer(), flush=True)


def throughput_part(args, median, sigma, timer):
    rows = throughput_vs_workers(median, sigma, args.quick)
    study.write_csv(os.path.join(args.out, "throughput_vs_workers.csv"),
                    mean_rows(rows, ["samples_per_s", "updates_per_s",
                                     "idle_frac", "shard_busy_frac"],
                              ("consistency", "workers")),
                    ["consistency", "workers", "seeds", "samples_per_s",
                     "samples_per_s_ci", "updates_per_s", "updates_per_s_ci",
                     "idle_frac", "idle_frac_ci", "shard_busy_frac",
                     "shard_busy_frac_ci"])
    print("[sim %6.1fs] throughput vs workers done" % timer(), flush=True)


def compression_part(args, median, sigma):
    codecs = codec_table(metrics.read_csv(os.path.join(args.compression,
                                                       "summary.csv")))
    # The compression study's batch is 64, half the traced runs' 128.
    rows = compression_vs_link(median / 2, sigma, codecs, args.quick)
    study.write_csv(os.path.join(args.out, "compression_vs_link.csv"),
                    mean_rows(rows, ["samples_per_s", "idle_frac"],
                              ("codec", "link_bits_per_s", "wire_ratio")),
                    ["codec", "link_bits_per_s", "wire_ratio", "seeds",
                     "samples_per_s", "samples_per_s_ci", "idle_frac",
                     "idle_frac_ci"])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
