#!/usr/bin/env python3
"""Issue 22 demonstrations on Fashion-MNIST (the CNN of
worker/python/examples/cnn.py), as a psrun --worker_cmd script.

  pretrain   (no PS) train the CNN locally for --epochs with torch Adam and
             save its state_dict (torch.save) to --ckpt; JSON result line.
  finetune   (psrun worker) load --ckpt, ParameterServer(init="model"): one
             worker's values are uploaded, every rank pulls them; rank 0
             evaluates the pulled weights at step 0, then all ranks train
             --epochs more (server-side Adam at ps_server --lr), and rank 0
             evaluates again and saves ps.state_dict() (loaded back into a
             plain model and evaluated: the torch.save round trip).
  optim      (psrun worker) Adam with a OneCycleLR schedule, either on the
             shards (--update server: DistributedOptimizer(ps, lr=) carries
             the scheduled lr; ps_server --optimizer=adam) or on the workers
             (--update worker: WorkerOptimizer over torch.optim.Adam; ps_server
             --optimizer=sgd only sums).

Rank 0 writes its result as JSON to --out (and prints it).
"""
import argparse
import io
import json
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "worker", "python", "examples"))  # cnn (expkit/__init__.py)

import asyncps  # noqa: E402
import asyncps.torch as apt  # noqa: E402
from asyncps.data import DEFAULT_DIR, Mnist  # noqa: E402
from cnn import make_cnn  # noqa: E402


def evaluate(model, test):
    acc, loss, _ = apt.evaluate(model, test.images, test.labels)
    return acc, loss


def batches(train, rank, workers, batch, epoch, seed):
    for x, y in train.batches(rank, workers, batch, epoch, seed, True):
        yield torch.from_numpy(x), torch.from_numpy(y)


def steps_per_epoch(train, workers, batch):
    return train.batches_per_epoch(workers, batch, True)


def write(args, result):
    print("RESULT " + json.dumps(result), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


def pretrain(args, model, train, test):
    torch.manual_seed(args.seed)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    t0 = time.time()
    model.train()
    steps = 0
    for epoch in range(args.epochs):
        for x, y in batches(train, 0, 1, args.batch, epoch, args.seed):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            steps += 1
    acc, loss = evaluate(model, test)
    torch.save(model.state_dict(), args.ckpt)
    write(args, {"mode": "pretrain", "epochs": args.epochs, "steps": steps, "test_acc": acc,
                 "test_loss": loss, "seconds": time.time() - t0, "ckpt": args.ckpt})


def train_through_ps(args, model, ps, opt, sched, train, test, env, start_epoch=0):
    rank, workers = env.rank, env.num_workers
    per = steps_per_epoch(train, workers, args.batch)
    curve = []
    step = 0
    model.train()
    for epoch in range(start_epoch, start_epoch + args.epochs):
        for x, y in batches(train, rank, workers, args.batch, epoch, args.seed):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            if sched is not None:
                sched.step()
            step += 1
            if rank == 0 and args.eval_every and step % args.eval_every == 0 and step < per * args.epochs:
                curve.append([step, evaluate(model, test)[0]])
    return step, curve


def finetune(args, model, train, test):
    env = asyncps.worker_env()
    state = torch.load(args.ckpt)
    model.load_state_dict(state)  # every rank: the same pretrained weights + BN statistics
    t0 = time.time()
    ps = apt.ParameterServer(model, init="model", seed=args.seed, timeout_s=300)
    result = {"mode": "finetune", "rank": env.rank, "workers": env.num_workers,
              "shards": len(env.servers), "uploaded": bool(ps.uploaded)}
    if env.rank == 0:
        pre = make_cnn(args.channels)
        pre.load_state_dict(state)
        result["pretrained_acc"] = evaluate(pre, test)[0]
        result["step0_acc"] = evaluate(model, test)[0]  # the weights pulled from the shards
    opt = apt.DistributedOptimizer(ps)
    steps, curve = train_through_ps(args, model, ps, opt, None, train, test, env, start_epoch=1)
    if env.rank == 0:
        result["final_acc"] = evaluate(model, test)[0]
        sd = ps.state_dict()
        buf = io.BytesIO()
        torch.save(sd, buf)
        buf.seek(0)
        plain = make_cnn(args.channels)
        plain.load_state_dict(torch.load(buf))
        result["saved_reloaded_acc"] = evaluate(plain, test)[0]
        result.update(steps=steps, curve=curve, seconds=time.time() - t0,
                      uploaded_by_rank0=bool(ps.uploaded))
    ps.close()
    if env.rank == 0:
        write(args, result)


def optim(args, model, train, test):
    env = asyncps.worker_env()
    torch.manual_seed(args.seed)
    t0 = time.time()
    ps = apt.ParameterServer(model, seed=args.seed, timeout_s=300)
    total = steps_per_epoch(train, env.num_workers, args.batch) * args.epochs
    if args.update == "worker":
        inner = torch.optim.Adam(model.parameters(), lr=args.lr)
        opt = apt.WorkerOptimizer(ps, inner)
        sched = torch.optim.lr_scheduler.OneCycleLR(inner, max_lr=args.lr, total_steps=total,
                                                    cycle_momentum=False)
    else:
        opt = apt.DistributedOptimizer(ps, lr=args.lr)
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=args.lr, total_steps=total,
                                                    cycle_momentum=False)
    steps, curve = train_through_ps(args, model, ps, opt, sched, train, test, env)
    if env.rank == 0:
        acc, loss = evaluate(model, test)
        stats = [json.loads(t) for t in ps.client.stats()]
        write(args, {"mode": "optim", "update": args.update, "workers": env.num_workers,
                     "shards": len(env.servers), "epochs": args.epochs, "steps": steps,
                     "max_lr": args.lr, "final_acc": acc, "final_loss": loss, "curve": curve,
                     "shard_optimizer": stats[0]["optimizer"],
                     "shard_worker_lr_last": stats[0]["worker_lr"],
                     "seconds": time.time() - t0})
    ps.close()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("mode", choices=["pretrain", "finetune", "optim"])
    p.add_argument("--ckpt", default="pretrained.pt")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--channels", default="16,32")
    p.add_argument("--update", choices=["server", "worker"], default="server")
    p.add_argument("--eval_every", type=int, default=0)
    p.add_argument("--data_dir", default=DEFAULT_DIR)
    p.add_argument("--out", default="")
    args = p.parse_args()
    args.channels = tuple(int(c) for c in args.channels.split(","))
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    model = make_cnn(args.channels)
    train = Mnist.load("train", args.data_dir, True)
    test = Mnist.load("test", args.data_dir, True)
    {"pretrain": pretrain, "finetune": finetune, "optim": optim}[args.mode](
        args, model, train, test)


if __name__ == "__main__":
    sys.exit(main())
