#!/usr/bin/env python3
"""CI test of experiments/: both studies on a tiny budget (--quick, a few
steps, a subset of runs, the shaped link when root can create a network
namespace), then experiments/report.py. Checks that the summary tables, the
plots (PNG + .gp) and REPORT.md are produced and every number is finite.

Exit 77 (skipped) when the binaries or gnuplot are missing.
Environment: ASYNCPS_BIN_DIR (default <repo>/build/bin).
"""
import csv
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
EXP = os.path.join(REPO, "experiments")
BIN = os.environ.get("ASYNCPS_BIN_DIR", os.path.join(REPO, "build", "bin"))
MAX_STEPS = "30"

# Columns that may be empty: the tiny budget never reaches 0.85, and bytes
# per epoch is only defined for whole epochs.
MAY_BE_EMPTY = {"time_to_target_s", "bytes_pushed_per_epoch",
                "encode_ms_per_step", "min_push_reduction", "bytes_ok",
                "push_reduction"}


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
        for k, v in r.items():
            if v == "" or v is None:
                if k not in MAY_BE_EMPTY:
                    fail("%s: run %s: %s is empty" % (path, r.get("run"), k))
                continue
            try:
                x = float(v)
            except ValueError:
                continue
            if not math.isfinite(x) and k != "staleness_bound":  # ASP: inf
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
    t0 = time.time()
    p = subprocess.Popen([sys.executable] + cmd, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
        # Killed, it could not delete its shaped-link namespace: do it here.
        subprocess.run(["ip", "netns", "del", "asyncps_slow_%d" % p.pid],
                       stderr=subprocess.DEVNULL, check=False)
        print(out[-3000:], err[-3000:])
        fail("%s timed out after %ds" % (" ".join(cmd), timeout))
    r = subprocess.CompletedProcess(p.args, p.returncode, out, err)
    print("%s: rc %d in %.1fs" % (os.path.basename(os.path.dirname(cmd[0])) or
                                  cmd[0], r.returncode, time.time() - t0))
    if r.returncode != 0:
        print(r.stdout[-3000:], r.stderr[-3000:])
        fail(" ".join(cmd) + " failed")
    return r


def main():
    for b in ("ps_server", "ps_worker", "ps_ctl"):
        if not os.access(os.path.join(BIN, b), os.X_OK):
            print("skip: %s not built in %s" % (b, BIN))
            return 77
    if shutil.which("gnuplot") is None:
        print("skip: gnuplot not installed")
        return 77
    tmp = tempfile.mkdtemp(prefix="asyncps_exp_test_")
    try:
        sync = os.path.join(tmp, "sync_vs_async")
        comp = os.path.join(tmp, "compression_study")
        run([os.path.join(EXP, "sync_vs_async", "run.py"), "--quick",
             "--bin_dir", BIN, "--out", sync, "--max_steps", MAX_STEPS,
             "--eval_every", "10", "--only", "bsp,ssp4,asp_straggler"], 150)
        run([os.path.join(EXP, "compression_study", "run.py"), "--quick",
             "--bin_dir", BIN, "--out", comp, "--max_steps", MAX_STEPS,
             "--eval_every", "10", "--only",
             "none,topk1_ef,sign,none_slow"], 150)
        run([os.path.join(EXP, "report.py"), "--results", tmp], 30)

        rows = check_csv(os.path.join(sync, "summary.csv"), 3)
        check_csv(os.path.join(sync, "curves.csv"), 3)
        for r in rows:
            if r["status"] != "ok":
                fail("sync run %s: %s" % (r["run"], r["status"]))
        for name in ("acc_vs_time", "acc_vs_time_straggler", "acc_vs_updates",
                     "acc_vs_updates_straggler", "idle_vs_staleness"):
            check_png(os.path.join(sync, name + ".png"))
        rows = check_csv(os.path.join(comp, "summary.csv"), 3)
        check_csv(os.path.join(comp, "targets.csv"), 1)
        by = {r["run"]: r for r in rows}
        if float(by["topk1_ef"]["wire_ratio"]) < 20:
            fail("top-k 1%% wire ratio %s" % by["topk1_ef"]["wire_ratio"])
        for name in ("acc_vs_bytes", "acc_vs_time"):
            check_png(os.path.join(comp, name + ".png"))
        if "none_slow" in by:
            check_png(os.path.join(comp, "acc_vs_time_slow.png"))
        report = open(os.path.join(tmp, "REPORT.md")).read()
        for needle in ("Cui et al.", "Li et al.", "Stich et al.",
                       "Karimireddy et al.", "Agarwal et al.", "| bsp |"):
            if needle not in report:
                fail("REPORT.md lacks " + repr(needle))
        if "nan" in report.lower().split() or " inf " in report:
            fail("REPORT.md has a non-finite number")
        # The study deletes the namespace it created (named after its PID).
        ns = subprocess.run(["ip", "netns", "list"], capture_output=True,
                            text=True).stdout
        for name in ns.split():
            if name.startswith("asyncps_slow_"):
                pid = name.rsplit("_", 1)[-1]
                if pid.isdigit() and not os.path.exists("/proc/" + pid):
                    fail("namespace %s left behind" % name)
        print("PASS")
        return 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
