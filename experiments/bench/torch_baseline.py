#!/usr/bin/env python3
"""PyTorch reference for ps_bench_worker: the 784-256-128-10 MLP, batch 64,
one thread, SGD with momentum, on Fashion-MNIST from Debian's
dataset-fashion-mnist. --mode single: one process; --mode ddp: two
processes with DistributedDataParallel over gloo on 127.0.0.1. Prints
`samples_per_s=X` (total over processes). Needs python3-torch, which is not
a dependency of asyncps."""
import argparse
import gzip
import os
import struct
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

DATA = "/usr/share/datasets/fashion-mnist"


def load():
    with gzip.open(os.path.join(DATA, "train-images-idx3-ubyte.gz")) as f:
        _, n, r, c = struct.unpack(">IIII", f.read(16))
        x = np.frombuffer(f.read(), np.uint8).reshape(n, r * c).astype(np.float32) / 255.0
    with gzip.open(os.path.join(DATA, "train-labels-idx1-ubyte.gz")) as f:
        f.read(8)
        y = np.frombuffer(f.read(), np.uint8).astype(np.int64)
    return torch.from_numpy((x - 0.286) / 0.353), torch.from_numpy(y)


def model():
    return torch.nn.Sequential(torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 128),
                               torch.nn.ReLU(), torch.nn.Linear(128, 10))


def train(rank, world, x, y, q):
    torch.set_num_threads(1)
    m = model()
    if world > 1:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29533")
        dist.init_process_group("gloo", rank=rank, world_size=world)
        m = torch.nn.parallel.DistributedDataParallel(m)
    opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
    idx = torch.arange(rank, x.shape[0], world)
    xs, ys = x[idx], y[idx]
    n = (xs.shape[0] // 64) * 64
    t0 = time.perf_counter()
    for i in range(0, n, 64):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(m(xs[i:i + 64]), ys[i:i + 64]).backward()
        opt.step()
    q.put(n / (time.perf_counter() - t0))
    if world > 1:
        dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=["single", "ddp"], default="single")
    a = ap.parse_args()
    x, y = load()
    world = 2 if a.mode == "ddp" else 1
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    ps = [ctx.Process(target=train, args=(r, world, x, y, q)) for r in range(world)]
    for p in ps:
        p.start()
    total = sum(q.get() for _ in ps)
    for p in ps:
        p.join()
    print("samples_per_s=%.1f" % total)


if __name__ == "__main__":
    main()
