#!/usr/bin/env python3
"""experiments/expkit/plots.py: every plot kind renders a PNG and its .gp,
including the 'no data' frame of a log-scaled plot (a study run with --only
has no straggler curves; gnuplot refused [0:1] on a log axis and the
sync-vs-async study died drawing its empty straggler plot).

Exit 77 (skipped) without gnuplot."""
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(
    os.path.dirname(os.path.abspath(__file__)))), "experiments"))

from expkit import plots  # noqa: E402


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def check(png):
    for path in (png, os.path.splitext(png)[0] + ".gp"):
        if not os.path.exists(path) or os.path.getsize(path) == 0:
            fail("missing or empty " + path)


def main():
    if not plots.have_gnuplot():
        print("SKIP: gnuplot not installed")
        return 77
    tmp = tempfile.mkdtemp(prefix="asyncps_plots_test_")
    try:
        band = [(1.0, 0.5, 0.4, 0.6), (10.0, 0.7, 0.65, 0.75),
                (100.0, 0.8, 0.78, 0.82)]
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
                p, "t", "x", "y", [("a", band)], logx=True)),
            ("errorbar", lambda p: plots.errorbar_plot(
                p, "t", "x", "y", [("a", band)])),
        ]
        for name, draw in cases:
            png = os.path.join(tmp, name + ".png")
            try:
                draw(png)
            except RuntimeError as e:
                fail("%s: %s" % (name, e))
            check(png)
        gp = open(os.path.join(tmp, "band_log.gp")).read()
        if "set logscale x" not in gp or "filledcurves" not in gp:
            fail("band_log.gp lacks its log axis or band:\n" + gp)
        print("PASS")
        return 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
