"""Pieces shared by the study scripts: CLI options, curve extraction, CSV IO."""
import argparse
import csv
import json
import math
import os
import shutil
import time

from pslaunch.binaries import default_bin_dir

from expkit import fleet, metrics, stats

REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
RESULTS = os.path.join(REPO, "experiments", "results")


def common_args(description, default_out):
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--quick", action="store_true",
                    help="short budget (fewer epochs): about a minute or two")
    ap.add_argument("--out", default=default_out,
                    help="output folder for CSVs and plots (default %(default)s)")
    ap.add_argument("--bin_dir", default=default_bin_dir(),
        help="ps_server/ps_worker/ps_ctl (default $ASYNCPS_BIN_DIR, else $BUILD/bin, "
             "else this checkout's build/bin: %(default)s)")
    ap.add_argument("--epochs", type=int, default=None,
                    help="epochs per worker (overrides the preset)")
    ap.add_argument("--max_steps", type=int, default=0,
                    help="cap every worker's steps (0: none), for CI")
    ap.add_argument("--eval_every", type=int, default=None,
                    help="rank 0 evaluates every N steps (overrides preset)")
    ap.add_argument("--only", default="",
                    help="comma-separated run names to run (default all)")
    ap.add_argument("--merge", action="store_true",
                    help="with --only: replace just these runs' rows in the "
                         "existing OUT CSVs (rerun a few configurations)")
    ap.add_argument("--worker_cmd", default=None,
                    help="run this command as each worker instead of ps_worker, e.g. "
                         "'/usr/bin/python3 worker/python/examples/mlp.py' (PyTorch)")
    ap.add_argument("--target", type=float, default=0.85,
                    help="test accuracy for time-to-accuracy (default 0.85)")
    ap.add_argument("--seeds", default="1,2,3",
                    help="comma-separated seeds (model initialisation and data "
                         "order) every configuration runs with "
                         "(default %(default)s)")
    return ap


def parse_seeds(text):
    """[int] from '1,2,3'; ValueError on anything else or on repeats."""
    seeds = [int(x) for x in text.split(",") if x.strip()]
    if not seeds or len(set(seeds)) != len(seeds):
        raise ValueError("--seeds needs distinct integers, got %r" % text)
    return seeds


def run_dir(out, run, seed):
    """OUT/runs/<run>/seed<k>: the logs and metrics CSVs of one run."""
    return os.path.join(out, "runs", run, "seed%d" % seed)


def load_average():
    """The 1-minute load average now (None where unknown)."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


# ------------------------------------------------------------ aggregation
def aggregate(rows, metrics_keys, keep=(), group="run"):
    """One row per configuration from per-seed rows: for every key of
    metrics_keys its mean, the half-width of its 95% t-interval (<key>_ci)
    and the number of seeds with a value (<key>_n); columns in `keep` are
    copied from the configuration's first row. Rows of one configuration
    keep the order of their first appearance."""
    order, by = [], {}
    for r in rows:
        k = r[group]
        if k not in by:
            order.append(k)
            by[k] = []
        by[k].append(r)
    out = []
    for k in order:
        rs = by[k]
        row = {group: k, "seeds": len(rs),
               "ok": sum(1 for r in rs if r.get("status", "ok") == "ok")}
        for c in keep:
            row[c] = rs[0].get(c)
        for m in metrics_keys:
            e = stats.Estimate([_float(r.get(m)) for r in rs])
            row[m] = e.mean
            row[m + "_ci"] = (e.half if e.half is not None and
                              math.isfinite(e.half) else None)
            row[m + "_n"] = e.n
        out.append(row)
    return out


def aggregate_columns(metrics_keys, keep=(), group="run"):
    cols = [group] + list(keep) + ["seeds", "ok"]
    for m in metrics_keys:
        cols += [m, m + "_ci", m + "_n"]
    return cols


def _float(v):
    if v in (None, ""):
        return None
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def worker_curve_points(out_dir, workers):
    """Per worker: [(wall_s, step)] from its metrics CSV, starting at (0, 0)."""
    out = []
    for r in range(workers):
        pts = [(0.0, 0)]
        for row in metrics.read_csv(os.path.join(out_dir,
                                                 "metrics-%d.csv" % r)):
            pts.append((float(row["wall_s"]), int(row["step"])))
        out.append(pts)
    return out


def _interp(pts, t):
    if t <= pts[0][0]:
        return pts[0][1]
    for (t0, s0), (t1, s1) in zip(pts, pts[1:]):
        if t <= t1:
            return s0 + (s1 - s0) * ((t - t0) / (t1 - t0) if t1 > t0 else 1)
    return pts[-1][1]


def curve_rows(run, job, summary, seed=None):
    """Rank 0's evaluations as rows: wall_s, step, updates_est, acc,
    bytes_wire_total_est (fleet wire bytes, scaled from rank 0's)."""
    workers = len(job["summaries"])
    per_worker = worker_curve_points(job["out_dir"], workers)
    pushes = max(1, summary["pushes"])
    per_push = summary["updates"] / pushes
    wire_total = summary["bytes_pushed_wire"] or 0
    rank0_wire = job["summaries"][0].get("bytes_pushed_wire", 0) or 1
    rows = []
    for wall, step, acc, wire0 in metrics.curve(job["out_dir"], 0):
        steps_all = sum(_interp(p, wall) for p in per_worker)
        rows.append({
            "run": run, "seed": seed, "wall_s": round(wall, 3), "step": step,
            "updates_est": round(per_push * steps_all, 1), "test_acc": acc,
            "bytes_wire_est": round(wire0 * wire_total / rank0_wire),
        })
    return rows


def write_csv(path, rows, columns):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: _cell(r.get(k)) for k in columns})


def _cell(v):
    if isinstance(v, float) and math.isfinite(v) and v.is_integer() \
            and abs(v) >= 1:
        return str(int(v))
    if isinstance(v, float):
        return metrics.fmt(v, 4)
    return "" if v is None else v


def check_finite(rows, allow_empty=()):
    """Raises ValueError naming the first non-finite or missing value."""
    for r in rows:
        for k, v in r.items():
            if v in ("", None):
                if k in allow_empty:
                    continue
                raise ValueError("%s: %s is empty" % (r.get("run"), k))
            try:
                x = float(v)
            except (TypeError, ValueError):
                continue
            if not math.isfinite(x):
                raise ValueError("%s: %s = %s" % (r.get("run"), k, v))


class Timer:
    def __init__(self):
        self.t0 = time.time()

    def __call__(self):
        return time.time() - self.t0


def _num(v):
    if v == "":
        return None
    try:
        x = float(v)
    except (TypeError, ValueError):
        return v
    return x


def merge_rows(path, new_rows):
    """Rows of the CSV at path whose (run, seed) is not in new_rows (values
    parsed back to numbers), followed by new_rows, in the file's run order
    (seed order within a run)."""
    def key(r):
        return (r["run"], str(r.get("seed", "")))
    fresh = {key(r) for r in new_rows}
    old = [{k: _num(v) if k != "run" else v for k, v in r.items()}
           for r in metrics.read_csv(path)]
    order = []
    for r in old + new_rows:
        if r["run"] not in order:
            order.append(r["run"])
    rows = [r for r in old if key(r) not in fresh] + list(new_rows)
    return sorted(rows, key=lambda r: (order.index(r["run"]),
                                       _float(r.get("seed")) or 0))


# -------------------------------------------------------------- execution
def finished_job(out, run, seed, server_flags, worker_flags):
    """The job a completed earlier (run, seed) left in its run_dir (job.json
    and stats.json, as fleet.run_job writes them once a job has finished),
    or None: when they are missing, unreadable or were run with other
    server or worker flags. Lets a long study resume after it was stopped."""
    d = run_dir(out, run, seed)
    try:
        with open(os.path.join(d, "job.json")) as f:
            job = json.load(f)
        with open(os.path.join(d, "stats.json")) as f:
            job["stats"] = json.load(f)
    except (OSError, ValueError):
        return None
    if job.get("server_flags") != list(server_flags) or \
            job.get("worker_flags") != list(worker_flags):
        return None
    job["out_dir"] = d
    return job


def execute(tag, out, run, seed, workers, start_job, timer):
    """Runs one (configuration, seed): start_job(run_dir) is a
    fleet.run_job call. Returns (job, status): a failed or diverged job
    gives what is left of it (fleet.partial_job), never an exception."""
    d = run_dir(out, run, seed)
    shutil.rmtree(d, ignore_errors=True)
    print("[%s %7.1fs] %s seed %d (load %.1f) ..." % (
        tag, timer(), run, seed, load_average() or -1), flush=True)
    try:
        return start_job(d), "ok"
    except fleet.JobError as e:
        status = "diverged" if "diverged" in str(e) else "failed"
        print("[%s] %s seed %d %s: %s" % (tag, run, seed, status,
                                          str(e)[-300:]), flush=True)
        return fleet.partial_job(d, workers), status


def finish(args, rows, curves, run_columns, curve_columns, agg_keys, keep,
           budget_line):
    """Writes OUT/runs.csv (one row per configuration and seed),
    OUT/curves.csv, OUT/summary.csv (per configuration: mean, 95% interval
    and n of agg_keys) and appends to OUT/budget.txt. With --merge the rows
    of the (run, seed) pairs just run replace theirs in the existing CSVs."""
    out = args.out
    if args.merge:
        rows = merge_rows(os.path.join(out, "runs.csv"), rows)
        curves = merge_rows(os.path.join(out, "curves.csv"), curves)
    write_csv(os.path.join(out, "runs.csv"), rows, run_columns)
    write_csv(os.path.join(out, "curves.csv"), curves, curve_columns)
    write_summary(out, agg_keys, keep)
    with open(os.path.join(out, "budget.txt"), "a" if args.merge else "w") as f:
        f.write(budget_line.rstrip("\n") + "\n")


def write_summary(out, agg_keys, keep):
    """OUT/summary.csv from OUT/runs.csv (report.py calls this too)."""
    rows = metrics.read_csv(os.path.join(out, "runs.csv"))
    write_csv(os.path.join(out, "summary.csv"), aggregate(rows, agg_keys, keep),
              aggregate_columns(agg_keys, keep))


def seed_bands(curves, run, x, y="test_acc", points=40):
    """stats.band of one configuration's per-seed curves (x, y)."""
    per_seed = {}
    for c in curves:
        if c["run"] != run:
            continue
        xv, yv = _float(c.get(x)), _float(c.get(y))
        if xv is None or yv is None:
            continue
        per_seed.setdefault(c.get("seed", ""), []).append((xv, yv))
    return stats.band(list(per_seed.values()), points=points)
