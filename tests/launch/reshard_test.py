#!/usr/bin/env python3
"""ps_reshard with psrun: a 3-shard fleet trains (a Python worker through the
asyncps package: Adam on dense tensors cut differently on 3 and 2 shards, an
AdaGrad sparse table) and shuts down (final checkpoints); ps_reshard restores
its stores onto 2 (re-cutting the chunks); a 2-shard fleet started by psrun
on them pulls the same weights and rows, bitwise."""
import json
import os
import subprocess
import sys

import launch_test_util as u

WORKER = r'''
import os, sys
import numpy as np
import asyncps

mode, out = sys.argv[1], sys.argv[2]
client = asyncps.Client(os.environ["ASYNCPS_SERVERS"].split(","), rank=0, timeout_s=60)
specs = [asyncps.TensorSpec("w", [3, 1000], "uniform", 0.1, 3),
         asyncps.TensorSpec("b", [100], "zeros", 0.0, 4)]
emb = asyncps.TableSpec("emb", 8, "uniform", 0.25, 17, "adagrad", 0.2)
# 3100 floats in pieces of total / (8 shards): 129 on 3 shards, 193 on 2.
client.register(specs, chunk_elems=256, min_chunk_elems=16, tables=[emb])
store = asyncps.Store(client, specs, push_codec="none", chunk_elems=256,
                      min_chunk_elems=16)
w = [np.zeros(s.shape, np.float32) for s in specs]
keys = np.arange(500, dtype=np.uint64)
rng = np.random.default_rng(7)
steps = 8 if mode == "train" else 0
for step in range(steps):
    store.pull(step, w)
    store.push(step, [rng.standard_normal(s.shape).astype(np.float32) for s in specs])
    some = keys[step::7]
    client.push_rows("emb", some, rng.standard_normal((len(some), 8)).astype(np.float32),
                     clock=step)
    store.clock(step + 1)
store.pull(steps, w)
rows = client.pull_rows("emb", keys, clock=steps)
np.savez(out, w=w[0], b=w[1], rows=rows)
'''


class ReshardTest(u.LaunchTestCase):
    def psrun(self, run_dir, servers, mode, out):
        argv = [sys.executable, u.PSRUN, "--servers", str(servers), "--workers", "1",
                "--run_dir", run_dir, "--bin_dir", u.bin_dir(), "--grace", "3",
                "--start_timeout", "20", "--progress", "off", "--server_flags",
                "--consistency=asp --optimizer=adam --lr=0.01 --checkpoint_every_s=0",
                "--worker_cmd", "%s %s %s %s" % (sys.executable, self.script, mode, out)]
        return subprocess.run(argv, capture_output=True, text=True, timeout=120)

    def test_three_shards_restored_on_two_by_psrun(self):
        if not os.access(os.path.join(u.bin_dir(), "ps_reshard"), os.X_OK):
            raise u.unittest.SkipTest("ps_reshard not built")
        self.script = os.path.join(self.tmp.name, "worker.py")
        with open(self.script, "w") as f:
            f.write(WORKER)
        a, b = os.path.join(self.tmp.name, "a"), os.path.join(self.tmp.name, "b")
        before, after = os.path.join(self.tmp.name, "a.npz"), os.path.join(self.tmp.name, "b.npz")
        r = self.psrun(a, 3, "train", before)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)

        reshard = [os.path.join(u.bin_dir(), "ps_reshard"),
                   "--from=" + ",".join(os.path.join(a, "db", "server-%d" % i)
                                        for i in range(3)),
                   "--to=" + ",".join(os.path.join(b, "db", "server-%d" % j)
                                      for j in range(2))]
        r = subprocess.run(reshard, capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        report = json.loads(r.stdout.strip().splitlines()[-1])
        self.assertTrue(report["ok"] and report["recut"], report)
        self.assertEqual(report["to_shards"], 2)
        self.assertGreater(report["rows"], 0)

        r = self.psrun(b, 2, "read", after)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        import numpy as np  # the worker's interpreter has it too
        x, y = np.load(before), np.load(after)
        for name in ("w", "b", "rows"):
            self.assertEqual(x[name].tobytes(), y[name].tobytes(), name)
        self.assertTrue(np.any(x["b"] != 0))  # trained (b starts at zeros)


if __name__ == "__main__":
    u.main()
