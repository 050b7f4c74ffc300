"""A psrun run folder -> the figures of one run (a runs.csv row) and its curves.

Figures (besides metrics.summarize's idle fraction, staleness, updates,
bytes and wall time, defined in metrics.py):
  final_<metric>   the eval rank's last evaluation of the study's metric (the
                   mean of its last final_evals evaluations)
  best_<metric>    its best evaluation (max, or min when lower is better)
  time_to_target_s the eval rank's wall time at its first evaluation at or
                   beyond the target (None if never)
  bytes_wire       bytes on the wire, all workers: pushed (encoded) + pulled
Evaluations come from the rank's evals CSV (asyncps.metrics.report) when it
has the metric, else from the metrics CSV column of that name (ps_worker and
asyncps.metrics.TrainingLog write test_acc and train_loss there).
"""
import json
import os

from . import metrics

RUN_FIGURES = ["time_to_target_s", "wall_s", "samples_per_s", "steps", "bytes_pushed_raw",
               "bytes_pushed_wire", "bytes_pulled", "bytes_wire", "wire_ratio", "idle_frac",
               "idle_frac_max", "staleness_p50", "staleness_p99", "staleness_max", "updates",
               "updates_per_s"]
CURVE_COLUMNS = ["config", "seed", "rank", "name", "wall_s", "step", "value", "bytes_wire_est"]


def _json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def _f(v):
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def evaluations(rdir, rank):
    """{name: [(wall_s, step, value)]} of the rank's evals CSV and of the
    test_acc / train_loss columns of its metrics CSV (names the evals CSV has
    win)."""
    out = {}
    for row in metrics.read_csv(os.path.join(rdir, "evals-%d.csv" % rank)):
        w, s, v = _f(row.get("wall_s")), _f(row.get("step")), _f(row.get("value"))
        if None not in (w, s, v):
            out.setdefault(row.get("name"), []).append((w, int(s), v))
    from_csv = {}
    for row in metrics.read_csv(os.path.join(rdir, "metrics-%d.csv" % rank)):
        for name in ("test_acc", "train_loss"):
            w, s, v = _f(row.get("wall_s")), _f(row.get("step")), _f(row.get(name))
            if None not in (w, s, v):
                from_csv.setdefault(name, []).append((w, int(s), v))
    for name, pts in from_csv.items():
        out.setdefault(name, pts)
    return {k: sorted(v) for k, v in out.items()}


def _bytes_curve(rdir, rank):
    """[(wall_s, pushed wire + pulled bytes)] of one rank's metrics CSV."""
    pts = [(0.0, 0.0)]
    for row in metrics.read_csv(os.path.join(rdir, "metrics-%d.csv" % rank)):
        w, a, b = _f(row.get("wall_s")), _f(row.get("bytes_pushed_wire")), \
            _f(row.get("bytes_pulled"))
        if None not in (w, a, b):
            pts.append((w, a + b))
    return pts


def _interp(pts, x):
    if len(pts) < 2:
        return None
    if x >= pts[-1][0]:
        return pts[-1][1]
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if x0 <= x <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return None


def collect(rdir, workers, study):
    """(row, curves) of the run in rdir: row has RUN_FIGURES and the metric's
    final_/best_ figures; curves are CURVE_COLUMNS rows (without config/seed)."""
    summary = _json(os.path.join(rdir, "summary.json"))
    per = summary.get("per_worker") or {}
    totals = summary.get("totals") or {}
    job = {"out_dir": rdir, "stats": _json(os.path.join(rdir, "stats.json")),
           "summaries": [per.get(str(r), {}) for r in range(workers)],
           "wall_s": totals.get("wall_s") or 0.0, "encode_ms": []}
    s = metrics.summarize(job)
    row = {k: s.get(k) for k in RUN_FIGURES}
    row["bytes_wire"] = (s["bytes_pushed_wire"] or 0) + (s["bytes_pulled"] or 0) \
        if per else None
    evals = evaluations(rdir, study.eval_rank)
    pts = evals.get(study.metric, [])
    m = study.metric
    last = [p[2] for p in pts[-study.final_evals:]]
    row["final_" + m] = sum(last) / len(last) if last else None
    best = max if study.higher_is_better else min
    row["best_" + m] = best(p[2] for p in pts) if pts else None
    row["evaluations"] = len(pts)
    tta = None
    if study.target is not None:
        for w, _, v in pts:
            if (v >= study.target) if study.higher_is_better else (v <= study.target):
                tta = w
                break
    row["time_to_target_s"] = tta
    # Fleet bytes at each evaluation: the eval rank's, scaled to all workers.
    bc = _bytes_curve(rdir, study.eval_rank)
    rank_total = bc[-1][1] if bc else 0
    scale = (row["bytes_wire"] or 0) / rank_total if rank_total else None
    curves = []
    for name, ps in sorted(evals.items()):
        for w, step, v in ps:
            b = _interp(bc, w)
            curves.append({"rank": study.eval_rank, "name": name, "wall_s": w, "step": step,
                           "value": v, "bytes_wire_est": round(b * scale) if
                           b is not None and scale else None})
    return row, curves
