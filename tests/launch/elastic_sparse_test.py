#!/usr/bin/env python3
"""psrun --elastic with a sparse model: 2 -> 3 -> 2 shards while 2 PyTorch
workers (psrun --worker_cmd, tests/launch/sparse_worker.py) train a
SparseEmbedding (AdaGrad rows) and a dense layer under ps_server
--consistency=bsp --sparse_consistency=asp, each rank on ids of its own. The
key-range buckets of the table move with the chunks (the steps' ps_ctl
reports count the rows moved), and both workers' final weights, every row of
the table included (ps.state_dict(), read through the elastic layout), are
bitwise those of a run with fixed membership. Exit 77 without etcd, the
binaries or Debian's python3-torch."""
import json
import os
import subprocess
import sys
import time
import unittest

import elastic_test
import launch_test_util as u

PY = "/usr/bin/python3"  # Debian's, with python3-torch
WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sparse_worker.py")
SERVER = ("--consistency=bsp --sparse_consistency=asp --optimizer=momentum --lr=0.05 "
          "--worker_timeout_s=30 --checkpoint_every_s=0")
STEPS = 2000  # ~8 s a worker here: the plan's steps at 2 s and 4 s fall inside


class ElasticSparseTest(elastic_test.EtcdTestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        r = subprocess.run([PY, "-c", "import torch"], capture_output=True)
        if r.returncode != 0:
            raise unittest.SkipTest("%s cannot import torch (python3-torch)" % PY)

    def run_psrun(self, name, plan):
        run_dir = os.path.join(self.tmp.name, name)
        argv = [sys.executable, u.PSRUN, "--servers", "2", "--workers", "2",
                "--run_dir", run_dir, "--bin_dir", u.bin_dir(), "--grace", "3",
                "--start_timeout", "20", "--progress", "off", "--server_flags", SERVER,
                "--worker_cmd", "%s %s" % (PY, WORKER)]
        if plan:
            # From the first push: PyTorch workers can take longer to start
            # (import, registration) than the plan's first step under a
            # loaded CI, and a change before any push moves no rows.
            argv += ["--elastic", plan, "--elastic_from", "training"]
        argv += ["--", "--steps=%d" % STEPS, "--out=" + os.path.join(run_dir, "w-{rank}.pt")]
        r = subprocess.run(argv, capture_output=True, text=True, timeout=150)
        self.assertEqual(r.returncode, 0, "%s failed:\n%s\n%s" % (
            name, r.stdout[-3000:], r.stderr[-3000:]))
        return run_dir

    def weights(self, run_dir):
        """rank 0's final state_dict as raw bytes per key; rank 1's equal."""
        code = ("import sys, torch\n"
                "a, b = (torch.load(p) for p in sys.argv[1:3])\n"
                "assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), "
                "'the two workers pulled different final weights'\n"
                "print(sorted((k, tuple(v.shape), v.numpy().tobytes().hex()) for k, v in "
                "a.items()))\n")
        r = subprocess.run([PY, "-c", code] + [os.path.join(run_dir, "w-%d.pt" % k)
                                              for k in (0, 1)],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr[-2000:])
        return r.stdout

    def test_sparse_model_through_two_three_two(self):
        t0 = time.monotonic()
        elastic = self.run_psrun("elastic", elastic_test.PLAN)
        t1 = time.monotonic()
        fixed = self.run_psrun("fixed", None)
        t2 = time.monotonic()
        with open(os.path.join(elastic, "elastic.json")) as f:
            doc = json.load(f)
        steps = doc["steps"]
        self.assertEqual(doc["from"], "training", doc)
        self.assertGreater(doc["from_s"], 0, doc)
        self.assertEqual([s.get("ok") for s in steps], [True, True], steps)
        add, remove = steps[0]["report"], steps[1]["report"]
        self.assertEqual([add["active"], remove["active"]], [[0, 1, 2], [1, 2]])
        for r in (add, remove):
            self.assertGreater(r["moved_buckets"], 0, r)
            self.assertGreater(r["moved_rows"], 0, r)
        with open(os.path.join(elastic, "summary.json")) as f:
            self.assertEqual(json.load(f)["totals"]["steps"], 2 * STEPS)
        w_elastic, w_fixed = self.weights(elastic), self.weights(fixed)
        self.assertIn("emb.weight", w_elastic)
        rows = int(w_elastic.split("('emb.weight', (", 1)[1].split(",", 1)[0])
        self.assertTrue(w_elastic == w_fixed,
                        "final weights (rows included) differ from the fixed run's")
        u.note("launch.elastic_sparse: --elastic '%s' with a SparseEmbedding model (2 PyTorch "
               "workers, BSP dense + ASP rows): add moved %d buckets / %d rows, remove %d / %d "
               "(and %d chunk(s)); final weights and all %d rows bitwise equal to the fixed "
               "run's; %.1f s elastic, %.1f s fixed" % (
                   elastic_test.PLAN, add["moved_buckets"], add["moved_rows"],
                   remove["moved_buckets"], remove["moved_rows"], remove["moved_chunks"],
                   rows, t1 - t0, t2 - t1))


if __name__ == "__main__":
    u.main()
