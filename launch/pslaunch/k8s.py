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

With --elastic PLAN (psrun --elastic, elastic.py) the StatefulSet starts with S
pods; pod shard-<o> is shard o, one past S started as --num_shards=o+1 (as ps_ctl
add-shard wants it), every shard with --elastic_etcd and --allow_remote_admin
(the admin requests come from another pod). etcd as above unless --etcd, and:
  ServiceAccount, Role, RoleBinding  asyncps-elastic: get/patch on the scale
                                 subresource of the StatefulSet (resourceNames)
  Job         asyncps-elastic    one pod, after etcd and the S shards answer:
                                 the plan as a shell script (elastic_script):
                                 scale up, wait for the new pod, ps_ctl add-shard;
                                 ps_ctl remove-shard, then scale down to one past
                                 the highest shard left (elastic_schedule)
With both, shard g is pods g*R .. g*R+R-1 (as above): a step scales by whole
groups ((K+1) x R pods for a new shard K), waits for each of its pods and gives
ps_ctl the group as 'ep1|ep2'.
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
from . import elastic as elastic_mod
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


def elastic(opts):
    """psrun --elastic: the plan's steps (elastic.parse_plan), or []."""
    return getattr(opts, "elastic_plan", None) or []


def replicated(opts):
    """Replica groups (etcd): --replicas > 1, or --etcd given without --elastic."""
    return replicas(opts) > 1 or (bool(getattr(opts, "etcd", None)) and not elastic(opts))


def needs_etcd(opts):
    return replicated(opts) or bool(elastic(opts))


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
    if elastic(opts):
        # Pod shard-<o> is shard o (replica groups: o / R); one the plan adds
        # (shard K >= S) starts as --num_shards=K+1, as ps_ctl add-shard
        # wants it.
        o = "${HOSTNAME##*-}" if replicas(opts) == 1 else "(${HOSTNAME##*-} / %d)" % replicas(
            opts)
        server_cmd[4:5] = [_Raw('"--num_shards=$((%s < %d ? %d : %s + 1))"' % (
            o, opts.servers, opts.servers, o)),
            "--elastic_etcd=" + etcd_endpoints(opts), "--etcd_prefix=/asyncps/" + opts.k8s_name]
    if replicated(opts):
        if any("--curve_secret_key" in f for f in [opts.server_flags or ""] + cfg["server"]):
            # ps_server runs replica groups over CURVE now; what is missing
            # here is an etcd as a CURVE fleet gets it elsewhere (psrun
            # --etcd_tls): TLS and users need more than flags in these
            # manifests (Secrets, an auth Job, probes with certificates).
            raise ValueError("--replicas / --etcd with --curve_secret_key: on k8s the rendered "
                             "etcd has no TLS or authentication yet (psrun --etcd_tls runs it "
                             "with both on the local, ssh and slurm backends)")
        server_cmd[3:4] = _replica_flags(opts, svc)
        shard_init = [_wait_for_etcd(opts)]
    if "--curve_secret_key" not in (opts.server_flags or ""):
        # Pods talk over the cluster network: ps_server needs CurveZMQ keys
        # (mount them from a Secret, pass --server_flags=--curve_secret_key=...)
        # or this explicit opt-out.
        server_cmd.append("--insecure")
        if elastic(opts):
            # ps_ctl add-shard/remove-shard come from the elastic Job's pod.
            server_cmd.append("--allow_remote_admin")
    elif elastic(opts):
        raise ValueError("--elastic on --backend k8s with --curve_secret_key: the elastic "
                         "Job's ps_ctl does not use CurveZMQ admin keys yet")
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
    # Elastic: a worker pod the Job replaces after shards left reads the
    # fleet's layout in etcd (ps_worker --etcd, ASYNCPS_ETCD).
    worker_etcd = [("etcd", etcd_endpoints(opts)),
                   ("etcd_prefix", "/asyncps/" + opts.k8s_name)] if elastic(opts) else []
    worker_cmd = ["exec", BIN + "/ps_worker", "--flagfile=%s/worker.flags" % FLAGS_DIR,
                  "--servers=" + eps, "--rank=$JOB_COMPLETION_INDEX",
                  "--num_workers=%d" % opts.workers,
                  "--metrics_csv=/tmp/metrics-$JOB_COMPLETION_INDEX.csv"] + metrics_flags + [
                      "--%s=%s" % kv for kv in worker_etcd] + list(opts.worker_extra)
    worker_env = []
    if getattr(opts, "worker_cmd", None):
        # Any command as the worker, with the environment contract
        # (launch/pslaunch/workercmd.py); the rank comes from the Job index.
        flags, flag_env = workercmd.split_env_flags(cfg["worker"])
        env = workercmd.contract(eps, "$JOB_COMPLETION_INDEX", opts.workers, opts.servers,
                                 "/tmp", BIN, flag_env)
        env["PYTHONPATH"] = PYTHON_DIR
        env.update(("ASYNCPS_" + k.upper(), v) for k, v in worker_etcd)
        if metrics:
            env.update({"ASYNCPS_METRICS_PORT": str(mport), "ASYNCPS_METRICS_BIND": "0.0.0.0"})
        static = {k: v for k, v in env.items() if "$" not in v}
        worker_env = [{"name": k, "value": v} for k, v in sorted(static.items())]
        worker_cmd = ["export", "ASYNCPS_RANK=$JOB_COMPLETION_INDEX",
                      "ASYNCPS_METRICS_CSV=/tmp/metrics-$JOB_COMPLETION_INDEX.csv;", "exec"] + \
            workercmd.argv(opts.worker_cmd, flags, opts.worker_extra)
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
                    "initContainers": [_wait_for_shards(opts)],
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
    if elastic(opts):
        out += render_elastic(opts)
    if needs_etcd(opts) and not getattr(opts, "etcd", None):
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


def elastic_schedule(opts):
    """The plan as StatefulSet actions: a list of (step, "add"|"remove",
    shard, shards the StatefulSet holds after it; x R pods with --replicas R).
    A new shard K is pod shard-<K> (replica groups: its R pods), created by
    scaling to K+1 shards; a removed shard's pod goes when the StatefulSet
    scales down to one past the highest shard left (a StatefulSet deletes its
    highest ordinals first: a shard below that serves on, owning nothing).
    ValueError for a plan a StatefulSet cannot follow: an add after a scale-down
    (scaling up again would bring back the deleted ordinals' pods, while
    ps_ctl add-shard wants the fleet's next index)."""
    active, total, count = set(range(opts.servers)), opts.servers, opts.servers
    out = []
    for step in elastic(opts):
        for _ in range(step.count):
            if step.op == "add":
                if total != count:
                    raise ValueError(
                        "--elastic step %s on --backend k8s: the StatefulSet scaled down "
                        "to %d pods before, so scaling up would recreate pod %s-%d (a shard "
                        "that left) while the new shard is %d; add shards before removing "
                        "the newest" % (step.text, count, opts.statefulset, count, total))
                active.add(total)
                total += 1
                count = total
                out.append((step, "add", total - 1, count))
            else:
                k = step.shard if step.shard is not None else max(active)
                active.discard(k)
                count = max(active) + 1
                out.append((step, "remove", k, count))
    return out


def render_elastic(opts):
    """psrun --elastic: a Job that runs the plan inside the cluster, and the
    RBAC its pod needs to scale the shards' StatefulSet."""
    name = opts.k8s_name + "-elastic"
    sts = opts.statefulset
    rules = [{"apiGroups": ["apps"], "resources": ["statefulsets/scale"],
              "resourceNames": [sts], "verbs": ["get", "patch"]}]
    account = {"apiVersion": "v1", "kind": "ServiceAccount",
               "metadata": _meta(opts, name, "elastic")}
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": _meta(opts, name, "elastic"), "rules": rules}
    subject = {"kind": "ServiceAccount", "name": name}
    if opts.namespace:
        subject["namespace"] = opts.namespace
    binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
               "metadata": _meta(opts, name, "elastic"),
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
               "subjects": [subject]}
    job = {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": _meta(opts, name, "elastic"),
        "spec": {
            "completions": 1, "parallelism": 1,
            # Not retried: a step half done is for a person to look at (the
            # shards stay on the layout they had; ps_ctl's report is in the log).
            "backoffLimit": 0,
            "template": {
                "metadata": {"labels": {"app.kubernetes.io/name": opts.k8s_name,
                                        "app.kubernetes.io/component": "elastic"}},
                "spec": {
                    "restartPolicy": "Never", "serviceAccountName": name,
                    "initContainers": [_wait_for_etcd(opts), _wait_for_shards(opts)],
                    "containers": [{"name": "elastic", "image": opts.image,
                                    "command": ["/bin/sh", "-c", elastic_script(opts)]}],
                }}}}
    return [account, role, binding, job]


def _pod_endpoint(opts, o):
    return "tcp://%s-%d.%s-shards%s:%d" % (opts.statefulset, o, opts.k8s_name, _suffix(opts),
                                           opts.port)


def _group_pods(opts, k):
    """The endpoints of shard k's pods (one, or its replica group's R)."""
    r = replicas(opts)
    return [_pod_endpoint(opts, o) for o in range(k * r, (k + 1) * r)]


# The elastic Job's shell functions (/bin/sh, coreutils, awk, curl). @STS@,
# @BIN@, @CTL@ and @TIMEOUT@ are filled in by elastic_script().
_ELASTIC_SH = r"""set -eu
SA=/var/run/secrets/kubernetes.io/serviceaccount
T0=$(date +%s.%N)
# Seconds from now until T0 + $1 (0.000 once past).
left() {
  awk -v t0="$T0" -v at="$1" -v now="$(date +%s.%N)" \
    'BEGIN { d = t0 + at - now; printf "%.3f\n", (d > 0 ? d : 0) }'
}
at() { sleep "$(left "$1")"; }
past() { [ "$(left "$1")" = 0.000 ]; }
# $1 seconds from now, as seconds after T0.
after() { awk -v t0="$T0" -v now="$(date +%s.%N)" -v s="$1" 'BEGIN { print now - t0 + s }'; }
# The StatefulSet's replicas, through the API server's scale subresource.
scale() {
  echo "scaling statefulset/@STS@ to $1 replicas" >&2
  curl -sS -f --max-time 10 --retry 5 --retry-all-errors --cacert "$SA/ca.crt" \
    -H "Authorization: Bearer $(cat "$SA/token")" \
    -H 'Content-Type: application/merge-patch+json' -X PATCH \
    -d "{\"spec\":{\"replicas\":$1}}" \
    "https://kubernetes.default.svc/apis/apps/v1/namespaces/$(cat "$SA/namespace")/statefulsets/@STS@/scale" \
    >/dev/null
}
# ps_ctl COMMAND ENDPOINT; retried while the workers have not registered the
# model yet, for at most @TIMEOUT@ s. Prints ps_ctl's JSON report.
ctl() {
  end=$(after @TIMEOUT@)
  while :; do
    if out=$(@CTL@ "$1" "$2"); then echo "$out" | tail -n 1; return 0; fi
    case "$out" in
      *'no model yet'*) if ! past "$end"; then sleep 0.25; continue; fi ;;
    esac
    echo "ps_ctl $1 $2 failed: $out" >&2
    return 1
  done
}
# A new shard's pod (each pod of a replica group) answers ps_ctl stats within
# @TIMEOUT@ s (scheduling, image pull).
ready() {
  end=$(after @TIMEOUT@)
  until @BIN@/ps_ctl --servers="$1" --timeout_ms=2000 stats >/dev/null 2>&1; do
    if past "$end"; then echo "$1 not ready within @TIMEOUT@ s" >&2; return 1; fi
    sleep 0.5
  done
}
report() {
  printf '{"step": "%s", "op": "%s", "shard": %s, "replicas": %s, "report": %s}\n' \
    "$1" "$2" "$3" "$4" "$5"
}
"""


def elastic_script(opts):
    """The elastic Job's shell script: each step at its time (seconds after
    the initial shards answered, when the workers start too), the
    StatefulSet scaled through the API server's scale subresource (curl, the
    pod's ServiceAccount token) and ps_ctl add-shard / remove-shard run as
    psrun runs them; one JSON line per step ({"step", "op", "shard",
    "replicas", "report": ps_ctl's}). Exits non-zero on the first failure."""
    q = shlex.quote
    initial = ",".join("|".join(_group_pods(opts, k)) for k in range(opts.servers))
    ctl = "%s/ps_ctl --etcd=%s --etcd_prefix=/asyncps/%s --servers=%s --timeout_ms=5000" % (
        BIN, q(etcd_endpoints(opts)), q(opts.k8s_name), q(initial))
    text = _ELASTIC_SH
    for key, value in (("@STS@", opts.statefulset), ("@BIN@", BIN), ("@CTL@", ctl),
                       ("@TIMEOUT@", "%g" % opts.start_timeout)):
        text = text.replace(key, value)
    lines = []
    r = replicas(opts)
    for step, op, k, count in elastic_schedule(opts):
        pods = _group_pods(opts, k)
        ep = q("|".join(pods))
        lines += ["# %s: %s shard %d" % (step.text, op, k), "at %g" % step.at_s]
        if op == "add":
            lines.append("scale %d" % (count * r))
            lines += ["ready %s" % q(p) for p in pods]
            lines.append("r=$(ctl add-shard %s)" % ep)
        else:
            lines.append("r=$(ctl remove-shard %s)" % ep)
        lines.append('report %s %s %d %d "$r"' % (q(step.text), op, k, count * r))
        if op == "remove":
            # Clients still routing by the old layout are told the new one
            # for a moment; then the StatefulSet drops the pods past the
            # highest shard left (SIGTERM: ps_server writes its checkpoint).
            lines += ["sleep %g" % elastic_mod.LINGER_S, "scale %d" % (count * r)]
    lines.append("echo 'elastic plan done' >&2")
    return text + "\n".join(lines) + "\n"


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


def _wait_for_shards(opts):
    """An init container: every shard pod of the initial StatefulSet (each
    replica of a group) answers `ps_ctl stats` before training starts."""
    cmd = ("until %s/ps_ctl --servers=%s --timeout_ms=2000 stats >/dev/null; do "
           "echo waiting for shards; sleep 2; done" % (BIN, ",".join(pod_endpoints(opts))))
    return {"name": "wait-for-shards", "image": opts.image, "command": ["/bin/sh", "-c", cmd]}


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
