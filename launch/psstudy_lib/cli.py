"""psstudy's command line: load the study, run what is not finished, report.

  psstudy STUDY.json [--out DIR] [--bin_dir DIR] [--retry_failed] [--dry_run]
                     [--report_only]

Exit status: 0 every run ended (ok or failed: failed runs are in the report);
2 a bad study file or missing tools (the message names the key); 128+n when
stopped by signal n (finished runs are kept: the same command resumes).
"""
import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
import time

from pslaunch.binaries import default_bin_dir  # psrun's: the same binaries

from . import collect, execute, grid, report


def make_parser():
    p = argparse.ArgumentParser(
        prog="psstudy", description="Run a grid of asyncps trainings through psrun (every "
        "configuration x seed, resumable) and write runs.csv, curves, plots and REPORT.md "
        "with 95%% intervals and verdicts. Study file format: launch/psstudy_lib/grid.py "
        "and launch/README.md.")
    p.add_argument("study", help="the study file (JSON; # comment lines)")
    p.add_argument("--out", help="results folder (default: study-<name> in the current "
                                 "directory)")
    p.add_argument("--bin_dir", help="ps_server/ps_worker/ps_ctl (default $ASYNCPS_BIN_DIR or "
                                     "<repo>/build/bin)")
    p.add_argument("--retry_failed", action="store_true",
                   help="run failed runs again (default: a failed run is finished too)")
    p.add_argument("--dry_run", action="store_true",
                   help="print each run's psrun command line and exit")
    p.add_argument("--report_only", action="store_true",
                   help="rewrite the report from the runs on disk; run nothing")
    return p


def _hms(s):
    s = int(round(s))
    return "%dh%02dm%02ds" % (s // 3600, s // 60 % 60, s % 60) if s >= 3600 else \
        "%dm%02ds" % (s // 60, s % 60)


def check_hosts(study, psrun_help):
    """GridError when the study needs --emulate_hosts and this psrun or
    machine cannot give it."""
    if not study.uses_hosts():
        return
    key = "grid key 'hosts'" if "hosts" in study.grid else "key 'hosts'"
    if "--emulate_hosts" not in psrun_help:
        raise grid.GridError("%s (and link/latency): this psrun has no --emulate_hosts "
                             "(launch/pslaunch/netns.py); use hosts=0 (loopback)" % key)
    try:
        from pslaunch import netns
    except ImportError as e:
        raise grid.GridError("%s: cannot load psrun's netns module: %s" % (key, e))
    why = netns.missing_tools()
    if why:
        raise grid.GridError("%s: emulated hosts unavailable here: %s" % (key, why))


def runs_of(study):
    return [(c, seed) for c in study.configs for seed in study.seeds]


def main(argv=None):
    """psstudy; argv: its arguments (default sys.argv[1:], the console script)."""
    args = make_parser().parse_args(sys.argv[1:] if argv is None else argv)
    t0 = time.time()
    try:
        study = grid.load(args.study)
        help_text = subprocess.run(execute.psrun_command() + ["--help"],
                                   capture_output=True, text=True).stdout
        check_hosts(study, help_text)
    except grid.GridError as e:
        sys.stderr.write("psstudy: %s\n" % e)
        return 2
    bin_dir = os.path.abspath(args.bin_dir or default_bin_dir())
    out = os.path.abspath(args.out or "study-" + study.name)
    if "," in out:
        sys.stderr.write("psstudy: --out %s contains a comma (psrun refuses run folders with "
                         "commas)\n" % out)
        return 2
    todo = runs_of(study)
    if args.dry_run:
        for c, seed in todo:
            print(" ".join(shlex.quote(a) for a in execute.psrun_argv(
                c, seed, execute.run_dir(out, c, seed), bin_dir)))
        return 0
    os.makedirs(out, exist_ok=True)
    copy = os.path.join(out, "study.json")
    if not (os.path.exists(copy) and os.path.samefile(args.study, copy)):
        shutil.copyfile(args.study, copy)  # the study as run (re-runnable from OUT)
    log = lambda msg: print("[psstudy %s] %s" % (time.strftime("%H:%M:%S"), msg), flush=True)
    results, pending = [], []
    for c, seed in todo:
        rdir = execute.run_dir(out, c, seed)
        r = execute.load_result(rdir, c.settings(seed))
        if r is not None and (r["status"] == "ok" or not args.retry_failed or
                              args.report_only):
            results.append((c, seed, r))
        elif not args.report_only:
            pending.append((c, seed))
    log("%s: %d configurations x %d seeds = %d runs; %d finished on disk (skipped), %d to run; "
        "results in %s" % (study.name, len(study.configs), len(study.seeds), len(todo),
                           len(results), len(pending), out))
    done_walls = []
    code = 0
    try:
        for i, (c, seed) in enumerate(pending):
            left = ""
            if done_walls:
                per = sum(done_walls) / len(done_walls)
                left = ", ~%s left (%.0f s per run)" % (_hms(per * (len(pending) - i)), per)
            log("run %d/%d (%d of %d in the study): %s, seed %d%s" % (
                i + 1, len(pending), len(results) + 1, len(todo), c.describe(
                    study.varying or list(grid.GRID_KEYS[:1])), seed, left))
            start = time.time()
            results.append((c, seed, run_one(study, c, seed, out, bin_dir, log)))
            done_walls.append(time.time() - start)
            r = results[-1][2]
            log("  %s in %.1f s%s; elapsed %s" % (
                r["status"], done_walls[-1], "" if r["status"] == "ok" else ": " + r["error"],
                _hms(time.time() - t0)))
    except execute.Interrupted as e:
        log("stopped by signal %d: the run in progress was torn down; finished runs are kept "
            "(the same command resumes)" % e.signum)
        code = 128 + e.signum
    order = {(c.slug(), s): i for i, (c, s) in enumerate(todo)}
    results.sort(key=lambda t: order[(t[0].slug(), t[1])])
    res = report.Results(study, results)
    curves = []
    for c, seed, r in results:
        for row in r.get("curves") or []:
            curves.append(dict(row, config=c.slug(), seed=seed))
    history = os.path.join(out, "history.txt")
    with open(history, "a") as f:
        f.write("%s  psstudy %s: %d runs run in %.1f s, %d finished before%s\n" % (
            time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t0)),
            " ".join(shlex.quote(a) for a in argv), len(done_walls), time.time() - t0,
            len(results) - len(done_walls), " (stopped)" if code else ""))
    run_wall = sum(r.get("wall_s_total") or 0 for _, _, r in results)
    try:
        with open(history) as f:
            invocations = [l.rstrip("\n") for l in f if l.strip()]
    except OSError:
        invocations = []
    ran = [re.search(r": (\d+) runs run in ([0-9.]+) s", l) for l in invocations]
    spent = sum(float(m.group(2)) for m in ran if m and int(m.group(1)))
    header = ["Study file: `%s` (copied to study.json). Command (runs, or resumes, the whole "
              "study): `launch/psstudy %s --out %s`. Wall time of the invocations that ran "
              "runs: %s (history below)." % (
                  args.study, shlex.quote(args.study),
                  shlex.quote(os.path.relpath(out) if not os.path.relpath(out).startswith("..")
                              else out), _hms(spent)),
              "",
              "%d configurations x %d seeds (%s) = %d runs: %d ok, %d failed%s. Runs' own wall "
              "time (psrun start to end, all invocations): %s; this invocation: %s (%d runs "
              "run, %d finished before)." % (
                  len(study.configs), len(study.seeds), ", ".join(map(str, study.seeds)),
                  len(todo), sum(1 for _, _, r in results if r["status"] == "ok"),
                  sum(1 for _, _, r in results if r["status"] != "ok"),
                  "" if len(results) == len(todo) else ", %d not run yet" % (
                      len(todo) - len(results)), _hms(run_wall), _hms(time.time() - t0),
                  len(done_walls), len(results) - len(done_walls)),
              "",
              "Worker: `%s`; fixed settings: %s." % (
                  study.top.get("worker_cmd") or "ps_worker (built in)",
                  "; ".join("%s=%s" % (k, v) for k, v in study.configs[0].values.items()
                            if k not in study.grid and v not in ("", 0, "none")) or "none"),
              "",
              "Grid: %s." % ("; ".join("%s in {%s}" % (k, ", ".join(map(str, v)))
                                       for k, v in study.grid.items()) or "(none)"),
              "", "Invocations (history.txt):", ""] + ["    " + l for l in invocations]
    if study.notes:
        header += ["", "Notes:", ""] + ["- " + n for n in study.notes]
    if code == 0:
        report.write(out, res, curves, header)
        log("wrote %s (%d runs, %d failed) in %s" % (
            os.path.join(out, "REPORT.md"), len(results),
            sum(1 for _, _, r in results if r["status"] != "ok"), _hms(time.time() - t0)))
    return code


def run_one(study, c, seed, out, bin_dir, log):
    """Runs one (configuration, seed) and writes its result.json; a failed
    run is a result too (status failed, its error and log tail)."""
    rdir = execute.run_dir(out, c, seed)
    argv = execute.psrun_argv(c, seed, rdir, bin_dir)
    start = time.time()
    code, why = execute.run_psrun(argv, rdir, study.timeout_s)
    result = {"settings": c.settings(seed), "run_dir": os.path.relpath(rdir, out),
              "exit_code": code, "wall_s_total": time.time() - start,
              "status": "ok" if code == 0 and not why else "failed"}
    if result["status"] != "ok":
        result["error"], result["log_tail"] = execute.failure_text(rdir, code, why)
    try:
        result["row"], result["curves"] = collect.collect(rdir, c.values["workers"], study)
    except (OSError, ValueError, KeyError) as e:  # a run cut short: what it left
        result["row"], result["curves"] = {}, []
        log("  could not read the run's figures: %s" % e)
    execute.write_result(rdir, result)
    return result
