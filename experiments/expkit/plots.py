"""gnuplot plots: each PNG comes with the self-contained .gp script (data
inlined as datablocks) that draws it, so a figure can be restyled by hand."""
import os
import shutil
import subprocess


def have_gnuplot():
    return shutil.which("gnuplot") is not None


def _q(s):
    return '"' + str(s).replace("\\", "\\\\").replace('"', '\\"') + '"'


def line_plot(png, title, xlabel, ylabel, series, logx=False, yrange=None,
              points=True, key="bottom right"):
    """series: [(label, [(x, y), ...])]. Writes png[:-4] + '.gp' and runs it.

    Returns the .gp path; raises RuntimeError if gnuplot fails.
    """
    gp = os.path.splitext(png)[0] + ".gp"
    lines = ["set terminal pngcairo size 900,560 enhanced font 'sans,10'"
             if _has_cairo() else "set terminal png size 900,560",
             "set output " + _q(os.path.basename(png)),
             "set title " + _q(title) + " noenhanced",
             "set xlabel " + _q(xlabel), "set ylabel " + _q(ylabel),
             "set grid", "set key " + key + " noenhanced"]
    if logx:
        lines.append("set logscale x")
    if yrange:
        lines.append("set yrange [%s:%s]" % yrange)
    plots = []
    for i, (label, pts) in enumerate(series):
        pts = [(x, y) for x, y in pts
               if x is not None and y is not None and (not logx or x > 0)]
        if not pts:
            continue
        lines.append("$d%d << EOD" % i)
        lines += ["%r %r" % (float(x), float(y)) for x, y in pts]
        lines.append("EOD")
        style = "linespoints pt 7 ps 0.6" if points else "lines"
        plots.append("$d%d using 1:2 with %s lw 2 title %s" %
                     (i, style, _q(label)))
    if not plots:
        lines.append("set label 1 'no data' at graph 0.5,0.5 center")
        lines.append("plot [0:1] [0:1] NaN notitle")
    else:
        lines.append("plot " + ", \\\n     ".join(plots))
    with open(gp, "w") as f:
        f.write("\n".join(lines) + "\n")
    r = subprocess.run(["gnuplot", os.path.basename(gp)],
                       cwd=os.path.dirname(os.path.abspath(gp)),
                       capture_output=True, text=True)
    if r.returncode != 0 or not os.path.exists(png):
        raise RuntimeError("gnuplot %s failed: %s" % (gp, r.stderr[-2000:]))
    return gp


_CAIRO = None


def _has_cairo():
    global _CAIRO
    if _CAIRO is None:
        r = subprocess.run(["gnuplot", "-e", "set terminal"],
                           capture_output=True, text=True)
        _CAIRO = "pngcairo" in (r.stdout + r.stderr)
    return _CAIRO
