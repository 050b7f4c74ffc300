#!/usr/bin/env python3
"""experiments/expkit/plots.py (launch/psstudy_lib/plots.py):
  - every plot kind renders a PNG and its .gp, including the 'no data' frame
    of a log-scaled plot (a study run with --only has no straggler curves;
    gnuplot refused [0:1] on a log axis and the sync-vs-async study died
    drawing its empty straggler plot);
  - hostile text in every field that reaches a script (title, axis labels,
    legend entries, the PNG's name): backticks, $(...), @macros, system(),
    quotes, backslashes, newlines; and the folder of the script that
    experiments/monitoring/run.py writes itself (PNG and data file names).
    gnuplot runs backticked text even inside double quotes, so a study named
    with `touch FILE` in backticks created FILE, and so did opening its saved
    .gp. Each script is run by the module and once more as saved; no command
    may run, and each text must appear in the script only inside a
    single-quoted literal.

Exit 77 (skipped) without gnuplot."""
import importlib.util
import os
import re
import shutil
import subprocess
import tempfile
import unittest

from expkit import plots  # PYTHONPATH: experiments/CMakeLists.txt
import unittest_main

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

BAND = [(1.0, 0.5, 0.4, 0.6), (10.0, 0.7, 0.65, 0.75), (100.0, 0.8, 0.78, 0.82)]
KINDS = {
    "line": lambda png, t, x, y, labels: plots.line_plot(
        png, t, x, y, [(l, [p[:2] for p in BAND]) for l in labels]),
    "band": lambda png, t, x, y, labels: plots.band_plot(
        png, t, x, y, [(l, BAND) for l in labels]),
    "errorbar": lambda png, t, x, y, labels: plots.errorbar_plot(
        png, t, x, y, [(l, BAND) for l in labels]),
}
# What the script may hold of a text: its control characters (a newline would
# end the command) and line separators as spaces.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def tricks(marker):
    """{name: text that, were it gnuplot code, would create `marker`+name}."""
    t = {
        "backtick": "a `touch {m}` b",
        "dollar": "a $(touch {m}) b",
        "macro": "a @foo @GPVAL_PWD b `touch {m}`",
        "system": 'a system("touch {m}") b',
        "single_quote": "a'.system(\"touch {m}\").'b",
        "double_quote": 'a".system("touch {m}")."b',
        "backslash": 'a\\" . system("touch {m}") . "\\',
        "end_backslash": "a \\",
        "newline": "a\n!touch {m}\nb",
        "backslash_newline": "a\\\n!touch {m}\n",
        "cr": "a\r!touch {m}\r",
        "separators": "a\u2028!touch {m}\x85b\x00c",
    }
    t["all"] = "".join(t.values())
    return {k: v.replace("{m}", marker + k) for k, v in t.items()}


def literals(line):
    """(the values of the line's single-quoted gnuplot literals, the line
    with them removed); AssertionError on an unterminated one."""
    vals, rest, i = [], [], 0
    while i < len(line):
        if line[i] != "'":
            rest.append(line[i])
            i += 1
            continue
        j, buf = i + 1, []
        while True:
            k = line.find("'", j)
            if k < 0:
                raise AssertionError("unterminated single quote in: " + line)
            buf.append(line[j:k])
            if line[k + 1:k + 2] == "'":
                buf.append("'")
                j = k + 2
                continue
            i = k + 1
            break
        vals.append("".join(buf))
    return vals, "".join(rest)


def script_literals(tc, gp_text):
    """Every single-quoted literal of the script; fails where anything else
    than gnuplot code of our own (a string of another kind, a backtick, a
    macro, a command of a label's) is outside them."""
    vals, in_block = [], False
    for line in gp_text.split("\n"):
        if in_block:
            if line == "EOD":
                in_block = False
            else:
                tc.assertRegex(line, r"^[-0-9.e+ ]*$", "datablock line")
            continue
        if re.match(r"^\$d\d+ << EOD$", line):
            in_block = True
            continue
        v, rest = literals(line)
        vals += v
        code = re.sub(r", \\$", "", rest)  # the plot command's continuations
        for bad in ('"', "`", "@", "$(", "\\", "touch", "system", "!"):
            tc.assertNotIn(bad, code, "outside single quotes in line %r" % line)
    return vals


def pwned(top):
    return sorted(os.path.join(d, n) for d, _, fs in os.walk(top) for n in fs
                  if n.startswith("PWNED-"))


class PlotsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if not plots.have_gnuplot():
            raise unittest.SkipTest("gnuplot not installed")

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="asyncps_plots_test_")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def check(self, png):
        for path in (png, os.path.splitext(png)[0] + ".gp"):
            self.assertTrue(os.path.exists(path) and os.path.getsize(path) > 0,
                            "missing or empty " + path)

    def test_every_kind_renders(self):
        cases = [
            ("band_log_empty", lambda p: plots.band_plot(
                p, "t", "x", "y", [], logx=True, yrange=("0.6", "0.92"))),
            ("band_log_series_without_points", lambda p: plots.band_plot(
                p, "t", "x", "y", [("a", [])], logx=True)),
            ("errorbar_log_empty", lambda p: plots.errorbar_plot(
                p, "t", "x", "y", [], logx=True, logy=True)),
            ("line_log_empty", lambda p: plots.line_plot(
                p, "t", "x", "y", [], logx=True, logy=True)),
            ("band_log", lambda p: plots.band_plot(
                p, "t", "x", "y", [("a", BAND)], logx=True)),
            ("errorbar", lambda p: plots.errorbar_plot(
                p, "t", "x", "y", [("a", BAND)])),
        ]
        for name, draw in cases:
            with self.subTest(name=name):
                png = os.path.join(self.tmp, name + ".png")
                draw(png)
                self.check(png)
        with open(os.path.join(self.tmp, "band_log.gp")) as f:
            gp = f.read()
        self.assertIn("set logscale x", gp)
        self.assertIn("filledcurves", gp)

    def test_hostile_text_runs_nothing(self):
        marker = os.path.join(self.tmp, "PWNED-")
        # A file name holds no '/': its commands touch relative to the script's
        # folder (gnuplot's working directory), inside self.tmp too. Nor control
        # characters (refused: test_file_name_with_a_newline_is_refused), nor
        # more than 255 bytes.
        file_tricks = {k: _CONTROL.sub("", v)[:200] for k, v in tricks("PWNED-file-").items()}
        seen = set()
        for kind, draw in sorted(KINDS.items()):
            for trick in sorted(tricks("")):
                with self.subTest(kind=kind, trick=trick):
                    out = os.path.join(self.tmp, kind, trick)
                    os.makedirs(out)
                    fields = {f: tricks(marker + kind + "-" + f + "-")[trick]
                              for f in ("title", "xlabel", "ylabel", "key1", "key2")}
                    name = file_tricks[trick] + ".png"
                    png = os.path.join(out, name)
                    gp = draw(png, fields["title"], fields["xlabel"], fields["ylabel"],
                              [fields["key1"], fields["key2"]])
                    self.assertEqual(gp, os.path.join(out, os.path.splitext(name)[0] + ".gp"))
                    self.check(png)
                    # The saved script, opened again (as a user restyling it would).
                    os.remove(png)
                    r = subprocess.run(["gnuplot", "./" + os.path.basename(gp)], cwd=out,
                                       capture_output=True, text=True)
                    self.assertEqual(r.returncode, 0, r.stderr)
                    self.check(png)
                    made = set(pwned(self.tmp)) - seen
                    seen |= made
                    self.assertEqual(sorted(made), [], "commands ran")
                    with open(gp) as f:
                        text = f.read()
                    vals = script_literals(self, text)
                    for f, v in list(fields.items()) + [("file", name)]:
                        self.assertIn(_CONTROL.sub(" ", v), vals, f)
                    self.assertRegex(text, r"\nset title '.*' noenhanced\n")
                    self.assertRegex(text, r"\nset key bottom right noenhanced\n|"
                                           r"\nset key top right noenhanced\n")
        self.assertEqual(sorted(seen), [])

    def test_file_name_with_a_newline_is_refused(self):
        png = os.path.join(self.tmp, "a\n!touch PWNED-nl\n.png")
        with self.assertRaisesRegex(ValueError, "control character"):
            plots.line_plot(png, "t", "x", "y", [("a", [(1, 2), (2, 3)])])
        self.assertEqual(pwned(self.tmp), [])

    def test_monitoring_plot_quotes_its_folder(self):
        spec = importlib.util.spec_from_file_location(
            "monitoring_run", os.path.join(REPO, "experiments", "monitoring", "run.py"))
        run = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(run)
        out = os.path.join(self.tmp, "o'ut \"`touch %s/PWNED-mon`\" @foo "
                           "$(touch %s/PWNED-mon2)" % (self.tmp, self.tmp))
        os.makedirs(out)
        run.plot(out, [(0.0, "samples_per_s", 1.0), (1.0, "samples_per_s", 2.0),
                       (0.0, "train_loss", 1.0), (1.0, "train_loss", 0.5)])
        self.assertGreater(os.path.getsize(os.path.join(out, "series.png")), 0)
        self.assertEqual(pwned(self.tmp), [])
        with open(os.path.join(out, "series.gp.txt")) as f:
            vals = script_literals(self, f.read())
        self.assertIn(os.path.join(out, "series.png"), vals)
        self.assertIn(os.path.join(out, "train_loss.dat"), vals)


if __name__ == "__main__":
    unittest_main.main()
