#!/usr/bin/python3
"""The click model against the planted optimum, by data size.

For each configuration (vocabulary, training examples, epochs) this
generates Criteo-format data from the planted factorization machine
(ps_criteo_gen), trains the click model with W ps_ctr_worker processes
through S ps_server shards (RocksDB, SSP, an embedding cache smaller than the
table), and records the test log loss and AUC next to the Bayes-optimal ones
of the same test file. Writes results.csv and REPORT.md into --out.

    experiments/ctr_planted/run.py --out experiments/results/ctr_planted
    experiments/ctr_planted/run.py --quick --out /tmp/ctr   # a minute
"""
import argparse
import csv
import json
import os
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))

# (vocab, train examples, epochs)
FULL = [(10, 100000, 4), (1000, 400000, 3), (100000, 1000000, 2)]
QUICK = [(10, 60000, 3)]


def run_one(bins, work, vocab, n, epochs, shards, workers, cache_mib):
    tag = "v%d_n%d_e%d" % (vocab, n, epochs)
    d = os.path.join(work, tag)
    os.makedirs(d, exist_ok=True)
    train, test = os.path.join(d, "train.txt"), os.path.join(d, "test.txt")
    planted = os.path.join(d, "planted.json")
    subprocess.run([os.path.join(bins, "ps_criteo_gen"), "--train=" + train,
                    "--test=" + test, "--train_examples=%d" % n,
                    "--test_examples=20000", "--vocab=%d" % vocab,
                    "--stats_json=" + planted], check=True,
                   stdout=subprocess.DEVNULL)
    servers, eps = [], []
    try:
        for s in range(shards):
            ready = os.path.join(d, "ready%d" % s)
            if os.path.exists(ready):
                os.remove(ready)
            subprocess.run(["rm", "-rf", os.path.join(d, "db%d" % s),
                            os.path.join(d, "db%d.cut" % s)], check=True)
            servers.append(subprocess.Popen(
                [os.path.join(bins, "ps_server"), "--shard_id=%d" % s,
                 "--num_shards=%d" % shards, "--num_workers=%d" % workers,
                 "--consistency=ssp", "--staleness=1", "--optimizer=adam",
                 "--lr=0.003", "--db_path=" + os.path.join(d, "db%d" % s),
                 "--ready_file=" + ready,
                 "--embedding_cache_bytes=%d" % (cache_mib << 20)],
                stdout=open(os.path.join(d, "server%d.log" % s), "w"),
                stderr=subprocess.STDOUT))
            for _ in range(300):
                if os.path.exists(ready):
                    break
                time.sleep(0.1)
            eps.append(open(ready).read().strip())
        t0 = time.time()
        ws = []
        for r in range(workers):
            args = [os.path.join(bins, "ps_ctr_worker"),
                    "--servers=" + ",".join(eps), "--rank=%d" % r,
                    "--num_workers=%d" % workers, "--train=" + train,
                    "--batch=256", "--epochs=%d" % epochs, "--factor_dim=4",
                    "--init_scale=0.1", "--log_every=500", "--timeout_s=600"]
            if r == 0:
                args += ["--test=" + test, "--planted_json=" + planted]
            ws.append(subprocess.Popen(args, stdout=subprocess.PIPE,
                                       stderr=open(os.path.join(
                                           d, "worker%d.log" % r), "w"),
                                       text=True))
        out = [w.communicate()[0] for w in ws]
        wall = time.time() - t0
        if any(w.returncode for w in ws):
            raise RuntimeError("a worker failed in " + d)
    finally:
        for p in servers:
            p.terminate()
            p.wait()
    m = dict(re.findall(r"(\w+)=([-0-9.e]+)", out[0]))
    st = json.load(open(planted))
    return {"vocab": vocab, "train_examples": n, "epochs": epochs,
            "test_logloss": float(m["test_logloss"]),
            "bayes_logloss": st["test"]["bayes_logloss_sample"],
            "logloss_gap": float(m["logloss_gap"]),
            "test_auc": float(m["test_auc"]),
            "bayes_auc": st["test"]["bayes_auc"],
            "auc_gap": float(m["auc_gap"]),
            "examples_per_s_worker0": float(m["examples_per_s"]),
            "wall_s": round(wall, 1)}


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--bin_dir", default=os.path.join(
        os.path.dirname(os.path.dirname(HERE)), "build", "bin"))
    ap.add_argument("--out", required=True)
    ap.add_argument("--work", default="", help="data (default: out/work)")
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--cache_mib", type=int, default=16)
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    out = os.path.abspath(a.out)
    work = os.path.abspath(a.work or os.path.join(out, "work"))
    os.makedirs(out, exist_ok=True)
    rows = [run_one(os.path.abspath(a.bin_dir), work, v, n, e, a.shards,
                    a.workers, a.cache_mib)
            for v, n, e in (QUICK if a.quick else FULL)]
    with open(os.path.join(out, "results.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
        w.writeheader()
        w.writerows(rows)
    with open(os.path.join(out, "REPORT.md"), "w") as f:
        f.write("# Click model vs the planted optimum\n\n")
        f.write("Command: `experiments/ctr_planted/run.py %s` (%d shards, %d "
                "workers, SSP s=1, %d MiB embedding cache per shard, FM k=4, "
                "AdaGrad rows, Adam dense).\n\n" %
                (" ".join(sys.argv[1:]), a.shards, a.workers, a.cache_mib))
        f.write("| vocab/field | train ex. | epochs | test log loss | Bayes | "
                "gap | test AUC | Bayes AUC | ex/s (worker 0) |\n")
        f.write("|---|---|---|---|---|---|---|---|---|\n")
        for r in rows:
            f.write("| {vocab:,} | {train_examples:,} | {epochs} | "
                    "{test_logloss:.4f} | {bayes_logloss:.4f} | "
                    "{logloss_gap:.4f} | {test_auc:.4f} | {bayes_auc:.4f} | "
                    "{examples_per_s_worker0:.0f} |\n".format(**r))
    print(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
