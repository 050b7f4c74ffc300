"""Issue 22 item 4 for SparseEmbedding tables, against real ps_server
processes (127.0.0.1): ps.state_dict() holds each table's rows of ids
0..num_embeddings-1 as '<module path>.weight' (torch.save of it loads into a
plain model with an nn.Embedding there), ps.optimizer_state_dict() their
per-row optimizer state, and loading both into a fresh fleet resumes
training bitwise as an uninterrupted run (hybrid consistency: dense Adam in
BSP rounds, rows applied on arrival). Bad input is refused before anything
is written."""
import io

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import asyncps  # noqa: E402
import asyncps.torch as apt  # noqa: E402
from conftest import endpoints  # noqa: E402
from test_resume import train  # noqa: E402  (DistributedOptimizer steps over batches)

FLAGS = ["--consistency=bsp", "--sparse_consistency=asp", "--optimizer=adam", "--lr=0.01"]
V, DIM, N, M = 50, 6, 4, 3


class Net(torch.nn.Module):
    def __init__(self, optimizer="sgd"):
        super().__init__()
        self.emb = apt.SparseEmbedding("emb", DIM, "normal", 0.5, 3, optimizer, 0.1,
                                       num_embeddings=V)
        self.fc = torch.nn.Linear(DIM, 2)

    def forward(self, ids):
        return self.fc(self.emb(ids).mean(1))


class PlainNet(torch.nn.Module):
    """Net without asyncps: where a saved state_dict goes."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(V, DIM)
        self.fc = torch.nn.Linear(DIM, 2)

    def forward(self, ids):
        return self.fc(self.emb(ids).mean(1))


def batches(n, seed=5):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randint(0, V, (8, 3), generator=g), torch.randint(0, 2, (8,), generator=g))
            for _ in range(n)]


def fleet(shards):
    return endpoints(shards(2, FLAGS, num_workers=1))


def start(eps, optimizer="sgd", seed=7):
    torch.manual_seed(seed)
    m = Net(optimizer)
    return m, apt.ParameterServer(m, servers=eps, rank=0, num_workers=1)


def saved(ps):
    buf = io.BytesIO()
    torch.save({"model": ps.state_dict(), "opt": ps.optimizer_state_dict()}, buf)
    buf.seek(0)
    return buf


# How a fresh fleet is given a checkpoint {"model": state_dict, "opt":
# optimizer_state_dict}.
LOADS = {
    "together": lambda ps, c: ps.load_state_dict(c["model"], optimizer_state=c["opt"]),
    "separately": lambda ps, c: (ps.load_state_dict(c["model"]),
                                 ps.load_optimizer_state_dict(c["opt"])),
    "without": lambda ps, c: ps.load_state_dict(c["model"]),
}


def run_resumed(shards, optimizer, how, data):
    """N steps, saved, a fresh fleet loaded (`how`), M steps: the state_dict."""
    m, ps = start(fleet(shards), optimizer)
    train(ps, m, data[:N])
    buf = saved(ps)
    ps.close()
    ckpt = torch.load(buf)
    m2, ps2 = start(fleet(shards), optimizer, seed=8)  # other dense weights, overwritten
    LOADS[how](ps2, ckpt)
    train(ps2, m2, data[N:])
    got = ps2.state_dict()
    ps2.close()
    return got


def uninterrupted(shards, optimizer, data):
    m, ps = start(fleet(shards), optimizer)
    train(ps, m, data)
    want = ps.state_dict()
    ps.close()
    return want


def test_rows_round_trip_and_resume_bitwise_with_stateless_rows(shards):
    data = batches(N + M)
    want = uninterrupted(shards, "sgd", data)
    assert want["emb.weight"].shape == (V, DIM)
    got = run_resumed(shards, "sgd", "together", data)
    assert list(got) == list(want)
    for k in want:
        assert torch.equal(got[k], want[k]), k


def test_saved_rows_load_into_a_plain_embedding(shards):
    m, ps = start(fleet(shards))
    train(ps, m, batches(2))
    buf = io.BytesIO()
    torch.save(ps.state_dict(), buf)
    buf.seek(0)
    plain = PlainNet()
    plain.load_state_dict(torch.load(buf))  # strict: the same keys and shapes
    ids = torch.randint(0, V, (5, 3))
    with torch.no_grad():
        assert torch.equal(plain(ids), m(ids))
    # And back: a plain model's weights become the shards' rows.
    with torch.no_grad():
        plain.emb.weight.mul_(2.0)
    ps.load_state_dict(plain.state_dict())
    assert torch.equal(ps.state_dict()["emb.weight"], plain.emb.weight)
    ps.close()


def test_bad_rows_are_refused_before_anything_is_written(shards):
    m, ps = start(fleet(shards))
    train(ps, m, batches(1))
    before = ps.state_dict()
    bad = dict(before)
    bad["fc.bias"] = torch.full((2,), 9.0)
    for rows, match in ((torch.zeros(V, DIM + 1), "size mismatch for emb.weight"),
                        (torch.zeros(V - 1, DIM), "size mismatch for emb.weight"),
                        (torch.full((V, DIM), float("nan")), "NaN")):
        bad["emb.weight"] = rows
        with pytest.raises(asyncps.InvalidArgument, match=match):
            ps.load_state_dict(bad)
    del bad["emb.weight"]
    with pytest.raises(asyncps.InvalidArgument, match="no emb.weight"):
        ps.load_state_dict(bad)
    after = ps.state_dict()
    for k in before:
        assert torch.equal(before[k], after[k]), k
    # strict=False: the dense values load, the rows stay, the key is missing.
    result = ps.load_state_dict(bad, strict=False)
    assert result.missing_keys == ["emb.weight"]
    after = ps.state_dict()
    assert torch.equal(after["emb.weight"], before["emb.weight"])
    assert torch.equal(after["fc.bias"], torch.full((2,), 9.0))
    ps.close()


@pytest.mark.parametrize("optimizer", ["adagrad", "adam"])
def test_resume_with_the_rows_optimizer_state_is_bitwise_an_uninterrupted_run(shards,
                                                                              optimizer):
    data = batches(N + M)
    want = uninterrupted(shards, optimizer, data)
    for how in ("together", "separately"):
        got = run_resumed(shards, optimizer, how, data)
        for k in want:
            assert torch.equal(got[k], want[k]), (how, k)
    # Without the rows' state (AdaGrad's sums, Adam's moments and steps
    # restart) the run differs: the comparison above can fail.
    without = run_resumed(shards, optimizer, "without", data)
    assert not torch.equal(without["emb.weight"], want["emb.weight"])


def test_row_state_round_trips_exactly(shards):
    m, ps = start(fleet(shards), "adam")
    train(ps, m, batches(2))
    sd = ps.optimizer_state_dict()
    entry = sd["tables"]["emb.weight"]
    assert entry["optimizer"] == "adam"
    assert entry["exp_avg"].shape == (V, DIM) and entry["exp_avg_sq"].shape == (V, DIM)
    assert entry["row_steps"].dtype == torch.int64 and entry["row_steps"].shape == (V,)
    assert 0 < float(entry["step"]) <= 2 and int(entry["row_steps"].min()) == 0
    entry["row_steps"] = torch.arange(V, dtype=torch.int64) * 1000
    entry["exp_avg"] = torch.full((V, DIM), 0.125)
    entry["exp_avg_sq"] = torch.full((V, DIM), 0.5)
    rows = ps.state_dict()["emb.weight"]
    ps.load_optimizer_state_dict(sd)
    back = ps.optimizer_state_dict()["tables"]["emb.weight"]
    for slot in ("exp_avg", "exp_avg_sq", "row_steps"):
        assert torch.equal(back[slot], entry[slot]), slot
    assert float(back["step"]) == 1000.0 * (V - 1)
    assert torch.equal(ps.state_dict()["emb.weight"], rows)  # values kept
    ps.close()


def test_bad_row_state_is_refused_before_anything_is_written(shards):
    m, ps = start(fleet(shards), "adagrad")
    train(ps, m, batches(2))
    sd = ps.optimizer_state_dict()
    before = ps.optimizer_state_dict()["tables"]["emb.weight"]
    entry = sd["tables"]["emb.weight"]
    good = entry["sum"]
    for value, match in ((torch.full((V, DIM), float("nan")), "finite"),
                         (torch.zeros(V, DIM + 1), "shape")):
        entry["sum"] = value
        with pytest.raises(asyncps.InvalidArgument, match=match):
            ps.load_optimizer_state_dict(sd)
    entry["sum"] = good
    entry["row_steps"] = -entry["row_steps"] - 1
    with pytest.raises(asyncps.InvalidArgument, match="whole numbers"):
        ps.load_optimizer_state_dict(sd)
    entry["optimizer"] = "adam"
    with pytest.raises(asyncps.InvalidArgument,
                       match="emb.weight .SparseEmbedding 'emb'. was saved from adam"):
        ps.load_optimizer_state_dict(sd)
    sd["tables"]["other.weight"] = sd["tables"].pop("emb.weight")
    with pytest.raises(asyncps.InvalidArgument, match="unknown other.weight"):
        ps.load_optimizer_state_dict(sd)
    # The C++ upload's own checks (the low-level upload skips the Python
    # ones; worker/upload.cc, before anything is sent; each shard checks its
    # requests again, server/shard/shard_sparse_test.cc): Adam's state into
    # an AdaGrad table, and negative sums.
    keys = np.arange(V, dtype=np.uint64)
    values = np.full((V, DIM), 3.0, np.float32)
    dense = [p.detach().numpy() for p in ps.params]
    steps = np.ones(V, np.uint64)
    with pytest.raises(asyncps.InvalidArgument, match="saved from 'adam'"):
        ps.client.upload(dense, overwrite=True, rows=[
            (0, keys, values, "adam", np.zeros((V, DIM), np.float32), steps)])
    negative = np.zeros((V, DIM), np.float32)
    negative[:, 2] = -1.0
    with pytest.raises(asyncps.InvalidArgument, match="negative sum of squares"):
        ps.client.upload(dense, overwrite=True, rows=[
            (0, keys, values, "adagrad", negative, steps)])
    after = ps.optimizer_state_dict()["tables"]["emb.weight"]
    for slot in ("sum", "row_steps"):
        assert torch.equal(after[slot], before[slot]), slot
    ps.close()


def test_num_embeddings_defaults_to_the_rows_and_is_checked():
    assert apt.SparseEmbedding("e", 4, rows=torch.zeros(5, 4)).num_embeddings == 5
    assert apt.SparseEmbedding("e", 4, rows=torch.zeros(5, 4),
                               num_embeddings=9).num_embeddings == 9
    assert apt.SparseEmbedding("e", 4).num_embeddings is None  # not saved
    for n in (0, 4):
        with pytest.raises(asyncps.InvalidArgument, match="num_embeddings"):
            apt.SparseEmbedding("e", 4, rows=torch.zeros(5, 4), num_embeddings=n)
