#!/usr/bin/env python3
"""Failover of replicated shards, measured: each repeat is a psrun fleet of S
shards x 2 replicas (a local etcd, 1 s leases) and W workers training the MLP;
while they train, the primary of one group is killed with SIGKILL and its
RocksDB folder deleted. With --hosts N the fleet runs on N emulated hosts
(psrun --emulate_hosts: network namespaces, links shaped to --link; shards on
the first --shard_hosts, workers on the others) and the victim is the host of
that primary: every process on it is killed with SIGKILL and their RocksDB
folders deleted, or with --partition its link is cut (eth0 down) for
--partition_s seconds and then healed while the workers on other hosts train.
Per repeat (one JSON line):
  gap_s        event (kill, cut) -> the acknowledgement that ends the
               victim group's longest stretch without one around the event:
               the new primary's first (the workers' own --push_log, wall
               clock); stall_s that stretch; with several victim groups (a
               host holding several primaries) the largest
  acked        distinct pushes the workers saw acknowledged, per group
  applied      pushes each surviving replica applied (ps_ctl stats at the end)
  views        each survivor's role and epoch when the stats were taken
               (its stats, or its log's last 'replica view' line)
  lost         acknowledged pushes missing from a survivor that is its
               group's primary or a backup at the end (must be 0): with
               --partition, the old primary cannot have acknowledged what
               the new one lacks; primary_lost counts the primaries alone
  accuracy     final test accuracy
Then a summary line: median and max of gap_s, total lost.

  experiments/chaos/failover.py --repeats 10 --out experiments/results/failover
  experiments/chaos/failover.py --hosts 5 --shard_hosts 3 --link 100mbit --servers 3 \\
      --workers 4 --repeats 10 [--partition] --out experiments/results/failover
"""
import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))
PSRUN = os.path.join(REPO, "launch", "psrun")
sys.path.insert(0, os.path.join(REPO, "launch"))  # pslaunch (expkit/__init__.py)
from pslaunch import netns  # noqa: E402

# glog's prefix and ps_server's view line (server/replication/replicator.cc).
_VIEW_RE = re.compile(r"^[IWE](\d{8} \d\d:\d\d:\d\d\.\d+) .*replica view: epoch (\d+) "
                      r"(primary|backup|spare)")


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


def stall(times, t_event):
    """(gap_s, stall_s) of acknowledgement times `times` around t_event.
    Replies already on their way at the event still arrive just after it:
    the failover is the longest stretch without an acknowledgement around
    the event, and gap_s runs from the event to the acknowledgement that
    ends it (the new primary's first). (None, None) with fewer than two."""
    ts = sorted(t for t in times if t > t_event - 1.0)
    if len(ts) < 2:
        return None, None
    i = max(range(1, len(ts)), key=lambda k: ts[k] - ts[k - 1])
    return round(ts[i] - t_event, 4), round(ts[i] - ts[i - 1], 4)


def last_views(fleet, names, until):
    """{name: (epoch, role)}: each replica's last 'replica view' log line
    written up to wall-clock time `until` (None when it has none)."""
    views = {}
    for name in names:
        views[name] = None
        try:
            with open(os.path.join(fleet, name + ".log"), errors="replace") as f:
                for line in f:
                    m = _VIEW_RE.match(line)
                    if not m:
                        continue
                    t = time.mktime(time.strptime(m.group(1).split(".")[0], "%Y%m%d %H:%M:%S"))
                    if t <= until:
                        views[name] = (int(m.group(2)), m.group(3))
        except OSError:
            pass
    return views


def wait_pushing(fleet, workers, kill_after_bytes, out_path, timeout=90):
    """pids.json's records once every worker's push log passed kill_after_bytes."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with open(os.path.join(fleet, "pids.json")) as f:
                procs = json.load(f)["procs"]
            logs = [os.path.join(fleet, "push-%d.log" % r) for r in range(workers)]
            if all(os.path.exists(p) and os.path.getsize(p) > kill_after_bytes for p in logs):
                return procs
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.05)
    raise RuntimeError("workers did not start pushing (%s)" % out_path)


def run_once(bin_dir, run_dir, servers=2, workers=2, epochs=3, victim_group=0,
             lease_ms=1000, attempt_timeout_ms=300, kill_after_bytes=20000, timeout_s=240,
             hosts=None, shard_hosts=None, link=None, partition_s=None, etcd=None,
             disrupt=None, consistency="asp", psrun_args=(), server_extra="",
             on_training=None):
    """One fleet, one kill (or cut); returns the repeat's record (see the
    module doc). hosts: psrun --emulate_hosts (shard_hosts, link): the victim
    is the host of group victim_group's primary, every process on it killed,
    or with partition_s its link cut for that many seconds. etcd: the fleet's
    etcd endpoints (psrun --etcd) instead of a local one psrun starts;
    disrupt: called instead of the kill (e.g. an etcd outage), nothing killed;
    consistency: the shards' --consistency (bsp: rounds handed on aggregated,
    ps_server's default); psrun_args / server_extra: more psrun options and
    ps_server flags (e.g. --etcd_tls on, an --etcd's credentials);
    on_training: called with the fleet's folder once the workers push,
    before the kill."""
    os.makedirs(run_dir, exist_ok=True)
    fleet = os.path.join(run_dir, "run")
    argv = [sys.executable, PSRUN, "--servers", str(servers), "--workers", str(workers),
            "--replicas", "2", "--lease_ms", str(lease_ms), "--run_dir", fleet,
            "--bin_dir", bin_dir, "--grace", "3", "--start_timeout", "30", "--progress", "off",
            "--server_flags",
            ("--consistency=%s --optimizer=sgd --lr=0.05 --worker_timeout_s=20 %s" % (
                consistency, server_extra)).strip()] + list(psrun_args)
    if hosts:
        argv += ["--emulate_hosts", str(hosts)] + (
            ["--shard_hosts", str(shard_hosts)] if shard_hosts else []) + (
            ["--link", link] if link else [])
    if etcd:
        argv += ["--etcd", etcd]
    argv += ["--", "--layers=784,32,10", "--batch=32", "--epochs=%d" % epochs,
             "--log_every=200", "--threads=1", "--timeout_s=60",
             "--attempt_timeout_ms=%d" % attempt_timeout_ms,
             "--push_log=" + os.path.join(fleet, "push-{rank}.log")]
    out_path = os.path.join(run_dir, "psrun.out")
    with open(out_path, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    rec = {"mode": "partition" if partition_s else "host" if hosts else "primary"}
    cut = None
    try:
        procs = wait_pushing(fleet, workers, kill_after_bytes, out_path)
        if on_training is not None:
            on_training(fleet)
        primary = [p for p in procs if p.get("name") == "server-%d-r0" % victim_group][0]
        if hosts:
            on_host = [p for p in procs if p.get("netns") == primary["netns"]]
            rec["victim"] = primary["emulated_host"]
        else:
            on_host = [primary]
            rec["victim"] = primary["name"]
        rec["victims"] = sorted(p["name"] for p in on_host)
        # The groups whose primary was there (no failover happened before).
        victim_groups = sorted({int(p["name"].split("-")[1]) for p in on_host
                                if p["role"] == "server" and p["name"].endswith("-r0")})
        if disrupt is not None:
            t_kill = time.time()
            disrupt()
            victim_groups = []
        elif partition_s:
            cut = primary["netns"]
            t_kill = time.time()
            netns.set_link_state(cut, up=False)
            time.sleep(partition_s)
            netns.set_link_state(cut, up=True)
            cut = None
            rec["healed_s"] = round(time.time() - t_kill, 3)
        else:
            t_kill = time.time()
            for p in on_host:
                try:
                    os.kill(p["pid"], signal.SIGKILL)
                except ProcessLookupError:
                    pass
            for p in on_host:
                if p["role"] == "server":
                    shutil.rmtree(os.path.join(fleet, "db", p["name"]), ignore_errors=True)
        rc = proc.wait(timeout=timeout_s)
    finally:
        if cut is not None:
            netns.set_link_state(cut, up=True)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)
    rec.update({"rc": rc, "t_kill": t_kill, "victim_groups": victim_groups,
                "namespaces_left": netns.list_namespaces("psrun%d-" % proc.pid)})
    with open(os.path.join(fleet, "summary.json")) as f:
        summary = json.load(f)
    rec["ok"] = summary["ok"]
    rec["accuracy"] = (summary.get("totals") or {}).get("final_test_acc")
    acked, times = read_push_logs(fleet, workers)
    stats_path = os.path.join(fleet, "stats.json")
    with open(stats_path) as f:
        stats = json.load(f)
    by_endpoint = {p["endpoint"]: p["name"] for p in procs if p.get("endpoint")}
    applied, names, views = {}, {}, {}
    for sh in stats["shards"]:
        st = sh["stats"]
        applied.setdefault(st["shard"], []).append(st["pushes"])
        name = by_endpoint.get(sh["endpoint"], sh["endpoint"])
        names[name] = (st["shard"], st["pushes"])
        repl = st.get("replication")
        rec["promotions"] = rec.get("promotions", 0) + (repl or {}).get("promotions", 0)
        if repl and "role" in repl:
            views[name] = (int(repl["epoch"]), repl["role"])
    if len(views) < len(names):  # a ps_server whose stats say no role: its log does
        logged = last_views(fleet, names, os.path.getmtime(stats_path) + 1.0)
        views = {n: views.get(n) or logged.get(n) for n in names}
    rec["acked"] = {str(g): len(v) for g, v in sorted(acked.items())}
    rec["applied"] = {str(g): v for g, v in sorted(applied.items())}
    rec["views"] = {n: v and "%s@%d" % (v[1], v[0]) for n, v in sorted(views.items())}
    # Each push is applied once (de-duplicated), and a worker that finished
    # had every push acknowledged: a primary or backup applying fewer pushes
    # than were acknowledged lost some, more would mean one applied twice. A
    # spare (a partitioned replica that came back, say) holds no state yet.
    holders = {n: gp for n, gp in names.items()
               if views.get(n) is None or views[n][1] != "spare"}
    newest = {}
    for n, (g, _) in names.items():
        if views.get(n) and views[n][1] == "primary":
            if g not in newest or views[n][0] > views[newest[g]][0]:
                newest[g] = n
    # A deposed primary that still thinks it leads (an older epoch) is not
    # the group's: judged as a holder only when no newer primary answered.
    holders = {n: gp for n, gp in holders.items()
               if not (views.get(n) and views[n][1] == "primary" and newest.get(gp[0]) != n)}
    rec["lost"] = sum(max(0, len(acked.get(g, ())) - n) for g, n in holders.values())
    rec["extra"] = sum(max(0, n - len(acked.get(g, ()))) for g, n in holders.values())
    rec["primary_lost"] = sum(max(0, len(acked.get(names[n][0], ())) - names[n][1])
                              for n in newest.values())
    # A group no primary or backup of which answered ps_ctl stats at the end.
    rec["missing_groups"] = sorted(set(range(servers)) - {g for g, _ in holders.values()})
    rec["gap_s"] = rec["stall_s"] = None
    for g in victim_groups:
        gap, st = stall(times.get(g, []), t_kill)
        if gap is not None and (rec["gap_s"] is None or gap > rec["gap_s"]):
            rec["gap_s"], rec["stall_s"] = gap, st
    return rec


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin_dir", default=os.path.join(REPO, "build", "bin"))
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--servers", type=int, default=2)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--hosts", type=int, help="emulated hosts (psrun --emulate_hosts; root)")
    ap.add_argument("--shard_hosts", type=int,
                    help="with --hosts: shards on the first M hosts, workers on the others")
    ap.add_argument("--link", help="with --hosts: each host's link rate, e.g. 100mbit")
    ap.add_argument("--partition", action="store_true",
                    help="with --hosts: cut the victim host's link instead of killing it")
    ap.add_argument("--partition_s", type=float, default=5.0,
                    help="with --partition: seconds until the link is healed (default 5)")
    ap.add_argument("--out", default=None,
                    help="write failover.jsonl here (hosts.jsonl with --hosts, "
                         "partition.jsonl with --partition)")
    ap.add_argument("--work_dir", default=None, help="fleets' folders (default: a temp dir)")
    ap.add_argument("--consistency", choices=["asp", "bsp"], default="asp",
                    help="the shards' --consistency (bsp: replication after aggregation)")
    a = ap.parse_args()
    if (a.partition or a.link or a.shard_hosts) and not a.hosts:
        ap.error("--partition, --link and --shard_hosts need --hosts")
    import tempfile
    work = a.work_dir or tempfile.mkdtemp(prefix="failover-")
    lines = []
    for i in range(a.repeats):
        rec = run_once(a.bin_dir, os.path.join(work, "r%02d" % i), servers=a.servers,
                       workers=a.workers, epochs=a.epochs, victim_group=i % a.servers,
                       hosts=a.hosts, shard_hosts=a.shard_hosts, link=a.link,
                       partition_s=a.partition_s if a.partition else None,
                       consistency=a.consistency)
        rec["repeat"] = i
        rec["consistency"] = a.consistency
        line = json.dumps(rec, sort_keys=True)
        print(line, flush=True)
        lines.append(rec)
    gaps = [r["gap_s"] for r in lines if r["gap_s"] is not None]
    summary = {"summary": True, "repeats": len(lines), "ok": sum(r["ok"] for r in lines),
               "gap_s_median": statistics.median(gaps) if gaps else None,
               "gap_s_min": min(gaps) if gaps else None, "gap_s_max": max(gaps) if gaps else None,
               "lost": sum(r["lost"] for r in lines), "extra": sum(r["extra"] for r in lines),
               "missing_groups": sum(len(r["missing_groups"]) for r in lines),
               "mode": lines[0]["mode"] if lines else None, "hosts": a.hosts,
               "shard_hosts": a.shard_hosts, "link": a.link, "servers": a.servers,
               "workers": a.workers, "epochs": a.epochs, "load": os.getloadavg()}
    print(json.dumps(summary, sort_keys=True), flush=True)
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        name = "partition.jsonl" if a.partition else "hosts.jsonl" if a.hosts else "failover.jsonl"
        with open(os.path.join(a.out, name), "w") as f:
            for r in lines + [summary]:
                f.write(json.dumps(r, sort_keys=True) + "\n")
    if not a.work_dir:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if (summary["lost"] == 0 and summary["ok"] == len(lines)
                 and not summary["missing_groups"]) else 1


if __name__ == "__main__":
    sys.exit(main())
