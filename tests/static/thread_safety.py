#!/usr/bin/env python3
"""Clang's thread-safety analysis over the C++ files that use asyncps::Mutex.

Reads the build's compile_commands.json (CMAKE_EXPORT_COMPILE_COMMANDS),
and for every translation unit that includes common/mutex.h (directly or
through its own header) runs its compile command with clang++ instead of the
configured compiler, -fsyntax-only -Wthread-safety -Werror=thread-safety.
Exit 0 when every file is clean, 1 on a finding (clang's messages printed),
77 when clang++ is missing (Debian's clang).

  tests/static/thread_safety.py BUILD_DIR [-j N]
"""
import argparse
import concurrent.futures
import json
import os
import re
import shlex
import shutil
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def uses_mutex(path, seen=None):
    """Whether `path` includes common/mutex.h through repo headers."""
    seen = set() if seen is None else seen
    if path in seen:
        return False
    seen.add(path)
    try:
        text = open(path, encoding="utf-8", errors="replace").read()
    except OSError:
        return False
    for inc in INCLUDE.findall(text):
        if inc == "common/mutex.h":
            return True
        full = os.path.join(REPO, inc)
        if os.path.isfile(full) and uses_mutex(full, seen):
            return True
    return False


def clang_args(entry, clang):
    args = entry.get("arguments") or shlex.split(entry["command"])
    out = [clang]
    i = 1
    while i < len(args):
        a = args[i]
        if a == "-o":
            i += 2
            continue
        if a == "-include" and i + 1 < len(args) and "cmake_pch" in args[i + 1]:
            i += 2  # GCC's precompiled header: clang reads the sources
            continue
        if a not in ("-c", "-Winvalid-pch"):
            out.append(a)
        i += 1
    if entry["file"] not in out:
        out.append(entry["file"])
    return out + ["-fsyntax-only", "-Wno-unknown-warning-option", "-Wthread-safety",
                  "-Werror=thread-safety"]


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("build_dir")
    ap.add_argument("-j", type=int, default=os.cpu_count() or 2)
    a = ap.parse_args()
    clang = shutil.which("clang++") or shutil.which("clang++-14")
    if clang is None:
        print("thread-safety: clang++ not installed (Debian's clang): skipped")
        return 77
    db = os.path.join(a.build_dir, "compile_commands.json")
    if not os.path.isfile(db):
        print("thread-safety: %s missing (configure with CMAKE_EXPORT_COMPILE_COMMANDS)" % db)
        return 1
    entries = [e for e in json.load(open(db))
               if e["file"].endswith(".cc") and "/_deps/" not in e["file"]
               and uses_mutex(e["file"])]
    # One entry per file (a file built into two targets is checked once).
    by_file = {}
    for e in entries:
        by_file.setdefault(e["file"], e)
    if not by_file:
        print("thread-safety: no file includes common/mutex.h")
        return 1

    def check(entry):
        p = subprocess.run(clang_args(entry, clang), cwd=entry["directory"],
                           capture_output=True, text=True)
        return entry["file"], p.returncode, p.stderr

    bad = 0
    with concurrent.futures.ThreadPoolExecutor(max_workers=a.j) as pool:
        for path, rc, err in pool.map(check, sorted(by_file.values(), key=lambda e: e["file"])):
            rel = os.path.relpath(path, REPO)
            if rc != 0:
                bad += 1
                print("FAIL %s\n%s" % (rel, err))
            else:
                print("ok   %s" % rel)
    print("thread-safety: %d files, %d with findings" % (len(by_file), bad))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
