#!/usr/bin/env python3
"""A CNN for Fashion-MNIST: two 5x5 convolution layers (32 and 64 channels)
with batch normalisation, ReLU and 2x2 max pooling, then a 128-unit hidden
layer with dropout and the 10-way output, trained through the asyncps
parameter server.

BatchNorm's running statistics are buffers: each worker keeps its own (see
asyncps.torch); the evaluating rank uses its running averages.

  launch/psrun --servers 2 --workers 4 --server_flags '--consistency=ssp --staleness=2
      --optimizer=adam --lr=0.001 --lr_decay_updates=14100' --worker_cmd 'python3 worker/python/examples/cnn.py --epochs 15'
  python3 cnn.py --local --epochs 2          # no parameter server
"""
import sys

import torch

import _common


def make_cnn(channels=(32, 64), bn=True, hidden=128, dropout=0.3):
    c1, c2 = channels
    norm = (lambda c: torch.nn.BatchNorm2d(c)) if bn else (lambda c: torch.nn.Identity())
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, c1, 5, padding=2), norm(c1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(c1, c2, 5, padding=2), norm(c2), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(c2 * 7 * 7, hidden), torch.nn.ReLU(),
        torch.nn.Dropout(dropout), torch.nn.Linear(hidden, 10))


def main(argv=None):
    p = _common.parser(__doc__.split("\n")[0])
    p.add_argument("--channels", default="32,64", help="output channels of the two convolutions")
    p.add_argument("--bn", type=_common._bool, nargs="?", const=True, default=True,
                   help="batch normalisation after each convolution")
    p.add_argument("--hidden", type=int, default=128, help="units of the hidden layer")
    p.add_argument("--dropout", type=float, default=0.3, help="dropout before the output")
    args = _common.parse(p, argv)
    channels = tuple(int(v) for v in args.channels.split(","))
    _common.run(args, make_cnn(channels, args.bn, args.hidden, args.dropout))


if __name__ == "__main__":
    sys.exit(main())
