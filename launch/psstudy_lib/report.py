"""A study's results folder from its runs' results: runs.csv, curves.csv,
summary.csv, the PNGs (gnuplot, with their .gp) and REPORT.md.

Statistics are stats.py's (those of experiments/report.py): a figure is the
mean over seeds +- the half-width of its 95% Student-t interval; a
comparison is the difference of two configurations' means with its 95%
Welch interval [lo, hi], and its verdict says where that interval lies:
above 0, below 0 (each named by what it means: better, faster, fewer
bytes), within the study's tolerance band, or around 0 (no difference
shown). Only runs that ended ok enter the statistics; a run whose metric
never reached the target counts its whole training time as its time to
target (a lower bound), as in experiments/report.py.
"""
import csv
import itertools
import math
import os

from . import plots, stats
from .collect import CURVE_COLUMNS, RUN_FIGURES

BASE_COLUMNS = ["config", "label", "seed", "status", "exit_code", "error"]
MIB = float(1 << 20)


def _f(v):
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def _cell(v):
    if v is None:
        return ""
    if isinstance(v, float):
        return "%.6g" % v
    return v


def write_csv(path, rows, columns):
    with open(path + ".tmp", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: _cell(r.get(k)) for k in columns})
    os.replace(path + ".tmp", path)


class Results:
    """The study's runs (result.json contents) by configuration."""

    def __init__(self, study, results):
        self.study = study
        self.m = study.metric
        self.results = results  # [(config, seed, result)]
        self.by = {}
        for c, seed, r in results:
            self.by.setdefault(c.slug(), []).append(r)

    def rows(self):
        out = []
        for c, seed, r in self.results:
            row = dict(r.get("row") or {})
            row.update(config=c.slug(), label=c.label(), seed=seed, status=r["status"],
                       exit_code=r.get("exit_code"), error=r.get("error", ""))
            row.update({k: c.values[k] for k in self.study.grid})
            out.append(row)
        return out

    def columns(self):
        return BASE_COLUMNS[:3] + list(self.study.grid) + BASE_COLUMNS[3:] + [
            "final_" + self.m, "best_" + self.m, "evaluations"] + RUN_FIGURES

    def est(self, c, key):
        return stats.Estimate([_f((r.get("row") or {}).get(key)) for r in self.by.get(c.slug(), [])
                               if r["status"] == "ok"])

    def tta(self, c):
        """Time to target per ok seed; never reached: its training time."""
        vals = []
        for r in self.by.get(c.slug(), []):
            if r["status"] != "ok":
                continue
            row = r.get("row") or {}
            t = _f(row.get("time_to_target_s"))
            vals.append(t if t is not None else _f(row.get("wall_s")))
        return stats.Estimate(vals)

    def reached(self, c):
        rs = [r for r in self.by.get(c.slug(), []) if r["status"] == "ok"]
        return sum(1 for r in rs if _f((r.get("row") or {}).get("time_to_target_s"))
                   is not None), len(rs)

    def counts(self, c):
        rs = self.by.get(c.slug(), [])
        return sum(1 for r in rs if r["status"] == "ok"), len(rs)


# Figures compared between configurations: (key, title, digits, scale, unit,
# word when A - B > 0, word when < 0).
def _figures(study):
    m = study.metric
    better, worse = ("better", "worse") if study.higher_is_better else ("worse", "better")
    figs = [("final_" + m, "final " + m, 4, 1.0, "", better, worse)]
    if study.target is not None:
        figs.append(("tta", "time to %s %s %g" % (m, ">=" if study.higher_is_better else "<=",
                                                    study.target), 2, 1.0, " s", "slower",
                     "faster"))
    figs += [("wall_s", "training wall time", 2, 1.0, " s", "slower", "faster"),
             ("bytes_wire", "bytes on the wire", 2, 1 / MIB, " MiB", "more bytes",
              "fewer bytes"),
             ("idle_frac", "idle fraction", 3, 1.0, "", "more idle", "less idle")]
    return figs


def verdict(d, up, down, tolerance=None):
    """The verdict word of a difference A - B."""
    if d.mean is None:
        return "not measured"
    if d.half is None or not math.isfinite(d.half):
        return "no interval (needs >= 2 ok runs each)"
    if tolerance is not None:
        v, _ = stats.verdict_within(d, tolerance)
        if v == "reproduced":
            return "equal within +-%g (the 95%% interval lies inside)" % tolerance
    if d.lo > 0:
        return "%s (the 95%% interval lies above 0)" % up
    if d.hi < 0:
        return "%s (the 95%% interval lies below 0)" % down
    return "no difference shown (the 95% interval contains 0)"


def comparisons(res):
    """(Markdown lines, glance table lines): for every grid key with several
    values, each value against the first one listed (the baseline), the other
    keys held equal; the table has one row per comparison, one verdict word
    per figure."""
    study = res.study
    out = []
    glance = []
    figs = _figures(study)
    n = 0
    for key in study.varying:
        base = study.grid[key][0]
        others = [k for k in study.varying if k != key]
        out += ["### %s: each value against %s" % (key, base), ""]
        for v in study.grid[key][1:]:
            for combo in itertools.product(*(study.grid[k] for k in others)):
                ctx = dict(zip(others, combo))
                a = b = None
                for c in study.configs:
                    if c.values[key] == v and all(c.values[k] == x for k, x in ctx.items()):
                        a = c
                    if c.values[key] == base and all(c.values[k] == x for k, x in ctx.items()):
                        b = c
                if a is None or b is None:
                    continue
                n += 1
                where = ", ".join("%s=%s" % kv for kv in ctx.items()) or "all else equal"
                lines, words = [], []
                for fkey, title, digits, scale, unit, up, down in figs:
                    ea = res.tta(a) if fkey == "tta" else res.est(a, fkey)
                    eb = res.tta(b) if fkey == "tta" else res.est(b, fkey)
                    d = stats.Difference(ea, eb)
                    tol = study.tolerance.get(fkey if fkey != "tta" else "time_to_target_s")
                    lines.append("  - %s: %s %s vs %s %s; difference %s: **%s**" % (
                        title, v, ea.fmt(digits, unit=unit) if scale == 1 else
                        _scaled(ea, scale, digits, unit), base,
                        eb.fmt(digits, unit=unit) if scale == 1 else
                        _scaled(eb, scale, digits, unit), d.fmt(digits, scale, unit),
                        verdict(d, up, down, tol)))
                    words.append(verdict(d, up, down, tol).split(" (")[0])
                out.append("%d. **%s = %s vs %s** (%s; %d/%d and %d/%d runs ok):" % (
                    n, key, v, base, where, *res.counts(a), *res.counts(b)))
                out += lines
                glance.append("| %d | %s = %s vs %s | %s | %s |" % (
                    n, key, v, base, where, " | ".join(words)))
        out.append("")
    if not n:
        out += ["(the grid varies no key: nothing to compare)", ""]
        return out, []
    head = ["#", "A vs B", "other keys"] + [f[1] for f in figs]
    table = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + glance + [""]
    return out, table


def _scaled(e, scale, digits, unit):
    if e.mean is None:
        return "n/a"
    f = "%%.%df" % digits
    if e.n < 2:
        return f % (e.mean * scale) + unit + " (1 run)"
    return "%s%s +- %s" % (f % (e.mean * scale), unit, f % (e.half * scale))


def summary_rows(res):
    out = []
    keys = ["final_" + res.m, "best_" + res.m] + RUN_FIGURES
    for c in res.study.configs:
        row = {"config": c.slug(), "label": c.label()}
        row.update({k: c.values[k] for k in res.study.grid})
        row["seeds"], row["ok"] = res.counts(c)[1], res.counts(c)[0]
        for k in keys:
            e = res.tta(c) if k == "time_to_target_s" else res.est(c, k)
            row[k] = e.mean
            row[k + "_ci"] = e.half if e.half is not None and math.isfinite(e.half) else None
            row[k + "_n"] = e.n
        out.append(row)
    cols = ["config", "label"] + list(res.study.grid) + ["seeds", "ok"]
    for k in keys:
        cols += [k, k + "_ci", k + "_n"]
    return out, cols


def draw(out, res, curves):
    """The PNGs (and .gp scripts); returns [(file, what it shows)]."""
    if not plots.have_gnuplot():
        return []
    study, m = res.study, res.m
    drawn = []
    per = {}
    for row in curves:
        if row["name"] != m:
            continue
        per.setdefault(row["config"], {}).setdefault(row["seed"], []).append(row)
    n = len(study.seeds)
    for x, xlabel, fname, scale in (("wall_s", "wall time of rank %d (s)" % study.eval_rank,
                                     "%s_vs_time.png" % m, 1.0),
                                    ("bytes_wire_est", "bytes on the wire, all workers (MiB)",
                                     "%s_vs_bytes.png" % m, 1 / MIB)):
        series = []
        for c in study.configs:
            seeds = per.get(c.slug(), {})
            cs = [[(_f(r[x]) * scale, _f(r["value"])) for r in rows
                   if _f(r[x]) is not None and _f(r["value"]) is not None]
                  for rows in seeds.values()]
            b = stats.band(cs)
            if len(b) < 3 and cs:  # seeds without a common x range: mean where each is
                lo = min(p[0][0] for p in cs if p)
                hi = max(p[-1][0] for p in cs if p)
                b = stats.band(cs, xs=[lo + (hi - lo) * i / 59 for i in range(60)])
            series.append((c.label(), [p[:4] for p in b]))
        plots.band_plot(os.path.join(out, fname), "%s: %s vs %s (mean of up to %d seeds, 95%% "
                        "band)" % (study.name, m, x.split("_")[0], n), xlabel,
                        "%s (rank %d)" % (m.replace("_", " "), study.eval_rank), series,
                        key="bottom right" if study.higher_is_better else "top right",
                        yrange=("0", "1") if "acc" in m.lower() else None)
        drawn.append((fname, "%s vs %s, mean over seeds with a 95%% band" % (m, xlabel)))
    for key, title, fname, scale, unit in (
            ("tta", "time to target" if study.target is not None else None,
             "time_to_target.png", 1.0, "s"),
            ("final_" + m, "final " + m, "final_%s.png" % m, 1.0, ""),
            ("bytes_wire", "bytes on the wire", "bytes_wire.png", 1 / MIB, "MiB")):
        if title is None:
            continue
        series = []
        for i, c in enumerate(study.configs):
            e = res.tta(c) if key == "tta" else res.est(c, key)
            if e.mean is None:
                continue
            h = e.half if math.isfinite(e.half) else 0.0
            series.append((c.label(), [(i + 1, e.mean * scale, (e.mean - h) * scale,
                                        (e.mean + h) * scale)]))
        plots.errorbar_plot(os.path.join(out, fname), "%s: %s per configuration (mean, 95%% "
                            "interval)" % (study.name, title), "configuration",
                            "%s%s" % (title.replace("_", " "), " (%s)" % unit if unit else ""),
                            series,
                            lines_too=False, key="outside right top",
                            extra=["set xrange [0.5:%g]" % (len(study.configs) + 0.5),
                                   "set xtics 1", "set offsets 0, 0, graph 0.05, graph 0.05"])
        drawn.append((fname, "%s per configuration, mean and 95%% interval" % title))
    return drawn


def write(out, res, curves, header):
    """Writes runs.csv, curves.csv, summary.csv, the PNGs and REPORT.md.
    header: lines about how the study ran (command, wall time)."""
    study = res.study
    write_csv(os.path.join(out, "runs.csv"), res.rows(), res.columns())
    write_csv(os.path.join(out, "curves.csv"), curves, CURVE_COLUMNS)
    srows, scols = summary_rows(res)
    write_csv(os.path.join(out, "summary.csv"), srows, scols)
    drawn = draw(out, res, curves)
    m = study.metric
    lines = ["# Study: %s" % study.name, ""] + header + [""]
    lines += ["## Configurations", "",
              "Mean over the runs that ended ok +- the half-width of the 95%% Student-t "
              "interval over seeds (%s). final %s is rank %d's %s (%s is better); "
              "time to target: its wall time at the first evaluation %s %s (a seed that "
              "never got there counts its whole training time); bytes on the wire: "
              "pushed (encoded) + pulled, all workers; idle: pull wait / wall, mean of the "
              "workers; staleness: the shards' histogram (p50/p99)." % (
                  ", ".join(map(str, study.seeds)), m, study.eval_rank,
                  "last evaluation" if study.final_evals == 1 else
                  "mean of its last %d evaluations" % study.final_evals, "higher" if study.higher_is_better else "lower",
                  ">=" if study.higher_is_better else "<=",
                  "%g" % study.target if study.target is not None else "(no target set)"), ""]
    head = ["configuration", "ok", "final " + m, "time to target (s)", "reached",
            "wall (s)", "samples/s", "wire (MiB)", "push ratio", "idle", "staleness p50/p99"]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in study.configs:
        ok, total = res.counts(c)
        reached = "%d/%d" % res.reached(c) if study.target is not None else "-"
        lines.append("| " + " | ".join([
            c.label(), "%d/%d" % (ok, total), res.est(c, "final_" + m).fmt(4),
            res.tta(c).fmt(2) if study.target is not None else "-", reached,
            res.est(c, "wall_s").fmt(2), res.est(c, "samples_per_s").fmt(0),
            _scaled(res.est(c, "bytes_wire"), 1 / MIB, 2, ""),
            res.est(c, "wire_ratio").fmt(1), res.est(c, "idle_frac").fmt(3),
            "%s / %s" % (res.est(c, "staleness_p50").fmt(1),
                         res.est(c, "staleness_p99").fmt(1))]) + " |")
    detail, table = comparisons(res)
    cells = (len(table) - 3) * len(_figures(study)) if table else 0
    lines += ["", "## Verdicts at a glance", "",
              "A's verdict against B per figure (details and intervals below): where the "
              "95%% Welch interval of the difference of means A - B over seeds lies. Each "
              "interval holds at 95%% on its own: of these %d, about %.1f may exclude 0 by "
              "chance alone when nothing differs." % (cells, cells / 20.0), ""]
    lines += table or ["(nothing compared)", ""]
    lines += ["## Comparisons (95% Welch intervals of A - B over seeds)", "",
              "Each value of a key against the first value listed for it, everything else "
              "equal. Verdict: where the interval of the difference lies.", ""]
    lines += detail
    failed = [(c, seed, r) for c, seed, r in res.results if r["status"] != "ok"]
    lines += ["## Failed runs", ""]
    if not failed:
        lines += ["None.", ""]
    for c, seed, r in failed:
        lines += ["- **%s, seed %d**: %s (exit %s; folder `%s`)" % (
            c.label(), seed, r.get("error"), r.get("exit_code"), r.get("run_dir")), "",
            "```", (r.get("log_tail") or "(no log)").rstrip()[-3000:], "```", ""]
    lines += ["## Files", "",
              "runs.csv (one row per configuration and seed), summary.csv (per "
              "configuration: mean, 95%% half-width and n of every figure), curves.csv "
              "(every evaluation of rank %d: name, wall_s, step, value, fleet bytes on the "
              "wire so far), runs/<configuration>/seed<k>/ (psrun's run folders: logs, "
              "metrics CSVs, summary.json, stats.json, result.json)." % study.eval_rank, ""]
    lines += ["- `%s`: %s" % d for d in drawn] + [""]
    with open(os.path.join(out, "REPORT.md.tmp"), "w") as f:
        f.write("\n".join(lines))
    os.replace(os.path.join(out, "REPORT.md.tmp"), os.path.join(out, "REPORT.md"))
