#!/usr/bin/env python3
"""ps_worker's MLP in PyTorch: 784-256-128-10 with ReLU, softmax cross-entropy,
on Fashion-MNIST from Debian's dataset-fashion-mnist.

The tensors are ps_worker's own (fc<i>.weight [in, out] with He-normal
initialisation, fc<i>.bias zeros, same seed), so this worker and ps_worker
train the same model from the same initial weights -- they can even share a
fleet.

  # under psrun (servers, rank, worker count from the environment):
  launch/psrun --servers 2 --workers 4 --config launch/configs/fashion_ssp.flags \
      --worker_cmd 'python3 worker/python/examples/mlp.py'
  # alone against running shards:
  python3 mlp.py --servers tcp://127.0.0.1:5555 --epochs 3
  # alone, no parameter server (PyTorch SGD in this process):
  python3 mlp.py --local --epochs 3 --lr 0.05
"""
import sys

import torch

import _common


class Mlp(torch.nn.Module):
    def __init__(self, layers):
        super().__init__()
        self.n = len(layers) - 1
        for i in range(self.n):
            setattr(self, "fc%d" % i, torch.nn.Module())
            fc = getattr(self, "fc%d" % i)
            fc.weight = torch.nn.Parameter(torch.empty(layers[i], layers[i + 1]))
            fc.bias = torch.nn.Parameter(torch.empty(layers[i + 1]))

    def forward(self, x):
        x = x.flatten(1)
        for i in range(self.n):
            fc = getattr(self, "fc%d" % i)
            x = torch.addmm(fc.bias, x, fc.weight)
            if i + 1 < self.n:
                x = torch.relu(x)
        return x


def init(layers):
    """ps_worker's initialisers (worker/model.cc MlpTensorSpecs)."""
    out = {}
    for i in range(len(layers) - 1):
        out["fc%d.weight" % i] = ("he_normal", 0.0)
        out["fc%d.bias" % i] = ("zeros", 0.0)
    return out


def main(argv=None):
    p = _common.parser(__doc__.split("\n")[0])
    p.add_argument("--layers", default="784,256,128,10")
    args = _common.parse(p, argv)
    layers = [int(v) for v in args.layers.split(",")]
    if len(layers) < 2 or layers[0] != 784 or layers[-1] != 10:
        p.error("--layers must start with 784 and end with 10")
    _common.run(args, Mlp(layers), init(layers))


if __name__ == "__main__":
    sys.exit(main())
