#!/usr/bin/env python3
"""PyTorch workers through asyncps (issue 11): Python workers
(worker/python/examples) on 2 shards x 4 workers, SSP s=2, Fashion-MNIST.

  - cnn_none / cnn_topk: the CNN of examples/cnn.py, uncompressed and with
    topk:ratio=0.01,ef=1 pushes; server SGD without momentum (asynchrony
    adds its own), lr 0.2 with cosine decay to 0 over the run
    (--lr_decay_updates = 4 workers x steps);
  - mlp_pytorch / mlp_ps_worker: ps_worker's MLP trained by examples/mlp.py
    and by ps_worker at the same epochs, batch, lr and seed (the settings of
    launch/configs/fashion_ssp.flags): the cross-check of the two workers.

  experiments/pytorch/run.py [--quick] [--only cnn_none,...] [--out DIR]
                             [--bin_dir DIR] [--epochs N] [--merge]

Writes OUT/summary.csv (one row per run), OUT/curves.csv (rank 0's
evaluations: wall time, epoch, test accuracy), acc_vs_epoch.png,
acc_vs_time.png and their .gp scripts. Each evaluation is rank 0's, in eval
mode with its own BatchNorm running statistics.
"""
import os
import sys

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


def runs(epochs_cnn, epochs_mlp, cnn_optimizer="sgd", cnn_lr=0.2):
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
    ap.add_argument("--cnn_optimizer", default="sgd", help="ps_server --optimizer for the CNN")
    ap.add_argument("--cnn_lr", type=float, default=0.2, help="ps_server --lr for the CNN")
    args = ap.parse_args()
    epochs_cnn = args.epochs or (1 if args.quick else 12)
    epochs_mlp = args.epochs_mlp or (1 if args.quick else 5)
    only = set(filter(None, args.only.split(",")))
    spe = steps_per_epoch()
    rows, curves = [], []
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
    if args.merge:
        rows = study.merge_rows(os.path.join(args.out, "summary.csv"), rows)
        curves = study.merge_rows(os.path.join(args.out, "curves.csv"), curves)
    study.write_csv(os.path.join(args.out, "summary.csv"), rows, COLUMNS)
    study.write_csv(os.path.join(args.out, "curves.csv"), curves,
                    ["run", "wall_s", "epoch", "test_acc"])
    if plots.have_gnuplot():
        names = sorted({c["run"] for c in curves})
        for x, label, png in (("epoch", "epoch (per worker)", "acc_vs_epoch.png"),
                              ("wall_s", "wall time (s)", "acc_vs_time.png")):
            series = [(n, [(float(c[x]), float(c["test_acc"])) for c in curves
                           if c["run"] == n]) for n in names]
            plots.line_plot(os.path.join(args.out, png),
                            "PyTorch workers through asyncps: 2 shards x 4 workers, SSP s=2",
                            label, "test accuracy (rank 0)", series, yrange=("0.8", "0.95"))


if __name__ == "__main__":
    main()
