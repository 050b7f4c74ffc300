"""Hybrid consistency (issue 22 item 5, as Persia): ps_server --consistency=bsp
--sparse_consistency=asp keeps dense tensors in BSP rounds while sparse rows
are applied when their push arrives; against real ps_server processes."""
import numpy as np
import pytest
import torch

import asyncps
import asyncps.torch as apt
from conftest import Shard, endpoints, on_threads

HYBRID = ["--consistency=bsp", "--sparse_consistency=asp", "--optimizer=sgd", "--lr=0.5"]


def connect(eps, rank):
    c = asyncps.Client(eps, rank=rank, timeout_s=30)
    table = asyncps.TableSpec("emb", 4, "zeros", 0.0, 1, "sgd", 0.1)
    spec = asyncps.TensorSpec("w", [10], "zeros", 0.0, 1)
    c.register([spec], tables=[table])
    return c, asyncps.Store(c, [spec], register=False)


def test_rows_apply_on_arrival_dense_waits_for_the_round(shards):
    eps = endpoints(shards(2, HYBRID, num_workers=2))
    (c0, s0), (c1, s1) = connect(eps, 0), connect(eps, 1)
    keys = np.array([5, 6, 1 << 40], np.uint64)
    w = [np.zeros(10, np.float32)]
    s0.pull(0, w)
    # Rank 0's rows: applied at once, before rank 1 has pushed anything.
    c0.push_rows("emb", keys, np.ones((3, 4), np.float32), clock=0)
    np.testing.assert_allclose(c1.pull_rows("emb", keys, 0), -0.1)
    # Its dense push of the same step still counts for round 0 (the rows'
    # push did not): the round averages both ranks' gradients, 1 and 3.
    s0.push(0, [np.full(10, 1.0, np.float32)])
    s0.clock(1)  # (prefetches the pull of clock 1: it waits for rank 1)
    s1.pull(0, [np.zeros(10, np.float32)])
    s1.push(0, [np.full(10, 3.0, np.float32)])
    s1.clock(1)
    s0.pull(1, w)
    np.testing.assert_allclose(w[0], -0.5 * 2.0)
    s0.close()
    s1.close()


def test_plain_bsp_sums_rows_into_the_round(shards):
    eps = endpoints(shards(1, ["--consistency=bsp", "--optimizer=sgd", "--lr=0.5"],
                           num_workers=2))
    (c0, s0), (c1, s1) = connect(eps, 0), connect(eps, 1)
    keys = np.array([5], np.uint64)
    c0.push_rows("emb", keys, np.ones((1, 4), np.float32), clock=0)
    np.testing.assert_allclose(c1.pull_rows("emb", keys, 0), 0.0)  # summed into round 0
    s0.close()
    s1.close()


def test_sparse_consistency_is_only_asp_under_bsp(tmp_path):
    with pytest.raises(RuntimeError, match="sparse_consistency"):
        Shard(tmp_path, ["--consistency=ssp", "--staleness=1", "--sparse_consistency=asp"])


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = apt.SparseEmbedding("ids", 8, optimizer="adagrad", lr=0.1)
        self.fc = torch.nn.Linear(8, 2)

    def forward(self, ids):
        return self.fc(self.emb(ids).mean(1))


def test_sparse_embedding_trains_under_hybrid_dense_models_stay_identical(shards):
    eps = endpoints(shards(2, HYBRID[:2] + ["--optimizer=adam", "--lr=0.01"], num_workers=2))

    def run(r):
        torch.manual_seed(r)
        m = Model()
        ps = apt.ParameterServer(m, servers=eps, rank=r, num_workers=2)
        opt = apt.DistributedOptimizer(ps)
        g = torch.Generator().manual_seed(10 + r)
        for _ in range(8):
            ids = torch.randint(0, 1000, (32, 5), generator=g)
            y = (ids[:, 0] % 2)
            opt.zero_grad()
            torch.nn.functional.cross_entropy(m(ids), y).backward()
            opt.step()
        ps.close()
        return {k: v.clone() for k, v in m.fc.state_dict().items()}

    out = on_threads(2, run)
    for k in out[0]:
        assert torch.equal(out[0][k], out[1][k]), k  # BSP: the same dense weights
