"""psrun's command line: options, run folder, flag files, backend choice."""
import argparse
import os
import shlex
import shutil
import signal
import sys
import time

from . import config as config_mod
from . import elastic as elastic_mod
from . import k8s
from . import netns
from . import procs as procs_mod
from . import slurm
from . import summary as summary_mod
from .binaries import check_binaries, default_bin_dir, needed_binaries
from .fleet import Fleet
from .member import LaunchError


def make_parser():
    p = argparse.ArgumentParser(
        prog="psrun", usage="psrun --servers S --workers W [options] [-- extra worker flags]",
        description="Launch S ps_server shards and W ps_worker ranks; see launch/README.md.")
    # Defaults are None so that a config's [psrun] section can fill them in;
    # DEFAULTS below applies what is still unset.
    p.add_argument("--servers", type=int, help="number of shards S (default 1)")
    p.add_argument("--workers", type=int, help="number of workers W (default 1)")
    p.add_argument("--config", help="experiment flag file with [server]/[worker]/[psrun] sections "
                   "(a bare name such as fashion_ssp: one of launch/configs, also installed "
                   "in share/asyncps/configs)")
    p.add_argument("--run_dir", help="run folder (default runs/<UTC time>-<pid> in the cwd)")
    p.add_argument("--backend", choices=["local", "ssh", "slurm", "k8s"],
                   help="where processes run (default local)")
    p.add_argument("--hostfile", help="ssh: 'host slots=N' lines")
    p.add_argument("--ssh_opts", help="ssh: options for every ssh call (default: -o BatchMode=yes "
                   "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR)")
    p.add_argument("--remote_bin_dir", help="ssh: binaries on the hosts (default: --bin_dir)")
    p.add_argument("--bin_dir", help="ps_server/ps_worker/ps_ctl (default $ASYNCPS_BIN_DIR or "
                   "$BUILD/bin or <repo>/build/bin)")
    p.add_argument("--start_timeout", type=float, help="seconds for each shard to come up (default 30)")
    p.add_argument("--max_restarts", type=int, help="restarts per crashed shard (default 0)")
    p.add_argument("--grace", type=float, help="seconds between SIGTERM and SIGKILL (default 5)")
    p.add_argument("--server_flags", help="extra ps_server flags, one shell-quoted string")
    p.add_argument("--progress", choices=["auto", "on", "off"], help="progress display (default auto: on a tty)")
    p.add_argument("--log_tail_lines", type=int, help="log lines shown per failure (default 20)")
    p.add_argument("--srun_opts", help="slurm: extra srun options, e.g. '--overcommit'")
    p.add_argument("--dry_run", action="store_true", default=None,
                   help="slurm: print the srun commands and exit")
    p.add_argument("--render", help="k8s: write manifests into this folder")
    p.add_argument("--format", choices=["yaml", "json"], help="k8s manifest format (default yaml)")
    p.add_argument("--image", help="k8s: container image (default asyncps:latest)")
    p.add_argument("--storage", help="k8s: RocksDB volume size per shard (default 1Gi)")
    p.add_argument("--namespace", help="k8s: namespace (default: none)")
    p.add_argument("--port", type=int, help="k8s: shard port (default 5555)")
    p.add_argument("--transport", choices=["tcp", "ipc"],
                   help="how workers and psrun reach the shards: tcp (default) or ipc (Unix "
                        "domain sockets under RUN_DIR/sock; --backend local only: every shard "
                        "and worker on this host)")
    p.add_argument("--shared_memory_mb", type=int,
                   help="with --transport ipc: ps_worker pulls through shared memory of this "
                        "many MiB (common/shm_segment.h; at least the model's fp32 size; pages "
                        "are used only for the model). Default 1024; 0: off. Not passed to "
                        "--worker_cmd (see launch/README.md)")
    p.add_argument("--replicas", type=int,
                   help="processes per shard (replica group): 1 primary + R-1 backups that "
                        "apply every update before it is acknowledged and take over when the "
                        "primary's etcd lease ends (default 1: no replication)")
    p.add_argument("--etcd", help="etcd endpoints for the replica layout and leases, or the "
                                  "--elastic layout (default: a local etcd started by psrun "
                                  "in the run folder; with --backend slurm an etcd step)")
    p.add_argument("--etcd_tls", choices=["auto", "on", "off"],
                   help="psrun's own etcd (for --replicas / --elastic) as a secured "
                        "deployment runs it: https with a CA and certificates made for the "
                        "run (openssl, in RUN_DIR/etcd/tls), client certificates required, "
                        "and etcd's user/password authentication: every ps_server and "
                        "psrun's ps_ctl sign in as asyncps-server (read/write under the "
                        "fleet's prefix), the workers of --elastic as asyncps-worker (read "
                        "its layout only). Default auto: on when the fleet uses CurveZMQ "
                        "(--curve_secret_key in the server flags), else off. 'on' is refused "
                        "with --etcd (give the --etcd_ca_file/--etcd_cert_file/--etcd_key_file"
                        "/--etcd_user/--etcd_password_file flags in --server_flags and the "
                        "[server]/[worker] sections yourself) and with --backend k8s")
    p.add_argument("--ctl_flags",
                   help="extra flags of psrun's own ps_ctl calls (readiness, stats, "
                        "shutdown, --elastic's add-shard/remove-shard), one shell-quoted "
                        "string, e.g. '--curve_secret_key=admin.key' (a key the shards' "
                        "--curve_admin_clients lists, so that shutdown and --elastic are let "
                        "in with CurveZMQ). They come after the CurveZMQ client keys psrun "
                        "takes from the worker flags when the shards use CurveZMQ")
    p.add_argument("--elastic", metavar="PLAN",
                   help="shards join and leave while the workers train: steps '+N@SECONDS' "
                        "(start N shards and move chunks onto them), '-N@SECONDS' (move every "
                        "chunk off the N newest, then stop them), '-#K@SECONDS' (shard K), "
                        "seconds after the workers started, e.g. '+1@20s,-1@40s'; backends "
                        "local (with --emulate_hosts: each new shard on a new emulated host), "
                        "ssh, slurm, k8s (a rendered Job scales the StatefulSet) "
                        "(launch/README.md; uses etcd: --etcd, or psrun's)")
    p.add_argument("--elastic_from", choices=["start", "training"], default="start",
                   help="--elastic: the plan's seconds count from the workers' start (default) "
                        "or from when they began training (every initial shard counted a push; "
                        "not with --backend k8s)")
    p.add_argument("--lease_ms", type=int,
                   help="shards' etcd lease TTL in ms (etcd rounds up to whole seconds; "
                        "default 1000)")
    p.add_argument("--emulate_hosts", type=int,
                   help="local backend: N emulated hosts on this machine, each a network "
                        "namespace of its own joined to a hub by one link (root, ip, tc; "
                        "addresses 10.213.0.0/24 only inside them); replica r of group g on "
                        "host (g + r) %% N, workers round-robin after the shards")
    p.add_argument("--link", help="with --emulate_hosts: each host's link rate, up and down "
                                  "(tc tbf), e.g. 100mbit, 1gbit (default: unshaped)")
    p.add_argument("--latency", type=float,
                   help="with --emulate_hosts: one-way delay host to host in ms (netem, half "
                        "on each end; refused where the kernel lacks netem)")
    p.add_argument("--shard_hosts", type=int,
                   help="with --emulate_hosts: shards on the first M hosts only, workers on "
                        "the others (default: all processes over all N hosts)")
    p.add_argument("--quiet", action="store_true", default=None, help="only the final summary")
    p.add_argument("--metrics", action="store_true", default=None,
                   help="every process serves Prometheus metrics on a free port; targets in "
                   "RUN_DIR/metrics/targets.json (file_sd)")
    p.add_argument("--prometheus", action="store_true", default=None,
                   help="also run a local Prometheus scraping the fleet, data in "
                   "RUN_DIR/prometheus (implies --metrics)")
    p.add_argument("--metrics_port_k8s", type=int,
                   help="k8s with --metrics: the pods' metrics port (default 9400)")
    p.add_argument("--service_monitor", action="store_true", default=None,
                   help="k8s with --metrics: also a ServiceMonitor and a PodMonitor "
                   "(Prometheus Operator)")
    p.add_argument("--scrape_interval", type=float,
                   help="Prometheus scrape interval, seconds (default 1)")
    p.add_argument("--worker_cmd", help="run this command as each worker instead of ps_worker, "
                   "e.g. 'python3 train.py'; it gets the [worker] flags and those after --, and "
                   "the ASYNCPS_* environment (launch/README.md)")
    return p


DEFAULTS = dict(metrics_port_k8s=9400, service_monitor=False, metrics=False, prometheus=False, scrape_interval=1.0, servers=1, workers=1, backend="local", start_timeout=30.0, max_restarts=0,
                grace=5.0, server_flags="", progress="auto", log_tail_lines=20, dry_run=False,
                format="yaml", image="asyncps:latest", storage="1Gi", port=5555, quiet=False,
                transport="tcp", shared_memory_mb=1024, replicas=1, etcd=None, lease_ms=1000,
                etcd_tls="auto", ctl_flags="",
                ssh_opts="-o BatchMode=yes -o StrictHostKeyChecking=no "
                         "-o UserKnownHostsFile=/dev/null -o LogLevel=ERROR")


def parse_args(argv):
    if "--" in argv:
        i = argv.index("--")
        own, extra = argv[:i], argv[i + 1:]
    else:
        own, extra = argv, []
    # "--server_flags --lr=0.1": argparse would take the value for an option.
    joined = []
    for a in own:
        if joined and joined[-1] in ("--server_flags", "--srun_opts", "--ssh_opts",
                                     "--elastic", "--ctl_flags"):
            joined[-1] = joined[-1] + "=" + a
        else:
            joined.append(a)
    parser = make_parser()
    opts = parser.parse_args(joined)
    cfg = {r: [] for r in config_mod.ROLES}
    if opts.config:
        opts.config = config_mod.find_config(opts.config)
        cfg = config_mod.parse_config_file(opts.config)
        from_cfg = config_mod.psrun_defaults(cfg["psrun"], make_parser())
        for k, v in vars(from_cfg).items():
            if getattr(opts, k) is None and v is not None:
                setattr(opts, k, v)
    for k, v in DEFAULTS.items():
        if getattr(opts, k) is None:
            setattr(opts, k, v)
    if opts.bin_dir is None:
        opts.bin_dir = default_bin_dir()
    opts.bin_dir = os.path.abspath(opts.bin_dir)
    opts.worker_extra = extra
    if opts.servers < 1 or opts.workers < 1:
        parser.error("--servers and --workers must be >= 1")
    if opts.replicas < 1 or opts.replicas > 16:
        parser.error("--replicas must be in [1, 16]")
    if opts.worker_cmd is not None and not opts.worker_cmd.strip():
        parser.error("--worker_cmd is empty")
    if opts.prometheus:
        opts.metrics = True
    if not opts.scrape_interval > 0:
        parser.error("--scrape_interval must be > 0")
    if opts.grace < 0 or opts.start_timeout <= 0:
        parser.error("--grace must be >= 0 and --start_timeout > 0")
    check_emulation(parser, opts)
    check_etcd_tls(parser, opts, cfg)
    opts.elastic_plan = []
    if opts.elastic:
        try:
            opts.elastic_plan = elastic_mod.parse_plan(opts.elastic, opts.servers)
        except ValueError as e:
            parser.error("--elastic: %s" % e)
        why = elastic_mod.check_opts(opts)
        if why:
            parser.error(why)
    if opts.transport == "ipc" and opts.backend != "local":
        # psrun's own ps_ctl (readiness, checkpoint, shutdown) must reach the
        # shards' sockets too, so they must be on psrun's host.
        parser.error("--transport ipc needs every shard and worker on psrun's host "
                     "(--backend local), not --backend %s" % opts.backend)
    return opts, cfg


def check_etcd_tls(parser, opts, cfg):
    """--etcd_tls: refused where psrun makes no etcd of its own to secure;
    opts.etcd_tls_on: whether psrun's etcd (if the fleet needs one) runs with
    TLS and authentication."""
    if opts.etcd_tls == "on" and opts.etcd:
        parser.error("--etcd_tls on: psrun makes certificates and users only for the etcd it "
                     "starts; with --etcd give the etcd's --etcd_ca_file, --etcd_cert_file, "
                     "--etcd_key_file, --etcd_user and --etcd_password_file in --server_flags "
                     "and the [server] / [worker] sections of --config")
    if opts.etcd_tls == "on" and opts.backend == "k8s":
        parser.error("--etcd_tls on: not with --backend k8s (the rendered etcd has no TLS or "
                     "authentication yet: its certificates would need Secrets, its users a "
                     "Job, its probes and init containers client certificates)")
    opts.etcd_tls_on = not opts.etcd and opts.backend != "k8s" and (
        opts.etcd_tls == "on" or (opts.etcd_tls == "auto" and
                                  config_mod.uses_curve(opts.server_flags, cfg["server"])))


def check_emulation(parser, opts):
    """--emulate_hosts and its options: consistent, the rate parsed (opts.link_bps)."""
    opts.link_bps = None
    if opts.emulate_hosts is None:
        for name in ("link", "latency", "shard_hosts"):
            if getattr(opts, name) is not None:
                parser.error("--%s needs --emulate_hosts N" % name)
        return
    n = opts.emulate_hosts
    if not 1 <= n <= 64:
        parser.error("--emulate_hosts must be in [1, 64]")
    if opts.backend != "local":
        parser.error("--emulate_hosts runs every emulated host on this machine: "
                     "--backend local, not %s" % opts.backend)
    if opts.transport == "ipc":
        parser.error("--emulate_hosts: hosts talk over TCP (their links), not --transport ipc")
    if opts.metrics or opts.prometheus:
        parser.error("--emulate_hosts: --metrics/--prometheus are not supported yet (the "
                     "processes' metrics ports are inside the hosts' namespaces)")
    if opts.link is not None:
        try:
            opts.link_bps = netns.parse_rate(opts.link)
        except ValueError as e:
            parser.error("--link: %s" % e)
    if opts.latency is not None and not opts.latency > 0:
        parser.error("--latency must be > 0 ms")
    if opts.shard_hosts is not None and not 1 <= opts.shard_hosts <= n:
        parser.error("--shard_hosts must be in [1, --emulate_hosts]")
    if opts.shard_hosts is not None and opts.shard_hosts == n:
        opts.shard_hosts = None


def prepare_run_dir(opts, cfg):
    if not opts.run_dir:
        opts.run_dir = os.path.join("runs", time.strftime("%Y%m%d-%H%M%S", time.gmtime()) +
                                    "-%d" % os.getpid())
    opts.run_dir = os.path.abspath(opts.run_dir)
    if "," in opts.run_dir:
        # Every process reads --flagfile=<run_dir>/flags/...: gflags splits
        # that value at commas, so no process could read its flags.
        raise config_mod.ConfigError(
            "--run_dir %s contains a comma: gflags reads --flagfile as a "
            "comma-separated list, so no process could read its flags; choose "
            "a path without commas" % opts.run_dir)
    os.makedirs(os.path.join(opts.run_dir, "flags"), exist_ok=True)
    if opts.config:
        shutil.copyfile(opts.config, os.path.join(opts.run_dir, "flags", "config.flags"))
    src = opts.config or "(no --config)"
    config_mod.write_flagfile(os.path.join(opts.run_dir, "flags", "server.flags"), cfg["server"],
                              "ps_server flags from %s [server]" % src)
    extra = ["--servers=%d" % opts.servers, "--workers=%d" % opts.workers]
    config_mod.write_flagfile(os.path.join(opts.run_dir, "flags", "worker.flags"), cfg["worker"],
                              "ps_worker flags from %s [worker]" % src)
    with open(os.path.join(opts.run_dir, "flags", "psrun.cmdline"), "w") as f:
        f.write(" ".join(shlex.quote(a) for a in [sys.argv[0]] + sys.argv[1:]) + "\n")
        f.write("# effective: %s\n" % " ".join(extra + [
            "--backend=" + opts.backend, "--bin_dir=" + opts.bin_dir,
            "--start_timeout=%g" % opts.start_timeout, "--max_restarts=%d" % opts.max_restarts,
            "--grace=%g" % opts.grace, "--server_flags=" + shlex.quote(opts.server_flags),
            "--etcd_tls=" + ("on" if getattr(opts, "etcd_tls_on", False) else "off")]))


def serve_between_hosts(opts, where, log):
    """Shards bound to `where`, not loopback: ps_server refuses that without
    CurveZMQ keys. Say so, and serve unencrypted only as an explicit choice
    (--insecure); psrun's own ps_ctl (stats, checkpoint, shutdown) then talks
    from another host: --allow_remote_admin (ps_server takes admin requests
    from loopback only)."""
    with open(os.path.join(opts.run_dir, "flags", "server.flags")) as f:
        if config_mod.uses_curve(opts.server_flags, [f.read()]):
            return
    log("psrun: warning: shards bind %s without CurveZMQ keys: traffic between hosts is "
        "unencrypted (--insecure); give --server_flags=--curve_secret_key=FILE "
        "(ps_ctl keygen) to encrypt it" % where)
    opts.server_flags = ((opts.server_flags or "") + " --insecure --allow_remote_admin").strip()


class _Stopped(Exception):
    """SIGINT/SIGTERM while psrun sets up or removes emulated hosts."""

    def __init__(self, signum):
        super().__init__("signal %d" % signum)
        self.signum = signum


def emulated_hosts(opts, log):
    """Makes the --emulate_hosts network; returns (network, spawn, bind_host).
    Raises netns.NetnsError when it cannot be made (nothing is left then)."""
    network = netns.Network.create(opts.emulate_hosts, rate=opts.link_bps,
                                   latency_ms=opts.latency)
    shard_hosts = opts.shard_hosts or opts.emulate_hosts
    where = procs_mod.place_emulated(opts.emulate_hosts, shard_hosts, opts.servers,
                                     opts.replicas, opts.workers)
    if opts.replicas > shard_hosts:
        log("psrun: warning: %d replicas per group on %d shard host(s): a host holds more than "
            "one replica of a group" % (opts.replicas, shard_hosts))
    log("psrun: %d emulated hosts (namespaces %s-h0..h%d, hub %s at %s), links %s%s" % (
        opts.emulate_hosts, network.tag, opts.emulate_hosts - 1, network.hub,
        network.hub_address, netns.format_rate(opts.link_bps) if opts.link_bps else "unshaped",
        ", latency %g ms" % opts.latency if opts.latency else ""))

    # psrun --elastic: a shard the plan adds (process index past `where`)
    # runs on a new emulated host of its own, as a machine joining the
    # cluster would: h<N>, h<N+1>, ... (network.add_host(): the same bridge,
    # link rate and latency as the others).
    added = {}

    def host(index):
        if index < len(where):
            return network.hosts[where[index]]
        if index not in added:
            try:
                added[index] = network.add_host()
            except netns.NetnsError as e:
                raise LaunchError(None, "no emulated host for a shard --elastic adds: %s" % e)
            log("psrun: emulated host %s (namespace %s, %s) for a shard --elastic adds" % (
                added[index].name, added[index].netns, added[index].address))
        return added[index]

    def spawn(name, argv_, log_path, index):
        return netns.NetnsProc(name, argv_, log_path, host(index))

    def bind_host(m):
        return host(m.rank if m.index is None else m.index).address

    return network, spawn, bind_host


def main(argv=None):
    """psrun; argv: its arguments (default sys.argv[1:], the console script)."""
    if argv is None:
        argv = sys.argv[1:]
    try:
        opts, cfg = parse_args(argv)
    except config_mod.ConfigError as e:
        sys.stderr.write("psrun: %s\n" % e)
        return 2

    if opts.emulate_hosts:
        why = netns.missing_tools()
        if why:
            sys.stderr.write("psrun: --emulate_hosts: %s\n" % why)
            return 2

    if opts.backend == "k8s":
        return k8s.main_from_psrun(opts, cfg)

    try:
        prepare_run_dir(opts, cfg)
    except config_mod.ConfigError as e:
        sys.stderr.write("psrun: %s\n" % e)
        return 2
    log = (lambda *a: None) if opts.quiet else (lambda msg: print(msg, flush=True))

    if opts.backend == "slurm":
        return slurm.main_from_psrun(opts, log)

    if not check_binaries(opts, needed_binaries(opts)):
        return 2

    if opts.emulate_hosts:
        return run_emulated(opts, log)
    if opts.backend == "local":
        def spawn(name, argv_, log_path, index):
            return procs_mod.LocalProc(name, argv_, log_path)
        bind_host = "127.0.0.1"
    else:  # ssh
        if not opts.hostfile:
            sys.stderr.write("psrun: --backend ssh needs --hostfile\n")
            return 2
        with open(opts.hostfile) as f:
            hosts = procs_mod.parse_hostfile(f.read(), opts.hostfile)
        shutil.copyfile(opts.hostfile, os.path.join(opts.run_dir, "flags", "hostfile"))
        ssh_cmd = ["ssh"] + shlex.split(opts.ssh_opts)
        remote_bin = opts.remote_bin_dir

        def spawn(name, argv_, log_path, index):
            # Round-robin over the slots; index past `placement`: a shard
            # psrun --elastic adds (the next slot after all started so far).
            host = procs_mod.place(hosts, 1, start=index)[0]
            if remote_bin and os.path.dirname(argv_[0]) == opts.bin_dir:
                argv_ = [os.path.join(remote_bin, os.path.basename(argv_[0]))] + argv_[1:]
            return procs_mod.SshProc(name, argv_, log_path, host, ssh_cmd, opts.run_dir)

        # Shards bind the address they are reached at when it is an IP literal.
        first = hosts[0][0]
        bind_host = first if all(c.isdigit() or c == "." for c in first) else "*"
        if len({h for h, _ in hosts}) > 1:
            bind_host = "*"
        if not bind_host.startswith("127."):
            serve_between_hosts(opts, bind_host, log)
        far = [h for h, _ in hosts if not _loopback(h)]
        if opts.elastic_plan and not opts.etcd and far:
            log("psrun: warning: --elastic: psrun's etcd listens on 127.0.0.1, which the shards "
                "on %s cannot reach (they ask it only when a change's ps_ctl went away "
                "mid-way); give --etcd ENDPOINTS that every host reaches" % ", ".join(far))

    return run_fleet(opts, log, spawn, bind_host)


def _loopback(host):
    return host == "localhost" or host.startswith("127.") or host == "::1"


def run_fleet(opts, log, spawn, bind_host, network=None):
    progress_cb = None
    want = opts.progress == "on" or (opts.progress == "auto" and sys.stdout.isatty())
    if want and not opts.quiet:
        progress_cb = lambda paths: summary_mod.Progress(paths)
    log("psrun: run folder %s" % opts.run_dir)
    fleet = Fleet(opts, opts.run_dir, spawn, bind_host=bind_host, log=log)
    if network is not None:
        # etcd in the hub, on its address; psrun's ps_ctl from there too.
        fleet.ctl_prefix = network.exec_argv(network.hub)
        fleet.etcd_options = dict(host=network.hub_address, netns=network.hub)
    code, summary = fleet.run(progress_cb)
    text = summary_mod.format_summary(summary)
    (sys.stdout if code == 0 else sys.stderr).write(text + "\n")
    return code


def run_emulated(opts, log):
    """--emulate_hosts: the network, the fleet in it, the network deleted in
    every exit path (a signal before or after the fleet's own handling too)."""
    old = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}

    def on_signal(signum, frame):
        raise _Stopped(signum)

    network = None
    try:
        for s in old:
            signal.signal(s, on_signal)
        network, spawn, bind_host = emulated_hosts(opts, log)
        serve_between_hosts(opts, "the emulated hosts' addresses", log)
        return run_fleet(opts, log, spawn, bind_host, network)
    except netns.NetnsError as e:
        sys.stderr.write("psrun: --emulate_hosts: %s\n" % e)
        return 2
    except _Stopped as e:
        log("psrun: %s: removing the emulated hosts" % signal.Signals(e.signum).name)
        return 128 + e.signum
    finally:
        for s in old:
            signal.signal(s, signal.SIG_IGN)
        if network is not None:
            for err in network.delete():
                sys.stderr.write("psrun: could not delete namespace %s\n" % err)
        for s, h in old.items():
            signal.signal(s, h)
