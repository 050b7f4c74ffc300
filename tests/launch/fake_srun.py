#!/usr/bin/env python3
"""A stand-in for `srun` (tests only): runs --ntasks copies of the command with
SLURM_PROCID/SLURM_NTASKS set, --output with %t per task, forwards SIGTERM/SIGINT,
exits non-zero if a task fails (killing the others, as --kill-on-bad-exit=1)."""
import os
import signal
import subprocess
import sys
import time

args = sys.argv[1:]
ntasks, output = 1, None
while args and args[0].startswith("-"):
    a = args.pop(0)
    if a.startswith("--ntasks="):
        ntasks = int(a.split("=", 1)[1])
    elif a.startswith("--output="):
        output = a.split("=", 1)[1]
with open(os.environ.get("FAKE_SRUN_LOG", os.devnull), "a") as f:
    f.write(" ".join(sys.argv) + "\n")
procs = []
for t in range(ntasks):
    env = dict(os.environ, SLURM_PROCID=str(t), SLURM_NTASKS=str(ntasks), SLURM_JOB_ID="1",
               SLURM_STEP_ID="0", PSRUN_ADVERTISE_HOST="127.0.0.1", PSRUN_BIND_HOST="127.0.0.1")
    out = open(output.replace("%t", str(t)), "ab") if output else None
    procs.append(subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL))


def forward(signum, frame):
    for p in procs:
        if p.poll() is None:
            p.send_signal(signum)


signal.signal(signal.SIGTERM, forward)
signal.signal(signal.SIGINT, forward)
rc = 0
while any(p.poll() is None for p in procs):
    if any(p.poll() not in (None, 0) for p in procs):
        rc = 1
        forward(signal.SIGKILL, None)
    time.sleep(0.05)
codes = [p.returncode for p in procs]
sys.exit(rc or next((1 for c in codes if c != 0), 0))
