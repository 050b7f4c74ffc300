#!/usr/bin/env python3
"""PyTorch reference for ps_bench_worker and bench_pytorch: the 784-256-128-10
MLP (--model mlp) or the CNN of worker/python/examples/cnn.py (--model cnn),
batch 64, one thread, SGD with momentum, on Fashion-MNIST from Debian's
dataset-fashion-mnist. --mode single: one process; --mode ddp: two
processes with DistributedDataParallel over gloo on 127.0.0.1. --max_steps
caps each process's steps (0: one pass over its half). Prints
`samples_per_s=X` (total over processes)."""
import argparse
import gzip
import os
import struct
import time

import sys

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


EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "worker",
                        "python", "examples")
sys.path.insert(0, EXAMPLES)  # cnn (expkit/__init__.py)


def model(kind="mlp"):
    if kind == "cnn":
        import cnn  # the example itself (needs asyncps on PYTHONPATH to import)
        return cnn.make_cnn()
    return torch.nn.Sequential(torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 128),
                               torch.nn.ReLU(), torch.nn.Linear(128, 10))


def train(rank, world, x, y, q, kind, max_steps, port):
    torch.set_num_threads(1)
    m = model(kind)
    if kind == "cnn":
        x = x.reshape(-1, 1, 28, 28)
    if world > 1:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(port))
        dist.init_process_group("gloo", rank=rank, world_size=world)
        m = torch.nn.parallel.DistributedDataParallel(m)
    opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
    idx = torch.arange(rank, x.shape[0], world)
    xs, ys = x[idx], y[idx]
    n = (xs.shape[0] // 64) * 64
    if max_steps:
        n = min(n, max_steps * 64)
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
    ap.add_argument("--model", choices=["mlp", "cnn"], default="mlp")
    ap.add_argument("--max_steps", type=int, default=0)
    ap.add_argument("--port", type=int, default=29533, help="ddp: gloo rendezvous port")
    a = ap.parse_args()
    x, y = load()
    world = 2 if a.mode == "ddp" else 1
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    ps = [ctx.Process(target=train, args=(r, world, x, y, q, a.model, a.max_steps, a.port))
          for r in range(world)]
    for p in ps:
        p.start()
    total = sum(q.get() for _ in ps)
    for p in ps:
        p.join()
    print("samples_per_s=%.1f" % total)


if __name__ == "__main__":
    main()
