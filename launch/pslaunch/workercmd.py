"""psrun --worker_cmd: any command as the worker, with an environment contract.

Each worker rank runs the command (split like a shell would) followed by the
experiment's [worker] flags and the flags after `--`, with these variables
(the contract, as torchrun's MASTER_ADDR/RANK/WORLD_SIZE; asyncps.env reads
them in Python):

    ASYNCPS_SERVERS       shard endpoints, comma-separated, shard 0 first
    ASYNCPS_RANK          this worker's rank, 0..W-1
    ASYNCPS_NUM_WORKERS   W
    ASYNCPS_NUM_SERVERS   S
    ASYNCPS_RUN_DIR       the run folder
    ASYNCPS_METRICS_CSV   RUN_DIR/metrics-<rank>.csv, where the worker writes
                          its metrics (ps_worker's columns)
    ASYNCPS_BIN_DIR       the asyncps binaries
    ASYNCPS_CURVE_SERVER_KEY, ASYNCPS_CURVE_SECRET_KEY, ASYNCPS_CURVE_PUBLIC_KEY
                          CurveZMQ keys (file or Z85), from the [worker] flags
                          --curve_server_key/--curve_secret_key/--curve_public_key,
                          which are not passed on the command line
    ASYNCPS_ETCD, ASYNCPS_ETCD_PREFIX
                          elastic fleets (psrun --elastic): etcd and the fleet's
                          key prefix
    ASYNCPS_ETCD_CA_FILE, ASYNCPS_ETCD_CERT_FILE, ASYNCPS_ETCD_KEY_FILE,
    ASYNCPS_ETCD_USER, ASYNCPS_ETCD_PASSWORD_FILE
                          elastic fleets with psrun --etcd_tls: the asyncps-worker
                          user's files (etcd_tls.py); else from the [worker] flags
                          --etcd_ca_file etc. (an --etcd of the user's), which are
                          not passed on the command line either
    PYTHONPATH            the built Python package (BIN_DIR/../python) first
    ASYNCPS_METRICS_PORT, ASYNCPS_METRICS_PORT_FILE, ASYNCPS_METRICS_LINGER_S
                          with psrun --metrics: serve Prometheus metrics on a free
                          port (-1), write it to the file, keep serving that long
                          after training (asyncps.metrics.TrainingLog does all three)

The worker prints ps_worker's progress lines on stderr and its SUMMARY line on
stdout (asyncps.metrics does both), so the progress display and summary.json
work as for ps_worker. Every backend sets the same variables: local and SSH
through `env` in front of the command (visible in each worker log's command
line), Slurm in launch/slurm/task.sh, Kubernetes in the Job's container.
"""
import os
import shlex

from . import etcd_tls

CURVE_FLAGS = {"--curve_server_key": "ASYNCPS_CURVE_SERVER_KEY",
               "--curve_secret_key": "ASYNCPS_CURVE_SECRET_KEY",
               "--curve_public_key": "ASYNCPS_CURVE_PUBLIC_KEY"}
# [worker] flags a --worker_cmd worker gets as variables, not arguments.
ENV_FLAGS = dict(CURVE_FLAGS, **{flag: var for flag, var, _ in etcd_tls.FLAGS})


def python_dir(bin_dir):
    return os.path.join(os.path.dirname(os.path.normpath(bin_dir)), "python")


def read_flag_lines(path):
    """The flags of a psrun-written flag file (comments dropped)."""
    try:
        with open(path) as f:
            return [l.strip() for l in f if l.strip() and not l.lstrip().startswith("#")]
    except OSError:
        return []


def split_env_flags(flags):
    """(flags without the CURVE key and etcd security flags, {env var: value}
    for them)."""
    rest, env = [], {}
    for f in flags:
        name, eq, value = f.partition("=")
        if name in ENV_FLAGS and eq:
            env[ENV_FLAGS[name]] = value
        else:
            rest.append(f)
    return rest, env


def pick(flags, names):
    """The flags of `flags` ("--name=value") whose name is in `names`."""
    return [f for f in flags if f.partition("=")[0] in names and "=" in f]


def contract(servers, rank, num_workers, num_servers, run_dir, bin_dir, flag_env=None,
             pythonpath=None):
    """The contract variables for one worker (rank may be a shell expression
    in backends that expand it, e.g. '$SLURM_PROCID')."""
    env = {"ASYNCPS_SERVERS": servers, "ASYNCPS_RANK": str(rank),
           "ASYNCPS_NUM_WORKERS": str(num_workers), "ASYNCPS_NUM_SERVERS": str(num_servers),
           "ASYNCPS_RUN_DIR": run_dir,
           "ASYNCPS_METRICS_CSV": os.path.join(run_dir, "metrics-%s.csv" % rank),
           "ASYNCPS_BIN_DIR": bin_dir}
    env.update(flag_env or {})
    pp = python_dir(bin_dir)
    env["PYTHONPATH"] = pp + (":" + pythonpath if pythonpath else "")
    return env


def argv(worker_cmd, flags, extra):
    cmd = shlex.split(worker_cmd)
    if not cmd:
        raise ValueError("--worker_cmd is empty")
    return cmd + list(flags) + list(extra)


def env_argv(env, cmd_argv):
    """`env K=V ... cmd`: runs the same locally and through ssh."""
    return ["env"] + ["%s=%s" % kv for kv in sorted(env.items())] + list(cmd_argv)
