"""The asyncps binaries psrun starts: where they are and whether they are there.

Shared by cli.py (the local, ssh and emulated backends), slurm.py and psstudy:
they start the same binaries from the same default folder."""
import os
import sys

LAUNCH = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))  # launch/
REPO = os.path.dirname(LAUNCH)


def default_bin_dir():
    """$ASYNCPS_BIN_DIR, else $BUILD/bin, else this checkout's build/bin."""
    return os.environ.get("ASYNCPS_BIN_DIR") or os.path.join(
        os.environ.get("BUILD", os.path.join(REPO, "build")), "bin")


def needed_binaries(opts):
    return ["ps_server", "ps_ctl"] + ([] if opts.worker_cmd else ["ps_worker"])


def check_binaries(opts, names):
    """False (after saying which are missing on stderr) unless every one of
    `names` is an executable in opts.bin_dir."""
    missing = [n for n in names if not os.access(os.path.join(opts.bin_dir, n), os.X_OK)]
    if missing:
        sys.stderr.write("psrun: %s not found in --bin_dir %s (build them: cmake --build build "
                         "--target ps_server ps_worker ps_ctl)\n" % (", ".join(missing), opts.bin_dir))
        return False
    return True
