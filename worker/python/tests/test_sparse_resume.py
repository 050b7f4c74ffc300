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
    del entry["saved"]  # the form saved before "saved" existed: ids 0..V-1
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
    del entry["saved"]  # the checks of the form of ids 0..V-1
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


# Hashed 64-bit ids, admission and expiry: the whole table is saved (ids,
# rows, optimizer state, admission counts, last-push clocks) and a fresh
# fleet resumes bitwise as an uninterrupted run; without the saved entries
# it does not.
H = torch.from_numpy(np.random.default_rng(3).integers(
    np.iinfo(np.int64).min, np.iinfo(np.int64).max, size=V, dtype=np.int64))


class HashNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = apt.SparseEmbedding("hashed", DIM, "normal", 0.5, 3, "adagrad", 0.1,
                                       admit_after=2, expire_after=2)
        self.fc = torch.nn.Linear(DIM, 2)

    def forward(self, idx):
        return self.fc(self.emb(H[idx]).mean(1))


def hashed_run(shards, data, load=None, cut=N):
    """Trains on data[:cut]; with `load` (a checkpoint and how to load it) a
    fresh fleet is loaded first. Returns (checkpoint, every id's row record,
    the final saved entries with their clocks made relative)."""
    torch.manual_seed(7)
    m = HashNet()
    ps = apt.ParameterServer(m, servers=fleet(shards), rank=0, num_workers=1)
    if load is not None:
        ckpt, how = load
        if how == "together":
            ps.load_state_dict(ckpt["model"], optimizer_state=ckpt["opt"])
        else:
            ps.load_state_dict(ckpt["model"])
            ps.load_optimizer_state_dict(ckpt["opt"])
    train(ps, m, data)
    ckpt = torch.load(saved(ps))
    rows = ps.client.read_rows(0, H.numpy().view(np.uint64))
    entry = ps.optimizer_state_dict()["tables"]["emb.weight"]["saved"]
    entry["clocks"] = entry["clocks"] - entry.pop("clock")
    dense = {k: v for k, v in ps.state_dict().items()}
    ps.close()
    return ckpt, rows, entry, dense


def test_hashed_ids_with_admission_and_expiry_resume_bitwise(shards):
    data = batches(N + M + 2)
    _, want_rows, want, want_dense = hashed_run(shards, data)
    ckpt, _, at_cut, _ = hashed_run(shards, data[:N])
    assert len(at_cut["ids"]) > 0 and int((at_cut["counts"] > 0).sum()) > 0
    assert (at_cut["ids"] < 0).any()  # ids above 2^63 (int64 bits)
    for how in ("together", "separately"):
        _, rows, got, dense = hashed_run(shards, data[N:], load=(ckpt, how))
        for a, b in zip(rows, want_rows):
            assert np.array_equal(a, b), how
        assert list(got) == list(want)
        for k in want:
            assert torch.equal(got[k], want[k]), (how, k)
        for k in want_dense:
            assert torch.equal(dense[k], want_dense[k]), (how, k)
    # Without the saved entries (as before: tables of unknown size were not
    # saved at all) the resumed run differs.
    del ckpt["opt"]["tables"]["emb.weight"]["saved"]
    with pytest.raises(asyncps.InvalidArgument, match="row_steps"):
        hashed_run(shards, data[N:], load=(ckpt, "together"))
    del ckpt["opt"]["tables"]
    _, rows, _, _ = hashed_run(shards, data[N:], load=(ckpt, "together"))
    assert not all(np.array_equal(a, b) for a, b in zip(rows, want_rows))


def test_bad_saved_entries_are_refused_before_anything_is_written(shards):
    torch.manual_seed(7)
    m = HashNet()
    ps = apt.ParameterServer(m, servers=fleet(shards), rank=0, num_workers=1)
    train(ps, m, batches(3))
    sd = ps.optimizer_state_dict()
    before = ps.client.scan_rows(0)
    saved_entries = sd["tables"]["emb.weight"]["saved"]
    good = {k: (v.clone() if torch.is_tensor(v) else v) for k, v in saved_entries.items()}
    counter = int(torch.nonzero(good["counts"] > 0)[0, 0])
    cases = [("sum", lambda e: e["sum"].fill_(float("nan")), "finite"),
             ("counts", lambda e: e["counts"].__setitem__(counter, 2), "admit_after"),
             ("counts", lambda e: e["row_steps"].__setitem__(counter, 1), "no row"),
             ("clocks", lambda e: e["clocks"].__setitem__(0, 1 << 60), "2.53"),
             ("ids", lambda e: e["ids"].__setitem__(1, int(e["ids"][0])), "repeat"),
             ("weight", lambda e: e.__setitem__("weight", e["weight"][:-1]), "shape")]
    for _, mutate, match in cases:
        entry = {k: (v.clone() if torch.is_tensor(v) else v) for k, v in good.items()}
        mutate(entry)
        sd["tables"]["emb.weight"]["saved"] = entry
        with pytest.raises(asyncps.InvalidArgument, match=match):
            ps.load_optimizer_state_dict(sd)
    # The C++ checks behind them (the low-level upload skips the Python ones).
    keys, kinds, counts, clocks, values, state = before
    dense = [p.detach().numpy() for p in ps.params]
    bad_kinds = kinds.copy()
    bad_kinds[0] = 3
    with pytest.raises(asyncps.InvalidArgument, match="kind 3"):
        ps.client.upload(dense, overwrite=True, rows=[
            (0, keys, values, "adagrad", state, counts, bad_kinds, clocks)])
    after = ps.client.scan_rows(0)
    for a, b in zip(before, after):
        assert np.array_equal(a, b)
    ps.close()



# Ids the model never looks up through H: pushed by hand, so the fleet holds
# rows and admission counters of ids that no save made before has.
EXTRA = torch.from_numpy(np.random.default_rng(4).integers(
    np.iinfo(np.int64).min, np.iinfo(np.int64).max, size=V, dtype=np.int64))


def train_extra(ps, m, data):
    opt = apt.DistributedOptimizer(ps)
    for x, y in data:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(m.fc(m.emb(EXTRA[x]).mean(1)), y).backward()
        opt.step()


def test_a_saved_table_loads_exactly_into_a_fleet_that_trained_on(shards):
    """Loading a save into a fleet that is not fresh: every id that is not in
    the save is gone afterwards (reads as on a fresh fleet: the initialiser,
    no state, no steps), the saved entries are back bitwise (their clocks
    shifted by the loader's clock minus the saver's), through
    load_optimizer_state_dict and load_state_dict(optimizer_state=)."""
    data = batches(N + M + 2)
    every = np.concatenate([H.numpy(), EXTRA.numpy()]).view(np.uint64)
    torch.manual_seed(7)
    fresh_model = HashNet()
    fresh = apt.ParameterServer(fresh_model, servers=fleet(shards), rank=0, num_workers=1)
    initial = fresh.client.read_rows(0, every)
    fresh.close()

    torch.manual_seed(7)
    m = HashNet()
    ps = apt.ParameterServer(m, servers=fleet(shards), rank=0, num_workers=1)
    train(ps, m, data[:N])
    ckpt = torch.load(saved(ps))
    at_save = ps.client.scan_rows(0)
    rows_at_save = ps.client.read_rows(0, every)
    saved_ids = set(at_save[0].tolist())
    gone = np.array([k for k in every.tolist() if k not in saved_ids], np.uint64)
    assert len(saved_ids) > 0 and len(gone) > 0

    def check_exactly_the_save():
        now = ps.client.scan_rows(0)
        assert np.array_equal(now[0], at_save[0])  # no other id
        for i in (1, 2, 4, 5):  # kinds, counts, weights, optimizer state
            assert np.array_equal(now[i], at_save[i]), i
        shift = now[3] - at_save[3]  # each entry keeps its age
        assert len(set(shift.tolist())) == 1 and shift[0] >= 0
        rows = ps.client.read_rows(0, every)
        for a, b in zip(rows, rows_at_save):
            assert np.array_equal(a, b)
        absent = np.isin(every, gone)
        for a, b in zip(rows, initial):
            assert np.array_equal(a[absent], b[absent])

    for load in (lambda: ps.load_optimizer_state_dict(ckpt["opt"]),
                 lambda: ps.load_state_dict(ckpt["model"], optimizer_state=ckpt["opt"])):
        # Trained on: the saved rows step on, ids of H not seen before and
        # ids of EXTRA become rows (seen twice) or admission counters.
        train(ps, m, data[N:])
        train_extra(ps, m, data[:N])
        train_extra(ps, m, data[:2])
        held = set(ps.client.scan_rows(0)[0].tolist())
        assert held - saved_ids & set(EXTRA.numpy().view(np.uint64).tolist())
        assert held != saved_ids
        load()
        check_exactly_the_save()
    ps.close()
