"""The environment contract between a launcher and a worker process.

`psrun --worker_cmd CMD` (every backend: local, SSH, Slurm, Kubernetes) runs
CMD once per worker rank with these variables set, as torchrun sets
MASTER_ADDR/RANK/WORLD_SIZE:

    ASYNCPS_SERVERS           shard endpoints, comma-separated, shard 0 first
    ASYNCPS_RANK              this worker's rank, 0 .. ASYNCPS_NUM_WORKERS-1
    ASYNCPS_NUM_WORKERS       number of workers
    ASYNCPS_NUM_SERVERS       number of shards
    ASYNCPS_RUN_DIR           the run folder (logs, metrics, summary.json)
    ASYNCPS_METRICS_CSV       where this rank writes its metrics CSV
    ASYNCPS_CURVE_SERVER_KEY  CurveZMQ: the shards' public key (file or Z85);
    ASYNCPS_CURVE_SECRET_KEY    this worker's secret key and
    ASYNCPS_CURVE_PUBLIC_KEY    public key, when the fleet is encrypted
    ASYNCPS_BIN_DIR           the asyncps binaries (ps_server, ps_ctl, ...)
    ASYNCPS_ETCD              elastic fleets (psrun --elastic): etcd's client URLs,
    ASYNCPS_ETCD_PREFIX         comma-separated, and the fleet's key prefix; the
                                client reads the current layout there first
    ASYNCPS_ETCD_CA_FILE      etcd over TLS: its CA, this worker's client
    ASYNCPS_ETCD_CERT_FILE      certificate and key (PEM files)
    ASYNCPS_ETCD_KEY_FILE
    ASYNCPS_ETCD_USER         etcd authentication: the (read-only) user and a
    ASYNCPS_ETCD_PASSWORD_FILE  file (mode 600) holding its password
    ASYNCPS_METRICS_PORT      psrun --metrics: -1 (any free port) or a port for
    ASYNCPS_METRICS_PORT_FILE   the Prometheus endpoint of asyncps.metrics, the file
    ASYNCPS_METRICS_LINGER_S    its port is written to, and how long it stays up
                                after training

psrun also puts the built package (build/python) on PYTHONPATH. Without
ASYNCPS_RANK, the rank is taken from SLURM_PROCID (srun), then
JOB_COMPLETION_INDEX (a Kubernetes Indexed Job), then OMPI_COMM_WORLD_RANK;
the worker count likewise from SLURM_NTASKS / OMPI_COMM_WORLD_SIZE.
"""
import os
from dataclasses import dataclass, field
from typing import List, Optional

from .errors import InvalidArgument

_RANK_VARS = ("ASYNCPS_RANK", "SLURM_PROCID", "JOB_COMPLETION_INDEX", "OMPI_COMM_WORLD_RANK")
_SIZE_VARS = ("ASYNCPS_NUM_WORKERS", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE")


@dataclass
class WorkerEnv:
    servers: List[str]
    rank: int
    num_workers: int
    run_dir: Optional[str] = None
    metrics_csv: Optional[str] = None
    curve_server_key: str = ""
    curve_secret_key: str = ""
    curve_public_key: str = ""
    etcd: List[str] = field(default_factory=list)
    etcd_prefix: str = "/asyncps/default"
    etcd_ca_file: str = ""
    etcd_cert_file: str = ""
    etcd_key_file: str = ""
    etcd_user: str = ""
    etcd_password_file: str = ""

    def etcd_security(self):
        """The Client keyword arguments of etcd's TLS files and credentials."""
        return {"etcd_ca_file": self.etcd_ca_file, "etcd_cert_file": self.etcd_cert_file,
                "etcd_key_file": self.etcd_key_file, "etcd_user": self.etcd_user,
                "etcd_password_file": self.etcd_password_file}

    def to_environ(self):
        """The variables a launcher sets for this worker."""
        env = {"ASYNCPS_SERVERS": ",".join(self.servers), "ASYNCPS_RANK": str(self.rank),
               "ASYNCPS_NUM_WORKERS": str(self.num_workers),
               "ASYNCPS_NUM_SERVERS": str(len(self.servers))}
        for key, value in (("ASYNCPS_RUN_DIR", self.run_dir),
                           ("ASYNCPS_METRICS_CSV", self.metrics_csv),
                           ("ASYNCPS_CURVE_SERVER_KEY", self.curve_server_key),
                           ("ASYNCPS_CURVE_SECRET_KEY", self.curve_secret_key),
                           ("ASYNCPS_CURVE_PUBLIC_KEY", self.curve_public_key),
                           ("ASYNCPS_ETCD", ",".join(self.etcd)),
                           ("ASYNCPS_ETCD_PREFIX", self.etcd_prefix if self.etcd else ""),
                           ("ASYNCPS_ETCD_CA_FILE", self.etcd_ca_file),
                           ("ASYNCPS_ETCD_CERT_FILE", self.etcd_cert_file),
                           ("ASYNCPS_ETCD_KEY_FILE", self.etcd_key_file),
                           ("ASYNCPS_ETCD_USER", self.etcd_user),
                           ("ASYNCPS_ETCD_PASSWORD_FILE", self.etcd_password_file)):
            if value:
                env[key] = value
        return env


def _int_var(names, environ):
    for n in names:
        v = environ.get(n)
        if v not in (None, ""):
            try:
                return int(v)
            except ValueError:
                raise InvalidArgument("%s=%r is not an integer" % (n, v)) from None
    return None


def split_servers(servers):
    """A list of endpoints from 'a,b' or a list."""
    if servers is None:
        return []
    if isinstance(servers, str):
        return [s.strip() for s in servers.split(",") if s.strip()]
    return [str(s) for s in servers]


def worker_env(servers=None, rank=None, num_workers=None, environ=None, require_servers=True):
    """The WorkerEnv of this process: explicit arguments first, then the
    environment (see the module doc). InvalidArgument when something needed is
    missing or out of range."""
    environ = os.environ if environ is None else environ
    eps = split_servers(servers) or split_servers(environ.get("ASYNCPS_SERVERS"))
    if not eps and require_servers:
        raise InvalidArgument("no shard endpoints: pass servers=... or run under psrun "
                              "(which sets ASYNCPS_SERVERS)")
    if rank is None:
        rank = _int_var(_RANK_VARS, environ)
    if num_workers is None:
        num_workers = _int_var(_SIZE_VARS, environ)
    rank = 0 if rank is None else int(rank)
    num_workers = 1 if num_workers is None else int(num_workers)
    if num_workers < 1 or not (0 <= rank < num_workers):
        raise InvalidArgument("rank %d is not in [0, num_workers=%d)" % (rank, num_workers))
    return WorkerEnv(servers=eps, rank=rank, num_workers=num_workers,
                     run_dir=environ.get("ASYNCPS_RUN_DIR") or None,
                     metrics_csv=environ.get("ASYNCPS_METRICS_CSV") or None,
                     curve_server_key=environ.get("ASYNCPS_CURVE_SERVER_KEY", ""),
                     curve_secret_key=environ.get("ASYNCPS_CURVE_SECRET_KEY", ""),
                     curve_public_key=environ.get("ASYNCPS_CURVE_PUBLIC_KEY", ""),
                     etcd=split_servers(environ.get("ASYNCPS_ETCD")),
                     etcd_prefix=environ.get("ASYNCPS_ETCD_PREFIX") or "/asyncps/default",
                     etcd_ca_file=environ.get("ASYNCPS_ETCD_CA_FILE", ""),
                     etcd_cert_file=environ.get("ASYNCPS_ETCD_CERT_FILE", ""),
                     etcd_key_file=environ.get("ASYNCPS_ETCD_KEY_FILE", ""),
                     etcd_user=environ.get("ASYNCPS_ETCD_USER", ""),
                     etcd_password_file=environ.get("ASYNCPS_ETCD_PASSWORD_FILE", ""))
