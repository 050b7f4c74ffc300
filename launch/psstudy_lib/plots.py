"""gnuplot plots: each PNG comes with the self-contained .gp script (data
inlined as datablocks) that draws it, so a figure can be restyled by hand.

line_plot draws curves; band_plot draws the mean of several seeds' curves
over a shaded 95% t-band; errorbar_plot draws means with 95% error bars.

Text (titles, labels, legend entries, file names: a study's or a
configuration's name among them) reaches a script only through quote():
gnuplot runs backticked text as a shell command even inside a double-quoted
string, so a study named with one ran it, and again whenever its .gp was
opened."""
import os
import re
import shutil
import subprocess

# A newline would end the command (the rest of the text would be the next
# one); the others are no text either. U+0085, U+2028 and U+2029 end lines
# for some readers of the script.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def have_gnuplot():
    return shutil.which("gnuplot") is not None


def quote(text):
    """text (str() of it) as a gnuplot string literal that stands for the
    text itself: single-quoted, where gnuplot expands no backticks, @macros
    or backslash escapes and a quote is written twice; control characters
    (newlines) become spaces."""
    return "'" + _CONTROL.sub(" ", str(text)).replace("'", "''") + "'"


def _header(png, title, xlabel, ylabel, logx, yrange, key, logy=False):
    lines = ["set terminal pngcairo size 900,560 enhanced font 'sans,10'"
             if _has_cairo() else "set terminal png size 900,560",
             "set output " + quote(os.path.basename(png)),
             "set title " + quote(title) + " noenhanced",
             "set xlabel " + quote(xlabel), "set ylabel " + quote(ylabel),
             "set grid", "set key " + key + " noenhanced"]
    if logx:
        lines.append("set logscale x")
    if logy:
        lines.append("set logscale y")
    if yrange:
        lines.append("set yrange [%s:%s]" % yrange)
    return lines


def _render(png, lines, plots):
    """Appends the plot command (or a 'no data' frame), writes the .gp next
    to png and runs gnuplot; RuntimeError if it fails."""
    gp = os.path.splitext(png)[0] + ".gp"
    if _CONTROL.search(os.path.basename(png)):
        raise ValueError("%r: a control character in a plot's file name (gnuplot "
                         "cannot be given it)" % png)
    if not plots:
        # [0:1] is not a range a log axis can take.
        lines.append("unset logscale")
        lines.append("set label 1 %s at graph 0.5,0.5 center" % quote("no data"))
        lines.append("plot [0:1] [0:1] NaN notitle")
    else:
        lines.append("plot " + ", \\\n     ".join(plots))
    with open(gp, "w") as f:
        f.write("\n".join(lines) + "\n")
    # "./": a name starting with '-' is no option.
    r = subprocess.run(["gnuplot", "./" + os.path.basename(gp)],
                       cwd=os.path.dirname(os.path.abspath(gp)),
                       capture_output=True, text=True)
    if r.returncode != 0 or not os.path.exists(png):
        raise RuntimeError("gnuplot %s failed: %s" % (gp, r.stderr[-2000:]))
    return gp


def _block(lines, i, rows, logx):
    rows = [r for r in rows if all(v is not None for v in r) and
            (not logx or r[0] > 0)]
    if not rows:
        return False
    lines.append("$d%d << EOD" % i)
    lines += [" ".join(repr(float(v)) for v in r) for r in rows]
    lines.append("EOD")
    return True


def line_plot(png, title, xlabel, ylabel, series, logx=False, yrange=None,
              points=True, key="bottom right", logy=False):
    """series: [(label, [(x, y), ...])]. Writes png[:-4] + '.gp' and runs it.

    Returns the .gp path; raises RuntimeError if gnuplot fails.
    """
    lines = _header(png, title, xlabel, ylabel, logx, yrange, key, logy)
    plots = []
    for i, (label, pts) in enumerate(series):
        if not _block(lines, i, pts, logx):
            continue
        style = "linespoints pt 7 ps 0.6" if points else "lines"
        plots.append("$d%d using 1:2 with %s lw 2 lc %d title %s" %
                     (i, style, i + 1, quote(label)))
    return _render(png, lines, plots)


def band_plot(png, title, xlabel, ylabel, series, logx=False, yrange=None,
              key="bottom right"):
    """series: [(label, [(x, mean, lo, hi), ...])]: each mean as a line over
    its shaded band (lo..hi)."""
    lines = _header(png, title, xlabel, ylabel, logx, yrange, key)
    plots = []
    for i, (label, pts) in enumerate(series):
        if not _block(lines, i, [p[:4] for p in pts], logx):
            continue
        plots.append("$d%d using 1:3:4 with filledcurves fs transparent "
                     "solid 0.18 noborder lc %d notitle" % (i, i + 1))
        plots.append("$d%d using 1:2 with lines lw 2 lc %d title %s" %
                     (i, i + 1, quote(label)))
    return _render(png, lines, plots)


def errorbar_plot(png, title, xlabel, ylabel, series, logx=False,
                  yrange=None, key="top right", logy=False, lines_too=True,
                  extra=()):
    """series: [(label, [(x, y, lo, hi), ...])]: points with error bars
    (joined by lines when lines_too). extra: more gnuplot set commands
    (e.g. 'set xrange [0.5:3.5]'; code: any text in them through quote())."""
    lines = _header(png, title, xlabel, ylabel, logx, yrange, key, logy)
    lines += list(extra)
    plots = []
    for i, (label, pts) in enumerate(series):
        if not _block(lines, i, [p[:4] for p in pts], logx):
            continue
        style = "yerrorlines" if lines_too else "yerrorbars"
        plots.append("$d%d using 1:2:3:4 with %s lw 2 pt 7 ps 0.8 lc %d "
                     "title %s" % (i, style, i + 1, quote(label)))
    return _render(png, lines, plots)


_CAIRO = None


def _has_cairo():
    global _CAIRO
    if _CAIRO is None:
        r = subprocess.run(["gnuplot", "-e", "set terminal"],
                           capture_output=True, text=True)
        _CAIRO = "pngcairo" in (r.stdout + r.stderr)
    return _CAIRO
