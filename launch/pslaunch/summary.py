"""The run summary (from the workers' SUMMARY lines) and the progress display."""
import json
import os
import re
import sys
import time

_SUMMARY_RE = re.compile(r"^SUMMARY (.*)$", re.M)
_PROGRESS_RE = re.compile(
    r"\[rank (\d+)\] epoch (\d+) step (\d+)/(\d+)\s+(\S+) samples/s\s+loss (\S+)\s+test_acc (\S+)")


def _read(path, max_bytes=1 << 20):
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - max_bytes))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def parse_summary_line(text):
    """The last SUMMARY line of a worker's output as a dict of numbers, or None."""
    last = None
    for m in _SUMMARY_RE.finditer(text):
        last = m.group(1)
    if last is None:
        return None
    out = {}
    for kv in last.split():
        if "=" in kv:
            k, v = kv.split("=", 1)
            try:
                out[k] = int(v)
            except ValueError:
                try:
                    out[k] = float(v)
                except ValueError:
                    out[k] = v
    return out


def aggregate(worker_summaries, wall_s):
    """Fleet totals from {rank: summary dict}."""
    s = list(worker_summaries.values())
    accs = [w.get("final_test_acc", -1) for w in s if w.get("final_test_acc", -1) >= 0]
    raw = sum(w.get("bytes_pushed_raw", 0) for w in s)
    wire = sum(w.get("bytes_pushed_wire", 0) for w in s)
    return {
        "final_test_acc": accs[0] if accs else None,
        "samples_per_s": round(sum(w.get("samples_per_s", 0) for w in s), 1),
        "steps": sum(w.get("steps", 0) for w in s),
        "bytes_pushed_raw": raw,
        "bytes_pushed_wire": wire,
        "bytes_pulled": sum(w.get("bytes_pulled", 0) for w in s),
        "compression_ratio": round(raw / wire, 2) if wire else None,
        "wall_s": round(wall_s, 2),
        "workers_reported": len(s),
    }


def human_bytes(n):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return "%.1f %s" % (n, unit) if unit != "B" else "%d B" % n
        n /= 1024.0


def format_summary(summary):
    lines = ["psrun: %s  (%s)" % ("OK" if summary.get("ok") else "FAILED", summary["run_dir"])]
    t = summary.get("totals")
    if t:
        acc = t["final_test_acc"]
        lines.append("  final test accuracy : %s" % ("%.4f" % acc if acc is not None else "n/a"))
        lines.append("  samples/s (total)   : %.1f" % t["samples_per_s"])
        lines.append("  bytes pushed        : %s raw, %s on the wire" %
                     (human_bytes(t["bytes_pushed_raw"]), human_bytes(t["bytes_pushed_wire"])))
        lines.append("  bytes pulled        : %s" % human_bytes(t["bytes_pulled"]))
        cr = t["compression_ratio"]
        lines.append("  compression ratio   : %s" % ("%.2fx" % cr if cr else "n/a"))
        lines.append("  wall time           : %.1f s" % t["wall_s"])
    mon = summary.get("monitoring")
    if mon:
        lines.append("  metrics targets     : %s" % mon["targets_file"])
        if mon.get("prometheus_data"):
            lines.append("  prometheus data     : %s" % mon["prometheus_data"])
            lines.append("  view it             : %s  (then open the URL it prints)" % mon["view"])
    if summary.get("restarts"):
        lines.append("  restarts            : %s" % ", ".join(
            "%s x%d" % (k, v) for k, v in sorted(summary["restarts"].items())))
    for f in summary.get("failures", []):
        lines.append("  FAILED %s: %s" % (f["name"], f["reason"]))
        if f.get("log"):
            lines.append("    log: %s" % f["log"])
        for tl in (f.get("log_tail") or "").splitlines():
            lines.append("    | " + tl)
    return "\n".join(lines)


def write_json(path, obj):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=2, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)


class Progress:
    """Prints one progress line every `interval` seconds from the workers' logs."""

    def __init__(self, log_paths, interval=2.0, stream=sys.stdout):
        self.log_paths = log_paths
        self.interval = interval
        self.stream = stream
        self.start = time.time()
        self.last = 0.0
        self.tty = stream.isatty()

    def update(self, force=False):
        now = time.time()
        if not force and now - self.last < self.interval:
            return
        self.last = now
        ranks = {}
        for path in self.log_paths:
            text = _read(path, 8192)
            m = None
            for m in _PROGRESS_RE.finditer(text):
                pass
            if m:
                ranks[int(m.group(1))] = m
        if not ranks:
            line = "[%6.1fs] starting %d workers..." % (now - self.start, len(self.log_paths))
        else:
            done = sum(int(m.group(3)) for m in ranks.values())
            total = sum(int(m.group(4)) for m in ranks.values())
            sps = sum(float(m.group(5)) for m in ranks.values())
            r0 = ranks.get(0) or next(iter(ranks.values()))
            pct = 100.0 * done / total if total else 0
            line = "[%6.1fs] steps %d/%d (%3.0f%%)  epoch %s  %.0f samples/s  loss %s  test_acc %s" % (
                now - self.start, done, total, pct, r0.group(2), sps, r0.group(6), r0.group(7))
        if self.tty:
            self.stream.write("\r" + line.ljust(100))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def finish(self):
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()
