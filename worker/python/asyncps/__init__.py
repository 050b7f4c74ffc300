"""asyncps: train with the asyncps parameter server from Python.

A thin binding of the C++ client stack (worker/client.h, worker/ps_store.h,
compression/compressor.h):

    Client(servers, rank=...)          connection to every shard; register(),
                                       stats(), checkpoint(), shutdown();
                                       pull_rows(), push_rows() of sparse tables;
                                       upload(), optimizer_state(), read_rows()
                                       (rows with their optimizer state)
    Store(client, tensors, push_codec=..., pull_codec=..., prefetch_ahead=...)
                                       per step: pull(c, bufs), push(c, grads),
                                       clock(c + 1); traffic() counters
    TensorSpec(name, shape, init, param, seed)
    TableSpec(name, dim, init, param, seed, optimizer, lr, ...)  a sparse table
    Compressor(spec, chunk_sizes, seed) the worker's codec state (EF, DGC)
    parse_codec(spec), decode(payload, n)
    load_mnist(dir, split), epoch_order(...)   the data path of ps_worker

Buffers are numpy float32 C-contiguous arrays (asyncps.torch passes torch
CPU tensors as the numpy views sharing their memory): pull() writes into
them, push() reads them in place, nothing else is copied. Every call that
waits releases the GIL (so does compression) and raises KeyboardInterrupt
within ~50 ms of Ctrl-C. Errors are asyncps.Error subclasses (asyncps.errors).

asyncps.torch has the PyTorch integration (ParameterServer,
DistributedOptimizer, SparseEmbedding); asyncps.env the launcher contract (psrun --worker_cmd).
PyTorch is optional (pip install 'asyncps[torch]'): this module and all but
asyncps.torch, asyncps.overlap and asyncps.torch_update import without it.
The compiled _asyncps fits the CPython it was built with (Debian 12: 3.11).
"""
from . import errors
from .errors import *  # noqa: F401,F403
from ._asyncps import (FASHION_MNIST_MEAN, FASHION_MNIST_STDDEV, Client, Compressor, Store,
                       TableSpec, TensorSpec, built_with_cuda, codec_name, decode, epoch_order, load_mnist,
                       parse_codec)
from .env import WorkerEnv, worker_env

__all__ = errors.__all__ + [
    "Client", "Store", "TensorSpec", "TableSpec", "Compressor", "parse_codec", "codec_name", "decode",
    "load_mnist", "epoch_order", "FASHION_MNIST_MEAN", "FASHION_MNIST_STDDEV",
    "built_with_cuda", "WorkerEnv", "worker_env"]
