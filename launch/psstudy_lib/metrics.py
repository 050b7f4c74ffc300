"""Turns a finished job (expkit.fleet.run_job, or a psrun run folder read by
psstudy_lib.collect) into numbers.

Definitions (used by every table in the report):
  time_to_target_s  rank 0's wall time (from its start) at its first
                    evaluation with test accuracy >= target; None if never.
  final_acc         rank 0's last evaluation (after its last step).
  final_acc_avg3    mean of rank 0's last 3 evaluations (see last_mean).
  idle_frac         mean over workers of pull wait / wall time (cumulative
                    pull_wait_ms of the last CSV row over its wall_s).
  staleness p50/p99 from the shards' histograms (ps_ctl stats after the
                    workers finished), merged over shards.
  updates           model updates applied by the shards: the shard version
                    (BSP: one per round; SSP/ASP: one per push), max over
                    shards; updates_per_s = updates / wall_s.
  wall_s            the slowest worker's training time (SUMMARY wall_s):
                    start-up (data loading) and teardown are left out.
  final_eval_acc    test accuracy of the shards' weights after every worker
                    finished (one observer evaluation, fleet.final_evaluation;
                    empty when not run): the model all samples trained.
  diverged_step     the step at which a worker stopped with a non-finite
                    loss (empty when none did).
"""
import csv
import math
import os
import re


def read_csv(path):
    """Rows of a CSV with a header; [] when the file does not exist."""
    try:
        with open(path, newline="") as f:
            return list(csv.DictReader(f))
    except FileNotFoundError:
        return []


def _f(v):
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def merged_staleness(stats):
    """(p50, p99, max, count) of all shards' staleness histograms."""
    buckets = {}
    mx = 0
    for sh in stats.get("shards", []):
        st = sh.get("stats", {}).get("staleness", {})
        mx = max(mx, st.get("max", 0))
        for low, count in st.get("buckets", []):
            buckets[low] = buckets.get(low, 0) + count
    total = sum(buckets.values())
    if total == 0:
        return 0, 0, 0, 0

    def q(p):
        need = p * total
        acc = 0
        for low in sorted(buckets):
            acc += buckets[low]
            if acc >= need:
                return low
        return max(buckets)

    return q(0.5), q(0.99), mx, total


def shard_counter(stats, key, agg=max):
    vals = [sh.get("stats", {}).get(key, 0) for sh in stats.get("shards", [])]
    return agg(vals) if vals else 0


def curve(out_dir, rank=0):
    """Rank's evaluation points: [(wall_s, step, test_acc, bytes_wire)]."""
    pts = []
    for row in read_csv(os.path.join(out_dir, "metrics-%d.csv" % rank)):
        acc = _f(row.get("test_acc"))
        if acc is None or _f(row.get("bytes_pushed_wire")) is None:
            continue  # not evaluated, or a row cut short by a crash
        pts.append((_f(row["wall_s"]), int(row["step"]), acc,
                    _f(row["bytes_pushed_wire"])))
    return pts


def last_mean(pts, n=3):
    """Mean accuracy of the last n evaluations: plain SGD at a constant
    learning rate makes single evaluations swing by a few points, so
    comparisons within 1-2 points use this."""
    accs = [p[2] for p in pts[-n:]]
    return sum(accs) / len(accs) if accs else None


_DIVERGED_RE = re.compile(r"training diverged: loss is \S+ at step (\d+)")


def diverged_step(out_dir, workers):
    """Earliest step at which a worker reported divergence, or None."""
    steps = []
    for r in range(workers):
        try:
            text = open(os.path.join(out_dir, "worker-%d.log" % r),
                        errors="replace").read()
        except OSError:
            continue
        steps += [int(m.group(1)) for m in _DIVERGED_RE.finditer(text)]
    return min(steps) if steps else None


def summarize(job, target=0.85):
    out_dir = job["out_dir"]
    workers = len(job["summaries"])
    rows = {r: read_csv(os.path.join(out_dir, "metrics-%d.csv" % r))
            for r in range(workers)}
    pts = curve(out_dir, 0)
    tta = next((t for t, _, a, _ in pts if a >= target), None)
    idle = []
    for r, rs in rows.items():
        if not rs or _f(rs[-1].get("pull_wait_ms")) is None:
            continue
        last = rs[-1]
        wall = _f(last["wall_s"])
        if wall and wall > 0:
            idle.append(_f(last["pull_wait_ms"]) / 1e3 / wall)
    p50, p99, smax, scount = merged_staleness(job["stats"])
    updates = shard_counter(job["stats"], "version")
    pushes = shard_counter(job["stats"], "pushes", sum)
    sums = job["summaries"]
    raw = sum(s.get("bytes_pushed_raw", 0) for s in sums)
    wire = sum(s.get("bytes_pushed_wire", 0) for s in sums)
    pulled = sum(s.get("bytes_pulled", 0) for s in sums)
    steps = sum(s.get("steps", 0) for s in sums)
    enc = [e for e in job.get("encode_ms", []) if e is not None]
    # Training wall time: the slowest worker's Run() (process start-up,
    # data loading and teardown excluded).
    wall = max((s.get("wall_s", 0) for s in sums), default=0) or job["wall_s"]
    return {
        "time_to_target_s": tta,
        "final_acc": pts[-1][2] if pts else None,
        "final_acc_avg3": last_mean(pts),
        "max_acc": max(a for _, _, a, _ in pts) if pts else None,
        "idle_frac": sum(idle) / len(idle) if idle else None,
        "idle_frac_max": max(idle) if idle else None,
        "idle_frac_min": min(idle) if idle else None,
        "staleness_p50": p50,
        "staleness_p99": p99,
        "staleness_max": smax,
        "updates": updates,
        "pushes": pushes,
        "wall_s": wall,
        "job_wall_s": job["wall_s"],
        "updates_per_s": updates / wall if wall > 0 else None,
        "samples_per_s": sum(s.get("samples_per_s", 0) for s in sums),
        "bytes_pushed_raw": raw,
        "bytes_pushed_wire": wire,
        "bytes_pulled": pulled,
        "wire_ratio": raw / wire if wire else None,
        "steps": steps,
        "encode_ms_per_step": (sum(enc) / steps) if enc and steps else None,
        "final_eval_acc": job.get("final_eval_acc"),
        "diverged_step": diverged_step(out_dir, workers),
    }


def fmt(v, digits=3):
    """Cell text: '' for None, integers plain, floats rounded."""
    if v is None:
        return ""
    if isinstance(v, float):
        if not math.isfinite(v):
            return str(v)
        if v == int(v) and (abs(v) >= 1000 or digits > 0 and v == 0):
            return str(int(v))
        return ("%%.%dg" % max(digits, 1)) % v if abs(v) < 1e-3 and v != 0 \
            else ("%%.%df" % digits) % v
    return str(v)
