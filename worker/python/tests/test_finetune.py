"""Issue 22 items 2-4 against real ps_server processes on 127.0.0.1: uploads
of a worker's values (two first registrants race: exactly one wins, the
other waits and reads it), the lr carried by pushes and clocks and bounded
by --max_lr, worker-side torch.optim optimizers over summing shards, and
ps.state_dict() / load_state_dict() round trips through torch.save."""
import io
import json
import threading

import numpy as np
import pytest
import torch

import asyncps
import asyncps.torch as apt
from conftest import endpoints, on_threads

SPECS = [("w", [120, 100], "he_normal", 0.0, 7), ("b", [100], "zeros", 0.0, 7),
         ("v", [9000], "uniform", 0.1, 7)]


def specs():
    return [asyncps.TensorSpec(*s) for s in SPECS]


def values(fill):
    return [np.full(s[1], fill, np.float32) + np.arange(int(np.prod(s[1])), dtype=np.float32)
            .reshape(s[1]) * 1e-3 for s in SPECS]


def pulled(client, clock=0):
    store = asyncps.Store(client, specs(), register=False)
    out = [np.zeros(s[1], np.float32) for s in SPECS]
    store.pull(clock, out)
    store.close()
    return out


def race(eps, n, fills, overwrite=False, max_request_bytes=20000):
    """n clients register and upload at once; returns (uploaded flags, clients)."""
    clients = [asyncps.Client(eps, rank=r, timeout_s=30) for r in range(n)]
    for c in clients:
        c.register(specs(), chunk_elems=4096)
    barrier = threading.Barrier(n)

    def run(r):
        barrier.wait()
        return clients[r].upload(values(fills[r]), overwrite=overwrite,
                                 max_request_bytes=max_request_bytes)

    won = on_threads(n, run)
    return won, clients


def test_upload_race_of_two_first_registrants_one_wins_both_read_it(shards):
    for attempt in range(3):
        group = shards(2, ["--consistency=bsp"], num_workers=2)
        eps = endpoints(group)
        won, clients = race(eps, 2, [1.0, 2.0])
        assert sorted(won) == [False, True], won
        winner = won.index(True)
        want = values([1.0, 2.0][winner])
        for c in clients:  # both read the winner's values, on both shards, bitwise
            for got, w in zip(pulled(c), want):
                np.testing.assert_array_equal(got, w)
        # Final now: a later upload does not overwrite (idempotent), overwrite does.
        assert clients[1 - winner].upload(values(5.0)) is False
        for got, w in zip(pulled(clients[0]), want):
            np.testing.assert_array_equal(got, w)
        assert clients[0].upload(values(3.0), overwrite=True) is True
        for got, w in zip(pulled(clients[1]), values(3.0)):
            np.testing.assert_array_equal(got, w)
        for s in group:
            s.stop()


def test_upload_is_refused_after_training_and_checked(shards):
    eps = endpoints(shards(1, ["--consistency=asp", "--lr=0.5"], num_workers=1))
    c = asyncps.Client(eps, rank=0, timeout_s=30)
    with pytest.raises(asyncps.FailedPrecondition, match="register"):
        c.upload(values(1.0))
    c.register(specs(), chunk_elems=4096)
    with pytest.raises(asyncps.InvalidArgument, match="'w'"):
        c.upload([np.zeros((3, 3), np.float32)] + values(1.0)[1:])
    st = asyncps.Store(c, specs(), register=False)
    w = [np.zeros(s[1], np.float32) for s in SPECS]
    st.pull(0, w)
    st.push(0, [np.ones(s[1], np.float32) for s in SPECS])
    st.clock(1)
    st.pull(1, w)
    assert c.upload(values(9.0)) is False  # trained: the shard keeps its weights
    after = [np.zeros(s[1], np.float32) for s in SPECS]
    st.pull(1, after)
    for a, b in zip(w, after):
        np.testing.assert_array_equal(a, b)
    st.close()


def test_lr_carried_by_push_and_clock_and_bounded_by_max_lr(shards):
    eps = endpoints(shards(1, ["--consistency=asp", "--lr=0.1", "--max_lr=0.5"]))
    c = asyncps.Client(eps, rank=0, timeout_s=30)
    st = asyncps.Store(c, specs())
    w0 = [np.zeros(s[1], np.float32) for s in SPECS]
    st.pull(0, w0)
    ones = [np.ones(s[1], np.float32) for s in SPECS]
    w = [x.copy() for x in w0]

    def step(clock):
        st.push(clock, ones)
        st.clock(clock + 1)
        st.flush()
        st.pull(clock + 1, w)
        return w[1][0]  # b started at 0

    assert step(0) == pytest.approx(-0.1)          # the server's --lr
    c.lr = 0.25
    assert step(1) == pytest.approx(-0.35)         # the carried lr
    assert json.loads(c.stats()[0])["worker_lr"] == pytest.approx(0.25)
    c.lr = 0.6  # over --max_lr: refused, not clamped; nothing applied
    with pytest.raises(asyncps.InvalidArgument, match="max_lr"):
        st.push(2, ones)
        st.flush()
    with pytest.raises(asyncps.InvalidArgument, match="max_lr"):
        st.clock(2)
        st.flush()
    with pytest.raises(asyncps.InvalidArgument):
        c.lr = -1.0
    c.lr = 0.5                                      # the bound itself is allowed
    assert step(2) == pytest.approx(-0.85)
    stats = json.loads(c.stats()[0])
    assert stats["rejected"]["lr_out_of_range"] >= 2
    assert stats["max_lr"] == pytest.approx(0.5)
    st.close()


def test_bsp_round_applies_the_lr_of_its_clock(shards):
    eps = endpoints(shards(1, ["--consistency=bsp", "--lr=0.1", "--optimizer=sgd"],
                           num_workers=1))
    c = asyncps.Client(eps, rank=0, timeout_s=30)
    st = asyncps.Store(c, specs())
    w = [np.zeros(s[1], np.float32) for s in SPECS]
    st.pull(0, w)
    st.push(0, [np.ones(s[1], np.float32) for s in SPECS])
    c.lr = 0.3  # set after the push: the clock that completes the round carries it
    st.clock(1)
    st.pull(1, w)
    assert w[1][0] == pytest.approx(-0.3)
    st.close()


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 4, 3)
        self.bn = torch.nn.BatchNorm2d(4)
        self.fc = torch.nn.Linear(4 * 6 * 6, 10)

    def forward(self, x):
        return self.fc(torch.relu(self.bn(self.conv(x))).flatten(1))


def test_torch_init_model_two_workers_one_upload_wins(shards):
    eps = endpoints(shards(2, ["--consistency=bsp"], num_workers=2))
    models = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        models.append(Net())
    want = [{k: v.clone() for k, v in m.named_parameters()} for m in models]
    pss = on_threads(2, lambda r: apt.ParameterServer(
        models[r], servers=eps, rank=r, num_workers=2, init="model", chunk_elems=4096))
    assert sorted([pss[0].uploaded, pss[1].uploaded]) == [False, True]
    winner = 0 if pss[0].uploaded else 1
    for m in models:
        for k, p in m.named_parameters():
            assert torch.equal(p.detach(), want[winner][k]), k
    # Another model on the same shards: still an error naming the tensor.
    other = torch.nn.Sequential(torch.nn.Linear(3, 2))
    with pytest.raises(asyncps.AlreadyExists, match="'0.weight'"):
        apt.ParameterServer(other, servers=eps, rank=0, num_workers=2, init="model")
    for ps in pss:
        ps.close()


def batches(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(16, 1, 8, 8, generator=g), torch.randint(0, 10, (16,), generator=g))
            for _ in range(n)]


def test_state_dict_round_trip_through_torch_save(shards):
    eps = endpoints(shards(2, ["--consistency=asp", "--optimizer=adam", "--lr=0.01"]))
    torch.manual_seed(0)
    m = Net()
    ps = apt.ParameterServer(m, servers=eps, init="model", chunk_elems=4096)
    opt = apt.DistributedOptimizer(ps)
    for x, y in batches(5):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(m(x), y).backward()
        opt.step()
    sd = ps.state_dict()
    buf = io.BytesIO()
    torch.save(sd, buf)
    buf.seek(0)
    plain = Net()
    plain.load_state_dict(torch.load(buf))  # a model built without asyncps
    for (k, a), b in zip(plain.state_dict().items(), m.state_dict().values()):
        assert torch.equal(a, b), k
    # load_state_dict uploads (overwrites) the values; a new worker pulls them.
    torch.manual_seed(5)
    fresh = Net().state_dict()
    ps.load_state_dict(fresh)
    m2 = Net()
    ps2 = apt.ParameterServer(m2, servers=eps, chunk_elems=4096)
    for k, p in m2.named_parameters():
        assert torch.equal(p.detach(), fresh[k]), k
    ps2.close()
    ps.close()


def test_worker_optimizer_bsp_is_local_adam_and_workers_stay_identical(shards):
    eps = endpoints(shards(2, ["--consistency=bsp", "--optimizer=sgd", "--lr=0.01"],
                           num_workers=2))
    torch.manual_seed(0)
    init = Net().state_dict()
    data = [batches(6, seed=r) for r in range(2)]

    def run(r):
        m = Net()
        m.load_state_dict(init)
        ps = apt.ParameterServer(m, servers=eps, rank=r, num_workers=2, init="model",
                                 chunk_elems=4096)
        adam = torch.optim.Adam(m.parameters(), lr=0.01)
        sched = torch.optim.lr_scheduler.OneCycleLR(adam, max_lr=0.02, total_steps=6)
        opt = apt.WorkerOptimizer(ps, adam)
        for x, y in data[r]:
            opt.zero_grad()
            torch.nn.functional.cross_entropy(m(x), y).backward()
            opt.step()
            sched.step()
        ps.close()
        return m

    models = on_threads(2, run)
    for (k, a), b in zip(models[0].named_parameters(), models[1].parameters()):
        assert torch.equal(a, b), k  # the same averaged gradient on every worker
    # Reference: one local Adam on the average of both workers' gradients
    # (BatchNorm in train mode: per-worker batch statistics, as in the run).
    ref = Net()
    ref.load_state_dict(init)
    adam = torch.optim.Adam(ref.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.OneCycleLR(adam, max_lr=0.02, total_steps=6)
    for step in range(6):
        grads = []
        for r in range(2):
            ref.zero_grad()
            x, y = data[r][step]
            torch.nn.functional.cross_entropy(ref(x), y).backward()
            grads.append([p.grad.clone() for p in ref.parameters()])
        for p, g0, g1 in zip(ref.parameters(), *grads):
            p.grad = (g0 + g1) / 2
        adam.step()
        sched.step()
    for (k, a), b in zip(models[0].named_parameters(), ref.parameters()):
        if k == "conv.bias":
            continue  # BatchNorm cancels it: a ~1e-9 gradient, which Adam's
            # normalisation turns into lr-sized steps of rounding noise
        torch.testing.assert_close(a, b, atol=2e-4, rtol=1e-3, msg=k)


def test_worker_optimizer_refuses_shards_that_do_not_only_sum(shards):
    eps = endpoints(shards(1, ["--optimizer=adam"]))
    m = Net()
    ps = apt.ParameterServer(m, servers=eps, chunk_elems=4096)
    with pytest.raises(asyncps.FailedPrecondition, match="optimizer=adam"):
        apt.WorkerOptimizer(ps, torch.optim.SGD(m.parameters(), lr=0.1))
    ps.close()


def test_distributed_optimizer_lr_follows_a_torch_scheduler(shards):
    eps = endpoints(shards(1, ["--consistency=asp", "--lr=0.05"]))
    m = Net()
    ps = apt.ParameterServer(m, servers=eps, chunk_elems=4096)
    opt = apt.DistributedOptimizer(ps, lr=0.2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    for i, (x, y) in enumerate(batches(3)):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(m(x), y).backward()
        opt.step()
        assert json.loads(ps.client.stats()[0])["worker_lr"] == pytest.approx(0.2 * 0.5 ** i)
        sched.step()
    ps.close()


def test_upload_of_sparse_rows_race_one_table_wins(shards):
    eps = endpoints(shards(2, ["--consistency=asp"], num_workers=2))
    table = asyncps.TableSpec("emb", 3, "zeros", 0.0, 1, "sgd", 0.1)
    keys = np.arange(1000, dtype=np.uint64)
    clients = [asyncps.Client(eps, rank=r, timeout_s=30) for r in range(2)]
    for c in clients:
        c.register(specs(), chunk_elems=4096, tables=[table])
    barrier = threading.Barrier(2)

    def run(r):
        barrier.wait()
        rows = np.full((1000, 3), r + 1.0, np.float32) + keys[:, None].astype(np.float32)
        return clients[r].upload(values(r + 1.0), rows=[("emb", keys, rows)],
                                 max_request_bytes=6000)  # several requests per shard

    won = on_threads(2, run)
    assert sorted(won) == [False, True]
    w = won.index(True) + 1.0
    for c in clients:
        got = c.pull_rows("emb", np.concatenate([keys, [5000]]).astype(np.uint64), 0)
        np.testing.assert_array_equal(got[:1000], np.full((1000, 3), w, np.float32)
                                      + keys[:, None].astype(np.float32))
        np.testing.assert_array_equal(got[1000], 0.0)  # not uploaded: its initialiser
        for a, b in zip(pulled(c), values(w)):
            np.testing.assert_array_equal(a, b)
    with pytest.raises(asyncps.InvalidArgument, match="float32"):
        clients[0].upload(values(1.0), rows=[("emb", keys, np.zeros((1000, 2), np.float32))])
    with pytest.raises(asyncps.NotFound, match="nope"):
        clients[0].upload(values(1.0), rows=[("nope", keys, np.zeros((1000, 3), np.float32))])


def test_sparse_embedding_rows_uploaded_with_init_model(shards):
    eps = endpoints(shards(2, ["--consistency=asp"]))
    pretrained = torch.randn(50, 4)

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = apt.SparseEmbedding("e", 4, rows=pretrained)
            self.fc = torch.nn.Linear(4, 2)

        def forward(self, ids):
            return self.fc(self.emb(ids))

    m = M()
    with pytest.raises(asyncps.InvalidArgument, match="init=\"model\""):
        apt.ParameterServer(m, servers=eps)
    ps = apt.ParameterServer(m, servers=eps, init="model")
    assert ps.uploaded
    with torch.no_grad():
        assert torch.equal(m.emb(torch.arange(50)), pretrained)
    ps.close()


def test_worker_optimizer_under_asp_one_worker_is_local_sgd(shards):
    eps = endpoints(shards(1, ["--consistency=asp", "--optimizer=sgd", "--lr=0.01"]))
    torch.manual_seed(3)
    init = Net().state_dict()
    m, ref = Net(), Net()
    m.load_state_dict(init)
    ref.load_state_dict(init)
    ps = apt.ParameterServer(m, servers=eps, init="model", chunk_elems=4096)
    opt = apt.WorkerOptimizer(ps, torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9))
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.05, momentum=0.9)
    for x, y in batches(5, seed=4):
        for model, o in ((m, opt), (ref, ref_opt)):
            o.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            o.step()
    for (k, a), b in zip(m.named_parameters(), ref.parameters()):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4, msg=k)
    ps.close()


def test_shard_adam_state_is_read_with_torch_names(shards):
    eps = endpoints(shards(2, ["--consistency=asp", "--optimizer=adam", "--lr=0.01"]))
    torch.manual_seed(0)
    m = Net()
    ps = apt.ParameterServer(m, servers=eps, chunk_elems=4096)
    opt = apt.DistributedOptimizer(ps)
    ref = Net()
    ref.load_state_dict(m.state_dict())
    ref_opt = torch.optim.Adam(ref.parameters(), lr=0.01)
    for x, y in batches(3):
        for model, o in ((m, opt), (ref, ref_opt)):
            o.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            o.step()
    sd = ps.optimizer_state_dict()
    assert sd["optimizer"] == "adam" and sd["step"] == 3
    for (name, p), q in zip(m.named_parameters(), ref.parameters()):
        st, want = sd["state"][name], ref_opt.state[q]
        assert st["exp_avg"].shape == p.shape
        torch.testing.assert_close(st["exp_avg"], want["exp_avg"], atol=1e-6, rtol=1e-4)
        torch.testing.assert_close(st["exp_avg_sq"], want["exp_avg_sq"], atol=1e-8, rtol=1e-3)
    ps.close()
