#!/usr/bin/env python3
"""PyTorch workers through asyncps (issue 11): Python workers
(worker/python/examples) on 2 shards x 4 workers, SSP s=2, Fashion-MNIST.

  - cnn_none / cnn_topk: the CNN of examples/cnn.py, uncompressed and with
    topk:ratio=0.01,ef=1 pushes; server Adam, lr 0.001 with cosine decay
    to 0 over the run (--lr_decay_updates = 4 workers x steps); 15 epochs
    (--cnn_optimizer sgd --cnn_lr 0.2: plain SGD reached 0.912 in 15 epochs);
  - mlp_pytorch / mlp_ps_worker: ps_worker's MLP trained by examples/mlp.py
    and by ps_worker at the same epochs, batch, lr and seed (the settings of
    launch/configs/fashion_ssp.flags): the cross-check of the two workers.

  experiments/pytorch/run.py [--quick] [--only cnn_none,...] [--out DIR]
                             [--bin_dir DIR] [--epochs N] [--merge]

Writes OUT/summary.csv (one row per run), OUT/curves.csv (rank 0's
evaluations: wall time, epoch, test accuracy), acc_vs_epoch.png,
acc_vs_time.png and their .gp scripts, and OUT/REPORT.md (the checks of
issue 11 from these CSVs), and keeps each run's metrics CSVs and logs in
OUT/runs/<run>/. Each evaluation is rank 0's, in eval
mode with its own BatchNorm running statistics.
"""
import os
import platform
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.dirname(HERE))

from expkit import fleet, metrics, plots, study  # noqa: E402

PY = "/usr/bin/python3"
EXAMPLES = os.path.join(REPO, "worker", "python", "examples")
WORKERS, SHARDS, BATCH = 4, 2, 64
TRAIN = 60000
TARGET = 0.916


def steps_per_epoch():
    return (TRAIN // WORKERS + BATCH - 1) // BATCH


def runs(epochs_cnn, epochs_mlp, cnn_optimizer="adam", cnn_lr=0.001):
    spe = steps_per_epoch()
    cnn_server = ["--consistency=ssp", "--staleness=2", "--optimizer=" + cnn_optimizer,
                  "--momentum=0.9", "--lr=%g" % cnn_lr, "--lr_final=0",
                  "--lr_decay_updates=%d" % (WORKERS * spe * epochs_cnn),
                  "--checkpoint_every_s=0", "--worker_timeout_s=60"]
    cnn_worker = ["--epochs=%d" % epochs_cnn, "--batch=%d" % BATCH, "--eval_every=%d" % spe,
                  "--log_every=%d" % spe, "--threads=1", "--timeout_s=300"]
    cnn_cmd = "%s %s" % (PY, os.path.join(EXAMPLES, "cnn.py"))
    mlp_server = ["--consistency=ssp", "--staleness=2", "--optimizer=sgd", "--lr=0.1",
                  "--checkpoint_every_s=0"]
    mlp_worker = ["--epochs=%d" % epochs_mlp, "--batch=%d" % BATCH,
                  "--eval_every=%d" % (spe // 2), "--log_every=%d" % (spe // 2),
                  "--threads=1", "--seed=1"]
    return [
        ("cnn_none", cnn_server, cnn_worker + ["--codec=none"], cnn_cmd),
        ("cnn_topk", cnn_server, cnn_worker + ["--codec=topk:ratio=0.01,ef=1"], cnn_cmd),
        ("mlp_pytorch", mlp_server, mlp_worker, "%s %s" % (PY, os.path.join(EXAMPLES, "mlp.py"))),
        ("mlp_ps_worker", mlp_server, mlp_worker + ["--layers=784,256,128,10"], None),
    ]


COLUMNS = ["run", "worker", "codec", "epochs", "final_acc", "final_acc_avg3", "max_acc",
           "epochs_to_target", "time_to_target_s", "wall_s", "samples_per_s",
           "bytes_pushed_raw", "bytes_pushed_wire", "wire_ratio", "staleness_p50",
           "staleness_p99", "staleness_max", "idle_frac", "status"]


def main():
    ap = study.common_args(__doc__.split("\n")[0], os.path.join(REPO, "experiments", "results",
                                                                  "pytorch"))
    ap.add_argument("--epochs_mlp", type=int, default=None)
    ap.add_argument("--report_only", action="store_true",
                    help="run nothing: REPORT.md and plots from OUT's CSVs")
    ap.add_argument("--cnn_optimizer", default="adam", help="ps_server --optimizer for the CNN")
    ap.add_argument("--cnn_lr", type=float, default=0.001, help="ps_server --lr for the CNN")
    args = ap.parse_args()
    epochs_cnn = args.epochs or (1 if args.quick else 15)
    epochs_mlp = args.epochs_mlp or (1 if args.quick else 5)
    only = set(filter(None, args.only.split(",")))
    spe = steps_per_epoch()
    rows, curves = [], []
    if args.report_only:
        rows = study.merge_rows(os.path.join(args.out, "summary.csv"), [])
        curves = study.merge_rows(os.path.join(args.out, "curves.csv"), [])
        only = {"-"}  # nothing to run
    for name, sflags, wflags, cmd in runs(epochs_cnn, epochs_mlp, args.cnn_optimizer,
                                                     args.cnn_lr):
        if only and name not in only:
            continue
        if args.max_steps:
            wflags = wflags + ["--max_steps=%d" % args.max_steps]
        out = os.path.join(args.out, "runs", name)
        print("== %s" % name, flush=True)
        try:
            job = fleet.run_job(out, bin_dir=args.bin_dir, servers=SHARDS, workers=WORKERS,
                                server_flags=sflags, worker_flags=wflags, worker_cmd=cmd,
                                timeout_s=4 * 3600)
            status = "ok"
        except fleet.JobError as e:
            print("%s failed: %s" % (name, e), file=sys.stderr)
            job, status = fleet.partial_job(out, WORKERS), "failed"
        s = metrics.summarize(job, TARGET) if status == "ok" else {}
        pts = metrics.curve(out, 0)
        hit = next((step for _, step, a, _ in pts if a >= TARGET), None)
        codec = next((f.split("=", 1)[1] for f in wflags if f.startswith("--codec=")), "none")
        epochs = epochs_cnn if name.startswith("cnn") else epochs_mlp
        row = dict(s, run=name, worker="python" if cmd else "ps_worker", codec=codec,
                   epochs=epochs, status=status,
                   epochs_to_target=round(hit / spe, 2) if hit else None)
        rows.append(row)
        for wall, step, acc, _ in pts:
            curves.append({"run": name, "wall_s": round(wall, 2), "epoch": round(step / spe, 3),
                           "test_acc": acc})
        print("   final acc %s (avg of last 3 evals %s), max %s, %s s, epochs to %.3f: %s" % (
            metrics.fmt(row.get("final_acc")), metrics.fmt(row.get("final_acc_avg3")),
            metrics.fmt(row.get("max_acc")), metrics.fmt(row.get("wall_s")), TARGET,
            row["epochs_to_target"]), flush=True)
    if args.merge and not args.report_only:
        rows = study.merge_rows(os.path.join(args.out, "summary.csv"), rows)
        curves = study.merge_rows(os.path.join(args.out, "curves.csv"), curves)
    study.write_csv(os.path.join(args.out, "summary.csv"), rows, COLUMNS)
    study.write_csv(os.path.join(args.out, "curves.csv"), curves,
                    ["run", "wall_s", "epoch", "test_acc"])
    write_report(args, rows, epochs_cnn, epochs_mlp)
    if plots.have_gnuplot():
        names = sorted({c["run"] for c in curves})
        for x, label, png in (("epoch", "epoch (per worker)", "acc_vs_epoch.png"),
                              ("wall_s", "wall time (s)", "acc_vs_time.png")):
            series = [(n, [(float(c[x]), float(c["test_acc"])) for c in curves
                           if c["run"] == n]) for n in names]
            plots.line_plot(os.path.join(args.out, png),
                            "PyTorch workers through asyncps: 2 shards x 4 workers, SSP s=2",
                            label, "test accuracy (rank 0)", series, yrange=("0.75", "0.95"))


def write_report(args, rows, epochs_cnn, epochs_mlp):
    by = {r["run"]: r for r in rows}
    f3 = lambda v: metrics.fmt(v, 4) if v is not None else "n/a"  # noqa: E731
    out = ["# PyTorch workers through asyncps", "",
           "Generated by `experiments/pytorch/run.py` (%s UTC, %s). 2 shards x %d Python workers "
           "(or ps_worker), SSP s=2, batch %d per worker, Fashion-MNIST; rank 0 evaluates on the "
           "10,000 test images %s, in eval mode with its own BatchNorm statistics. Single runs "
           "(seed 1) on 2 shared CPU cores." % (
               time.strftime("%Y-%m-%d %H:%M", time.gmtime()), platform.platform(), WORKERS,
               BATCH, "after every epoch (CNN) and every half epoch (MLP)"), "",
           "| run | worker | codec | epochs | final acc | mean of last 3 | best | epochs to %.3f | "
           "time to %.3f (s) | train wall (s) | samples/s | wire ratio | staleness p50/p99/max "
           "| status |" % (TARGET, TARGET), "|---" * 14 + "|"]
    for r in rows:
        out.append("| %s | %s | `%s` | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s/%s/%s | %s |"
                   % (r["run"], r["worker"], r["codec"], r["epochs"], f3(r.get("final_acc")),
                      f3(r.get("final_acc_avg3")), f3(r.get("max_acc")),
                      r.get("epochs_to_target") or "not reached",
                      metrics.fmt(r.get("time_to_target_s")), metrics.fmt(r.get("wall_s")),
                      metrics.fmt(r.get("samples_per_s")), metrics.fmt(r.get("wire_ratio")),
                      r.get("staleness_p50"), r.get("staleness_p99"), r.get("staleness_max"),
                      r["status"]))
    out.append("")
    checks = []
    n, t = by.get("cnn_none"), by.get("cnn_topk")
    if n and n.get("final_acc") is not None:
        checks.append("- CNN through the parameter server reaches %.3f: final %s, best %s, first "
                      "at epoch %s, %s s into the run -> **%s**." % (
                          TARGET, f3(n["final_acc"]), f3(n.get("max_acc")),
                          n.get("epochs_to_target") or "-", metrics.fmt(n.get("time_to_target_s")),
                          "yes" if n["final_acc"] >= TARGET else "no"))
    if n and t and n.get("final_acc") is not None and t.get("final_acc") is not None:
        d = t["final_acc"] - n["final_acc"]
        checks.append("- top-k 1%% + error feedback within 1 point of uncompressed: %s vs %s "
                      "(%+.2f points, %s x fewer bytes pushed) -> **%s**." % (
                          f3(t["final_acc"]), f3(n["final_acc"]), 100 * d,
                          metrics.fmt(t.get("wire_ratio")), "yes" if abs(d) <= 0.01 else "no"))
    a, b = by.get("mlp_pytorch"), by.get("mlp_ps_worker")
    if a and b and a.get("final_acc") is not None and b.get("final_acc") is not None:
        d = a["final_acc"] - b["final_acc"]
        checks.append("- PyTorch MLP (examples/mlp.py) vs ps_worker (epochs: %d; same batch, lr, "
                      "seed): %s vs %s (%+.2f points) -> **%s**." % (
                          epochs_mlp, f3(a["final_acc"]), f3(b["final_acc"]), 100 * d,
                          "within 1 point" if abs(d) <= 0.01 else "not within 1 point"))
    out += ["## Checks", ""] + checks + ["", "## Commands", "",
                                          "```", "PYTHONPATH=build/python nice -n 5 "
                                          "/usr/bin/python3 experiments/pytorch/run.py", "```", "",
                                          "Plots: `acc_vs_epoch.png`, `acc_vs_time.png`. "
                                          "Per-run logs and metrics CSVs: `runs/<run>/`.", ""]
    with open(os.path.join(args.out, "REPORT.md"), "w") as f:
        f.write("\n".join(out))


if __name__ == "__main__":
    main()
