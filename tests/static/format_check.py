#!/usr/bin/env python3
"""Every C++ source in the tree is formatted by the repository's .clang-format.

Lists the tracked C++ files (git ls-files; the files under the current
directory when it is not a git checkout), runs
`clang-format --dry-run -Werror` over them, and prints each file that
differs with the first lines clang-format would change. Exit 0 when all are
formatted, 1 when one is not, 77 when clang-format is missing (Debian's
clang-format package).

  tests/static/format_check.py [--root DIR] [--fix]

--fix rewrites the files in place (clang-format -i) instead of checking.
"""
import argparse
import os
import shutil
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SUFFIXES = (".cc", ".h", ".cu", ".cuh", ".cpp")
# Vendored or generated code keeps its own layout.
SKIP_DIRS = ("build", "third_party")


def find_clang_format():
    for name in ("clang-format", "clang-format-14", "clang-format-15", "clang-format-16"):
        path = shutil.which(name)
        if path:
            return path
    return None


def sources(root):
    try:
        out = subprocess.run(["git", "-C", root, "ls-files", "-z"], check=True,
                             capture_output=True).stdout.decode()
        files = [f for f in out.split("\0") if f]
    except (subprocess.CalledProcessError, FileNotFoundError):
        files = []
        for d, dirs, names in os.walk(root):
            dirs[:] = [x for x in dirs if not x.startswith(".") and x not in SKIP_DIRS]
            files += [os.path.relpath(os.path.join(d, n), root) for n in names]
    return sorted(f for f in files
                  if f.endswith(SUFFIXES) and f.split("/")[0] not in SKIP_DIRS
                  and os.path.isfile(os.path.join(root, f)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=REPO)
    ap.add_argument("--fix", action="store_true")
    args = ap.parse_args()
    tool = find_clang_format()
    if tool is None:
        print("format_check: clang-format not installed (apt-get install clang-format): skipped")
        return 77
    files = sources(args.root)
    if not files:
        print(f"format_check: no C++ sources under {args.root}")
        return 1
    if args.fix:
        subprocess.run([tool, "-i", "--style=file"] + files, cwd=args.root, check=True)
        print(f"format_check: formatted {len(files)} files")
        return 0
    bad = []
    for i in range(0, len(files), 64):
        batch = files[i:i + 64]
        r = subprocess.run([tool, "--dry-run", "-Werror", "--style=file"] + batch,
                           cwd=args.root, capture_output=True, text=True)
        if r.returncode != 0:
            for f in batch:
                one = subprocess.run([tool, "--dry-run", "-Werror", "--style=file", f],
                                     cwd=args.root, capture_output=True, text=True)
                if one.returncode != 0:
                    bad.append((f, one.stderr))
    for f, msg in bad:
        print(f"format_check: {f} is not clang-formatted:")
        print("\n".join(msg.splitlines()[:6]))
    print(f"format_check: {len(files) - len(bad)} of {len(files)} C++ files formatted "
          f"({os.path.basename(tool)}); {len(bad)} not")
    if bad:
        print("format_check: run tests/static/format_check.py --fix (clang-format -i) and commit")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
