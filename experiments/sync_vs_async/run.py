#!/usr/bin/env python3
"""Sync vs async: BSP, SSP (s = 1, 4, 16) and ASP, 4 workers, 1 shard,
Fashion-MNIST, each without and with one straggler (--slowdown=3 on rank 3),
same seed, optimizer and epoch budget.

  experiments/sync_vs_async/run.py [--quick] [--out DIR] [--bin_dir DIR]

Writes OUT/summary.csv (one row per run), OUT/curves.csv (rank 0's
evaluations: accuracy vs wall time and vs updates) and the plots
(OUT/*.png + the .gp scripts drawing them). Raw logs go to OUT/runs/<run>/.
"""
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))

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
    "full": {"epochs": 6, "eval_every": 40, "log_every": 20, "batch": 128},
    "quick": {"epochs": 1, "eval_every": 40, "log_every": 20, "batch": 128},
}

MODES = [  # name, consistency, staleness bound
    ("bsp", "bsp", 0),
    ("ssp1", "ssp", 1),
    ("ssp4", "ssp", 4),
    ("ssp16", "ssp", 16),
    ("asp", "asp", None),
]

SUMMARY_COLUMNS = [
    "run", "mode", "staleness_bound", "straggler", "status", "epochs", "steps",
    "time_to_target_s", "final_acc", "max_acc", "idle_frac", "idle_frac_min",
    "idle_frac_max", "staleness_p50", "staleness_p99", "staleness_max",
    "updates", "pushes", "updates_per_s", "samples_per_s", "wall_s",
]
CURVE_COLUMNS = ["run", "wall_s", "step", "updates_est", "test_acc"]


def runs():
    for straggler in (False, True):
        for name, consistency, bound in MODES:
            yield (name + ("_straggler" if straggler else ""), name,
                   consistency, bound, straggler)


def main(argv):
    ap = study.common_args(__doc__.split("\n")[0], os.path.join(
        study.RESULTS, "sync_vs_async"))
    args = ap.parse_args(argv)
    preset = dict(PRESETS["quick" if args.quick else "full"])
    if args.epochs is not None:
        preset["epochs"] = args.epochs
    if args.eval_every is not None:
        preset["eval_every"] = args.eval_every
    only = set(filter(None, args.only.split(",")))
    os.makedirs(args.out, exist_ok=True)
    timer = study.Timer()
    summary_rows, curve_rows = [], []
    for run, mode, consistency, bound, straggler in runs():
        if only and run not in only:
            continue
        server_flags = ["--consistency=" + consistency, "--optimizer=sgd",
                        "--lr=%g" % (LR_BSP if consistency == "bsp"
                                     else LR_ASYNC),
                        "--worker_timeout_s=60", "--checkpoint_every_s=0"]
        if consistency == "ssp":
            server_flags.append("--staleness=%d" % bound)
        worker_flags = ["--epochs=%d" % preset["epochs"],
                        "--batch=%d" % preset["batch"], "--normalize",
                        "--threads=1", "--seed=1", "--heartbeat_ms=1000",
                        "--eval_every=%d" % preset["eval_every"],
                        "--log_every=%d" % preset["log_every"]]
        if args.max_steps:
            worker_flags.append("--max_steps=%d" % args.max_steps)
        rank_flags = {STRAGGLER_RANK: ["--slowdown=%g" % SLOWDOWN]} \
            if straggler else {}
        run_dir = os.path.join(args.out, "runs", run)
        shutil.rmtree(run_dir, ignore_errors=True)
        print("[sync_vs_async %6.1fs] %s ..." % (timer(), run), flush=True)
        try:
            job = fleet.run_job(run_dir, bin_dir=args.bin_dir,
                                servers=SHARDS, workers=WORKERS,
                                server_flags=server_flags,
                                worker_flags=worker_flags,
                                rank_flags=rank_flags,
                                worker_cmd=args.worker_cmd)
            status = "ok"
        except fleet.JobError as e:
            status = "diverged" if "diverged" in str(e) else "failed"
            print("[sync_vs_async] %s %s: %s" % (run, status, str(e)[-300:]),
                  flush=True)
            job = fleet.partial_job(run_dir, WORKERS)
        s = metrics.summarize(job, target=args.target)
        s.update(run=run, mode=mode, straggler=int(straggler), status=status,
                 staleness_bound={"bsp": 0, "asp": "inf"}.get(mode, bound),
                 epochs=preset["epochs"])
        summary_rows.append(s)
        curve_rows += study.curve_rows(run, job, s)
        print("[sync_vs_async %6.1fs] %s: %.1fs, acc %.4f, to %.2f: %s, "
              "idle %.3f, staleness p50/p99 %s/%s" % (
                  timer(), run, s["wall_s"], s["final_acc"] or -1,
                  args.target, metrics.fmt(s["time_to_target_s"]),
                  s["idle_frac"] or -1, s["staleness_p50"],
                  s["staleness_p99"]), flush=True)
    if args.merge:
        summary_rows = study.merge_rows(
            os.path.join(args.out, "summary.csv"), summary_rows)
        curve_rows = study.merge_rows(
            os.path.join(args.out, "curves.csv"), curve_rows)
    study.write_csv(os.path.join(args.out, "summary.csv"), summary_rows,
                    SUMMARY_COLUMNS)
    study.write_csv(os.path.join(args.out, "curves.csv"), curve_rows,
                    CURVE_COLUMNS)
    with open(os.path.join(args.out, "budget.txt"),
              "a" if args.merge else "w") as f:
        f.write("preset=%s epochs=%d max_steps=%d wall_s=%.1f\n" % (
            "quick" if args.quick else "full", preset["epochs"],
            args.max_steps, timer()))
    make_plots(args.out)
    print("[sync_vs_async %6.1fs] wrote %s" % (timer(), args.out))
    return 0


def make_plots(out):
    """Draws OUT/*.png from OUT/summary.csv and OUT/curves.csv."""
    summary = metrics.read_csv(os.path.join(out, "summary.csv"))
    curves = metrics.read_csv(os.path.join(out, "curves.csv"))
    by_run = {}
    for c in curves:
        by_run.setdefault(c["run"], []).append(c)
    for tag, straggler in (("", "0"), ("_straggler", "1")):
        names = [r["run"] for r in summary if r["straggler"] == straggler]
        what = "with one straggler (rank %d, slowdown %g)" % (
            STRAGGLER_RANK, SLOWDOWN) if straggler == "1" else \
            "no straggler"
        plots.line_plot(
            os.path.join(out, "acc_vs_time%s.png" % tag),
            "Test accuracy vs wall time, 4 workers, %s" % what,
            "wall time of rank 0 (s)", "test accuracy (rank 0)",
            [(n, [(float(c["wall_s"]), float(c["test_acc"]))
                  for c in by_run.get(n, [])]) for n in names],
            yrange=("0.6", "0.92"))
        plots.line_plot(
            os.path.join(out, "acc_vs_updates%s.png" % tag),
            "Test accuracy vs model updates applied, %s" % what,
            "model updates applied by the shard (BSP: rounds; SSP/ASP: pushes)",
            "test accuracy (rank 0)",
            [(n, [(float(c["updates_est"]), float(c["test_acc"]))
                  for c in by_run.get(n, [])]) for n in names],
            yrange=("0.6", "0.92"), logx=True)
    # Idle fraction vs staleness bound; ASP is drawn at s = 64 (unbounded).
    series = []
    for straggler, label in (("0", "no straggler"), ("1", "one straggler")):
        pts = []
        for r in summary:
            if r["straggler"] != straggler or not r["idle_frac"]:
                continue
            s = 64 if r["staleness_bound"] == "inf" else \
                int(r["staleness_bound"])
            pts.append((s + 0.5, float(r["idle_frac"])))
        series.append((label + " (x = s + 0.5; ASP at 64.5)", sorted(pts)))
    plots.line_plot(os.path.join(out, "idle_vs_staleness.png"),
                    "Worker idle fraction (pull wait / wall) vs staleness "
                    "bound s (BSP = 0)", "staleness bound s + 0.5",
                    "mean idle fraction over 4 workers", series, logx=True,
                    key="top right")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
