"""Shared by pip_test.py and deb_test.py: a clean environment for installed
files, and a short training run through an installed psrun.

Both run the installed commands with an environment that names nothing of
the checkout or its build tree (no PYTHONPATH, ASYNCPS_BIN_DIR or BUILD from
ctest), from a folder outside the checkout, so that what they find they find
the way an installed psrun does (launch/pslaunch/binaries.py)."""
import json
import os
import subprocess

BUILD = os.environ.get("ASYNCPS_BUILD_DIR", "")
SOURCE = os.environ.get("ASYNCPS_SOURCE_DIR", "")
DATA = "/usr/share/datasets/fashion-mnist"

# 1 shard, 1 worker, a 784-32-10 MLP for 40 steps (a few seconds).
TINY = ["--servers", "1", "--workers", "1", "--grace", "3", "--start_timeout", "30",
        "--progress", "off", "--server_flags",
        "--consistency=ssp --staleness=2 --optimizer=sgd --lr=0.05 --worker_timeout_s=10",
        "--", "--layers=784,32,10", "--batch=32", "--epochs=0", "--max_steps=40",
        "--log_every=10", "--threads=1", "--timeout_s=30"]


def clean_env(path_dirs, pythonpath=None, **extra):
    """os.environ without what points into the checkout, PATH = path_dirs +
    /usr/bin:/bin, PYTHONPATH = pythonpath (or none)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "ASYNCPS_BIN_DIR", "BUILD", "VIRTUAL_ENV")}
    env["PATH"] = ":".join(list(path_dirs) + ["/usr/bin", "/bin"])
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    env.update(extra)
    return env


def run(argv, env, cwd, timeout=120):
    """(exit code, stdout + stderr) of argv."""
    r = subprocess.run(argv, env=env, cwd=cwd, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=timeout)
    return r.returncode, r.stdout


def train(test, psrun, env, tmp, config="fashion_ssp"):
    """A short run through `psrun --config <config>` (a bare name: the
    installed copy); asserts it trained, returns (summary, bin_dir psrun used)."""
    run_dir = os.path.join(tmp, "run")
    code, out = run([psrun, "--config", config, "--run_dir", run_dir] + TINY, env, tmp, 180)
    test.assertEqual(code, 0, out)
    with open(os.path.join(run_dir, "summary.json")) as f:
        summary = json.load(f)
    test.assertTrue(summary["ok"], out)
    test.assertEqual(summary["totals"]["steps"], 40, out)
    test.assertGreater(summary["totals"]["final_test_acc"], 0.2, out)
    with open(os.path.join(run_dir, "flags", "psrun.cmdline")) as f:
        cmdline = f.read()
    bin_dir = next(a.split("=", 1)[1] for a in cmdline.split() if a.startswith("--bin_dir="))
    return summary, bin_dir
