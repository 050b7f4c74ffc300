"""A Python worker's output, in ps_worker's formats (worker/trainer.h), so
psrun's progress display, summary.json and the experiment scripts read
Python workers exactly like C++ ones:

  - metrics CSV with the columns of kMetricsCsvHeader (COLUMNS below), one
    row per logged step (every `log_every` steps, at evaluations and at the
    last step);
  - a progress line on stderr per logged step:
      [rank R] epoch E step S/T  X samples/s  loss L  test_acc A
  - the SUMMARY line on stdout at the end:
      SUMMARY rank=R final_test_acc=A samples_per_s=X bytes_pushed_raw=N
        bytes_pushed_wire=N bytes_pulled=N steps=N wall_s=S
  - with ASYNCPS_METRICS_PORT set (psrun --metrics does it) or metrics_port
    given, a Prometheus endpoint with ps_worker's families
    (asyncps_worker_*, see worker/worker_metrics.h), fed after every step;
    its port is written to ASYNCPS_METRICS_PORT_FILE when set, and it stays
    up ASYNCPS_METRICS_LINGER_S seconds after finish() for a last scrape.

Evaluations and any other named metric, in one call:

    asyncps.metrics.report(step=1200, test_acc=0.91, test_loss=0.27, bleu=31.2)

appends one row per value (EVAL_COLUMNS: wall_s,rank,step,name,value) to
the rank's evals CSV, `evals-<rank>.csv` beside ASYNCPS_METRICS_CSV (the
psrun run folder; ASYNCPS_EVALS_CSV or path= choose another file), and
prints `EVAL rank=R step=S name=value ...` on stderr. launch/psstudy reads
these rows as the run's curves (a study's `metric` names one of them).
TrainingLog.report() does the same on the log's clock, and a test_acc (or
accuracy) value also fills the test_acc column of ps_worker's metrics CSV
and the progress line, as evaluated() does.
"""
import math
import os
import re
import sys
import time

COLUMNS = ("wall_s,rank,step,epoch,samples,train_loss,test_acc,bytes_pushed_raw,"
           "bytes_pushed_wire,bytes_pulled,pull_wait_ms,compute_ms,staleness")

EVAL_COLUMNS = "wall_s,rank,step,name,value"
_ACC_NAMES = ("test_acc", "accuracy")
_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*$")
_IMPORTED = time.perf_counter()  # report()'s clock: seconds since this import

_EMPTY_TRAFFIC = {"bytes_pushed_raw": 0, "bytes_pushed_wire": 0, "bytes_pulled": 0,
                  "pull_wait_ns": 0, "last_staleness": -1}


def evals_path(environ=None):
    """The evals CSV of this process: ASYNCPS_EVALS_CSV, else evals-<rank>.csv
    in the folder of ASYNCPS_METRICS_CSV (psrun sets it), else None."""
    environ = os.environ if environ is None else environ
    if environ.get("ASYNCPS_EVALS_CSV"):
        return environ["ASYNCPS_EVALS_CSV"]
    metrics_csv = environ.get("ASYNCPS_METRICS_CSV")
    if not metrics_csv:
        return None
    return os.path.join(os.path.dirname(metrics_csv),
                        "evals-%s.csv" % environ.get("ASYNCPS_RANK", "0"))


def _eval_rows(step, values):
    """[(name, float)] of report()'s keyword values; InvalidArgument naming a
    bad one (a name that is not an identifier, a value that is not a number)."""
    from .errors import InvalidArgument
    if not values:
        raise InvalidArgument("report() needs at least one name=value (e.g. test_acc=0.91)")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise InvalidArgument("report(): step must be an integer >= 0, got %r" % (step,))
    rows = []
    for name, v in values.items():
        if not _NAME_RE.match(name):
            raise InvalidArgument("report(): metric name %r is not [A-Za-z_][A-Za-z0-9_.]*" % name)
        try:
            x = float(v)
        except (TypeError, ValueError):
            raise InvalidArgument("report(): %s=%r is not a number" % (name, v)) from None
        rows.append((name, x))
    return rows


def _append_evals(path, wall_s, rank, step, rows, stream):
    stream.write("EVAL rank=%s step=%d %s\n" % (rank, step, " ".join(
        "%s=%.6g" % (n, x) for n, x in rows)))
    stream.flush()
    if not path:
        return
    new = not os.path.exists(path) or os.path.getsize(path) == 0
    with open(path, "a") as f:
        if new:
            f.write(EVAL_COLUMNS + "\n")
        for n, x in rows:
            f.write("%.3f,%s,%d,%s,%s\n" % (wall_s, rank, step, n,
                                           repr(x) if math.isfinite(x) else "nan"))


def report(step, wall_s=None, rank=None, path=None, stream=None, environ=None, **values):
    """Records an evaluation, or any named metric, at training step `step`:
    report(step=s, test_acc=0.91, test_loss=0.27). One row per value in the
    evals CSV (evals_path(), or `path`), wall_s = seconds since asyncps.metrics
    was imported unless given; rank from ASYNCPS_RANK unless given. Raises
    asyncps.InvalidArgument naming a bad name or value; returns the rows."""
    environ = os.environ if environ is None else environ
    rows = _eval_rows(step, values)
    wall = time.perf_counter() - _IMPORTED if wall_s is None else float(wall_s)
    rank = environ.get("ASYNCPS_RANK", "0") if rank is None else rank
    _append_evals(path or evals_path(environ), wall, rank, step, rows,
                  sys.stderr if stream is None else stream)
    return rows


class TrainingLog:
    """Call step() after every training step, evaluated() after an
    evaluation, finish() once at the end. `traffic` is Store.traffic() (or
    ParameterServer.traffic()); None for a run without parameter server."""

    def __init__(self, rank, total_steps, csv_path=None, log_every=200, stream=sys.stderr,
                 metrics_port=None, environ=None):
        environ = os.environ if environ is None else environ
        self.exporter = None
        self.linger_s = float(environ.get("ASYNCPS_METRICS_LINGER_S", "0") or 0)
        if metrics_port is None and environ.get("ASYNCPS_METRICS_PORT"):
            metrics_port = int(environ["ASYNCPS_METRICS_PORT"])
        if metrics_port:  # -1: any free port, as ps_worker's flag
            from ._asyncps import MetricsExporter
            self.exporter = MetricsExporter(
                port=max(0, metrics_port), bind=environ.get("ASYNCPS_METRICS_BIND", "127.0.0.1"),
                port_file=environ.get("ASYNCPS_METRICS_PORT_FILE", ""))
        self.rank = rank
        self.total_steps = total_steps
        self.log_every = log_every
        self.stream = stream
        self.start = time.perf_counter()
        self.csv = open(csv_path, "w") if csv_path else None
        if self.csv:
            self.csv.write(COLUMNS + "\n")
        self.samples = 0
        self.eval_s = 0.0
        self.last_acc = -1.0
        self._pending_acc = None
        self._loss = 0.0
        self._compute_s = 0.0
        self._n = 0
        self._last_log = self.start
        self._last_log_samples = 0
        self._last_log_eval_s = 0.0
        self.final_train_loss = None

    def evaluated(self, accuracy, seconds):
        """Records an evaluation (accuracy in [0, 1]) that took `seconds`."""
        self.last_acc = accuracy
        self._pending_acc = accuracy
        self.eval_s += seconds
        if self.exporter:
            self.exporter.on_eval(accuracy)

    def report(self, step, eval_s=0.0, path=None, environ=None, **values):
        """report() on this log's clock (wall_s from its start) and rank; a
        test_acc (or accuracy) value is also recorded as evaluated(value,
        eval_s) for the metrics CSV's test_acc column."""
        rows = _eval_rows(step, values)
        environ = os.environ if environ is None else environ
        _append_evals(path or evals_path(environ), time.perf_counter() - self.start, self.rank,
                      step, rows, self.stream)
        for name in _ACC_NAMES:
            if name in values:
                self.evaluated(float(values[name]), eval_s)
                break
        return rows

    def step(self, step, epoch, batch_size, loss, compute_s, traffic=None):
        """After step `step` (0-based) of `epoch`: loss of the minibatch,
        compute time of forward/backward in seconds."""
        self.samples += batch_size
        self._loss += loss
        self._compute_s += compute_s
        self._n += 1
        if self.exporter:
            self.exporter.on_step(loss, batch_size, compute_s, traffic)
        last = step + 1 == self.total_steps
        log = last or (self.log_every > 0 and (step + 1) % self.log_every == 0)
        if not (log or self._pending_acc is not None):
            return
        now = time.perf_counter()
        t = traffic or _EMPTY_TRAFFIC
        mean_loss = self._loss / max(self._n, 1)
        self.final_train_loss = mean_loss
        if self.csv:
            acc = "%.4f" % self._pending_acc if self._pending_acc is not None else ""
            self.csv.write("%.3f,%d,%d,%d,%d,%.6f,%s,%d,%d,%d,%.3f,%.4f,%d\n" % (
                now - self.start, self.rank, step + 1, epoch, self.samples, mean_loss, acc,
                t["bytes_pushed_raw"], t["bytes_pushed_wire"], t["bytes_pulled"],
                t["pull_wait_ns"] / 1e6, 1e3 * self._compute_s / max(self._n, 1),
                t["last_staleness"]))
            if last:
                self.csv.flush()
        if log:
            dt = (now - self._last_log) - (self.eval_s - self._last_log_eval_s)
            sps = (self.samples - self._last_log_samples) / dt if dt > 0 else 0.0
            acc = "-" if self.last_acc < 0 else ("%f" % self.last_acc)[:6]
            self.stream.write("[rank %d] epoch %d step %d/%d  %.0f samples/s  loss %.4f  "
                              "test_acc %s\n" % (self.rank, epoch, step + 1, self.total_steps,
                                                 sps, mean_loss, acc))
            self.stream.flush()
            self._last_log = now
            self._last_log_samples = self.samples
            self._last_log_eval_s = self.eval_s
        self._pending_acc = None
        self._loss = self._compute_s = 0.0
        self._n = 0

    def finish(self, steps, traffic=None, out=sys.stdout):
        """Prints the SUMMARY line; returns it as a dict."""
        wall = time.perf_counter() - self.start
        train_s = wall - self.eval_s
        t = traffic or _EMPTY_TRAFFIC
        s = {"rank": self.rank, "final_test_acc": self.last_acc,
             "samples_per_s": self.samples / train_s if train_s > 0 else 0.0,
             "bytes_pushed_raw": t["bytes_pushed_raw"],
             "bytes_pushed_wire": t["bytes_pushed_wire"], "bytes_pulled": t["bytes_pulled"],
             "steps": steps, "wall_s": wall}
        out.write("SUMMARY rank=%d final_test_acc=%.4f samples_per_s=%.1f bytes_pushed_raw=%d "
                  "bytes_pushed_wire=%d bytes_pulled=%d steps=%d wall_s=%.3f\n" % (
                      s["rank"], s["final_test_acc"], s["samples_per_s"], s["bytes_pushed_raw"],
                      s["bytes_pushed_wire"], s["bytes_pulled"], s["steps"], s["wall_s"]))
        out.flush()
        if self.csv:
            self.csv.close()
            self.csv = None
        if self.exporter and self.linger_s > 0:
            time.sleep(self.linger_s)  # the final values, for one more scrape
        return s
