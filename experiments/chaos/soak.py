#!/usr/bin/env python3
"""Soak: a fleet (2 shards, 3 workers, Fashion-MNIST, --durable) runs for
--minutes (default 30) with random kill -9s of workers (restarted) and, less
often, shards (restarted from RocksDB); every 10 s it samples each shard's
RSS from /proc/PID/status. Reports per shard slot the RSS at start (first
sample after warm-up) and at the end, per incarnation, and the growth of the
longest-lived incarnation.

Lost acknowledged pushes are counted exactly, per shard, from what the
workers were told and what the recovered store holds, not from the shards'
counters:
  acked  pushes the shard acknowledged to a worker (every worker writes each
         push it sends and each acknowledgement it receives to --push_log,
         write-through, so a kill -9 loses no line);
  stored updates the shard's store holds after the run (a fresh ps_server
         opened on it: its version; every applied push is one update);
  extra  pushes applied but never acknowledged: those a worker sent and was
         killed before hearing back (a push is logged before it leaves). Each
         is looked up in the shard's de-duplication table, read after the
         kill once the shard has read what the dead process sent (ps_ctl
         stats "push_table": the applied ids of that worker process);
  lost = acked - (stored - extra), which is 0 when every acknowledged push is
  in the store. Pushes of a killed worker whose fate the table cannot tell
  (below its floor) are reported as "undetermined" (expected: 0).

  experiments/chaos/soak.py --build build --minutes 30
"""
import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time

from chaos import Fleet


def rss_kib(pid):
    try:
        for line in open("/proc/%d/status" % pid):
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def read_push_log(path):
    """(incarnation, rank, {shard: set(sent ids)}, {shard: set(acked ids)})."""
    inc, rank, sent, acked = None, None, {}, {}
    try:
        lines = open(path).read().splitlines()
    except OSError:
        return inc, rank, sent, acked
    for line in lines:
        w = line.split()
        if len(w) == 4 and w[0] == "incarnation":
            inc, rank = int(w[1]), int(w[3])
        elif len(w) in (3, 4) and w[0] in ("sent", "acked"):  # 4th: time, us
            (sent if w[0] == "sent" else acked).setdefault(int(w[1]), set()).add(int(w[2]))
    return inc, rank, sent, acked


def push_tables(f, deadline_s=20):
    """Each shard's de-duplication table {(rank, incarnation): entry}, retried
    while a shard restarts."""
    end = time.time() + deadline_s
    while time.time() < end:
        j = f.ctl(f.eps, "stats", 2000)
        try:
            return [{(e["rank"], e["incarnation"]): e for e in sh["stats"]["push_table"]}
                    for sh in j["shards"]]
        except (TypeError, KeyError, IndexError):
            time.sleep(0.2)
    return None


def store_version(f, s, run_dir):
    """The version the store of shard `s` holds, read by a fresh ps_server."""
    ready = os.path.join(run_dir, "reopen%d.ready" % s)
    cmd = [os.path.join(f.bin, "ps_server"), "--shard_id=%d" % s,
           "--num_shards=%d" % f.a.shards, "--num_workers=%d" % f.a.workers,
           "--endpoint=tcp://127.0.0.1:*", "--ready_file=" + ready,
           "--checkpoint_every_s=0",
           "--db_path=" + os.path.join(f.dir, "%s.db%d" % (f.tag, s))]
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        end = time.time() + 60
        while time.time() < end and not (os.path.exists(ready) and open(ready).read().strip()):
            time.sleep(0.05)
        ep = open(ready).read().strip()
        j = f.ctl([ep], "stats", 5000)
        f.ctl([ep], "shutdown", 5000)
        return j["shards"][0]["stats"]["version"]
    finally:
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def settle_killed(f, log_path, killed):
    """After a worker's kill -9: which of its unacknowledged pushes each shard
    applied, from the shards' de-duplication tables."""
    time.sleep(1.0)  # what the dead process had sent reaches the shards
    inc, rank, sent, acked = read_push_log(log_path)
    # A shard reads its connections in turn, one message from each: a stats
    # request can overtake what the dead worker's connection still holds.
    # Ask several times; the last answer comes after all of it.
    tables = None
    for _ in range(6):
        tables = push_tables(f) or tables
        time.sleep(0.3)
    for s in range(f.a.shards):
        pending = sent.get(s, set()) - acked.get(s, set())
        entry = tables[s].get((rank, inc)) if tables else None
        for pid in pending:
            if entry is None or pid < entry["floor"]:
                killed["undetermined"][s] += 1
            elif pid in entry["applied"]:
                killed["applied_unacked"][s] += 1
            elif entry["applied_total"] > len(entry["applied"]):
                killed["undetermined"][s] += 1  # the listed ids are cut short


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("--minutes", type=float, default=30)
    ap.add_argument("--worker_kill_every_s", type=float, default=20)
    ap.add_argument("--shard_kill_every_s", type=float, default=90)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    # Fleet options (the chaos defaults).
    fa = argparse.Namespace(build=a.build, shards=2, workers=3, lr=0.05, durable=True,
                            worker_timeout_s=5.0, seed=a.seed, log_every=200,
                            timeout_s=120, max_steps=0, epochs=1000, push_log=True)
    run_dir = tempfile.mkdtemp(prefix="asyncps-soak-")
    f = Fleet(fa, run_dir, "soak")
    rng = random.Random(a.seed)
    killed = {"applied_unacked": [0] * fa.shards, "undetermined": [0] * fa.shards}
    for s in range(fa.shards):
        f.start_shard(s)
    for s in range(fa.shards):
        f.wait_ready(s, time.time() + 20)
    for r in range(fa.workers):
        f.start_worker(r)
    t0 = time.time()
    end = t0 + a.minutes * 60
    samples = {s: [] for s in range(fa.shards)}  # (t, pid, rss_kib)
    kills = {"shard": 0, "worker": 0}
    next_sample = t0 + 10
    next_wkill = t0 + a.worker_kill_every_s
    next_skill = t0 + a.shard_kill_every_s

    def current_log(r):
        return [i for i in f.incarnations if i[0] == r][-1][1] + ".push"

    while time.time() < end:
        now = time.time()
        for r, p in list(f.workers.items()):
            if p.poll() is not None:  # finished or died: start again
                if p.returncode != 0:
                    settle_killed(f, current_log(r), killed)
                f.start_worker(r)
        if now >= next_sample:
            for s in range(fa.shards):
                pid = f.shards[s].pid
                samples[s].append((round(now - t0, 1), pid, rss_kib(pid)))
            next_sample = now + 10
        if now >= next_wkill:
            r = rng.randrange(fa.workers)
            f.workers[r].send_signal(signal.SIGKILL)
            f.workers[r].wait()
            settle_killed(f, current_log(r), killed)
            f.start_worker(r)
            kills["worker"] += 1
            next_wkill = now + rng.uniform(0.5, 1.5) * a.worker_kill_every_s
        if now >= next_skill:
            s = rng.randrange(fa.shards)
            f.shards[s].send_signal(signal.SIGKILL)
            f.shards[s].wait()
            f.start_shard(s)
            kills["shard"] += 1
            next_skill = now + rng.uniform(0.5, 1.5) * a.shard_kill_every_s
        time.sleep(0.2)
    # End: the workers are killed too (their last pushes are settled like any
    # kill), then the shards shut down and their stores are read afresh.
    for r, p in f.workers.items():
        p.send_signal(signal.SIGKILL)
        p.wait()
    for r in range(fa.workers):
        settle_killed(f, current_log(r), killed)
    stats = f.ctl(f.eps, "stats")
    f.ctl(f.eps, "shutdown")
    for p in f.started:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    acked, sent = [0] * fa.shards, [0] * fa.shards
    for r, path, p in f.incarnations:
        _, _, s_ids, a_ids = read_push_log(path + ".push")
        for s in range(fa.shards):
            acked[s] += len(a_ids.get(s, ()))
            sent[s] += len(s_ids.get(s, ()))
    out = {"minutes": a.minutes, "kills": kills, "run_dir": run_dir, "shards": [],
           "worker_incarnations": len(f.incarnations)}
    for s in range(fa.shards):
        stored = store_version(f, s, run_dir)
        extra = killed["applied_unacked"][s]
        by_pid = {}
        for t, pid, rss in samples[s]:
            if rss is not None:
                by_pid.setdefault(pid, []).append((t, rss))
        inc = [{"pid": pid, "from_s": v[0][0], "to_s": v[-1][0],
                "rss_start_kib": v[0][1], "rss_end_kib": v[-1][1],
                "rss_max_kib": max(x[1] for x in v)} for pid, v in by_pid.items()]
        longest = max(inc, key=lambda i: i["to_s"] - i["from_s"]) if inc else None
        out["shards"].append({
            "shard": s,
            "pushes_sent": sent[s], "pushes_acked": acked[s],
            "store_updates": stored, "applied_unacked": extra,
            "undetermined": killed["undetermined"][s],
            "lost_acked_pushes": acked[s] - (stored - extra),
            "rss_start_kib": samples[s][0][2] if samples[s] else None,
            "rss_end_kib": samples[s][-1][2] if samples[s] else None,
            "incarnations": inc,
            "longest_growth_pct": None if not longest else round(
                100.0 * (longest["rss_end_kib"] - longest["rss_start_kib"]) /
                longest["rss_start_kib"], 1),
            "duplicate_pushes": (stats or {}).get("shards", [{}] * fa.shards)[s].get(
                "stats", {}).get("duplicate_pushes")})
    out["lost_acked_pushes"] = sum(x["lost_acked_pushes"] for x in out["shards"])
    print(json.dumps(out))
    return 0 if out["lost_acked_pushes"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
