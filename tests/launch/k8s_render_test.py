#!/usr/bin/env python3
"""Kubernetes manifests: rendered for S shards and W workers, parsed back, wiring checked."""
import glob
import json
import os
import re
import subprocess
import sys

import launch_test_util as u

from pslaunch import k8s


def load_yaml(path):
    try:
        import yaml  # PyYAML is not needed by the renderer, only to cross-check here.
    except ImportError:
        return None
    with open(path) as f:
        return list(yaml.safe_load_all(f))


class K8sRenderTest(u.LaunchTestCase):
    needs_binaries = False

    def render(self, fmt, servers=3, workers=5, extra=(), num_files=4):
        out = os.path.join(self.tmp.name, "k8s-" + fmt)
        cfg = os.path.join(self.tmp.name, "exp.flags")
        with open(cfg, "w") as f:
            f.write("[server]\n--consistency=ssp\n--staleness=2\n[worker]\n--batch=64\n"
                    "--codec=topk:ratio=0.01,ef=1\n")
        argv = [sys.executable, os.path.join(u.REPO, "launch", "k8s", "render.py"),
                "--servers", str(servers), "--workers", str(workers), "--config", cfg,
                "--render", out, "--format", fmt, "--image", "registry.local/asyncps:1",
                "--storage", "5Gi", "--server_flags", "--optimizer=adam"] + list(extra) + [
                    "--", "--epochs=3"]
        r = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        self.assertEqual(r.returncode, 0, r.stderr)
        files = sorted(glob.glob(os.path.join(out, "*." + fmt)))
        self.assertEqual(len(files), num_files, files)
        docs = []
        for path in files:
            if fmt == "json":
                with open(path) as f:
                    docs.append(json.load(f))
            else:
                parsed = load_yaml(path)
                if parsed is None:
                    self.skipTest("PyYAML not installed")
                self.assertEqual(len(parsed), 1)
                docs.append(parsed[0])
        return {d["kind"]: d for d in docs}

    def check_wiring(self, m, servers, workers, namespace=None):
        self.assertEqual(set(m), {"ConfigMap", "Service", "StatefulSet", "Job"})
        svc, sts, job, cm = m["Service"], m["StatefulSet"], m["Job"], m["ConfigMap"]
        # Headless service selecting the shard pods, port 5555 named ps.
        self.assertEqual(svc["spec"]["clusterIP"], "None")
        self.assertEqual(svc["spec"]["ports"][0]["port"], 5555)
        self.assertEqual(svc["spec"]["ports"][0]["name"], "ps")
        shard_labels = sts["spec"]["template"]["metadata"]["labels"]
        for k, v in svc["spec"]["selector"].items():
            self.assertEqual(shard_labels[k], v)
        self.assertEqual(sts["spec"]["selector"]["matchLabels"], shard_labels)
        # StatefulSet: S replicas under the service, one RocksDB volume per pod.
        self.assertEqual(sts["spec"]["serviceName"], svc["metadata"]["name"])
        self.assertEqual(sts["spec"]["replicas"], servers)
        vct = sts["spec"]["volumeClaimTemplates"]
        self.assertEqual(len(vct), 1)
        self.assertEqual(vct[0]["spec"]["resources"]["requests"]["storage"], "5Gi")
        c = sts["spec"]["template"]["spec"]["containers"][0]
        self.assertEqual(c["image"], "registry.local/asyncps:1")
        mounts = {v["name"]: v["mountPath"] for v in c["volumeMounts"]}
        self.assertEqual(mounts[vct[0]["metadata"]["name"]], "/data")
        cmd = c["command"][-1]
        self.assertIn("--db_path=/data/rocksdb", cmd)
        self.assertIn("--shard_id=${HOSTNAME##*-}", cmd)  # ordinal = shard id
        self.assertIn("--num_shards=%d" % servers, cmd)
        self.assertIn("--num_workers=%d" % workers, cmd)
        self.assertIn("--endpoint=tcp://0.0.0.0:5555", cmd)
        self.assertIn("--optimizer=adam", cmd)
        self.assertEqual(c["ports"][0]["containerPort"], 5555)
        self.assertIn("stats", c["readinessProbe"]["exec"]["command"])
        # The pod's ordinal really is the shard id: sh expands it like this.
        r = subprocess.run(["sh", "-c", 'HOSTNAME=shard-7; echo "--shard_id=${HOSTNAME##*-}"'],
                           capture_output=True, text=True)
        self.assertEqual(r.stdout.strip(), "--shard_id=7")
        # Indexed Job: W completions, rank from JOB_COMPLETION_INDEX, stable shard DNS names.
        js = job["spec"]
        self.assertEqual(js["completionMode"], "Indexed")
        self.assertEqual(js["completions"], workers)
        self.assertEqual(js["parallelism"], workers)
        wc = js["template"]["spec"]["containers"][0]
        wcmd = wc["command"][-1]
        self.assertIn("--rank=$JOB_COMPLETION_INDEX", wcmd)
        self.assertIn("--num_workers=%d" % workers, wcmd)
        self.assertIn("--epochs=3", wcmd)
        servers_flag = re.search(r"--servers=(\S+)", wcmd).group(1)
        eps = servers_flag.split(",")
        suffix = ".%s.svc.cluster.local" % namespace if namespace else ""
        self.assertEqual(eps, ["tcp://%s-%d.%s%s:5555" % (sts["metadata"]["name"], i,
                                                          svc["metadata"]["name"], suffix)
                               for i in range(servers)])
        self.assertTrue(eps[0].startswith("tcp://shard-0.asyncps-shards"))
        init = js["template"]["spec"]["initContainers"][0]["command"][-1]
        self.assertIn("--servers=" + servers_flag, init)
        # Flags from the config reach both roles through the ConfigMap.
        self.assertIn("--staleness=2", cm["data"]["server.flags"])
        self.assertIn("--codec=topk:ratio=0.01,ef=1", cm["data"]["worker.flags"])
        for pod_spec, cont in ((sts["spec"]["template"]["spec"], c),
                               (js["template"]["spec"], wc)):
            vols = {v["name"]: v for v in pod_spec["volumes"]}
            self.assertEqual(vols["flags"]["configMap"]["name"], cm["metadata"]["name"])
            self.assertIn("/etc/asyncps", [v["mountPath"] for v in cont["volumeMounts"]])
        if namespace:
            for d in m.values():
                self.assertEqual(d["metadata"]["namespace"], namespace)

    def test_json(self):
        self.check_wiring(self.render("json"), 3, 5)

    def test_yaml(self):
        self.check_wiring(self.render("yaml"), 3, 5)

    def test_yaml_with_namespace(self):
        self.check_wiring(self.render("yaml", 2, 4, ["--namespace", "ml"]), 2, 4, "ml")

    def test_hand_written_yaml_matches_json(self):
        try:
            import yaml
        except ImportError:
            self.skipTest("PyYAML not installed")
        doc = {"a": [1, {"b": "x: y", "c": []}, "-z"], "k.v/w": {"t": True, "n": None},
               "s": "line1\nline2 \"q\" $X ${HOSTNAME##*-}", "e": {}}
        self.assertEqual(yaml.safe_load(k8s.to_yaml(doc)), doc)


    def test_metrics_annotations_and_monitors(self):
        m = self.render("json", extra=["--metrics", "--service_monitor",
                                       "--metrics_port_k8s", "9555"], num_files=6)
        for kind in ("StatefulSet", "Job"):
            tmpl = m[kind]["spec"]["template"]
            self.assertEqual(tmpl["metadata"]["annotations"],
                             {"prometheus.io/scrape": "true", "prometheus.io/port": "9555",
                              "prometheus.io/path": "/metrics"}, kind)
            c = tmpl["spec"]["containers"][0]
            self.assertIn({"name": "metrics", "containerPort": 9555}, c["ports"], kind)
            cmd = c["command"][-1]
            self.assertIn("--metrics_port=9555", cmd, kind)
            self.assertIn("--metrics_bind=0.0.0.0", cmd, kind)
        self.assertIn({"name": "metrics", "port": 9555, "targetPort": 9555, "protocol": "TCP"},
                      m["Service"]["spec"]["ports"])
        sm, pm = m["ServiceMonitor"], m["PodMonitor"]
        self.assertEqual(sm["spec"]["selector"]["matchLabels"],
                         m["StatefulSet"]["spec"]["selector"]["matchLabels"])
        self.assertEqual(sm["spec"]["endpoints"][0]["port"], "metrics")
        self.assertEqual(pm["spec"]["selector"]["matchLabels"],
                         m["Job"]["spec"]["template"]["metadata"]["labels"])
        self.assertEqual(pm["spec"]["podMetricsEndpoints"][0]["port"], "metrics")
        # Without --metrics nothing of it.
        plain = self.render("json")
        self.assertNotIn("annotations", plain["Job"]["spec"]["template"]["metadata"])
        self.assertNotIn("--metrics_port", plain["Job"]["spec"]["template"]["spec"][
            "containers"][0]["command"][-1])


if __name__ == "__main__":
    u.main()
