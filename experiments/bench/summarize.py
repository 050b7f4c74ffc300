#!/usr/bin/env python3
"""Markdown tables of benchmark JSON lines (experiments/bench/*).

  experiments/bench/summarize.py experiments/results/perf/quiet/*.jsonl
  experiments/bench/summarize.py --compare OLD.jsonl NEW.jsonl

Every benchmark prints one JSON object per line; this prints, per file, one
table with the figures a report quotes: the median, the same-run baseline, the
ratio and its spread (min-max of the per-repeat ratios). For the transport it
also gives the ratio to the two-process raw ZeroMQ baseline (raw_2proc, the
topology of a worker and a ps_server), which the benchmark prints beside the
one-process one.
"""
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


def main():
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
