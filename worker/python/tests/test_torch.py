"""asyncps.torch: ParameterServer and DistributedOptimizer on real shards."""
import importlib.util
import os
import threading
import types

import numpy as np
import pytest
import torch

import asyncps
import asyncps.torch as apt
from asyncps.data import Mnist
from conftest import EXAMPLES, endpoints, need_data


def small_cnn(bn=True):
    norm = (lambda c: torch.nn.BatchNorm2d(c)) if bn else (lambda c: torch.nn.Identity())
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 8, 5, padding=2), norm(8), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(8, 16, 5, padding=2), norm(16), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(16 * 7 * 7, 10))


def test_initial_weights_come_from_the_shards_with_torch_defaults(shards):
    eps = endpoints(shards(2))
    m = small_cnn()
    ps = apt.ParameterServer(m, servers=eps, rank=0, num_workers=1)
    names = dict(m.named_parameters())
    assert ps.names == list(names)
    for spec in ps.specs:
        np.testing.assert_array_equal(names[spec.name].detach().numpy(), spec.initial_values())
    w = names["0.weight"].detach().numpy()
    assert np.abs(w).max() <= 1 / np.sqrt(25) and w.std() > 0.1 / np.sqrt(25)
    np.testing.assert_array_equal(names["1.weight"].detach().numpy(), 1.0)  # BatchNorm
    np.testing.assert_array_equal(names["1.bias"].detach().numpy(), 0.0)
    # A second worker starts from the same weights.
    m2 = small_cnn()
    apt.ParameterServer(m2, servers=eps, rank=0, num_workers=1).close()
    for a, b in zip(m.parameters(), m2.parameters()):
        assert torch.equal(a, b)
    ps.close()


def test_two_workers_with_batchnorm_train_and_evaluate(shards):
    need_data()
    eps = endpoints(shards(2, ["--consistency=ssp", "--staleness=2", "--optimizer=sgd",
                               "--lr=0.05"], num_workers=2))
    torch.set_num_threads(1)
    train = Mnist.load("train")
    test = Mnist.load("test")
    models = [small_cnn(), small_cnn()]
    errors = []

    def worker(rank):
        try:
            m = models[rank]
            ps = apt.ParameterServer(m, servers=eps, rank=rank, num_workers=2)
            opt = apt.DistributedOptimizer(ps)
            for step, (x, y) in enumerate(train.batches(rank, 2, 64, epoch=0)):
                if step == 150:
                    break
                opt.zero_grad()
                torch.nn.functional.cross_entropy(m(torch.from_numpy(x)),
                                                  torch.from_numpy(y)).backward()
                opt.step()
            ps.close()
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    acc, loss, _ = apt.evaluate(models[0], test.images[:2000], test.labels[:2000])
    assert acc > 0.7, "accuracy %.3f after 2 x 150 steps" % acc
    # Buffers are local: each worker has its own running statistics.
    bn0, bn1 = models[0][1], models[1][1]
    assert bn0.num_batches_tracked.item() == bn1.num_batches_tracked.item() == 150
    assert not torch.equal(bn0.running_mean, bn1.running_mean)


def test_bad_models_raise_naming_the_parameter(shards):
    eps = endpoints(shards(1))
    with pytest.raises(asyncps.InvalidArgument, match="parameter '0.weight' is torch.float64"):
        apt.ParameterServer(torch.nn.Sequential(torch.nn.Linear(3, 2).double()), servers=eps)
    m = torch.nn.Linear(4, 3)
    m.weight = torch.nn.Parameter(torch.zeros(3, 4).t().contiguous().t())
    with pytest.raises(asyncps.InvalidArgument, match="parameter 'weight' is not contiguous"):
        apt.ParameterServer(m, servers=eps)
    fake = types.SimpleNamespace(dtype=torch.float32, device=torch.device("cuda", 0),
                                 is_contiguous=lambda: True)
    if not (asyncps.built_with_cuda and torch.cuda.is_available()):
        with pytest.raises(asyncps.InvalidArgument, match="parameter 'x' is on cuda:0"):
            apt._check_param("x", fake)
    with pytest.raises(asyncps.InvalidArgument, match="unknown parameters: nope"):
        apt.ParameterServer(torch.nn.Linear(2, 2), servers=eps, init={"nope": ("zeros", 0)})
    with pytest.raises(asyncps.InvalidArgument, match="wraps a ParameterServer"):
        apt.DistributedOptimizer(torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1))


def test_model_changed_after_registration(shards):
    eps = endpoints(shards(1, ["--optimizer=sgd", "--lr=0.1"]))
    m = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 2))
    ps = apt.ParameterServer(m, servers=eps)
    before = [p.detach().clone() for p in m.parameters()]
    m[2] = torch.nn.Linear(5, 2)  # a new layer object
    with pytest.raises(asyncps.FailedPrecondition, match="2.weight"):
        ps.push()
    m2 = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 2))
    ps2 = apt.ParameterServer(m2, servers=eps)
    m2[0].weight.data = torch.zeros(5, 7)
    with pytest.raises(asyncps.FailedPrecondition,
                       match=r"parameter '0.weight' is now \(5, 7\).*registered as \(5, 6\)"):
        ps2.pull()
    # Nothing was pushed: the shard still holds the initial weights.
    m3 = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 2))
    apt.ParameterServer(m3, servers=eps).close()
    for a, b in zip(before, m3.parameters()):
        assert torch.equal(a, b)
    # Same-shape replacement of p.data is followed (the new memory is used).
    m3p = apt.ParameterServer(m3, servers=eps)
    m3[0].bias.data = torch.full((5,), 7.0)
    m3p.pull()
    assert torch.equal(m3[0].bias, before[1])
    m3p.close()


def test_another_model_on_the_same_shards_is_already_exists(shards):
    eps = endpoints(shards(1))
    apt.ParameterServer(torch.nn.Linear(4, 3), servers=eps).close()
    with pytest.raises(asyncps.AlreadyExists, match="tensor 'weight'"):
        apt.ParameterServer(torch.nn.Linear(4, 2), servers=eps)


def test_unused_parameters_push_zeros_and_steps_count(shards):
    eps = endpoints(shards(1, ["--optimizer=sgd", "--lr=0.5"]))

    class TwoHeads(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(3, 1)
            self.b = torch.nn.Linear(3, 1)

        def forward(self, x):
            return self.a(x)

    m = TwoHeads()
    ps = apt.ParameterServer(m, servers=eps)
    opt = apt.DistributedOptimizer(ps)
    b0 = m.b.weight.detach().clone()
    a0 = m.a.weight.detach().clone()
    for _ in range(3):
        opt.zero_grad()
        m(torch.ones(2, 3)).sum().backward()
        opt.step()
    assert ps.clock == 3
    assert torch.equal(m.b.weight, b0)  # zero gradients: unchanged
    assert not torch.equal(m.a.weight, a0)
    t = ps.traffic()
    assert t["bytes_pushed_raw"] == 3 * 4 * 8
    ps.close()


def test_servers_and_rank_come_from_the_environment(shards, monkeypatch):
    eps = endpoints(shards(2, num_workers=3))
    monkeypatch.setenv("ASYNCPS_SERVERS", ",".join(eps))
    monkeypatch.setenv("ASYNCPS_RANK", "2")
    monkeypatch.setenv("ASYNCPS_NUM_WORKERS", "3")
    ps = apt.ParameterServer(torch.nn.Linear(2, 2))
    assert (ps.servers, ps.rank, ps.num_workers) == (eps, 2, 3)
    ps.close()
    monkeypatch.setenv("ASYNCPS_RANK", "3")
    with pytest.raises(asyncps.InvalidArgument, match="rank 3 is not in"):
        apt.ParameterServer(torch.nn.Linear(2, 2))
    monkeypatch.delenv("ASYNCPS_SERVERS")
    with pytest.raises(asyncps.InvalidArgument, match="ASYNCPS_SERVERS"):
        apt.ParameterServer(torch.nn.Linear(2, 2))


def test_structure_check_sees_added_modules_and_parameters(shards):
    eps = endpoints(shards(1))
    m = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU())
    ps = apt.ParameterServer(m, servers=eps)
    ps.push()
    m[1].extra = torch.nn.Linear(2, 2)  # a leaf module grows a submodule
    with pytest.raises(asyncps.FailedPrecondition, match="1.extra.weight"):
        ps.push()
    del m[1].extra
    ps.push()
    m[0].scale = torch.nn.Parameter(torch.ones(1))
    with pytest.raises(asyncps.FailedPrecondition, match="0.scale"):
        ps.push()


def test_drop_last_leaves_out_exactly_the_short_batch():
    need_data()
    train = Mnist.load("train")
    # 60000 / 7 = 8571 examples per rank: 133 batches of 64 and one of 59.
    assert train.batches_per_epoch(7, 64) == 134
    assert train.batches_per_epoch(7, 64, drop_last=True) == 133
    for epoch in (0, 1):
        full = list(train.batches(3, 7, 64, epoch, seed=5))
        dropped = list(train.batches(3, 7, 64, epoch, seed=5, drop_last=True))
        assert [len(y) for _, y in full] == [64] * 133 + [59]
        assert len(dropped) == 133
        for (xa, ya), (xb, yb) in zip(full, dropped):
            np.testing.assert_array_equal(xa, xb)
            np.testing.assert_array_equal(ya, yb)


def test_drop_last_auto_follows_the_shards_consistency(shards):
    spec = importlib.util.spec_from_file_location("_common", os.path.join(EXAMPLES, "_common.py"))
    common = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(common)
    for flags, bsp in ((["--consistency=bsp"], True), (["--consistency=asp"], False)):
        model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 10))
        ps = apt.ParameterServer(model, servers=endpoints(shards(1, flags)), rank=0,
                                 num_workers=1)
        assert common.shards_run_bsp(ps) is bsp
        ps.close()
