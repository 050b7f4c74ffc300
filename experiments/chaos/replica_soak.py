#!/usr/bin/env python3
"""Many failovers in one training run: a psrun fleet of S shards x 2 replicas
(local etcd, 1 s leases) and W workers training the MLP; every --every_s
seconds the current primary of a group (taken in turn) is killed with SIGKILL
and its RocksDB folder deleted. psrun restarts it at its endpoint
(--max_restarts) with an empty disk: a spare, which the new primary copies
its state to and etcd lists as a backup again, so the next kill finds two
replicas. At the end, per group, every surviving replica must have applied
exactly the distinct pushes the workers' own logs say were acknowledged
(0 lost, 0 applied twice). One JSON line per kill (gap_s: kill -> the
acknowledgement that ends the group's longest stretch without one around
the kill; rejoin_s: kill -> the group has a backup again), then a summary.

  experiments/chaos/replica_soak.py --kills 10 --out experiments/results/failover
"""
import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.realpath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
PSRUN = os.path.join(REPO, "launch", "psrun")
from failover import read_push_logs


def ctl_stats(bin_dir, endpoints, timeout_ms=1500):
    """[stats] of the processes at `endpoints` that answered."""
    out = []
    for ep in endpoints:
        try:
            r = subprocess.run([os.path.join(bin_dir, "ps_ctl"), "--servers=" + ep,
                                "--timeout_ms=%d" % timeout_ms, "stats"],
                               capture_output=True, timeout=timeout_ms / 1000 * 2 + 5)
            if r.returncode == 0:
                out.append(json.loads(r.stdout)["shards"][0]["stats"])
        except (subprocess.TimeoutExpired, ValueError, KeyError, IndexError):
            pass
    return out


def stall(times, t_kill, t_end):
    """(kill -> the acknowledgement ending the longest stretch without one in
    [t_kill - 1 s, t_end), that stretch)."""
    ts = sorted(t for t in times if t_kill - 1.0 < t < t_end)
    if len(ts) < 2:
        return None, None
    i = max(range(1, len(ts)), key=lambda k: ts[k] - ts[k - 1])
    return round(ts[i] - t_kill, 4), round(ts[i] - ts[i - 1], 4)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin_dir", default=os.path.join(REPO, "build", "bin"))
    ap.add_argument("--kills", type=int, default=10)
    ap.add_argument("--every_s", type=float, default=4.0)
    ap.add_argument("--servers", type=int, default=2)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=0, help="0: enough for every kill")
    ap.add_argument("--out", help="write replica_soak.jsonl here")
    ap.add_argument("--work_dir")
    a = ap.parse_args()
    work = a.work_dir or tempfile.mkdtemp(prefix="replica-soak-")
    os.makedirs(work, exist_ok=True)
    fleet = os.path.join(work, "run")
    epochs = a.epochs or max(4, int(a.kills * (a.every_s + 3) / 2.5) + 2)
    argv = [sys.executable, PSRUN, "--servers", str(a.servers), "--workers", str(a.workers),
            "--replicas", "2", "--lease_ms", "1000", "--max_restarts", str(a.kills),
            "--run_dir", fleet, "--bin_dir", a.bin_dir, "--grace", "3", "--start_timeout", "30",
            "--progress", "off",
            "--server_flags", "--consistency=asp --optimizer=sgd --lr=0.05 --worker_timeout_s=20",
            "--", "--layers=784,32,10", "--batch=32", "--epochs=%d" % epochs,
            "--log_every=500", "--threads=1", "--timeout_s=60", "--attempt_timeout_ms=300",
            "--push_log=" + os.path.join(fleet, "push-{rank}.log")]
    out_path = os.path.join(work, "psrun.out")
    with open(out_path, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    kills = []
    try:
        time.sleep(3)
        while not os.path.exists(os.path.join(fleet, "push-0.log")):
            if proc.poll() is not None:
                raise RuntimeError("psrun ended early: see %s" % out_path)
            time.sleep(0.2)
        for k in range(a.kills):
            time.sleep(a.every_s)
            group = k % a.servers
            with open(os.path.join(fleet, "pids.json")) as f:
                procs = [p for p in json.load(f)["procs"] if p.get("role") == "server"]
            eps = [p["endpoint"] for p in procs]
            stats = ctl_stats(a.bin_dir, eps)
            prim = [s for s in stats if s["shard"] == group
                    and s.get("replication", {}).get("role") == "primary"]
            if not prim or not prim[0]["replication"]["backups"]:
                raise RuntimeError("group %d has no primary with a backup before kill %d"
                                   % (group, k))
            name = prim[0]["replication"]["name"]  # g<G>r<R>
            victim = [p for p in procs if p["name"] == "server-%d-r%s" % (
                group, name.split("r")[-1])][0]
            t_kill = time.time()
            os.kill(victim["pid"], signal.SIGKILL)
            shutil.rmtree(os.path.join(fleet, "db", victim["name"]), ignore_errors=True)
            # The group is whole again once its new primary lists a backup.
            rejoin = None
            deadline = time.time() + 60
            while time.time() < deadline and proc.poll() is None:
                st = [s for s in ctl_stats(a.bin_dir, eps, 800) if s["shard"] == group
                      and s.get("replication", {}).get("role") == "primary"]
                if st and st[0]["replication"]["backups"] and \
                        st[0]["replication"]["name"] != name:
                    rejoin = time.time() - t_kill
                    break
                time.sleep(0.2)
            kills.append({"kill": k, "group": group, "victim": victim["name"],
                          "t_kill": t_kill, "rejoin_s": None if rejoin is None else round(rejoin, 3)})
            print(json.dumps(kills[-1]), flush=True)
            if rejoin is None:
                raise RuntimeError("group %d did not get a backup back after kill %d" % (group, k))
        rc = proc.wait(timeout=1800)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=60)
    with open(os.path.join(fleet, "summary.json")) as f:
        summary = json.load(f)
    acked, times = read_push_logs(fleet, a.workers)
    with open(os.path.join(fleet, "stats.json")) as f:
        stats = [sh["stats"] for sh in json.load(f)["shards"]]
    lost = extra = 0
    for st in stats:
        n = len(acked.get(st["shard"], ()))
        lost += max(0, n - st["pushes"])
        extra += max(0, st["pushes"] - n)
    for i, k in enumerate(kills):
        end = kills[i + 1]["t_kill"] if i + 1 < len(kills) else k["t_kill"] + 15
        k["gap_s"], k["stall_s"] = stall(times.get(k["group"], []), k["t_kill"], end)
    gaps = [k["gap_s"] for k in kills if k["gap_s"] is not None]
    rejoins = [k["rejoin_s"] for k in kills if k["rejoin_s"] is not None]
    result = {"summary": True, "rc": rc, "ok": summary["ok"], "kills": len(kills),
              "acked": {str(g): len(v) for g, v in sorted(acked.items())},
              "replicas_at_end": len(stats), "lost": lost, "extra": extra,
              "gap_s_median": statistics.median(gaps) if gaps else None,
              "gap_s_max": max(gaps) if gaps else None,
              "rejoin_s_median": statistics.median(rejoins) if rejoins else None,
              "rejoin_s_max": max(rejoins) if rejoins else None,
              "accuracy": (summary.get("totals") or {}).get("final_test_acc"),
              "load": os.getloadavg()}
    print(json.dumps(result, sort_keys=True), flush=True)
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "replica_soak.jsonl"), "w") as f:
            for r in kills + [result]:
                f.write(json.dumps(r, sort_keys=True) + "\n")
    if not a.work_dir:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if rc == 0 and lost == 0 and extra == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
