"""psstudy: a grid of asyncps training runs through psrun, with a report.

One layer per module, lowest first:
  stats    means, Student-t / Welch 95% intervals, verdicts (shared with
           experiments/report.py through experiments/expkit)
  metrics  the figures of one finished run (time to target, idle fraction,
           staleness, bytes), shared with experiments/expkit likewise
  plots    gnuplot PNGs with their .gp scripts (shared likewise)
  grid     the study file: keys, validation, the configurations it expands to
  rankwrap the worker wrapper that slows one rank (straggler injection)
  execute  one (configuration, seed) through psrun: resumable, a result.json
  collect  a finished run folder -> one runs.csv row and its curves
  report   runs.csv, curves.csv, summary.csv, PNGs and REPORT.md
  cli      launch/psstudy's command line

Python 3 standard library only (gnuplot for the plots), like psrun.
"""
