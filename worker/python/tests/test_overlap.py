"""asyncps.torch with overlap=True (asyncps.overlap) on real shards: BSP
results bitwise equal to the unoverlapped path, the SSP bound with pushes
in several buckets per step, Store.push_chunks, misuse errors."""
import threading
import time

import numpy as np
import pytest
import torch

import asyncps
import asyncps.torch as apt
from conftest import endpoints
from test_torch import small_cnn


def run_workers(fn, n):
    errors = []

    def wrap(rank):
        try:
            fn(rank)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=wrap, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors


def train_bsp(eps, overlap, steps=6, codec="none", bucket_mb=25.0, pipeline_shards=0,
              placement="balanced"):
    """2 workers (threads) x `steps` BSP steps of small_cnn on fixed random
    batches; returns the final weights of each worker (pulled after the last
    step) and the overlap stats."""
    gen = torch.Generator().manual_seed(7)
    xs = torch.randn(steps, 2, 32, 1, 28, 28, generator=gen)
    ys = torch.randint(0, 10, (steps, 2, 32), generator=gen)
    final, stats = {}, {}

    def worker(rank):
        m = small_cnn()
        ps = apt.ParameterServer(m, servers=eps, rank=rank, num_workers=2, codec=codec,
                                 overlap=overlap, bucket_mb=bucket_mb,
                                 pipeline_shards=pipeline_shards, placement=placement)
        if rank == 0:
            stats["chunks"] = ps.client.chunks()
        if overlap:
            ps._overlap.min_group_bytes = 1  # a pull group per module
        opt = apt.DistributedOptimizer(ps)
        for c in range(steps):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(m(xs[c, rank]), ys[c, rank]).backward()
            opt.step()
        ps.pull()
        final[rank] = [p.detach().clone() for p in ps.params]
        if ps._overlap is not None:
            stats[rank] = dict(ps._overlap.stats)
        ps.close()

    run_workers(worker, 2)
    return final, stats


@pytest.mark.parametrize("codec,pipeline", [("none", 0), ("topk:ratio=0.05,ef=1", 0),
                                            ("none", 1)])
def test_bsp_overlap_is_bitwise_equal_to_the_plain_path(shards, codec, pipeline):
    """pipeline 1: the sender waits for each clocked shard's push to be
    acknowledged before the next shard's (pipeline_shards=1)."""
    torch.set_num_threads(1)
    flags = ["--consistency=bsp", "--optimizer=momentum", "--lr=0.05"]
    plain, _ = train_bsp(endpoints(shards(2, flags, num_workers=2)), False, codec=codec)
    over, stats = train_bsp(endpoints(shards(2, flags, num_workers=2)), True, codec=codec,
                            pipeline_shards=pipeline)
    for rank in (0, 1):
        assert stats[rank]["steps"] == 6 and stats[rank]["buckets"] == 12  # one per shard
        assert stats[rank]["pull_groups"] == 6 * 5  # 5 modules with parameters
        # From the second step on each shard got its clock (and its part of
        # the pull) right behind its push: per-shard clocks in every step.
        assert 5 <= stats[rank]["shard_clocks"] <= 5 * 2
        if pipeline:  # the second shard's push waited for the first's
            assert stats[rank]["stage_waits"] >= 5
        else:
            assert stats[rank]["stage_waits"] == 0
        for a, b in zip(plain[rank], over[rank]):
            assert torch.equal(a, b)
    assert any(not torch.equal(a, b) for a, b in zip(plain[0], small_cnn().parameters()))


def test_in_order_placement_trains_like_balanced_and_is_enforced(shards):
    """placement="in_order" (the last layers on the last shard, so their
    pushes leave during backward) changes where chunks live, not what BSP
    computes: with and without overlap the weights equal the balanced plain
    path's bitwise. A worker naming another placement is refused."""
    torch.set_num_threads(1)
    flags = ["--consistency=bsp", "--optimizer=momentum", "--lr=0.05"]
    balanced, bstats = train_bsp(endpoints(shards(2, flags, num_workers=2)), False)
    plain, pstats = train_bsp(endpoints(shards(2, flags, num_workers=2)), False,
                              placement="in_order")
    eps = endpoints(shards(2, flags, num_workers=2))
    over, stats = train_bsp(eps, True, pipeline_shards=1, placement="in_order")
    for rank in (0, 1):
        assert stats[rank]["buckets"] == 12 and stats[rank]["shard_clocks"] >= 5
        for a, b, c in zip(balanced[rank], plain[rank], over[rank]):
            assert torch.equal(a, b) and torch.equal(a, c)
    # (id, tensor, offset, num_elems, shard): in order, shards never go back,
    # the first tensor is on shard 0 and the last on shard 1; balanced is not.
    owners = [c[4] for c in pstats["chunks"]]
    assert owners == sorted(owners) and owners[0] == 0 and owners[-1] == 1
    assert [c[4] for c in stats["chunks"]] == owners
    assert [c[4] for c in bstats["chunks"]] != owners
    with pytest.raises(asyncps.AlreadyExists, match="placement"):
        apt.ParameterServer(small_cnn(), servers=eps, rank=0, num_workers=2)
    with pytest.raises(asyncps.InvalidArgument, match="placement"):
        apt.ParameterServer(small_cnn(), servers=eps, rank=0, num_workers=2,
                            placement="contiguous")


class Sums(torch.nn.Module):
    """Three parameters whose gradient is 1 everywhere; forward records the
    weights it ran with."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Parameter(torch.zeros(300))
        self.b = torch.nn.Parameter(torch.zeros(70, 10))
        self.c = torch.nn.Parameter(torch.zeros(5))
        self.seen = []

    def forward(self, x):
        self.seen.append([p.detach().clone() for p in (self.a, self.b, self.c)])
        return x * (self.a.sum() + self.b.sum() + self.c.sum())


SUMS_INIT = {"a": ("zeros", 0.0), "b": ("zeros", 0.0), "c": ("zeros", 0.0)}


def test_ssp_bound_holds_with_pushes_in_buckets(shards):
    """SGD with lr 1 and gradients of ones: a weight is minus the number of
    pushes applied to it. Under SSP s=1 a worker's forward at clock c runs
    with all of its own c pushes and at least c - 1 of the other's; every
    bucket of every push is applied exactly once."""
    s, steps = 1, 12
    eps = endpoints(shards(2, ["--consistency=ssp", "--staleness=%d" % s, "--optimizer=sgd",
                               "--lr=1"], num_workers=2))
    models, stats = [Sums(), Sums()], {}
    done = threading.Barrier(2)

    def worker(rank):
        m = models[rank]
        ps = apt.ParameterServer(m, servers=eps, rank=rank, num_workers=2, init=SUMS_INIT,
                                 overlap=True, bucket_mb=0.001)
        for c in range(steps):
            for p in ps.params:
                p.grad = None
            m(torch.ones(())).backward()
            if rank == 1:
                time.sleep(0.05)  # the straggler: rank 0 runs into the bound
            ps.step()
        stats[rank] = dict(ps._overlap.stats)
        ps.flush()
        done.wait(60)  # both pushed everything: the last pull sees all of it
        ps.pull()
        m.seen.append([p.detach().clone() for p in (m.a, m.b, m.c)])
        ps.close()

    run_workers(worker, 2)
    for rank in (0, 1):
        assert stats[rank]["buckets"] >= 2 * steps  # several pushes per step
        assert stats[rank]["shard_clocks"] >= steps - 1  # the pipeline ran
        for c, weights in enumerate(models[rank].seen[:steps]):
            # Each tensor lives on one shard, and shards answer on their own:
            # under SSP each must hold its own c pushes and c - s of the
            # other's, not the same count as a tensor of another shard.
            for w in weights:
                applied = -w.flatten()[0].item()
                assert torch.all(w == -applied), (rank, c)  # a bucket whole
                assert c + max(0, c - s) <= applied <= 2 * steps, (rank, c, applied)
        for w in models[rank].seen[-1]:
            assert torch.all(w == -2.0 * steps)
    # The fast worker waited for the straggler: it saw no more than the bound
    # lets it run ahead.
    assert any(-w[0][0].item() <= 2 * c - 1 + s for c, w in enumerate(models[0].seen[1:steps], 1))


def test_push_chunks_sends_only_the_listed_chunks(shards):
    eps = endpoints(shards(2, ["--optimizer=sgd", "--lr=1"]))
    specs = [asyncps.TensorSpec("x", [1000], "zeros"), asyncps.TensorSpec("y", [10], "zeros")]
    client = asyncps.Client(eps, rank=0)
    store = asyncps.Store(client, specs, chunk_elems=256, min_chunk_elems=256)
    chunks = client.chunks()
    ones = [np.ones(1000, np.float32), np.ones(10, np.float32)]
    x_chunks = [c[0] for c in chunks if c[1] == 0]
    assert len(x_chunks) > 1
    store.push_chunks(0, x_chunks[:1], ones)
    store.clock(1)
    w = [np.zeros(1000, np.float32), np.zeros(10, np.float32)]
    store.pull(1, w)
    first = chunks[x_chunks[0]]
    np.testing.assert_array_equal(w[0][first[2]:first[2] + first[3]], -1.0)
    assert (w[0] == 0).sum() == 1000 - first[3]
    np.testing.assert_array_equal(w[1], 0.0)
    with pytest.raises(asyncps.InvalidArgument, match="listed twice"):
        store.push_chunks(1, [x_chunks[0], x_chunks[0]], ones)
    with pytest.raises(asyncps.InvalidArgument, match="not in the layout"):
        store.push_chunks(1, [len(chunks)], ones)
    store.close()


def test_two_backwards_in_one_step_are_refused(shards):
    eps = endpoints(shards(1, ["--optimizer=sgd", "--lr=0.1"]))
    m = Sums()
    ps = apt.ParameterServer(m, servers=eps, rank=0, num_workers=1, init=SUMS_INIT, overlap=True)
    m(torch.ones(())).backward()
    with pytest.raises(Exception, match="second gradient in one step"):
        m(torch.ones(())).backward()
    ps.close()
    with pytest.raises(asyncps.InvalidArgument, match="bucket_mb"):
        apt.ParameterServer(Sums(), servers=eps, rank=0, num_workers=1, init=SUMS_INIT,
                            overlap=True, bucket_mb=0)


@pytest.mark.parametrize("first_mb,per_step", [(1e-6, 2), (25.0, 1)])
def test_first_bucket_of_a_step_closes_early(shards, first_mb, per_step):
    """As DDP's first bucket: the first gradient of a step leaves alone once
    first_bucket_mb is reached (1e-6: the first parameter ready), the rest
    with the 25 MiB bucket at the end; every gradient applied once."""
    eps = endpoints(shards(1, ["--optimizer=sgd", "--lr=0.1"]))
    m = Sums()
    ps = apt.ParameterServer(m, servers=eps, rank=0, num_workers=1, init=SUMS_INIT,
                             overlap=True, first_bucket_mb=first_mb)
    for _ in range(3):
        for p in ps.params:
            p.grad = None
        m(torch.ones(())).backward()
        ps.step()
    assert ps._overlap.stats["buckets"] == 3 * per_step
    ps.pull()
    for p in ps.params:
        assert torch.allclose(p.detach(), torch.full_like(p, -0.3))
    ps.close()
    with pytest.raises(asyncps.InvalidArgument, match="first_bucket_mb"):
        apt.ParameterServer(Sums(), servers=eps, rank=0, num_workers=1, init=SUMS_INIT,
                            overlap=True, first_bucket_mb=0)


class Reversed(torch.nn.Module):
    """Registered a, b, c; run c, b, a."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(16, 4)
        self.b = torch.nn.Linear(32, 16)
        self.c = torch.nn.Linear(8, 32)

        self.seen = []

    def forward(self, x):
        y = torch.relu(self.c(x))
        y = torch.relu(self.b(y))
        y = self.a(y)
        self.seen.append([p.detach().clone() for p in self.parameters()])  # all pulled now
        return y


@pytest.mark.parametrize("prefetch", [False, True])
def test_layered_pulls_follow_the_forward_order_and_match_the_plain_path(shards, prefetch):
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(3)
    xs, ys = torch.randn(5, 20, 8, generator=gen), torch.randint(0, 4, (5, 20), generator=gen)
    flags = ["--consistency=asp", "--optimizer=momentum", "--lr=0.1"]
    weights = []
    for overlap in (False, True):
        m = Reversed()
        ps = apt.ParameterServer(m, servers=endpoints(shards(2, flags)), rank=0, num_workers=1,
                                 overlap=overlap, bucket_mb=0.0001, prefetch_ahead=prefetch)
        if overlap:
            ps._overlap.min_group_bytes = 1
        opt = apt.DistributedOptimizer(ps)
        for c in range(5):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(m(xs[c]), ys[c]).backward()
            opt.step()
        if not prefetch:  # (with it, a pull at the same clock may return the prefetch)
            ps.pull()
            m.seen.append([p.detach().clone() for p in m.parameters()])
        weights.append([w for seen in m.seen for w in seen])
        if overlap:
            o = ps._overlap
            if prefetch:  # one pull request per step, no groups
                assert not o.layered and o.stats["pull_groups"] == 0
            else:
                order = [[ps.names[t] for t in g] for g, _ in o.groups]
                assert order == [["c.weight", "c.bias"], ["b.weight", "b.bias"],
                                 ["a.weight", "a.bias"]]
                assert o.stats["pull_groups"] == 3 * 5
            assert o.stats["buckets"] >= 2 * 5
        ps.close()
    for a, b in zip(*weights):
        assert torch.equal(a, b)


def test_per_shard_clocks_on_real_shards(shards):
    """Store.clock_shards_and_pull_groups against two BSP ps_server shards
    and one worker: shard 0's round closes and its weights come down before
    shard 1 heard of the clock; a group with chunks on an unclocked shard is
    refused, and so is a push to a clocked shard; clock_and_pull_groups
    does the rest."""
    eps = endpoints(shards(2, ["--consistency=bsp", "--optimizer=sgd", "--lr=1"],
                           num_workers=1))
    specs = [asyncps.TensorSpec("x", [1000], "zeros"), asyncps.TensorSpec("y", [10], "zeros")]
    client = asyncps.Client(eps, rank=0)
    store = asyncps.Store(client, specs, chunk_elems=256, min_chunk_elems=256)
    chunks = client.chunks()
    on = {s: [c[0] for c in chunks if c[4] == s] for s in (0, 1)}
    assert on[0] and on[1]
    groups = [on[0], on[1]]
    ones = [np.ones(1000, np.float32), np.ones(10, np.float32)]
    w = [np.zeros(1000, np.float32), np.zeros(10, np.float32)]
    store.push_chunks(0, on[0], ones)
    store.wait_acks()  # shard 0 has the push
    store.clock_shards_and_pull_groups(1, [0], groups)
    with pytest.raises(asyncps.FailedPrecondition, match="not clocked"):
        store.wait_pull_group(1, w)
    with pytest.raises(asyncps.FailedPrecondition, match="already clocked"):
        store.push_chunks(0, on[0][:1], ones)
    store.wait_pull_group(0, w)  # the round of shard 0 closed without shard 1
    for cid, tensor, off, n, shard in chunks:
        assert (w[tensor][off:off + n] == (-1.0 if shard == 0 else 0.0)).all()
    store.push_chunks(0, on[1], ones)
    store.clock_and_pull_groups(1, groups)
    store.wait_pull_group(1, w)
    np.testing.assert_array_equal(w[0], -1.0)
    np.testing.assert_array_equal(w[1], -1.0)
    # The next step the plain way: the shards' clocks are where they should be.
    store.push(1, ones)
    store.clock(2)
    store.pull(2, w)
    np.testing.assert_array_equal(w[0], -2.0)
    store.close()
