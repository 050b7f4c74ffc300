"""Sparse tables from Python against real ps_server processes: pull_rows /
push_rows round trip exactly (repeated keys summed, keys spread over two
shards), bad input is refused with a clear exception and changes no row, and
asyncps.torch.SparseEmbedding learns a planted click model."""
import json

import numpy as np
import pytest

import asyncps
from conftest import endpoints


def emb(dim=4, optimizer="sgd", lr=0.5):
    return asyncps.TableSpec("emb", dim, "uniform", 0.1, 3, optimizer, lr)


def connect(group, tables):
    client = asyncps.Client(endpoints(group), rank=0, timeout_s=30)
    client.register([asyncps.TensorSpec("d", [4])], tables=tables)
    return client


def test_rows_round_trip_exactly(shards):
    group = shards(2, flags=("--optimizer=sgd", "--lr=0.1"))
    client = connect(group, [emb(), asyncps.TableSpec("side", 3)])
    assert [t.name for t in client.tables] == ["emb", "side"]
    keys = np.array([5, 7, 5, 2**63 + 1, 9, 123456789012, 7], np.uint64)
    spec = client.tables[0]
    start = client.pull_rows("emb", keys)
    assert start.shape == (7, 4) and start.dtype == np.float32
    assert np.array_equal(start, spec.initial_rows(keys))
    assert np.array_equal(client.pull_rows(0, keys), start)  # by index
    rng = np.random.default_rng(5)
    grads = (rng.integers(-16, 17, size=(7, 4)) / 64).astype(np.float32)  # exact sums
    client.push_rows("emb", keys, grads)
    want = spec.initial_rows(keys)
    for k in np.unique(keys):
        at = keys == k
        want[at] -= np.float32(0.5) * grads[at].sum(axis=0)
    assert np.array_equal(client.pull_rows("emb", keys), want)
    # Lists of ints and int64 arrays are keys too.
    assert np.array_equal(client.pull_rows("emb", [5, 9]), want[[0, 4]])
    assert client.pull_rows("side", np.array([], np.uint64)).shape == (0, 3)


def test_bad_row_input_is_refused_and_changes_nothing(shards):
    group = shards(1, flags=("--optimizer=sgd",))
    client = connect(group, [emb()])
    keys = np.array([1, 2, 3], np.uint64)
    before = client.pull_rows("emb", keys)
    with pytest.raises(asyncps.InvalidArgument, match=r"shape \(3, 4\)"):
        client.push_rows("emb", keys, np.zeros((3, 5), np.float32))
    with pytest.raises(asyncps.InvalidArgument, match="1-d"):
        client.pull_rows("emb", keys.reshape(3, 1))
    with pytest.raises(asyncps.NotFound, match="'nope'"):
        client.pull_rows("nope", keys)
    with pytest.raises(asyncps.NotFound):
        client.push_rows(3, keys, np.zeros((3, 4), np.float32))
    bad = np.zeros((3, 4), np.float32)
    bad[1, 2] = np.nan
    with pytest.raises(asyncps.InvalidArgument, match="NaN"):
        client.push_rows("emb", keys, bad)
    with pytest.raises(asyncps.InvalidArgument):
        asyncps.TableSpec("bad", 0)
    with pytest.raises(asyncps.InvalidArgument, match="optimizer|adagrad"):
        asyncps.TableSpec("bad", 4, optimizer="lion")
    assert np.array_equal(client.pull_rows("emb", keys), before)
    # Another client registering other tables on the same shards is refused.
    other = asyncps.Client(endpoints(group), rank=0, timeout_s=30)
    with pytest.raises(asyncps.AlreadyExists, match="emb"):
        other.register([asyncps.TensorSpec("d", [4])], tables=[emb(dim=8)])


def test_sparse_embedding_learns_a_planted_click_model(shards):
    torch = pytest.importorskip("torch")
    import asyncps.torch as apt
    group = shards(2, flags=("--optimizer=sgd", "--lr=0.05", "--consistency=asp"))
    torch.manual_seed(0)
    rng = np.random.default_rng(11)
    ids = rng.integers(0, 2**62, size=300, dtype=np.int64)  # spread over the shards
    label = (rng.random(300) < 0.5).astype(np.float32)       # planted: y depends on id

    class Clicks(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = apt.SparseEmbedding("ids", 4, init="normal", param=0.01,
                                           optimizer="adagrad", lr=0.5)
            self.out = torch.nn.Linear(4, 1)

        def forward(self, x):
            return self.out(self.emb(x)).squeeze(-1)

    model = Clicks()
    ps = apt.ParameterServer(model, servers=endpoints(group), rank=0, num_workers=1,
                             heartbeat_s=0.0)
    opt = apt.DistributedOptimizer(ps)
    loss_fn = torch.nn.BCEWithLogitsLoss()

    def full_loss():
        with torch.no_grad():
            return loss_fn(model(torch.from_numpy(ids)), torch.from_numpy(label)).item()

    first = full_loss()
    for step in range(120):
        pick = rng.integers(0, 300, size=64)
        opt.zero_grad()
        loss = loss_fn(model(torch.from_numpy(ids[pick])), torch.from_numpy(label[pick]))
        loss.backward()
        opt.step()
    last = full_loss()
    ps.close()
    assert first > 0.6, first
    assert last < 0.35 * first, (first, last)
    stats = ps.client.stats()
    assert all('"sparse"' in s for s in stats)


def test_sparse_embedding_pushes_once_per_step_and_refuses_bsp(shards):
    torch = pytest.importorskip("torch")
    import asyncps.torch as apt
    group = shards(1, flags=("--optimizer=sgd", "--lr=0.1", "--consistency=ssp",
                             "--staleness=1"))
    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = apt.SparseEmbedding("e", 2, init="zeros", optimizer="sgd", lr=1.0)
            self.b = torch.nn.Parameter(torch.zeros(1))

        def forward(self, x):
            return self.emb(x).sum() + self.b.sum()

    model = Model()
    ps = apt.ParameterServer(model, servers=endpoints(group), rank=0, num_workers=1,
                             heartbeat_s=0.0, init={"b": ("zeros", 0.0)})
    opt = apt.DistributedOptimizer(ps)
    ids = torch.tensor([3, 4, 3])
    opt.zero_grad()
    # Two forward passes in one step: id 3 gets 2 + 1, id 4 gets 1.
    (model(ids) + model(torch.tensor([3]))).backward()
    opt.step()
    rows = ps.client.pull_rows("e", np.array([3, 4, 5], np.uint64), clock=ps.clock)
    assert np.array_equal(rows, np.array([[-3, -3], [-1, -1], [0, 0]], np.float32))
    stats = [json.loads(s) for s in ps.client.stats()]
    assert stats[0]["pushes"] == 2  # one of the rows, one of the dense tensor
    ps.close()

    bsp = shards(1, flags=("--consistency=bsp",))
    with pytest.raises(asyncps.FailedPrecondition, match="ssp or asp"):
        apt.ParameterServer(Model(), servers=endpoints(bsp), rank=0, num_workers=1,
                            heartbeat_s=0.0, init={"b": ("zeros", 0.0)})
