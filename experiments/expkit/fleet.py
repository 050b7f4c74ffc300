"""Run one asyncps training job: S ps_server shards, W ps_worker ranks.

Unlike launch/psrun, every rank may get its own flags (a straggler gets
--slowdown), the shards' `ps_ctl stats` are read after the workers finish and
before the shards are shut down (the staleness histogram lives there), and the
whole fleet may run inside a network namespace (ShapedLink) whose loopback is
rate-limited with tc, so all traffic crosses a slow link.

Processes are started by this module and ended by PID only (SIGTERM, then
SIGKILL after a grace period); a failed job ends every process it started.
"""
import atexit
import json
import os
import re
import signal
import subprocess
import sys
import time

from pslaunch import workercmd  # psrun's --worker_cmd contract
from pslaunch.binaries import default_bin_dir  # psrun's: the same binaries


class JobError(RuntimeError):
    """A job could not start or one of its processes failed."""


def _tail(path, lines=15):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return "(no log)"


class ShapedLink:
    """A network namespace whose loopback is shaped with tc tbf.

    with ShapedLink("100mbit") as link:
        run_job(..., prefix=link.prefix())

    The namespace (asyncps_slow_<pid>) is deleted on exit, on failure and at
    interpreter exit; it needs root (CAP_NET_ADMIN). Traffic stays on the
    namespace's own 127.0.0.1.
    """

    def __init__(self, rate="100mbit", burst="32kb", latency="50ms"):
        self.rate, self.burst, self.latency = rate, burst, latency
        self.name = "asyncps_slow_%d" % os.getpid()
        self._up = False

    @staticmethod
    def available():
        """True when namespaces can be created here (root, ip and tc)."""
        if os.geteuid() != 0:
            return False
        for tool in ("ip", "tc"):
            if subprocess.call(["sh", "-c", "command -v " + tool],
                               stdout=subprocess.DEVNULL) != 0:
                return False
        return True

    def __enter__(self):
        subprocess.run(["ip", "netns", "del", self.name],
                       stderr=subprocess.DEVNULL, check=False)
        subprocess.run(["ip", "netns", "add", self.name], check=True)
        self._up = True
        atexit.register(self.close)
        try:
            # The burst must exceed the MTU: lo's default 65536 passes nothing.
            subprocess.run(["ip", "-n", self.name, "link", "set", "lo", "mtu",
                            "1500", "up"], check=True)
            subprocess.run(["ip", "netns", "exec", self.name, "tc", "qdisc",
                            "add", "dev", "lo", "root", "tbf", "rate",
                            self.rate, "burst", self.burst, "latency",
                            self.latency], check=True)
        except Exception:
            self.close()
            raise
        return self

    def prefix(self):
        return ["ip", "netns", "exec", self.name]

    def close(self):
        """Deletes the namespace, retrying for a few seconds.

        A deletion can fail (EBUSY) while the last process that ran in the
        namespace is still being torn down; one silent attempt left the
        namespace behind in a CI run.
        """
        if not self._up:
            return
        path = os.path.join("/run/netns", self.name)
        deadline = time.time() + 10.0
        while True:
            r = subprocess.run(["ip", "netns", "del", self.name],
                               capture_output=True, text=True, check=False)
            if not os.path.exists(path):
                break
            if time.time() > deadline:
                sys.stderr.write("ShapedLink: cannot delete namespace %s: %s\n"
                                 % (self.name, r.stderr.strip()))
                break
            time.sleep(0.2)
        self._up = False

    def __exit__(self, *exc):
        self.close()
        return False


class _Procs:
    """Processes started by one job, ended by PID."""

    def __init__(self):
        self.procs = []  # (name, Popen)

    def start(self, name, cmd, stdout_path, stderr_path):
        with open(stdout_path, "wb") as out, open(stderr_path, "wb") as err:
            p = subprocess.Popen(cmd, stdout=out, stderr=err,
                                 stdin=subprocess.DEVNULL)
        self.procs.append((name, p))
        return p

    def end_all(self, grace=3.0):
        live = [p for _, p in self.procs if p.poll() is None]
        for p in live:
            try:
                p.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.time() + grace
        for p in live:
            try:
                p.wait(max(0.0, deadline - time.time()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


_SUMMARY_RE = re.compile(r"SUMMARY (.*)")
_ENCODE_RE = re.compile(r"encode_ms_total=([0-9.eE+-]+)")


def parse_summary(path):
    """key=value pairs of the SUMMARY line in a worker's stdout ({} if none)."""
    try:
        text = open(path, errors="replace").read()
    except OSError:
        return {}
    m = None
    for m in _SUMMARY_RE.finditer(text):
        pass
    if not m:
        return {}
    out = {}
    for kv in m.group(1).split():
        k, _, v = kv.partition("=")
        try:
            out[k] = float(v)
        except ValueError:
            out[k] = v
    return out


def parse_encode_ms(*paths):
    """Total gradient encode time (ms) a worker logged, or None."""
    for path in paths:
        try:
            m = _ENCODE_RE.search(open(path, errors="replace").read())
        except OSError:
            continue
        if m:
            return float(m.group(1))
    return None


def _ctl(bin_dir, prefix, endpoints, cmd, timeout_s=10):
    r = subprocess.run(prefix + [os.path.join(bin_dir, "ps_ctl"),
                                 "--servers=" + ",".join(endpoints), cmd],
                       capture_output=True, text=True, timeout=timeout_s)
    if r.returncode != 0:
        raise JobError("ps_ctl %s failed: %s" % (cmd, r.stderr.strip()))
    return json.loads(r.stdout)


def partial_job(out_dir, workers):
    """What is left of a failed job (metrics CSVs so far), shaped like
    run_job's result, so that the failure can still be tabulated."""
    return {"out_dir": out_dir, "wall_s": 0.0, "endpoints": [],
            "stats": {}, "failed": True, "final_eval_acc": None,
            "summaries": [parse_summary(os.path.join(
                out_dir, "worker-%d.out" % r)) for r in range(workers)],
            "encode_ms": [None] * workers}


def final_evaluation(bin_dir, prefix, endpoints, workers, worker_flags,
                     out_dir, timeout_s=120):
    """Test accuracy of the shards' weights once every worker is done: one
    `ps_worker --role=eval` (an observer, rank -1) that pulls and evaluates
    once (the workers' clocks are already at the end). ps_worker's MLP
    only; its flags must give the workers' planned steps (epochs, batch,
    max_steps, drop_last). Returns the accuracy, or None if it failed."""
    skip = ("--eval=", "--eval_every=", "--metrics_csv=", "--slowdown=",
            "--log_every=")
    flags = [f for f in worker_flags if not f.startswith(skip)]
    log = os.path.join(out_dir, "final-eval.log")
    cmd = prefix + [os.path.join(bin_dir, "ps_worker"),
                    "--servers=" + ",".join(endpoints), "--role=eval",
                    "--num_workers=%d" % workers, "--eval_interval_ms=100"] + \
        flags
    with open(log, "wb") as err, open(log + ".out", "wb") as out:
        try:
            rc = subprocess.run(cmd, stdout=out, stderr=err,
                                stdin=subprocess.DEVNULL,
                                timeout=timeout_s).returncode
        except subprocess.TimeoutExpired:
            return None
    acc = parse_summary(log + ".out").get("final_test_acc")
    return acc if rc == 0 and isinstance(acc, float) and acc >= 0 else None


def run_job(out_dir, bin_dir=None, servers=1, workers=4,
            server_flags=(), worker_flags=(), rank_flags=None, prefix=(),
            timeout_s=900, start_timeout_s=30, worker_cmd=None,
            final_eval=False):
    """Runs one job to completion; returns a dict describing it.

    out_dir gets server-<i>.log, worker-<r>.log (stderr), worker-<r>.out
    (stdout, SUMMARY line), metrics-<r>.csv, stats.json, job.json.
    bin_dir: ps_server, ps_worker and ps_ctl (None: psrun's default_bin_dir()).
    rank_flags: {rank: [extra flags]} for individual workers.
    prefix: command prefix for every process (ShapedLink.prefix()).
    worker_cmd: run this command (e.g. 'python3 worker/python/examples/mlp.py')
    as each worker instead of ps_worker, with the flags and psrun's
    environment contract (launch/pslaunch/workercmd.py).
    final_eval: after the workers, evaluate the shards' final weights once
    (final_evaluation(); ps_worker's MLP only): job["final_eval_acc"].
    Raises JobError on any failure, after ending every process it started.
    """
    bin_dir = bin_dir or default_bin_dir()
    os.makedirs(out_dir, exist_ok=True)
    prefix = list(prefix)
    rank_flags = rank_flags or {}
    procs = _Procs()
    try:
        ready = []
        for i in range(servers):
            rf = os.path.join(out_dir, "shard-%d.endpoint" % i)
            if os.path.exists(rf):
                os.remove(rf)
            ready.append(rf)
            cmd = prefix + [os.path.join(bin_dir, "ps_server"),
                            "--endpoint=tcp://127.0.0.1:*",
                            "--ready_file=" + rf, "--shard_id=%d" % i,
                            "--num_shards=%d" % servers,
                            "--num_workers=%d" % workers] + list(server_flags)
            log = os.path.join(out_dir, "server-%d.log" % i)
            procs.start("server-%d" % i, cmd, log, log + ".err")
        deadline = time.time() + start_timeout_s
        endpoints = []
        for i, rf in enumerate(ready):
            name, p = procs.procs[i]
            while not os.path.exists(rf):
                if p.poll() is not None:
                    raise JobError("%s exited with %d before serving:\n%s" % (
                        name, p.returncode,
                        _tail(os.path.join(out_dir, "server-%d.log.err" % i))))
                if time.time() > deadline:
                    raise JobError("%s not ready after %ds" %
                                   (name, start_timeout_s))
                time.sleep(0.02)
            endpoints.append(open(rf).read().strip())

        t0 = time.time()
        worker_procs = []
        for r in range(workers):
            flags = list(worker_flags) + list(rank_flags.get(r, []))
            if worker_cmd:
                env = workercmd.contract(",".join(endpoints), r, workers, servers, out_dir,
                                         bin_dir, pythonpath=os.environ.get("PYTHONPATH"))
                cmd = prefix + workercmd.env_argv(env, workercmd.argv(worker_cmd, flags, ()))
            else:
                cmd = prefix + [os.path.join(bin_dir, "ps_worker"),
                                "--servers=" + ",".join(endpoints),
                                "--rank=%d" % r, "--num_workers=%d" % workers,
                                "--metrics_csv=" + os.path.join(
                                    out_dir, "metrics-%d.csv" % r)] + flags
            worker_procs.append(procs.start(
                "worker-%d" % r, cmd,
                os.path.join(out_dir, "worker-%d.out" % r),
                os.path.join(out_dir, "worker-%d.log" % r)))
        deadline = t0 + timeout_s
        pending = set(range(workers))
        while pending:
            for r in sorted(pending):
                rc = worker_procs[r].poll()
                if rc is None:
                    continue
                pending.discard(r)
                if rc != 0:
                    raise JobError("worker-%d exited with %d:\n%s" % (
                        r, rc, _tail(os.path.join(out_dir,
                                                  "worker-%d.log" % r))))
            for i in range(servers):
                name, p = procs.procs[i]
                if p.poll() is not None:
                    raise JobError("%s died (rc %d) during training:\n%s" % (
                        name, p.returncode,
                        _tail(os.path.join(out_dir,
                                           "server-%d.log.err" % i))))
            if pending and time.time() > deadline:
                raise JobError("workers %s still running after %ds" %
                               (sorted(pending), timeout_s))
            time.sleep(0.05)
        wall = time.time() - t0

        final_acc = None
        if final_eval and not worker_cmd:
            final_acc = final_evaluation(bin_dir, prefix, endpoints, workers,
                                         worker_flags, out_dir)
        stats = _ctl(bin_dir, prefix, endpoints, "stats")
        with open(os.path.join(out_dir, "stats.json"), "w") as f:
            json.dump(stats, f)
        try:
            _ctl(bin_dir, prefix, endpoints, "shutdown")
        except (JobError, subprocess.TimeoutExpired):
            pass
        for i in range(servers):
            try:
                procs.procs[i][1].wait(10)
            except subprocess.TimeoutExpired:
                pass
        job = {
            "out_dir": out_dir,
            "wall_s": wall,
            "endpoints": endpoints,
            "stats": stats,
            "summaries": [parse_summary(os.path.join(out_dir,
                                                     "worker-%d.out" % r))
                          for r in range(workers)],
            "encode_ms": [parse_encode_ms(
                os.path.join(out_dir, "worker-%d.log" % r),
                os.path.join(out_dir, "worker-%d.out" % r))
                for r in range(workers)],
            "final_eval_acc": final_acc,
            "server_flags": list(server_flags),
            "worker_flags": list(worker_flags),
            "rank_flags": {str(k): v for k, v in rank_flags.items()},
        }
        with open(os.path.join(out_dir, "job.json"), "w") as f:
            json.dump({k: v for k, v in job.items() if k != "stats"}, f,
                      indent=1)
        return job
    finally:
        procs.end_all()
