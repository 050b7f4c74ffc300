#!/usr/bin/env python3
"""Hostile soak (issue 13): a ps_server shard built with ASan+UBSan receives
--messages structure-aware hostile requests (ps_hostile_fuzz: well-formed
requests of every kind with extreme and random values) while a real
ps_worker trains Fashion-MNIST against it; then the same training runs
undisturbed for the accuracy baseline.

Checks and reports (one JSON object, plus files in --out):
  crashes   the shard is alive at the end and its log holds no ASan/UBSan
            report; it exits 0 on an admin shutdown
  hangs     every hostile request answered within --deadline_ms
  memory    the shard's RSS sampled every second vs --budget_mb, and the
            shard's own budget accounting (peak bytes in use, refusals)
  accuracy  the worker's final test accuracy vs the undisturbed run
  reasons   every rejection counted by reason (ps_ctl stats)

The shard runs with CURVE and an admin key the fuzzer does not hold, so the
fuzzer's checkpoint and shutdown requests are refused; ps_ctl (admin key)
reads the stats and shuts it down.

  experiments/chaos/hostile_soak.py --server_build build-asan --build build \\
      --messages 1000000 --epochs 4 --out experiments/results/hostile_soak
  experiments/chaos/hostile_soak.py --quick     # 20,000 messages, 1 epoch

With --model ctr the trained model is the click model (ps_ctr_worker) on
planted Criteo-format data (ps_criteo_gen), whose embedding table lives in
the shard's RocksDB behind a small --cache_mib cache (evictions, store reads
and write-backs under fire), and the fuzzer also sends hostile row refs for
that table (--tables=ctr.emb:<1+factor_dim>); the quality figure is the
test AUC and log loss instead of the accuracy. The fuzzer's dense chunk refs
are built for the MLP, so against the click model they exercise the
rejection paths of the dense part only.

  experiments/chaos/hostile_soak.py --model ctr --messages 200000 \
      --out experiments/results/hostile_soak_ctr
"""
import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

SUMMARY = re.compile(r"SUMMARY rank=0 final_test_acc=([-\d.]+)")
CTR_SUMMARY = re.compile(r"SUMMARY rank=0 test_logloss=([-\d.]+) test_auc=([-\d.]+)")
CTR_FACTOR_DIM = 4
SANITIZER = re.compile(r"ERROR: AddressSanitizer|runtime error:|ERROR: LeakSanitizer")


def rss_kib(pid):
    try:
        for line in open("/proc/%d/status" % pid):
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def keygen(ctl, prefix):
    subprocess.run([ctl, "keygen", "--out=" + prefix], check=True, capture_output=True)
    return prefix + ".key", prefix + ".pub"


def wait_ready(path, proc, timeout):
    end = time.time() + timeout
    while time.time() < end:
        if os.path.exists(path) and open(path).read().strip():
            return open(path).read().strip()
        if proc.poll() is not None:
            raise RuntimeError("ps_server exited during start (%s)" % proc.returncode)
        time.sleep(0.05)
    raise RuntimeError("ps_server not ready within %d s" % timeout)


def ctr_data(a, run_dir):
    """Planted Criteo-format train and test files (made once per soak)."""
    d = {"train": os.path.join(run_dir, "ctr-train.txt"),
         "test": os.path.join(run_dir, "ctr-test.txt"),
         "planted": os.path.join(run_dir, "ctr-planted.json")}
    if not os.path.exists(d["planted"]):
        subprocess.run([os.path.join(a.build, "bin", "ps_criteo_gen"), "--train=" + d["train"],
                        "--test=" + d["test"], "--train_examples=%d" % a.ctr_examples,
                        "--test_examples=20000", "--vocab=%d" % a.ctr_vocab,
                        "--seed=%d" % a.seed, "--stats_json=" + d["planted"]],
                       check=True, stdout=subprocess.DEVNULL)
    return d


def run(a, run_dir, tag, fuzz):
    """One training run; with `fuzz`, hostile traffic beside it."""
    sbin = os.path.join(a.server_build, "bin")
    bin_ = os.path.join(a.build, "bin")
    keys = {n: keygen(os.path.join(bin_, "ps_ctl"), os.path.join(run_dir, "%s-%s" % (tag, n)))
            for n in ("server", "admin", "fuzz")}
    admins = os.path.join(run_dir, tag + "-admins")
    with open(admins, "w") as f:
        f.write(open(keys["admin"][1]).read())
    ready = os.path.join(run_dir, tag + ".ready")
    env = dict(os.environ)
    env["ASAN_OPTIONS"] = "detect_leaks=1:abort_on_error=1:quarantine_size_mb=%d" % a.quarantine_mb
    env["UBSAN_OPTIONS"] = "halt_on_error=1:print_stacktrace=1"
    slog = os.path.join(run_dir, tag + ".shard.log")
    shard = subprocess.Popen(
        [os.path.join(sbin, "ps_server"), "--endpoint=tcp://127.0.0.1:*", "--ready_file=" + ready,
         "--num_workers=%d" % a.num_workers, "--consistency=asp", "--optimizer=sgd",
         "--lr=%g" % a.lr, "--worker_timeout_s=10", "--checkpoint_every_s=30",
         "--db_path=" + os.path.join(run_dir, tag + ".db"),
         "--memory_budget_mb=%d" % a.budget_mb, "--max_park_s=2",
         "--curve_secret_key=" + keys["server"][0], "--curve_admin_clients=" + admins]
        + (["--embedding_cache_bytes=%d" % (a.cache_mib << 20)] if a.model == "ctr" else []),
        stdout=open(slog, "wb"), stderr=subprocess.STDOUT, env=env)
    endpoint = wait_ready(ready, shard, 60)
    wlog = os.path.join(run_dir, tag + ".worker.log")
    if a.model == "ctr":
        data = ctr_data(a, run_dir)
        wargs = [os.path.join(bin_, "ps_ctr_worker"), "--servers=" + endpoint, "--rank=0",
                 "--num_workers=%d" % a.num_workers, "--train=" + data["train"],
                 "--test=" + data["test"], "--planted_json=" + data["planted"],
                 "--batch=256", "--epochs=%d" % a.epochs,
                 "--factor_dim=%d" % CTR_FACTOR_DIM, "--init_scale=0.1", "--seed=%d" % a.seed,
                 "--log_every=500", "--timeout_s=300"]
    else:
        wargs = [os.path.join(bin_, "ps_worker"), "--servers=" + endpoint, "--rank=0",
                 "--num_workers=%d" % a.num_workers, "--epochs=%d" % a.epochs, "--eval=true",
                 "--seed=%d" % a.seed, "--log_every=500", "--timeout_s=300",
                 "--slowdown=%g" % (a.worker_slowdown if fuzz else 1.0)]
    worker = subprocess.Popen(wargs + ["--curve_server_key=" + keys["server"][1]],
                              stdout=open(wlog, "wb"), stderr=subprocess.STDOUT)
    fuzzer = None
    flog = os.path.join(run_dir, tag + ".fuzz.json")
    t0 = time.time()
    ctl = [os.path.join(bin_, "ps_ctl"), "--servers=" + endpoint, "--timeout_ms=20000",
           "--curve_server_key=" + keys["server"][1], "--curve_secret_key=" + keys["admin"][0]]
    if fuzz:
        # The worker registers the model first (a hostile registration of
        # another model would make the worker's own fail, as it must).
        end = time.time() + 120
        while time.time() < end:
            out = subprocess.run(ctl + ["stats"], capture_output=True, text=True)
            if '"registered":true' in out.stdout:
                break
            time.sleep(0.2)
        fuzzer = subprocess.Popen(
            [os.path.join(bin_, "ps_hostile_fuzz"), "--server=" + endpoint,
             "--messages=%d" % a.messages, "--seed=%d" % a.seed,
             "--num_workers=%d" % a.num_workers, "--deadline_ms=%d" % a.deadline_ms,
             "--model_seed=%d" % a.seed, "--curve_server_key=" + keys["server"][1],
             "--curve_secret_key=" + keys["fuzz"][0], "--report=" + flog]
            + (["--tables=ctr.emb:%d" % (1 + CTR_FACTOR_DIM)] if a.model == "ctr" else []),
            stdout=subprocess.DEVNULL, stderr=open(os.path.join(run_dir, tag + ".fuzz.log"), "wb"))
    samples = []
    worker_s = None
    while True:
        samples.append((round(time.time() - t0, 1), rss_kib(shard.pid)))
        if worker_s is None and worker.poll() is not None:
            worker_s = round(time.time() - t0, 1)
        if worker.poll() is not None and (fuzzer is None or fuzzer.poll() is not None):
            break
        if shard.poll() is not None:
            break
        time.sleep(1)
    fuzz_s = round(time.time() - t0, 1) if fuzzer else None
    alive = shard.poll() is None
    stats = None
    if alive:
        out = subprocess.run(ctl + ["stats"], capture_output=True, text=True)
        try:
            stats = json.loads(out.stdout)["shards"][0]["stats"]
        except (ValueError, KeyError, IndexError, TypeError):
            stats = None
        subprocess.run(ctl + ["shutdown"], capture_output=True)
    try:
        shard_rc = shard.wait(timeout=60)
    except subprocess.TimeoutExpired:
        shard.kill()
        shard_rc = shard.wait()
    for p in (worker, fuzzer):
        if p is not None and p.poll() is None:
            p.kill()
            p.wait()
    wtext = open(wlog, errors="replace").read()
    shard_text = open(slog, errors="replace").read()
    rss = [s for _, s in samples if s is not None]
    result = {"tag": tag, "worker_rc": worker.returncode}
    if a.model == "ctr":
        m = CTR_SUMMARY.search(wtext)
        result["test_logloss"] = float(m.group(1)) if m else None
        result["test_auc"] = float(m.group(2)) if m else None
    else:
        m = SUMMARY.search(wtext)
        result["final_test_acc"] = float(m.group(1)) if m else None
    result.update({
        "worker_wall_s": worker_s, "fuzz_wall_s": fuzz_s,
        "shard_alive_at_end": alive, "shard_exit_code": shard_rc,
        "sanitizer_reports": len(SANITIZER.findall(shard_text)),
        "shard_rss_max_kib": max(rss) if rss else None,
        "shard_rss_last_kib": rss[-1] if rss else None,
        "budget_mb": a.budget_mb,
        "memory_budget": stats.get("memory_budget") if stats else None,
        "rejected": stats.get("rejected") if stats else None,
        "rejected_total": stats.get("rejected_total") if stats else None,
        "pushes": stats.get("pushes") if stats else None,
    })
    if a.model == "ctr" and stats:
        result["sparse"] = stats.get("sparse")
    if fuzzer is not None:
        try:
            result["fuzz"] = json.load(open(flog))
        except (OSError, ValueError):
            result["fuzz"] = None
        result["fuzz_rc"] = fuzzer.returncode
    with open(os.path.join(run_dir, tag + ".rss.csv"), "w") as f:
        f.write("t_s,rss_kib\n")
        for t, s in samples:
            f.write("%s,%s\n" % (t, "" if s is None else s))
    return result


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build", help="ps_worker, ps_ctl, ps_hostile_fuzz")
    ap.add_argument("--server_build", default="build-asan", help="the ASan+UBSan ps_server")
    ap.add_argument("--messages", type=int, default=1000000)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--num_workers", type=int, default=2)
    ap.add_argument("--worker_slowdown", type=float, default=1.0,
                    help="ps_worker --slowdown of the run beside the fuzzer (a sleep: "
                         "stretches training over the fuzz without using CPU)")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--budget_mb", type=int, default=512)
    ap.add_argument("--quarantine_mb", type=int, default=32)
    ap.add_argument("--deadline_ms", type=int, default=10000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default="", help="copy the run's files here")
    ap.add_argument("--model", choices=("mlp", "ctr"), default="mlp",
                    help="mlp: ps_worker on Fashion-MNIST; ctr: ps_ctr_worker on planted "
                         "Criteo-format data, with hostile row refs of its table")
    ap.add_argument("--cache_mib", type=int, default=4,
                    help="ctr: the shard's --embedding_cache_bytes, MiB")
    ap.add_argument("--ctr_examples", type=int, default=400000, help="ctr: training examples")
    ap.add_argument("--ctr_vocab", type=int, default=200000,
                    help="ctr: distinct values per categorical field")
    ap.add_argument("--quick", action="store_true", help="20,000 messages, 1 epoch")
    a = ap.parse_args()
    if a.quick:
        a.messages, a.epochs = 20000, 1
        a.ctr_examples = min(a.ctr_examples, 60000)
    run_dir = tempfile.mkdtemp(prefix="asyncps-hostile-")
    out = {"config": vars(a), "run_dir": run_dir}
    out["hostile"] = run(a, run_dir, "hostile", fuzz=True)
    out["baseline"] = run(a, run_dir, "baseline", fuzz=False)
    h, b = out["hostile"], out["baseline"]
    if h.get("final_test_acc") is not None and b.get("final_test_acc") is not None:
        out["accuracy_delta_points"] = round(100 * (h["final_test_acc"] - b["final_test_acc"]), 2)
    if h.get("test_auc") is not None and b.get("test_auc") is not None:
        out["auc_delta"] = round(h["test_auc"] - b["test_auc"], 4)
        out["logloss_delta"] = round(h["test_logloss"] - b["test_logloss"], 4)
    f = h.get("fuzz") or {}
    out["ok"] = bool(
        h["shard_alive_at_end"] and h["shard_exit_code"] == 0 and h["sanitizer_reports"] == 0
        and f.get("sent") == a.messages and f.get("answered") == a.messages
        and f.get("unanswered") == 0 and h["worker_rc"] == 0
        and h["memory_budget"] is not None
        and h["memory_budget"]["peak"] <= h["memory_budget"]["capacity"])
    print(json.dumps(out))
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "summary.json"), "w") as fo:
            json.dump(out, fo, indent=1)
        for name in ("hostile.rss.csv", "baseline.rss.csv"):
            src = os.path.join(run_dir, name)
            if os.path.exists(src):
                with open(src) as fi, open(os.path.join(a.out, name), "w") as fo:
                    fo.write(fi.read())
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    sys.exit(main())
