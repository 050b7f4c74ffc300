"""Fashion-MNIST (any MNIST-format IDX directory) the way ps_worker reads it.

    train = Mnist.load("train")          # pixels standardised like ps_worker
    for epoch in range(epochs):
        for x, y in train.batches(rank, num_workers, batch=64, epoch=epoch):
            ...                          # numpy float32 [b, 1, 28, 28], int64 [b]

The reader is ps_worker's (worker/idx_reader.cc, gzip or raw files), and a
rank's batches are exactly those of a ps_worker of that rank with the same
seed: its partition, shuffled per epoch (worker/data_partition.h).
"""
import numpy as np

from . import _asyncps

DEFAULT_DIR = "/usr/share/datasets/fashion-mnist"


class Mnist:
    def __init__(self, images, labels):
        self.images = images  # float32 [N, 1, rows, cols]
        self.labels = labels  # int64 [N]

    @classmethod
    def load(cls, split, data_dir=DEFAULT_DIR, normalize=True):
        """`split`: train or test. normalize: (p/255 - 0.2860) / 0.3530 as
        ps_worker --normalize (its default); else p/255."""
        mean, std = ((_asyncps.FASHION_MNIST_MEAN, _asyncps.FASHION_MNIST_STDDEV)
                     if normalize else (0.0, 1.0))
        x, y = _asyncps.load_mnist(data_dir, split, mean, std)
        return cls(x.reshape(x.shape[0], 1, x.shape[1], x.shape[2]), y.astype(np.int64))

    def __len__(self):
        return self.labels.shape[0]

    def batches_per_epoch(self, num_workers, batch, drop_last=False):
        """ceil(floor(N / W) / batch), or floor(...) with drop_last (as
        ps_worker, worker/data_partition.h BatchesPerEpoch)."""
        per = len(self) // num_workers
        return per // batch if drop_last else (per + batch - 1) // batch

    def batches(self, rank, num_workers, batch, epoch, seed=1, drop_last=False):
        """This rank's minibatches of `epoch` as (x, y) numpy arrays; with
        drop_last the short last batch of the epoch is left out."""
        order = _asyncps.epoch_order(len(self), rank, num_workers, seed, epoch)
        end = order.shape[0] - order.shape[0] % batch if drop_last else order.shape[0]
        for i in range(0, end, batch):
            idx = order[i:i + batch]
            yield self.images[idx], self.labels[idx]
