"""etcd as a secured deployment runs it, for a run: TLS with a CA and client
certificates (etcd --client-cert-auth) and etcd's user/password
authentication, with roles that give each kind of process what it needs and
no more.

make_certs(dir, hosts) writes, with Debian's openssl (EC P-256 keys, one-day
certificates; keys mode 600):
  ca.pem                        the run's CA (its key, ca.key, signs the rest)
  server.pem, server.key        etcd's certificate, for `hosts` (IPs / names);
                                also a client certificate (clientAuth): etcd's
                                JSON gateway dials etcd's own gRPC with it
  <user>.pem, <user>.key        a client certificate per user, without a CN
                                (O=asyncps, OU=the user): etcd's JSON gateway
                                refuses certificates with one (HTTP 400, "CommonName
                                of client sending a request against gateway will
                                be ignored"), so the user is always the one its
                                password signs in as

enable_auth(dir, endpoint, prefix) creates, with etcdctl (Debian's
etcd-client), over TLS:
  root                  etcd's administrator (auth enable needs it); its
                        password only in root.password
  asyncps-server        role asyncps-server: read and write under <prefix>
                        (the replica layout, member keys, the groups' replica
                        secrets, the elastic document); ps_server and psrun's
                        ps_ctl sign in as it
  asyncps-worker        role asyncps-worker: read <prefix>/elastic (the
                        elastic layout a worker routes by) and <prefix>/members/
                        (endpoints and public keys: a worker follows a redirect
                        only to a member of the shard's group), never the
                        replica layout or the secrets under <prefix>/secrets/
then turns authentication on. Passwords are random (32 hex digits), each in
<user>.password (mode 600).

ensure_certs(dir, hosts) is make_certs unless `dir` already holds a set for
the same hosts (a run started again on its run dir keeps its CA, and the
users' password files are never touched).

Security(dir, user) is the set of ps_* flags (etcd_flags(), the common/
etcd_flags.h ones) and of ASYNCPS_ETCD_* worker variables (worker_env())
for one user, and an ssl context (ssl_context()) for talking to etcd as it.

Command line (the C++ tests' etcd fixture uses certs and auth,
tests/util/etcd_fixture.h; launch/slurm/task.sh ensure, health and auth):
  python3 -m pslaunch.etcd_tls certs DIR [HOST...]
  python3 -m pslaunch.etcd_tls ensure DIR HOST...
  python3 -m pslaunch.etcd_tls health DIR ENDPOINT    (exit 0: healthy)
  python3 -m pslaunch.etcd_tls auth DIR ENDPOINT PREFIX
"""
import json
import os
import secrets
import ssl
import subprocess
import sys
import urllib.error
import urllib.request

OPENSSL = "/usr/bin/openssl"
ETCDCTL = "/usr/bin/etcdctl"
SERVER_USER = "asyncps-server"
WORKER_USER = "asyncps-worker"
USERS = (SERVER_USER, WORKER_USER, "root")
# The etcd security flags of ps_server / ps_worker / ps_ctl (common/etcd_flags.h),
# the ASYNCPS_ETCD_* variable of each (asyncps.env), and Security's attribute.
FLAGS = (("--etcd_ca_file", "ASYNCPS_ETCD_CA_FILE", "ca_file"),
         ("--etcd_cert_file", "ASYNCPS_ETCD_CERT_FILE", "cert_file"),
         ("--etcd_key_file", "ASYNCPS_ETCD_KEY_FILE", "key_file"),
         ("--etcd_user", "ASYNCPS_ETCD_USER", "user"),
         ("--etcd_password_file", "ASYNCPS_ETCD_PASSWORD_FILE", "password_file"))


class TlsError(RuntimeError):
    """Certificates or etcd's users could not be made."""


def tools_available():
    """True when openssl and etcdctl are installed."""
    return all(os.access(t, os.X_OK) for t in (OPENSSL, ETCDCTL))


def _run(argv, what):
    p = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    if p.returncode != 0:
        raise TlsError("%s failed (exit %d): %s" % (what, p.returncode,
                                                    (p.stderr or p.stdout).strip()[-2000:]))
    return p.stdout


def _key(path):
    _run([OPENSSL, "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256",
          "-out", path], "openssl genpkey " + path)
    os.chmod(path, 0o600)


def _sign(d, name, subject, ext):
    """<name>.key and <name>.pem signed by the CA in `d`, with extensions `ext`."""
    key, csr, pem, extfile = (os.path.join(d, name + s) for s in (".key", ".csr", ".pem", ".ext"))
    _key(key)
    _run([OPENSSL, "req", "-new", "-key", key, "-subj", subject, "-out", csr],
         "openssl req " + name)
    with open(extfile, "w") as f:
        f.write(ext)
    _run([OPENSSL, "x509", "-req", "-in", csr, "-CA", os.path.join(d, "ca.pem"),
          "-CAkey", os.path.join(d, "ca.key"), "-CAcreateserial", "-days", "1",
          "-sha256", "-extfile", extfile, "-out", pem], "openssl x509 " + name)
    os.remove(csr)
    os.remove(extfile)


def make_certs(d, hosts=("127.0.0.1",), users=USERS):
    """The run's CA, etcd's certificate for `hosts` and one client certificate
    per user, in folder `d` (made, mode 700). Returns `d`."""
    os.makedirs(d, mode=0o700, exist_ok=True)
    os.chmod(d, 0o700)
    _key(os.path.join(d, "ca.key"))
    _run([OPENSSL, "req", "-x509", "-new", "-key", os.path.join(d, "ca.key"), "-days", "1",
          "-sha256", "-subj", "/CN=asyncps run CA", "-addext",
          "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign",
          "-out", os.path.join(d, "ca.pem")], "openssl req ca")
    names = ["IP:%s" % h if h.replace(".", "").isdigit() or ":" in h else "DNS:%s" % h
             for h in list(hosts) + ["localhost"]]
    _sign(d, "server", "/CN=etcd", "subjectAltName=%s\nextendedKeyUsage=serverAuth,clientAuth\n"
          % ",".join(dict.fromkeys(names)))
    for u in users:
        _sign(d, u, "/O=asyncps/OU=" + u, "extendedKeyUsage=clientAuth\n")
    return d


def ensure_certs(d, hosts=("127.0.0.1",)):
    """make_certs(d, hosts) unless `d` holds a complete set made for the same
    hosts (recorded in d/hosts). Returns `d`."""
    stamp = os.path.join(d, "hosts")
    want = " ".join(hosts) + "\n"
    names = ["ca.pem", "server.pem", "server.key"] + [u + s for u in USERS
                                                       for s in (".pem", ".key")]
    try:
        with open(stamp) as f:
            if f.read() == want and all(os.path.exists(os.path.join(d, n)) for n in names):
                return d
    except OSError:
        pass
    make_certs(d, hosts)
    with open(stamp, "w") as f:
        f.write(want)
    return d


def _etcdctl_argv(d, endpoint, args, user=None):
    argv = [ETCDCTL, "--endpoints=" + endpoint, "--cacert=" + os.path.join(d, "ca.pem"),
            "--cert=" + os.path.join(d, "root.pem"), "--key=" + os.path.join(d, "root.key")]
    if user:
        argv.append("--user=%s:%s" % (user, _password(d, user)))
    return argv + list(args)


def _etcdctl(d, endpoint, *args, user=None):
    return _run(_etcdctl_argv(d, endpoint, args, user), "etcdctl " + " ".join(args[:2]))


def _etcdctl_all(d, endpoint, calls):
    """etcdctl calls that do not depend on each other, at once: [(args,
    stdin text or None)]. Raises TlsError naming the first that failed."""
    procs = [(args, subprocess.Popen(_etcdctl_argv(d, endpoint, args),
                                     stdin=subprocess.PIPE if text is not None
                                     else subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True),
              text) for args, text in calls]
    failed = []
    for args, p, text in procs:
        out, err = p.communicate(text)
        if p.returncode != 0:
            failed.append("etcdctl %s failed (exit %d): %s" % (
                " ".join(args[:2]), p.returncode, (err or out).strip()[-2000:]))
    if failed:
        raise TlsError(failed[0])


def _password(d, user):
    with open(os.path.join(d, user + ".password")) as f:
        return f.readline().strip()


def _new_password(d, user):
    path = os.path.join(d, user + ".password")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(16) + "\n")
    return _password(d, user)


def enable_auth(d, endpoint, prefix):
    """Users root, asyncps-server and asyncps-worker with their roles (see the
    module doc), then authentication on. Idempotent on an etcd that has it
    on already (a run started again on its run dir): nothing is changed."""
    if os.path.exists(os.path.join(d, "auth.enabled")):
        return
    # In three rounds of calls made at once (each call an etcdctl process);
    # passwords go on etcdctl's stdin, never on a command line others see.
    _etcdctl_all(d, endpoint, [(("user", "add", user, "--interactive=false"),
                                _new_password(d, user) + "\n") for user in USERS] +
                 [(("role", "add", role), None) for role in (SERVER_USER, WORKER_USER)])
    _etcdctl_all(d, endpoint, [(args, None) for args in (
        ("user", "grant-role", "root", "root"),
        ("role", "grant-permission", SERVER_USER, "readwrite", prefix, "--prefix=true"),
        ("user", "grant-role", SERVER_USER, SERVER_USER),
        ("role", "grant-permission", WORKER_USER, "read", prefix + "/elastic"),
        ("role", "grant-permission", WORKER_USER, "read", prefix + "/members/",
         "--prefix=true"),
        ("user", "grant-role", WORKER_USER, WORKER_USER))])
    _etcdctl(d, endpoint, "auth", "enable")
    with open(os.path.join(d, "auth.enabled"), "w") as f:
        f.write("prefix %s\n" % prefix)


class Security:
    """The TLS files and credentials of one etcd user, as flags and variables."""

    def __init__(self, d, user):
        self.ca_file = os.path.join(d, "ca.pem")
        self.cert_file = os.path.join(d, user + ".pem")
        self.key_file = os.path.join(d, user + ".key")
        self.user = user
        self.password_file = os.path.join(d, user + ".password")

    def ssl_context(self):
        """Trusts the run's CA and presents this user's client certificate."""
        ctx = ssl.create_default_context(cafile=self.ca_file)
        ctx.load_cert_chain(self.cert_file, self.key_file)
        return ctx

    def password(self):
        return _password(os.path.dirname(self.password_file), self.user)

    def etcd_flags(self):
        """The ps_server / ps_worker / ps_ctl flags (common/etcd_flags.h)."""
        return ["%s=%s" % (flag, getattr(self, attr)) for flag, _, attr in FLAGS]

    def worker_env(self):
        """The ASYNCPS_ETCD_* variables of a --worker_cmd worker (asyncps.env)."""
        return {var: getattr(self, attr) for _, var, attr in FLAGS}

    def etcd_server_flags(self, d):
        """etcd's own TLS flags (its certificate, client certificates
        required) and bcrypt cost 4 for the users' passwords: they are 128
        random bits, which no hash cost makes easier or harder to guess,
        while at etcd's default (10) each sign-in costs about 60 ms of CPU
        (a fleet's processes sign in at once when it starts)."""
        return ["--cert-file=" + os.path.join(d, "server.pem"),
                "--key-file=" + os.path.join(d, "server.key"),
                "--trusted-ca-file=" + self.ca_file, "--client-cert-auth", "--bcrypt-cost=4"]


def etcd_server_flags(d):
    """etcd's TLS flags for the certificates in `d`."""
    return Security(d, SERVER_USER).etcd_server_flags(d)


def healthy(endpoint, timeout=0.5, context=None):
    """True when etcd at `endpoint` answers /health true (`context`: the
    ssl context of an https endpoint). Here rather than in etcd.py, which
    imports this module, for the `health` command below."""
    try:
        with urllib.request.urlopen(endpoint + "/health", timeout=timeout,
                                    context=context) as r:
            return json.loads(r.read().decode()).get("health") == "true"
    except (OSError, ValueError, urllib.error.URLError):
        return False


def main(argv):
    if len(argv) >= 2 and argv[0] == "certs":
        make_certs(argv[1], hosts=argv[2:] or ("127.0.0.1",))
        return 0
    if len(argv) >= 3 and argv[0] == "ensure":
        ensure_certs(argv[1], hosts=argv[2:])
        return 0
    if len(argv) == 3 and argv[0] == "health":
        ctx = Security(argv[1], SERVER_USER).ssl_context()
        return 0 if healthy(argv[2], timeout=1.0, context=ctx) else 1
    if len(argv) == 4 and argv[0] == "auth":
        enable_auth(argv[1], argv[2], argv[3])
        return 0
    sys.stderr.write("usage: python3 -m pslaunch.etcd_tls certs DIR [HOST...] | "
                     "ensure DIR HOST... | health DIR ENDPOINT | auth DIR ENDPOINT PREFIX\n")
    return 2


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except TlsError as e:
        sys.stderr.write("etcd_tls: %s\n" % e)
        sys.exit(1)
