#!/usr/bin/env python3
"""psrun --elastic on Kubernetes, for real: the rendered manifests run as pods
by k8s_run_test.py's kubelet (PodsTestCase), which also plays the API server
(the scale subresource over HTTPS at kubernetes.default.svc, requests
authorised by the rendered ServiceAccount's token and what its RoleBinding's
Role grants) and the StatefulSet controller (a scale up creates the next
ordinal's pod and adds its names to every pod's DNS; a scale down deletes the
highest ordinals, which must exit 0 on SIGTERM). 2 -> 3 -> 2 shards under BSP
as launch.elastic; the final weights bitwise those of the same manifests
without --elastic. Then with --replicas 2: the Job scales by whole groups (2 pods
per shard) and gives ps_ctl each group as 'ep1|ep2'. Needs root, ip netns, unshare, nsenter, overlayfs, etcd,
etcdctl, openssl and curl (exit 77 without them)."""
import json
import os
import shutil
import time

import elastic_test
import k8s_run_test as kr
import launch_test_util as u

from pslaunch import summary as summary_mod


class K8sElasticTest(kr.PodsTestCase):
    @staticmethod
    def job_steps(res):
        """The elastic Job's log and its JSON line per step."""
        (ctl,) = res["singles"]
        with open(ctl["log"], errors="replace") as f:
            text = f.read()
        return text, [json.loads(l) for l in text.splitlines() if l.startswith('{"step"')]

    @staticmethod
    def patches(res):
        """(replicas, HTTP status) of each scale PATCH the API server got."""
        return [(json.loads(b)["spec"]["replicas"], code)
                for m, _, b, code in res["api"] if m == "PATCH"]

    def test_elastic_scale(self):
        """psrun --elastic "+1@3s,-1@6s" on Kubernetes: 2 -> 3 -> 2 shards
        while 2 ps_workers train under BSP. The elastic Job's pod scales the
        StatefulSet through the API server (its ServiceAccount token, the
        Role's verbs on statefulsets/scale), waits for pod shard-2 (created
        here as the StatefulSet controller would, --shard_id=2
        --num_shards=3 from its hostname), runs ps_ctl add-shard, later
        remove-shard, then scales back to 2: pod shard-2 is deleted and
        exits 0. The final weights are bitwise those of the same manifests
        rendered without --elastic (2 fixed shard pods)."""
        for tool in ("etcd", "etcdctl", "openssl", "curl"):
            if not shutil.which(tool, path="/usr/bin"):
                self.skipTest("/usr/bin/%s not installed" % tool)
        server = elastic_test.SERVER.split()
        after = ["--max_steps=%d" % elastic_test.STEPS, "--weights_out=/tmp/weights-{rank}.bin"]
        plan = "+1@3s,-1@6s"
        docs = self.render(2, 2, ["--elastic", plan], server, elastic_test.WORKER, after,
                           "manifests-elastic")
        names = [(d["kind"], d["metadata"]["name"]) for d in docs]
        self.assertEqual(names[-4:], [("ServiceAccount", "asyncps-elastic"),
                                      ("Role", "asyncps-elastic"),
                                      ("RoleBinding", "asyncps-elastic"),
                                      ("Job", "asyncps-elastic")])
        self.assertIn(("StatefulSet", "asyncps-etcd"), names)
        t0 = time.monotonic()
        res = self.run_manifests(docs, root="cluster-elastic")
        t1 = time.monotonic()
        fixed = self.run_manifests(self.render(2, 2, [], server, elastic_test.WORKER, after,
                                               "manifests-fixed"), root="cluster-fixed")
        t2 = time.monotonic()
        text, steps = self.job_steps(res)
        self.assertEqual([(s["step"], s["op"], s["shard"], s["replicas"]) for s in steps],
                         [("+1@3s", "add", 2, 3), ("-1@6s", "remove", 2, 2)], text[-3000:])
        add, remove = steps[0]["report"], steps[1]["report"]
        self.assertTrue(add["ok"] and remove["ok"], steps)
        self.assertEqual((add["epoch"], remove["epoch"]), (1, 2))
        self.assertEqual([add["active"], remove["active"]], [[0, 1, 2], [0, 1]])
        for r in (add, remove):
            self.assertGreater(r["moved_chunks"], 0, r)
        patches = self.patches(res)
        self.assertEqual(patches, [(3, 200), (2, 200)], res["api"])
        self.assertEqual([p["name"] for p in res["deleted"]], ["shard-2"])
        with open(res["deleted"][0]["log"], errors="replace") as f:
            self.assertIn("ps_server shard 2/3", f.read(200000))
        weights = []
        for r in (res, fixed):
            w = []
            for i, pod in enumerate(r["workers"]):
                with open(os.path.join(pod["dir"], pod["names"][-1], "tmp",
                                       "weights-%d.bin" % i), "rb") as f:
                    w.append(f.read())
                with open(pod["log"], errors="replace") as f:
                    s = summary_mod.parse_summary_line(f.read())
                self.assertEqual(s["steps"], elastic_test.STEPS, pod["name"])
                if r is res:  # it trained through both changes
                    with open(pod["log"], errors="replace") as f:
                        self.assertIn("elastic layout epoch 2", f.read())
            self.assertEqual(w[0], w[1], "the two workers pulled different final weights")
            weights.append(w[0])
        self.fixed_weights = weights[1]
        self.assertEqual(len(weights[0]), (784 * 64 + 64 + 64 * 10 + 10) * 4)
        self.assertTrue(weights[0] == weights[1],
                        "final weights differ from the fixed 2-shard run's")
        getattr(u, "note", print)(
            "k8s pods, --elastic '%s': StatefulSet scaled 2 -> 3 -> 2 by the elastic Job "
            "(API PATCHes to %s replicas), %d chunks moved on, %d off; 2 ps_workers x %d "
            "steps under BSP, final weights bitwise equal to 2 fixed shard pods'; %.1f s "
            "elastic, %.1f s fixed" % (
                plan, [n for n, _ in patches],
                add["moved_chunks"], remove["moved_chunks"], elastic_test.STEPS,
                t1 - t0, t2 - t1))

        # Replica groups: 2 shards x 2 pods; shard 2 is pods shard-4 and
        # shard-5, scaled up and down together.
        docs = self.render(2, 2, ["--elastic", plan, "--replicas", "2"], server,
                           elastic_test.WORKER, after, "manifests-replicas")
        t3 = time.monotonic()
        res = self.run_manifests(docs, root="cluster-replicas")
        t4 = time.monotonic()
        text, steps = self.job_steps(res)
        self.assertEqual([(s["step"], s["op"], s["shard"], s["replicas"]) for s in steps],
                         [("+1@3s", "add", 2, 6), ("-1@6s", "remove", 2, 4)], text[-3000:])
        self.assertTrue(all(s["report"]["ok"] for s in steps), steps)
        self.assertEqual([s["report"]["active"] for s in steps], [[0, 1, 2], [0, 1]])
        patches = self.patches(res)
        self.assertEqual(patches, [(6, 200), (4, 200)], res["api"])
        self.assertEqual(sorted(p["name"] for p in res["deleted"]), ["shard-4", "shard-5"])
        for p in res["deleted"]:
            with open(p["log"], errors="replace") as f:
                self.assertIn("ps_server shard 2/3", f.read(200000), p["name"])
        w = []
        for i, pod in enumerate(res["workers"]):
            with open(os.path.join(pod["dir"], pod["names"][-1], "tmp",
                                   "weights-%d.bin" % i), "rb") as f:
                w.append(f.read())
        self.assertEqual(w[0], w[1], "the two workers pulled different final weights")
        self.assertTrue(w[0] == self.fixed_weights,
                        "final weights (replica groups) differ from the fixed 2-shard run's")
        getattr(u, "note", print)(
            "k8s pods, --elastic '%s' --replicas 2: StatefulSet scaled 4 -> 6 -> 4 pods by the "
            "elastic Job (shard 2 = pods shard-4|shard-5), final weights bitwise equal to 2 "
            "fixed shard pods'; %.1f s" % (plan, t4 - t3))


if __name__ == "__main__":
    kr.main("k8s_elastic_test")
