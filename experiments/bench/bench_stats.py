"""Summaries of repeated measurements shared by the benchmark drivers of
experiments/bench: every figure is reported as the median and spread of its
repeats, never only the best run."""
import statistics


def spread(values, digits=None, count="repeats"):
    """{"median", "min", "max"} of `values`, rounded to `digits` when given,
    with their number under `count` (none when count is None)."""
    def r(x):
        return x if digits is None else round(x, digits)
    out = {"median": r(statistics.median(values)), "min": r(min(values)),
           "max": r(max(values))}
    if count is not None:
        out[count] = len(values)
    return out
