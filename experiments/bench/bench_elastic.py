#!/usr/bin/env python3
"""How long an elastic change pauses training (issue 21 item 4: the longest
pause of any worker <= 1 s per change). psrun --elastic '+1@3s,-#0@6s' trains
the MLP (ps_worker, Fashion-MNIST, BSP, 2 workers) on 2 shards, adds a third
while the workers train, then removes shard 0: 2 -> 3 -> 2, the same run as
tests/launch/elastic_test.py. Each repeat also runs the same training with
fixed membership (same seeds), the same-run baseline: its longest gap between
acknowledged pushes is what an undisturbed run pauses anyway.

Per change (add, remove), one JSON line: the longest pause of any worker
around the change (the gap between consecutive acknowledged pushes in the
workers' --push_log that overlaps the change, from its start to 1 s after its
end) as median, min and max over the repeats; how long the shards were frozen
and drained; the fixed runs' longest gap; pause_goal_ratio = 1 s / pause
(>= 1 when the goal is met; its min is the worst repeat's), checked by
summarize.py --check against goals.json. A last line says whether every
repeat's final weights were bitwise equal to its fixed twin's.

  experiments/bench/bench_elastic.py --repeats 7
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))
PSRUN = os.path.join(REPO, "launch", "psrun")
sys.path.insert(0, os.path.join(REPO, "launch"))  # pslaunch (expkit/__init__.py)
from pslaunch.elastic import acked_times, longest_gap  # noqa: E402
import bench_stats  # noqa: E402

SERVER = ("--consistency=bsp --optimizer=momentum --lr=0.05 --worker_timeout_s=10 "
          "--checkpoint_every_s=0")
WORKER = ["--layers=784,64,10", "--batch=32", "--epochs=0", "--log_every=500",
          "--threads=1", "--timeout_s=30", "--seed=11", "--eval=false"]
PLAN = "+1@3s,-#0@6s"
GOAL_S = 1.0


def psrun(bin_dir, run_dir, plan, steps):
    argv = [sys.executable, PSRUN, "--servers", "2", "--workers", "2", "--run_dir", run_dir,
            "--bin_dir", bin_dir, "--grace", "3", "--start_timeout", "20", "--progress", "off",
            "--quiet", "--server_flags", SERVER]
    if plan:
        argv += ["--elastic", plan]
    argv += ["--"] + WORKER + [
        "--max_steps=%d" % steps,
        "--weights_out=" + os.path.join(run_dir, "weights-{rank}.bin"),
        "--push_log=" + os.path.join(run_dir, "push-{rank}.log")]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        sys.exit("psrun failed (%s):\n%s\n%s" % (run_dir, r.stdout[-3000:], r.stderr[-3000:]))


def weights(run_dir):
    with open(os.path.join(run_dir, "weights-0.bin"), "rb") as f:
        return f.read()


def spread(v):
    return bench_stats.spread(v, count="n")


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin_dir", default=os.path.join(REPO, "build", "bin"))
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--quick", action="store_true", help="1 repeat")
    a = ap.parse_args()
    if a.quick:
        a.repeats = 1
    if a.repeats < 1 or a.steps < 1:
        sys.exit("--repeats and --steps must be >= 1")
    for b in ("ps_server", "ps_worker", "ps_ctl"):
        if not os.access(os.path.join(a.bin_dir, b), os.X_OK):
            sys.exit("%s not built in %s" % (b, a.bin_dir))
    if not os.access("/usr/bin/etcd", os.X_OK):
        print("etcd not installed (etcd-server): nothing measured", file=sys.stderr)
        sys.exit(77)
    per = {"add": {"pause": [], "frozen": [], "drain": [], "moved": []},
           "remove": {"pause": [], "frozen": [], "drain": [], "moved": []}}
    fixed_gaps, equal = [], []
    with tempfile.TemporaryDirectory(prefix="bench-elastic-") as work:
        for i in range(a.repeats):
            el, fx = os.path.join(work, "elastic-%d" % i), os.path.join(work, "fixed-%d" % i)
            psrun(a.bin_dir, el, PLAN, a.steps)
            psrun(a.bin_dir, fx, None, a.steps)
            with open(os.path.join(el, "elastic.json")) as f:
                steps = json.load(f)["steps"]
            if [s.get("ok") for s in steps] != [True, True]:
                sys.exit("a change failed: %s" % json.dumps(steps))
            acked = [acked_times(os.path.join(el, "push-%d.log" % r)) for r in (0, 1)]
            for name, s in zip(("add", "remove"), steps):
                per[name]["pause"].append(max(longest_gap(t, s["t0"], s["t1"] + 1.0)[0]
                                              for t in acked))
                per[name]["frozen"].append(s["report"]["frozen_ms"])
                per[name]["drain"].append(s["report"].get("drain_ms", 0))
                per[name]["moved"].append(s["report"]["moved_chunks"])
            fixed_gaps.append(max(longest_gap(acked_times(os.path.join(fx, "push-%d.log" % r)))[0]
                                  for r in (0, 1)))
            equal.append(weights(el) == weights(fx))
    for name, d in per.items():
        ratios = [GOAL_S / max(p, 1e-6) for p in d["pause"]]
        print(json.dumps({
            "bench": "elastic", "change": name, "plan": PLAN, "steps": a.steps,
            "repeats": a.repeats, "pause_s": spread(d["pause"]),
            "frozen_ms": spread(d["frozen"]), "drain_ms": spread(d["drain"]),
            "moved_chunks": spread(d["moved"]), "baseline": "fixed_longest_gap_s",
            "baseline_s": spread(fixed_gaps), "goal_s": GOAL_S,
            "pause_goal_ratio": spread(ratios)}))
    print(json.dumps({"bench": "elastic", "change": "all", "repeats": a.repeats,
                      "weights_bitwise_equal_to_fixed": sum(equal),
                      "of": len(equal)}))
    return 0 if all(equal) else 1


if __name__ == "__main__":
    sys.exit(main())
