#!/usr/bin/env python3
"""bench_overlap: asyncps.torch with overlap=True (asyncps.overlap: pushes in
buckets during backward, pulls by layer in forward order) against the same
fleet without it, and against PyTorch DDP (gloo) on the same links and
processes. One JSON object per line; each figure is the median of --repeats
runs with its spread (min, max), runs interleaved.

Fleet: --shards shards (ps_server, --consistency as given, SGD; default 2)
+ 2 workers, each
worker one process with one thread training the CNN of
worker/python/examples/cnn.py on fixed random batches (Fashion-MNIST shapes;
the data does not change the speed), --warmup steps then --steps timed;
samples/s = the workers' sum. DDP: the same 2 worker processes' model, batch
and steps, torch.optim.SGD, DistributedDataParallel over gloo (25 MiB
buckets).

Settings:
  loopback  every process on 127.0.0.1, unshaped (ratio goal >= 0.97);
  link      4 emulated hosts (launch/pslaunch/netns.py; root): shards on h0,
            h1 (shard i on h(i % 2)), workers (and the DDP ranks) on h2, h3,
            each host's link shaped to --rate both ways (ratio goals >= 1.3
            vs no overlap, >= 1.0 vs DDP).

Usage (as root for `link`):
  PYTHONPATH=build/python /usr/bin/python3 experiments/bench/bench_overlap.py \\
      [--bin_dir build/bin] [--repeats 5] [--settings loopback,link] \\
      [--rate 100mbit] [--batches 64,256] [--consistency bsp] [--quick]
--quick (CI): loopback only, few steps, one repeat: figures only indicative.
--hidden H sets the CNN's hidden units (default 128, the example's 1.8 MB
model; 1024 gives 13.7 MB, communication-bound on a 1gbit link as the
default is on 100mbit); rows name it in "model" ("cnn", "cnn_hidden1024")
and carry the link's rate in "link". Each row also carries the CPU of each
worker process per timed step (all threads; cpu_ms_per_step, and
baseline_cpu_ms_per_step for its baseline) and of each shard process over its
life per step (shard_cpu_ms_per_step), to tell a link-bound step from a
CPU-bound one on a small machine.
--chunk_elems / --placement / --prefetch_ahead / --send_buffer_kb apply to
both asyncps paths
(with --plain_loop a third asyncps run has neither overlap nor prefetch_ahead:
the loop the issue starts from, backward, push, then pull); --shards N
runs N shards (link: shard i on h(i % 2)); --pipeline_shards k is the
overlap path's ParameterServer(pipeline_shards=k) (asyncps.overlap). With
BENCH_OVERLAP_TRAFFIC=1 each asyncps worker prints its Store.traffic()
counters (JSON, stderr). Results and analysis: experiments/results/overlap/.
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
EXAMPLES = os.path.join(REPO, "worker", "python", "examples")
sys.path[:0] = [os.path.join(REPO, "launch"), EXAMPLES]  # pslaunch, cnn (expkit/__init__.py)
import bench_stats  # noqa: E402
import bench_worker  # noqa: E402  (stop)
PY = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
WORKERS = 2
SHARD_HOSTS = 2  # link: shards on h0, h1; workers on h2, h3


# ---- the processes ----------------------------------------------------------
def make_model(batch, hidden=128):
    import torch
    import cnn
    torch.manual_seed(1)
    gen = torch.Generator().manual_seed(2)
    data = [(torch.randn(batch, 1, 28, 28, generator=gen),
             torch.randint(0, 10, (batch,), generator=gen)) for _ in range(4)]
    return cnn.make_cnn(hidden=hidden), data


def timed_loop(model, opt, data, a):
    """--warmup steps, then --steps timed; returns samples/s and sets
    a.cpu_ms_per_step (this process's CPU, all its threads, per timed step)."""
    import torch

    def step(i):
        x, y = data[i % len(data)]
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        t = time.perf_counter()
        loss.backward()
        a.backward_s = getattr(a, "backward_s", 0.0) + time.perf_counter() - t
        opt.step()

    for i in range(a.warmup):
        step(i)
    t0, c0 = time.perf_counter(), time.process_time()
    for i in range(a.warmup, a.warmup + a.steps):
        step(i)
    a.cpu_ms_per_step = (time.process_time() - c0) * 1e3 / a.steps
    return a.steps * a.batch / (time.perf_counter() - t0)


def worker_main(a):
    """One asyncps worker: prints samples_per_s=X cpu_ms_per_step=Y."""
    import torch
    import asyncps.torch as apt
    torch.set_num_threads(1)
    model, data = make_model(a.batch, a.hidden)
    ps = apt.ParameterServer(model, servers=a.servers.split(","), rank=a.rank,
                             num_workers=a.num_workers, overlap=a.overlap == 1,
                             bucket_mb=a.bucket_mb, chunk_elems=a.chunk_elems,
                             prefetch_ahead=a.prefetch_ahead, pipeline_shards=a.pipeline_shards,
                             placement=a.placement, first_bucket_mb=a.first_bucket_mb,
                             send_buffer_kb=a.send_buffer_kb)
    rate = timed_loop(model, apt.DistributedOptimizer(ps), data, a)
    if os.environ.get("BENCH_OVERLAP_TRAFFIC"):  # where the time went (ns, summed)
        stats = ps._overlap.stats if ps._overlap is not None else {}
        print(json.dumps(dict(ps.traffic(), rank=a.rank, overlap=a.overlap,
                              backward_ns=int(a.backward_s * 1e9), **stats)), file=sys.stderr)
    ps.close()
    print("samples_per_s=%.3f cpu_ms_per_step=%.3f" % (rate, a.cpu_ms_per_step), flush=True)


def ddp_main(a):
    """One DDP rank: prints samples_per_s=X cpu_ms_per_step=Y."""
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    host, port = a.master.rsplit(":", 1)
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = host, port
    dist.init_process_group("gloo", rank=a.rank, world_size=a.num_workers)
    model, data = make_model(a.batch, a.hidden)
    model = torch.nn.parallel.DistributedDataParallel(model)
    rate = timed_loop(model, torch.optim.SGD(model.parameters(), lr=0.05), data, a)
    dist.barrier()
    dist.destroy_process_group()
    print("samples_per_s=%.3f cpu_ms_per_step=%.3f" % (rate, a.cpu_ms_per_step), flush=True)


# ---- the fleet ----------------------------------------------------------------
def child_env():
    e = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME=os.environ.get(
        "GLOO_SOCKET_IFNAME", "lo"))
    pkg = os.path.join(REPO, "build", "python")
    if "PYTHONPATH" not in e and os.path.isdir(pkg):
        e["PYTHONPATH"] = pkg
    return e


class Fleet:
    """Where the processes run: `prefix(i)` is the argv prefix of host i
    (None: this namespace), `address(i)` its address."""

    def __init__(self, net=None):
        self.net = net

    def prefix(self, i):
        return self.net.exec_argv(self.net.hosts[i]) if self.net else []

    def address(self, i):
        return self.net.hosts[i].address if self.net else "127.0.0.1"

    def env(self):
        e = child_env()
        if self.net:
            e["GLOO_SOCKET_IFNAME"] = "eth0"
        return e


def start_shards(fleet, tmp, bin_dir, consistency, shards, send_buffer_kb=0):
    procs, eps = [], []
    for i in range(shards):
        ready = os.path.join(tmp, "ready-%d-%d" % (i, time.monotonic_ns()))
        log = open(os.path.join(tmp, "shard%d.log" % i), "a")
        host = i % SHARD_HOSTS
        argv = fleet.prefix(host) + [
            os.path.join(bin_dir, "ps_server"), "--endpoint=tcp://%s:0" % fleet.address(host),
            "--ready_file=" + ready, "--shard_id=%d" % i, "--num_shards=%d" % shards,
            "--num_workers=%d" % WORKERS, "--consistency=" + consistency,
            "--optimizer=sgd", "--lr=0.05", "--checkpoint_every_s=0",
            "--send_buffer_kb=%d" % send_buffer_kb]
        if fleet.net:  # an address other than loopback, inside our own namespaces
            argv += ["--insecure", "--allow_remote_admin"]
        p = subprocess.Popen(argv, stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        procs.append(p)
        for _ in range(2000):
            if os.path.exists(ready) and open(ready).read().strip():
                eps.append(open(ready).read().strip())
                break
            if p.poll() is not None:
                stop_all(procs)
                raise RuntimeError("ps_server exited: see " + log.name)
            time.sleep(0.01)
        else:
            stop_all(procs)
            raise RuntimeError("ps_server not ready")
    return procs, eps


def cpu_seconds(proc):
    """CPU time (user + system, all threads) a running child has used so
    far, from /proc; None where it cannot be read."""
    try:
        with open("/proc/%d/stat" % proc.pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def stop_all(procs):
    for p in procs:
        if p.poll() is None:
            bench_worker.stop(p)


def run_children(fleet, argvs, cpu=None):
    """Runs one child per worker host (h2, h3 / local) and returns the sum
    of their samples/s; appends each child's CPU ms per step to `cpu`."""
    procs = [subprocess.Popen(fleet.prefix(SHARD_HOSTS + r if fleet.net else 0) + argv,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=fleet.env()) for r, argv in enumerate(argvs)]
    total, errors = 0.0, []
    for p in procs:
        try:
            out, err = p.communicate(timeout=900)
        except subprocess.TimeoutExpired:
            stop_all(procs)
            raise
        if p.returncode != 0:
            errors.append(err[-3000:])
            continue
        if os.environ.get("BENCH_OVERLAP_TRAFFIC"):
            sys.stderr.write(err)
        fields = dict(kv.split("=", 1) for kv in out.strip().splitlines()[-1].split())
        total += float(fields["samples_per_s"])
        if cpu is not None:
            cpu.append(float(fields["cpu_ms_per_step"]))
    if errors:
        raise RuntimeError("a child failed:\n" + "\n".join(errors))
    return total


def run_ps(fleet, tmp, bin_dir, consistency, overlap, a, batch, cpu=None, shard_cpu=None,
           prefetch_ahead=None):
    """One asyncps run; appends the workers' CPU ms per timed step to `cpu`
    and each shard's (its whole life, start-up and warm-up included, per
    step) to `shard_cpu`. prefetch_ahead: None is a.prefetch_ahead."""
    if prefetch_ahead is None:
        prefetch_ahead = a.prefetch_ahead
    shards, eps = start_shards(fleet, tmp, bin_dir, consistency, a.shards, a.send_buffer_kb)
    try:
        rate = run_children(fleet, [[
            PY, os.path.abspath(__file__), "--worker", "--servers", ",".join(eps),
            "--rank", str(r), "--num_workers", str(WORKERS), "--overlap", str(int(overlap)),
            "--bucket_mb", str(a.bucket_mb), "--first_bucket_mb", str(a.first_bucket_mb),
            "--batch", str(batch), "--steps", str(a.steps),
            "--warmup", str(a.warmup), "--chunk_elems", str(a.chunk_elems),
            "--pipeline_shards", str(a.pipeline_shards), "--placement", a.placement,
            "--hidden", str(a.hidden), "--send_buffer_kb", str(a.send_buffer_kb)] +
            (["--prefetch_ahead"] if prefetch_ahead else []) for r in range(WORKERS)], cpu)
        if shard_cpu is not None:
            for p in shards:
                c = cpu_seconds(p)
                if c is not None:
                    shard_cpu.append(c * 1e3 / (a.warmup + a.steps))
        return rate
    finally:
        stop_all(shards)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ddp(fleet, a, batch, cpu=None):
    master = "%s:%d" % (fleet.address(SHARD_HOSTS) if fleet.net else "127.0.0.1", free_port())
    return run_children(fleet, [[
        PY, os.path.abspath(__file__), "--ddp", "--master", master, "--rank", str(r),
        "--num_workers", str(WORKERS), "--batch", str(batch), "--steps", str(a.steps),
        "--warmup", str(a.warmup), "--hidden", str(a.hidden)] for r in range(WORKERS)], cpu)


def spread(values, digits=1):
    return bench_stats.spread(values, digits)


def cpu_spread(values):
    """spread() of CPU figures, one per process and run ("values")."""
    return bench_stats.spread(values, 1, "values")


def emit(obj):
    print(json.dumps(obj), flush=True)


def bench_setting(setting, fleet, tmp, a):
    for batch in [int(b) for b in a.batches.split(",")]:
        plain, over, ddp = [], [], []
        cpu_plain, cpu_over, cpu_ddp, cpu_shards = [], [], [], []
        loop, cpu_loop = [], []  # --plain_loop: no overlap and no prefetch
        for _ in range(a.repeats):  # interleaved: load drifts hit all three alike
            plain.append(run_ps(fleet, tmp, a.bin_dir, a.consistency, False, a, batch, cpu_plain))
            over.append(run_ps(fleet, tmp, a.bin_dir, a.consistency, True, a, batch, cpu_over,
                               cpu_shards))
            if setting == "link" or a.ddp_on_loopback:
                ddp.append(run_ddp(fleet, a, batch, cpu_ddp))
            if a.plain_loop and a.prefetch_ahead:
                loop.append(run_ps(fleet, tmp, a.bin_dir, a.consistency, False, a, batch,
                                   cpu_loop, prefetch_ahead=False))
        common = {"bench": "overlap", "model": "cnn" if a.hidden == 128 else "cnn_hidden%d" % a.hidden, "setting": setting,
                  "link": a.rate if setting == "link" else "loopback",
                  "consistency": a.consistency, "shards": a.shards, "workers": WORKERS,
                  "batch": batch, "threads": 1, "bucket_mb": a.bucket_mb,
                  "first_bucket_mb": a.first_bucket_mb,
                  "chunk_elems": a.chunk_elems, "placement": a.placement,
                  "prefetch_ahead": a.prefetch_ahead, "send_buffer_kb": a.send_buffer_kb,
                  "tcp_wmem": a.tcp_wmem,
                  "pipeline_shards": a.pipeline_shards,
                  "steps_per_worker": a.steps, "warmup_steps": a.warmup,
                  "samples_per_s": spread(over),
                  # CPU per timed step of each worker process (all threads), and of
                  # each shard over its life (start-up and warm-up included)
                  "cpu_ms_per_step": cpu_spread(cpu_over),
                  "shard_cpu_ms_per_step": cpu_spread(cpu_shards)}
        emit(dict(common, baseline="asyncps_no_overlap", baseline_samples_per_s=spread(plain),
                  baseline_cpu_ms_per_step=cpu_spread(cpu_plain),
                  ratio=spread([o / p for o, p in zip(over, plain)], 3),
                  target=0.97 if setting == "loopback" else 1.3))
        if loop:  # the loop of asyncps.torch without overlap or prefetch_ahead
            emit(dict(common, baseline="asyncps_plain_loop", baseline_samples_per_s=spread(loop),
                      baseline_cpu_ms_per_step=cpu_spread(cpu_loop),
                      ratio=spread([o / p for o, p in zip(over, loop)], 3),
                      target=0.97 if setting == "loopback" else 1.3))
        if ddp:
            emit(dict(common, baseline="pytorch_ddp_gloo_2proc",
                      baseline_samples_per_s=spread(ddp),
                      baseline_cpu_ms_per_step=cpu_spread(cpu_ddp),
                      ratio=spread([o / d for o, d in zip(over, ddp)], 3), target=1.0))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_fleet_args(ap)
    ap.add_argument("--batches", default="64,256")
    ap.add_argument("--shards", type=int, default=2,
                    help="ps_server shards (link: spread over the 2 shard hosts)")
    ap.add_argument("--bucket_mb", type=float, default=25.0)
    ap.add_argument("--first_bucket_mb", type=float, default=1.0,
                    help="ParameterServer first_bucket_mb (each step's first bucket; ASP/SSP)")
    ap.add_argument("--pipeline_shards", type=int, default=0,
                    help="overlap path: ParameterServer(pipeline_shards=), clocked shards whose "
                    "pushes may share the link before the next push waits (0: no limit)")
    ap.add_argument("--chunk_elems", type=int, default=1 << 20,
                    help="layout chunk size (ParameterServer chunk_elems); smaller spreads "
                    "the CNN's large layer over both shards")
    ap.add_argument("--placement", default="balanced", choices=["balanced", "in_order"],
                    help="layout placement (ParameterServer placement): in_order puts the "
                    "last layers on the last shards, whose pushes then leave during backward")
    ap.add_argument("--prefetch_ahead", action="store_true",
                    help="both asyncps paths pull ahead (ASP/SSP)")
    ap.add_argument("--hidden", type=int, default=128,
                    help="units of the CNN's hidden layer (cnn.make_cnn hidden): 128 is "
                    "the example's 1.8 MB model; 1024 a 13.7 MB one")
    ap.add_argument("--send_buffer_kb", type=int, default=0,
                    help="both asyncps paths: ps_server --send_buffer_kb and "
                    "ParameterServer(send_buffer_kb=) (0: the OS default)")
    ap.add_argument("--tcp_wmem", default="",
                    help="link: net.ipv4.tcp_wmem of every emulated host ('min default "
                    "max' bytes), the system-wide cap of autotuned send buffers, DDP's "
                    "included (compare with --send_buffer_kb, which only asyncps sets)")
    ap.add_argument("--plain_loop", action="store_true",
                    help="with --prefetch_ahead: also run asyncps without overlap and without "
                    "prefetch_ahead (push after backward, then pull) as a third baseline, "
                    "asyncps_plain_loop")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--ddp_on_loopback", action="store_true")
    ap.add_argument("--quick", action="store_true", help="CI: loopback, few steps, 1 repeat")
    # child modes
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--ddp", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--servers", help=argparse.SUPPRESS)
    ap.add_argument("--master", help=argparse.SUPPRESS)
    ap.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--num_workers", type=int, default=WORKERS, help=argparse.SUPPRESS)
    ap.add_argument("--overlap", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--batch", type=int, default=64, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        return worker_main(a)
    if a.ddp:
        return ddp_main(a)
    if a.quick:
        a.settings, a.repeats, a.steps, a.warmup, a.batches = "loopback", 1, 8, 2, "64"
    run_settings(ap, a, "ovb", bench_setting)


def add_fleet_args(ap):
    """The options of the fleet and its test beds (run_settings)."""
    ap.add_argument("--bin_dir", default=os.path.join(REPO, "build", "bin"))
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--settings", default="loopback,link")
    ap.add_argument("--rate", default="100mbit")
    ap.add_argument("--consistency", default="bsp", choices=["bsp", "ssp", "asp"])


def run_settings(ap, a, tag, bench):
    """Calls bench(setting, fleet, tmp, a) for each of a.settings (loopback;
    link: emulated hosts with links shaped to a.rate, namespaces tagged
    tag + pid, skipped with a message where they cannot be made)."""
    with tempfile.TemporaryDirectory(prefix="bench_%s." % tag) as tmp:
        for setting in a.settings.split(","):
            if setting == "loopback":
                bench(setting, Fleet(), tmp, a)
            elif setting == "link":
                from pslaunch import netns
                missing = netns.unavailable("%s%d" % (tag, os.getpid()))
                if missing:
                    print("SKIP link: %s" % missing, file=sys.stderr)
                    continue
                with netns.Network.create(SHARD_HOSTS + WORKERS, rate=netns.parse_rate(a.rate),
                                          tag="%s%d" % (tag, os.getpid())) as net:
                    if getattr(a, "tcp_wmem", ""):  # every host's TCP, DDP's too
                        for h in net.hosts:
                            subprocess.run(net.exec_argv(h) + [
                                "sysctl", "-q", "-w", "net.ipv4.tcp_wmem=" + a.tcp_wmem],
                                check=True)
                    bench(setting, Fleet(net), tmp, a)
            else:
                ap.error("unknown setting " + setting)


if __name__ == "__main__":
    sys.exit(main())
