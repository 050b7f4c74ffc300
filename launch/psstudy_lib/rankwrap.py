#!/usr/bin/env python3
"""The worker wrapper psstudy puts in front of a worker to slow one rank
(straggler injection); psrun gives every rank the same command and flags.

  rankwrap.py RANK FACTOR FLAG_TEMPLATE -- CMD [ARGS...]

runs CMD ARGS (exec, same PID) in the psrun --worker_cmd environment. The
rank whose ASYNCPS_RANK is RANK also gets FLAG_TEMPLATE with {factor}
replaced appended to its arguments (psstudy's default: --slowdown={factor},
which ps_worker and worker/python/examples take) and ASYNCPS_SLOWDOWN=FACTOR
in its environment (for a script that takes no such flag: an empty template,
and the script reads the variable). When CMD is ps_worker, the contract's
variables become its flags (--servers, --rank, --num_workers, --metrics_csv),
as psrun passes them when it runs ps_worker itself.
"""
import os
import sys


def wrapped_argv(argv, environ):
    """(argv to exec, environment) for rankwrap's own argv[1:]."""
    if len(argv) < 5 or argv[3] != "--":
        raise SystemExit("usage: rankwrap.py RANK FACTOR FLAG_TEMPLATE -- CMD [ARGS...]")
    rank, factor, template, cmd = int(argv[0]), argv[1], argv[2], list(argv[4:])
    env = dict(environ)
    prog, args = cmd[0], cmd[1:]
    if os.path.basename(prog) == "ps_worker":
        args = ["--servers=" + env.get("ASYNCPS_SERVERS", ""),
                "--rank=" + env.get("ASYNCPS_RANK", "0"),
                "--num_workers=" + env.get("ASYNCPS_NUM_WORKERS", "1")] + (
            ["--metrics_csv=" + env["ASYNCPS_METRICS_CSV"]]
            if env.get("ASYNCPS_METRICS_CSV") else []) + args
    if int(env.get("ASYNCPS_RANK", "-1")) == rank:
        env["ASYNCPS_SLOWDOWN"] = factor
        if template:
            args.append(template.format(factor=factor))
    return [prog] + args, env


def main():
    argv, env = wrapped_argv(sys.argv[1:], os.environ)
    sys.stderr.write("# rankwrap: %s\n" % " ".join(argv))
    sys.stderr.flush()
    os.execvpe(argv[0], argv, env)


if __name__ == "__main__":
    main()
