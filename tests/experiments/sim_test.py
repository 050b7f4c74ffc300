#!/usr/bin/env python3
"""Tests of the discrete-event simulator (experiments/sim/model.py): each
case is worked out by hand in its comment and must come out exactly."""
import unittest

import model as m  # experiments/sim (PYTHONPATH: experiments/CMakeLists.txt)
import unittest_main

FREE = dict(model_bytes=0.0, latency=0.0, header_bytes=0.0, per_request=0.0)


class HandComputedTest(unittest.TestCase):
    def test_bsp_with_fixed_step_times(self):
        # Worker 0 computes 1 s, worker 1 2 s, free network and shard. Each
        # round lasts 2 s; worker 0 waits 1 s in rounds 2 and 3 (its first
        # pull is answered at once) and ends with its last push at 5 s,
        # worker 1 at 6 s. Three rounds = three updates in 6 s.
        r = m.simulate(m.Config(workers=2, consistency="bsp", steps=3,
                                step_time=m.Fixed(1.0, {1: 2.0}), **FREE))
        self.assertEqual(r.wall, [5.0, 6.0])
        self.assertEqual(r.idle, [2.0, 0.0])
        self.assertEqual(r.idle_frac, [0.4, 0.0])
        self.assertEqual(r.updates, 3)
        self.assertEqual(r.updates_per_s, 0.5)
        self.assertEqual(r.staleness_max, 0)

    def test_ssp_bound_one(self):
        # s = 1, worker 0 takes 1 s, worker 1 3 s. Worker 0 pulls clock 2 at
        # 2 s and waits for worker 1's first push (3 s); clock 3 at 4 s waits
        # for its second (6 s); its 4th push is at 7 s. Idle 0+0+1+2 = 3 s.
        r = m.simulate(m.Config(workers=2, consistency="ssp", staleness=1,
                                steps=4, step_time=m.PerWorker([1.0, 3.0]),
                                **FREE))
        self.assertEqual(r.wall, [7.0, 12.0])
        self.assertEqual(r.idle, [3.0, 0.0])
        self.assertEqual(r.updates, 8)
        # Staleness = version before the apply - version last read. Worker
        # 1 reads v0 at 0 and pushes at 3 after w0's two pushes: 2; it reads
        # v3 at 3 and pushes at 6 after w0's third: 1; reads v5, pushes at 9
        # after w0's fourth: 1; reads v7, pushes at 12: 0. Worker 0's pushes
        # at 1, 2, 4, 7 read v0, v1, v3, v5 and see v0, v1, v3, v5: 0.
        self.assertEqual(r.staleness_max, 2)
        self.assertEqual(r.staleness_p50, 0)

    def test_asp_never_waits_on_others(self):
        r = m.simulate(m.Config(workers=3, consistency="asp", steps=5,
                                step_time=m.PerWorker([1.0, 2.0, 5.0]), **FREE))
        self.assertEqual(r.idle, [0.0, 0.0, 0.0])
        self.assertEqual(r.wall, [5.0, 10.0, 25.0])
        self.assertEqual(r.updates, 15)

    def test_link_bandwidth_and_latency(self):
        # One worker, 1000-byte model at 1000 B/s, 0.1 s latency, 1 s steps.
        # Pull(0): request at 0.1; reply on the wire 0.1..1.1, in at 1.2.
        # Compute to 2.2; the push is on the wire 2.2..3.2 and in at 3.3, the
        # pull behind it at 3.3; its reply in at 4.4 (wait 2.2). Second step
        # computes to 5.4 and pushes: idle 1.2 + 2.2 = 3.4 of 5.4.
        r = m.simulate(m.Config(workers=1, consistency="asp", steps=2,
                                step_time=m.Fixed(1.0), model_bytes=1000.0,
                                worker_bandwidth=1000.0, latency=0.1,
                                header_bytes=0.0, per_request=0.0))
        self.assertAlmostEqual(r.wall[0], 5.4, places=12)
        self.assertAlmostEqual(r.idle[0], 3.4, places=12)

    def test_shard_queue_is_fifo_and_costs_add_up(self):
        # Two workers push at the same time to one shard whose every request
        # costs 0.5 s (free network, 1 s steps, ASP). t=0: pulls served
        # 0..0.5 and 0.5..1.0. Worker 0 computes 0.5..1.5, worker 1 1.0..2.0.
        # At 1.5: w0's push (1.5..2.0), its pull (2.0..2.5); at 2.0 w1's push
        # (2.5..3.0) and pull (3.0..3.5): w0 waits 1.0 (1.5 -> 2.5), w1 1.5.
        # Last pushes: w0 at 3.5, w1 at 4.5.
        r = m.simulate(m.Config(workers=2, consistency="asp", steps=2,
                                step_time=m.Fixed(1.0), worker_bandwidth=1e30,
                                latency=0.0, header_bytes=0.0, per_request=0.5))
        self.assertEqual(r.wall, [3.5, 4.5])
        self.assertEqual(r.idle, [0.5 + 1.0, 1.0 + 1.5])

    def test_parked_pulls_and_shared_snapshots(self):
        # BSP, 2 workers, 1 s steps, free network; the shard costs 0.5 s per
        # request received and 1 s to copy the weights into a snapshot, once
        # per version. t=0: w0's pull 0..1.5 (0.5 + copy), w1's 1.5..2.0
        # (shares it). w0 computes to 2.5, its push 2.5..3.0, its pull(1)
        # 3.0..3.5 is parked. w1 computes to 3.0; its push 3.5..5.0 completes
        # the round and answers w0's parked pull (a new version: a copy, no
        # request cost): w0 resumes at 5.0; w1's pull(1) 5.0..5.5 shares the
        # snapshot. Last pushes at 6.0 and 6.5.
        r = m.simulate(m.Config(workers=2, consistency="bsp", steps=2,
                                step_time=m.Fixed(1.0), model_bytes=4.0,
                                worker_bandwidth=1e30, latency=0.0,
                                header_bytes=0.0, per_request=0.5,
                                pull_per_byte=0.25))
        self.assertEqual(r.wall, [6.0, 6.5])
        self.assertEqual(r.idle, [1.5 + 2.5, 2.0 + 2.5])

    def test_compression_shrinks_transfer_and_adds_encode(self):
        # 1000 B model over 1000 B/s, no latency, ratio 4, encode 1e-3 s per
        # element (250 elements: 0.25 s). Pull reply 1 s; step 1 s + 0.25 s;
        # push 0.25 s on the wire: end = 1 + 1.25 + (0.25 + 1 + 1.25) = 4.75.
        r = m.simulate(m.Config(workers=1, consistency="asp", steps=2,
                                step_time=m.Fixed(1.0), model_bytes=1000.0,
                                worker_bandwidth=1000.0, latency=0.0,
                                header_bytes=0.0, per_request=0.0,
                                codec=m.Codec("x", ratio=4.0, encode_per_elem=1e-3)))
        self.assertAlmostEqual(r.wall[0], 4.75, places=12)
        self.assertAlmostEqual(r.idle[0], 1.0 + 1.25, places=12)

    def test_shard_replicas_split_bytes_and_bandwidth(self):
        # 1 simulated shard standing for 4: it holds 250 of the 1000 bytes
        # and gets a quarter of the worker's 1000 B/s, so each transfer still
        # takes 1 s (all 4 shards' parts cross the worker's NIC at once).
        # 0.5 s steps: reply in at 1 (wait 1), push from 1.5 in at 2.5 with
        # the pull, reply in at 3.5 (wait 2), last push at 4.
        r = m.simulate(m.Config(workers=1, consistency="asp", steps=2,
                                step_time=m.Fixed(0.5), model_bytes=1000.0,
                                worker_bandwidth=1000.0, shard_bandwidth=250.0,
                                latency=0.0, header_bytes=0.0, per_request=0.0,
                                shard_replicas=4))
        self.assertAlmostEqual(r.wall[0], 4.0, places=12)
        self.assertAlmostEqual(r.idle[0], 3.0, places=12)
        # The shard's NIC is its own: with 2 workers the shard's egress
        # carries both replies (250 B each at 250 B/s) one after the other.
        r = m.simulate(m.Config(workers=2, consistency="asp", steps=1,
                                step_time=m.Fixed(0.5), model_bytes=1000.0,
                                worker_bandwidth=1000.0, shard_bandwidth=250.0,
                                latency=0.0, header_bytes=0.0, per_request=0.0,
                                shard_replicas=4))
        self.assertEqual(sorted(r.idle), [1.0, 2.0])

    def test_deterministic_given_the_seed(self):
        cfg = lambda seed: m.Config(workers=8, consistency="ssp", staleness=2,  # noqa: E731
                                    steps=50, seed=seed,
                                    step_time=m.HeavyTail(0.01, 0.2, p=0.05))
        self.assertEqual(m.simulate(cfg(3)).wall, m.simulate(cfg(3)).wall)
        self.assertNotEqual(m.simulate(cfg(3)).wall, m.simulate(cfg(4)).wall)

    def test_rejects_bad_config(self):
        with self.assertRaises(ValueError):
            m.Config(consistency="sync")
        with self.assertRaises(ValueError):
            m.Config(workers=0)


if __name__ == "__main__":
    unittest_main.main()
