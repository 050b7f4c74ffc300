#!/usr/bin/env python3
"""Failover of replicated shards, measured: each repeat is a psrun fleet of S
shards x 2 replicas (a local etcd, 1 s leases) and W workers training the MLP;
while they train, the primary of one group is killed with SIGKILL and its
RocksDB folder deleted. Per repeat (one JSON line):
  gap_s        kill -> the acknowledgement that ends the group's longest
               stretch without one around the kill: the new primary's first
               (the workers' own --push_log, wall clock); stall_s that stretch
  acked        distinct pushes the workers saw acknowledged, per group
  applied      pushes each surviving replica applied (ps_ctl stats at the end)
  lost         acknowledged pushes missing from a survivor (must be 0)
  accuracy     final test accuracy
Then a summary line: median and max of gap_s, total lost.

  experiments/chaos/failover.py --repeats 10 --out experiments/results/failover
"""
import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))
PSRUN = os.path.join(REPO, "launch", "psrun")


def read_push_logs(run_dir, workers):
    """({group: set of (rank, incarnation, id) acknowledged}, {group: [ack
    times, s]}) from the workers' push logs push-<rank>.log."""
    acked, times = {}, {}
    for r in range(workers):
        inc = None
        with open(os.path.join(run_dir, "push-%d.log" % r)) as f:
            for line in f:
                w = line.split()
                if len(w) == 4 and w[0] == "incarnation":
                    inc = int(w[1])
                elif len(w) == 4 and w[0] == "acked":
                    g = int(w[1])
                    acked.setdefault(g, set()).add((r, inc, int(w[2])))
                    times.setdefault(g, []).append(int(w[3]) / 1e6)
    return acked, times


def run_once(bin_dir, run_dir, servers=2, workers=2, epochs=3, victim_group=0,
             lease_ms=1000, attempt_timeout_ms=300, kill_after_bytes=20000, timeout_s=240):
    """One fleet, one kill; returns the repeat's record (see the module doc)."""
    os.makedirs(run_dir, exist_ok=True)
    fleet = os.path.join(run_dir, "run")
    argv = [sys.executable, PSRUN, "--servers", str(servers), "--workers", str(workers),
            "--replicas", "2", "--lease_ms", str(lease_ms), "--run_dir", fleet,
            "--bin_dir", bin_dir, "--grace", "3", "--start_timeout", "30", "--progress", "off",
            "--server_flags", "--consistency=asp --optimizer=sgd --lr=0.05 --worker_timeout_s=20",
            "--", "--layers=784,32,10", "--batch=32", "--epochs=%d" % epochs,
            "--log_every=200", "--threads=1", "--timeout_s=60",
            "--attempt_timeout_ms=%d" % attempt_timeout_ms,
            "--push_log=" + os.path.join(fleet, "push-{rank}.log")]
    out_path = os.path.join(run_dir, "psrun.out")
    with open(out_path, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        victim = None
        deadline = time.time() + 90
        while time.time() < deadline:
            try:
                with open(os.path.join(fleet, "pids.json")) as f:
                    procs = json.load(f)["procs"]
                victim = [p for p in procs if p.get("name") == "server-%d-r0" % victim_group][0]
                logs = [os.path.join(fleet, "push-%d.log" % r) for r in range(workers)]
                if all(os.path.exists(p) and os.path.getsize(p) > kill_after_bytes for p in logs):
                    break
            except (OSError, ValueError, IndexError, KeyError):
                pass
            time.sleep(0.05)
        else:
            raise RuntimeError("workers did not start pushing (%s)" % out_path)
        t_kill = time.time()
        os.kill(victim["pid"], signal.SIGKILL)
        shutil.rmtree(os.path.join(fleet, "db", "server-%d-r0" % victim_group),
                      ignore_errors=True)
        rc = proc.wait(timeout=timeout_s)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)
    rec = {"rc": rc, "t_kill": t_kill}
    with open(os.path.join(fleet, "summary.json")) as f:
        summary = json.load(f)
    rec["ok"] = summary["ok"]
    rec["accuracy"] = (summary.get("totals") or {}).get("final_test_acc")
    acked, times = read_push_logs(fleet, workers)
    with open(os.path.join(fleet, "stats.json")) as f:
        stats = json.load(f)
    applied = {}
    for sh in stats["shards"]:
        st = sh["stats"]
        applied.setdefault(st["shard"], []).append(st["pushes"])
    rec["acked"] = {str(g): len(v) for g, v in sorted(acked.items())}
    rec["applied"] = {str(g): v for g, v in sorted(applied.items())}
    # Each push is applied once (de-duplicated), and a worker that finished
    # had every push acknowledged: a survivor applying fewer pushes than were
    # acknowledged lost some, more would mean one applied twice.
    rec["lost"] = sum(max(0, len(acked.get(g, ())) - n) for g, ns in applied.items() for n in ns)
    rec["extra"] = sum(max(0, n - len(acked.get(g, ()))) for g, ns in applied.items() for n in ns)
    # Replies already on their way when the primary died still arrive just
    # after the kill: the failover is the longest stretch without an
    # acknowledgement from the group around the kill, and gap_s runs from the
    # kill to the acknowledgement that ends it (the new primary's first).
    ts = sorted(t for t in times.get(victim_group, []) if t > t_kill - 1.0)
    rec["gap_s"] = rec["stall_s"] = None
    if len(ts) >= 2:
        i = max(range(1, len(ts)), key=lambda k: ts[k] - ts[k - 1])
        rec["stall_s"] = round(ts[i] - ts[i - 1], 4)
        rec["gap_s"] = round(ts[i] - t_kill, 4)
    return rec


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin_dir", default=os.path.join(REPO, "build", "bin"))
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--servers", type=int, default=2)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", default=None, help="write failover.jsonl here")
    ap.add_argument("--work_dir", default=None, help="fleets' folders (default: a temp dir)")
    a = ap.parse_args()
    import tempfile
    work = a.work_dir or tempfile.mkdtemp(prefix="failover-")
    lines = []
    for i in range(a.repeats):
        rec = run_once(a.bin_dir, os.path.join(work, "r%02d" % i), servers=a.servers,
                       workers=a.workers, victim_group=i % a.servers)
        rec["repeat"] = i
        line = json.dumps(rec, sort_keys=True)
        print(line, flush=True)
        lines.append(rec)
    gaps = [r["gap_s"] for r in lines if r["gap_s"] is not None]
    summary = {"summary": True, "repeats": len(lines), "ok": sum(r["ok"] for r in lines),
               "gap_s_median": statistics.median(gaps) if gaps else None,
               "gap_s_min": min(gaps) if gaps else None, "gap_s_max": max(gaps) if gaps else None,
               "lost": sum(r["lost"] for r in lines), "extra": sum(r["extra"] for r in lines),
               "load": os.getloadavg()}
    print(json.dumps(summary, sort_keys=True), flush=True)
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "failover.jsonl"), "w") as f:
            for r in lines + [summary]:
                f.write(json.dumps(r, sort_keys=True) + "\n")
    if not a.work_dir:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if summary["lost"] == 0 and summary["ok"] == len(lines) else 1


if __name__ == "__main__":
    sys.exit(main())
