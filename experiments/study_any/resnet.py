#!/usr/bin/env python3
"""A user's own training script, not one of asyncps's examples: a small
ResNet-style CNN with BatchNorm (a 3x3 stem, two residual stages with a
strided projection shortcut, global average pooling) on Fashion-MNIST,
through the parameter server with asyncps.torch, its evaluations reported
with one asyncps.metrics call each. launch/psstudy runs it under psrun:

  launch/psstudy experiments/study_any/study.json

  --steps N        training steps per worker
  --batch B        minibatch
  --width C        channels of the first stage (the second has 2C)
  --eval_every N   rank 0 evaluates every N steps (and after the last)
  --eval_images N  test images per evaluation (the first N of the test set)
  --codec SPEC     push codec (e.g. topk:ratio=0.01,ef=1); --pull_codec SPEC
  --seed K         initial weights and data order
  --slowdown F     this rank is a straggler: each step's compute takes F times
                   as long (psstudy passes it to the slowed rank only)
  --threads T      torch threads
Servers, rank and worker count come from psrun's environment (asyncps.env).
"""
import argparse
import sys
import time

import torch

import asyncps.torch as apt
from asyncps.data import Mnist
from asyncps.metrics import TrainingLog


class Block(torch.nn.Module):
    """conv-BN-ReLU-conv-BN plus the input (projected when the shape changes)."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(cout)
        self.conv2 = torch.nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(cout)
        self.short = None
        if stride != 1 or cin != cout:
            self.short = torch.nn.Sequential(torch.nn.Conv2d(cin, cout, 1, stride, bias=False),
                                             torch.nn.BatchNorm2d(cout))

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return torch.relu(y + (x if self.short is None else self.short(x)))


class SmallResNet(torch.nn.Module):
    def __init__(self, width=8, classes=10):
        super().__init__()
        self.stem = torch.nn.Sequential(torch.nn.Conv2d(1, width, 3, 2, 1, bias=False),
                                        torch.nn.BatchNorm2d(width), torch.nn.ReLU())  # 14x14
        self.stage1 = Block(width, width, 1)
        self.stage2 = Block(width, 2 * width, 2)                                      # 7x7
        self.head = torch.nn.Linear(2 * width, classes)

    def forward(self, x):
        x = self.stage2(self.stage1(self.stem(x)))
        return self.head(x.mean((2, 3)))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--width", type=int, default=8)
    p.add_argument("--eval_every", type=int, default=25)
    p.add_argument("--eval_images", type=int, default=2000)
    p.add_argument("--codec", default="none")
    p.add_argument("--pull_codec", default="")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--slowdown", type=float, default=1.0)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)

    model = SmallResNet(args.width)
    train = Mnist.load("train")
    ps = apt.ParameterServer(model, codec=args.codec, pull_codec=args.pull_codec,
                             seed=args.seed, steps_per_epoch=train.batches_per_epoch(
                                 1, args.batch) // 4)
    opt = apt.DistributedOptimizer(ps)
    rank, workers = ps.rank, ps.num_workers
    test = Mnist.load("test") if rank == 0 else None
    log = TrainingLog(rank, args.steps, csv_path=apt.worker_env(
        require_servers=False).metrics_csv, log_every=25)

    def evaluate(step):
        n = args.eval_images
        acc, loss, secs = apt.evaluate(model, test.images[:n], test.labels[:n])
        log.report(step, eval_s=secs, test_acc=acc, test_loss=loss)  # one call

    step, epoch = 0, 0
    model.train()
    while step < args.steps:
        for x, y in train.batches(rank, workers, args.batch, epoch, args.seed, drop_last=True):
            t0 = time.perf_counter()
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(torch.from_numpy(x)),
                                                     torch.from_numpy(y))
            loss.backward()
            compute_s = time.perf_counter() - t0
            if args.slowdown > 1:
                time.sleep((args.slowdown - 1) * compute_s)
            opt.step()  # push the gradients, pull the shards' weights
            step += 1
            if rank == 0 and (step % args.eval_every == 0 or step == args.steps):
                evaluate(step)
            log.step(step - 1, epoch, len(y), loss.item(), compute_s, ps.traffic())
            if step >= args.steps:
                break
        epoch += 1
    log.finish(step, ps.traffic())
    ps.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
