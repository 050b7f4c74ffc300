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
"""
import sys
import time

COLUMNS = ("wall_s,rank,step,epoch,samples,train_loss,test_acc,bytes_pushed_raw,"
           "bytes_pushed_wire,bytes_pulled,pull_wait_ms,compute_ms,staleness")

_EMPTY_TRAFFIC = {"bytes_pushed_raw": 0, "bytes_pushed_wire": 0, "bytes_pulled": 0,
                  "pull_wait_ns": 0, "last_staleness": -1}


class TrainingLog:
    """Call step() after every training step, evaluated() after an
    evaluation, finish() once at the end. `traffic` is Store.traffic() (or
    ParameterServer.traffic()); None for a run without parameter server."""

    def __init__(self, rank, total_steps, csv_path=None, log_every=200, stream=sys.stderr):
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

    def step(self, step, epoch, batch_size, loss, compute_s, traffic=None):
        """After step `step` (0-based) of `epoch`: loss of the minibatch,
        compute time of forward/backward in seconds."""
        self.samples += batch_size
        self._loss += loss
        self._compute_s += compute_s
        self._n += 1
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
        return s
