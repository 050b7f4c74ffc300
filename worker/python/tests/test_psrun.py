"""psrun --worker_cmd end to end with the example scripts (real shards,
real Fashion-MNIST), the environment contract on every backend, and the
PyTorch MLP against ps_worker."""
import csv
import json
import os
import re
import shlex
import subprocess
import sys

import pytest

from conftest import EXAMPLES, REPO, bin_dir, binary, need_data, python_env

PSRUN = os.path.join(REPO, "launch", "psrun")
TASK = os.path.join(REPO, "launch", "slurm", "task.sh")
from pslaunch import summary as summary_mod  # noqa: E402  (PYTHONPATH: worker/python/CMakeLists.txt)


def kmetrics_header():
    """ps_worker's kMetricsCsvHeader, read from worker/trainer.cc."""
    text = open(os.path.join(REPO, "worker", "trainer.cc")).read()
    body = text.split("kMetricsCsvHeader[] =", 1)[1].split(";", 1)[0]
    return "".join(re.findall(r'"([^"]*)"', body))


def psrun(run_dir, workers, worker_cmd, extra=(), servers=1, server_flags="--consistency=ssp "
          "--staleness=2 --optimizer=sgd --lr=0.1", config=None, timeout=240, extra_psrun=()):
    binary("ps_server")
    argv = [sys.executable, PSRUN, "--servers", str(servers), "--workers", str(workers),
            "--run_dir", run_dir, "--bin_dir", bin_dir(), "--progress", "off", "--grace", "3",
            "--server_flags", server_flags]
    if worker_cmd:
        argv += ["--worker_cmd", worker_cmd]
    if config:
        argv += ["--config", config]
    argv += list(extra_psrun)
    r = subprocess.run(argv + ["--"] + list(extra), capture_output=True, text=True,
                       timeout=timeout, env=python_env())
    return r


def test_two_python_workers_reach_real_accuracy(tmp_path):
    need_data()
    run = str(tmp_path / "run")
    r = psrun(run, 2, "%s %s" % (sys.executable, os.path.join(EXAMPLES, "mlp.py")),
              ["--epochs=1", "--log_every=100", "--eval_every=200"])
    assert r.returncode == 0, r.stdout + r.stderr
    summary = json.load(open(os.path.join(run, "summary.json")))
    assert summary["ok"] and summary["workers"] == 2
    assert set(summary["per_worker"]) == {"0", "1"}
    assert summary["totals"]["final_test_acc"] > 0.80, summary["totals"]
    assert summary["totals"]["steps"] == 2 * 469
    for rank in (0, 1):
        rows = list(csv.reader(open(os.path.join(run, "metrics-%d.csv" % rank))))
        assert ",".join(rows[0]) == kmetrics_header()
        assert rows[-1][2] == "469"
        log = open(os.path.join(run, "worker-%d.log" % rank)).read()
        assert summary_mod._PROGRESS_RE.search(log), "no progress line psrun can read"
        assert "ASYNCPS_RANK=%d" % rank in log.splitlines()[1]  # the command line
    acc = [float(r[6]) for r in csv.reader(open(os.path.join(run, "metrics-0.csv")))
           if r[6] and r[0] != "wall_s"]
    assert len(acc) == 3 and acc[-1] > 0.8  # steps 200, 400 and the last
    assert os.path.exists(os.path.join(run, "stats.json"))


ENV_DUMP = ("import json, os, sys; "
            "json.dump({'env': {k: v for k, v in os.environ.items() if k.startswith('ASYNCPS_') "
            "or k == 'PYTHONPATH'}, 'argv': sys.argv[1:]}, "
            "open(os.path.join(os.environ['ASYNCPS_RUN_DIR'], 'env-%s.json' "
            "% os.environ['ASYNCPS_RANK']), 'w'))")


def test_environment_contract(tmp_path):
    run = str(tmp_path / "run")
    cfg = tmp_path / "exp.flags"
    cfg.write_text("[worker]\n--batch=32\n--curve_server_key=/keys/server.pub\n"
                   "--curve_secret_key=/keys/worker.key\n")
    r = psrun(run, 3, "%s -c %s" % (sys.executable, shlex.quote(ENV_DUMP)), ["--epochs=2"],
              servers=2, config=str(cfg))
    assert r.returncode == 0, r.stdout + r.stderr
    endpoints = json.load(open(os.path.join(run, "summary.json")))["endpoints"]
    for rank in range(3):
        d = json.load(open(os.path.join(run, "env-%d.json" % rank)))
        env = d["env"]
        assert env["ASYNCPS_SERVERS"] == ",".join(endpoints)
        assert env["ASYNCPS_RANK"] == str(rank)
        assert env["ASYNCPS_NUM_WORKERS"] == "3" and env["ASYNCPS_NUM_SERVERS"] == "2"
        assert env["ASYNCPS_RUN_DIR"] == run
        assert env["ASYNCPS_METRICS_CSV"] == os.path.join(run, "metrics-%d.csv" % rank)
        assert env["ASYNCPS_CURVE_SERVER_KEY"] == "/keys/server.pub"
        assert env["ASYNCPS_CURVE_SECRET_KEY"] == "/keys/worker.key"
        assert env["ASYNCPS_BIN_DIR"] == bin_dir()
        assert env["PYTHONPATH"].split(":")[0] == os.path.join(os.path.dirname(bin_dir()),
                                                               "python")
        # The [worker] flags and those after --, without the keys.
        assert d["argv"] == ["--batch=32", "--epochs=2"]


def test_slurm_renders_and_runs_the_contract(tmp_path):
    run = str(tmp_path / "run")
    r = subprocess.run([sys.executable, PSRUN, "--backend", "slurm", "--dry_run", "--servers",
                        "2", "--workers", "3", "--run_dir", run, "--bin_dir", "/opt/bin",
                        "--worker_cmd", "python3 train.py --lr 0.1", "--", "--epochs=2"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    wrk = shlex.split(r.stdout.strip().splitlines()[1])
    i = wrk.index(TASK)
    assert wrk[i + 1:i + 6] == ["cmd", run, "/opt/bin", "2", "3"]
    assert wrk[i + 7:] == ["python3 train.py --lr 0.1", "--epochs=2"]
    # task.sh itself: SLURM_PROCID becomes ASYNCPS_RANK.
    env = dict(os.environ, SLURM_PROCID="2", SLURM_NTASKS="3")
    r = subprocess.run([TASK, "cmd", run, "/opt/bin", "2", "3", "tcp://a:1,tcp://b:2",
                        "echo ARGS $ASYNCPS_RANK $ASYNCPS_NUM_WORKERS $ASYNCPS_SERVERS "
                        "$ASYNCPS_METRICS_CSV $PYTHONPATH", "--x=1"],
                       env=env, capture_output=True, text=True, timeout=10)
    assert r.returncode == 0, r.stderr
    line = [l for l in r.stdout.splitlines() if l.startswith("ARGS")][0].split()
    assert line[1:5] == ["2", "3", "tcp://a:1,tcp://b:2", run + "/metrics-2.csv"]
    assert line[5].startswith("/opt/python") and line[6] == "--x=1"


def test_k8s_renders_the_contract(tmp_path):
    out = str(tmp_path / "k8s")
    r = subprocess.run([sys.executable, PSRUN, "--backend", "k8s", "--servers", "2", "--workers",
                        "4", "--render", out, "--format", "json",
                        "--worker_cmd", "python3 /app/train.py", "--", "--epochs=3"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    job = [json.load(open(os.path.join(out, f))) for f in sorted(os.listdir(out))][-1]
    c = job["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env["ASYNCPS_NUM_WORKERS"] == "4" and env["ASYNCPS_NUM_SERVERS"] == "2"
    assert env["ASYNCPS_SERVERS"].startswith("tcp://shard-0.asyncps-shards:")
    assert env["PYTHONPATH"] == "/opt/asyncps/python"
    cmd = c["command"][2]
    assert "ASYNCPS_RANK=$JOB_COMPLETION_INDEX" in cmd
    assert cmd.endswith("exec python3 /app/train.py --epochs=3")


def run_summary(r, run):
    assert r.returncode == 0, r.stdout + r.stderr
    return json.load(open(os.path.join(run, "summary.json")))["totals"]


def test_pytorch_mlp_matches_ps_worker(tmp_path):
    """Same model, initial weights, data order, epochs, batch and lr: the
    two workers agree within 1 point."""
    need_data()
    binary("ps_worker")
    flags = ["--epochs=1", "--batch=64", "--seed=1", "--log_every=0"]
    server = "--consistency=asp --optimizer=sgd --lr=0.1"
    py = run_summary(psrun(str(tmp_path / "py"), 1, "%s %s" % (
        sys.executable, os.path.join(EXAMPLES, "mlp.py")), flags, server_flags=server),
        str(tmp_path / "py"))
    cpp = run_summary(psrun(str(tmp_path / "cpp"), 1, None, flags + ["--threads=1"],
                            server_flags=server), str(tmp_path / "cpp"))
    assert abs(py["final_test_acc"] - cpp["final_test_acc"]) <= 0.01, (py, cpp)
    assert py["final_test_acc"] > 0.8
    assert py["bytes_pushed_raw"] == cpp["bytes_pushed_raw"]


def test_readme_example_runs_under_psrun(tmp_path):
    """The README's "Train your own PyTorch model" script, as written."""
    need_data()
    readme = open(os.path.join(REPO, "README.md")).read()
    section = readme.split("## Train your own PyTorch model", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    script = tmp_path / "train.py"
    script.write_text(code + "print('SUMMARY rank=%d final_test_acc=-1 samples_per_s=0 "
                      "bytes_pushed_raw=%d bytes_pushed_wire=%d bytes_pulled=0 steps=%d "
                      "wall_s=0' % (ps.rank, ps.traffic()['bytes_pushed_raw'], "
                      "ps.traffic()['bytes_pushed_wire'], ps.clock))\n")
    run = str(tmp_path / "run")
    r = psrun(run, 2, "%s %s" % (sys.executable, script))
    totals = run_summary(r, run)
    assert totals["steps"] == 2 * 469
    assert 0 < totals["bytes_pushed_wire"] < totals["bytes_pushed_raw"] / 10  # top-k 1%
