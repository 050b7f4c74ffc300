#!/usr/bin/env python3
"""The Kubernetes manifests run for real: each pod a process tree in its own namespaces.

psrun --backend k8s renders the manifests (JSON); this test plays kubelet and
cluster DNS for them, with no cluster:
  - every pod gets its own network namespace with an address 10.200.0.<n>/24 on
    a veth to a bridge in a hub namespace, all of them made by this test (no
    interface in the machine's own namespace: nothing leaves them);
  - every container gets its own mount and UTS namespace, chrooted into an
    "image" made of this machine's /usr read-only, the local build's binaries
    at the rendered /opt/asyncps/bin (and build/python at /opt/asyncps/python),
    an overlay of /etc holding the pod's /etc/hosts and /etc/hostname, its own
    /tmp, and the manifest's volumeMounts: the ConfigMap's keys as files, a
    per-pod folder for each volumeClaimTemplate;
  - the container runs the manifest's command verbatim under `env -i` with
    only what Kubernetes puts there: PATH, HOME, HOSTNAME (the pod's
    hostname), the container's env, and JOB_COMPLETION_INDEX in an Indexed
    Job's pods;
  - cluster DNS is emulated by /etc/hosts: each shard pod's name under the
    headless Service that selects it (<pod>.<service>.<ns>.svc.cluster.local
    and the shorter forms the pod's DNS search path completes) -> its address;
  - every StatefulSet's pods (the shards', and with --replicas etcd's) and the
    Job's pods start together; each pod runs its init containers, then its
    container; a readinessProbe (exec: nsenter into the container; httpGet:
    from the pod's network namespace) runs in the background until it passes;
    when the Job has completed the StatefulSets are deleted in reverse apply
    order: SIGTERM to each pod's main process, SIGKILL after
    terminationGracePeriodSeconds.
With a Job whose pods use a ServiceAccount (psrun --elastic) it also plays
the API server: the StatefulSets' scale subresource over HTTPS at
kubernetes.default.svc (ApiServer: the token and CA mounted into the pod,
each request authorised by the RoleBinding's Role), and the StatefulSet
controller following it (_follow_scale; k8s_elastic_test.py uses it).
It checks that the workers trained (SUMMARY lines, accuracy, metrics CSVs in
the pods' /tmp), that the shards' RocksDB stores landed on their volumes and
that the shards exited 0 on SIGTERM; with --replicas 2, that `ps_ctl stats`
from inside a shard pod shows each group's backup at its primary's version.
Needs root, ip netns, unshare, nsenter and overlayfs: exits 77 (skipped)
without them (the replicated case also needs /usr/bin/etcd and etcdctl).
Every process it started is killed by PID, every namespace it made deleted,
whatever happens.
"""
import http.server
import json
import os
import re
import secrets
import shlex
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import unittest

import launch_test_util as u

from pslaunch import k8s
from pslaunch import netns
from pslaunch import summary as summary_mod

SUBNET = "10.200.0"  # only inside this test's own namespaces
IMAGE = "asyncps:under-test"
POD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def _run(argv, check=True, **kw):
    r = subprocess.run(argv, capture_output=True, text=True, timeout=30, **kw)
    if check and r.returncode != 0:
        raise RuntimeError("%s: exit %d: %s" % (" ".join(argv), r.returncode, r.stderr.strip()))
    return r


def missing_test_bed():
    """Why the pods cannot run here, or None."""
    if os.geteuid() != 0:
        return "needs root (network, mount and UTS namespaces)"
    for tool in ("ip", "unshare", "nsenter", "chroot", "mount", "env"):
        if not shutil.which(tool):
            return "%s not installed" % tool
    why = netns.unavailable("apk%d-probe" % os.getpid())
    if why:
        return why
    with open("/proc/filesystems") as f:
        if "overlay" not in f.read():
            return "no overlayfs"
    return None


class Cluster:
    """The namespaces, pods and processes of one run; close() removes them all."""

    def __init__(self, root, namespace):
        self.root = root
        self.namespace = namespace or "default"
        self.tag = "apk%d" % os.getpid()
        self.procs = []     # every Popen started, killed by close()
        self.pods = {}      # name -> dict(ip, netns, hostname, dir, ...)
        self.dns = {}       # name -> ip: what the cluster DNS would answer
        self.api = None     # an ApiServer, when a Job's pods use a ServiceAccount
        # Every namespace made (a hub with a bridge, a veth per pod), deleted by close().
        self.network = netns.Network.create(0, tag=self.tag, subnet=SUBNET)

    def add_pod(self, name, hostname, subdomain=None):
        host = self.network.add_host()
        d = os.path.join(self.root, "pods", name)
        os.makedirs(d)
        pod = dict(name=name, ip=host.address, netns=host.netns, hostname=hostname,
                   subdomain=subdomain, dir=d)
        self.pods[name] = pod
        return pod

    def register_dns(self, pod, service):
        # A headless Service's pod record, and the shorter names the search
        # path <ns>.svc.cluster.local svc.cluster.local cluster.local completes.
        base = "%s.%s" % (pod["hostname"], service)
        for suffix in ("", "." + self.namespace, "." + self.namespace + ".svc",
                       "." + self.namespace + ".svc.cluster.local"):
            self.dns[base + suffix] = pod["ip"]

    def hosts_file(self, pod):
        own = [pod["hostname"]]
        if pod["subdomain"]:
            own.insert(0, "%s.%s.%s.svc.cluster.local" % (pod["hostname"], pod["subdomain"],
                                                        self.namespace))
        # Its own DNS names too (etcd resolves its own peer URL).
        own += [name for name, ip in sorted(self.dns.items())
                if ip == pod["ip"] and name not in own]
        lines = ["127.0.0.1 localhost", "%s %s" % (pod["ip"], " ".join(own))]
        lines += ["%s %s" % (ip, name) for name, ip in sorted(self.dns.items())
                  if ip != pod["ip"]]
        return "\n".join(lines) + "\n"

    def container_script(self, pod, ctr, mounts, env, argv):
        """A shell script that, in fresh mount and UTS namespaces inside the
        pod's network namespace, builds the container's root and execs argv."""
        cdir = os.path.join(pod["dir"], ctr)
        root = os.path.join(cdir, "root")
        for sub in ("root", "etc-upper", "etc-work", "tmp"):
            os.makedirs(os.path.join(cdir, sub))
        os.chmod(os.path.join(cdir, "tmp"), 0o1777)
        with open(os.path.join(cdir, "hosts"), "w") as f:
            f.write(self.hosts_file(pod))
        with open(os.path.join(cdir, "resolv.conf"), "w") as f:
            # No nameserver here: names resolve through /etc/hosts alone.
            f.write("search %s.svc.cluster.local svc.cluster.local cluster.local\n"
                    "options ndots:5\n" % self.namespace)
        q = shlex.quote
        R = q(root)
        lines = ["set -eu", "hostname %s" % q(pod["hostname"]),
                 "mount -t tmpfs -o mode=755 pod-root %s" % R]
        for link in ("bin", "lib", "lib32", "lib64", "sbin"):
            if os.path.islink("/" + link):
                lines.append("ln -s %s %s/%s" % (q(os.readlink("/" + link)), R, link))
        binds = [("/usr", "/usr", True), ("/dev", "/dev", False), ("/proc", "/proc", False),
                 ("/sys", "/sys", False), (os.path.join(cdir, "tmp"), "/tmp", False),
                 (u.bin_dir(), k8s.BIN, True)]
        python_dir = os.path.join(os.path.dirname(u.bin_dir()), "python")
        if os.path.isdir(python_dir):
            binds.append((python_dir, k8s.PYTHON_DIR, True))
        binds += mounts
        lines += ["mkdir -p %s/etc %s/root" % (R, R),
                  "mount -t overlay pod-etc -o lowerdir=/etc,upperdir=%s,workdir=%s %s/etc" % (
                      q(os.path.join(cdir, "etc-upper")), q(os.path.join(cdir, "etc-work")), R),
                  "cp %s %s/etc/hosts" % (q(os.path.join(cdir, "hosts")), R),
                  "cp %s %s/etc/resolv.conf" % (q(os.path.join(cdir, "resolv.conf")), R),
                  "echo %s > %s/etc/hostname" % (q(pod["hostname"]), R)]
        for src, dst, ro in binds:
            t = R + q(dst)
            lines.append("mkdir -p %s && mount --rbind %s %s" % (t, q(src), t))
            if ro:
                lines.append("mount -o remount,bind,ro %s" % t)
        lines.append("exec chroot %s /usr/bin/env -i %s %s" % (
            R, " ".join(q("%s=%s" % kv) for kv in env), " ".join(q(a) for a in argv)))
        path = os.path.join(cdir, "run.sh")
        with open(path, "w") as f:
            f.write("\n".join(lines) + "\n")
        return path

    def start(self, pod, ctr, script):
        log = os.path.join(pod["dir"], ctr + ".log")
        with open(log, "wb") as out:
            # ip netns exec, unshare, sh, chroot, env and the container's
            # /bin/sh -c 'exec ...' all exec in place: p.pid is the container's
            # main process (PID 1 in a real pod), in its own process group.
            p = subprocess.Popen(["ip", "netns", "exec", pod["netns"], "unshare", "--mount",
                                  "--uts", "--propagation", "private", "/bin/sh", script],
                                 stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 start_new_session=True)
        self.procs.append(p)
        return p, log

    def exec_argv(self, p, env, argv):
        """kubectl exec: argv in the running container p's namespaces and root."""
        return ["nsenter", "-t", str(p.pid), "-n", "-m", "-u", "-r", "-w", "--",
                "/usr/bin/env", "-i"] + ["%s=%s" % kv for kv in env] + argv

    def exec_in(self, p, env, argv, timeout):
        """argv in container p (exec_argv); (exit status, stdout), -1 on timeout."""
        try:
            r = subprocess.run(self.exec_argv(p, env, argv), capture_output=True, text=True,
                               timeout=timeout, stdin=subprocess.DEVNULL)
            return r.returncode, r.stdout
        except subprocess.TimeoutExpired:
            return -1, ""

    def http_get_argv(self, pod, p, port, path, timeout):
        """An httpGet probe: kubelet's GET http://<pod ip>:port/path, from the
        pod's network namespace (the node reaches pods there); 200-399 passes."""
        code = ("import sys, urllib.request\n"
                "try:\n    s = urllib.request.urlopen(sys.argv[1], timeout=%g).status\n"
                "except Exception:\n    s = 0\n"
                "sys.exit(0 if 200 <= s < 400 else 1)" % timeout)
        return ["nsenter", "-t", str(p.pid), "-n", "--", sys.executable, "-c", code,
                "http://%s:%d%s" % (pod["ip"], port, path)]

    def spawn(self, argv):
        """A probe in the background, killed by close() if still running."""
        p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             stdin=subprocess.DEVNULL, start_new_session=True)
        self.procs.append(p)
        return p

    def update_dns(self, pods):
        """A name was added to the cluster DNS: every pod's hosts file again,
        for its containers still to start and in its running one (replaced
        whole by a rename: a lookup never sees half a file)."""
        for pod in pods:
            text = self.hosts_file(pod)
            for ctr in pod.get("names", []):
                path = os.path.join(pod["dir"], ctr, "hosts")
                if os.path.exists(path):
                    with open(path, "w") as f:
                        f.write(text)
            p = pod.get("proc")
            if p is not None and p.poll() is None:
                subprocess.run(["nsenter", "-t", str(p.pid), "-m", "-r", "--", "/bin/sh", "-c",
                                "cat > /etc/hosts.new && mv /etc/hosts.new /etc/hosts"],
                               input=text, text=True, capture_output=True, timeout=10)

    def close(self):
        if self.api is not None:
            self.api.close()
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        self.network.delete()


SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
API_HOST = "kubernetes.default.svc"
_SCALE_PATH = re.compile(r"^/apis/apps/v1/namespaces/([^/]+)/statefulsets/([^/]+)/scale$")


class ApiServer:
    """The API server's scale subresource of the StatefulSets (GET, PATCH with
    a JSON merge patch), over HTTPS at https://kubernetes.default.svc (the
    hub's address, port 443, a certificate of its own made with openssl),
    authorised as RBAC would: the bearer token of the ServiceAccount mounted
    into a Job's pods, the verbs its RoleBinding's Role grants on
    statefulsets/scale (resourceNames). replicas[name] is what the
    StatefulSet should have; the test's kubelet loop follows it."""

    def __init__(self, cluster, docs):
        self.namespace = cluster.namespace
        d = os.path.join(cluster.root, "apiserver")
        os.makedirs(d)
        key, crt = os.path.join(d, "key.pem"), os.path.join(d, "ca.crt")
        hub = cluster.network.hub_address
        _run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key,
              "-out", crt, "-days", "1", "-subj", "/CN=kubernetes", "-addext",
              "subjectAltName=DNS:%s,IP:%s" % (API_HOST, hub)])
        self.replicas = {x["metadata"]["name"]: x["spec"]["replicas"] for x in docs
                         if x["kind"] == "StatefulSet"}
        self.requests = []  # (method, path, body, status)
        self.tokens = {}    # token -> ServiceAccount name
        self.sa_dirs = {}   # ServiceAccount name -> what a pod mounts at SA_DIR
        roles = {x["metadata"]["name"]: x for x in docs if x["kind"] == "Role"}
        self.grants = set()  # (account, verb, resource, name)
        for b in (x for x in docs if x["kind"] == "RoleBinding"):
            role = roles[b["roleRef"]["name"]]
            for sub in b["subjects"]:
                if sub["kind"] != "ServiceAccount" or sub.get(
                        "namespace", self.namespace) != self.namespace:
                    continue
                for rule in role["rules"]:
                    if "apps" not in rule["apiGroups"]:
                        continue
                    for verb in rule["verbs"]:
                        for res in rule["resources"]:
                            for name in rule.get("resourceNames", ["*"]):
                                self.grants.add((sub["name"], verb, res, name))
        for sa in (x for x in docs if x["kind"] == "ServiceAccount"):
            name = sa["metadata"]["name"]
            token = secrets.token_hex(16)
            self.tokens[token] = name
            sd = os.path.join(d, "sa-" + name)
            os.makedirs(sd)
            for fname, text in (("token", token), ("namespace", self.namespace)):
                with open(os.path.join(sd, fname), "w") as f:
                    f.write(text)
            shutil.copyfile(crt, os.path.join(sd, "ca.crt"))
            self.sa_dirs[name] = sd
        api = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                self.answer(None)

            def do_PATCH(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.answer(body)

            def answer(self, body):
                code, out = api.handle(self.command, self.path, self.headers, body)
                api.requests.append((self.command, self.path, body, code))
                data = json.dumps(out).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        listener = netns.call_in(cluster.network.hub,
                                 lambda: socket.create_server((hub, 443)))
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(crt, key)
        self.server = http.server.ThreadingHTTPServer((hub, 443), Handler,
                                                      bind_and_activate=False)
        self.server.socket.close()
        self.server.socket = ctx.wrap_socket(listener, server_side=True)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        cluster.dns[API_HOST] = hub

    def handle(self, method, path, headers, body):
        def status(code, reason):
            return code, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                          "reason": reason, "code": code}
        auth = headers.get("Authorization", "")
        account = self.tokens.get(auth[len("Bearer "):]) if auth.startswith("Bearer ") else None
        if account is None:
            return status(401, "Unauthorized")
        m = _SCALE_PATH.match(path)
        if not m or m.group(2) not in self.replicas:
            return status(404, "NotFound")
        ns, name = m.groups()
        verb = {"GET": "get", "PATCH": "patch"}[method]
        if ns != self.namespace or not ({(account, verb, "statefulsets/scale", name),
                                         (account, verb, "statefulsets/scale", "*")}
                                        & self.grants):
            return status(403, "Forbidden")
        if method == "PATCH":
            if headers.get("Content-Type") != "application/merge-patch+json":
                return status(415, "UnsupportedMediaType")
            try:
                n = json.loads(body)["spec"]["replicas"]
            except (ValueError, KeyError, TypeError):
                return status(400, "BadRequest")
            if not isinstance(n, int) or n < 0:
                return status(422, "Invalid")
            self.replicas[name] = n
        return 200, {"kind": "Scale", "apiVersion": "autoscaling/v1",
                     "metadata": {"name": name, "namespace": ns},
                     "spec": {"replicas": self.replicas[name]}}

    def close(self):
        self.server.shutdown()
        self.server.server_close()


class PodsTestCase(u.LaunchTestCase):
    """Renders manifests and runs them as pods (Cluster, and ApiServer when a
    Job's pods use a ServiceAccount); used by K8sRunTest here and by
    k8s_elastic_test.py."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        why = missing_test_bed()
        if why:
            raise unittest.SkipTest(why)

    def render(self, servers, workers, extra=(), server=u.TINY_SERVER.split(),
               worker=u.TINY_WORKER, after=("--max_steps=40", "--seed=3"), out="manifests"):
        cfg = os.path.join(self.tmp.name, out + ".flags")
        with open(cfg, "w") as f:
            f.write("[server]\n%s\n[worker]\n%s\n" % ("\n".join(server), "\n".join(worker)))
        out = os.path.join(self.tmp.name, out)
        r = subprocess.run([sys.executable, os.path.join(u.REPO, "launch", "k8s", "render.py"),
                            "--servers", str(servers), "--workers", str(workers), "--config", cfg,
                            "--render", out, "--format", "json", "--image", IMAGE]
                           + list(extra) + ["--"] + list(after),
                           capture_output=True, text=True, timeout=30)
        self.assertEqual(r.returncode, 0, r.stderr)
        docs = []
        for name in sorted(os.listdir(out)):
            with open(os.path.join(out, name)) as f:
                docs.append(json.load(f))
        return docs

    def run_manifests(self, docs, deadline_s=120, before_delete=None, root="cluster"):
        """Runs the pods until the Job completed, then before_delete(cluster,
        shard pods) (its result in the returned dict), then deletes them."""
        by_kind = {}
        for d in docs:
            by_kind.setdefault(d["kind"], []).append(d)
        # RBAC objects (psrun --elastic) are what the ApiServer authorises by.
        self.assertEqual(sorted(set(by_kind) - {"ServiceAccount", "Role", "RoleBinding"}),
                         ["ConfigMap", "Job", "Service", "StatefulSet"])
        namespace = docs[0]["metadata"].get("namespace")
        cluster = Cluster(os.path.join(self.tmp.name, root), namespace)
        try:
            if "ServiceAccount" in by_kind:
                cluster.api = ApiServer(cluster, docs)
            return self._run(cluster, by_kind, deadline_s, before_delete)
        finally:
            cluster.close()
            left = [n for n in _run(["ip", "netns", "list"]).stdout.split()
                    if n.startswith(cluster.tag)]
            self.assertEqual(left, [], "namespaces left behind")

    def _volumes(self, cluster, pod_spec, claims, pod):
        """volume name -> host folder: ConfigMaps as files, claims per pod."""
        vols = {}
        for v in pod_spec.get("volumes", []):
            cm = self.configmaps[v["configMap"]["name"]]
            d = os.path.join(pod["dir"], "volume-" + v["name"])
            os.makedirs(d)
            for key, text in cm["data"].items():
                with open(os.path.join(d, key), "w") as f:
                    f.write(text)
            vols[v["name"]] = d
        for c in claims:
            # PersistentVolumeClaim <template>-<pod>, as the StatefulSet names it.
            d = os.path.join(cluster.root, "pv", "%s-%s" % (c["metadata"]["name"], pod["name"]))
            os.makedirs(d)
            vols[c["metadata"]["name"]] = d
        return vols

    def _container(self, cluster, pod, vols, c, extra_env, extra_mounts=()):
        self.assertEqual(c["image"], IMAGE)
        mounts = [(vols[m["name"]], m["mountPath"], bool(m.get("readOnly")))
                  for m in c.get("volumeMounts", [])] + list(extra_mounts)
        env = [("PATH", POD_PATH), ("HOME", "/root"), ("HOSTNAME", pod["hostname"])]
        env += extra_env + [(e["name"], e["value"]) for e in c.get("env", [])]
        argv = c["command"] + c.get("args", [])
        script = cluster.container_script(pod, c["name"], mounts, env, argv)
        return script, env

    def _run(self, cluster, by_kind, deadline_s, before_delete):
        self.configmaps = {d["metadata"]["name"]: d for d in by_kind["ConfigMap"]}
        services = {d["metadata"]["name"]: d for d in by_kind["Service"]}
        # The Indexed Job's pods are the workers; another Job (psrun
        # --elastic's plan) runs one pod, with its ServiceAccount's token.
        (job,) = [j for j in by_kind["Job"] if j["spec"].get("completionMode") == "Indexed"]
        others = [j for j in by_kind["Job"] if j is not job]
        # Every StatefulSet's pods, under the headless Service that selects them
        # (apply order: etcd's before the shards').
        sets = []
        for sts in by_kind["StatefulSet"]:
            svc = services[sts["spec"]["serviceName"]]
            self.assertEqual(svc["spec"]["clusterIP"], "None")  # headless: DNS names the pods
            labels = sts["spec"]["template"]["metadata"]["labels"]
            self.assertTrue(all(labels.get(k) == v for k, v in svc["spec"]["selector"].items()),
                            "Service %s does not select its pods" % svc["metadata"]["name"])
            pods = []
            for i in range(sts["spec"]["replicas"]):
                name = "%s-%d" % (sts["metadata"]["name"], i)
                pod = cluster.add_pod(name, name, subdomain=svc["metadata"]["name"])
                cluster.register_dns(pod, svc["metadata"]["name"])
                pod["set"] = sts
                pods.append(pod)
            sets.append((sts, pods))
        self.assertEqual(len(sets), len(services), "a Service without its StatefulSet")
        (shards,) = [pods for sts, pods in sets if sts["spec"]["template"]["metadata"][
            "labels"].get("app.kubernetes.io/component") == "shard"]
        # The Indexed Job's pods: hostname <job>-<index>, JOB_COMPLETION_INDEX.
        js = job["spec"]
        self.assertEqual(js["completionMode"], "Indexed")
        self.assertEqual(js["parallelism"], js["completions"])
        workers = [cluster.add_pod("%s-%d" % (job["metadata"]["name"], i),
                                   "%s-%d" % (job["metadata"]["name"], i))
                   for i in range(js["completions"])]
        wpod = js["template"]
        self.assertEqual(wpod["spec"]["restartPolicy"], "Never")
        singles = []
        for j in others:
            self.assertEqual((j["spec"]["completions"], j["spec"]["parallelism"]), (1, 1))
            self.assertEqual(j["spec"]["template"]["spec"]["restartPolicy"], "Never")
            singles.append(cluster.add_pod(j["metadata"]["name"] + "-p0",
                                           j["metadata"]["name"] + "-p0"))
        # Each pod's containers in order (init containers, then its one
        # container); every name is in the DNS by now, so the hosts files are whole.
        for sts, pods in sets:
            for pod in pods:
                vols = self._volumes(cluster, sts["spec"]["template"]["spec"],
                                     sts["spec"].get("volumeClaimTemplates", []), pod)
                self._steps(cluster, pod, sts["spec"]["template"], vols, [])
        for i, pod in enumerate(workers):
            vols = self._volumes(cluster, wpod["spec"], [], pod)
            self._steps(cluster, pod, wpod, vols, [("JOB_COMPLETION_INDEX", str(i))])
        for j, pod in zip(others, singles):
            spec = j["spec"]["template"]["spec"]
            sa = spec.get("serviceAccountName")
            mounts = [(cluster.api.sa_dirs[sa], SA_DIR, True)] if sa else []
            self._steps(cluster, pod, j["spec"]["template"], self._volumes(
                cluster, spec, [], pod), [], mounts)
        # Start everything at once, as the API server would.
        stateful = [pod for _, pods in sets for pod in pods]
        deleted = []  # pods a scale-down deleted
        jobpods = workers + singles
        for pod in stateful + jobpods:
            pod["proc"], pod["log"] = cluster.start(pod, pod["names"][0], pod["steps"][0][0])
        # kubelet: init containers then the container, readiness probes (each
        # every periodSeconds, in the background), until the Job completes
        # (every index succeeded) or something fails.
        t0 = time.time()
        ready = {}
        done = set()
        while len(done) < len(jobpods):
            self.assertLess(time.time() - t0, deadline_s, "the Job did not complete in time")
            if cluster.api is not None:
                self._follow_scale(cluster, sets, stateful, jobpods, deleted)
            for pod in stateful:
                rc = pod["proc"].poll()
                main = pod["step"] == len(pod["steps"]) - 1
                if rc is not None:
                    self.assertTrue(rc == 0 and not main, "pod %s container %s exited %s:\n%s"
                                    % (pod["name"], pod["names"][pod["step"]], rc,
                                       self.tail(pod["log"])))
                    self._next_step(cluster, pod)
                elif main and pod["name"] not in ready and self._probe(cluster, pod):
                    ready[pod["name"]] = time.time() - t0
            for pod in jobpods:
                if pod["name"] in done:
                    continue
                rc = pod["proc"].poll()
                if rc is None:
                    continue
                self.assertEqual(rc, 0, "pod %s container %s exited %d:\n%s" % (
                    pod["name"], pod["names"][pod["step"]], rc, self.tail(pod["log"])))
                if pod["step"] == len(pod["steps"]) - 1:
                    done.add(pod["name"])
                else:
                    self._next_step(cluster, pod)
            time.sleep(0.2)
        job_s = time.time() - t0
        self.assertEqual(sorted(ready), sorted(p["name"] for p in stateful + deleted),
                         "readiness probe never passed")
        seen = before_delete(cluster, shards) if before_delete else None
        # kubectl delete, in reverse apply order (the shards before etcd):
        # SIGTERM to each main process, then the grace period.
        for sts, pods in reversed(sets):
            grace = sts["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
            for pod in pods:
                os.kill(pod["proc"].pid, signal.SIGTERM)
            for pod in pods:
                try:
                    rc = pod["proc"].wait(timeout=min(grace, 60))
                except subprocess.TimeoutExpired:
                    os.killpg(pod["proc"].pid, signal.SIGKILL)
                    self.fail("pod %s ignored SIGTERM for %ds" % (pod["name"], grace))
                # etcd ends by the signal it got (after shutting down cleanly).
                ok = (0,) if pods is shards else (0, -signal.SIGTERM)
                self.assertIn(rc, ok, "pod %s exited %d on SIGTERM:\n%s" % (
                    pod["name"], rc, self.tail(pod["log"])))
        return dict(shards=shards, workers=workers, ready=ready, job_s=job_s,
                    total_s=time.time() - t0, pods=stateful, before_delete=seen,
                    singles=singles, deleted=deleted,
                    api=cluster.api.requests if cluster.api else [])

    def _follow_scale(self, cluster, sets, stateful, jobpods, deleted):
        """The StatefulSet controller: pods created up to the replicas the
        ApiServer holds (the next ordinal, its names in the DNS, its volume
        claim), or deleted from the highest ordinal down (SIGTERM; the
        container must exit 0 within terminationGracePeriodSeconds)."""
        for sts, pods in sets:
            want = cluster.api.replicas[sts["metadata"]["name"]]
            svc = sts["spec"]["serviceName"]
            while len(pods) < want:
                name = "%s-%d" % (sts["metadata"]["name"], len(pods))
                pod = cluster.add_pod(name, name, subdomain=svc)
                cluster.register_dns(pod, svc)
                pod["set"] = sts
                vols = self._volumes(cluster, sts["spec"]["template"]["spec"],
                                     sts["spec"].get("volumeClaimTemplates", []), pod)
                self._steps(cluster, pod, sts["spec"]["template"], vols, [])
                cluster.update_dns(stateful + jobpods)
                pod["proc"], pod["log"] = cluster.start(pod, pod["names"][0], pod["steps"][0][0])
                pod["created"] = time.time()
                pods.append(pod)
                stateful.append(pod)
            while len(pods) > want:
                pod = pods.pop()
                stateful.remove(pod)
                grace = sts["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
                os.kill(pod["proc"].pid, signal.SIGTERM)
                try:
                    rc = pod["proc"].wait(timeout=min(grace, 60))
                except subprocess.TimeoutExpired:
                    os.killpg(pod["proc"].pid, signal.SIGKILL)
                    self.fail("pod %s ignored SIGTERM for %ds" % (pod["name"], grace))
                self.assertEqual(rc, 0, "pod %s exited %d on SIGTERM (scale-down):\n%s" % (
                    pod["name"], rc, self.tail(pod["log"])))
                pod["deleted"] = time.time()
                deleted.append(pod)

    def _steps(self, cluster, pod, template, vols, extra_env, extra_mounts=()):
        ctrs = template["spec"].get("initContainers", []) + template["spec"]["containers"]
        self.assertEqual(len(template["spec"]["containers"]), 1)
        pod["steps"] = [self._container(cluster, pod, vols, c, extra_env, extra_mounts)
                        for c in ctrs]
        pod["names"] = [c["name"] for c in ctrs]
        pod["main"] = ctrs[-1]
        pod["step"] = 0
        pod["probe"] = None
        pod["next_probe"] = 0.0

    def _next_step(self, cluster, pod):
        pod["step"] += 1
        pod["proc"], pod["log"] = cluster.start(pod, pod["names"][pod["step"]],
                                                pod["steps"][pod["step"]][0])

    def _probe(self, cluster, pod):
        """The main container's readinessProbe (exec or httpGet), run in the
        background every periodSeconds; True once one attempt passed."""
        spec = pod["main"].get("readinessProbe")
        if spec is None:
            return True
        p = pod["probe"]
        if p is not None:
            rc = p.poll()
            if rc is None:
                if time.time() - pod["probe_t"] > spec.get("timeoutSeconds", 1) + 5:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
                    pod["probe"] = None
                return False
            pod["probe"] = None
            if rc == 0:
                return True
        if time.time() < pod["next_probe"]:
            return False
        # Kubernetes' default period is 10 s; sooner here to keep the test short.
        pod["next_probe"] = time.time() + min(spec.get("periodSeconds", 10), 1)
        timeout = spec.get("timeoutSeconds", 1)
        if "exec" in spec:
            argv = cluster.exec_argv(pod["proc"], pod["steps"][-1][1], spec["exec"]["command"])
        else:
            get = spec["httpGet"]
            port = get["port"]
            if not isinstance(port, int):
                (port,) = [q["containerPort"] for q in pod["main"]["ports"] if q["name"] == port]
            argv = cluster.http_get_argv(pod, pod["proc"], port, get.get("path", "/"), timeout)
        pod["probe"] = cluster.spawn(argv)
        pod["probe_t"] = time.time()
        return False

    def tail(self, path, n=3000):
        with open(path, errors="replace") as f:
            return f.read()[-n:]

    def check_trained(self, res, servers, workers):
        accs = []
        for i, pod in enumerate(res["workers"]):
            with open(pod["log"], errors="replace") as f:
                text = f.read()
            s = summary_mod.parse_summary_line(text)
            self.assertIsNotNone(s, "no SUMMARY line from %s:\n%s" % (pod["name"], text[-2000:]))
            self.assertEqual(s["rank"], i)
            self.assertEqual(s["steps"], 40)
            self.assertGreater(s["bytes_pulled"], 0)
            accs.append(s["final_test_acc"])
            self.assertIn("against %d shard(s)" % servers, text)
            csv = os.path.join(pod["dir"], pod["names"][-1], "tmp", "metrics-%d.csv" % i)
            with open(csv) as f:
                self.assertTrue(f.readline().startswith("wall_s,rank,step"), csv)
        self.assertEqual(len(accs), workers)
        self.assertGreater(accs[0], 0.3, accs)  # rank 0 evaluates; the others print -1
        for pod in res["shards"]:
            store = os.path.join(self.tmp.name, "cluster", "pv", "rocksdb-" + pod["name"],
                                 "rocksdb")
            self.assertTrue(os.path.exists(os.path.join(store, "CURRENT")),
                            "no RocksDB store on %s's volume" % pod["name"])
        getattr(u, "note", print)("k8s pods: %d shards, %d workers: accuracy %s, shards ready after %s s, "
               "Job complete after %.1f s, all down after %.1f s" % (
                   servers, workers, "%.3f" % accs[0],
                   " ".join("%.1f" % res["ready"][p["name"]] for p in res["shards"]),
                   res["job_s"], res["total_s"]))


class K8sRunTest(PodsTestCase):
    def test_two_shards_two_workers(self):
        docs = self.render(2, 2)
        self.check_trained(self.run_manifests(docs), 2, 2)

    def test_namespace_fully_qualified_names(self):
        # --namespace: the workers reach the shard by its
        # shard-0.asyncps-shards.ml.svc.cluster.local name.
        docs = self.render(1, 2, ["--namespace", "ml"])
        wcmd = [d for d in docs if d["kind"] == "Job"][0]["spec"]["template"]["spec"][
            "containers"][0]["command"][-1]
        self.assertIn("shard-0.asyncps-shards.ml.svc.cluster.local", wcmd)
        self.check_trained(self.run_manifests(docs), 1, 2)

    def test_replica_groups(self):
        """--replicas 2: etcd's StatefulSet and Service beside the shards', 2
        shards x 2 replicas whose init containers wait for etcd, 2 workers
        training through the primaries; every backup at its primary's version."""
        for tool in ("etcd", "etcdctl"):
            if not os.access("/usr/bin/" + tool, os.X_OK):
                self.skipTest("/usr/bin/%s not installed (Debian's etcd-server, etcd-client)"
                              % tool)
        docs = self.render(2, 2, ["--replicas", "2"])
        names = [(d["kind"], d["metadata"]["name"]) for d in docs]
        self.assertEqual(names[1:3], [("Service", "asyncps-etcd"),
                                      ("StatefulSet", "asyncps-etcd")])
        wcmd = docs[-1]["spec"]["template"]["spec"]["containers"][0]["command"][-1]
        self.assertIn("tcp://shard-0.asyncps-shards:5555|tcp://shard-1.asyncps-shards:5555,"
                      "tcp://shard-2.asyncps-shards:5555|tcp://shard-3.asyncps-shards:5555", wcmd)

        def stats(cluster, shards):
            # kubectl exec shard-0 -- ps_ctl stats, to every shard pod.
            eps = ",".join("tcp://%s.%s:5555" % (p["hostname"], p["subdomain"]) for p in shards)
            rc, out = cluster.exec_in(shards[0]["proc"], shards[0]["steps"][-1][1],
                                      [k8s.BIN + "/ps_ctl", "--servers=" + eps,
                                       "--timeout_ms=3000", "stats"], 30)
            self.assertEqual(rc, 0, out)
            return [sh["stats"] for sh in json.loads(out)["shards"]]

        res = self.run_manifests(docs, before_delete=stats)
        self.check_trained(res, 2, 2)
        self.assertEqual([p["name"] for p in res["shards"]], ["shard-%d" % o for o in range(4)])
        st = res["before_delete"]
        self.assertEqual(sorted(x["replication"]["role"] for x in st),
                         ["backup", "backup", "primary", "primary"], st)
        for g in (0, 1):
            group = [x for x in st if x["shard"] == g]
            self.assertEqual(len(group), 2, st)
            # The backup holds what its primary does: every update reached it.
            self.assertEqual(len({x["version"] for x in group}), 1, group)
            self.assertGreater(group[0]["version"], 0, group)
        # Pod shard-<o> was replica o % 2 of shard o / 2; etcd kept its data on its volume.
        for o, pod in enumerate(res["shards"]):
            with open(pod["log"], errors="replace") as f:
                head = f.read(200000)
            self.assertIn("ps_server shard %d/2" % (o // 2), head)
            self.assertIn("member g%dr%d joined" % (o // 2, o % 2), head)
        member = os.path.join(self.tmp.name, "cluster", "pv", "etcd-data-asyncps-etcd-0",
                              "data", "member")
        self.assertTrue(os.path.isdir(member), "no etcd data on its volume")
        ready = res["ready"]
        getattr(u, "note", print)(
            "k8s pods, --replicas 2: etcd ready after %.1f s, 4 shard pods (2 groups) after "
            "%s s, Job (2 workers) complete after %.1f s; roles %s, versions %s" % (
                ready["asyncps-etcd-0"],
                " ".join("%.1f" % ready["shard-%d" % o] for o in range(4)), res["job_s"],
                " ".join(x["replication"]["role"] for x in st),
                " ".join(str(x["version"]) for x in st)))


def main(name):
    """Exit 77 (ctest: Skipped) before unittest when nothing can run here."""
    why = (None if u.have_binaries() else "ps_server/ps_worker/ps_ctl not built in " + u.bin_dir()) \
        or (None if u.have_data() else "Fashion-MNIST not installed") or missing_test_bed()
    if why:
        print("SKIP: %s: %s" % (name, why))
        sys.exit(u.SKIP)
    u.main()


if __name__ == "__main__":
    main("k8s_run_test")
