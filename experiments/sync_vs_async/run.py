#!/usr/bin/env python3
"""Sync vs async: BSP, SSP (s = 1, 4, 16) and ASP, 4 workers, 1 shard,
Fashion-MNIST, each without and with one straggler (--slowdown=3 on rank 3),
same optimizer and epoch budget, every configuration with several seeds
(model initialisation and data order: --seeds, default 1,2,3).

  experiments/sync_vs_async/run.py [--quick] [--seeds 1,2,3] [--out DIR]
                                   [--bin_dir DIR] [--only RUNS [--merge]]

Writes OUT/runs.csv (one row per configuration and seed), OUT/summary.csv
(per configuration: mean, 95% t-interval half-width and n of every figure),
OUT/curves.csv (rank 0's evaluations of every seed: accuracy vs wall time
and vs updates) and the plots (OUT/*.png + the .gp scripts drawing them:
mean over seeds with a 95% band or error bars). Raw logs go to
OUT/runs/<run>/seed<k>/; the workers log every step (--log_every=1), which
experiments/sim/run.py replays to validate the simulator.
"""
import os
import sys

EXPERIMENTS = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
sys.path[:0] = [os.path.join(os.path.dirname(EXPERIMENTS), "launch"), EXPERIMENTS]  # expkit/__init__.py

from expkit import fleet, metrics, plots, study  # noqa: E402

WORKERS = 4
SHARDS = 1
STRAGGLER_RANK = 3  # rank 0 evaluates; the straggler is another rank
SLOWDOWN = 3.0

# Every mode gets the same optimizer: plain SGD on the server. BSP averages
# the W gradients of a round into one update, so its learning rate is scaled
# by W (linear scaling rule, Goyal et al. 2017): one BSP update then moves
# the weights as far as W asynchronous pushes of lr 0.1 would.
LR_ASYNC = 0.1
LR_BSP = LR_ASYNC * WORKERS

PRESETS = {
    # epochs per worker (each a pass over its 1/W of the data), eval cadence
    "full": {"epochs": 6, "eval_every": 40, "log_every": 1, "batch": 128},
    "quick": {"epochs": 1, "eval_every": 40, "log_every": 1, "batch": 128},
}

MODES = [  # name, consistency, staleness bound
    ("bsp", "bsp", 0),
    ("ssp1", "ssp", 1),
    ("ssp4", "ssp", 4),
    ("ssp16", "ssp", 16),
    ("asp", "asp", None),
]

RUN_COLUMNS = [
    "run", "seed", "mode", "staleness_bound", "straggler", "status", "epochs",
    "steps", "time_to_target_s", "final_acc", "final_acc_avg3",
    "final_eval_acc", "max_acc", "idle_frac", "idle_frac_min",
    "idle_frac_max", "staleness_p50", "staleness_p99", "staleness_max",
    "updates", "pushes", "updates_per_s", "samples_per_s", "wall_s",
    "load_avg",
]
# Figures averaged over seeds in summary.csv.
AGG_KEYS = ["time_to_target_s", "final_acc", "final_acc_avg3",
            "final_eval_acc", "max_acc", "idle_frac", "staleness_p50",
            "staleness_p99", "updates", "updates_per_s", "samples_per_s",
            "wall_s", "load_avg"]
KEEP = ["mode", "staleness_bound", "straggler", "epochs"]
CURVE_COLUMNS = ["run", "seed", "wall_s", "step", "updates_est", "test_acc"]


def runs():
    for straggler in (False, True):
        for name, consistency, bound in MODES:
            yield (name + ("_straggler" if straggler else ""), name,
                   consistency, bound, straggler)


def main(argv):
    ap = study.common_args(__doc__.split("\n")[0], os.path.join(
        study.RESULTS, "sync_vs_async"))
    args = ap.parse_args(argv)
    seeds = study.parse_seeds(args.seeds)
    preset = dict(PRESETS["quick" if args.quick else "full"])
    if args.epochs is not None:
        preset["epochs"] = args.epochs
    if args.eval_every is not None:
        preset["eval_every"] = args.eval_every
    only = set(filter(None, args.only.split(",")))
    os.makedirs(args.out, exist_ok=True)
    timer = study.Timer()
    load0 = study.load_average()
    rows, curves = [], []
    for run, mode, consistency, bound, straggler in runs():
        if only and run not in only:
            continue
        server_flags = ["--consistency=" + consistency, "--optimizer=sgd",
                        "--lr=%g" % (LR_BSP if consistency == "bsp"
                                     else LR_ASYNC),
                        "--worker_timeout_s=60", "--checkpoint_every_s=0"]
        if consistency == "ssp":
            server_flags.append("--staleness=%d" % bound)
        rank_flags = {STRAGGLER_RANK: ["--slowdown=%g" % SLOWDOWN]} \
            if straggler else {}
        for seed in seeds:
            worker_flags = ["--epochs=%d" % preset["epochs"],
                            "--batch=%d" % preset["batch"], "--normalize",
                            "--threads=1", "--seed=%d" % seed,
                            "--heartbeat_ms=1000",
                            "--eval_every=%d" % preset["eval_every"],
                            "--log_every=%d" % preset["log_every"]]
            if args.max_steps:
                worker_flags.append("--max_steps=%d" % args.max_steps)
            load = study.load_average()
            job, status = study.execute(
                "sync_vs_async", args.out, run, seed, WORKERS,
                lambda d: fleet.run_job(
                    d, bin_dir=args.bin_dir, servers=SHARDS, workers=WORKERS,
                    server_flags=server_flags, worker_flags=worker_flags,
                    rank_flags=rank_flags, worker_cmd=args.worker_cmd,
                    final_eval=not args.worker_cmd), timer)
            s = metrics.summarize(job, target=args.target)
            s.update(run=run, seed=seed, mode=mode, straggler=int(straggler),
                     status=status, epochs=preset["epochs"], load_avg=load,
                     staleness_bound={"bsp": 0, "asp": "inf"}.get(mode, bound))
            rows.append(s)
            curves += study.curve_rows(run, job, s, seed)
            print("[sync_vs_async %7.1fs] %s seed %d: %.1fs, acc %s (final "
                  "model %s), to %.2f: %s, idle %.3f, staleness p50/p99 %s/%s"
                  % (timer(), run, seed, s["wall_s"],
                     metrics.fmt(s["final_acc"]),
                     metrics.fmt(s["final_eval_acc"]), args.target,
                     metrics.fmt(s["time_to_target_s"]), s["idle_frac"] or -1,
                     s["staleness_p50"], s["staleness_p99"]), flush=True)
    study.finish(args, rows, curves, RUN_COLUMNS, CURVE_COLUMNS, AGG_KEYS,
                 KEEP, "preset=%s epochs=%d seeds=%s max_steps=%d wall_s=%.1f "
                 "load_avg=%.1f..%.1f" % (
                     "quick" if args.quick else "full", preset["epochs"],
                     ",".join(map(str, seeds)), args.max_steps, timer(),
                     load0 or -1, study.load_average() or -1))
    make_plots(args.out)
    print("[sync_vs_async %7.1fs] wrote %s" % (timer(), args.out))
    return 0


def make_plots(out):
    """Draws OUT/*.png from OUT/runs.csv and OUT/curves.csv: means over
    seeds with 95% bands (curves) or error bars (idle fraction)."""
    summary = metrics.read_csv(os.path.join(out, "summary.csv"))
    curves = metrics.read_csv(os.path.join(out, "curves.csv"))
    n = max([int(r["seeds"]) for r in summary] or [0])
    for tag, straggler in (("", "0"), ("_straggler", "1")):
        names = [r["run"] for r in summary if r["straggler"] == straggler]
        what = "with one straggler (rank %d, slowdown %g)" % (
            STRAGGLER_RANK, SLOWDOWN) if straggler == "1" else \
            "no straggler"
        plots.band_plot(
            os.path.join(out, "acc_vs_time%s.png" % tag),
            "Test accuracy vs wall time, 4 workers, %s (mean of %d seeds, "
            "95%% band)" % (what, n),
            "wall time of rank 0 (s)", "test accuracy (rank 0)",
            [(r, study.seed_bands(curves, r, "wall_s")) for r in names],
            yrange=("0.6", "0.92"))
        plots.band_plot(
            os.path.join(out, "acc_vs_updates%s.png" % tag),
            "Test accuracy vs model updates applied, %s (mean of %d seeds, "
            "95%% band)" % (what, n),
            "model updates applied by the shard (BSP: rounds; SSP/ASP: pushes)",
            "test accuracy (rank 0)",
            [(r, study.seed_bands(curves, r, "updates_est")) for r in names],
            yrange=("0.6", "0.92"), logx=True)
    # Idle fraction vs staleness bound; ASP is drawn at s = 64 (unbounded).
    series = []
    for straggler, label in (("0", "no straggler"), ("1", "one straggler")):
        pts = []
        for r in summary:
            if r["straggler"] != straggler or not r["idle_frac"]:
                continue
            s = 64 if r["staleness_bound"] == "inf" else \
                int(float(r["staleness_bound"]))
            m, h = float(r["idle_frac"]), float(r["idle_frac_ci"] or 0)
            pts.append((s + 0.5, m, m - h, m + h))
        series.append((label + " (x = s + 0.5; ASP at 64.5)", sorted(pts)))
    plots.errorbar_plot(os.path.join(out, "idle_vs_staleness.png"),
                        "Worker idle fraction (pull wait / wall) vs staleness "
                        "bound s (BSP = 0), mean of %d seeds, 95%% interval"
                        % n, "staleness bound s + 0.5",
                        "mean idle fraction over 4 workers", series,
                        logx=True, key="top right")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
