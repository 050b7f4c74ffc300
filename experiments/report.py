#!/usr/bin/env python3
"""Regenerates RESULTS/REPORT.md (tables, plots, verdicts on published
claims) from the studies' CSVs; runs nothing but gnuplot.

  experiments/report.py [--results DIR]     (default experiments/results)

Reads DIR/sync_vs_async/{summary,curves}.csv and
DIR/compression_study/{summary,curves,targets}.csv, redraws their PNGs and
writes DIR/REPORT.md. A study whose CSVs are missing is reported as missing.
"""
import argparse
import datetime
import os
import platform
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from expkit import metrics  # noqa: E402

sys.path.insert(0, os.path.join(HERE, "sync_vs_async"))
sys.path.insert(0, os.path.join(HERE, "compression_study"))
import importlib.util  # noqa: E402


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


sync_mod = _load("sync_run", os.path.join(HERE, "sync_vs_async", "run.py"))
comp_mod = _load("comp_run", os.path.join(HERE, "compression_study",
                                          "run.py"))


def f(v):
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def cell(v, digits=3, pct=False, empty="not reached"):
    x = f(v)
    if x is None:
        return empty if v in ("", None) else str(v)
    if pct:
        return "%.1f%%" % (100 * x)
    if abs(x) >= 1e6:
        return "%.3g" % x
    if x.is_integer():
        return str(int(x))
    return ("%%.%df" % digits) % x


def table(header, rows):
    out = ["| " + " | ".join(header) + " |",
           "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def budget(path):
    try:
        return open(path).read().strip()
    except OSError:
        return "(no budget.txt)"


def avg3(d):
    """{run: mean of rank 0's last 3 evaluations} from d/curves.csv."""
    by = {}
    for c in metrics.read_csv(os.path.join(d, "curves.csv")):
        by.setdefault(c["run"], []).append((0, 0, float(c["test_acc"])))
    return {k: metrics.last_mean(v) for k, v in by.items()}


# ----------------------------------------------------------------- sync
def sync_section(d):
    rows = metrics.read_csv(os.path.join(d, "summary.csv"))
    if not rows:
        return ["## Sync vs async\n\nNo results (run "
                "`experiments/sync_vs_async/run.py`).\n"], []
    sync_mod.make_plots(d)
    a3 = avg3(d)
    for r in rows:
        r["final_acc_avg3"] = a3.get(r["run"])
    md = ["## Sync vs async (BSP / SSP / ASP)", "",
          "4 workers, 1 shard, MLP 784-256-128-10 on Fashion-MNIST, batch "
          "%d per worker, %s epochs per worker, server SGD (lr %g for "
          "SSP/ASP, %g = 4 x %g for BSP, whose one update averages 4 "
          "gradients), seed 1. Straggler: rank %d with `--slowdown=%g`. "
          "Rank 0 evaluates on the 10,000 test images every %d steps." % (
              sync_mod.PRESETS["full"]["batch"], rows[0]["epochs"],
              sync_mod.LR_ASYNC, sync_mod.LR_BSP, sync_mod.LR_ASYNC,
              sync_mod.STRAGGLER_RANK, sync_mod.SLOWDOWN,
              sync_mod.PRESETS["full"]["eval_every"]),
          "", "Budget: `%s`" % budget(os.path.join(d, "budget.txt")), ""]
    hdr = ["run", "status", "time to 0.85 (s)", "final acc",
           "mean of last 3 evals", "best acc",
           "idle frac (mean)", "idle min..max", "staleness p50", "p99",
           "max", "updates", "updates/s", "train wall (s)"]
    md.append(table(hdr, [[
        r["run"], r.get("status", "ok"), cell(r["time_to_target_s"], 2),
        cell(r["final_acc"], 4), cell(r["final_acc_avg3"], 4),
        cell(r["max_acc"], 4), cell(r["idle_frac"], pct=True),
        "%s..%s" % (cell(r["idle_frac_min"], pct=True),
                    cell(r["idle_frac_max"], pct=True)),
        cell(r["staleness_p50"]), cell(r["staleness_p99"]),
        cell(r["staleness_max"]), cell(r["updates"]),
        cell(r["updates_per_s"], 1), cell(r["wall_s"], 2)] for r in rows]))
    md += ["", "Staleness = shard version at apply minus the version the "
           "worker last read (all 4 pushes of a clock count, so ASP/SSP "
           "staleness of ~W-1 per clock is normal); updates = model "
           "versions applied by the shard (BSP: one per round of 4 "
           "gradients).", "",
           "![acc vs time](sync_vs_async/acc_vs_time.png)",
           "![acc vs time, straggler](sync_vs_async/acc_vs_time_straggler.png)",
           "![acc vs updates](sync_vs_async/acc_vs_updates.png)",
           "![acc vs updates, straggler]"
           "(sync_vs_async/acc_vs_updates_straggler.png)",
           "![idle vs s](sync_vs_async/idle_vs_staleness.png)", ""]
    return md, rows


# ---------------------------------------------------------- compression
def comp_section(d):
    rows = metrics.read_csv(os.path.join(d, "summary.csv"))
    if not rows:
        return ["## Compression\n\nNo results (run "
                "`experiments/compression_study/run.py`).\n"], [], []
    comp_mod.make_plots(d)
    a3 = avg3(d)
    for r in rows:
        r["final_acc_avg3"] = a3.get(r["run"])
    tg = metrics.read_csv(os.path.join(d, "targets.csv"))
    md = ["## Gradient compression", "",
          "4 workers, 1 shard, SSP s=2, server SGD lr 0.1 (the DGC run: "
          "0.01, see below), batch 64, seed 1, same epochs per codec. "
          "`fast` = unshaped loopback; the shaped link is a network "
          "namespace whose loopback is limited with `tc tbf` (all traffic "
          "of the fleet shares it; pulls int8 there for every codec). Wire "
          "ratio = raw fp32 bytes / bytes on the wire (indices, scales and "
          "uncompressed small tensors included), pushes only.", "",
          "Budget: `%s`" % budget(os.path.join(d, "budget.txt")), ""]
    hdr = ["run", "link", "codec", "status", "epochs", "wire ratio",
           "MB pushed / epoch", "encode ms/step", "final acc",
           "mean of last 3 evals", "best acc",
           "time to 0.85 (s)", "train wall (s)", "samples/s"]
    md.append(table(hdr, [[
        r["run"], r["link"], "`%s`" % r["codec"], r["status"], r["epochs"],
        cell(r["wire_ratio"], 1),
        cell(f(r["bytes_pushed_per_epoch"]) / 1e6
             if f(r["bytes_pushed_per_epoch"]) else None, 2, empty=""),
        cell(r["encode_ms_per_step"], 3, empty="n/a"),
        cell(r["final_acc"], 4), cell(r["final_acc_avg3"], 4),
        cell(r["max_acc"], 4),
        cell(r["time_to_target_s"], 2), cell(r["wall_s"], 2),
        cell(r["samples_per_s"], 0)] for r in rows]))
    md += ["", "DGC (`topk01_ef_dgc`): momentum correction on the worker "
           "(momentum 0.9) scales the step by 10, so its server lr is 0.01 "
           "for the same effective step (lr 0.1 diverged in calibration).",
           ""]
    if tg:
        md += ["### Issue-4 convergence targets (fast link, same epochs)", "",
               "Accuracy = mean of rank 0's last 3 evaluations (single "
               "evaluations swing by a few points at a constant lr).", ""]
        md.append(table(
            ["codec", "acc (last 3)", "uncompressed (last 3)",
             "drop (points)", "allowed", "push bytes reduction", "required",
             "verdict"],
            [["`%s`" % t["codec"],
              cell(t.get("final_acc_avg3", t.get("final_acc")), 4),
              cell(t.get("none_final_acc_avg3", t.get("none_final_acc")), 4),
              cell(t["drop_points"], 2),
              cell(t["max_drop_points"], 1),
              cell(t["push_reduction"], 1, empty="-"),
              cell(t["min_push_reduction"], 0, empty="-"), t["verdict"]]
             for t in tg]))
        md.append("")
    md += ["![acc vs bytes](compression_study/acc_vs_bytes.png)",
           "![acc vs time](compression_study/acc_vs_time.png)"]
    if any(r["link"] != "fast" for r in rows):
        md += ["![acc vs bytes, slow](compression_study/acc_vs_bytes_slow.png)",
               "![acc vs time, slow](compression_study/acc_vs_time_slow.png)"]
    md.append("")
    return md, rows, tg


# --------------------------------------------------------------- claims
def claims(sync, comp):
    out = ["## Published claims: do our runs reproduce them?", "",
           "Single runs (one seed) on 2 shared CPU cores: differences under "
           "~10% in time are within run-to-run noise here.", ""]
    by = {r["run"]: r for r in sync}

    def tta(run):
        r = by.get(run)
        return f(r["time_to_target_s"]) if r else None

    # 1. Cui et al.
    if sync:
        parts = []
        verdicts = []
        for tag, label in (("_straggler", "with a straggler"),
                           ("", "without a straggler")):
            b = tta("bsp" + tag)
            ssp = [(s, tta("ssp%d%s" % (s, tag))) for s in (1, 4, 16)]
            reached = [(s, t) for s, t in ssp if t is not None]
            best = min(reached, key=lambda x: x[1]) if reached else None
            txt = "%s: BSP %s s; SSP %s" % (
                label, cell(b, 2), ", ".join(
                    "s=%d %s s" % (s, cell(t, 2)) for s, t in ssp))
            if tag:
                ok = best is not None and (b is None or best[1] < 0.9 * b)
            else:
                ok = best is not None and b is not None and \
                    abs(best[1] - b) <= 0.2 * b
                if best is not None and b is not None and not ok:
                    txt += " (best SSP / BSP = %.2f)" % (best[1] / b)
            verdicts.append(ok)
            parts.append(txt)
        v = "reproduced" if all(verdicts) else (
            "partly reproduced" if any(verdicts) else "not reproduced")
        out += ["**1. SSP beats BSP in time to accuracy with a straggler, and "
                "is about equal without (Cui et al., ATC'14): %s.**" % v, "",
                "Time to 0.85 test accuracy: " + "; ".join(parts) + ". "
                "Criterion: with the straggler, the best SSP at least 10% "
                "faster than BSP (or BSP never reaching 0.85); without, "
                "within 20% of BSP.", ""]
        # 2. Li et al.
        lines = []
        vs = []
        for tag, label in (("", "no straggler"), ("_straggler", "straggler")):
            seq = [("0 (BSP)", by.get("bsp" + tag))] + [
                (str(s), by.get("ssp%d%s" % (s, tag))) for s in (1, 4, 16)]
            seq = [(k, f(r["idle_frac"])) for k, r in seq if r]
            vals = [x for _, x in seq if x is not None]
            mono = all(b <= a + 0.02 for a, b in zip(vals, vals[1:]))
            falls = len(vals) >= 2 and vals[-1] < vals[0] - 0.02
            vs.append(mono and falls)
            lines.append("%s: %s" % (label, ", ".join(
                "s=%s %s" % (k, cell(x, pct=True)) for k, x in seq)))
            a = by.get("asp" + tag)
            if a:
                lines[-1] += ", ASP %s" % cell(a["idle_frac"], pct=True)
        v = "reproduced" if all(vs) else (
            "partly reproduced" if any(vs) else "not reproduced")
        out += ["**2. Worker idle time falls as the staleness bound grows "
                "(Li et al., OSDI'14: 50%% at bound 0, 1.7%% at 16): %s "
                "(trend); the magnitudes differ.**" % v, "",
                "Idle fraction (pull wait / wall, mean of 4 workers): " +
                "; ".join(lines) + ". Criterion: non-increasing in s (2-point "
                "tolerance) and lower at s=16 than at 0. Our floor is not "
                "~2%: on 2 cores shared by 4 workers and the shard, a pull "
                "also waits for CPU time and for the shard to serve the "
                "other workers, so even ASP workers spend a large share of "
                "the step in Pull.", ""]
    else:
        out += ["**1-2. Sync vs async claims: no results.**", ""]

    cb = {r["run"]: r for r in comp}

    def acc(run):
        r = cb.get(run)
        return f(r.get("final_acc_avg3")) if r and r["status"] == "ok" \
            else None

    if comp:
        # 3. top-k + EF
        n, t, t0 = acc("none"), acc("topk1_ef"), acc("topk1")
        ok = n is not None and t is not None and n - t <= 0.01
        red = f(cb["topk1_ef"]["wire_ratio"]) if "topk1_ef" in cb else None
        out += ["**3. Top-k at 1%% with error feedback keeps dense accuracy "
                "(Stich et al. 2018; Lin et al. DGC 2018): %s.**" % (
                    "reproduced" if ok else "not reproduced"), "",
                "Accuracy (mean of the last 3 evaluations): uncompressed "
                "%s, top-k 1%% + EF %s (wire "
                "ratio %s), top-k 1%% without EF %s, top-k 0.1%% + EF + DGC "
                "%s. Criterion: within 1 point of uncompressed." % (
                    cell(n, 4), cell(t, 4), cell(red, 1), cell(t0, 4),
                    cell(acc("topk01_ef_dgc"), 4, empty="failed")), ""]
        # 4. sign with/without EF
        s0, s1 = acc("sign"), acc("sign_ef")
        st0 = cb.get("sign", {}).get("status")
        ok = s1 is not None and (s0 is None or s0 < s1 - 0.005)
        out += ["**4. Sign compression without error feedback is worse than "
                "with it (Karimireddy et al. 2019): %s.**" % (
                    "reproduced" if ok else "not reproduced"), "",
                "Accuracy (mean of the last 3 evaluations): sign %s%s, "
                "sign + EF %s (uncompressed %s). "
                "Criterion: EF at least 0.5 point better." % (
                    cell(s0, 4, empty="-"),
                    "" if st0 in (None, "ok") else " (%s)" % st0,
                    cell(s1, 4), cell(n, 4)), ""]
        # 5. Agarwal et al.
        def speed(link_runs, base):
            res = []
            for r in link_runs:
                if r["run"] == base["run"] or r["status"] != "ok":
                    continue
                w, bw = f(r["wall_s"]), f(base["wall_s"])
                ta, tb = f(r["time_to_target_s"]), f(base["time_to_target_s"])
                res.append((r["run"], bw / w if w else None,
                            tb / ta if ta and tb else None))
            return res
        fast = [r for r in comp if r["link"] == "fast"]
        slow = [r for r in comp if r["link"] != "fast"]
        txt = []
        fv = sv = None
        if "none" in cb:
            sp = speed(fast, cb["none"])
            faster = [x for x in sp if x[1] and x[1] > 1.1]
            fv = len(faster) <= len(sp) / 2
            txt.append("Fast link (loopback, same epochs), speed-up of "
                       "training wall time over uncompressed: " + ", ".join(
                           "%s %sx" % (k, cell(w, 2)) for k, w, _ in sp) +
                       " (%d of %d codecs more than 10%% faster)." % (
                           len(faster), len(sp)))
        base_slow = next((r for r in slow if r["run"] == "none_slow"), None)
        if base_slow:
            sp = speed(slow, base_slow)
            faster = [x for x in sp if x[1] and x[1] > 1.1]
            sv = len(faster) > 0
            txt.append("Shaped link (%s): wall-time speed-up " % slow[0][
                "link"] + ", ".join("%s %sx (time to 0.85: %s)" % (
                    k, cell(w, 2), cell(t, 2, empty="n/a"))
                    for k, w, t in sp) + ".")
        if fv is None:
            v = "not measured"
        elif sv is None:
            v = ("reproduced on the fast link; the slow-link half was not "
                 "run" if fv else "not reproduced")
        else:
            v = "reproduced" if fv and sv else (
                "partly reproduced" if fv or sv else "not reproduced")
        out += ["**5. On a fast link compression often does not speed "
                "training up (Agarwal et al., MLSys'22): %s.**" % v, ""] + \
            [" ".join(txt), "Criterion: on the fast link at most half of "
             "the codecs are >10% faster than uncompressed; on the shaped "
             "link some are. Time to 0.85 ratio uses the runs that reached "
             "it.", ""]
    else:
        out += ["**3-5. Compression claims: no results.**", ""]
    return out


CAVEATS = [
    "## Caveats (read before citing these numbers)", "",
    "- **One seed per configuration** on 2 CPU cores shared by 4 workers, "
    "the shard and (while these runs were made) other people's compilers: "
    "time differences under ~10-20% and accuracy differences under ~1-2 "
    "points are within run-to-run noise.",
    "- **Oversubscribed CPUs.** 5 busy processes on 2 cores: a worker "
    "blocked in Pull is often waiting for CPU time or for the shard to serve "
    "the others, not for the consistency protocol. This is why the idle "
    "fraction stays near 40-60% even for ASP, unlike Li et al.'s cluster "
    "(one machine per worker). `--slowdown=3` sleeps 2x the compute time "
    "(~1-2 ms of a ~10 ms step), and a sleeping straggler frees CPU for the "
    "others, so the straggler is mild here.",
    "- **Constant learning rate, plain SGD.** Single evaluations swing by "
    "a few points; the last step of every epoch is a short batch (15000 "
    "examples per worker is not a multiple of the batch) and the final "
    "evaluation, right after one, is visibly lower in several runs. Tables "
    "therefore also give the best and the mean of the last 3 evaluations; "
    "accuracy comparisons use the latter.",
    "- **BSP vs SSP/ASP.** Same optimizer and epochs; BSP's lr is 4x "
    "(linear scaling), but BSP still makes 4x fewer, larger-batch updates. "
    "Its slower time to accuracy without a straggler comes from that and "
    "from the barrier under CPU contention.",
    "- **Shaped link.** Pulls are int8 for every codec there, so the push "
    "codec is what differs; with fp32 pulls the pull traffic alone would "
    "bound any push codec's speed-up to under 2x.", ""]


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--results", default=os.path.join(HERE, "results"))
    args = ap.parse_args(argv)
    d = args.results
    sync_md, sync_rows = sync_section(os.path.join(d, "sync_vs_async"))
    comp_md, comp_rows, _ = comp_section(os.path.join(d,
                                                      "compression_study"))
    try:
        commit = subprocess.run(["git", "-C", HERE, "rev-parse", "--short",
                                 "HEAD"], capture_output=True,
                                text=True).stdout.strip()
    except OSError:
        commit = "?"
    md = ["# asyncps experiments: report", "",
          "Generated by `experiments/report.py` from the CSVs in this "
          "folder (%s UTC, repo at %s, %s, %d CPUs). Rerun the studies "
          "with `experiments/sync_vs_async/run.py` and "
          "`experiments/compression_study/run.py` (add `--quick` for a short "
          "budget), then `experiments/report.py`." % (
              datetime.datetime.utcnow().strftime("%Y-%m-%d %H:%M"),
              commit or "?", platform.platform(), os.cpu_count() or 0), "",
          "Definitions: time to 0.85 = rank 0's wall time (from its "
          "start) at its first evaluation >= 0.85 (evaluation time "
          "included); final acc = rank 0's evaluation after its last step; "
          "idle fraction = time blocked in Pull / wall, per worker; "
          "staleness from the shard's histogram (`ps_ctl stats`); train "
          "wall = slowest worker's training loop.", ""]
    md += claims(sync_rows, comp_rows)
    md += sync_md + comp_md + CAVEATS
    with open(os.path.join(d, "REPORT.md"), "w") as fo:
        fo.write("\n".join(md) + "\n")
    print("wrote " + os.path.join(d, "REPORT.md"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
