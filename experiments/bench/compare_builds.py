#!/usr/bin/env python3
"""Two builds of asyncps side by side: the same benchmarks, interleaved.

For a change that must not move performance (a refactor), runs the
benchmarks of an old and a new build in the same session, alternating
which goes first in each repeat so that a burst of load hits both:
  - ps_bench_transport (push and pull, transport_only and sgd; ratio to a raw
    ZeroMQ DEALER/ROUTER pair measured in the same process),
  - ps_bench_apply (optimizer apply; ratio to memcpy of the same bytes),
  - experiments/bench/bench_worker.py (this tree's script over each build's
    ps_worker, ps_server and ps_train_local; ratio to ps_train_local).
Each build's binaries come from its own bin folder (--old_bin, --new_bin).

Prints one JSON object per line: every measured row, tagged with "build"
and "repeat", then one "compare_builds" row per (benchmark, configuration,
metric): old and new medians with min and max over the repeats,
new_over_old (ratio of the medians) and within_noise (the new median lies
inside the old runs' [min, max], or the old median inside the new runs').

  experiments/bench/compare_builds.py --old_bin OLD/build/bin --new_bin build/bin
      [--repeats 5] [--quick] [--only transport,apply,worker]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

# Fields that name a configuration (everything else is a measurement).
KEYS = {
    "transport": ("op", "mode", "bytes", "inflight"),
    "apply": ("level", "optimizer", "elems", "apply_threads"),
    "worker": ("config", "prefetch_ahead"),
}
METRICS = {
    "transport": ("mb_per_s", "ratio"),
    "apply": ("gbps", "ratio"),
    "worker": ("samples_per_s", "ratio"),
}


def json_lines(text):
    rows = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    return rows


def run(cmd, timeout):
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        sys.stderr.write(f"compare_builds: {' '.join(cmd)} exited {r.returncode}\n"
                         f"{r.stderr[-2000:]}\n")
        return []
    return json_lines(r.stdout)


def bench_transport(bin_dir, quick):
    return run([os.path.join(bin_dir, "ps_bench_transport"),
                "--sizes=1048576,16777216", "--inflight=1,8", "--modes=transport_only,sgd",
                "--repeats=1", "--seconds=%s" % ("0.3" if quick else "0.7")], 600)


def bench_apply(bin_dir, quick):
    return run([os.path.join(bin_dir, "ps_bench_apply"), "--repeats=1",
                "--sizes=262144,4194304", "--apply_threads_list=",
                "--min_seconds=%s" % ("0.05" if quick else "0.2")], 600)


def bench_worker(bin_dir, quick):
    rows = run([sys.executable, os.path.join(HERE, "bench_worker.py"), "--bin_dir", bin_dir,
                "--repeats=1", "--no_torch", "--no_profile", "--epochs=1"], 1800)
    # Its rows only (its ratios are to the ps_train_local of the same build).
    return [r for r in rows if r.get("bench") == "worker"]


BENCHES = {"transport": bench_transport, "apply": bench_apply, "worker": bench_worker}


def spread(v):
    return {"median": round(statistics.median(v), 4), "min": round(min(v), 4),
            "max": round(max(v), 4), "n": len(v)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old_bin", required=True)
    ap.add_argument("--new_bin", required=True)
    ap.add_argument("--old_label", default="old")
    ap.add_argument("--new_label", default="new")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", default="transport,apply,worker")
    a = ap.parse_args()
    names = [n for n in a.only.split(",") if n]
    for n in names:
        if n not in BENCHES:
            ap.error(f"--only: unknown benchmark {n!r} (transport, apply, worker)")
    builds = {"old": os.path.abspath(a.old_bin), "new": os.path.abspath(a.new_bin)}
    for label, d in builds.items():
        if not os.path.isdir(d):
            ap.error(f"--{label}_bin {d}: no such folder")
    measured = {}  # (bench, key) -> build -> metric -> [values]
    for rep in range(a.repeats):
        order = ("old", "new") if rep % 2 == 0 else ("new", "old")
        for name in names:
            for build in order:
                for row in BENCHES[name](builds[build], a.quick):
                    if row.get("bench") != name:
                        continue
                    row.update({"build": a.old_label if build == "old" else a.new_label,
                                "repeat": rep})
                    print(json.dumps(row), flush=True)
                    key = (name,) + tuple(row.get(k) for k in KEYS[name])
                    for m in METRICS[name]:
                        if isinstance(row.get(m), (int, float)):
                            measured.setdefault(key, {}).setdefault(build, {}).setdefault(
                                m, []).append(float(row[m]))
    for key, by_build in measured.items():
        name = key[0]
        if "old" not in by_build or "new" not in by_build:
            continue
        for m in METRICS[name]:
            old, new = by_build["old"].get(m), by_build["new"].get(m)
            if not old or not new:
                continue
            so, sn = spread(old), spread(new)
            out = {"bench": "compare_builds", "of": name}
            out.update(dict(zip(KEYS[name], key[1:])))
            out.update({"metric": m, a.old_label: so, a.new_label: sn,
                        "new_over_old": round(sn["median"] / so["median"], 4) if so["median"] else None,
                        "within_noise": so["min"] <= sn["median"] <= so["max"]
                        or sn["min"] <= so["median"] <= sn["max"]})
            print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
