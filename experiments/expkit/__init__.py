"""Shared code of the asyncps studies (experiments/*/run.py, report.py).

fleet   : runs one training job (ps_server shards + ps_worker ranks + ps_ctl
          stats) with per-rank worker flags, optionally inside a network
          namespace whose loopback is rate-limited with tc.
metrics : reads the workers' metrics CSVs and summary lines into one row.
plots   : writes gnuplot scripts (.gp) and renders them to PNG.
table   : CSV/Markdown helpers.

Python 3 standard library only.
"""
