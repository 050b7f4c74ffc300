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

Python 3 standard library only.
"""
import os
import sys

_LAUNCH = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "launch")
if _LAUNCH not in sys.path:
    sys.path.insert(0, _LAUNCH)

from psstudy_lib import metrics, plots, stats  # noqa: E402

for _m in (metrics, plots, stats):
    sys.modules[__name__ + "." + _m.__name__.rsplit(".", 1)[1]] = _m
