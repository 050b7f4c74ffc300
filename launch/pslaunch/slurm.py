"""Slurm backend: the shards as one srun step (S tasks), the workers as another (W
tasks); each task's rank is SLURM_PROCID (launch/slurm/task.sh maps it to
--shard_id / --rank). Shards publish their endpoints in RUN_DIR/ready on the shared
disk; psrun waits for them and for `ps_ctl stats`, then starts the worker step with
--servers. Per-task logs: srun --output=RUN_DIR/<role>-%t.log. Teardown signals the
srun steps (srun forwards SIGTERM to its tasks; SIGKILL makes slurmd end the step).
No --max_restarts here: a failed shard task fails the run.

With --replicas R (replica groups, server/replication/): an etcd step of one
task comes first (task.sh etcd; its endpoint in RUN_DIR/ready/etcd.endpoint),
unless --etcd names one; the server step has S x R tasks, task r being
replica r % R of shard r / R; the workers get each shard as its replica
group, 'ep1|ep2'. The server step then runs with --kill-on-bad-exit=0: a
replica that dies does not end its group. With --etcd_tls the etcd step
(task.sh etcd ... tls PREFIX) makes its certificates for the host it runs on
in RUN_DIR/etcd/tls, serves https, and creates etcd's users and turns
authentication on before it writes etcd.endpoint; the shards' steps get the
asyncps-server user's --etcd_* flags, psrun's ps_ctl too.

With --elastic PLAN (elastic.py) the etcd step comes first too (unless
--etcd), the shards get --elastic_etcd and --etcd_prefix, and each shard a
step adds is an srun step of one task of its own (task.sh server with
PSRUN_SHARD_OFFSET=K: shard K of K+1, log RUN_DIR/server-K.log, srun's own
output in RUN_DIR/srun-server-K.log); inside an allocation it needs a free
CPU (sbatch --ntasks=S+W+added shards, or --srun_opts=--overlap). A shard
the plan removes gets `ps_ctl shutdown`: its task ends with 0 and its step
goes on with the other shards' tasks.
"""
import os
import shlex
import sys

from . import binaries
from . import etcd_tls
from . import fleet as fleet_mod
from . import procs as procs_mod
from . import summary as summary_mod
from . import workercmd

TASK = os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(__file__))), "slurm",
                    "task.sh")


def srun_argv(opts, role, tasks, task_args, log="%t", shards=None):
    """log: the per-task log is RUN_DIR/<role>-<log>.log (srun's %t: the task
    number); shards: task.sh's NUM_SHARDS (default --servers)."""
    argv = ["srun", "--ntasks=%d" % tasks, "--kill-on-bad-exit=1", "--job-name=asyncps-" + role,
            "--output=" + os.path.join(opts.run_dir, "%s-%s.log" % (role, log))]
    argv += shlex.split(opts.srun_opts or "")
    return argv + [TASK, role, opts.run_dir, opts.bin_dir, str(shards or opts.servers),
                   str(opts.workers)] + task_args


def elastic_flags(opts, etcd, prefix):
    """ps_server flags of an --elastic fleet's shards: the fleet's, and the
    etcd a shard frozen by a change whose ps_ctl went away asks."""
    return shlex.split(opts.server_flags or "") + ["--elastic_etcd=" + etcd,
                                                   "--etcd_prefix=/asyncps/" + prefix]


def replica_flags(opts, etcd, prefix):
    return ["--etcd=" + etcd, "--etcd_prefix=/asyncps/" + prefix,
            "--lease_ms=%d" % getattr(opts, "lease_ms", 1000)]


def keep_step_on_bad_exit(argv):
    # A replica that dies must not end the step: its group goes on.
    return [("--kill-on-bad-exit=0" if a == "--kill-on-bad-exit=1" else a) for a in argv]


def server_step(opts, etcd=None, prefix=None, elastic=False, tls=()):
    """tls: the shards' --etcd_* flags (psrun --etcd_tls), before the fleet's."""
    replicas = getattr(opts, "replicas", 1) or 1
    if tls:
        opts = _with_flags(opts, tls)
    if elastic and replicas == 1:
        return srun_argv(opts, "server", opts.servers, elastic_flags(opts, etcd, prefix))
    if replicas == 1 and not etcd:
        return srun_argv(opts, "server", opts.servers, shlex.split(opts.server_flags or ""))
    flags = (elastic_flags(opts, etcd, prefix) if elastic
             else shlex.split(opts.server_flags or ""))
    return keep_step_on_bad_exit(srun_argv(opts, "server", opts.servers * replicas,
                                           flags + replica_flags(opts, etcd, prefix)))


def _with_flags(opts, flags):
    """A copy of opts whose --server_flags start with `flags`."""
    import copy
    o = copy.copy(opts)
    o.server_flags = " ".join(shlex.quote(f) for f in flags) + " " + (opts.server_flags or "")
    return o


def added_shard_step(opts, shard, etcd, prefix, tls=()):
    """psrun --elastic: shard `shard` of shard+1, a step of one task (task.sh
    turns SLURM_PROCID 0 into it with PSRUN_SHARD_OFFSET=shard); with
    --replicas R a step of R tasks, the group's replicas (server-K-r%t)."""
    replicas = getattr(opts, "replicas", 1) or 1
    if tls:
        opts = _with_flags(opts, tls)
    if replicas == 1:
        return srun_argv(opts, "server", 1, elastic_flags(opts, etcd, prefix), log=str(shard),
                         shards=shard + 1)
    return keep_step_on_bad_exit(srun_argv(
        opts, "server", replicas,
        elastic_flags(opts, etcd, prefix) + replica_flags(opts, etcd, prefix),
        log="%d-r%%t" % shard, shards=shard + 1))


def etcd_step(opts, client_port, peer_port, tls_prefix=None):
    """tls_prefix: TLS and authentication, the users' permissions under it."""
    return srun_argv(opts, "etcd", 1, [str(client_port), str(peer_port)] + (
        ["tls", tls_prefix] if tls_prefix else []))


def worker_step(opts, servers):
    if opts.worker_cmd:
        # task.sh cmd: the command with the [worker] flags, under the
        # environment contract (launch/pslaunch/workercmd.py).
        flags, _ = workercmd.split_env_flags(workercmd.read_flag_lines(
            os.path.join(opts.run_dir, "flags", "worker.flags")))
        return srun_argv(opts, "cmd", opts.workers, [servers, opts.worker_cmd] + flags +
                         list(opts.worker_extra))
    return srun_argv(opts, "worker", opts.workers, [servers] + list(opts.worker_extra))


def worker_step_env(opts):
    """The srun process's environment: CURVE keys of a --worker_cmd worker
    (srun passes the environment on to the tasks)."""
    if not opts.worker_cmd:
        return None
    _, curve = workercmd.split_env_flags(workercmd.read_flag_lines(
        os.path.join(opts.run_dir, "flags", "worker.flags")))
    return dict(os.environ, **curve) if curve else None


class SlurmFleet(fleet_mod.Fleet):
    """Fleet whose members share two srun steps instead of owning a process each."""

    def advertise_host(self, m):
        try:
            with open(self.path("ready", "%s.host" % m.name)) as f:
                return f.read().strip() or m.proc.host
        except OSError:
            return m.proc.host

    def start_etcd(self):
        """Replicated or elastic fleets without --etcd: etcd as a step of its own."""
        if not (self.replicated() or self.elastic) or self.etcd_endpoints:
            return
        import socket
        import time as time_mod

        def free_port():
            with socket.socket() as s:
                s.bind(("", 0))
                return s.getsockname()[1]
        tls_prefix = "/asyncps/" + self.etcd_prefix() if self.etcd_tls_dir else None
        self.etcd_step = procs_mod.LocalProc(
            "etcd-step", etcd_step(self.o, free_port(), free_port(), tls_prefix),
            self.path("srun-etcd.log"), env=self.replica_env()).start()
        ready = self.path("ready", "etcd.endpoint")
        deadline = time_mod.time() + self.o.start_timeout
        while True:
            text = self.etcd_step.read_file(ready)
            if text and text.strip():
                self.etcd_endpoints = text.strip()
                break
            if self.etcd_step.poll() is not None or time_mod.time() > deadline:
                raise fleet_mod.LaunchError(None, "the etcd step did not serve (see %s)" %
                                            self.path("etcd-0.log"))
            self.sleep(0.1)
        self.log("psrun: etcd step serving at %s%s" % (
            self.etcd_endpoints, ", TLS and authentication (%s)" % self.etcd_tls_dir
            if self.etcd_tls_dir else ""))

    def server_tls_flags(self):
        server = self.etcd_credentials(etcd_tls.SERVER_USER)
        return server.etcd_flags() if server else []

    def replica_env(self):
        return dict(os.environ, PSRUN_REPLICAS=str(self.replicas))

    def start_shards(self):
        self.start_etcd()
        if self.replicated() or self.elastic:
            step = server_step(self.o, self.etcd_endpoints, self.etcd_prefix(),
                               elastic=bool(self.elastic), tls=self.server_tls_flags())
        else:
            step = server_step(self.o)
        self.server_step = procs_mod.LocalProc(
            "server-step", step, self.path("srun-server.log"),
            env=self.replica_env() if self.replicated() else None).start()
        for m in self.shards:
            m.proc = self.server_step
        self.write_pids()
        deadline = __import__("time").time() + self.o.start_timeout
        for m in self.shards:
            m.endpoint = self.wait_ready_file(m, deadline)
        for m in self.shards:
            self.wait_stats(m, deadline)
        self.log("psrun: %d shard(s) ready: %s" % (len(self.shards), self.endpoints()))

    def start_shard(self, m, endpoint=None):
        """A shard psrun --elastic adds: a step of its own (no restarts on
        Slurm); a replica group's members share one step of R tasks, started
        with its first member."""
        try:
            os.unlink(self.path("ready", "%s.endpoint" % m.name))
        except FileNotFoundError:
            pass
        if self.replicated() and m.replica:
            m.proc = next(x.proc for x in self.shards
                          if x.group == m.group and x.replica == 0)
            return
        env = dict(os.environ, PSRUN_SHARD_OFFSET=str(m.group))
        if self.replicated():
            env["PSRUN_REPLICAS"] = str(self.replicas)
        m.proc = procs_mod.LocalProc(
            "server-step-%d" % m.group,
            added_shard_step(self.o, m.group, self.etcd_endpoints, self.etcd_prefix(),
                             self.server_tls_flags()),
            self.path("srun-server-%d.log" % m.group), env=env).start()
        self.write_pids()

    def start_workers(self):
        self.worker_start = __import__("time").time()
        self.worker_step = procs_mod.LocalProc(
            "worker-step", worker_step(self.o, self.endpoints()),
            self.path("srun-worker.log"), env=worker_step_env(self.o)).start()
        for m in self.workers:
            m.proc = self.worker_step
        self.write_pids()
        self.log("psrun: worker step started (%d tasks)" % len(self.workers))

    def failure_record(self, m, reason):
        rec = super().failure_record(m, reason)
        if m is not None and m.proc is not None:
            rec["srun_log_tail"] = procs_mod.tail(m.proc.log_path, 10)
        return rec

    def replica_stopped(self, m, rc):
        # The tasks share one step: its end is every replica's.
        if rc is not None:
            raise fleet_mod.LaunchError(m, "the server step ended (%s)" %
                                        procs_mod.describe_status(rc))

    def teardown(self):
        # One signal per srun step, not one per member.
        seen = {}
        for m in self.all_members():
            if m.proc is not None:
                seen.setdefault(id(m.proc), m)
        members = self.workers, self.shards
        self.workers = [m for m in self.workers if seen.get(id(m.proc)) is m]
        self.shards = [m for m in self.shards if seen.get(id(m.proc)) is m]
        try:
            super().teardown()
        finally:
            self.workers, self.shards = members
            step = getattr(self, "etcd_step", None)
            if step is not None and step.poll() is None:
                import signal
                step.signal(signal.SIGTERM)
                try:
                    step.popen.wait(timeout=10)
                except Exception:
                    step.signal(signal.SIGKILL)


def main_from_psrun(opts, log):
    if opts.max_restarts:
        sys.stderr.write("psrun: --max_restarts is not supported with --backend slurm\n")
        return 2
    if opts.dry_run:
        print(" ".join(shlex.quote(a) for a in server_step(opts)))
        print(" ".join(shlex.quote(a) for a in worker_step(
            opts, "<endpoints from %s/ready/server-*.endpoint>" % opts.run_dir)))
        return 0
    if not binaries.check_binaries(opts, binaries.needed_binaries(opts)):
        return 2
    log("psrun: run folder %s (slurm)" % opts.run_dir)
    f = SlurmFleet(opts, opts.run_dir, spawn=None, log=log)
    code, summary = f.run()
    text = summary_mod.format_summary(summary)
    (sys.stdout if code == 0 else sys.stderr).write(text + "\n")
    return code
