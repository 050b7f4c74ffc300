#!/usr/bin/env python3
"""Tests of `summarize.py --check` on small synthetic JSONL files: a passing
set, a row below its goal, a missing row, a waived goal, a benchmark absent
from the files, malformed lines and goals files, and the shipped goals.json
(it parses, and every selector names fields the benchmarks print)."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SUMMARIZE = os.path.join(HERE, "summarize.py")

GOALS = {"goals": [
    {"name": "quantisers", "bench": "codec",
     "select": {"codec": ["qsgd", "terngrad"], "n": 1048576, "op": "encode"},
     "metric": "ratio", "min": 0.3},
    {"name": "two-process transport", "bench": "transport",
     "select": {"op": "pull", "bytes": 1048576, "inflight": 8},
     "metric": "ratio_vs_raw_2proc", "min": 0.9},
    {"name": "sparse hot rows", "bench": "sparse", "select": {"regime": "hit100"},
     "metric": "ratio_hashmap", "min": 0.5},
    {"name": "1 MiB optimizer", "bench": "apply", "select": {"optimizer": "adam"},
     "metric": "ratio", "min": 0.5, "waived": "byte-count bound"},
]}


def codec(name, ratio, lo=None, hi=None, n=1048576, op="encode"):
    d = {"bench": "codec", "codec": name, "n": n, "op": op, "baseline": "memcpy",
         "ratio": ratio}
    if lo is not None:
        d["ratio_spread"] = {"median": ratio, "min": lo, "max": hi, "n": 5}
    return d


TRANSPORT = {"bench": "transport", "op": "pull", "mode": "sgd", "bytes": 1048576, "inflight": 8,
             "baseline": "raw_zmq_dealer_router", "ratio": 0.7, "ratio_vs_raw_2proc": 0.95}
SPARSE = {"bench": "sparse", "op": "pull", "regime": "hit100", "baseline": "hashmap",
          "ratio": 2.4, "ratio_hashmap": 2.4, "ratio_hashmap_min": 1.9,
          "ratio_hashmap_max": 3.1}
ADAM = {"bench": "apply", "optimizer": "adam", "baseline": "memcpy", "ratio": 0.26}


class CheckTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="summarize_test.")
        self.goals = self.write("goals.json", json.dumps(GOALS))

    def tearDown(self):
        self.tmp.cleanup()

    def write(self, name, text):
        path = os.path.join(self.tmp.name, name)
        with open(path, "w") as f:
            f.write(text)
        return path

    def rows(self, name, rows):
        return self.write(name, "".join(json.dumps(r) + "\n" for r in rows))

    def check(self, *files, goals=None, extra=()):
        p = subprocess.run([sys.executable, SUMMARIZE, "--check", "--goals", goals or self.goals,
                            *extra, *files], capture_output=True, text=True, timeout=60)
        return p.returncode, p.stdout, p.stderr

    def passing(self):
        return [self.rows("codecs.jsonl", [codec("qsgd", 0.35, 0.31, 0.40),
                                           codec("terngrad", 0.33, 0.29, 0.44),
                                           codec("terngrad", 0.1, n=4096)]),
                self.rows("transport.jsonl", [TRANSPORT]),
                self.rows("sparse.jsonl", [SPARSE]),
                self.rows("apply.jsonl", [ADAM])]

    def table_line(self, out, *parts):
        lines = [l for l in out.splitlines()
                 if l.startswith("| ") and all(p in l for p in parts)]
        self.assertEqual(len(lines), 1, "no single table line with %r in:\n%s" % (parts, out))
        return lines[0]

    def test_passing_set(self):
        rc, out, err = self.check(*self.passing())
        self.assertEqual(rc, 0, out + err)
        self.assertNotIn("FAIL", out)
        self.assertNotIn("MISSING", out)
        # Median and [min, max] of every goal row, from the row's spread.
        self.assertIn("| 0.350 | [0.31, 0.40] | >= 0.30 |",
                      self.table_line(out, "codec=qsgd n=1048576 op=encode"))
        self.assertIn("| 0.330 | [0.29, 0.44] |",
                      self.table_line(out, "codec=terngrad n=1048576 op=encode"))
        # No spread in the row: the range is "-".
        self.assertIn("| 0.950 | - | >= 0.90 |", self.table_line(out, "ratio_vs_raw_2proc"))
        # Flat <metric>_min / _max fields are a spread too.
        self.assertIn("| 2.400 | [1.90, 3.10] |", self.table_line(out, "regime=hit100"))
        # A waived goal's row below its minimum is shown but does not fail.
        self.assertTrue(self.table_line(out, "optimizer=adam").startswith("| WAIVED |"))
        self.assertIn("waived: 1 MiB optimizer: byte-count bound", out)
        # The 4096-element row is not a goal row.
        self.assertNotIn("n=4096", out)

    def test_row_below_goal_fails(self):
        files = self.passing()
        files[0] = self.rows("codecs.jsonl", [codec("qsgd", 0.21, 0.18, 0.25),
                                              codec("terngrad", 0.33, 0.29, 0.44)])
        rc, out, err = self.check(*files)
        self.assertEqual(rc, 1, out + err)
        fails = [l for l in out.splitlines() if l.startswith("FAIL")]
        self.assertEqual(len(fails), 1, out)
        self.assertIn("bench=codec row=codec=qsgd n=1048576 op=encode ratio=0.210 < goal 0.30",
                      fails[0])
        self.assertTrue(self.table_line(out, "codec=qsgd").startswith("| FAIL |"))
        self.assertTrue(self.table_line(out, "codec=terngrad").startswith("| ok |"))
        self.assertIn("1 goal row(s) below goal or missing", out)

    def test_missing_row(self):
        files = self.passing()
        files[0] = self.rows("codecs.jsonl", [codec("qsgd", 0.35, 0.31, 0.40)])
        rc, out, err = self.check(*files)
        self.assertEqual(rc, 1, out + err)
        missing = [l for l in out.splitlines() if l.startswith("MISSING")]
        self.assertEqual(len(missing), 1, out)
        self.assertIn("bench=codec row=codec=terngrad n=1048576 op=encode", missing[0])
        self.assertNotIn("FAIL", out)

    def test_several_runs_of_a_row_in_one_file(self):
        files = self.passing()
        # Three runs: the median run (0.31) meets the goal, one run does not.
        files[0] = self.rows("codecs.jsonl", [
            codec("qsgd", 0.25, 0.2, 0.3), codec("qsgd", 0.33, 0.3, 0.4),
            codec("qsgd", 0.31, 0.3, 0.35), codec("terngrad", 0.33, 0.29, 0.44)])
        rc, out, err = self.check(*files)
        self.assertEqual(rc, 0, out + err)
        self.assertIn("| ok | codec | codec=qsgd n=1048576 op=encode | ratio | 0.310 | "
                      "[0.25, 0.33] |", out)
        # The same runs in two files are judged per file.
        other = self.rows("codecs2.jsonl", [codec("qsgd", 0.2), codec("qsgd", 0.22),
                                            codec("terngrad", 0.4)])
        rc, out, _ = self.check(*files, other)
        self.assertEqual(rc, 1)
        fails = [l for l in out.splitlines() if l.startswith("FAIL")]
        self.assertEqual(len(fails), 1, out)
        self.assertIn("codec=qsgd n=1048576 op=encode ratio=0.210 < goal 0.30 (codecs2.jsonl)",
                      fails[0])

    def test_row_without_the_metric_fails(self):
        files = self.passing()
        row = dict(TRANSPORT)
        del row["ratio_vs_raw_2proc"]
        files[1] = self.rows("transport.jsonl", [row])
        rc, out, _ = self.check(*files)
        self.assertEqual(rc, 1)
        self.assertIn("ratio_vs_raw_2proc=missing < goal 0.90", out)

    def test_benchmark_absent_from_files(self):
        files = self.passing()
        rc, out, err = self.check(*files[:3])  # no apply rows at all
        self.assertEqual(rc, 0, out + err)
        self.assertIn("not checked (no rows of their benchmark in these files): 1 MiB optimizer",
                      out)
        # With --all it is a missing row (waived goals still need their row).
        rc, out, _ = self.check(*files[:3], extra=["--all"])
        self.assertEqual(rc, 1)
        self.assertIn("MISSING bench=apply row=optimizer=adam", out)

    def test_malformed_line_is_a_clear_error(self):
        good = json.dumps(codec("qsgd", 0.35))
        bad = self.write("bad.jsonl", good + "\n" + '{"bench": "codec", "ratio": 0.3' + "\n")
        rc, out, err = self.check(bad)
        self.assertEqual(rc, 2)
        self.assertEqual(out, "")
        self.assertIn("bad.jsonl:2: not a JSON line", err)
        self.assertNotIn("Traceback", err)
        # A line that is JSON but not an object.
        arr = self.write("arr.jsonl", good + "\n\n[1, 2]\n")
        rc, _, err = self.check(arr)
        self.assertEqual(rc, 2)
        self.assertIn("arr.jsonl:3: not a JSON object", err)

    def test_bad_goals_file_is_a_clear_error(self):
        data = self.rows("codecs.jsonl", [codec("qsgd", 0.35)])
        for text, what in (("{", "not a goals file"),
                           (json.dumps({"goals": [{"name": "x", "bench": "codec"}]}),
                            "has no 'select'")):
            rc, _, err = self.check(data, goals=self.write("g.json", text))
            self.assertEqual(rc, 2, err)
            self.assertIn(what, err)
            self.assertNotIn("Traceback", err)
        rc, _, err = self.check(os.path.join(self.tmp.name, "absent.jsonl"))
        self.assertEqual(rc, 2)
        self.assertIn("absent.jsonl", err)


class ShippedGoalsTest(unittest.TestCase):
    # Fields each benchmark prints (a goal selecting on another field would
    # never match a row).
    FIELDS = {
        "transport": {"op", "mode", "transport", "bytes", "inflight"},
        "apply": {"level", "optimizer", "grad_bytes", "apply_threads"},
        "codec": {"codec", "n", "op"},
        "worker": {"config", "prefetch_ahead"},
        "sparse": {"op", "dim", "regime"},
        "metrics_overhead": {"variant"},
        "pytorch": {"model", "baseline"},
        "overlap": {"setting", "link", "model", "consistency", "batch", "prefetch_ahead",
                    "baseline", "shards", "placement"},
        "worker_overlap": {"setting", "consistency", "pipeline_shards", "baseline", "shards",
                           "batch"},
        "elastic": {"change"},
        "replication": {"op", "mode", "layers"},
    }

    def test_goals_file(self):
        with open(os.path.join(HERE, "goals.json")) as f:
            goals = json.load(f)["goals"]
        self.assertGreater(len(goals), 10)
        for g in goals:
            self.assertIn(g["bench"], self.FIELDS, g["name"])
            self.assertLessEqual(set(g["select"]), self.FIELDS[g["bench"]], g["name"])
            self.assertIsInstance(g["min"], (int, float))
        # The goals of issue 24 are there.
        q = [g for g in goals if g["bench"] == "codec"][0]
        self.assertEqual(q["min"], 0.3)
        self.assertEqual(set(q["select"]["n"]), {1048576, 16777216})
        self.assertIn("terngrad:bucket=512", q["select"]["codec"])
        w = [g for g in goals if g["bench"] == "worker"][0]
        self.assertEqual((w["metric"], w["min"]), ("ratio", 0.85))
        mins = sorted(g["min"] for g in goals if g["metric"] == "ratio_vs_raw_2proc")
        self.assertEqual(mins, [0.7, 0.8, 0.9])


if __name__ == "__main__":
    unittest.main()
