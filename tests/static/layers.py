#!/usr/bin/env python3
"""The include graph follows the layers: no file includes a layer above it.

The layers, lowest first (a file may include its own layer and any below):
  common/ and compression/ (below everything; compression may include
  common/), then server/'s folders in the order of SERVER_LAYERS, the
  test-support headers of server/testing/ at the top of server/, and
  worker/ beside server/ (the client never includes a server header, and
  no server code includes worker/). server/CMakeLists.txt builds one
  library per layer, each linking only the layers below it; this check is
  what keeps a header include from going around that order (a static
  library does not stop one). Test files (*_test.cc, *_fuzz.cc, tests/)
  may include anything.

  tests/static/layers.py [--root DIR]

Prints each violation as `file:line: <layer> includes <layer> (path)`;
exit 1 when there is one.
"""
import argparse
import os
import re
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SERVER_LAYERS = ["internal", "optimizer", "store", "sparse", "shard", "upload", "migrate",
                 "replication", "reshard", "elastic", "loop", "ctl", "testing"]
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
TEST = re.compile(r"(_test|_fuzz|_bench)\.(cc|cu)$|^tests/|^experiments/")


def layer(path):
    """(group, rank) of a repo path, or None for files outside the layering."""
    parts = path.split("/")
    if parts[0] == "common":
        return ("base", 0)
    if parts[0] == "compression":
        return ("base", 1)
    if parts[0] == "server" and len(parts) > 2 and parts[1] in SERVER_LAYERS:
        return ("server", 10 + SERVER_LAYERS.index(parts[1]))
    if parts[0] == "worker":
        return ("worker", 10)
    return None


def allowed(src, dst):
    if src is None or dst is None:
        return True
    if dst[0] == "base":
        return src[0] != "base" or dst[1] <= src[1]
    if src[0] == "base":
        return False
    if src[0] != dst[0]:
        return False  # server <-> worker
    return dst[1] <= src[1]


def name(path):
    p = path.split("/")
    return p[0] if p[0] != "server" else "server/" + p[1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=REPO)
    a = ap.parse_args()
    out = subprocess.run(["git", "-C", a.root, "ls-files", "-z"], capture_output=True).stdout
    files = [f for f in out.decode().split("\0")
             if f.endswith((".cc", ".h", ".cu", ".cuh")) and not TEST.search(f)]
    if not files:
        print(f"layers: no C++ files under {a.root} (not a git checkout?)")
        return 1
    bad = 0
    for f in sorted(files):
        src = layer(f)
        if src is None:
            continue
        with open(os.path.join(a.root, f), encoding="utf-8", errors="replace") as fh:
            for n, line in enumerate(fh, 1):
                m = INCLUDE.match(line)
                if not m:
                    continue
                inc = m.group(1)
                if not os.path.exists(os.path.join(a.root, inc)):
                    continue  # a generated header or one beside the file
                if not allowed(src, layer(inc)):
                    print(f"{f}:{n}: {name(f)} includes {name(inc)} ({inc})")
                    bad += 1
    checked = sum(1 for f in files if layer(f) is not None)
    print(f"layers: {checked} files checked, {bad} includes against the layer order "
          f"(server: {' < '.join(SERVER_LAYERS)})")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
