#!/usr/bin/env python3
"""Gradient compression study: codec x error feedback, 4 workers, 1 shard,
Fashion-MNIST, SSP s=2 with plain server SGD (launch/configs/fashion_topk.flags),
same epochs for every codec and every configuration with several seeds
(model initialisation and data order: --seeds, default 1,2,3); on the plain
loopback ("fast" link) and on a loopback shaped to 100 Mbit/s with tc inside
a network namespace this script creates and deletes ("slow" link).

  experiments/compression_study/run.py [--quick] [--seeds 1,2,3] [--out DIR]
                                       [--bin_dir DIR] [--no_slow]
                                       [--rate 100mbit] [--only RUNS [--merge]]

Writes OUT/runs.csv (one row per run, link and seed), OUT/summary.csv (per
configuration: mean, 95% t-interval half-width and n of every figure),
OUT/curves.csv (rank 0's evaluations with the fleet's cumulative wire
bytes, every seed), OUT/targets.csv (the issue-4 convergence targets with
intervals) and the plots (means over seeds with 95% bands).
"""
import os
import sys

EXPERIMENTS = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
sys.path[:0] = [os.path.join(os.path.dirname(EXPERIMENTS), "launch"), EXPERIMENTS]  # expkit/__init__.py

from expkit import fleet, metrics, plots, stats, study  # noqa: E402

WORKERS = 4
SHARDS = 1

# name, push codec spec
CODECS = [
    ("none", "none"),
    ("fp16", "fp16"),
    ("int8", "int8"),
    ("qsgd4", "qsgd:levels=4"),
    ("sign", "sign"),
    ("sign_ef", "sign:ef=1"),
    ("topk1", "topk:ratio=0.01"),
    ("topk1_ef", "topk:ratio=0.01,ef=1"),
    # DGC: momentum correction on the worker multiplies the step by
    # 1/(1 - 0.9) = 10, so this run's server lr is 0.01 (DGC_LR): the same
    # effective step as the others' lr 0.1 (at lr 0.1 it diverges).
    ("topk01_ef_dgc", "topk:ratio=0.001,ef=1,momentum=0.9,warmup_epochs=1"),
    ("randomk1_ef", "randomk:ratio=0.01,ef=1"),
]
# On the shaped link only these run (time budget); pulls are int8 there for
# every codec so that the push codec is what differs (fp32 pulls alone would
# take ~75 ms of the 100 Mbit/s link per worker step).
SLOW_CODECS = ["none", "fp16", "int8", "qsgd4", "sign_ef", "topk1_ef",
               "topk01_ef_dgc"]
SLOW_PULL_CODEC = "int8"

PRESETS = {
    "full": {"epochs": 4, "slow_epochs": 2, "eval_every": 40,
             "log_every": 20, "batch": 64, "slow_codecs": SLOW_CODECS,
             "slow_max_steps": 0},
    # The shaped link is slow by design: --quick runs two codecs there for
    # 100 steps each.
    "quick": {"epochs": 1, "slow_epochs": 1, "eval_every": 40,
              "log_every": 20, "batch": 64,
              "slow_codecs": ["none", "topk1_ef"], "slow_max_steps": 100},
}
SERVER_FLAGS = ["--consistency=ssp", "--staleness=2", "--optimizer=sgd",
                "--worker_timeout_s=120",
                "--checkpoint_every_s=0"]

LR = {"topk01_ef_dgc": 0.01}
DEFAULT_LR = 0.1

# Issue 4: (codec run, required max accuracy drop in points vs none,
# required push-byte reduction vs none or None)
TARGETS = [("topk1_ef", 1.0, 40.0), ("sign_ef", 2.0, None),
           ("qsgd4", 1.0, None)]

RUN_COLUMNS = [
    "run", "seed", "link", "codec", "status", "lr", "epochs", "steps",
    "wire_ratio", "bytes_pushed_wire", "bytes_pushed_per_epoch",
    "bytes_pulled", "encode_ms_per_step", "final_acc", "final_acc_avg3",
    "final_eval_acc", "max_acc", "time_to_target_s", "wall_s",
    "samples_per_s", "idle_frac", "staleness_p50", "staleness_p99",
    "load_avg",
]
AGG_KEYS = ["wire_ratio", "bytes_pushed_per_epoch", "encode_ms_per_step",
            "final_acc", "final_acc_avg3", "final_eval_acc", "max_acc",
            "time_to_target_s", "wall_s", "samples_per_s", "idle_frac",
            "load_avg"]
KEEP = ["link", "codec", "lr", "epochs"]
CURVE_COLUMNS = ["run", "seed", "wall_s", "step", "test_acc", "bytes_wire_est"]
TARGET_COLUMNS = ["run", "codec", "seeds", "acc", "acc_ci", "none_acc",
                  "none_acc_ci", "drop_points", "drop_lo", "drop_hi",
                  "max_drop_points", "accuracy_verdict", "push_reduction",
                  "min_push_reduction", "bytes_ok", "verdict"]

# Accuracy figure the targets and claims compare: the shards' weights after
# every worker finished (all samples trained), measured once per run.
ACC = "final_eval_acc"


def main(argv):
    ap = study.common_args(__doc__.split("\n")[0], os.path.join(
        study.RESULTS, "compression_study"))
    ap.add_argument("--no_slow", action="store_true",
                    help="skip the bandwidth-limited runs")
    ap.add_argument("--rate", default="100mbit",
                    help="tc tbf rate of the shaped link (default %(default)s)")
    ap.add_argument("--slow_epochs", type=int, default=None)
    args = ap.parse_args(argv)
    seeds = study.parse_seeds(args.seeds)
    preset = dict(PRESETS["quick" if args.quick else "full"])
    for k in ("epochs", "eval_every", "slow_epochs"):
        if getattr(args, k) is not None:
            preset[k] = getattr(args, k)
    only = set(filter(None, args.only.split(",")))
    os.makedirs(args.out, exist_ok=True)
    timer = study.Timer()
    load0 = study.load_average()
    rows, curves = [], []

    def one(run, link, spec, epochs, seed, prefix=(), extra=(), max_steps=0):
        lr = LR.get(run.replace("_slow", ""), DEFAULT_LR)
        worker_flags = ["--epochs=%d" % epochs, "--batch=%d" % preset["batch"],
                        "--normalize", "--threads=1", "--seed=%d" % seed,
                        "--codec=" + spec,
                        "--eval_every=%d" % preset["eval_every"],
                        "--log_every=%d" % preset["log_every"]] + list(extra)
        max_steps = args.max_steps or max_steps
        if max_steps:
            worker_flags.append("--max_steps=%d" % max_steps)
        load = study.load_average()
        job, status = study.execute(
            "compression", args.out, run, seed, WORKERS,
            lambda d: fleet.run_job(
                d, bin_dir=args.bin_dir, servers=SHARDS, workers=WORKERS,
                server_flags=SERVER_FLAGS + ["--lr=%g" % lr],
                worker_flags=worker_flags, prefix=prefix,
                worker_cmd=args.worker_cmd, final_eval=not args.worker_cmd),
            timer)
        s = metrics.summarize(job, target=args.target)
        s.update(run=run, seed=seed, link=link, codec=spec, epochs=epochs,
                 status=status, lr=lr, load_avg=load)
        # Per epoch of the whole fleet (each worker one pass over its part).
        steps_per_epoch = 60000 // WORKERS // preset["batch"]
        per_worker_steps = s["steps"] / WORKERS if s["steps"] else 0
        s["bytes_pushed_per_epoch"] = (
            s["bytes_pushed_wire"] * steps_per_epoch / per_worker_steps
            if per_worker_steps else None)
        rows.append(s)
        curves.extend(study.curve_rows(run, job, s, seed))
        print("[compression %7.1fs] %s seed %d: train %.1fs, acc %s (final "
              "model %s), ratio %.1f, to %.2f: %s s" % (
                  timer(), run, seed, s["wall_s"], metrics.fmt(s["final_acc"]),
                  metrics.fmt(s["final_eval_acc"]), s["wire_ratio"] or 0,
                  args.target, metrics.fmt(s["time_to_target_s"])),
              flush=True)

    for name, spec in CODECS:
        if not only or name in only:
            for seed in seeds:
                one(name, "fast", spec, preset["epochs"], seed)
    slow = [(n, s) for n, s in CODECS if n in preset["slow_codecs"] and
            (not only or n + "_slow" in only)]
    if slow and not args.no_slow:
        if not fleet.ShapedLink.available():
            print("[compression] no root/ip/tc: shaped-link runs skipped")
        else:
            with fleet.ShapedLink(args.rate) as link:
                for name, spec in slow:
                    for seed in seeds:
                        one(name + "_slow", args.rate, spec,
                            preset["slow_epochs"], seed, prefix=link.prefix(),
                            extra=["--pull_codec=" + SLOW_PULL_CODEC],
                            max_steps=preset["slow_max_steps"])
    study.finish(args, rows, curves, RUN_COLUMNS, CURVE_COLUMNS, AGG_KEYS,
                 KEEP, "preset=%s epochs=%d slow_epochs=%d rate=%s seeds=%s "
                 "max_steps=%d wall_s=%.1f load_avg=%.1f..%.1f" % (
                     "quick" if args.quick else "full", preset["epochs"],
                     preset["slow_epochs"], args.rate,
                     ",".join(map(str, seeds)), args.max_steps, timer(),
                     load0 or -1, study.load_average() or -1))
    write_targets(args.out)
    make_plots(args.out)
    print("[compression %7.1fs] wrote %s" % (timer(), args.out))
    return 0


def write_targets(out):
    """OUT/targets.csv from OUT/runs.csv (report.py calls this too)."""
    rows = metrics.read_csv(os.path.join(out, "runs.csv"))
    study.write_csv(os.path.join(out, "targets.csv"), targets(rows),
                    TARGET_COLUMNS)


def targets(rows):
    """Issue-4 targets judged by intervals: the accuracy drop against
    uncompressed (Welch 95% interval of the difference of means over seeds)
    must lie below the allowed drop, and the mean push-byte reduction reach
    the required one."""
    fast = [r for r in rows if r["link"] == "fast"]

    def accs(run):
        return [study._float(r.get(ACC)) for r in fast
                if r["run"] == run and r.get("status", "ok") == "ok"]

    def mean_of(run, key):
        v = [study._float(r.get(key)) for r in fast if r["run"] == run]
        v = [x for x in v if x is not None]
        return sum(v) / len(v) if v else None

    base = stats.Estimate(accs("none"))
    out = []
    for run, max_drop, min_red in TARGETS:
        mine = [r for r in fast if r["run"] == run]
        if not mine or base.mean is None:
            continue
        est = stats.Estimate(accs(run))
        diff = stats.Difference(base, est)  # drop = none - codec
        # Claim: drop < max_drop  <=>  (max_drop - drop) > 0.
        verdict, _ = stats.verdict_greater(
            stats.Difference(est, base), -max_drop / 100.0)
        red = None
        nb, cb = mean_of("none", "bytes_pushed_wire"), \
            mean_of(run, "bytes_pushed_wire")
        if nb and cb:
            red = nb / cb
        bytes_ok = None if min_red is None else (red or 0) >= min_red
        out.append({
            "run": run, "codec": mine[0]["codec"], "seeds": len(mine),
            "acc": est.mean, "acc_ci": est.half, "none_acc": base.mean,
            "none_acc_ci": base.half,
            "drop_points": None if diff.mean is None else 100 * diff.mean,
            "drop_lo": None if diff.mean is None else 100 * diff.lo,
            "drop_hi": None if diff.mean is None else 100 * diff.hi,
            "max_drop_points": max_drop, "accuracy_verdict": verdict,
            "push_reduction": red, "min_push_reduction": min_red,
            "bytes_ok": "" if bytes_ok is None else int(bytes_ok),
            "verdict": "met" if verdict == "reproduced" and
            bytes_ok is not False else "missed",
        })
    return out


def make_plots(out):
    """Draws OUT/*.png from OUT/summary.csv and OUT/curves.csv: means over
    seeds with 95% bands."""
    summary = metrics.read_csv(os.path.join(out, "summary.csv"))
    curves = metrics.read_csv(os.path.join(out, "curves.csv"))
    n = max([int(r["seeds"]) for r in summary] or [0])
    links = []
    for r in summary:
        if r["link"] not in links:
            links.append(r["link"])
    for link in links:
        names = [r["run"] for r in summary if r["link"] == link]
        tag = "" if link == "fast" else "_slow"
        what = "unshaped loopback" if link == "fast" else \
            "loopback shaped to %s (pulls int8)" % link
        what += ", mean of %d seeds, 95%% band" % n
        plots.band_plot(
            os.path.join(out, "acc_vs_bytes%s.png" % tag),
            "Test accuracy vs cumulative bytes pushed (4 workers), " + what,
            "bytes pushed on the wire by all workers (log)",
            "test accuracy (rank 0)",
            [(r, study.seed_bands(curves, r, "bytes_wire_est")) for r in names],
            logx=True, yrange=("0.5", "0.92"), key="top left")
        plots.band_plot(
            os.path.join(out, "acc_vs_time%s.png" % tag),
            "Test accuracy vs wall time (4 workers), " + what,
            "wall time of rank 0 (s)", "test accuracy (rank 0)",
            [(r, study.seed_bands(curves, r, "wall_s")) for r in names],
            yrange=("0.5", "0.92"))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
