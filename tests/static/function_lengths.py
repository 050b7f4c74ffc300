#!/usr/bin/env python3
"""The longest C++ functions in the tree, and a check that none is too long.

Scans the tracked C++ sources (tests excluded unless --tests) with comments
and string literals blanked out, tracks brace nesting, and records every
function body opened at namespace or class scope: a `{` whose text since the
previous `;`, `{` or `}` ends in a parameter list, optionally followed by
qualifiers, a trailing return type or a constructor's initialiser list.
Lambdas and local classes count toward the function that holds them.

  tests/static/function_lengths.py [--max N] [--top K] [--tests] [--root DIR]

Prints the K longest (lines from the signature's `{` to its `}`, inclusive),
the largest non-test file, and, with --max, every function over N lines;
exit 1 when there is one.
"""
import argparse
import os
import re
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SUFFIXES = (".cc", ".h", ".cu", ".cuh", ".cpp")
SCOPE = re.compile(r"\b(namespace|class|struct|union|enum)\b[^()]*$|extern\s*$|^\s*$")
SIGNATURE = re.compile(
    r"\)\s*(const|override|final|noexcept(\([^)]*\))?|mutable|&|&&|\s)*"
    r"(->\s*[\w:<>,\s\*&]+)?\s*$")
INIT_LIST = re.compile(r"\)\s*(noexcept)?\s*:\s*[\w:]+\s*[({]", re.S)
NAME = re.compile(r"([~\w:]+(?:<[^()]*>)?|operator\s*[^\s(]+)\s*\($")


def blank(text):
    """Comments and literals replaced by spaces (newlines kept)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == 'R' and text.startswith('R"', i) and (i == 0 or not text[i - 1].isalnum()):
            m = re.match(r'R"([^(\s]*)\(', text[i:])
            if not m:
                out.append(c)
                i += 1
                continue
            end = text.find(")" + m.group(1) + '"', i)
            j = n if end < 0 else end + len(m.group(1)) + 2
            out.append('""' + re.sub(r"[^\n]", " ", text[i + 2:j]))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            out.append(c + " " * (j - i - 1) + c)
            i = j + 1
        elif c == "#" and (i == 0 or text[i - 1] == "\n"):
            j = i
            while True:
                e = text.find("\n", j)
                if e < 0:
                    e = n
                    break
                if text[e - 1] != "\\":
                    break
                j = e + 1
            out.append(re.sub(r"[^\n]", " ", text[i:e]))
            i = e
        else:
            out.append(c)
            i += 1
    return "".join(out)


def functions(text):
    """(name, first line, line count) of each function body at scope level."""
    src = blank(text)
    stack = []  # per open brace: "scope", "func" or "block"
    found = []
    last = 0  # index after the previous ; { or }
    for i, c in enumerate(src):
        if c == "{":
            head = src[last:i]
            inside_func = any(k == "func" for k, _ in stack)
            if inside_func:
                kind = "block"
            elif SIGNATURE.search(head) or INIT_LIST.search(head):
                kind = "func"
            elif SCOPE.search(head.strip().split("\n")[-1] if head.strip() else "") or \
                    re.search(r"\b(namespace|class|struct|union|enum)\b", head):
                kind = "scope"
            else:
                kind = "block"
            stack.append((kind, i if kind != "func" else (i, head)))
            last = i + 1
        elif c == "}":
            if stack:
                kind, info = stack.pop()
                if kind == "func":
                    start, head = info
                    sig = head[:head.rfind(")") + 1] if ")" in head else head
                    depth, k = 0, len(sig) - 1
                    while k >= 0:
                        if sig[k] == ")":
                            depth += 1
                        elif sig[k] == "(":
                            depth -= 1
                            if depth == 0:
                                break
                        k -= 1
                    m = NAME.search(sig[:k + 1].rstrip() if k >= 0 else "")
                    name = m.group(1) if m else "?"
                    first = src.count("\n", 0, start) + 1
                    lastline = src.count("\n", 0, i) + 1
                    found.append((name, first, lastline - first + 1))
            last = i + 1
        elif c == ";":
            if not any(k == "func" for k, _ in stack):
                last = i + 1
    return found


def sources(root, tests):
    out = subprocess.run(["git", "-C", root, "ls-files", "-z"], capture_output=True).stdout
    files = [f for f in out.decode().split("\0") if f.endswith(SUFFIXES)]
    if not tests:
        files = [f for f in files if not re.search(r"(_test|_fuzz)\.(cc|cu)$|^tests/", f)]
    return files


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=REPO)
    ap.add_argument("--max", type=int)
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--tests", action="store_true")
    args = ap.parse_args()
    rows, sizes = [], []
    for f in sources(args.root, args.tests):
        text = open(os.path.join(args.root, f), encoding="utf-8", errors="replace").read()
        sizes.append((text.count("\n"), f))
        rows += [(n, f"{f}:{line}", name) for name, line, n in functions(text)]
    rows.sort(reverse=True)
    sizes.sort(reverse=True)
    print(f"function_lengths: {len(rows)} functions in {len(sizes)} files; "
          f"largest file {sizes[0][1]} ({sizes[0][0]} lines)")
    for n, where, name in rows[:args.top]:
        print(f"  {n:5d}  {name}  {where}")
    if args.max is not None:
        over = [r for r in rows if r[0] > args.max]
        for n, where, name in over:
            print(f"function_lengths: {name} at {where} is {n} lines (limit {args.max})")
        print(f"function_lengths: {len(over)} functions over {args.max} lines")
        return 1 if over else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
