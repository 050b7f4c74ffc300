"""One (configuration, seed) of a study through psrun, resumably.

Each run has its folder OUT/runs/<config slug>/seed<k>/, which is psrun's
--run_dir (logs, metrics CSVs, summary.json, stats.json) plus psrun.out
(psrun's own output) and, once the run has ended (ok or failed),
result.json: the run's settings, status, exit code, error and log tail, its
runs.csv row and curves. A folder with a result.json for the same settings is
a finished run and is not run again (a killed study resumes where it was);
one without it is removed and run from the start.

Processes: psrun is started in its own session and ended by its PID
(SIGTERM, which makes it tear its fleet down; SIGKILL after a grace period);
it gets SIGTERM if the study dies (PR_SET_PDEATHSIG).
"""
import ctypes
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time

from pslaunch.procs import tail as _tail  # psrun's log tail

HERE = os.path.dirname(os.path.abspath(__file__))
LAUNCH = os.path.dirname(HERE)
PSRUN = os.path.join(LAUNCH, "psrun")  # in a checkout


def psrun_command(python=sys.executable):
    """How psstudy starts psrun: launch/psrun in a checkout, else (an
    installed pslaunch, which that python imports) python -m pslaunch."""
    if os.path.isfile(PSRUN):
        return [python, PSRUN]
    return [python, "-m", "pslaunch"]
RANKWRAP = os.path.join(HERE, "rankwrap.py")


class Interrupted(Exception):
    """The study got SIGINT/SIGTERM; the run in progress was torn down."""

    def __init__(self, signum):
        super().__init__("signal %d" % signum)
        self.signum = signum


def run_dir(out, config, seed):
    return os.path.join(out, "runs", config.slug(), "seed%d" % seed)


def psrun_argv(config, seed, rdir, bin_dir, python=sys.executable):
    """psrun's command line for one run."""
    v = config.values
    study = config.study
    argv = psrun_command(python) + [
        "--servers", str(v["servers"]), "--workers", str(v["workers"]), "--run_dir", rdir,
        "--bin_dir", bin_dir, "--progress", "off"]
    if study.top.get("config"):
        argv += ["--config", os.path.abspath(study.top["config"])]
    if v["hosts"]:
        argv += ["--emulate_hosts", str(v["hosts"])]
        if v["link"] != "none":
            argv += ["--link", v["link"]]
        if v["latency"]:
            argv += ["--latency", "%g" % v["latency"]]
        if v["shard_hosts"]:
            argv += ["--shard_hosts", str(v["shard_hosts"])]
    argv += ["--server_flags", " ".join(shlex.quote(f) for f in config.server_flags())]
    worker_cmd = study.top.get("worker_cmd")
    slow = config.straggler
    if slow:
        inner = worker_cmd or os.path.join(bin_dir, "ps_worker")
        worker_cmd = " ".join(shlex.quote(a) for a in [
            python, RANKWRAP, str(slow[1]), "%g" % slow[0], study.straggler_flag, "--"]) + \
            " " + inner
    if worker_cmd:
        argv += ["--worker_cmd", worker_cmd]
    argv += config.psrun_flags()
    return argv + ["--"] + config.worker_flags(seed)


def load_result(rdir, settings):
    """The result.json of a finished run with these settings, or None."""
    try:
        with open(os.path.join(rdir, "result.json")) as f:
            r = json.load(f)
    except (OSError, ValueError):
        return None
    return r if r.get("settings") == settings else None


def write_result(rdir, result):
    path = os.path.join(rdir, "result.json")
    with open(path + ".tmp", "w") as f:
        json.dump(result, f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(path + ".tmp", path)


def _die_with_parent():
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def run_psrun(argv, rdir, timeout_s, grace_s=20):
    """Runs psrun to its end; returns (exit code, 'timed out' or None).
    Raises Interrupted after tearing psrun down when the study is signalled."""
    shutil.rmtree(rdir, ignore_errors=True)
    os.makedirs(rdir)
    with open(os.path.join(rdir, "psrun.cmdline"), "w") as f:
        f.write(" ".join(shlex.quote(a) for a in argv) + "\n")
    stop = []

    def on_signal(signum, frame):
        stop.append(signum)

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        with open(os.path.join(rdir, "psrun.out"), "wb") as out:
            p = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, start_new_session=True,
                                 preexec_fn=_die_with_parent)
        deadline = time.time() + timeout_s
        why = None
        while p.poll() is None:
            if stop or time.time() > deadline:
                why = None if stop else "timed out after %gs" % timeout_s
                _end(p, grace_s)
                break
            time.sleep(0.2)
        if stop:
            raise Interrupted(stop[0])
        return p.returncode, why
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def _end(p, grace_s):
    """SIGTERM to psrun (it tears its fleet down), SIGKILL after grace_s."""
    try:
        p.send_signal(signal.SIGTERM)
        p.wait(grace_s)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
    except ProcessLookupError:
        pass


def failure_text(rdir, code, why):
    """(one-line error, log tail) of a failed run from summary.json/psrun.out."""
    try:
        with open(os.path.join(rdir, "summary.json")) as f:
            fails = json.load(f).get("failures") or []
    except (OSError, ValueError):
        fails = []
    if why:
        return why, _tail(os.path.join(rdir, "psrun.out"))
    if fails:
        f = fails[0]
        return ("%s: %s" % (f.get("name"), f.get("reason")),
                f.get("log_tail") or _tail(f.get("log") or ""))
    return "psrun exited %d" % code, _tail(os.path.join(rdir, "psrun.out"))
