"""Prometheus metrics of Python workers: the exporter (asyncps.metrics) serves the
same families as ps_worker, promtool accepts them, and psrun --metrics finds a
--worker_cmd worker's endpoint through the environment contract."""
import json
import os
import shutil
import subprocess
import sys
import threading
import urllib.request

import pytest

from conftest import EXAMPLES, need_data

from asyncps.metrics import TrainingLog

PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"


def sample(text, series):
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    return None


def fetch(port):
    with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=5) as r:
        return r.read().decode()


def test_training_log_exports_worker_metrics(tmp_path):
    port_file = str(tmp_path / "port")
    env = {"ASYNCPS_METRICS_PORT": "-1", "ASYNCPS_METRICS_PORT_FILE": port_file}
    log = TrainingLog(0, 3, None, log_every=0, stream=open(os.devnull, "w"), environ=env)
    port = int(open(port_file).read())
    assert port == log.exporter.port
    traffic = {"bytes_pushed_raw": 4000, "bytes_pushed_wire": 1000, "bytes_pulled": 4000,
               "pull_wait_ns": 2_000_000, "encode_ns": 500_000, "last_staleness": 3,
               "resends": 2}
    for step in range(3):
        log.step(step, 0, 32, 0.5 + step, 0.01, traffic)
    log.evaluated(0.75, 0.1)
    # A scrape from another thread while this one holds the GIL: served anyway.
    got = {}
    t = threading.Thread(target=lambda: got.update(text=fetch(port)))
    t.start()
    t.join(10)
    text = got["text"]
    assert sample(text, "asyncps_worker_steps_total") == 3
    assert sample(text, "asyncps_worker_samples_total") == 96
    assert sample(text, "asyncps_worker_train_loss") == 2.5
    assert sample(text, "asyncps_worker_test_accuracy") == 0.75
    assert sample(text, "asyncps_worker_compression_ratio") == 4
    assert sample(text, 'asyncps_worker_pushed_bytes_total{kind="wire"}') == 1000
    assert sample(text, "asyncps_worker_resends_total") == 2
    assert sample(text, "asyncps_worker_staleness_count") == 3
    assert sample(text, "asyncps_worker_encode_seconds_total") == pytest.approx(5e-4)
    if os.path.exists(PROMTOOL):
        r = subprocess.run([PROMTOOL, "check", "metrics"], input=text.encode(),
                           capture_output=True, timeout=30)
        assert r.returncode == 0 and not (r.stdout + r.stderr).strip(), r.stdout + r.stderr
    log.finish(3, traffic, out=open(os.devnull, "w"))


def test_no_exporter_without_the_variable():
    log = TrainingLog(0, 1, None, log_every=0, stream=open(os.devnull, "w"), environ={})
    assert log.exporter is None


def test_psrun_metrics_reaches_python_workers(tmp_path):
    need_data()
    from test_psrun import psrun
    run = str(tmp_path / "run")
    r = psrun(run, 1, "%s %s" % (sys.executable, os.path.join(EXAMPLES, "mlp.py")),
              ["--max_steps=20", "--log_every=10"], extra_psrun=["--metrics"])
    assert r.returncode == 0, r.stdout + r.stderr
    groups = json.load(open(os.path.join(run, "metrics", "targets.json")))
    jobs = sorted(g["labels"]["job"] for g in groups)
    assert jobs == ["asyncps_server", "asyncps_worker"], groups
    log = open(os.path.join(run, "worker-0.log")).read()
    assert "ASYNCPS_METRICS_PORT_FILE=" in log  # the contract, on the command line


def test_report_writes_named_metrics(tmp_path):
    """asyncps.metrics.report: one call per evaluation, rows in the evals CSV
    beside the metrics CSV (what launch/psstudy reads), bad names refused."""
    import io

    import asyncps
    from asyncps import metrics
    env = {"ASYNCPS_METRICS_CSV": str(tmp_path / "metrics-2.csv"), "ASYNCPS_RANK": "2"}
    out = io.StringIO()
    metrics.report(step=10, test_acc=0.5, test_loss=1.25, environ=env, stream=out)
    metrics.report(step=20, wall_s=3.0, perplexity=7, environ=env, stream=out)
    assert "EVAL rank=2 step=10 test_acc=0.5 test_loss=1.25" in out.getvalue()
    lines = open(tmp_path / "evals-2.csv").read().splitlines()
    assert lines[0] == metrics.EVAL_COLUMNS
    assert [l.split(",")[1:] for l in lines[1:]] == [
        ["2", "10", "test_acc", "0.5"], ["2", "10", "test_loss", "1.25"],
        ["2", "20", "perplexity", "7.0"]]
    assert lines[3].startswith("3.000,")
    with pytest.raises(asyncps.InvalidArgument, match="acc"):
        metrics.report(step=1, acc="high", environ=env, stream=out)
    with pytest.raises(asyncps.InvalidArgument, match="at least one"):
        metrics.report(step=1, environ=env, stream=out)
    # TrainingLog.report: the same rows, and test_acc in ps_worker's CSV column.
    log = TrainingLog(2, 2, str(tmp_path / "metrics-2.csv"), log_every=1, stream=out)
    log.report(0, test_acc=0.75, environ=env)
    log.step(0, 0, 32, 0.4, 0.01)
    log.finish(1, out=out)
    rows = open(tmp_path / "metrics-2.csv").read().splitlines()
    assert rows[1].split(",")[6] == "0.7500"
    assert open(tmp_path / "evals-2.csv").read().splitlines()[-1].endswith(",2,0,test_acc,0.75")
