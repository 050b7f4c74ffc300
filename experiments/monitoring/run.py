#!/usr/bin/env python3
"""A fleet watched by Prometheus: what `psrun --metrics --prometheus` records.

  experiments/monitoring/run.py --bin_dir build/bin --out experiments/results/monitoring

Runs one local fleet (2 shards, 3 ps_worker ranks, SSP with bound 2, Fashion-MNIST)
under `psrun --metrics --prometheus`, captures `ps_ctl top` against the live
shards, then reopens the run's Prometheus data (as `launch/psmon` does) and reads
series through the HTTP API (`/api/v1/query_range`): samples/s, training loss,
staleness quantiles, pull wait, bytes and compression ratio. Writes
series.csv (time_s, series, value), top.txt, fleet.txt (the psrun summary) and
a gnuplot PNG of the series (with --screenshot also Prometheus' own graph page
as headless Chromium renders it: prometheus_graph.png), and checks that the stored counters agree with
the run's summary.json. --quick: 1 epoch on a subset (for CI-sized runs).
"""
import argparse
import csv
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

HERE = os.path.dirname(os.path.realpath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "launch"))  # pslaunch, psstudy_lib (expkit/__init__.py)

from pslaunch import monitoring  # noqa: E402
from psstudy_lib.plots import quote  # noqa: E402  (text into gnuplot: single-quoted)

PSRUN = os.path.join(ROOT, "launch", "psrun")

# (series name, PromQL): what a person watching a run looks at.
SERIES = [
    ("samples_per_s", "sum(rate(asyncps_worker_samples_total[5s]))"),
    ("train_loss", "avg(asyncps_worker_train_loss)"),
    ("staleness_p50", "histogram_quantile(0.5, sum by (le) "
                      "(rate(asyncps_shard_staleness_bucket[5s])))"),
    ("staleness_p99", "histogram_quantile(0.99, sum by (le) "
                      "(rate(asyncps_shard_staleness_bucket[5s])))"),
    ("pull_wait_p50_s", "histogram_quantile(0.5, sum by (le) "
                        "(rate(asyncps_shard_pull_wait_seconds_bucket[5s])))"),
    ("push_per_s", "sum(rate(asyncps_shard_pushes_total[5s]))"),
    ("push_wire_mb_per_s",
     'sum(rate(asyncps_shard_push_bytes_total{kind="wire"}[5s])) / 1e6'),
]


def query_range(base, expr, start, end, step):
    params = {"query": expr, "start": "%.3f" % start, "end": "%.3f" % end,
              "step": "%gs" % step}
    url = base + "/api/v1/query_range?" + urllib.parse.urlencode(params)
    with urllib.request.urlopen(url, timeout=30) as r:
        doc = json.loads(r.read().decode())
    if doc.get("status") != "success":
        raise RuntimeError("query_range %r: %s" % (expr, doc))
    return doc["data"]["result"]


def wait_for(path, timeout_s):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        try:
            with open(path) as f:
                return json.load(f)
        except (OSError, ValueError):
            time.sleep(0.2)
    return None


def capture_top(ctl, run_dir, out_path, want_shards, iterations):
    """ps_ctl top against the live shards, `iterations` refreshes, plain text."""
    pids = None
    deadline = time.time() + 60
    while time.time() < deadline:
        pids = wait_for(os.path.join(run_dir, "pids.json"), 5)
        eps = [p.get("endpoint") for p in (pids or {}).get("procs", []) if p.get("endpoint")]
        if len(eps) >= want_shards:
            break
        time.sleep(0.5)
    else:
        return "no shard endpoints in pids.json"
    time.sleep(15)  # let every worker get going
    argv = [ctl, "--servers=" + ",".join(eps), "top", "--interval_ms=1000",
            "--iterations=%d" % iterations, "--clear=false"]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    with open(out_path, "w") as f:
        f.write("$ ps_ctl --servers=... top --interval_ms=1000 --iterations=%d --clear=false\n"
                % iterations)
        f.write(r.stdout)
        if r.returncode:
            f.write("(exit %d) %s\n" % (r.returncode, r.stderr))
    return None if r.returncode == 0 else r.stderr


# Panels of the Prometheus graph page in the screenshot.
SCREENSHOT_QUERIES = [
    "histogram_quantile(0.5, sum by (le) (rate(asyncps_shard_staleness_bucket[5s])))",
    "histogram_quantile(0.99, sum by (le) (rate(asyncps_shard_staleness_bucket[5s])))",
    "asyncps_worker_train_loss",
]
CHROMIUM = "/usr/bin/chromium"


def screenshot(base, start, end, png):
    """Prometheus' own graph page over [start, end], as headless Chromium renders it."""
    if not os.access(CHROMIUM, os.X_OK):
        print("no %s (Debian package chromium): no screenshot" % CHROMIUM)
        return False
    # The page keeps minutes of its end time: end at the next whole minute.
    end_m = (int(end) // 60 + 1) * 60
    end_s = time.strftime("%Y-%m-%d %H:%M", time.gmtime(end_m))
    params = {}
    for i, q in enumerate(SCREENSHOT_QUERIES):
        params["g%d.expr" % i] = q
        params["g%d.tab" % i] = "0"
        params["g%d.range_input" % i] = "%ds" % (end_m - int(start) + 5)
        params["g%d.end_input" % i] = end_s
        params["g%d.moment_input" % i] = end_s
    url = base + "/graph?" + urllib.parse.urlencode(params)
    with tempfile.TemporaryDirectory(prefix="asyncps-chromium-") as profile:
        r = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
                            "--hide-scrollbars", "--user-data-dir=" + profile,
                            "--window-size=1400,2300", "--virtual-time-budget=20000",
                            "--screenshot=" + png, url],
                           capture_output=True, text=True, timeout=180)
    ok = r.returncode == 0 and os.path.exists(png)
    if not ok:
        print("chromium failed (%d): %s" % (r.returncode, r.stderr[-500:]))
    return ok


def plot(out_dir, rows):
    if not shutil.which("gnuplot"):
        print("gnuplot missing: no plot")
        return
    by = {}
    for t, name, v in rows:
        by.setdefault(name, []).append((t, v))
    for name, pts in by.items():
        with open(os.path.join(out_dir, "%s.dat" % name), "w") as f:
            for t, v in pts:
                f.write("%.2f %.6g\n" % (t, v))
    panels = [("samples/s (all workers)", ["samples_per_s"]),
              ("training loss (mean of workers)", ["train_loss"]),
              ("staleness in shard updates since the weights were read, p50 and p99",
               ["staleness_p50", "staleness_p99"]),
              ("pushes/s and pushed MB/s (wire), all shards", ["push_per_s", "push_wire_mb_per_s"])]
    gp = os.path.join(out_dir, "series.gp")
    with open(gp, "w") as f:
        f.write("set terminal pngcairo size 1200,800 font ',10' noenhanced\n")
        f.write("set output %s\n" % quote(os.path.join(out_dir, "series.png")))
        f.write("set multiplot layout 2,2 title %s\n" % quote(
            "asyncps fleet as Prometheus recorded it (2 shards, 3 workers, SSP s=2; "
            "scraped every 1 s)"))
        f.write("set xlabel %s\nset grid\n" % quote("seconds since the first scrape"))
        for title, names in panels:
            f.write("set title %s\n" % quote(title))
            plots = ["%s using 1:2 with lines lw 2 title %s" %
                     (quote(os.path.join(out_dir, n + ".dat")), quote(n))
                     for n in names if n in by]
            f.write("plot " + ", ".join(plots) + "\n" if plots else "clear\n")
        f.write("unset multiplot\n")
    subprocess.run(["gnuplot", gp], check=True)
    for name in by:
        os.remove(os.path.join(out_dir, "%s.dat" % name))
    # Keep the script readable without the deleted data files.
    os.rename(gp, os.path.join(out_dir, "series.gp.txt"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin_dir", default=os.path.join(ROOT, "build", "bin"))
    ap.add_argument("--out", default=os.path.join(ROOT, "experiments", "results", "monitoring"))
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--screenshot", action="store_true",
                    help="also a PNG of Prometheus' graph page (headless Chromium)")
    o = ap.parse_args()
    if not os.access(monitoring.PROMETHEUS_BIN, os.X_OK):
        print("SKIP: %s missing (Debian package prometheus)" % monitoring.PROMETHEUS_BIN)
        return 77
    os.makedirs(o.out, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="asyncps-monitoring-")
    run_dir = os.path.join(tmp, "run")
    worker = ["--epochs=%d" % (1 if o.quick else o.epochs), "--batch=64"]
    if o.quick:
        worker += ["--max_steps=300", "--eval=false"]
    argv = [sys.executable, PSRUN, "--servers", "2", "--workers", "3", "--run_dir", run_dir,
            "--bin_dir", o.bin_dir, "--metrics", "--prometheus", "--scrape_interval", "1",
            "--progress", "off", "--server_flags", "--consistency=ssp --staleness=2 --lr=0.05",
            "--"] + worker
    t0 = time.time()
    failures = []
    with open(os.path.join(o.out, "psrun.out"), "w") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
        try:
            err = capture_top(os.path.join(o.bin_dir, "ps_ctl"), run_dir,
                              os.path.join(o.out, "top.txt"), 2, 3 if o.quick else 5)
            if err:
                failures.append("ps_ctl top: %s" % err)
            rc = proc.wait(timeout=3600)
        finally:
            if proc.poll() is None:
                proc.terminate()
                proc.wait()
    wall = time.time() - t0
    summary = wait_for(os.path.join(run_dir, "summary.json"), 5)
    if rc != 0 or not summary or not summary.get("ok"):
        print("psrun failed (exit %s); see %s/psrun.out" % (rc, o.out))
        return 1

    pdir = os.path.join(run_dir, "prometheus")
    cfg = os.path.join(pdir, "reread.yml")
    monitoring.write_json_atomic(cfg, {"global": {"scrape_interval": "1m"},
                                       "scrape_configs": []})
    prom = monitoring.Prometheus(cfg, os.path.join(pdir, "data"),
                                 os.path.join(pdir, "reread.log"))
    prom.start()
    try:
        # The span of the data: first and last scrape of any worker.
        bounds = query_range(prom.url, "count(asyncps_worker_samples_total)",
                             t0 - 5, time.time(), 1)
        if not bounds:
            raise RuntimeError("no worker series stored")
        ts = [float(t) for t, _ in bounds[0]["values"]]
        start, end = min(ts), max(ts)
        rows = []
        for name, expr in SERIES:
            for series in query_range(prom.url, expr, start, end, 1):
                for t, v in series["values"]:
                    v = float(v)
                    if v == v and abs(v) != float("inf"):
                        rows.append((float(t) - start, name, v))
        for name, _ in SERIES:
            if not any(n == name for _, n, _ in rows):
                failures.append("no points for %s" % name)
        # A --quick run can end within one 5 s rate window on a quiet machine.
        if not o.quick and not any(n == "samples_per_s" and v > 0 for _, n, v in rows):
            failures.append("samples/s never above 0")
        # Stored counters against the run's own totals (same thing counted).
        steps = prom.query("sum(max_over_time(asyncps_worker_steps_total[1h]))", at=end)
        stored = float(steps["result"][0]["value"][1]) if steps["result"] else 0.0
        totals = summary.get("totals") or {}
        want = float(totals.get("steps", 0))
        check = {"steps_in_prometheus": stored, "steps_in_summary_json": want}
        if stored != want:
            failures.append("steps: Prometheus %g, summary.json %g" % (stored, want))
        if o.screenshot:
            screenshot(prom.url, start, end, os.path.join(o.out, "prometheus_graph.png"))
    finally:
        prom.stop()

    with open(os.path.join(o.out, "series.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["time_s", "series", "value"])
        for t, name, v in rows:
            w.writerow(["%.1f" % t, name, "%.6g" % v])
    with open(os.path.join(o.out, "fleet.json"), "w") as f:
        json.dump({"command": " ".join(argv[1:]).replace(run_dir, "RUN_DIR"),
                   "wall_s": round(wall, 1), "load_avg": os.getloadavg(),
                   "check": check, "totals": totals,
                   "monitoring": summary.get("monitoring")}, f, indent=1, default=str)
    plot(o.out, rows)
    shutil.rmtree(tmp, ignore_errors=True)
    for msg in failures:
        print("FAIL: " + msg)
    print("wrote %s (%d points, %.0f s)" % (o.out, len(rows), wall))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
