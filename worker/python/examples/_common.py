"""The training loop shared by the example scripts (mlp.py, cnn.py).

It takes ps_worker's flags (--batch, --epochs, --max_steps, --codec,
--pull_codec, --prefetch_ahead, --drop_last, --eval, --eval_every, --log_every,
--metrics_csv, --seed, --threads, --slowdown, --timeout_s, --heartbeat_ms,
--normalize, --chunk_elems, --placement, --overlap, --pipeline_shards,
--data_dir), so a psrun flag file's [worker]
section drives a Python worker unchanged; flags it does not know are
reported and ignored. --servers/--rank/--num_workers default from the
environment psrun sets (asyncps.env). With --local, or when no servers are
known, it trains in this process with a PyTorch optimizer instead (--lr,
--momentum), from the same initial weights.
"""
import argparse
import itertools
import json
import os
import sys
import time

import torch

import asyncps
import asyncps.torch as apt
from asyncps.data import DEFAULT_DIR, Mnist
from asyncps.metrics import TrainingLog


def _bool(v):
    if v.lower() in ("1", "true", "yes", "on"):
        return True
    if v.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError("expected true or false, got %r" % v)


def parser(description, batch=64):
    p = argparse.ArgumentParser(description=description)
    a = p.add_argument
    a("--servers", default=None, help="shard endpoints (default $ASYNCPS_SERVERS)")
    a("--rank", type=int, default=None, help="default $ASYNCPS_RANK")
    a("--num_workers", type=int, default=None, help="default $ASYNCPS_NUM_WORKERS")
    a("--data_dir", default=DEFAULT_DIR)
    a("--batch", type=int, default=batch)
    a("--epochs", type=int, default=1)
    a("--max_steps", type=int, default=0, help="stop after this many steps (0: no limit)")
    a("--codec", default="none", help="push compression, e.g. topk:ratio=0.01,ef=1")
    a("--pull_codec", default="")
    a("--prefetch_ahead", type=_bool, nargs="?", const=True, default=False)
    a("--drop_last", default="auto", choices=["auto", "true", "false"],
      help="skip each epoch's short last batch; auto: when the shards run BSP")
    a("--eval", default="auto", choices=["auto", "true", "false"], help="auto: rank 0")
    a("--eval_every", type=int, default=0)
    a("--log_every", type=int, default=200)
    a("--metrics_csv", default=None, help="default $ASYNCPS_METRICS_CSV")
    a("--seed", type=int, default=1)
    a("--threads", type=int, default=1, help="torch intra-op threads")
    a("--slowdown", type=float, default=1.0, help="straggler: compute takes F times as long")
    a("--timeout_s", type=float, default=120.0)
    a("--heartbeat_ms", type=int, default=1000)
    a("--normalize", type=_bool, nargs="?", const=True, default=True)
    a("--chunk_elems", type=int, default=1 << 20)
    a("--placement", default="balanced", choices=["balanced", "in_order"],
      help="which shard holds each chunk (ParameterServer placement)")
    a("--overlap", type=_bool, nargs="?", const=True, default=False,
      help="push gradients while backward runs, pull layers in forward order")
    a("--pipeline_shards", type=int, default=0, help="--overlap: shards per push stage")
    a("--local", action="store_true", help="train in this process, no parameter server")
    a("--lr", type=float, default=0.05, help="--local: learning rate")
    a("--momentum", type=float, default=0.9, help="--local: SGD momentum")
    return p


def parse(p, argv=None):
    args, unknown = p.parse_known_args(argv)
    if unknown:
        sys.stderr.write("%s: ignoring flags it does not use: %s\n" % (
            os.path.basename(sys.argv[0]), " ".join(unknown)))
    if args.batch < 1 or args.epochs < 0 or args.max_steps < 0 or args.slowdown < 1:
        p.error("--batch >= 1, --epochs/--max_steps >= 0, --slowdown >= 1")
    if args.epochs == 0 and args.max_steps == 0:
        p.error("one of --epochs or --max_steps must be > 0")
    return args


def shards_run_bsp(ps):
    """True when shard 0's stats say it runs BSP (--drop_last=auto)."""
    return json.loads(ps.client.stats()[0]).get("consistency") == "bsp"


def run(args, model, init=None):
    """Trains `model` as ps_worker trains its MLP; returns the summary dict."""
    torch.set_num_threads(args.threads)
    env = asyncps.worker_env(args.servers, args.rank, args.num_workers, require_servers=False)
    local = args.local or not env.servers
    rank, workers = (0, 1) if local else (env.rank, env.num_workers)
    train = Mnist.load("train", args.data_dir, args.normalize)
    do_eval = args.eval == "true" or (args.eval == "auto" and rank == 0)
    test = Mnist.load("test", args.data_dir, args.normalize) if do_eval else None
    drop_last = args.drop_last == "true"
    per_epoch = train.batches_per_epoch(workers, args.batch, drop_last)
    csv = args.metrics_csv or env.metrics_csv
    if local:
        # The shards' initial values, computed here: same start as through the PS.
        _, params, specs = apt.tensor_specs(model, args.seed, init)
        with torch.no_grad():
            for p, s in zip(params, specs):
                p.copy_(torch.from_numpy(s.initial_values()))
        ps = None
        opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    else:
        ps = apt.ParameterServer(
            model, env.servers, rank, workers, codec=args.codec, pull_codec=args.pull_codec,
            prefetch_ahead=args.prefetch_ahead, seed=args.seed, steps_per_epoch=per_epoch,
            timeout_s=args.timeout_s, heartbeat_s=args.heartbeat_ms / 1000.0,
            chunk_elems=args.chunk_elems, init=init, placement=args.placement,
            overlap=args.overlap, pipeline_shards=args.pipeline_shards)
        opt = apt.DistributedOptimizer(ps)
        if args.drop_last == "auto":
            drop_last = shards_run_bsp(ps)
            per_epoch = train.batches_per_epoch(workers, args.batch, drop_last)
    total = args.epochs * per_epoch if args.epochs else args.max_steps
    if args.max_steps:
        total = min(total, args.max_steps)
    if local:
        print("training %d steps (%d per epoch) locally" % (total, per_epoch), file=sys.stderr)
    else:
        print("training %d steps (%d per epoch, drop_last=%s) against %d shard(s) as rank %d "
              "of %d" % (total, per_epoch, drop_last, len(env.servers), rank, workers),
              file=sys.stderr)
    traffic = ps.traffic if ps else (lambda: None)
    log = TrainingLog(rank, total, csv, args.log_every)

    def evaluate():
        acc, _, secs = apt.evaluate(model, test.images, test.labels)
        log.evaluated(acc, secs)

    model.train()
    step = 0
    for epoch in itertools.count():
        if step >= total:
            break
        for x, y in train.batches(rank, workers, args.batch, epoch, args.seed, drop_last):
            if step >= total:
                break
            if do_eval and args.eval_every > 0 and step > 0 and step % args.eval_every == 0:
                evaluate()
            t0 = time.perf_counter()
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(torch.from_numpy(x)),
                                                     torch.from_numpy(y))
            loss.backward()
            compute_s = time.perf_counter() - t0
            if args.slowdown > 1:
                time.sleep((args.slowdown - 1) * compute_s)
            opt.step()  # through the PS: push, clock, pull the next weights
            lv = loss.item()
            if lv != lv or lv in (float("inf"), float("-inf")):
                raise SystemExit("training diverged: loss is %s at step %d (lower the "
                                 "learning rate)" % (lv, step))
            if step + 1 == total and do_eval:
                evaluate()  # the weights after the last update
            log.step(step, epoch, len(y), lv, compute_s, traffic())
            step += 1
    summary = log.finish(step, traffic())
    if ps:
        for t in ps.tensor_bytes():
            print("TENSOR_BYTES rank=%d tensor=%s raw=%d wire=%d ratio=%.2f" % (
                rank, t["name"], t["raw"], t["wire"], t["raw"] / t["wire"] if t["wire"] else 0))
        tr = ps.traffic()
        ps.close()
        print("codec: encode_ms_total=%.3f steps=%d resends=%d" % (
            tr["encode_ns"] / 1e6, step, tr["resends"]), file=sys.stderr)
    return summary
