"""asyncps.Client / asyncps.Store against real ps_server processes: the
round trip is bitwise the C++ client's, bad input is refused with a clear
exception and leaves the shard untouched, SSP holds from Python, a dead
shard is named, Ctrl-C interrupts a blocked pull."""
import json
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import asyncps
from conftest import binary, endpoints, python_env

SPECS = [("w", [300, 70], "he_normal", 0.0, 7), ("b", [70], "zeros", 0.0, 7),
         ("v", [5000], "uniform", 0.1, 7)]


def specs():
    return [asyncps.TensorSpec(*s) for s in SPECS]


def spec_arg():
    return ",".join("%s:%s:%s:%g:%d" % (n, "x".join(map(str, shape)), init, p, seed)
                    for n, shape, init, p, seed in SPECS)


def buffers():
    return [np.zeros(s.shape, np.float32) for s in specs()]


def grads(steps, seed=3):
    rng = np.random.default_rng(seed)
    return [[rng.standard_normal(s.shape).astype(np.float32) for s in specs()]
            for _ in range(steps)]


def python_trajectory(eps, steps, codec, pull_codec="", prefetch=False, shared_memory_mb=0,
                      send_buffer_kb=0):
    client = asyncps.Client(eps, rank=0, timeout_s=30, shared_memory_mb=shared_memory_mb,
                            send_buffer_kb=send_buffer_kb)
    store = asyncps.Store(client, specs(), push_codec=codec, pull_codec=pull_codec, seed=1,
                          prefetch_ahead=prefetch)
    out, w = [], buffers()
    for c, g in enumerate(grads(steps)):
        store.pull(c, w)
        out.append(np.concatenate([x.ravel() for x in w]))
        store.push(c, g)
        store.clock(c + 1)
    store.pull(steps, w)
    out.append(np.concatenate([x.ravel() for x in w]))
    store.close()
    return np.stack(out)


def cpp_trajectory(tmp_path, eps, steps, codec, pull_codec="", prefetch=False):
    gpath, wpath = str(tmp_path / "grads.f32"), str(tmp_path / "weights.f32")
    with open(gpath, "wb") as f:
        for step in grads(steps):
            for g in step:
                f.write(g.tobytes())
    subprocess.run([binary("ps_py_crosscheck"), "--mode=train", "--servers=" + ",".join(eps),
                    "--rank=0", "--tensors=" + spec_arg(), "--codec=" + codec,
                    "--pull_codec=" + pull_codec, "--seed=1", "--steps=%d" % steps,
                    "--input=" + gpath, "--output=" + wpath,
                    "--prefetch_ahead=%s" % ("true" if prefetch else "false")],
                   check=True, timeout=120)
    total = sum(int(np.prod(s[1])) for s in SPECS)
    return np.fromfile(wpath, np.float32).reshape(steps + 1, total)


@pytest.mark.parametrize("codec,pull_codec,prefetch", [
    ("none", "", False), ("fp16", "", False), ("int8", "", True),
    ("qsgd:levels=4,bucket=512,ef=1", "", False), ("topk:ratio=0.01,ef=1", "topk:ratio=0.05", False),
    ("topk:ratio=0.01,ef=1,momentum=0.9,warmup_epochs=1", "", False),
    ("randomk:ratio=0.02,ef=1", "bf16", True), ("sign:ef=1", "int8", False)])
def test_round_trip_bitwise_equal_to_cpp_client(shards, tmp_path, codec, pull_codec, prefetch):
    flags = ["--optimizer=momentum", "--lr=0.05", "--consistency=asp"]
    steps = 6
    py = python_trajectory(endpoints(shards(2, flags)), steps, codec, pull_codec, prefetch)
    cpp = cpp_trajectory(tmp_path, endpoints(shards(2, flags)), steps, codec, pull_codec, prefetch)
    assert py.shape == cpp.shape
    assert py.tobytes() == cpp.tobytes(), "differs at steps %s" % sorted(
        set(np.nonzero(py != cpp)[0].tolist()))
    # The pushes did something: the weights moved.
    assert not np.array_equal(py[0], py[-1])


def test_small_send_buffers_train_bitwise_alike_and_bad_sizes_are_refused(shards):
    """send_buffer_kb (the client's SO_SNDBUF) and ps_server --send_buffer_kb
    change no bit of training (prefetch_ahead, 2 shards), and out-of-range
    sizes are refused by the client and by ps_server, naming the option."""
    flags = ["--optimizer=momentum", "--lr=0.05", "--consistency=asp"]
    small = python_trajectory(endpoints(shards(2, flags + ["--send_buffer_kb=16"])), 6, "none",
                              prefetch=True, send_buffer_kb=16)
    plain = python_trajectory(endpoints(shards(2, flags)), 6, "none", prefetch=True)
    assert small.tobytes() == plain.tobytes()
    assert not np.array_equal(small[0], small[-1])
    eps = endpoints(shards(1, flags))
    for bad in (-1, 3, 65537):
        with pytest.raises(asyncps.InvalidArgument, match="send_buffer_kb must be 0"):
            asyncps.Client(eps, rank=0, send_buffer_kb=bad)
    r = subprocess.run([binary("ps_server"), "--endpoint=tcp://127.0.0.1:0",
                        "--send_buffer_kb=70000"], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert "--send_buffer_kb must be 0 (the OS default) or 4 to 65536 KiB, got 70000" in r.stderr


@pytest.mark.parametrize("prefetch", [False, True])
def test_shared_memory_pulls_bitwise_equal_to_socket_pulls(shards, prefetch):
    """Shards on this host write pulls into the client's shared memory: the
    same weights, bit for bit, as pulls over the socket."""
    flags = ["--optimizer=momentum", "--lr=0.05", "--consistency=asp"]
    group = shards(2, flags)
    shm = python_trajectory(endpoints(group), 6, "none", prefetch=prefetch, shared_memory_mb=4)
    written = [json.loads(t)["shm_bytes_out"]
               for t in asyncps.Client(endpoints(group), rank=-1).stats()]
    sock = python_trajectory(endpoints(shards(2, flags)), 6, "none", prefetch=prefetch)
    assert shm.tobytes() == sock.tobytes()
    assert not np.array_equal(shm[0], shm[-1])
    # Every pull of the run went through shared memory, on both shards.
    total = sum(int(np.prod(s[1])) for s in SPECS) * 4
    assert sum(written) >= 7 * total, written
    assert all(w > 0 for w in written), written


def test_pull_writes_initial_values_in_place(shards):
    client = asyncps.Client(endpoints(shards(2)), rank=0)
    store = asyncps.Store(client, specs())
    w = buffers()
    ids = [id(x) for x in w]
    store.pull(0, w)
    assert [id(x) for x in w] == ids
    for spec, x in zip(specs(), w):
        assert x.tobytes() == spec.initial_values().tobytes()


def test_register_is_idempotent_and_a_mismatch_names_the_tensor(shards):
    eps = endpoints(shards(1, num_workers=2))
    asyncps.Client(eps, rank=0).register(specs())
    asyncps.Client(eps, rank=1).register(specs())  # same model: fine
    other = specs()
    other[1] = asyncps.TensorSpec("b", [71], "zeros", 0.0, 7)
    with pytest.raises(asyncps.AlreadyExists, match="tensor 'b'"):
        asyncps.Client(eps, rank=1).register(other)


def assert_untouched(eps, initial):
    w = buffers()
    store = asyncps.Store(asyncps.Client(eps, rank=0), specs())
    store.pull(0, w)
    for x, y in zip(w, initial):
        assert x.tobytes() == y.tobytes()
    store.close()


def test_bad_buffers_raise_naming_the_tensor_and_change_nothing(shards):
    eps = endpoints(shards(1, ["--optimizer=sgd", "--lr=1"]))
    store = asyncps.Store(asyncps.Client(eps, rank=0), specs())
    initial = buffers()
    store.pull(0, initial)
    good = [np.ones(s.shape, np.float32) for s in specs()]

    bad = list(good)
    bad[1] = np.ones(70, np.float64)
    with pytest.raises(asyncps.InvalidArgument, match="tensor 'b' has dtype float64"):
        store.push(0, bad)
    bad = list(good)
    bad[0] = np.ones((70, 300), np.float32).T  # right shape, not C-contiguous
    with pytest.raises(asyncps.InvalidArgument, match="tensor 'w' is not C-contiguous"):
        store.push(0, bad)
    bad = list(good)
    bad[2] = np.ones(4999, np.float32)
    with pytest.raises(asyncps.InvalidArgument,
                       match=r"tensor 'v' has shape \(4999,\), registered as \(5000,\)"):
        store.push(0, bad)
    with pytest.raises(asyncps.InvalidArgument, match="3 tensors, got 2"):
        store.push(0, good[:2])
    bad = list(good)
    bad[0] = [[1.0] * 70] * 300
    with pytest.raises(asyncps.InvalidArgument, match="tensor 'w' is a list"):
        store.push(0, bad)
    ro = buffers()
    ro[1].setflags(write=False)
    with pytest.raises(asyncps.InvalidArgument, match="tensor 'b' is read-only"):
        store.pull(0, ro)
    # A non-finite gradient is refused by the shard, naming it, and not applied.
    bad = list(good)
    bad[2] = good[2].copy()
    bad[2][17] = np.nan
    with pytest.raises(asyncps.Error, match="shard 0"):
        store.push(0, bad)
        store.clock(1)
        store.pull(1, buffers())
    store.close()
    assert_untouched(eps, initial)


def test_unknown_codec_spec(shards):
    client = asyncps.Client(endpoints(shards(1)), rank=0)
    with pytest.raises(asyncps.InvalidArgument, match="unknown codec 'zstd'"):
        asyncps.Store(client, specs(), push_codec="zstd")
    with pytest.raises(asyncps.InvalidArgument, match="pull_codec"):
        asyncps.Store(client, specs(), pull_codec="topk:ratio=2")
    with pytest.raises(asyncps.InvalidArgument, match="unknown codec"):
        asyncps.parse_codec("topk2")


def test_store_before_register_is_a_failed_precondition(shards):
    client = asyncps.Client(endpoints(shards(1)), rank=0)
    with pytest.raises(asyncps.FailedPrecondition, match="not registered"):
        asyncps.Store(client, specs(), register=False)
    with pytest.raises(asyncps.FailedPrecondition):
        client.chunks()
    client.register(specs())
    store = asyncps.Store(client, specs(), register=False)
    store.pull(0, buffers())
    store.close()
    with pytest.raises(asyncps.FailedPrecondition, match="closed"):
        store.push(0, buffers())


def test_dead_shard_times_out_naming_its_endpoint(shards, tmp_path):
    live = shards(1)[0]
    # Bind and close to find a port nobody listens on.
    dead = shards(1)[0]
    dead_ep = dead.endpoint
    dead.stop()
    client = asyncps.Client([live.endpoint, dead_ep], rank=0, timeout_s=1.0,
                            attempt_timeout_s=0.2)
    t0 = time.time()
    with pytest.raises(asyncps.TimedOut, match=dead_ep.replace(".", r"\.")) as e:
        client.register(specs())
    assert isinstance(e.value, TimeoutError)
    assert time.time() - t0 < 10


def test_ssp_bound_holds_from_python(shards):
    eps = endpoints(shards(1, ["--consistency=ssp", "--staleness=1"], num_workers=2))
    fast = asyncps.Store(asyncps.Client(eps, rank=0, timeout_s=30), specs())
    slow = asyncps.Store(asyncps.Client(eps, rank=1, timeout_s=30), specs())
    w = buffers()
    g = [np.zeros(s.shape, np.float32) for s in specs()]
    for c in range(2):  # rank 0 runs to clock 2; rank 1 stays at clock 0
        fast.pull(c, w)
        fast.push(c, g)
        fast.clock(c + 1)
    done = threading.Event()

    def blocked_pull():
        fast.pull(2, w)  # needs every clock >= 2 - 1
        done.set()

    t = threading.Thread(target=blocked_pull)
    t.start()
    assert not done.wait(1.0), "a pull 2 clocks ahead of a worker returned under SSP s=1"
    slow.pull(0, buffers())
    slow.push(0, g)
    slow.clock(1)
    assert done.wait(10), "the pull did not return once the slow worker caught up"
    t.join()
    fast.close()
    slow.close()


INTERRUPT_SCRIPT = r"""
import sys, time, numpy as np, asyncps
eps = sys.argv[1].split(",")
w = [np.zeros(s, np.float32) for s in ([300, 70], [70], [5000])]
st = asyncps.Store(asyncps.Client(eps, rank=0, timeout_s=600),
                   [asyncps.TensorSpec("w", [300, 70]), asyncps.TensorSpec("b", [70]),
                    asyncps.TensorSpec("v", [5000])], timeout_s=600)
for c in range(2):
    st.pull(c, w); st.push(c, w); st.clock(c + 1)
print("blocking", flush=True)
try:
    st.pull(2, w)  # rank 1 never comes (clock 0): blocks under SSP s=1
except KeyboardInterrupt:
    print("interrupted %.6f" % time.time(), flush=True)
    sys.exit(3)
"""


def test_ctrl_c_interrupts_a_blocked_pull(shards, tmp_path):
    eps = endpoints(shards(1, ["--consistency=ssp", "--staleness=1", "--worker_timeout_s=600"],
                           num_workers=2))
    p = subprocess.Popen([sys.executable, "-c", INTERRUPT_SCRIPT, ",".join(eps)],
                         stdout=subprocess.PIPE, text=True, env=python_env())
    assert p.stdout.readline().strip() == "blocking"
    time.sleep(0.5)
    sent = time.time()
    p.send_signal(signal.SIGINT)
    out, _ = p.communicate(timeout=20)
    assert p.returncode == 3, out
    took = float(out.split()[1]) - sent
    assert took < 0.5, "KeyboardInterrupt came %.3f s after SIGINT" % took


def test_traffic_counters(shards):
    eps = endpoints(shards(1))
    store = asyncps.Store(asyncps.Client(eps, rank=0), specs(), push_codec="topk:ratio=0.01,ef=1")
    w = buffers()
    for c in range(3):
        store.pull(c, w)
        store.push(c, grads(1)[0])
        store.clock(c + 1)
    store.flush()
    t = store.traffic()
    raw = 3 * 4 * sum(s.num_elements for s in specs())
    assert t["bytes_pushed_raw"] == raw
    assert 0 < t["bytes_pushed_wire"] < raw / 10
    assert t["bytes_pulled"] >= 3 * 4 * sum(s.num_elements for s in specs())
    assert t["encode_ns"] > 0 and t["last_staleness"] >= 0 and t["resends"] == 0
    # Step-time counters: parts within their wholes.
    assert 0 < t["pull_copy_ns"] <= t["pull_wait_ns"]
    assert t["encode_ns"] + t["push_copy_ns"] <= t["push_ns"] and t["clock_ns"] > 0
    per = {d["name"]: d for d in store.tensor_bytes()}
    assert per["b"]["raw"] == per["b"]["wire"] == 3 * 4 * 70  # below min_elems: raw
    store.close()


def test_shard_restart_is_transparent(shards, tmp_path):
    """kill -9 of a durable shard mid-run, restarted at the same endpoint
    from its RocksDB store: the Python worker's requests are resent and
    training goes on; no acknowledged push is lost."""
    db = str(tmp_path / "db")
    flags = ["--optimizer=sgd", "--lr=1", "--db_path=" + db, "--durable"]
    first = shards(1, flags)[0]
    ep = first.endpoint
    store = asyncps.Store(asyncps.Client([ep], rank=0, timeout_s=60, attempt_timeout_s=0.2),
                          specs(), timeout_s=60)
    w = buffers()
    one = [np.ones(s.shape, np.float32) for s in specs()]
    for c in range(3):
        store.pull(c, w)
        store.push(c, one)
        store.clock(c + 1)
    store.flush()
    first.proc.kill()
    first.proc.wait()
    from conftest import Shard
    second = Shard(tmp_path, flags, "restarted", endpoint=ep)
    try:
        for c in range(3, 6):
            store.pull(c, w)
            store.push(c, one)
            store.clock(c + 1)
        store.pull(6, w)
        # Six pushes of ones at lr 1: initial values minus 6, exactly once each.
        for spec, x in zip(specs(), w):
            np.testing.assert_allclose(x, spec.initial_values() - 6, rtol=0, atol=1e-5)
        assert store.traffic()["resends"] >= 1
        store.close()
    finally:
        second.stop()


def test_curve_encrypted_shard(shards, tmp_path):
    prefix = str(tmp_path / "server")
    subprocess.run([binary("ps_ctl"), "keygen", "--out=" + prefix], check=True,
                   capture_output=True, timeout=30)
    eps = endpoints(shards(1, ["--curve_secret_key=" + prefix + ".key"]))
    store = asyncps.Store(asyncps.Client(eps, rank=0, curve_server_key=prefix + ".pub"),
                          specs())
    store.pull(0, buffers())
    store.close()
    with pytest.raises(asyncps.TimedOut, match=eps[0].replace(".", r"\.")):
        asyncps.Client(eps, rank=0, timeout_s=1.0, attempt_timeout_s=0.2).register(specs())
    with pytest.raises(asyncps.InvalidArgument):
        asyncps.Client(eps, rank=0, curve_secret_key=prefix + ".key")
