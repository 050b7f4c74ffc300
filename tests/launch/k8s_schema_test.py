#!/usr/bin/env python3
"""Every object psrun's Kubernetes backend renders, validated offline against the
Kubernetes API schemas (launch/k8s/schema/validate.mjs: kubernetes-models, pinned in
its package-lock.json), and broken manifests rejected.

Installs the schema packages with `npm ci` into launch/k8s/schema/node_modules when
they are missing or stale; without node/npm, or when npm cannot install, exits 77.
"""
import copy
import fcntl
import glob
import json
import os
import shutil
import subprocess
import sys
import unittest

import launch_test_util as u

SCHEMA_DIR = os.path.join(u.REPO, "launch", "k8s", "schema")
VALIDATE = os.path.join(SCHEMA_DIR, "validate.mjs")


def installed():
    """True when node_modules holds exactly what package-lock.json pins."""
    try:
        with open(os.path.join(SCHEMA_DIR, "package-lock.json")) as f:
            want = json.load(f)["packages"]
        with open(os.path.join(SCHEMA_DIR, "node_modules", ".package-lock.json")) as f:
            have = json.load(f)["packages"]
    except (OSError, ValueError, KeyError):
        return False
    return all(have.get(k, {}).get("integrity") == v.get("integrity")
               for k, v in want.items() if k)


def install():
    """npm ci, once at a time; None on success, else why not."""
    if not shutil.which("node") or not shutil.which("npm"):
        return "node/npm not installed"
    with open(os.path.join(SCHEMA_DIR, "package.json")) as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if installed():
            return None
        try:
            r = subprocess.run(["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"],
                               cwd=SCHEMA_DIR, capture_output=True, text=True, timeout=300)
        except subprocess.TimeoutExpired:
            return "npm ci timed out"
        if r.returncode != 0 or not installed():
            return "npm ci failed: " + (r.stderr.strip()[-500:] or r.stdout.strip()[-500:])
    return None


class K8sSchemaTest(u.LaunchTestCase):
    needs_binaries = False

    @classmethod
    def setUpClass(cls):
        why = install()
        if why:
            raise unittest.SkipTest(why)

    def validate(self, *paths):
        r = subprocess.run(["node", VALIDATE] + list(paths), capture_output=True, text=True,
                           timeout=60)
        return r.returncode, r.stdout + r.stderr

    def render(self, name, fmt="json", extra=()):
        out = os.path.join(self.tmp.name, name)
        cfg = os.path.join(self.tmp.name, "exp.flags")
        with open(cfg, "w") as f:
            f.write("[server]\n--consistency=ssp\n[worker]\n--batch=64\n")
        r = subprocess.run([sys.executable, os.path.join(u.REPO, "launch", "k8s", "render.py"),
                            "--servers", "2", "--workers", "3", "--config", cfg, "--render", out,
                            "--format", fmt] + list(extra) + ["--", "--epochs=2"],
                           capture_output=True, text=True, timeout=30)
        self.assertEqual(r.returncode, 0, r.stderr)
        return out

    def yaml_as_json(self, out):
        """The YAML files parsed (PyYAML) and written back as JSON, for the validator."""
        try:
            import yaml
        except ImportError:
            self.skipTest("PyYAML not installed")
        jdir = out + "-as-json"
        os.makedirs(jdir)
        for path in sorted(glob.glob(os.path.join(out, "*.yaml"))):
            with open(path) as f:
                (doc,) = list(yaml.safe_load_all(f))
            with open(os.path.join(jdir, os.path.basename(path)[:-5] + ".json"), "w") as f:
                json.dump(doc, f)
        return jdir

    def test_every_rendered_object_is_valid(self):
        variants = {
            "plain": [],
            "namespace": ["--namespace", "ml", "--image", "registry.local/asyncps:1",
                          "--storage", "5Gi", "--port", "6000"],
            "metrics": ["--metrics", "--service_monitor", "--metrics_port_k8s", "9555"],
            "worker_cmd": ["--worker_cmd", "python3 /opt/train.py --lr 0.1", "--metrics"],
            "curve": ["--server_flags", "--curve_secret_key=/keys/s --optimizer=adam"],
            # Replica groups: etcd's Service and StatefulSet beside the shards'.
            "replicas": ["--replicas", "2", "--namespace", "ml", "--worker_cmd", "python3 t.py"],
            "replicas_etcd": ["--replicas", "3", "--etcd", "http://etcd.infra:2379",
                              "--metrics"],
            # psrun --elastic: etcd, and the elastic Job with its ServiceAccount and RBAC.
            "elastic": ["--elastic", "+1@20s,-1@40s", "--namespace", "ml"],
        }
        kinds = set()
        for name, extra in variants.items():
            for fmt in ("json", "yaml"):
                out = self.render(name + "-" + fmt, fmt, extra)
                d = out if fmt == "json" else self.yaml_as_json(out)
                rc, text = self.validate(d)
                self.assertEqual(rc, 0, "%s %s:\n%s" % (name, fmt, text))
                lines = text.splitlines()
                self.assertEqual(len(lines), len(os.listdir(d)), text)
                self.assertTrue(all(line.startswith("ok ") for line in lines), text)
                kinds.update(line.split()[1] for line in lines)
                if name in ("replicas", "elastic"):
                    self.assertIn("ok StatefulSet asyncps-etcd", lines)
                    self.assertIn("ok Service asyncps-etcd", lines)
                if name == "elastic":
                    self.assertIn("ok Job asyncps-elastic", lines)
        self.assertEqual(kinds, {"ConfigMap", "Service", "StatefulSet", "Job",
                                 "ServiceMonitor", "PodMonitor", "ServiceAccount", "Role",
                                 "RoleBinding"})

    def test_broken_manifests_are_rejected(self):
        out = self.render("base", extra=["--metrics", "--service_monitor"])
        docs = {}
        for path in glob.glob(os.path.join(out, "*.json")):
            with open(path) as f:
                d = json.load(f)
            docs[d["kind"]] = d

        def ctr(d):
            return d["spec"]["template"]["spec"]["containers"][0]

        cases = [
            # (kind, how it is broken, the path the validator must name)
            ("StatefulSet", lambda d: ctr(d)["ports"][0].update(containerPort="5555"),
             "/spec/template/spec/containers/0/ports/0/containerPort must be integer"),
            ("StatefulSet", lambda d: d["spec"].pop("selector"),
             "/spec must have required property selector"),
            ("StatefulSet", lambda d: d["spec"]["volumeClaimTemplates"][0]["spec"].update(
                storage="1Gi"), "/spec/volumeClaimTemplates/0/spec/storage is not a field"),
            ("StatefulSet", lambda d: ctr(d)["readinessProbe"].update(periodSecond=5),
             "/readinessProbe/periodSecond is not a field"),
            ("StatefulSet", lambda d: d["spec"].update(podManagementPolicy="Together"),
             "/spec/podManagementPolicy must be equal to one of the allowed values"),
            ("Job", lambda d: d["spec"].update(completionMode="Ranked"),
             "/spec/completionMode must be equal to one of the allowed values"),
            ("Job", lambda d: ctr(d).pop("name"),
             "/spec/template/spec/containers/0 must have required property name"),
            ("Job", lambda d: ctr(d).update(env=[{"name": "A", "valu": "x"}]),
             "/containers/0/env/0/valu is not a field"),
            ("Job", lambda d: d["spec"].update(completions="3"),
             "/spec/completions must be integer"),
            ("Service", lambda d: d.update(specs={}), "data/specs is not a field"),
            ("Service", lambda d: d["spec"]["ports"][0].pop("port"),
             "/spec/ports/0 must have required property port"),
            ("ConfigMap", lambda d: d["data"].update(extra=1), "/data/extra must be string"),
            ("ConfigMap", lambda d: d["metadata"].update(label={}),
             "/metadata/label is not a field"),
            ("ServiceMonitor", lambda d: d["spec"]["endpoints"][0].update(portt="metrics"),
             "/spec/endpoints/0/portt is not a field"),
            ("PodMonitor", lambda d: d["spec"].pop("selector"),
             "/spec must have required property selector"),
        ]
        bdir = os.path.join(self.tmp.name, "broken")
        os.makedirs(bdir)
        for i, (kind, breaks, want) in enumerate(cases):
            with self.subTest(case=want):
                d = copy.deepcopy(docs[kind])
                breaks(d)
                path = os.path.join(bdir, "%02d.json" % i)
                with open(path, "w") as f:
                    json.dump(d, f)
                rc, text = self.validate(path)
                self.assertEqual(rc, 1, text)
                self.assertIn(want, text)
        # etcd's StatefulSet (--replicas) is checked as closely.
        rdir = self.render("replicas-broken", extra=["--replicas", "2"])
        (etcd,) = [p for p in glob.glob(os.path.join(rdir, "*.json")) if "statefulset-asyncps-etcd"
                   in p]
        with open(etcd) as f:
            d = json.load(f)
        d["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"].pop("port")
        d["spec"]["persistentVolumeClaimRetentionPolicy"]["whenDelete"] = "Delete"
        path = os.path.join(bdir, "etcd.json")
        with open(path, "w") as f:
            json.dump(d, f)
        rc, text = self.validate(path)
        self.assertEqual(rc, 1, text)
        self.assertIn("/readinessProbe/httpGet must have required property port", text)
        self.assertIn("/persistentVolumeClaimRetentionPolicy/whenDelete is not a field", text)
        # A kind with no schema is not waved through.
        path = os.path.join(bdir, "unknown-kind.json")
        with open(path, "w") as f:
            json.dump({"apiVersion": "v1", "kind": "Podd", "metadata": {"name": "x"}}, f)
        rc, text = self.validate(path)
        self.assertEqual(rc, 2, text)
        self.assertIn("no schema", text)
        # The unbroken ones pass (the cases above failed for their change alone).
        rc, text = self.validate(out)
        self.assertEqual(rc, 0, text)


if __name__ == "__main__":
    # Exit 77 (ctest: Skipped) before unittest when nothing can run here.
    why = install()
    if why:
        print("SKIP: k8s_schema_test: " + why)
        sys.exit(u.SKIP)
    u.main()
