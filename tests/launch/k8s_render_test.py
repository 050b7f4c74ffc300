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

    def render_list(self, name, extra):
        """The JSON manifests of `render.py --servers 2 --workers 3 EXTRA`, in apply order."""
        out = os.path.join(self.tmp.name, name)
        r = subprocess.run([sys.executable, os.path.join(u.REPO, "launch", "k8s", "render.py"),
                            "--servers", "2", "--workers", "3", "--render", out, "--format",
                            "json"] + list(extra), capture_output=True, text=True, timeout=30)
        self.assertEqual(r.returncode, 0, r.stderr)
        docs = []
        for path in sorted(glob.glob(os.path.join(out, "*.json"))):
            with open(path) as f:
                docs.append(json.load(f))
        return docs

    def test_replica_groups(self):
        docs = self.render_list("replicas", ["--replicas", "2", "--lease_ms", "2000"])
        self.assertEqual([(d["kind"], d["metadata"]["name"]) for d in docs], [
            ("ConfigMap", "asyncps-flags"), ("Service", "asyncps-etcd"),
            ("StatefulSet", "asyncps-etcd"), ("Service", "asyncps-shards"),
            ("StatefulSet", "shard"), ("Job", "asyncps-workers")])
        _, esvc, ests, _, sts, job = docs
        # etcd: headless (its DNS name exists before it is ready: it resolves
        # its own peer URL), one pod, 1 s leases, data on its claim.
        self.assertEqual(esvc["spec"]["clusterIP"], "None")
        self.assertTrue(esvc["spec"]["publishNotReadyAddresses"])
        self.assertEqual([(p["name"], p["port"]) for p in esvc["spec"]["ports"]],
                         [("client", 2379), ("peer", 2380)])
        self.assertEqual(ests["spec"]["replicas"], 1)
        self.assertEqual(ests["spec"]["serviceName"], "asyncps-etcd")
        ec = ests["spec"]["template"]["spec"]["containers"][0]
        self.assertEqual(ec["image"], "asyncps:latest")
        self.assertEqual(ec["command"][0], "/usr/bin/etcd")
        for flag in ("--heartbeat-interval=50", "--election-timeout=250",
                     "--listen-client-urls=http://0.0.0.0:2379",
                     "--advertise-client-urls=http://asyncps-etcd-0.asyncps-etcd:2379",
                     "--initial-cluster=asyncps-etcd-0=http://asyncps-etcd-0.asyncps-etcd:2380",
                     "--data-dir=/var/lib/etcd/data"):
            self.assertIn(flag, ec["command"])
        self.assertEqual(ec["readinessProbe"]["httpGet"], {"path": "/health", "port": 2379})
        self.assertEqual(ec["volumeMounts"], [{"name": "etcd-data", "mountPath": "/var/lib/etcd"}])
        self.assertEqual(ests["spec"]["volumeClaimTemplates"][0]["metadata"]["name"], "etcd-data")
        # Shards: S x R pods; pod shard-<o> is replica o % R of shard o / R.
        self.assertEqual(sts["spec"]["replicas"], 4)
        spec = sts["spec"]["template"]["spec"]
        (init,) = spec["initContainers"]
        self.assertIn("until /usr/bin/etcdctl --endpoints=http://asyncps-etcd-0.asyncps-etcd:2379",
                      init["command"][-1])
        cmd = spec["containers"][0]["command"][-1]
        self.assertTrue(cmd.startswith("exec "), cmd)
        for o in range(4):
            r = subprocess.run(["sh", "-c", "HOSTNAME=shard-%d; for a in %s; do echo $a; done"
                                % (o, cmd[len("exec "):])], capture_output=True, text=True)
            argv = r.stdout.split()
            for flag in ("--shard_id=%d" % (o // 2), "--replica=%d" % (o % 2), "--replicas=2",
                         "--num_shards=2", "--etcd=http://asyncps-etcd-0.asyncps-etcd:2379",
                         "--etcd_prefix=/asyncps/asyncps", "--lease_ms=2000",
                         "--advertise_endpoint=tcp://shard-%d.asyncps-shards:5555" % o,
                         "--endpoint=tcp://0.0.0.0:5555", "--insecure"):
                self.assertIn(flag, argv, (o, argv))
        # Workers: each shard as its replica group; they wait for every pod.
        groups = ("tcp://shard-0.asyncps-shards:5555|tcp://shard-1.asyncps-shards:5555,"
                  "tcp://shard-2.asyncps-shards:5555|tcp://shard-3.asyncps-shards:5555")
        js = job["spec"]["template"]["spec"]
        self.assertIn("'--servers=%s'" % groups, js["containers"][0]["command"][-1])
        self.assertIn("--servers=" + groups.replace("|", ","), js["initContainers"][0][
            "command"][-1])
        # --worker_cmd: the same groups in ASYNCPS_SERVERS; --namespace: full names.
        docs = self.render_list("cmd", ["--replicas", "2", "--namespace", "ml",
                                        "--worker_cmd", "python3 t.py"])
        env = {e["name"]: e["value"] for e in docs[-1]["spec"]["template"]["spec"][
            "containers"][0]["env"]}
        full = groups.replace(".asyncps-shards:", ".asyncps-shards.ml.svc.cluster.local:")
        self.assertEqual(env["ASYNCPS_SERVERS"], full)
        self.assertIn("--etcd=http://asyncps-etcd-0.asyncps-etcd.ml.svc.cluster.local:2379",
                      docs[4]["spec"]["template"]["spec"]["containers"][0]["command"][-1])

    def test_replica_groups_with_given_etcd(self):
        docs = self.render_list("etcd", ["--replicas", "3", "--etcd", "http://etcd.infra:2379"])
        self.assertEqual([d["kind"] for d in docs], ["ConfigMap", "Service", "StatefulSet", "Job"])
        spec = docs[2]["spec"]["template"]["spec"]
        self.assertEqual(docs[2]["spec"]["replicas"], 6)
        self.assertIn("--etcd=http://etcd.infra:2379", spec["containers"][0]["command"][-1])
        self.assertIn("--endpoints=http://etcd.infra:2379", spec["initContainers"][0]["command"][-1])
        # A CURVE fleet's etcd runs with TLS and auth (psrun --etcd_tls); the
        # rendered etcd has neither yet: refused.
        r = subprocess.run([sys.executable, os.path.join(u.REPO, "launch", "k8s", "render.py"),
                            "--replicas", "2", "--server_flags=--curve_secret_key=/k",
                            "--render", os.path.join(self.tmp.name, "curve")],
                           capture_output=True, text=True, timeout=30)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("--curve_secret_key", r.stderr)
        self.assertIn("no TLS or authentication", r.stderr)

    def elastic_render(self, name, plan, extra=()):
        """render.py --servers 2 --workers 3 --elastic PLAN: (exit status, stderr)."""
        r = subprocess.run([sys.executable, os.path.join(u.REPO, "launch", "k8s", "render.py"),
                            "--servers", "2", "--workers", "3", "--elastic=" + plan,
                            "--render", os.path.join(self.tmp.name, name)] + list(extra),
                           capture_output=True, text=True, timeout=30)
        return r.returncode, r.stderr

    def test_elastic(self):
        """--elastic: etcd beside the shards, shard pods that join as shard
        <ordinal> past S, and the elastic Job with the RBAC to scale them."""
        docs = self.render_list("elastic", ["--elastic", "+1@3s,-1@6s", "--namespace", "ml"])
        self.assertEqual([(d["kind"], d["metadata"]["name"]) for d in docs], [
            ("ConfigMap", "asyncps-flags"), ("Service", "asyncps-etcd"),
            ("StatefulSet", "asyncps-etcd"), ("Service", "asyncps-shards"),
            ("StatefulSet", "shard"), ("Job", "asyncps-workers"),
            ("ServiceAccount", "asyncps-elastic"), ("Role", "asyncps-elastic"),
            ("RoleBinding", "asyncps-elastic"), ("Job", "asyncps-elastic")])
        etcd = "http://asyncps-etcd-0.asyncps-etcd.ml.svc.cluster.local:2379"
        shard = docs[4]["spec"]["template"]["spec"]
        self.assertEqual(docs[4]["spec"]["replicas"], 2)
        cmd = shard["containers"][0]["command"][-1]
        self.assertIn('"--num_shards=$((${HOSTNAME##*-} < 2 ? 2 : ${HOSTNAME##*-} + 1))"', cmd)
        for flag in ("--elastic_etcd=" + etcd, "--etcd_prefix=/asyncps/asyncps",
                     "--insecure", "--allow_remote_admin"):
            self.assertIn(flag, cmd)
        self.assertNotIn("--replica=", cmd)
        self.assertNotIn("initContainers", shard)
        # A worker pod the Job replaces after shards left reads the layout.
        worker = docs[5]["spec"]["template"]["spec"]["containers"][0]["command"][-1]
        for flag in ("--etcd=" + etcd, "--etcd_prefix=/asyncps/asyncps"):
            self.assertIn(flag, worker)
        for o, n in ((0, 2), (1, 2), (2, 3), (5, 6)):  # the shell's arithmetic, as the pod's
            r = subprocess.run(["/bin/sh", "-c", 'echo $((${HOSTNAME##*-} < 2 ? 2 : '
                                '${HOSTNAME##*-} + 1))'], env={"HOSTNAME": "shard-%d" % o},
                               capture_output=True, text=True, timeout=10)
            self.assertEqual(r.stdout.strip(), str(n))
        role, binding, job = docs[7], docs[8], docs[9]
        self.assertEqual(role["rules"], [{"apiGroups": ["apps"],
                                          "resources": ["statefulsets/scale"],
                                          "resourceNames": ["shard"],
                                          "verbs": ["get", "patch"]}])
        self.assertEqual(binding["subjects"], [{"kind": "ServiceAccount",
                                                "name": "asyncps-elastic", "namespace": "ml"}])
        self.assertEqual(binding["roleRef"]["name"], "asyncps-elastic")
        spec = job["spec"]["template"]["spec"]
        self.assertEqual(spec["serviceAccountName"], "asyncps-elastic")
        self.assertEqual([c["name"] for c in spec["initContainers"]],
                         ["wait-for-etcd", "wait-for-shards"])
        script = spec["containers"][0]["command"][-1]
        r = subprocess.run(["/bin/sh", "-n", "-c", script], capture_output=True, text=True,
                           timeout=10)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("statefulsets/shard/scale", script)
        self.assertIn("scale 3\nready tcp://shard-2.asyncps-shards.ml.svc.cluster.local:5555\n"
                      "r=$(ctl add-shard tcp://shard-2.asyncps-shards.ml.svc.cluster.local:5555)",
                      script)
        self.assertIn("--etcd=%s --etcd_prefix=/asyncps/asyncps" % etcd, script)
        self.assertTrue(script.rstrip().endswith("sleep 2\nscale 2\necho 'elastic plan done' >&2"),
                        script[-300:])
        # The workers' Job is as without --elastic.
        self.assertEqual(docs[5]["spec"]["completions"], 3)

    def test_elastic_schedules(self):
        from pslaunch import cli

        def schedule(plan, servers=2):
            opts, _ = cli.parse_args(["--backend", "k8s", "--servers", str(servers),
                                      "--elastic=" + plan])
            opts.statefulset = "shard"
            return [(op, k, n) for _, op, k, n in k8s.elastic_schedule(opts)]

        self.assertEqual(schedule("+1@3s,-1@6s"), [("add", 2, 3), ("remove", 2, 2)])
        # Shard 0 leaves: its pod serves on (owning nothing) until the shards
        # above it leave too; a later add is the next ordinal.
        self.assertEqual(schedule("-#0@5s,+1@8s,-#3@9s,-#2@10s", 3), [
            ("remove", 0, 3), ("add", 3, 4), ("remove", 3, 3), ("remove", 2, 2)])
        self.assertEqual(schedule("+2@1,-1@2,-1@3"), [("add", 2, 3), ("add", 3, 4),
                                                      ("remove", 3, 3), ("remove", 2, 2)])
        # An add after a scale-down would bring the deleted ordinal back.
        code, err = self.elastic_render("again", "+1@3s,-1@6s,+1@9s")
        self.assertEqual(code, 2, err)
        self.assertIn("would recreate pod shard-2", err)
        code, err = self.elastic_render("curve", "+1@3s", ["--server_flags=--curve_secret_key=/k"])
        self.assertEqual(code, 2, err)
        self.assertIn("CurveZMQ admin keys", err)
        # Replica groups: whole groups of pods, given to ps_ctl as 'ep1|ep2'.
        docs = self.render_list("elastic-replicas", ["--elastic", "+1@3s,-1@6s",
                                                     "--replicas", "2"])
        sts = next(d for d in docs if d["kind"] == "StatefulSet"
                   and d["metadata"]["name"] == "shard")
        self.assertEqual(sts["spec"]["replicas"], 4)
        cmd = sts["spec"]["template"]["spec"]["containers"][0]["command"][-1]
        self.assertIn('"--shard_id=$((${HOSTNAME##*-} / 2))"', cmd)
        self.assertIn('"--num_shards=$(((${HOSTNAME##*-} / 2) < 2 ? 2 : (${HOSTNAME##*-} / 2) '
                      '+ 1))"', cmd)
        for flag in ("--replicas=2", "--elastic_etcd=", "--etcd="):
            self.assertIn(flag, cmd)
        for n, group in ((0, 0), (1, 0), (2, 1), (3, 1), (4, 2), (5, 2)):  # pod -> shard
            r = subprocess.run(["/bin/sh", "-c", 'HOSTNAME=shard-%d; echo $((${HOSTNAME##*-} / 2)) '
                                '$(((${HOSTNAME##*-} / 2) < 2 ? 2 : (${HOSTNAME##*-} / 2) + 1))'
                                % n], capture_output=True, text=True, timeout=10)
            self.assertEqual(r.stdout.split(), [str(group), str(max(2, group + 1))], n)
        job = next(d for d in docs if d["kind"] == "Job"
                   and d["metadata"]["name"] == "asyncps-elastic")
        script = job["spec"]["template"]["spec"]["containers"][0]["command"][-1]
        ep = "tcp://shard-%d.asyncps-shards:5555"
        self.assertIn("--servers='%s|%s,%s|%s'" % (ep % 0, ep % 1, ep % 2, ep % 3), script)
        self.assertIn("scale 6\nready %s\nready %s\nr=$(ctl add-shard '%s|%s')" % (
            ep % 4, ep % 5, ep % 4, ep % 5), script)
        self.assertIn("r=$(ctl remove-shard '%s|%s')" % (ep % 4, ep % 5), script)
        self.assertTrue(script.rstrip().endswith("sleep 2\nscale 4\necho 'elastic plan done' >&2"),
                        script[-300:])
        # A given etcd: none rendered, the shards and the Job use it.
        docs = self.render_list("elastic-etcd", ["--elastic", "+1@3s", "--etcd",
                                                 "http://etcd.infra:2379"])
        self.assertEqual([d["kind"] for d in docs], ["ConfigMap", "Service", "StatefulSet", "Job",
                                                     "ServiceAccount", "Role", "RoleBinding",
                                                     "Job"])
        self.assertIn("--elastic_etcd=http://etcd.infra:2379",
                      docs[2]["spec"]["template"]["spec"]["containers"][0]["command"][-1])
        self.assertNotIn("--etcd=", docs[2]["spec"]["template"]["spec"]["containers"][0][
            "command"][-1])


if __name__ == "__main__":
    u.main()
