"""Shared code of the asyncps studies (experiments/*/run.py, report.py).

fleet   : runs one training job (ps_server shards + ps_worker ranks + ps_ctl
          stats) with per-rank worker flags, optionally inside a network
          namespace whose loopback is rate-limited with tc.
metrics : reads the workers' metrics CSVs and summary lines into one row.
plots   : writes gnuplot scripts (.gp) and renders them to PNG.
stats   : means, 95% t-intervals, Welch differences, verdicts.
study   : CLI options, curve extraction, CSV IO of the study scripts.

metrics, plots and stats live in launch/psstudy_lib/, shared with
launch/psstudy (one copy of the definitions and statistics for these studies
and for any user's study): this package makes them its submodules, so
`from expkit import stats` and `import expkit.stats` get those modules.

Import roots. expkit needs two folders on sys.path: experiments/ (expkit) and
launch/ (pslaunch, psstudy_lib); no module of expkit, pslaunch or psstudy_lib
edits sys.path, and ctest gives the tests these folders through PYTHONPATH. A
script run as a file from a checkout (experiments/<study>/run.py, report.py,
the benchmarks) gets only its own folder from Python, so it puts the other
folders it imports from (launch/, experiments/, worker/python/examples for an
example's model) in front of sys.path in one statement at its top: that keeps
every command `python3 experiments/...` as it is, with nothing installed.

Python 3 standard library only.
"""
import sys

from psstudy_lib import metrics, plots, stats

for _m in (metrics, plots, stats):
    sys.modules[__name__ + "." + _m.__name__.rsplit(".", 1)[1]] = _m
