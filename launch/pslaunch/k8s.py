"""Kubernetes manifests for S shards and W workers.

Objects (names for the default --k8s_name=asyncps):
  ConfigMap   asyncps-flags      server.flags / worker.flags from the config
  Service     asyncps-shards     headless (clusterIP: None), port "ps"
  StatefulSet shard              S replicas, Parallel; pod shard-<i> is shard i
                                 (ordinal from its hostname); one PersistentVolumeClaim
                                 "rocksdb" per pod mounted at /data (the RocksDB store)
  Job         asyncps-workers    completionMode: Indexed, W completions; the rank is
                                 JOB_COMPLETION_INDEX; an init container waits until
                                 every shard answers `ps_ctl stats`
With --metrics every pod serves Prometheus metrics on --metrics_port_k8s (default 9400,
all interfaces) and carries the prometheus.io/scrape|port|path annotations; the shard
Service gets a "metrics" port; --service_monitor adds a ServiceMonitor (shards) and a
PodMonitor (workers) for the Prometheus Operator.
Shard i is reached at tcp://shard-<i>.asyncps-shards[.<ns>.svc.cluster.local]:<port>.

With --replicas R (replica groups, server/replication/) the StatefulSet has S x R
pods: pod shard-<o> is replica o % R of shard o / R (its hostname's ordinal), bound to
0.0.0.0 and advertised in etcd under its pod DNS name; an init container waits until
etcd answers (etcdctl endpoint health: ps_server gives up on etcd after a few seconds).
Workers get each shard as its replica group 'ep1|ep2'. Unless --etcd names one, etcd
runs beside them, from the same image (Debian's etcd-server and etcd-client in it):
  Service     asyncps-etcd       headless, ports client 2379 and peer 2380
  StatefulSet asyncps-etcd       1 pod, asyncps-etcd-0, data on a PersistentVolumeClaim
                                 "etcd-data" at /var/lib/etcd, readinessProbe GET /health,
                                 1 s leases (launch/pslaunch/etcd.py's heartbeat/election)
The layout lives under /asyncps/<--k8s_name>.
YAML is written by hand (no PyYAML): strings are double-quoted JSON strings,
which YAML reads verbatim; --format json writes one JSON object per file. Both
are checked against the Kubernetes API schemas by launch/k8s/schema/validate.mjs.
"""
import json
import os
import re
import shlex
import sys

from . import config as config_mod
from . import etcd as etcd_mod
from . import workercmd

BIN = "/opt/asyncps/bin"
FLAGS_DIR = "/etc/asyncps"
PYTHON_DIR = "/opt/asyncps/python"  # the built package (build/python) in the image
ETCD_CLIENT_PORT = 2379
ETCD_PEER_PORT = 2380
ETCD_DATA = "/var/lib/etcd"
ETCD_STORAGE = "1Gi"


def replicas(opts):
    return getattr(opts, "replicas", 1) or 1


def replicated(opts):
    """Replica groups (etcd): --replicas > 1 or --etcd given."""
    return replicas(opts) > 1 or bool(getattr(opts, "etcd", None))


def _suffix(opts):
    return ".%s.svc.cluster.local" % opts.namespace if opts.namespace else ""


def pod_endpoints(opts):
    """Every shard pod's endpoint, in ordinal order (S x R of them when replicated)."""
    return ["tcp://%s-%d.%s-shards%s:%d" % (opts.statefulset, o, opts.k8s_name, _suffix(opts),
                                            opts.port)
            for o in range(opts.servers * replicas(opts))]


def shard_endpoints(opts):
    """One item per shard, shard 0 first: a replica group is its pods' endpoints
    joined by '|' (pod o is replica o % R of shard o / R)."""
    pods, r = pod_endpoints(opts), replicas(opts)
    return ["|".join(pods[g * r:(g + 1) * r]) for g in range(opts.servers)]


def etcd_endpoints(opts):
    """--etcd, or the client URL of the etcd pod rendered beside the shards."""
    return getattr(opts, "etcd", None) or "http://%s-etcd-0.%s-etcd%s:%d" % (
        opts.k8s_name, opts.k8s_name, _suffix(opts), ETCD_CLIENT_PORT)


class _Raw(str):
    """A shell word _sh leaves as it is (an expansion the shell must see)."""


def _meta(opts, name, role=None):
    m = {"name": name, "labels": {"app.kubernetes.io/name": opts.k8s_name}}
    if role:
        m["labels"]["app.kubernetes.io/component"] = role
    if opts.namespace:
        m["namespace"] = opts.namespace
    return m


def _sh(argv):
    return " ".join(a if isinstance(a, _Raw) or re.fullmatch(r"[\w@%+=:,./$-]+", a) and "$(" not in a else
                    shlex.quote(a) for a in argv)


def render(opts, cfg):
    """The manifests as a list of dicts, in apply order."""
    name = opts.k8s_name
    svc = "%s-shards" % name
    labels_shard = {"app.kubernetes.io/name": name, "app.kubernetes.io/component": "shard"}
    labels_worker = {"app.kubernetes.io/name": name, "app.kubernetes.io/component": "worker"}
    eps = ",".join(shard_endpoints(opts))
    flags_vol = {"name": "flags", "configMap": {"name": "%s-flags" % name}}
    flags_mount = {"name": "flags", "mountPath": FLAGS_DIR, "readOnly": True}

    configmap = {
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": _meta(opts, "%s-flags" % name),
        "data": {"server.flags": "\n".join(cfg["server"]) + "\n",
                 "worker.flags": "\n".join(cfg["worker"]) + "\n"}}
    service = {
        "apiVersion": "v1", "kind": "Service", "metadata": _meta(opts, svc, "shard"),
        "spec": {"clusterIP": "None", "publishNotReadyAddresses": True,
                 "selector": labels_shard,
                 "ports": [{"name": "ps", "port": opts.port, "targetPort": opts.port,
                            "protocol": "TCP"}]}}
    metrics = bool(getattr(opts, "metrics", False))
    mport = getattr(opts, "metrics_port_k8s", None) or 9400
    metrics_flags = ["--metrics_port=%d" % mport, "--metrics_bind=0.0.0.0"] if metrics else []
    pod_annotations = {"prometheus.io/scrape": "true", "prometheus.io/port": str(mport),
                       "prometheus.io/path": "/metrics"} if metrics else None
    metrics_port = [{"name": "metrics", "containerPort": mport}] if metrics else []
    server_cmd = ["exec", BIN + "/ps_server", "--flagfile=%s/server.flags" % FLAGS_DIR,
                  "--shard_id=${HOSTNAME##*-}", "--num_shards=%d" % opts.servers,
                  "--num_workers=%d" % opts.workers, "--endpoint=tcp://0.0.0.0:%d" % opts.port,
                  "--db_path=/data/rocksdb"] + metrics_flags + shlex.split(opts.server_flags or "")
    shard_init = []
    if replicated(opts):
        if any("--curve_secret_key" in f for f in [opts.server_flags or ""] + cfg["server"]):
            raise ValueError("--replicas / --etcd with --curve_secret_key: ps_server's replicas "
                             "do not yet connect to each other with CurveZMQ keys")
        server_cmd[3:4] = _replica_flags(opts, svc)
        shard_init = [_wait_for_etcd(opts)]
    if "--curve_secret_key" not in (opts.server_flags or ""):
        # Pods talk over the cluster network: ps_server needs CurveZMQ keys
        # (mount them from a Secret, pass --server_flags=--curve_secret_key=...)
        # or this explicit opt-out.
        server_cmd.append("--insecure")
    probe = {"exec": {"command": [BIN + "/ps_ctl", "--servers=tcp://127.0.0.1:%d" % opts.port,
                                  "--timeout_ms=2000", "stats"]},
             "periodSeconds": 5, "timeoutSeconds": 5}
    statefulset = {
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": _meta(opts, opts.statefulset, "shard"),
        "spec": {
            "serviceName": svc, "replicas": opts.servers * replicas(opts),
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": labels_shard},
            "template": {
                "metadata": {"labels": labels_shard},
                "spec": {
                    "terminationGracePeriodSeconds": int(max(opts.grace, 1)) + 25,
                    "initContainers": shard_init,
                    "containers": [{
                        "name": "ps-server", "image": opts.image,
                        "command": ["/bin/sh", "-c", _sh(server_cmd).replace(
                            "'--shard_id=${HOSTNAME##*-}'", '"--shard_id=${HOSTNAME##*-}"')],
                        "ports": [{"name": "ps", "containerPort": opts.port}] + metrics_port,
                        "readinessProbe": probe,
                        "volumeMounts": [{"name": "rocksdb", "mountPath": "/data"}, flags_mount],
                    }],
                    "volumes": [flags_vol],
                }},
            "volumeClaimTemplates": [{
                "metadata": {"name": "rocksdb"},
                "spec": {"accessModes": ["ReadWriteOnce"],
                         "resources": {"requests": {"storage": opts.storage}}}}],
        }}
    worker_cmd = ["exec", BIN + "/ps_worker", "--flagfile=%s/worker.flags" % FLAGS_DIR,
                  "--servers=" + eps, "--rank=$JOB_COMPLETION_INDEX",
                  "--num_workers=%d" % opts.workers,
                  "--metrics_csv=/tmp/metrics-$JOB_COMPLETION_INDEX.csv"] + metrics_flags + list(
                      opts.worker_extra)
    worker_env = []
    if getattr(opts, "worker_cmd", None):
        # Any command as the worker, with the environment contract
        # (launch/pslaunch/workercmd.py); the rank comes from the Job index.
        flags, curve = workercmd.split_curve(cfg["worker"])
        env = workercmd.contract(eps, "$JOB_COMPLETION_INDEX", opts.workers, opts.servers,
                                 "/tmp", BIN, curve)
        env["PYTHONPATH"] = PYTHON_DIR
        if metrics:
            env.update({"ASYNCPS_METRICS_PORT": str(mport), "ASYNCPS_METRICS_BIND": "0.0.0.0"})
        static = {k: v for k, v in env.items() if "$" not in v}
        worker_env = [{"name": k, "value": v} for k, v in sorted(static.items())]
        worker_cmd = ["export", "ASYNCPS_RANK=$JOB_COMPLETION_INDEX",
                      "ASYNCPS_METRICS_CSV=/tmp/metrics-$JOB_COMPLETION_INDEX.csv;", "exec"] + \
            workercmd.argv(opts.worker_cmd, flags, opts.worker_extra)
    # Every shard pod (each replica of a group) answers before training starts.
    wait_cmd = ("until %s/ps_ctl --servers=%s --timeout_ms=2000 stats >/dev/null; do "
                "echo waiting for shards; sleep 2; done" % (BIN, ",".join(pod_endpoints(opts))))
    job = {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": _meta(opts, "%s-workers" % name, "worker"),
        "spec": {
            "completionMode": "Indexed", "completions": opts.workers, "parallelism": opts.workers,
            # A failed worker pod is replaced (it re-registers idempotently and
            # carries on); the shards restart in place under the StatefulSet.
            "backoffLimit": opts.workers * (opts.max_restarts + 1),
            "template": {
                "metadata": {"labels": labels_worker},
                "spec": {
                    "restartPolicy": "Never",
                    "initContainers": [{"name": "wait-for-shards", "image": opts.image,
                                        "command": ["/bin/sh", "-c", wait_cmd]}],
                    "containers": [{
                        "name": "ps-worker", "image": opts.image, "ports": metrics_port,
                        "command": ["/bin/sh", "-c", _sh(worker_cmd).replace(
                            "'ASYNCPS_METRICS_CSV=/tmp/metrics-$JOB_COMPLETION_INDEX.csv;'",
                            "ASYNCPS_METRICS_CSV=/tmp/metrics-$JOB_COMPLETION_INDEX.csv;")],
                        "volumeMounts": [flags_mount],
                    }],
                    "volumes": [flags_vol],
                }}}}
    if not shard_init:
        del statefulset["spec"]["template"]["spec"]["initContainers"]
    if worker_env:
        job["spec"]["template"]["spec"]["containers"][0]["env"] = worker_env
    if not metrics_port:
        del job["spec"]["template"]["spec"]["containers"][0]["ports"]
    out = [configmap, service, statefulset, job]
    if replicated(opts) and not getattr(opts, "etcd", None):
        out[1:1] = render_etcd(opts)
    if metrics:
        service["spec"]["ports"].append({"name": "metrics", "port": mport, "targetPort": mport,
                                         "protocol": "TCP"})
        statefulset["spec"]["template"]["metadata"]["annotations"] = dict(pod_annotations)
        job["spec"]["template"]["metadata"]["annotations"] = dict(pod_annotations)
        if getattr(opts, "service_monitor", False):
            out.append({
                "apiVersion": "monitoring.coreos.com/v1", "kind": "ServiceMonitor",
                "metadata": _meta(opts, "%s-shards" % name, "shard"),
                "spec": {"selector": {"matchLabels": labels_shard},
                         "endpoints": [{"port": "metrics", "path": "/metrics",
                                        "interval": "5s"}]}})
            out.append({
                "apiVersion": "monitoring.coreos.com/v1", "kind": "PodMonitor",
                "metadata": _meta(opts, "%s-workers" % name, "worker"),
                "spec": {"selector": {"matchLabels": labels_worker},
                         "podMetricsEndpoints": [{"port": "metrics", "path": "/metrics",
                                                  "interval": "5s"}]}})
    elif getattr(opts, "service_monitor", False):
        raise ValueError("--service_monitor needs --metrics")
    return out


def _replica_flags(opts, svc):
    """ps_server's flags for pod shard-<o>: replica o % R of shard o / R, its
    layout in etcd, reached at its pod DNS name (it binds 0.0.0.0)."""
    r = replicas(opts)
    ordinal = "${HOSTNAME##*-}"
    return [_Raw('"--shard_id=$((%s / %d))"' % (ordinal, r)),
            _Raw('"--replica=$((%s %% %d))"' % (ordinal, r)), "--replicas=%d" % r,
            "--etcd=" + etcd_endpoints(opts), "--etcd_prefix=/asyncps/" + opts.k8s_name,
            "--lease_ms=%d" % (getattr(opts, "lease_ms", None) or 1000),
            "--advertise_endpoint=tcp://$HOSTNAME.%s%s:%d" % (svc, _suffix(opts), opts.port)]


def _wait_for_etcd(opts):
    """Shard pods' init container: ps_server gives up on etcd after a few
    seconds, so the pod waits here until etcd is healthy (Debian's etcd-client)."""
    cmd = ("until /usr/bin/etcdctl --endpoints=%s --dial-timeout=2s --command-timeout=2s "
           "endpoint health; do echo waiting for etcd; sleep 1; done" % etcd_endpoints(opts))
    return {"name": "wait-for-etcd", "image": opts.image, "command": ["/bin/sh", "-c", cmd]}


def render_etcd(opts):
    """etcd for the replica layout and leases: a headless Service and a
    StatefulSet of one pod from --image (Debian's etcd-server), with the
    short election timeout 1 s leases need (launch/pslaunch/etcd.py)."""
    name = opts.k8s_name + "-etcd"
    labels = {"app.kubernetes.io/name": opts.k8s_name, "app.kubernetes.io/component": "etcd"}
    pod = name + "-0"
    host = "%s.%s%s" % (pod, name, _suffix(opts))
    client = "http://%s:%d" % (host, ETCD_CLIENT_PORT)
    peer = "http://%s:%d" % (host, ETCD_PEER_PORT)
    service = {
        "apiVersion": "v1", "kind": "Service", "metadata": _meta(opts, name, "etcd"),
        # etcd resolves its own peer URL before it serves: its DNS record
        # must exist before the pod is ready.
        "spec": {"clusterIP": "None", "publishNotReadyAddresses": True, "selector": labels,
                 "ports": [{"name": "client", "port": ETCD_CLIENT_PORT,
                            "targetPort": ETCD_CLIENT_PORT, "protocol": "TCP"},
                           {"name": "peer", "port": ETCD_PEER_PORT,
                            "targetPort": ETCD_PEER_PORT, "protocol": "TCP"}]}}
    command = ["/usr/bin/etcd", "--name=" + pod, "--data-dir=%s/data" % ETCD_DATA,
               "--listen-client-urls=http://0.0.0.0:%d" % ETCD_CLIENT_PORT,
               "--advertise-client-urls=" + client,
               "--listen-peer-urls=http://0.0.0.0:%d" % ETCD_PEER_PORT,
               "--initial-advertise-peer-urls=" + peer,
               "--initial-cluster=%s=%s" % (pod, peer), "--initial-cluster-state=new",
               "--heartbeat-interval=%d" % etcd_mod.HEARTBEAT_MS,
               "--election-timeout=%d" % etcd_mod.ELECTION_MS]
    statefulset = {
        "apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": _meta(opts, name, "etcd"),
        "spec": {
            "serviceName": name, "replicas": 1, "selector": {"matchLabels": labels},
            # Its keys describe this run only (layout, leases): deleting the
            # StatefulSet deletes them, so the next apply starts afresh.
            "persistentVolumeClaimRetentionPolicy": {"whenDeleted": "Delete",
                                                     "whenScaled": "Retain"},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "terminationGracePeriodSeconds": 30,
                    "containers": [{
                        "name": "etcd", "image": opts.image, "command": command,
                        "ports": [{"name": "client", "containerPort": ETCD_CLIENT_PORT},
                                  {"name": "peer", "containerPort": ETCD_PEER_PORT}],
                        "readinessProbe": {"httpGet": {"path": "/health",
                                                       "port": ETCD_CLIENT_PORT},
                                           "periodSeconds": 2, "timeoutSeconds": 2},
                        "volumeMounts": [{"name": "etcd-data", "mountPath": ETCD_DATA}],
                    }],
                }},
            "volumeClaimTemplates": [{
                "metadata": {"name": "etcd-data"},
                "spec": {"accessModes": ["ReadWriteOnce"],
                         "resources": {"requests": {"storage": ETCD_STORAGE}}}}],
        }}
    return [service, statefulset]


# ---- YAML (the subset the manifests use) ----------------------------------
_PLAIN_KEY = re.compile(r"^[A-Za-z_][\w./-]*$")


def _scalar(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "null"
    if isinstance(v, (int, float)):
        return json.dumps(v)
    return json.dumps(str(v))


def _key(k):
    return k if _PLAIN_KEY.match(k) else json.dumps(k)


def to_yaml(obj, indent=0):
    pad = " " * indent
    lines = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            if isinstance(v, (dict, list)) and v:
                lines.append("%s%s:" % (pad, _key(k)))
                lines.append(to_yaml(v, indent + 2))
            else:
                lines.append("%s%s: %s" % (pad, _key(k), _scalar(v) if not isinstance(
                    v, (dict, list)) else ("{}" if isinstance(v, dict) else "[]")))
    elif isinstance(obj, list):
        for v in obj:
            if isinstance(v, (dict, list)) and v:
                sub = to_yaml(v, indent + 2)
                lines.append("%s- %s" % (pad, sub[indent + 2:]))
            else:
                lines.append("%s- %s" % (pad, _scalar(v)))
    else:
        lines.append(pad + _scalar(obj))
    return "\n".join(lines)


def write(manifests, out_dir, fmt):
    """One file per object, numbered in apply order; returns the paths."""
    os.makedirs(out_dir, exist_ok=True)
    # Manifests of an earlier render (e.g. with --service_monitor) must not be
    # applied with these: remove the numbered files this function writes.
    for old in os.listdir(out_dir):
        if re.fullmatch(r"\d\d-[a-z]+-[\w.-]+\.(yaml|json)", old):
            os.unlink(os.path.join(out_dir, old))
    paths = []
    for i, m in enumerate(manifests):
        base = "%02d-%s-%s" % (i, m["kind"].lower(), m["metadata"]["name"])
        path = os.path.join(out_dir, base + (".yaml" if fmt == "yaml" else ".json"))
        with open(path, "w") as f:
            if fmt == "yaml":
                f.write("# Rendered by launch/psrun --backend k8s; apply with kubectl apply -f DIR\n")
                f.write(to_yaml(m) + "\n")
            else:
                json.dump(m, f, indent=2)
                f.write("\n")
        paths.append(path)
    return paths


def main_from_psrun(opts, cfg):
    for attr, default in (("k8s_name", "asyncps"), ("statefulset", "shard")):
        if getattr(opts, attr, None) is None:
            setattr(opts, attr, default)
    if not opts.render:
        sys.stderr.write("psrun: --backend k8s needs --render DIR (psrun writes manifests, "
                         "kubectl applies them)\n")
        return 2
    try:
        manifests = render(opts, cfg)
    except ValueError as e:
        sys.stderr.write("psrun: %s\n" % e)
        return 2
    paths = write(manifests, opts.render, opts.format)
    for p in paths:
        print(p)
    print("apply with: kubectl apply -f %s" % opts.render)
    return 0
