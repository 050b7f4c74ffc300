#!/usr/bin/env python3
"""Staleness-aware training: delay compensation (DC-ASGD) and the
staleness-dependent learning rate against plain ASP and sequential SGD at
the same number of samples, and learning-rate warm-up for BSP with many
workers at the linearly scaled rate; Fashion-MNIST, MLP 784-256-128-10,
every configuration with several seeds (--seeds, default 1,2,3,4,5).

  experiments/staleness_study/run.py [--quick] [--seeds 1,...] [--out DIR]
                                     [--bin_dir DIR] [--only RUNS [--merge]]

Part A (Zheng et al., ICML 2017): 1 worker (sequential SGD) vs 8 ASP
workers, server SGD lr 0.1, batch 128, the same epochs over the data (so
the same samples); ASP plain, with DC-ASGD-a (lambda0 2, mean-square decay
0.95, the paper's setting), DC-ASGD-c (lambda 0.04) and lr / staleness
(Zhang et al., IJCAI 2016).
Part B (Goyal et al., 2017): BSP with 8 workers of batch 128 (1024 per
update) at 8 x the small-batch rate, without and with a linear warm-up over
the first epoch from 1/8 of it; the unscaled rate, and sequential SGD at
the small-batch rate and batch 128, as references.

Accuracy = the shards' weights after every worker finished, evaluated once
(all samples trained). Writes OUT/runs.csv, OUT/summary.csv, OUT/curves.csv
and the plots; logs in OUT/runs/<run>/seed<k>/.
"""
import os
import sys

EXPERIMENTS = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
sys.path[:0] = [os.path.join(os.path.dirname(EXPERIMENTS), "launch"), EXPERIMENTS]  # expkit/__init__.py

from expkit import fleet, metrics, plots, study  # noqa: E402

TRAIN = 60000
BATCH = 128
LR = 0.1              # part A: the small-batch rate of the other studies
ETA = 0.075           # part B: small-batch rate whose 8x diverges without warm-up
BSP_WORKERS = 8
ASP_WORKERS = 8

PRESETS = {
    "full": {"epochs_a": 3, "epochs_b": 3},
    "quick": {"epochs_a": 1, "epochs_b": 1},
}


def rounds_per_epoch(workers):
    """BSP rounds (= steps of a worker, drop_last on) per epoch."""
    return (TRAIN // workers) // BATCH


def plan(preset):
    """(run, part, workers, consistency, server flags, epochs, eval_every)."""
    ea, eb = preset["epochs_a"], preset["epochs_b"]
    a = ["--consistency=asp", "--optimizer=sgd", "--lr=%g" % LR]
    runs = [
        ("seq", "A", 1, a, ea, 160),
        ("asp8", "A", ASP_WORKERS, a, ea, 20),
        ("asp8_dc_a", "A", ASP_WORKERS,
         a + ["--dc_lambda=2", "--dc_meansquare_decay=0.95"], ea, 20),
        ("asp8_dc_c", "A", ASP_WORKERS, a + ["--dc_lambda=0.04"], ea, 20),
        ("asp8_lr_inverse", "A", ASP_WORKERS, a + ["--staleness_lr=inverse"],
         ea, 20),
    ]
    bsp = ["--consistency=bsp", "--optimizer=sgd"]
    rpe = rounds_per_epoch(BSP_WORKERS)
    warm = ["--lr_warmup_epochs=1", "--updates_per_epoch=%d" % rpe,
            "--lr_warmup_start=%g" % (1.0 / BSP_WORKERS)]
    scaled = ETA * BSP_WORKERS
    runs += [
        ("seq_small", "B", 1, ["--consistency=asp", "--optimizer=sgd",
                               "--lr=%g" % ETA], eb, 160),
        ("bsp8_unscaled", "B", BSP_WORKERS, bsp + ["--lr=%g" % ETA], eb, 10),
        ("bsp8_scaled", "B", BSP_WORKERS, bsp + ["--lr=%g" % scaled], eb, 10),
        ("bsp8_scaled_warmup", "B", BSP_WORKERS,
         bsp + ["--lr=%g" % scaled] + warm, eb, 10),
        # 8 x 0.1: past what this model takes at batch 1024 even after a
        # warm-up (calibration): where the rule stops.
        ("bsp8_scaled_lr08_warmup", "B", BSP_WORKERS,
         bsp + ["--lr=%g" % (LR * BSP_WORKERS)] + warm, eb, 10),
    ]
    return runs


RUN_COLUMNS = [
    "run", "seed", "part", "workers", "consistency", "server_flags", "status",
    "epochs", "steps", "diverged_step", "diverged_early", "final_acc",
    "final_eval_acc", "max_acc", "time_to_target_s", "staleness_p50",
    "staleness_p99", "staleness_max", "updates", "wall_s", "samples_per_s",
    "idle_frac", "dc_compensated", "dc_uncompensated", "load_avg",
]
AGG_KEYS = ["final_eval_acc", "final_acc", "max_acc", "diverged_early",
            "staleness_p50", "staleness_p99", "updates", "wall_s",
            "samples_per_s", "idle_frac", "load_avg"]
KEEP = ["part", "workers", "consistency", "server_flags", "epochs"]
CURVE_COLUMNS = ["run", "seed", "wall_s", "step", "updates_est", "samples",
                 "test_acc"]


def main(argv):
    ap = study.common_args(__doc__.split("\n")[0], os.path.join(
        study.RESULTS, "staleness_study"))
    ap.set_defaults(seeds="1,2,3,4,5")
    args = ap.parse_args(argv)
    seeds = study.parse_seeds(args.seeds)
    preset = dict(PRESETS["quick" if args.quick else "full"])
    if args.epochs is not None:
        preset["epochs_a"] = preset["epochs_b"] = args.epochs
    only = set(filter(None, args.only.split(",")))
    os.makedirs(args.out, exist_ok=True)
    timer = study.Timer()
    load0 = study.load_average()
    rows, curves = [], []
    for run, part, workers, sflags, epochs, eval_every in plan(preset):
        if only and run not in only:
            continue
        server_flags = sflags + ["--worker_timeout_s=60",
                                 "--checkpoint_every_s=0"]
        for seed in seeds:
            worker_flags = ["--epochs=%d" % epochs, "--batch=%d" % BATCH,
                            "--normalize", "--threads=1", "--seed=%d" % seed,
                            "--eval_every=%d" % (args.eval_every or eval_every),
                            "--log_every=20"]
            if args.max_steps:
                worker_flags.append("--max_steps=%d" % args.max_steps)
            load = study.load_average()
            job, status = study.execute(
                "staleness", args.out, run, seed, workers,
                lambda d: fleet.run_job(
                    d, bin_dir=args.bin_dir, servers=1, workers=workers,
                    server_flags=server_flags, worker_flags=worker_flags,
                    final_eval=True), timer)
            s = metrics.summarize(job, target=args.target)
            rpe = rounds_per_epoch(workers)
            dc = {}
            for sh in job.get("stats", {}).get("shards", []):
                dc = sh.get("stats", {}).get("delay_compensation", {})
            s.update(run=run, seed=seed, part=part, workers=workers,
                     consistency=sflags[0].split("=")[1], status=status,
                     server_flags=" ".join(sflags[1:]), epochs=epochs,
                     load_avg=load,
                     diverged_early=int(s["diverged_step"] is not None and
                                        s["diverged_step"] < rpe),
                     dc_compensated=dc.get("compensated"),
                     dc_uncompensated=dc.get("uncompensated"))
            rows.append(s)
            for c in study.curve_rows(run, job, s, seed):
                c["samples"] = c["step"] * BATCH * workers
                curves.append(c)
            print("[staleness %7.1fs] %s seed %d: %s, final model %s, "
                  "diverged at %s, staleness p50/p99 %s/%s" % (
                      timer(), run, seed, status,
                      metrics.fmt(s["final_eval_acc"]),
                      s["diverged_step"], s["staleness_p50"],
                      s["staleness_p99"]), flush=True)
    study.finish(args, rows, curves, RUN_COLUMNS, CURVE_COLUMNS, AGG_KEYS,
                 KEEP, "preset=%s epochs_a=%d epochs_b=%d seeds=%s "
                 "max_steps=%d wall_s=%.1f load_avg=%.1f..%.1f" % (
                     "quick" if args.quick else "full", preset["epochs_a"],
                     preset["epochs_b"], ",".join(map(str, seeds)),
                     args.max_steps, timer(), load0 or -1,
                     study.load_average() or -1))
    make_plots(args.out)
    print("[staleness %7.1fs] wrote %s" % (timer(), args.out))
    return 0


def make_plots(out):
    """Accuracy vs samples trained (mean over seeds, 95% band) per part."""
    summary = metrics.read_csv(os.path.join(out, "summary.csv"))
    ok = {(r["run"], r["seed"]) for r in
          metrics.read_csv(os.path.join(out, "runs.csv"))
          if r["status"] == "ok"}
    curves = [c for c in metrics.read_csv(os.path.join(out, "curves.csv"))
              if (c["run"], c["seed"]) in ok]
    n = max([int(r["seeds"]) for r in summary] or [0])
    for part, png, title in (
            ("A", "acc_vs_samples_dc.png",
             "Part A: sequential SGD vs 8 ASP workers, plain / DC-ASGD / "
             "lr/staleness"),
            ("B", "acc_vs_samples_warmup.png",
             "Part B: BSP 8 workers at the linearly scaled lr, with and "
             "without warm-up")):
        names = [r["run"] for r in summary if r["part"] == part]
        plots.band_plot(
            os.path.join(out, png),
            "%s (mean of up to %d seeds that did not diverge, 95%% band)" %
            (title, n), "samples trained by all workers",
            "test accuracy (rank 0)",
            [(r, study.seed_bands(curves, r, "samples")) for r in names],
            yrange=("0.5", "0.92"))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
