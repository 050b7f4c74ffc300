#!/usr/bin/env python3
"""Checks experiments/results/INDEX.md against the files it names and the docs that quote it.

  experiments/results/check_index.py [--root DIR]

INDEX.md holds one table row per figure that README.md, docs/*.md or experiments/results/
REPORT.md cite:

  | claim | figure | file | in file | command | commit |

(a `|` inside a cell is written `\\|`)

- figure: the figure as the docs write it (`0.99x`, `0.84-1.11x`, `8-10 M rows/s`, `0.923`).
- file: the kept file it comes from, relative to the repository root.
- in file: optional; the values as that file writes them, separated by `;` (`0.9874; 3.81`),
  where the docs round them or the file spells them otherwise. Each must occur in the file
  (as text, not inside a longer number), and each number of the figure must be one of them
  rounded to the figure's decimals, or so scaled by a thousand, a million, a billion (`73k
  samples/s` for 73412) or a hundred (percentages). Empty: each number of the figure must
  occur in the file as the figure writes it.
- command: what makes the file; commit: the commit that added it (`git log --diff-filter=A`).

It fails (exit 1, one line per problem) when a row's file is missing, when a row's figure
does not match its file as above, or when README.md or docs/*.md contains a figure-like
number (a ratio such as `1.17x`, or a rate such as `12.6 GB/s`, `8 M rows/s`, `70k
samples/s`) that no INDEX row names. Fenced code blocks and inline code (commands, flag
defaults) are not read; link rates (`100 Mbit/s`) are set-ups, not figures. Standard library
only; runs in CI as ctest `experiments.results_index`.
"""
import argparse
import bisect
import os
import re
import sys

INDEX = "experiments/results/INDEX.md"
COLUMNS = ("claim", "figure", "file", "in file", "command", "commit")
# A number, or a range of two, then "x" (a ratio) or a rate unit.
RATE_UNITS = (r"GB/s|MB/s|GiB/s|MiB/s|kB/s|G elements/s|M elements/s|M rows/s|k rows/s|"
              r"rows/s|samples/s|k samples/s|ops/s|steps/s|updates/s")
FIGURE = re.compile(
    r"(?<![\w.\-/])~?(\d+(?:[.,]\d+)*k?(?:\s?-\s?\d+(?:[.,]\d+)*k?)?)"
    r"(x(?![\w-])|\s?(?:" + RATE_UNITS + r")(?!\w))")
NUMBER = re.compile(r"(?<![\w.])-?\d+(?:,\d{3})*(?:\.\d+)?(?:[eE][-+]?\d+)?")
SCALES = (1.0, 1e3, 1e6, 1e9, 1e-3, 1e-6, 1e-9, 1e2, 1e-2)


def normalize(figure):
    """One spelling of a figure: no backticks, no '~', single spaces, no spaces around '-'."""
    f = figure.replace("`", "").replace("~", "").strip()
    f = re.sub(r"\s*-\s*(?=\d)", "-", f)
    return re.sub(r"\s+", " ", f)


def figure_numbers(figure):
    """(value, tolerance) for each number of a figure; "73k" is 73,000 +- 500."""
    out = []
    for m in re.finditer(r"(\d+(?:,\d{3})*(?:\.(\d+))?)(k?)", normalize(figure)):
        value = float(m.group(1).replace(",", ""))
        decimals = len(m.group(2) or "")
        tol = 0.5 * 10 ** -decimals + 1e-9
        if m.group(3):
            value, tol = value * 1e3, tol * 1e3
        out.append((value, tol))
    return out


def file_numbers(text):
    """Sorted numbers that occur in a file's text."""
    vals = []
    for m in NUMBER.finditer(text):
        try:
            vals.append(float(m.group(0).replace(",", "")))
        except ValueError:
            pass
    return sorted(vals)


def near(sorted_vals, value, tol):
    """True if some value v of sorted_vals, scaled by one of SCALES, is within tol of value."""
    for s in SCALES:
        lo, hi = (value - tol) / s, (value + tol) / s
        i = bisect.bisect_left(sorted_vals, min(lo, hi))
        if i < len(sorted_vals) and sorted_vals[i] <= max(lo, hi):
            return True
    return False


def occurs(text, literal):
    """literal occurs in text, not as part of a longer number."""
    pat = r"(?<![\d.])" + re.escape(literal) + r"(?!\d)"
    return re.search(pat, text) is not None


def parse_index(path):
    """Rows of INDEX.md's tables whose header names the COLUMNS, as dicts."""
    rows, header = [], None
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            line = line.strip()
            if not line.startswith("|"):
                header = None
                continue
            cells = [c.strip().replace("\\|", "|")
                     for c in re.split(r"(?<!\\)\|", line)[1:-1]]
            if header is None:
                names = tuple(c.lower() for c in cells)
                header = names if names == COLUMNS else ()
                continue
            if not header or set(line) <= set("|-: "):
                continue
            if len(cells) != len(COLUMNS):
                rows.append({"lineno": lineno, "error": "%d cells, want %d" %
                             (len(cells), len(COLUMNS))})
                continue
            row = dict(zip(COLUMNS, (c.replace("`", "").strip() for c in cells)))
            row["lineno"] = lineno
            rows.append(row)
    return rows


def check_row(root, row, cache):
    """Problems with one row: a missing file, a figure its file does not hold."""
    where = "%s:%d" % (INDEX, row["lineno"])
    if "error" in row:
        return ["%s: %s" % (where, row["error"])]
    problems = []
    path = os.path.join(root, row["file"])
    if not row["file"] or not os.path.isfile(path):
        return ["%s: %s: file %r is missing" % (where, row["figure"], row["file"])]
    if row["file"] not in cache:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        cache[row["file"]] = (text, file_numbers(text))
    text, numbers = cache[row["file"]]
    wanted = figure_numbers(row["figure"])
    if not wanted:
        problems.append("%s: figure %r has no number" % (where, row["figure"]))
    literals = [s.strip() for s in row["in file"].split(";") if s.strip()]
    for lit in literals:
        if not occurs(text, lit):
            problems.append("%s: %s: %r does not occur in %s" %
                            (where, row["figure"], lit, row["file"]))
    if not literals:  # the figure's own numbers, as written
        for lit in figure_literals(row["figure"]):
            if not occurs(text, lit):
                problems.append("%s: figure %r: %s does not occur in %s" %
                                (where, row["figure"], lit, row["file"]))
        return problems + commit_problems(where, row)
    pool = sorted(v for lit in literals for v in file_numbers(lit))
    for value, tol in wanted:
        if not near(pool, value, tol):
            problems.append("%s: figure %r: %g is not in %s%s" % (
                where, row["figure"], value, row["file"],
                " (in file: %s)" % row["in file"] if literals else ""))
    return problems + commit_problems(where, row)


def commit_problems(where, row):
    if re.fullmatch(r"[0-9a-f]{7,40}", row["commit"]):
        return []
    return ["%s: %s: commit %r is not a commit id" % (where, row["figure"], row["commit"])]


def figure_literals(figure):
    """The numbers of a figure as it writes them ("0.84-1.11x" -> 0.84, 1.11)."""
    return re.findall(r"\d+(?:,\d{3})*(?:\.\d+)?", normalize(figure))


def prose(text):
    """Text of a Markdown file without fenced code blocks and inline code."""
    text = re.sub(r"^ *(```|~~~).*?^ *\1 *$", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*(?:\n[^`\n]+)?`", "``", text)


def doc_figures(text):
    """Normalized figure-like numbers in a Markdown text's prose, with their line numbers."""
    out = []
    for lineno, line in enumerate(prose(text).split("\n"), 1):
        for m in FIGURE.finditer(line):
            out.append((lineno, normalize(m.group(0))))
    return out


def doc_files(root):
    files = [os.path.join(root, "README.md")]
    docs = os.path.join(root, "docs")
    if os.path.isdir(docs):
        files += sorted(os.path.join(docs, f) for f in os.listdir(docs) if f.endswith(".md"))
    return [f for f in files if os.path.isfile(f)]


def check(root):
    """All problems of the index and the docs under root, as lines."""
    index = os.path.join(root, INDEX)
    if not os.path.isfile(index):
        return ["%s is missing" % INDEX]
    rows = parse_index(index)
    if not rows:
        return ["%s has no rows under a header %s" % (INDEX, " | ".join(COLUMNS))]
    problems, cache = [], {}
    for row in rows:
        problems += check_row(root, row, cache)
    named = {normalize(r["figure"]) for r in rows if "figure" in r}
    for path in doc_files(root):
        with open(path, encoding="utf-8") as f:
            for lineno, fig in doc_figures(f.read()):
                if fig not in named:
                    problems.append("%s:%d: figure %r is named by no row of %s" %
                                    (os.path.relpath(path, root), lineno, fig, INDEX))
    return problems


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))), help="repository root (default: this script's)")
    args = ap.parse_args()
    problems = check(args.root)
    for p in problems:
        print(p)
    rows = [r for r in parse_index(os.path.join(args.root, INDEX))
            if "figure" in r] if os.path.isfile(os.path.join(args.root, INDEX)) else []
    print("check_index: %d rows, %d problems" % (len(rows), len(problems)))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
