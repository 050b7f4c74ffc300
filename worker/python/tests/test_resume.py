"""Issue 22 item 4: resuming a checkpoint of the model and of the shards'
optimizer state on a fresh fleet of real ps_server processes (127.0.0.1).
Server-side Adam under BSP, one worker: N steps, torch.save of
ps.state_dict() and ps.optimizer_state_dict(), a fresh fleet, both loaded,
M more steps: the final weights are bitwise those of an uninterrupted N+M
step run with the same seeds and batches, with a constant lr and with a
ps_server lr schedule (resumed at the state's steps); without the optimizer
state they differ. Also: per-chunk steps round-trip exactly, and state of another
optimizer is refused by the shards, naming the tensor, before any value is
written."""
import io

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import asyncps  # noqa: E402
import asyncps.torch as apt  # noqa: E402
from conftest import endpoints  # noqa: E402
from test_finetune import Net, batches  # noqa: E402  (the model and data of test_finetune)

ADAM = ["--consistency=bsp", "--optimizer=adam", "--lr=0.01"]
# A ps_server lr schedule (a warm-up over 10 rounds: each round its own
# rate): the shards resume its count at the uploaded state's steps.
SCHEDULE = ADAM + ["--lr_warmup_updates=10", "--lr_warmup_start=0.1"]
CHUNK = 256  # the fc weight (1440 floats) spans several chunks
N, M = 4, 3


def train(ps, model, data):
    opt = apt.DistributedOptimizer(ps)
    for x, y in data:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()


def weights(model):
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def fleet(shards, flags=ADAM):
    return endpoints(shards(2, flags, num_workers=1))


def start(eps, init=None, seed=7):
    torch.manual_seed(seed)
    m = Net()
    if init is not None:
        m.load_state_dict(init)
    ps = apt.ParameterServer(m, servers=eps, rank=0, num_workers=1, chunk_elems=CHUNK,
                             init="model" if init is not None else None)
    return m, ps


@pytest.mark.parametrize("flags", [ADAM, SCHEDULE], ids=["constant_lr", "lr_schedule"])
def test_resume_with_the_shards_optimizer_state_is_bitwise_an_uninterrupted_run(shards, flags):
    torch.manual_seed(0)
    init = Net().state_dict()
    data = batches(N + M)
    m, ps = start(fleet(shards, flags), init)
    train(ps, m, data)
    want = weights(m)
    ps.close()

    m, ps = start(fleet(shards, flags), init)
    train(ps, m, data[:N])
    buf = io.BytesIO()
    torch.save({"model": ps.state_dict(), "opt": ps.optimizer_state_dict()}, buf)
    ps.close()

    def resume(how):
        buf.seek(0)
        ckpt = torch.load(buf)
        m2, ps2 = start(fleet(shards, flags))  # other initial weights, overwritten
        if how == "together":
            ps2.load_state_dict(ckpt["model"], optimizer_state=ckpt["opt"])
        elif how == "separately":
            ps2.load_state_dict(ckpt["model"])
            ps2.load_optimizer_state_dict(ckpt["opt"])
        else:
            ps2.load_state_dict(ckpt["model"])
        if how != "without":
            back = ps2.optimizer_state_dict()
            assert back["optimizer"] == "adam" and back["step"] == N
            for name, entry in ckpt["opt"]["state"].items():
                for slot, t in entry.items():
                    assert torch.equal(back["state"][name][slot], t), (name, slot)
        train(ps2, m2, data[N:])
        got = weights(m2)
        ps2.close()
        return got

    for how in ("together", "separately"):
        got = resume(how)
        for k in want:
            assert torch.equal(got[k], want[k]), (how, k)
    # Without the optimizer state (the moments restart) the run differs: the
    # comparison above can fail.
    without = resume("without")
    assert any(not torch.equal(without[k], want[k]) for k in want)


def test_per_chunk_steps_round_trip_exactly(shards):
    m, ps = start(fleet(shards), Net().state_dict())
    train(ps, m, batches(2))
    sd = ps.optimizer_state_dict()
    entry = sd["state"]["fc.weight"]
    chunks = len(entry["chunk_steps"])
    assert chunks == (1440 + CHUNK - 1) // CHUNK
    assert entry["chunk_steps"].tolist() == [2] * chunks and float(entry["step"]) == 2.0
    entry["chunk_steps"] = torch.arange(1, chunks + 1, dtype=torch.int64) * 1000
    sd["state"]["fc.bias"].pop("chunk_steps")
    sd["state"]["fc.bias"]["step"] = torch.tensor(77.0)  # torch.optim style
    ps.load_optimizer_state_dict(sd)
    back = ps.optimizer_state_dict()
    assert back["state"]["fc.weight"]["chunk_steps"].tolist() == \
        [1000 * (i + 1) for i in range(chunks)]
    assert back["state"]["fc.bias"]["chunk_steps"].tolist() == [77]
    assert back["step"] == 1000 * chunks
    # A count per chunk that does not fit the layout: refused, naming it.
    entry["chunk_steps"] = torch.tensor([1, 2])
    with pytest.raises(asyncps.InvalidArgument, match="'fc.weight'"):
        ps.load_optimizer_state_dict(sd)
    ps.close()


def test_state_of_another_optimizer_is_refused_naming_the_tensor(shards):
    m, ps = start(fleet(shards), Net().state_dict())
    train(ps, m, batches(1))
    adam = ps.optimizer_state_dict()
    ps.close()
    eps = fleet(shards, ["--consistency=bsp", "--optimizer=momentum", "--lr=0.01"])
    m2, ps2 = start(eps)
    before = weights(m2)
    # The Python check names the first parameter.
    with pytest.raises(asyncps.InvalidArgument, match="'conv.weight' was saved from adam"):
        ps2.load_optimizer_state_dict(adam)
    # The shards' own check (the low-level upload skips the Python one): the
    # state of 'adam' (2 floats per weight) into 'momentum' shards, refused
    # by the first shard asked before any value is written anywhere.
    names = ps2.names
    slots = [[adam["state"][n][s].numpy() for n in names] for s in ("exp_avg", "exp_avg_sq")]
    steps = [np.array([1], np.uint64) for _ in names]
    values = [np.full(p.shape, 9.0, np.float32) for p in ps2.params]
    with pytest.raises(asyncps.InvalidArgument,
                       match=r"optimizer state of tensor '[a-z.]+' \(chunk \d+\) was saved "
                             r"from 'adam', this shard runs 'momentum'"):
        ps2.client.upload(values, overwrite=True, state=("adam", slots, steps))
    ps2.pull()
    after = weights(m2)
    for k in before:
        assert torch.equal(before[k], after[k]), k
    ps2.close()
