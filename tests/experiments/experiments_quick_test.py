#!/usr/bin/env python3
"""CI test of experiments/: the studies on a tiny budget (--quick, a few
steps, a subset of runs, three seeds each, the shaped link when root can
create a network namespace), the simulator (--quick) on the sync study's
traces, then experiments/report.py. Checks that the per-seed and summary
tables, the plots (PNG + .gp) and REPORT.md are produced, every number is
finite, and the summaries hold the seeds' mean and interval.

One part per ctest test, so that ctest -j runs them beside each other and
beside the other tests (experiments/CMakeLists.txt):

  experiments_quick_test.py STUDY --out DIR   # sync_vs_async, compression_study
                                              # or staleness_study: runs it into
                                              # DIR/STUDY (emptied first), checks it
  experiments_quick_test.py report --out DIR  # copies the three studies from DIR
                                              # into a temp dir, runs the simulator
                                              # and report.py there, checks them

Exit 77 (skipped) when the binaries or gnuplot are missing.
Environment: ASYNCPS_BIN_DIR (default <repo>/build/bin).
"""
import argparse
import csv
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
EXP = os.path.join(REPO, "experiments")
BIN = os.environ.get("ASYNCPS_BIN_DIR", os.path.join(REPO, "build", "bin"))
MAX_STEPS = "30"

SEEDS = "1,2,3"
# Columns that may be empty: the tiny budget never reaches 0.85, bytes per
# epoch is only defined for whole epochs, intervals need two values, a run
# that did not diverge has no divergence step, ...
MAY_BE_EMPTY = {"time_to_target_s", "bytes_pushed_per_epoch",
                "encode_ms_per_step", "min_push_reduction", "bytes_ok",
                "push_reduction", "diverged_step", "dc_compensated",
                "dc_uncompensated", "staleness_p50_measured"}


def may_be_empty(k):
    return k in MAY_BE_EMPTY or k.endswith("_ci") or \
        k.startswith("time_to_target_s")


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def check_csv(path, min_rows):
    if not os.path.exists(path):
        fail("missing " + path)
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if len(rows) < min_rows:
        fail("%s: %d rows, want >= %d" % (path, len(rows), min_rows))
    for r in rows:
        # A run that diverged (an outcome the staleness study counts, and
        # how soon depends on the workers' timing) has no accuracy to give.
        diverged = r.get("status") == "diverged"
        for k, v in r.items():
            if v == "" or v is None:
                if not diverged and not may_be_empty(k):
                    fail("%s: run %s: %s is empty" % (path, r.get("run"), k))
                continue
            try:
                x = float(v)
            except ValueError:
                continue
            # ASP's staleness bound is written as inf (a label, not a figure).
            if not math.isfinite(x) and k not in ("staleness_bound", "bound"):
                fail("%s: run %s: %s = %s" % (path, r.get("run"), k, v))
    return rows


def check_png(path):
    if not os.path.exists(path) or os.path.getsize(path) < 1000:
        fail("missing or empty plot " + path)
    with open(path, "rb") as f:
        if f.read(8) != b"\x89PNG\r\n\x1a\n":
            fail(path + " is not a PNG")
    if not os.path.exists(os.path.splitext(path)[0] + ".gp"):
        fail("no gnuplot script next to " + path)


def run(cmd, timeout):
    """Runs one study; timeout only guards against a hang (a stage takes
    ~30-60 s on 2 quiet cores and over 100 s at a load average of 15, so
    the guards are several times that), never a performance target."""
    t0 = time.time()
    # Its own process group: a stage that runs out of time is killed with
    # the servers and workers it started (they would outlive it otherwise).
    p = subprocess.Popen([sys.executable] + cmd, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        # Killed, it could not delete its shaped-link namespace: do it here.
        subprocess.run(["ip", "netns", "del", "asyncps_slow_%d" % p.pid],
                       stderr=subprocess.DEVNULL, check=False)
        print(out[-3000:], err[-3000:])
        fail("%s: no result after %d s (hung?)" % (" ".join(cmd), timeout))
    r = subprocess.CompletedProcess(p.args, p.returncode, out, err)
    print("%s: rc %d in %.1fs" % (os.path.basename(os.path.dirname(cmd[0])) or
                                  cmd[0], r.returncode, time.time() - t0))
    if r.returncode != 0:
        print(r.stdout[-3000:], r.stderr[-3000:])
        fail(" ".join(cmd) + " failed")
    return r


def run_study(study, out, max_steps, eval_every, only):
    """experiments/STUDY/run.py --quick into `out`: the runs in `only`, each
    with the three seeds."""
    run([os.path.join(EXP, study, "run.py"), "--quick", "--bin_dir", BIN,
         "--out", out, "--max_steps", max_steps, "--eval_every", eval_every,
         "--only", only, "--seeds", SEEDS], 300)


def run_sync(out):
    run_study("sync_vs_async", out, MAX_STEPS, "10", "bsp,asp")
    rows = check_csv(os.path.join(out, "runs.csv"), 6)
    for r in rows:
        if r["status"] != "ok":
            fail("sync run %s seed %s: %s" % (r["run"], r["seed"], r["status"]))
    summary = check_csv(os.path.join(out, "summary.csv"), 2)
    check_aggregate(rows, summary, "idle_frac")
    check_csv(os.path.join(out, "curves.csv"), 6)
    for name in ("acc_vs_time", "acc_vs_time_straggler", "acc_vs_updates",
                 "acc_vs_updates_straggler", "idle_vs_staleness"):
        check_png(os.path.join(out, name + ".png"))


def run_compression(out):
    run_study("compression_study", out, "20", "10", "none,topk1_ef,none_slow")
    rows = check_csv(os.path.join(out, "runs.csv"), 6)
    summary = check_csv(os.path.join(out, "summary.csv"), 2)
    check_aggregate(rows, summary, "final_eval_acc")
    check_csv(os.path.join(out, "targets.csv"), 1)
    by = {r["run"]: r for r in summary}
    if float(by["topk1_ef"]["wire_ratio"]) < 20:
        fail("top-k 1%% wire ratio %s" % by["topk1_ef"]["wire_ratio"])
    for name in ("acc_vs_bytes", "acc_vs_time"):
        check_png(os.path.join(out, name + ".png"))
    if "none_slow" in by:
        check_png(os.path.join(out, "acc_vs_time_slow.png"))


def run_staleness(out):
    run_study("staleness_study", out, "15", "5", "asp8_dc_a,bsp8_scaled_warmup")
    rows = check_csv(os.path.join(out, "runs.csv"), 6)
    if any(r["status"] not in ("ok", "diverged") for r in rows):
        fail("staleness study: a run failed")
    dc = [r for r in rows if r["run"] == "asp8_dc_a" and r["status"] == "ok"]
    if not dc or not all(int(float(r["dc_compensated"])) > 0 for r in dc):
        fail("DC-ASGD runs compensated no push")
    check_png(os.path.join(out, "acc_vs_samples_dc.png"))


STUDIES = {"sync_vs_async": run_sync, "compression_study": run_compression,
           "staleness_study": run_staleness}


def run_report(studies):
    """The simulator on the sync and compression studies' results and
    report.py over all three, in a temp dir of their own (the studies'
    folders in `studies` are copied, never written)."""
    tmp = tempfile.mkdtemp(prefix="asyncps_exp_test_")
    try:
        for study in STUDIES:
            src = os.path.join(studies, study)
            if not os.path.exists(os.path.join(src, "runs.csv")):
                fail("no %s results in %s (its ctest test runs first)" % (study, src))
            shutil.copytree(src, os.path.join(tmp, study))
        sim = os.path.join(tmp, "sim")
        run([os.path.join(EXP, "sim", "run.py"), "--quick",
             "--runs", os.path.join(tmp, "sync_vs_async"),
             "--compression", os.path.join(tmp, "compression_study"),
             "--out", sim], 240)
        run([os.path.join(EXP, "report.py"), "--results", tmp], 120)
        check_csv(os.path.join(sim, "validation.csv"), 6)
        check_csv(os.path.join(sim, "idle_vs_bound.csv"), 7)
        for name in ("validation_idle", "sim_idle_vs_bound",
                     "sim_throughput_vs_workers", "sim_compression_vs_link"):
            check_png(os.path.join(sim, name + ".png"))
        report = open(os.path.join(tmp, "REPORT.md")).read()
        for needle in ("Cui et al.", "Li et al.", "Stich et al.",
                       "Karimireddy et al.", "Agarwal et al.", "Zheng et al.",
                       "Goyal et al.", "| bsp |", "SIMULATED",
                       "within bound"):
            if needle not in report:
                fail("REPORT.md lacks " + repr(needle))
        if "nan" in report.lower().split() or " inf " in report:
            fail("REPORT.md has a non-finite number")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def check_no_namespace_left():
    """A study deletes the namespace it created (named after its PID)."""
    ns = subprocess.run(["ip", "netns", "list"], capture_output=True,
                        text=True).stdout
    for name in ns.split():
        if name.startswith("asyncps_slow_"):
            pid = name.rsplit("_", 1)[-1]
            if pid.isdigit() and not os.path.exists("/proc/" + pid):
                fail("namespace %s left behind" % name)


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("part", choices=sorted(STUDIES) + ["report"])
    parser.add_argument("--out", required=True,
                        help="folder of the studies' results (DIR/STUDY)")
    args = parser.parse_args(argv)
    out = os.path.join(args.out, args.part)
    if args.part in STUDIES:
        # Emptied first, skipped or not: the report never reads a result that
        # this run of the study did not produce.
        shutil.rmtree(out, ignore_errors=True)
    for b in ("ps_server", "ps_worker", "ps_ctl"):
        if not os.access(os.path.join(BIN, b), os.X_OK):
            print("SKIP: %s not built in %s" % (b, BIN))
            return 77
    if shutil.which("gnuplot") is None:
        print("SKIP: gnuplot not installed")
        return 77
    if args.part == "report":
        run_report(args.out)
    else:
        STUDIES[args.part](out)
        check_no_namespace_left()
    print("PASS")
    return 0


def check_aggregate(rows, summary, key):
    """summary.csv's mean of `key` is the mean of the seeds' values."""
    for srow in summary:
        vals = [float(r[key]) for r in rows
                if r["run"] == srow["run"] and r.get(key) not in ("", None)]
        if not vals:
            continue
        if abs(float(srow[key]) - sum(vals) / len(vals)) > 1e-3:
            fail("%s: summary %s = %s, seeds' mean %s" % (
                srow["run"], key, srow[key], sum(vals) / len(vals)))
        if len(vals) >= 2 and srow.get(key + "_ci") in ("", None):
            fail("%s: no interval for %s" % (srow["run"], key))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
