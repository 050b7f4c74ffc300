"""Monitoring of a fleet: Prometheus scrape targets and a local Prometheus server.

psrun --metrics gives every process a metrics endpoint: each ps_server / ps_worker gets
`--metrics_port=-1 --metrics_port_file=RUN_DIR/metrics/<name>.port` (the process binds a
free port and writes it there once serving; no port is guessed, so none can collide).
Python workers started with --worker_cmd get the same through ASYNCPS_METRICS_PORT and
ASYNCPS_METRICS_PORT_FILE. psrun keeps RUN_DIR/metrics/targets.json, a Prometheus file_sd
target list, up to date as the port files appear (and after a shard restarts on a new port):

  [{"targets": ["127.0.0.1:40123"], "labels": {"job": "asyncps_server", "shard": "0",
    "instance_name": "server-0", "run": "<run folder name>"}}, ...]

psrun --prometheus also starts Debian's `prometheus` with RUN_DIR/prometheus/prometheus.yml
(scrapes targets.json every --scrape_interval seconds), its data in RUN_DIR/prometheus/data
and its web UI and HTTP API on 127.0.0.1:<free port>; it stops it after the fleet, so the
data stays in the run folder. `launch/psmon RUN_DIR` serves that data again for viewing.
"""
import json
import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request

PROMETHEUS_BIN = "/usr/bin/prometheus"


def free_port(host="127.0.0.1"):
    """A TCP port free at this moment (for Prometheus, which cannot report one it chose)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def write_json_atomic(path, doc):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)


def duration(seconds):
    """A Prometheus duration ("500ms"; it takes no fractions like "0.5s")."""
    return "%dms" % max(1, round(seconds * 1000))


def prometheus_config(targets_file, scrape_interval_s, run_name):
    """prometheus.yml for one run (YAML is a superset of JSON: written as JSON)."""
    interval = duration(scrape_interval_s)
    return {
        "global": {"scrape_interval": interval, "evaluation_interval": interval,
                   "external_labels": {"asyncps_run": run_name}},
        "scrape_configs": [{
            "job_name": "asyncps",
            "honor_labels": True,  # the job label comes from the targets file
            "scrape_timeout": duration(min(scrape_interval_s, 5.0)),
            "file_sd_configs": [{"files": [targets_file], "refresh_interval": "1s"}],
        }],
    }


class Prometheus:
    """A prometheus server process on 127.0.0.1, stopped by PID."""

    def __init__(self, config_path, data_dir, log_path, binary=PROMETHEUS_BIN, port=None):
        self.config_path = config_path
        self.data_dir = data_dir
        self.log_path = log_path
        self.binary = binary
        self.port = port or free_port()
        self.popen = None

    @property
    def url(self):
        return "http://127.0.0.1:%d" % self.port

    def start(self, timeout_s=30.0):
        """Starts the server and waits until /-/ready answers; raises RuntimeError with the
        log's tail when it exits or is not ready in time."""
        os.makedirs(self.data_dir, exist_ok=True)
        argv = [self.binary, "--config.file=" + self.config_path,
                "--storage.tsdb.path=" + self.data_dir,
                "--web.listen-address=127.0.0.1:%d" % self.port,
                "--web.enable-lifecycle", "--storage.tsdb.retention.time=30d"]
        with open(self.log_path, "ab") as log:
            log.write(("# psrun: command: %s\n" % " ".join(argv)).encode())
            log.flush()
            self.popen = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log,
                                          stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            if self.popen.poll() is not None:
                raise RuntimeError("prometheus exited (code %s); see %s" %
                                   (self.popen.returncode, self.log_path))
            try:
                with urllib.request.urlopen(self.url + "/-/ready", timeout=1) as r:
                    if r.status == 200:
                        return self
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError("prometheus not ready within %gs; see %s" % (timeout_s, self.log_path))

    def query(self, expr, at=None, timeout_s=5.0):
        """Instant query through the HTTP API: the `data` of the reply, or raises."""
        params = {"query": expr}
        if at is not None:
            params["time"] = "%.3f" % at
        url = self.url + "/api/v1/query?" + urllib.parse.urlencode(params)
        with urllib.request.urlopen(url, timeout=timeout_s) as r:
            doc = json.loads(r.read().decode())
        if doc.get("status") != "success":
            raise RuntimeError("query %r: %s" % (expr, doc))
        return doc["data"]

    def targets_up(self):
        """Instance names of the targets scraped successfully at least once."""
        with urllib.request.urlopen(self.url + "/api/v1/targets", timeout=5) as r:
            doc = json.loads(r.read().decode())
        return {t["labels"].get("instance_name", t["scrapeUrl"])
                for t in doc.get("data", {}).get("activeTargets", []) if t.get("health") == "up"}

    def wait_targets(self, names, timeout_s=30.0):
        """Waits until every target in `names` was scraped (Prometheus acts on a targets
        file up to 5 s after it changes); returns the ones still missing."""
        deadline = time.time() + timeout_s
        missing = set(names)
        while missing and time.time() < deadline:
            try:
                missing = set(names) - self.targets_up()
            except (urllib.error.URLError, OSError, ValueError):
                pass
            if missing:
                time.sleep(0.2)
        return missing

    def stop(self, grace_s=10.0):
        if not self.popen or self.popen.poll() is not None:
            return
        os.killpg(self.popen.pid, 15)  # its own session: pgid == pid
        try:
            self.popen.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.popen.pid, 9)
            self.popen.wait()


class Monitor:
    """Metrics ports and targets of one fleet; optionally its Prometheus."""

    def __init__(self, run_dir, prometheus=False, scrape_interval_s=1.0, log=print):
        self.run_dir = run_dir
        self.dir = os.path.join(run_dir, "metrics")
        self.targets_file = os.path.join(self.dir, "targets.json")
        self.want_prometheus = prometheus
        self.scrape_interval_s = scrape_interval_s
        self.log = log
        self.prometheus = None
        self._last_targets = None
        os.makedirs(self.dir, exist_ok=True)
        write_json_atomic(self.targets_file, [])

    def port_file(self, name):
        return os.path.join(self.dir, "%s.port" % name)

    def linger_s(self):
        """How long a finished worker keeps serving metrics: Prometheus takes up to 5 s to
        act on a changed targets file (its discovery manager's update period), then one
        scrape interval, so a worker shorter than that is still scraped at least once."""
        return 6.0 + 2 * self.scrape_interval_s

    def flags(self, name, role):
        """Flags of a ps_server / ps_worker process named `name`."""
        try:
            os.unlink(self.port_file(name))  # a restart writes its new port
        except FileNotFoundError:
            pass
        f = ["--metrics_port=-1", "--metrics_port_file=" + self.port_file(name)]
        if role == "worker" and self.want_prometheus:
            # Keep the final values up long enough for one more scrape.
            f.append("--metrics_linger_s=%g" % self.linger_s())
        return f

    def env(self, name):
        """Environment of a --worker_cmd process (read by the Python package)."""
        try:
            os.unlink(self.port_file(name))
        except FileNotFoundError:
            pass
        env = {"ASYNCPS_METRICS_PORT": "-1",
               "ASYNCPS_METRICS_PORT_FILE": self.port_file(name)}
        if self.want_prometheus:
            env["ASYNCPS_METRICS_LINGER_S"] = "%g" % self.linger_s()
        return env

    def update_targets(self, members):
        """Rewrites targets.json from the port files present; `members` is a list of
        (name, role, index, host, read_file) with read_file(path) -> text or None."""
        groups = []
        for name, role, index, host, read_file in members:
            text = read_file(self.port_file(name))
            if not text or not text.strip().isdigit():
                continue
            labels = {"job": "asyncps_%s" % role, "instance_name": name,
                      "run": os.path.basename(os.path.normpath(self.run_dir))}
            labels["shard" if role == "server" else "rank"] = str(index)
            groups.append({"targets": ["%s:%s" % (host, text.strip())], "labels": labels})
        if groups != self._last_targets:
            write_json_atomic(self.targets_file, groups)
            self._last_targets = groups
        return groups

    def start_prometheus(self, wait_for=()):
        """Starts Prometheus and waits (up to 30 s) until the targets named in `wait_for`
        (the shards) were scraped, so the run is recorded from its first step."""
        if not self.want_prometheus:
            return None
        binary = shutil.which("prometheus") or PROMETHEUS_BIN
        if not os.path.exists(binary):
            raise RuntimeError("--prometheus needs Debian's prometheus package "
                               "(apt-get install prometheus)")
        pdir = os.path.join(self.run_dir, "prometheus")
        os.makedirs(pdir, exist_ok=True)
        config = os.path.join(pdir, "prometheus.yml")
        write_json_atomic(config, prometheus_config(
            self.targets_file, self.scrape_interval_s,
            os.path.basename(os.path.normpath(self.run_dir))))
        self.prometheus = Prometheus(config, os.path.join(pdir, "data"),
                                     os.path.join(pdir, "prometheus.log"), binary=binary)
        self.prometheus.start()
        missing = self.prometheus.wait_targets(wait_for)
        if missing:
            self.log("psrun: warning: prometheus has not scraped %s yet" %
                     ", ".join(sorted(missing)))
        self.log("psrun: prometheus at %s (targets %s)" % (self.prometheus.url,
                                                           self.targets_file))
        return self.prometheus

    def wait_final_scrape(self):
        """After the workers: one more scrape interval so the final values are stored."""
        if self.prometheus:
            time.sleep(self.scrape_interval_s + 0.5)

    def stop(self):
        if self.prometheus:
            self.prometheus.stop()

    def summary(self):
        out = {"targets_file": self.targets_file}
        if self.prometheus:
            out["prometheus_data"] = self.prometheus.data_dir
            out["prometheus_config"] = self.prometheus.config_path
            out["view"] = "launch/psmon %s" % self.run_dir
        return out
