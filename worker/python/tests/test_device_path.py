"""asyncps.torch with the model on each device: the CPU always, and a CUDA
device where one is visible (tests/gpu/run.sh runs this file on a GPU
machine: ctest -L gpu). Every step's update is checked exactly against the
gradient the model computed that step, so a gradient pushed twice, a stale
host copy or a pull pushed as a gradient fails it."""
import numpy as np
import pytest

import asyncps

torch = pytest.importorskip("torch")  # a GPU machine may lack python3-torch: Skipped
import asyncps.torch as apt  # noqa: E402
from conftest import endpoints  # noqa: E402

HAVE_CUDA = asyncps.built_with_cuda and torch.cuda.is_available()
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not HAVE_CUDA, reason="no CUDA device visible (or asyncps built without CUDA): "
    "tests/gpu/run.sh runs it on a GPU machine"))]
LR = 0.5  # a power of two: w - LR * g is one rounding, as on the shard


def mlp(device):
    torch.manual_seed(3)
    return torch.nn.Sequential(torch.nn.Linear(20, 16), torch.nn.Tanh(),
                               torch.nn.Linear(16, 3)).to(device)


def batch(step, device):
    gen = torch.Generator().manual_seed(100 + step)
    return (torch.randn(32, 20, generator=gen).to(device),
            torch.randint(0, 3, (32,), generator=gen).to(device))


def host(tensors):
    return [t.detach().to("cpu").clone() for t in tensors]


def train_step(model, opt, step, device):
    """One step on batch `step`, the gradients zeroed in place (torch < 2's
    default: the same gradient tensors every step); returns the weights and
    gradients the step started from, copied to the CPU."""
    opt.zero_grad(set_to_none=False)
    x, y = batch(step, device)
    torch.nn.functional.cross_entropy(model(x), y).backward()
    w, g = host(model.parameters()), host(p.grad for p in model.parameters())
    opt.step()
    return w, g


@pytest.mark.parametrize("device", DEVICES)
def test_each_step_applies_exactly_that_steps_gradient(shards, device):
    eps = endpoints(shards(1, ["--consistency=asp", "--optimizer=sgd", "--lr=%g" % LR]))
    model = mlp(device)
    ps = apt.ParameterServer(model, servers=eps, rank=0, num_workers=1)
    opt = apt.DistributedOptimizer(ps)
    assert not ps.store.accepts_device_gradients  # no codec: the host path
    grads_seen = []
    for step in range(3):
        # opt.step(): push, then pull; one worker under ASP sees its own push.
        w, g = train_step(model, opt, step, device)
        grads_seen.append(g)
        for name, p, w0, g0 in zip(ps.names, model.parameters(), w, g):
            assert p.device.type == device, name
            assert torch.equal(p.detach().to("cpu"), w0 - LR * g0), (step, name)
    # The steps' gradients differ, so a gradient pushed again would have shown.
    assert not torch.equal(grads_seen[1][0], grads_seen[2][0])
    ps.close()


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("device", DEVICES)
def test_top_k_sends_the_largest_entries_of_each_steps_gradient(shards, device, overlap):
    eps = endpoints(shards(1, ["--consistency=asp", "--optimizer=sgd", "--lr=%g" % LR]))
    model = mlp(device)
    ps = apt.ParameterServer(model, servers=eps, rank=0, num_workers=1, overlap=overlap,
                             codec="topk:ratio=0.25,min_elems=1")
    opt = apt.DistributedOptimizer(ps)
    # A CUDA model is compressed on the device (PushDevice), a CPU one on the
    # host; with overlap=True each bucket's host copy is, on either device.
    assert ps.store.accepts_device_gradients == (device == "cuda" and not overlap)
    for step in range(2):
        w, g = train_step(model, opt, step, device)
        ps.pull()  # overlap=True: the pull the next forward would wait for
        for name, p, w0, g0 in zip(ps.names, model.parameters(), w, g):
            now = p.detach().to("cpu")
            changed = now != w0
            n = g0.numel()
            # At most a quarter of each tensor moves (one chunk each here;
            # min_elems=1 compresses the small ones too), each moved weight
            # by exactly its own gradient entry...
            assert 0 < int(changed.sum()) <= -(-n // 4) + 1, (step, name)
            assert torch.equal(now[changed], (w0 - LR * g0)[changed]), (step, name)
            # ... and those are the largest entries of the gradient.
            if int(changed.sum()) < n:
                assert float(g0[changed].abs().min()) >= float(g0[~changed].abs().max()), \
                    (step, name)
    ps.close()


@pytest.mark.parametrize("device", DEVICES)
def test_state_dict_of_the_model_loads_into_a_plain_cpu_model(shards, tmp_path, device):
    eps = endpoints(shards(1, ["--consistency=asp", "--optimizer=sgd", "--lr=%g" % LR]))
    model = mlp(device)
    ps = apt.ParameterServer(model, servers=eps, rank=0, num_workers=1)
    opt = apt.DistributedOptimizer(ps)
    train_step(model, opt, 0, device)
    x, _ = batch(1, device)
    path = tmp_path / "model.pt"
    torch.save(ps.state_dict(), path)
    plain = mlp("cpu")
    plain.load_state_dict(torch.load(path))
    for (name, a), b in zip(plain.named_parameters(), model.parameters()):
        assert a.device.type == "cpu"
        assert torch.equal(a.detach(), b.detach().to("cpu")), name
    if device == "cpu":  # same weights, same kernels: the same outputs
        assert torch.equal(plain(x), model(x))
    ps.close()


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("device", DEVICES)
def test_worker_side_optimizer_steps_the_model_on_its_device(shards, device, overlap):
    # The shards only sum (sgd, lr 1 carried); torch.optim.SGD runs on the
    # model's device with the gradient the pull brought back. With overlap
    # the gradients leave in buckets during backward (the pull stays whole).
    eps = endpoints(shards(1, ["--consistency=asp", "--optimizer=sgd", "--lr=0.1"]))
    model = mlp(device)
    ps = apt.ParameterServer(model, servers=eps, rank=0, num_workers=1, overlap=overlap,
                             bucket_mb=0.0001, first_bucket_mb=0.0001)
    opt = apt.WorkerOptimizer(ps, torch.optim.SGD(model.parameters(), lr=LR))
    for step in range(3):
        w, g = train_step(model, opt, step, device)
        for name, p, w0, g0 in zip(ps.names, model.parameters(), w, g):
            assert p.device.type == device and p.grad.device.type == device, name
            # The gradient came back as (pulled before) - (pulled now): g up
            # to the rounding of the shard's sum.
            torch.testing.assert_close(p.detach().to("cpu"), w0 - LR * g0,
                                       rtol=1e-5, atol=1e-6, msg=lambda m: "%d %s: %s" % (
                                           step, name, m))
    if overlap:
        assert ps._overlap.stats["buckets"] >= 2 * 3, ps._overlap.stats
    ps.close()


@pytest.mark.parametrize("device", DEVICES)
def test_sparse_rows_come_to_the_device_and_their_gradients_go_back(shards, device):
    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = apt.SparseEmbedding("e", 2, init="zeros", optimizer="sgd", lr=1.0)
            self.b = torch.nn.Parameter(torch.zeros(1, device=device))

        def forward(self, ids):
            return self.emb(ids).sum() + self.b.sum()

    eps = endpoints(shards(1, ["--consistency=asp", "--optimizer=sgd", "--lr=0.1"]))
    model = Model()
    ps = apt.ParameterServer(model, servers=eps, rank=0, num_workers=1,
                             init={"b": ("zeros", 0.0)})
    opt = apt.DistributedOptimizer(ps)
    ids = torch.tensor([3, 4, 3], device=device)
    assert model.emb(ids).device.type == device
    opt.zero_grad()
    # Two forward passes in one step: id 3 gets 2 + 1, id 4 gets 1.
    (model(ids) + model(torch.tensor([3], device=device))).backward()
    opt.step()
    rows = ps.client.pull_rows("e", np.array([3, 4, 5], np.uint64), clock=ps.clock)
    assert np.array_equal(rows, np.array([[-3, -3], [-1, -1], [0, 0]], np.float32))
    with torch.no_grad():  # a lookup outside a step: nothing to push
        out = model.emb(torch.tensor([4, 5], device=device))
    assert out.device.type == device
    assert torch.equal(out.detach().to("cpu"), torch.tensor([[-1.0, -1.0], [0.0, 0.0]]))
    ps.close()


@pytest.mark.parametrize("consistency", ["asp", "bsp"])
@pytest.mark.parametrize("device", DEVICES)
def test_overlap_pushes_each_steps_gradient_and_pulls_by_groups(shards, device, consistency):
    # Buckets of 100 bytes (2 per step under ASP; one per shard under
    # BSP) and layered pulls; after ps.pull() the weights are each step's
    # exact update, written into the model on its device.
    eps = endpoints(shards(2, ["--consistency=" + consistency, "--optimizer=sgd",
                               "--lr=%g" % LR]))
    model = mlp(device)
    ps = apt.ParameterServer(model, servers=eps, rank=0, num_workers=1, overlap=True,
                             bucket_mb=0.0001, first_bucket_mb=0.0001)
    opt = apt.DistributedOptimizer(ps)
    for step in range(3):
        w, g = train_step(model, opt, step, device)
        ps.pull()  # the layered pull the next forward would wait for, now
        for name, p, w0, g0 in zip(ps.names, model.parameters(), w, g):
            assert p.device.type == device, name
            assert torch.equal(p.detach().to("cpu"), w0 - LR * g0), (step, name)
    stats = ps._overlap.stats
    assert stats["steps"] == 3 and stats["buckets"] >= 6, stats
    assert stats["pull_groups"] > 0, stats  # the pulls went by groups
    ps.close()
