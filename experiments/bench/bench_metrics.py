#!/usr/bin/env python3
"""ps_bench_metrics: what serving Prometheus metrics costs a training fleet.

One shard + one ps_worker (ASP, the 784-256-128-10 MLP, batch 64, one BLAS thread,
--prefetch_ahead: the fastest configuration, so any cost shows most), trained in
interleaved repeats of four variants within the same run:

  off        no metrics endpoint (the baseline)
  on         both processes serve /metrics, nobody scrapes
  scrape_1s  both are scraped every second, as Prometheus would
  scrape_50ms  every 50 ms (a stress case: 20x a usual interval)

Prints one JSON object per line: per variant the median and min/max of the worker's
samples/s over the repeats, the ratio of the medians to `off` and the spread of the
per-repeat ratios (ratio_spread); then one line with the time a scrape takes (median
over all scrapes; ratio = that time over the 1 s scrape interval, baseline
"scrape_interval_1s"). Goal (goals.json): scrape_1s >= 0.98 of off.

Usage: experiments/bench/bench_metrics.py [--bin_dir build/bin] [--steps 2000]
       [--repeats 5] [--quick]
"""
import argparse
import json
import os
import statistics
import subprocess
import tempfile
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
from bench_worker import start_server, stop, summary

VARIANTS = {"off": None, "on": 0, "scrape_1s": 1.0, "scrape_50ms": 0.05}


def wait_file(path, proc, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if os.path.exists(path):
            text = open(path).read().strip()
            if text:
                return int(text)
        if proc.poll() is not None:
            raise RuntimeError("process exited before writing " + path)
        time.sleep(0.01)
    raise RuntimeError("no " + path)


class Scraper(threading.Thread):
    def __init__(self, ports, period):
        super().__init__(daemon=True)
        self.ports, self.period = ports, period
        self.stop_flag = threading.Event()
        self.latencies = []

    def run(self):
        while not self.stop_flag.wait(self.period):
            for port in self.ports:
                t0 = time.perf_counter()
                try:
                    with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port,
                                                timeout=5) as r:
                        r.read()
                except OSError:
                    continue  # the worker finished between two scrapes
                self.latencies.append(time.perf_counter() - t0)


def run_once(bin_dir, tmp, steps, variant):
    period = VARIANTS[variant]
    metrics = period is not None
    sport = os.path.join(tmp, "server.port")
    wport = os.path.join(tmp, "worker.port")
    for p in (sport, wport):
        if os.path.exists(p):
            os.unlink(p)
    extra = ["--metrics_port=-1", "--metrics_port_file=" + sport] if metrics else []
    server, ep = start_server(bin_dir, tmp, 1, extra)
    scraper = None
    try:
        argv = [os.path.join(bin_dir, "ps_worker"), "--servers=" + ep, "--rank=0",
                "--num_workers=1", "--epochs=0", "--max_steps=%d" % steps, "--batch=64",
                "--threads=1", "--log_every=0", "--eval=false", "--prefetch_ahead"]
        if metrics:
            argv += ["--metrics_port=-1", "--metrics_port_file=" + wport]
        worker = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                  text=True)
        if period:
            ports = [wait_file(sport, server), wait_file(wport, worker)]
            scraper = Scraper(ports, period)
            scraper.start()
        out, _ = worker.communicate(timeout=600)
        if worker.returncode != 0:
            raise RuntimeError("ps_worker failed (%d)" % worker.returncode)
        return summary(out)["samples_per_s"], (scraper.latencies if scraper else [])
    finally:
        if scraper:
            scraper.stop_flag.set()
            scraper.join()
        stop(server)


def ratio_spread(values):
    return {"median": round(statistics.median(values), 4), "min": round(min(values), 4),
            "max": round(max(values), 4), "n": len(values)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin_dir", default=os.path.join(HERE, "..", "..", "build", "bin"))
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="200 steps, 1 repeat (CI smoke run)")
    o = ap.parse_args()
    if o.quick:
        o.steps, o.repeats = 200, 1
    results = {v: [] for v in VARIANTS}
    latencies = []
    with tempfile.TemporaryDirectory(prefix="bench-metrics-") as tmp:
        for _ in range(o.repeats):
            for v in VARIANTS:  # interleaved: drifts of the machine hit every variant
                sps, lat = run_once(o.bin_dir, tmp, o.steps, v)
                results[v].append(sps)
                latencies += lat
    base = statistics.median(results["off"])
    for v, xs in results.items():
        med = statistics.median(xs)
        print(json.dumps({"bench": "metrics_overhead", "variant": v, "steps": o.steps,
                          "repeats": o.repeats, "samples_per_s_median": round(med, 1),
                          "samples_per_s_min": round(min(xs), 1),
                          "samples_per_s_max": round(max(xs), 1),
                          "baseline": "off", "ratio": round(med / base, 4),
                          "ratio_spread": ratio_spread([x / o for x, o in
                                                        zip(xs, results["off"])])}),
              flush=True)
    if latencies:
        med = statistics.median(latencies)
        print(json.dumps({"bench": "metrics_scrape", "scrapes": len(latencies),
                          "latency_ms_median": round(1e3 * med, 3),
                          "latency_ms_max": round(1e3 * max(latencies), 3),
                          "baseline": "scrape_interval_1s", "ratio": round(med / 1.0, 5)}),
              flush=True)


if __name__ == "__main__":
    main()
