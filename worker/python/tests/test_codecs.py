"""asyncps.Compressor gives the bytes of the C++ path (ps_py_crosscheck
--mode=encode runs compression::Compressor on the same gradients), for
every codec and wrapper, step after step (error feedback, DGC momentum and
warm-up carry state across steps); decode() inverts them."""
import subprocess

import numpy as np
import pytest

import asyncps
from conftest import binary

SIZES = [5000, 700, 3000]
STEPS = 4

CODECS = ["none", "fp16", "bf16", "int8", "int8:bucket=64,ef=1", "qsgd:levels=4,bucket=512",
          "qsgd:levels=16,ef=1", "terngrad", "sign:ef=1", "topk:ratio=0.01",
          "topk:ratio=0.05,mode=sampled,ef=1", "topk:ratio=0.01,ef=1,momentum=0.9,warmup_epochs=1",
          "randomk:ratio=0.02,ef=1", "int8:min_elems=1000"]


def gradients():
    rng = np.random.default_rng(11)
    return [[rng.standard_normal(n).astype(np.float32) for n in SIZES] for _ in range(STEPS)]


def cpp_payloads(tmp_path, spec, seed):
    gpath, opath = str(tmp_path / "g.f32"), str(tmp_path / "p.bin")
    with open(gpath, "wb") as f:
        for step in gradients():
            for g in step:
                f.write(g.tobytes())
    subprocess.run([binary("ps_py_crosscheck"), "--mode=encode", "--codec=" + spec,
                    "--seed=%d" % seed, "--sizes=" + ",".join(map(str, SIZES)),
                    "--steps=%d" % STEPS, "--input=" + gpath, "--output=" + opath],
                   check=True, timeout=60)
    data = open(opath, "rb").read()
    out, i = [], 0
    while i < len(data):
        cid = data[i]
        n = int.from_bytes(data[i + 1:i + 5], "little")
        out.append((cid, data[i + 5:i + 5 + n]))
        i += 5 + n
    return out


@pytest.mark.parametrize("spec", CODECS)
def test_payload_bytes_equal_the_cpp_path(tmp_path, spec):
    c = asyncps.Compressor(spec, SIZES, seed=99)
    py = []
    for step, gs in enumerate(gradients()):
        for chunk, g in enumerate(gs):
            py.append(c.compress(chunk, g, epoch=step * 0.25, step=step))
    cpp = cpp_payloads(tmp_path, spec, 99)
    assert len(py) == len(cpp) == STEPS * len(SIZES)
    for k, ((pid, pb), (cid, cb)) in enumerate(zip(py, cpp)):
        assert pid == cid, "codec id differs at payload %d" % k
        assert pb == cb, "payload %d (step %d, chunk %d) differs" % (k, k // 3, k % 3)
    stats = c.stats()
    assert stats["chunks"] > 0
    assert stats["wire_bytes"] > 0


def test_decode_inverts_lossless_and_bounded_codecs():
    g = np.random.default_rng(1).standard_normal(4096).astype(np.float32)
    cid, payload = asyncps.Compressor("none", [4096]).compress(0, g)
    assert asyncps.codec_name(cid) == "none"
    assert asyncps.decode(payload, 4096).tobytes() == g.tobytes()
    cid, payload = asyncps.Compressor("int8", [4096]).compress(0, g)
    assert asyncps.codec_name(cid) == "int8"
    assert np.max(np.abs(asyncps.decode(payload, 4096) - g)) <= np.max(np.abs(g)) / 127 + 1e-6
    cid, payload = asyncps.Compressor("topk:ratio=0.01", [4096]).compress(0, g)
    d = asyncps.decode(payload, 4096)
    assert np.count_nonzero(d) == 41 and len(payload) < 4096


def test_error_feedback_keeps_the_residual():
    g = np.random.default_rng(2).standard_normal(4096).astype(np.float32)
    c = asyncps.Compressor("topk:ratio=0.01,ef=1", [4096])
    _, payload = c.compress(0, g)
    sent = asyncps.decode(payload, 4096)
    np.testing.assert_array_equal(sent + c.residual(0), g)


def test_bad_inputs():
    with pytest.raises(asyncps.InvalidArgument, match="unknown codec"):
        asyncps.Compressor("gzip", [10])
    c = asyncps.Compressor("fp16", [10])
    with pytest.raises(asyncps.InvalidArgument, match="float32 array of 10 elements"):
        c.compress(0, np.zeros(10, np.float64))
    with pytest.raises(asyncps.InvalidArgument, match="out of range"):
        c.compress(1, np.zeros(10, np.float32))
    with pytest.raises(asyncps.Error):
        asyncps.decode(b"\x00" * 7, 10)
    assert asyncps.parse_codec("topk:ef=1") == "topk:ratio=0.01,ef=1"
