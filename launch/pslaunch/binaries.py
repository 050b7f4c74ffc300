"""The asyncps binaries psrun starts: where they are and whether they are there.

Shared by cli.py (the local, ssh and emulated backends), slurm.py and psstudy:
they start the same binaries from the same default folder. They are found, in
this order, in $ASYNCPS_BIN_DIR, $BUILD/bin, this checkout's build/bin, the
installed asyncps package's bin/ (`pip install .`, setup.py) and the folder of
the ps_server on PATH (the Debian package's /usr/bin).

ps_server, ps_worker and ps_ctl of a pip install are console scripts that run
the binaries of the package's bin/ (setup.py's entry points, defined below)."""
import importlib.util
import os
import shutil
import sys

LAUNCH = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))  # launch/
REPO = os.path.dirname(LAUNCH)
BINARIES = ("ps_server", "ps_worker", "ps_ctl")


def _has_server(d):
    return d is not None and os.access(os.path.join(d, "ps_server"), os.X_OK)


def package_bin_dir():
    """The bin/ folder of the installed asyncps package (found without
    importing it), or None where asyncps is not installed or its bin/ has no
    ps_server."""
    try:
        spec = importlib.util.find_spec("asyncps")
    except (ImportError, ValueError):
        return None
    for d in (spec.submodule_search_locations or []) if spec else []:
        if _has_server(os.path.join(d, "bin")):
            return os.path.join(d, "bin")
    return None


def path_bin_dir():
    """The folder of the ps_server binary on PATH (links resolved: a console
    script of a pip install is a Python file, whose folder is not taken)."""
    found = shutil.which("ps_server")
    if not found:
        return None
    with open(found, "rb") as f:
        if f.read(4) != b"\x7fELF":
            return None
    return os.path.dirname(os.path.realpath(found))


def default_bin_dir():
    """$ASYNCPS_BIN_DIR, else $BUILD/bin, else the first of this checkout's
    build/bin, the asyncps package's bin/ and ps_server's folder on PATH that
    holds ps_server; else this checkout's build/bin (psrun then says what is
    missing)."""
    if os.environ.get("ASYNCPS_BIN_DIR"):
        return os.environ["ASYNCPS_BIN_DIR"]
    if os.environ.get("BUILD"):
        return os.path.join(os.environ["BUILD"], "bin")
    checkout = os.path.join(REPO, "build", "bin")
    for d in (checkout, package_bin_dir(), path_bin_dir()):
        if _has_server(d):
            return d
    return checkout


def needed_binaries(opts):
    return ["ps_server", "ps_ctl"] + ([] if opts.worker_cmd else ["ps_worker"])


def check_binaries(opts, names):
    """False (after saying which are missing on stderr) unless every one of
    `names` is an executable in opts.bin_dir."""
    missing = [n for n in names if not os.access(os.path.join(opts.bin_dir, n), os.X_OK)]
    if missing:
        sys.stderr.write("psrun: %s not found in --bin_dir %s (build them: cmake --build build "
                         "--target ps_server ps_worker ps_ctl; or pip install .)\n"
                         % (", ".join(missing), opts.bin_dir))
        return False
    return True


def _exec_packaged(name):
    """Replaces this process with the asyncps package's bin/<name>, with this
    process's arguments (the console scripts of a pip install)."""
    d = package_bin_dir()
    if d is None or not os.access(os.path.join(d, name), os.X_OK):
        sys.stderr.write("%s: not in the asyncps package (reinstall it: pip install .)\n" % name)
        return 127
    path = os.path.join(d, name)
    os.execv(path, [path] + sys.argv[1:])


def ps_server():
    return _exec_packaged("ps_server")


def ps_worker():
    return _exec_packaged("ps_worker")


def ps_ctl():
    return _exec_packaged("ps_ctl")
