#!/usr/bin/python3
"""A sparse table many times larger than the shard's cache, trained.

Generates Criteo-format data from the planted model with a huge, heavy-tailed
vocabulary (ps_criteo_gen), starts one ps_server with RocksDB and a bounded
embedding cache, and trains the click model (ps_ctr_worker, rows of
1 + factor_dim floats with AdaGrad state beside them) with W workers. While
it runs, the shard's RSS is sampled every second and its `ps_ctl stats`
every few seconds (rows stored, cache bytes, hit rate, RocksDB reads and
writes, on-disk size). At the end: a checkpoint, the on-disk size of the
store (du), a CSV, a gnuplot PNG and a Markdown report.

    experiments/sparse_large/run.py --out experiments/results/sparse_large \
        --examples 1500000 --cache_mib 512 --factor_dim 31
    experiments/sparse_large/run.py --quick --out /tmp/sl   # CI smoke test

The table is "rows stored x bytes per cached row"; the run checks that it is
at least --min_ratio times the cache budget and that the peak RSS stays
within budget + the stated overhead (RocksDB block cache, two write buffers
of the key space, and a fixed process baseline). Exit status 1 when either
check fails.
"""
import argparse
import csv
import json
import os
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(os.path.dirname(os.path.dirname(HERE)), "launch"),
                 os.path.dirname(HERE)]  # expkit/__init__.py
from expkit import plots  # noqa: E402

MIB = 1 << 20


def rss_bytes(pid):
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def du_bytes(path):
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += os.stat(os.path.join(root, f)).st_size
            except OSError:
                pass
    return total


def ctl(bins, endpoint, cmd):
    out = subprocess.run([os.path.join(bins, "ps_ctl"), "--servers=" + endpoint,
                          "--timeout_ms=60000", cmd],
                         capture_output=True, text=True, timeout=120)
    try:
        return json.loads(out.stdout)
    except ValueError:
        return None


def table_stats(doc):
    try:
        sp = doc["shards"][0]["stats"]["sparse"]
        return sp, sp["tables"][0]
    except (KeyError, IndexError, TypeError):
        return None, None


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--bin_dir", default=os.path.join(
        os.path.dirname(os.path.dirname(HERE)), "build", "bin"))
    ap.add_argument("--out", required=True, help="results folder")
    ap.add_argument("--work", default="", help="data and store (default: out)")
    ap.add_argument("--examples", type=int, default=1500000)
    ap.add_argument("--test_examples", type=int, default=20000)
    ap.add_argument("--vocab", type=int, default=100000000)
    ap.add_argument("--zipf", type=float, default=1.05)
    ap.add_argument("--factor_dim", type=int, default=31)
    ap.add_argument("--cache_mib", type=int, default=512)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--max_steps", type=int, default=0,
                    help="steps per worker (0: one pass over its lines)")
    ap.add_argument("--checkpoint_s", type=int, default=600,
                    help="ps_server --checkpoint_every_s")
    ap.add_argument("--min_ratio", type=float, default=10.0)
    ap.add_argument("--overhead_mib", type=int, default=320,
                    help="stated overhead over the cache budget: RocksDB "
                         "block cache 64 + write buffers 2 x 64 + baseline")
    ap.add_argument("--reuse_data", action="store_true",
                    help="keep train/test files of an earlier run in --work")
    ap.add_argument("--quick", action="store_true",
                    help="tiny run for CI: 60000 examples, 4 MiB cache")
    a = ap.parse_args()
    if a.quick:
        a.examples, a.test_examples, a.cache_mib = 60000, 2000, 4
        a.factor_dim, a.vocab, a.batch = 15, 10000000, 512
        a.overhead_mib = 320
    bins = os.path.abspath(a.bin_dir)
    out = os.path.abspath(a.out)
    work = os.path.abspath(a.work or a.out)
    os.makedirs(out, exist_ok=True)
    os.makedirs(work, exist_ok=True)
    train, test = os.path.join(work, "train.txt"), os.path.join(work, "test.txt")
    planted = os.path.join(out, "planted.json")
    db = os.path.join(work, "shard0.db")
    for p in (db, db + ".cut"):
        subprocess.run(["rm", "-rf", p], check=True)

    t0 = time.time()
    if not (a.reuse_data and os.path.exists(planted) and
            os.path.exists(test)):
        subprocess.run([os.path.join(bins, "ps_criteo_gen"), "--train=" + train,
                        "--test=" + test, "--train_examples=%d" % a.examples,
                        "--test_examples=%d" % a.test_examples,
                        "--vocab=%d" % a.vocab, "--zipf=%g" % a.zipf,
                        "--stats_json=" + planted],
                       check=True, stdout=subprocess.DEVNULL)
    gen_s = time.time() - t0

    procs = []

    def stop_all():
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    ready = os.path.join(work, "shard0.ready")
    if os.path.exists(ready):
        os.remove(ready)
    server_log = open(os.path.join(out, "server.log"), "w")
    server = subprocess.Popen(
        [os.path.join(bins, "ps_server"), "--num_workers=%d" % a.workers,
         "--consistency=ssp", "--staleness=2", "--optimizer=adam",
         "--lr=0.003", "--db_path=" + db, "--ready_file=" + ready,
         "--embedding_cache_bytes=%d" % (a.cache_mib * MIB),
         "--checkpoint_every_s=%d" % a.checkpoint_s,
         "--worker_timeout_s=600"],
        stdout=server_log, stderr=subprocess.STDOUT)
    procs.append(server)
    try:
        for _ in range(300):
            if os.path.exists(ready):
                break
            if server.poll() is not None:
                raise RuntimeError("ps_server exited at start")
            time.sleep(0.1)
        endpoint = open(ready).read().strip()
        base_rss = rss_bytes(server.pid)
        workers = []
        for r in range(a.workers):
            log = open(os.path.join(out, "worker%d.log" % r), "w")
            args = [os.path.join(bins, "ps_ctr_worker"), "--servers=" + endpoint,
                    "--rank=%d" % r, "--num_workers=%d" % a.workers,
                    "--train=" + train, "--batch=%d" % a.batch,
                    "--factor_dim=%d" % a.factor_dim, "--log_every=200",
                    "--max_steps=%d" % a.max_steps,
                    "--timeout_s=1200", "--metrics_csv=" +
                    os.path.join(out, "metrics%d.csv" % r)]
            if r == 0:
                args += ["--test=" + test, "--planted_json=" + planted]
            w = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
            procs.append(w)
            workers.append(w)
        samples = []  # (t, rss, rows, cache_bytes, hit_rate, disk, reads, writes)
        start = time.time()
        last_stats, st = 0.0, (0, 0, 0.0, 0, 0, 0)
        while any(w.poll() is None for w in workers):
            now = time.time() - start
            if now - last_stats >= (2 if a.quick else 10):
                sp, t = table_stats(ctl(bins, endpoint, "stats"))
                if t:
                    st = (t["admitted"], sp["cache_bytes"], t["hit_rate"],
                          t["disk_bytes"], t["rocksdb_reads"], t["rocksdb_writes"])
                last_stats = now
            samples.append((now, rss_bytes(server.pid)) + st)
            time.sleep(1 if not a.quick else 0.2)
        for r, w in enumerate(workers):
            if w.returncode != 0:
                raise RuntimeError("worker %d failed: see worker%d.log" % (r, r))
        train_s = time.time() - start
        ctl(bins, endpoint, "checkpoint")
        doc = ctl(bins, endpoint, "stats")
        sp, t = table_stats(doc)
        peak = max(s[1] for s in samples)
        samples.append((time.time() - start, rss_bytes(server.pid), t["admitted"],
                        sp["cache_bytes"], t["hit_rate"], t["disk_bytes"],
                        t["rocksdb_reads"], t["rocksdb_writes"]))
    finally:
        stop_all()
        server_log.close()
    disk = du_bytes(db)
    row_bytes = 4 * (1 + a.factor_dim) * 2 + 32  # weights + AdaGrad + meta
    table_bytes = t["admitted"] * row_bytes
    ratio = table_bytes / float(a.cache_mib * MIB)
    bound = (a.cache_mib + a.overhead_mib) * MIB
    summary = open(os.path.join(out, "worker0.log")).read()
    line = [l for l in summary.splitlines() if l.startswith("SUMMARY")]

    with open(os.path.join(out, "rss.csv"), "w", newline="") as f:
        wr = csv.writer(f)
        wr.writerow(["t_s", "rss_bytes", "rows", "cache_bytes", "hit_rate",
                     "disk_bytes", "rocksdb_reads", "rocksdb_writes"])
        wr.writerows(samples)
    if plots.have_gnuplot():
        plots.line_plot(
            os.path.join(out, "rss.png"),
            "ps_server RSS while training a %.1fx-cache table" % ratio,
            "seconds", "MiB",
            [("shard RSS", [(s[0], s[1] / MIB) for s in samples]),
             ("cache budget", [(0, a.cache_mib), (samples[-1][0], a.cache_mib)]),
             ("budget + stated overhead",
              [(0, bound / MIB), (samples[-1][0], bound / MIB)]),
             ("table (rows x row bytes) / 10",
              [(s[0], s[2] * row_bytes / MIB / 10) for s in samples])],
            points=False, key="top left")
    result = {
        "examples": a.examples, "workers": a.workers, "vocab": a.vocab,
        "zipf": a.zipf, "row_floats": 1 + a.factor_dim,
        "cache_budget_bytes": a.cache_mib * MIB, "rows": t["admitted"],
        "rows_estimate_rocksdb": t["rows"],
        "row_bytes_cached": row_bytes, "table_bytes": table_bytes,
        "table_over_cache": round(ratio, 2), "peak_rss_bytes": peak,
        "rss_at_start_bytes": base_rss, "stated_overhead_bytes":
        a.overhead_mib * MIB, "rss_bound_bytes": bound,
        "rss_within_bound": peak <= bound, "store_disk_bytes": disk,
        "hit_rate": t["hit_rate"], "rocksdb_reads": t["rocksdb_reads"],
        "rocksdb_writes": t["rocksdb_writes"], "evictions": t["evictions"],
        "train_s": round(train_s, 1), "generate_s": round(gen_s, 1),
        "summary": line[0] if line else ""}
    with open(os.path.join(out, "result.json"), "w") as f:
        json.dump(result, f, indent=2)
    with open(os.path.join(out, "REPORT.md"), "w") as f:
        f.write("# A sparse table %.1fx the shard's cache, trained\n\n" % ratio)
        f.write("Command: `experiments/sparse_large/run.py %s`\n\n" %
                " ".join(sys.argv[1:]))
        f.write("| figure | value |\n|---|---|\n")
        for k, v in [
                ("examples trained", "%d (%d workers, batch %d, from a file "
                 "of %d)" % (a.max_steps * a.batch * a.workers
                             if a.max_steps else a.examples, a.workers,
                             a.batch, a.examples)),
                ("row", "%d floats + AdaGrad state" % (1 + a.factor_dim)),
                ("rows stored", "{:,}".format(t["admitted"])),
                ("table (rows x %d B cached)" % row_bytes,
                 "%.0f MiB = %.1fx the %d MiB cache" %
                 (table_bytes / MIB, ratio, a.cache_mib)),
                ("peak shard RSS", "%.0f MiB (bound: budget + %d MiB = %.0f MiB)"
                 % (peak / MIB, a.overhead_mib, bound / MIB)),
                ("RSS at start", "%.0f MiB" % (base_rss / MIB)),
                ("store on disk (du)", "%.0f MiB" % (disk / MIB)),
                ("cache hit rate", "%.3f" % t["hit_rate"]),
                ("RocksDB reads / writes (rows)", "{:,} / {:,}".format(
                    t["rocksdb_reads"], t["rocksdb_writes"])),
                ("training time", "%.0f s" % train_s),
                ("worker 0", "`%s`" % (line[0] if line else "?"))]:
            f.write("| %s | %s |\n" % (k, v))
        f.write("\n![RSS](rss.png)\n")
    print(json.dumps(result, indent=2))
    ok = ratio >= a.min_ratio and peak <= bound
    if not ok:
        print("FAILED: ratio %.2f (need %.1f), peak RSS %d > bound %d?" %
              (ratio, a.min_ratio, peak, bound), file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
