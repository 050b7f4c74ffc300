#!/usr/bin/env python3
"""Markdown tables of benchmark JSON lines (experiments/bench/*).

  experiments/bench/summarize.py experiments/results/perf/quiet2/*.jsonl
  experiments/bench/summarize.py --compare OLD.jsonl NEW.jsonl
  experiments/bench/summarize.py --check [--goals goals.json] [--all] FILES...

Every benchmark prints one JSON object per line; this prints, per file, one
table with the figures a report quotes: the median, the same-run baseline, the
ratio and its spread (min-max of the per-repeat ratios). For the transport it
also gives the ratio to the two-process raw ZeroMQ baseline (raw_2proc, the
topology of a worker and a ps_server), which the benchmark prints beside the
one-process one.

--check compares the rows with the goals of experiments/bench/goals.json (or
--goals): one line per goal row below its minimum ("FAIL bench=... row=...
ratio=0.21 < goal 0.30"), per goal row not found in files that hold rows of
its benchmark ("MISSING ..."), then a table of every goal row (median and
[min, max] of the metric over the repeats, where the row has a spread; for
a row a file holds several runs of, the median of the runs' medians and
their [min, max], and that median is what meets the goal or not). Goals
of benchmarks with no rows in FILES are listed as not checked (with --all they
are MISSING). Every non-empty line of FILES must be a JSON object. Exit
status: 0 all checked goal rows met (or waived), 1 a row below its goal or
missing, 2 unreadable input (a malformed line, a bad goals file).
"""
import argparse
import itertools
import os
import statistics
import json
import sys


def spread(d, key="ratio_spread"):
    s = d.get(key) or {}
    if "min" not in s:
        return ""
    return "%.2f-%.2f" % (s["min"], s["max"])


def size(b):
    for unit, k in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= k and b % k == 0:
            return "%d %s" % (b // k, unit)
    return str(b)


def shm(rows):
    """ps_bench_transport --transport=shm: shared memory and ipc vs memcpy."""
    print("| pull size | in flight | shared memory MB/s | x memcpy (spread) | ipc MB/s "
          "| x memcpy | memcpy MB/s | CPU ms/GB shm / ipc |")
    print("|---|---|---|---|---|---|---|---|")
    for d in rows:
        print("| %s | %d | %.0f | %.2f (%s) | %.0f | %.2f | %.0f | %.0f / %.0f |" % (
            size(d["bytes"]), d["inflight"], d["mb_per_s"], d["ratio"], spread(d),
            d["ipc_mb_per_s"], d["ratio_ipc"], d["baseline_mb_per_s"], d["cpu_ms_per_gb"],
            d["ipc_cpu_ms_per_gb"]))


def transport(rows):
    if rows and rows[0].get("baseline") == "memcpy":
        return shm(rows)
    print("| op | server | size | in flight | ours MB/s | raw 1-proc MB/s | ratio (spread) "
          "| raw 2-proc MB/s | ratio to 2-proc | CPU ms/GB ours / raw 2-proc |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for d in rows:
        print("| %s | %s | %s | %d | %.0f | %.0f | %.2f (%s) | %.0f | %.2f | %.0f / %.0f |" % (
            d["op"], d["mode"], size(d["bytes"]), d["inflight"], d["mb_per_s"],
            d["baseline_mb_per_s"], d["ratio"], spread(d), d.get("raw_2proc_mb_per_s", 0),
            d.get("ratio_vs_raw_2proc", 0), d.get("cpu_ms_per_gb", 0),
            d.get("raw_2proc_cpu_ms_per_gb", 0)))


def apply(rows):
    print("| level | optimizer | gradient | threads | GB/s | memcpy GB/s | ratio (spread) |")
    print("|---|---|---|---|---|---|---|")
    for d in rows:
        print("| %s | %s | %s | %s | %.2f | %.2f | %.2f (%s) |" % (
            d.get("level", ""), d.get("optimizer", ""), size(d.get("grad_bytes", 0)),
            d.get("apply_threads", ""), d.get("gbps", 0), d.get("baseline_gbps", 0),
            d.get("ratio", 0), spread(d)))


def codecs(rows):
    print("| codec | elements | op | Gelem/s | memcpy Gelem/s | ratio (spread) | bits/elem |")
    print("|---|---|---|---|---|---|---|")
    for d in rows:
        print("| %s | %d | %s | %.3f | %.3f | %.2f (%s) | %.1f |" % (
            d["codec"], d["n"], d["op"], d["gelems_per_s"], d["baseline_gelems_per_s"],
            d["ratio"], spread(d), d.get("bits_per_elem", 0)))


def generic(rows):
    keys = []
    for d in rows:
        for k, v in d.items():
            if k not in keys and not isinstance(v, (dict, list)):
                keys.append(k)
    print("| " + " | ".join(keys) + " |")
    print("|" + "---|" * len(keys))
    for d in rows:
        print("| " + " | ".join(str(d.get(k, "")) for k in keys) + " |")


KEYS = {
    "transport": (lambda d: (d["op"], d["mode"], d["bytes"], d["inflight"]), "mb_per_s"),
    "apply": (lambda d: (d.get("level"), d.get("optimizer"), d.get("grad_bytes"),
                         d.get("apply_threads")), "gbps"),
    "codec": (lambda d: (d["codec"], d["n"], d["op"]), "gelems_per_s"),
}


def load(path):
    return [json.loads(l) for l in open(path) if l.strip().startswith("{")]


def compare(old_path, new_path):
    """Rows of two runs of one benchmark side by side: throughput and ratio."""
    old, new = load(old_path), load(new_path)
    key, val = KEYS[old[0]["bench"]]
    by_key = {key(d): d for d in old}
    print("| row | old | new | old ratio | new ratio |")
    print("|---|---|---|---|---|")
    lower = higher = 0
    for d in new:
        o = by_key.get(key(d))
        if o is None:
            continue
        if d.get("ratio") is not None and o.get("ratio") is not None:
            lower += d["ratio"] < o["ratio"]
            higher += d["ratio"] >= o["ratio"]
        print("| %s | %s | %s | %s | %s |" % (" ".join(str(k) for k in key(d)), o.get(val),
                                             d.get(val), o.get("ratio"), d.get("ratio")))
    print("\nnew ratio lower in %d rows, at or above in %d" % (lower, higher))


class InputError(Exception):
    """A file --check cannot read: a malformed line or goals file."""


def load_strict(path):
    """Every non-empty line of path as a JSON object; InputError otherwise."""
    rows = []
    with open(path) as f:
        for no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                d = json.loads(line)
            except ValueError as e:
                raise InputError("%s:%d: not a JSON line (%s): %.60s" % (path, no, e, line.strip()))
            if not isinstance(d, dict):
                raise InputError("%s:%d: not a JSON object: %.60s" % (path, no, line.strip()))
            rows.append(d)
    return rows


def goal_rows(goal):
    """The selectors of one goal: a list value in "select" means one goal row
    per value (every combination of the lists)."""
    sel = goal["select"]
    keys = list(sel)
    values = [v if isinstance(v, list) else [v] for v in (sel[k] for k in keys)]
    return [dict(zip(keys, combo)) for combo in itertools.product(*values)]


def load_goals(path):
    try:
        with open(path) as f:
            goals = json.load(f)["goals"]
        for g in goals:
            for key in ("name", "bench", "select", "metric", "min"):
                if key not in g:
                    raise InputError("%s: goal %r has no %r" % (path, g.get("name"), key))
            if not isinstance(g["min"], (int, float)) or not isinstance(g["select"], dict):
                raise InputError("%s: goal %r: min must be a number, select an object"
                                 % (path, g["name"]))
        return goals
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise InputError("%s: not a goals file (%s)" % (path, e))


def metric_of(row, metric):
    """(median, min, max) of a row's metric; min and max None without a spread.
    A metric is a number with its spread in <metric>_spread (ratio: also
    ratio_spread) or <metric>_min/_max, or an object with median/min/max."""
    v = row.get(metric)
    if isinstance(v, dict):
        return v.get("median"), v.get("min"), v.get("max")
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return None, None, None
    s = row.get(metric + "_spread")
    if isinstance(s, dict) and "min" in s:
        return v, s["min"], s.get("max")
    if (metric + "_min") in row:
        return v, row[metric + "_min"], row.get(metric + "_max")
    return v, None, None


def metric_of_runs(rows, metric):
    """metric_of one row; of several runs of a row in one file, the median of
    their medians with the [min, max] of those medians."""
    if len(rows) == 1:
        return metric_of(rows[0], metric)
    meds = [m for m in (metric_of(d, metric)[0] for d in rows) if m is not None]
    if len(meds) < len(rows):
        return None, None, None
    return statistics.median(meds), min(meds), max(meds)


def row_text(sel):
    return " ".join("%s=%s" % (k, json.dumps(v) if not isinstance(v, str) else v)
                    for k, v in sel.items())


def check(goals_path, paths, require_all=False):
    """Prints failing and missing goal rows, then the table; returns the exit
    status (0 met, 1 below goal or missing)."""
    goals = load_goals(goals_path)
    files = [(p, load_strict(p)) for p in paths]
    benches = {d.get("bench") for _, rows in files for d in rows}
    table, failed, unchecked = [], 0, []
    for g in goals:
        if g["bench"] not in benches and not require_all:
            unchecked.append(g["name"])
            continue
        for sel in goal_rows(g):
            found = [(p, d) for p, rows in files for d in rows
                     if d.get("bench") == g["bench"] and
                     all(k in d and d[k] == v for k, v in sel.items())]
            if not found:
                print("MISSING bench=%s row=%s (goal: %s)" % (g["bench"], row_text(sel), g["name"]))
                failed += 1
                table.append((g, sel, None, None, None, "MISSING", ""))
                continue
            by_file = {}
            for path, d in found:
                by_file.setdefault(path, []).append(d)
            for path, rows in by_file.items():
                med, lo, hi = metric_of_runs(rows, g["metric"])
                if med is None:
                    status = "NO METRIC"
                elif med >= g["min"]:
                    status = "ok"
                else:
                    status = "WAIVED" if g.get("waived") else "FAIL"
                if status in ("FAIL", "NO METRIC"):
                    failed += 1
                    print("FAIL bench=%s row=%s %s=%s < goal %.2f (%s)" % (
                        g["bench"], row_text(sel), g["metric"],
                        "missing" if med is None else "%.3f" % med, g["min"],
                        os.path.basename(path)))
                table.append((g, sel, med, lo, hi, status, path))
    print("\n| status | bench | row | metric | median | [min, max] | goal | file |")
    print("|---|---|---|---|---|---|---|---|")
    for g, sel, med, lo, hi, status, path in table:
        rng = "[%.2f, %.2f]" % (lo, hi) if lo is not None and hi is not None else "-"
        print("| %s | %s | %s | %s | %s | %s | >= %.2f | %s |" % (
            status, g["bench"], row_text(sel), g["metric"],
            "-" if med is None else "%.3f" % med, rng, g["min"], path))
    for g in goals:
        if g.get("waived") and g["name"] not in unchecked:
            print("\nwaived: %s: %s" % (g["name"], g["waived"]))
    if unchecked:
        print("\nnot checked (no rows of their benchmark in these files): " +
              "; ".join(unchecked))
    print("\n%d goal row(s) below goal or missing" % failed)
    return 1 if failed else 0


def main():
    if len(sys.argv) >= 2 and sys.argv[1] == "--check":
        ap = argparse.ArgumentParser(prog="summarize.py --check")
        ap.add_argument("--goals", default=os.path.join(os.path.dirname(
            os.path.abspath(__file__)), "goals.json"))
        ap.add_argument("--all", action="store_true",
                        help="a goal of a benchmark absent from FILES is MISSING")
        ap.add_argument("files", nargs="+")
        a = ap.parse_args(sys.argv[2:])
        try:
            sys.exit(check(a.goals, a.files, a.all))
        except (InputError, OSError) as e:
            print("summarize.py --check: %s" % e, file=sys.stderr)
            sys.exit(2)
    if len(sys.argv) == 4 and sys.argv[1] == "--compare":
        compare(sys.argv[2], sys.argv[3])
        return
    for path in sys.argv[1:]:
        rows = []
        for line in open(path):
            line = line.strip()
            if line.startswith("{"):
                rows.append(json.loads(line))
        if not rows:
            continue
        print("\n#### %s\n" % path)
        kind = rows[0].get("bench")
        {"transport": transport, "apply": apply, "codec": codecs}.get(kind, generic)(rows)


if __name__ == "__main__":
    main()
