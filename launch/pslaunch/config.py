"""Experiment flag files: one file for the whole fleet.

Format (documented in launch/README.md): a gflags flag file split into sections.

    # comment
    [psrun]               # launcher options, same names as psrun's command line
    --servers=2
    --workers=4
    [server]              # passed to every ps_server (--flagfile)
    --consistency=ssp
    --staleness=2
    [worker]              # passed to every ps_worker (--flagfile)
    --batch=64
    server: --lr=0.05     # a one-line prefix works too, in any section

Lines outside a section without a prefix are an error: ps_server and ps_worker
reject each other's flags, so every flag must say whom it is for.
"""
import os
import re
import shlex

ROLES = ("psrun", "server", "worker")
# Where a bare --config name (fashion_ssp, fashion_ssp.flags) is looked up:
# this checkout's launch/configs, then the installed copies: <prefix>/share/
# asyncps/configs beside <prefix>/lib/python3.../site-packages/pslaunch (pip,
# also in a venv or with --user; the Debian package, also unpacked with
# dpkg -x), then /usr/share/asyncps/configs.
_PKG = os.path.dirname(os.path.realpath(__file__))
CONFIG_DIRS = (os.path.join(os.path.dirname(_PKG), "configs"),
               os.path.normpath(os.path.join(_PKG, "..", "..", "..", "..", "share", "asyncps",
                                             "configs")),
               "/usr/share/asyncps/configs")


class ConfigError(Exception):
    pass


def parse_config_text(text, source="<config>"):
    """Returns {"psrun": [...], "server": [...], "worker": [...]} flag lists."""
    out = {r: [] for r in ROLES}
    section = None
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = re.fullmatch(r"\[(\w+)\]", line)
        if m:
            if m.group(1) not in ROLES:
                raise ConfigError("%s:%d: unknown section [%s] (use %s)" %
                                  (source, lineno, m.group(1),
                                   ", ".join("[%s]" % r for r in ROLES)))
            section = m.group(1)
            continue
        role = section
        m = re.match(r"(\w+):\s*(.*)$", line)
        if m and not line.startswith("-"):
            if m.group(1) not in ROLES:
                raise ConfigError("%s:%d: unknown prefix '%s:'" % (source, lineno, m.group(1)))
            role, line = m.group(1), m.group(2).strip()
        if role is None:
            raise ConfigError("%s:%d: '%s' is outside any [server]/[worker]/[psrun] section"
                              % (source, lineno, line))
        if not line.startswith("--"):
            raise ConfigError("%s:%d: expected --flag=value, got '%s'" % (source, lineno, line))
        out[role].append(line)
    return out


def find_config(path):
    """`path` where it exists or names a folder; else the first of
    CONFIG_DIRS/<path> and CONFIG_DIRS/<path>.flags that exists; else `path`
    (parse_config_file then says it is missing)."""
    if os.path.exists(path) or os.sep in path:
        return path
    for d in CONFIG_DIRS:
        for name in (path, path + ".flags"):
            if os.path.isfile(os.path.join(d, name)):
                return os.path.join(d, name)
    return path


def parse_config_file(path):
    with open(path) as f:
        return parse_config_text(f.read(), path)


def psrun_defaults(flags, parser):
    """Parses [psrun] lines with psrun's own argparse parser (no positional args)."""
    args = []
    for f in flags:
        args.extend(shlex.split(f))
    ns, rest = parser.parse_known_args(args)
    if rest:
        raise ConfigError("[psrun]: unknown options %s" % " ".join(rest))
    return ns


def uses_curve(server_flags, server_lines):
    """True when the fleet's shards get a CurveZMQ key: --server_flags (one
    string), the [server] lines."""
    return any("--curve_secret_key" in t for t in [server_flags or ""] + list(server_lines))


def write_flagfile(path, lines, header):
    """Writes a gflags flag file (one flag per line)."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write("# %s\n" % header)
        for line in lines:
            f.write(line + "\n")
    os.replace(tmp, path)
