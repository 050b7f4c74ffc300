#!/usr/bin/env python3
"""experiments/results/check_index.py on a repository of its own in a temp dir:
  - a good index (a figure the docs round from its file, one quoted as written) passes;
  - a row whose file is missing fails, naming the file;
  - a row whose figure its file does not hold fails (as written, or rounded from `in file`);
  - a figure in README.md or docs/ that no row names fails; the same figure inside a code
    block, inline code or a link rate does not.
Standard library only."""
import importlib.util
import os
import shutil
import tempfile
import unittest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load(name, path):
    spec = importlib.util.spec_from_file_location(name, os.path.join(REPO, path))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


check_index = load("check_index", "experiments/results/check_index.py")
unittest_main = load("unittest_main", "tests/unittest_main.py")

HEADER = ("| claim | figure | file | in file | command | commit |\n"
          "|---|---|---|---|---|---|\n")
GOOD_ROWS = [
    "| apply vs memcpy | 0.91x | `experiments/results/perf/apply.jsonl` | "
    "`\"ratio\":0.905` | `ps_bench_apply` | abc1234 |",
    "| push ratio range | 0.84-1.11x | `experiments/results/perf/REPORT.md` | | "
    "`ps_bench_transport` | abc1234 |",
]
README = """# demo

The apply runs at 0.91x memcpy; pulls at 0.84-1.11x memcpy on 100 Mbit/s links.

```
build/bin/ps_bench --ratio=3.5x   # 3.5x in a code block is not read
```

A flag default `--factor=2x` in inline code is not read either.
"""


class CheckIndexTest(unittest.TestCase):
    def setUp(self):
        self.root = tempfile.mkdtemp(prefix="check_index_test.")
        self.addCleanup(shutil.rmtree, self.root)
        self.write("experiments/results/perf/apply.jsonl",
                   '{"bench":"apply","ratio":0.905}\n')
        self.write("experiments/results/perf/REPORT.md",
                   "shared memory 0.84 (1 in flight) and 1.11 (8 in flight)\n")
        self.write("README.md", README)

    def write(self, rel, text):
        path = os.path.join(self.root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)

    def index(self, rows):
        self.write(check_index.INDEX, "# index\n\n" + HEADER + "\n".join(rows) + "\n")

    def test_good_index_passes(self):
        self.index(GOOD_ROWS)
        self.assertEqual(check_index.check(self.root), [])

    def test_missing_file_fails(self):
        self.index(GOOD_ROWS + [
            "| gone | 2.0x | `experiments/results/perf/gone.jsonl` | | `x` | abc1234 |"])
        problems = check_index.check(self.root)
        self.assertEqual(len(problems), 1, problems)
        self.assertIn("perf/gone.jsonl", problems[0])
        self.assertIn("missing", problems[0])

    def test_figure_not_in_file_fails(self):
        rows = [GOOD_ROWS[0].replace("0.91x", "0.95x"),
                GOOD_ROWS[1].replace("0.84-1.11x", "0.84-1.21x")]
        self.index(rows)
        self.write("README.md", "0.95x and 0.84-1.21x\n")
        problems = check_index.check(self.root)
        self.assertEqual(len(problems), 2, problems)
        self.assertIn("0.95", problems[0])
        self.assertIn("1.21 does not occur", problems[1])

    def test_in_file_value_must_occur(self):
        self.index([GOOD_ROWS[0].replace('"ratio":0.905', '"ratio":0.907'), GOOD_ROWS[1]])
        problems = check_index.check(self.root)
        self.assertEqual(len(problems), 1, problems)
        self.assertIn("does not occur", problems[0])

    def test_unnamed_figure_in_docs_fails(self):
        self.index(GOOD_ROWS)
        self.write("docs/benchmarks.md", "# b\n\nTop-k runs at 14.7x `std::nth_element` and "
                   "12.6 GB/s; the link is 1 Gbit/s.\n")
        problems = check_index.check(self.root)
        self.assertEqual(len(problems), 2, problems)
        self.assertIn("docs/benchmarks.md:3: figure '14.7x'", problems[0])
        self.assertIn("'12.6 GB/s'", problems[1])

    def test_doc_figures_skip_code_and_link_rates(self):
        figs = [f for _, f in check_index.doc_figures(README)]
        self.assertEqual(figs, ["0.91x", "0.84-1.11x"])

    def test_rounding_and_scales(self):
        self.assertTrue(check_index.near([0.905], 0.91, 0.005 + 1e-9))
        self.assertFalse(check_index.near([0.894], 0.91, 0.005 + 1e-9))
        nums = [v for v, _ in check_index.figure_numbers("55.5k samples/s")]
        self.assertEqual(nums, [55500.0])
        self.assertTrue(check_index.near([55517.0], 55500.0, 50.0))
        self.assertTrue(check_index.near([13049522.0], 13.0, 0.5))  # "13 M rows/s"

    def test_escaped_pipes_in_cells(self):
        self.write("experiments/results/perf/REPORT.md", "| 16 MiB x 1 | 0.84 |\n| x | 1.11 |\n")
        self.index([GOOD_ROWS[0],
                    "| pulls | 0.84-1.11x | `experiments/results/perf/REPORT.md` | "
                    "`\\| 16 MiB x 1 \\| 0.84; \\| 1.11` | `x` | abc1234 |"])
        self.assertEqual(check_index.check(self.root), [])


if __name__ == "__main__":
    unittest_main.main()
