"""The study file: what to run, and the configurations it expands to.

A study is a JSON object (lines whose first non-blank character is `#` are
comments). Every key but `grid` and `overrides` is optional:

  name            title of the report (default: the file's name)
  notes           a string or list of strings: a "Notes" section of the report
                  (what the study reduced, the machine, ...)
  worker_cmd      the worker (psrun --worker_cmd); absent: the built-in ps_worker
  config          a psrun flag file (--config) every run starts from
  servers, workers, hosts, link, latency, shard_hosts, consistency, codec,
  pull_codec, straggler, server_flags, worker_flags
                  one value for every run (the grid keys below)
  psrun_flags     more psrun options, one shell-quoted string
  seeds           list of seeds; each configuration runs once per seed
                  (default [1, 2, 3])
  seed_flag       how a run gets its seed (default "--seed={seed}", appended to
                  the worker's flags; "" for none)
  straggler_flag  what the slowed rank gets appended (default "--slowdown={factor}";
                  it also gets ASYNCPS_SLOWDOWN=factor in its environment)
  metric          what the script reports and the report compares (default
                  test_acc): a name given to asyncps.metrics.report(), or a
                  column of the metrics CSV (test_acc, train_loss)
  higher_is_better  default: false for names containing "loss", "err" or
                  "perplexity", else true
  final_evals     final_<metric> is the mean of the last N evaluations
                  (default 1: the last; a few smooth out evaluation noise)
  target          time to target: first evaluation of `metric` at or beyond it
  eval_rank       the rank whose evaluations are the curve (default 0)
  tolerance       {figure: band}: a comparison whose 95% interval lies within
                  +-band is reported "equal within +-band"
  timeout_s       seconds a run may take before it is stopped and recorded as
                  failed (default 1800)
  grid            {key: [values]}: every combination of values is a configuration
  overrides       [{"when": {key: value, ...}, "server_flags": "...",
                  "worker_flags": "...", "psrun_flags": "..."}]: flags added to the
                  configurations that match (e.g. a BSP learning rate)

Grid keys (also allowed at the top level as a single value; server_flags and
worker_flags may be in both: the grid's flags come after the top level's):
  consistency   bsp | ssp:S | asp             ps_server --consistency (--staleness=S)
  codec         a push codec spec             worker --codec=...
  pull_codec    a pull codec spec             worker --pull_codec=...
  server_flags  ps_server flags (one string)  e.g. "--optimizer=adam --lr=0.001"
  worker_flags  worker flags (one string)
  straggler     none | F | F@R                rank R (default: the last) slowed F times
  servers       shards                        psrun --servers
  workers       workers                       psrun --workers
  hosts         emulated hosts, 0 = loopback  psrun --emulate_hosts N
  link          none | RATE (100mbit, 1gbit)  psrun --link RATE (needs hosts >= 1)
  latency       ms, 0 = none                  psrun --latency MS
  shard_hosts   M                             psrun --shard_hosts M

Errors are GridError and name the key (and the file) they are about.
"""
import hashlib
import itertools
import json
import os
import re
import shlex

GRID_KEYS = ("consistency", "codec", "pull_codec", "server_flags", "worker_flags", "straggler",
             "servers", "workers", "hosts", "link", "latency", "shard_hosts")
TOP_KEYS = ("name", "notes", "worker_cmd", "config", "psrun_flags", "seeds", "seed_flag",
            "straggler_flag", "metric", "higher_is_better", "target", "final_evals", "eval_rank", "tolerance",
            "timeout_s", "grid", "overrides")
DEFAULTS = {"consistency": "asp", "codec": "none", "pull_codec": "", "server_flags": "",
            "worker_flags": "", "straggler": "none", "servers": 1, "workers": 1, "hosts": 0,
            "link": "none", "latency": 0, "shard_hosts": 0}
_SLUG_PREFIX = {"straggler": "slow", "servers": "s", "workers": "w", "hosts": "h",
                "latency": "lat", "shard_hosts": "sh", "pull_codec": "pull-"}
_LOWER_IS_BETTER = ("loss", "err", "perplexity")


class GridError(ValueError):
    """A study file that cannot be run; the message names the key."""


def _where(key, in_grid):
    return "grid key '%s'" % key if in_grid else "key '%s'" % key


def _int(key, v, lo, in_grid):
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise GridError("%s: %r is not an integer >= %d" % (_where(key, in_grid), v, lo))
    return v


def canonical(key, v, in_grid=True):
    """The value of grid key `key` in its canonical form; GridError naming the
    key when it is not a valid value."""
    w = _where(key, in_grid)
    if key == "consistency":
        s = str(v).strip().lower()
        if s in ("bsp", "asp"):
            return s
        m = re.match(r"^ssp:(\d+)$", s)
        if not m:
            raise GridError("%s: %r is not bsp, asp or ssp:S (S the staleness bound, "
                            "e.g. ssp:4)" % (w, v))
        return "ssp:%d" % int(m.group(1))
    if key in ("codec", "pull_codec", "server_flags", "worker_flags"):
        if not isinstance(v, str):
            raise GridError("%s: %r is not a string" % (w, v))
        if key in ("codec", "pull_codec") and re.search(r"\s", v.strip()):
            raise GridError("%s: %r: a codec spec has no spaces (e.g. topk:ratio=0.01,ef=1)"
                            % (w, v))
        if key.endswith("_flags"):
            try:
                shlex.split(v)
            except ValueError as e:
                raise GridError("%s: %r: %s" % (w, v, e))
        return v.strip() or ("none" if key == "codec" else "")
    if key == "straggler":
        s = str(v).strip().lower()
        if s in ("none", "", "0", "1"):
            return "none"
        m = re.match(r"^([0-9.]+)(?:@(\d+))?$", s)
        try:
            factor = float(m.group(1)) if m else 0.0
        except ValueError:
            factor = 0.0
        if not m or factor <= 1.0:
            raise GridError("%s: %r is not none, F or F@R (a rank slowed F > 1 times; R "
                            "default the last rank), e.g. 3 or 3@1" % (w, v))
        return "%g" % factor + ("@%d" % int(m.group(2)) if m.group(2) else "")
    if key in ("servers", "workers"):
        return _int(key, v, 1, in_grid)
    if key in ("hosts", "shard_hosts"):
        return _int(key, v, 0, in_grid)
    if key == "link":
        s = str(v).strip().lower()
        if s in ("none", "", "unshaped"):
            return "none"
        if not re.match(r"^\d+(\.\d+)?([kmg]?bit|[kmg]?bps)$", s):
            raise GridError("%s: %r is not none or a tc rate (100mbit, 1gbit, 500kbit)" % (w, v))
        return s
    if key == "latency":
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
            raise GridError("%s: %r is not a number of milliseconds >= 0" % (w, v))
        return v
    raise GridError("unknown %s" % w)


def _strip_comments(text):
    return "\n".join("" if l.lstrip().startswith("#") else l for l in text.splitlines())


class Config:
    """One configuration: a value for every grid key, the flags it runs with."""

    def __init__(self, study, values):
        self.study = study
        self.values = values  # {grid key: canonical value}

    def get(self, key):
        return self.values[key]

    @property
    def straggler(self):
        """(factor, rank) or None."""
        s = self.values["straggler"]
        if s == "none":
            return None
        f, _, r = s.partition("@")
        return float(f), int(r) if r else self.values["workers"] - 1

    def label(self, keys=None):
        """'ssp:4 / topk:ratio=0.01,ef=1' from the values of `keys` (default:
        the keys the grid varies)."""
        keys = self.study.varying if keys is None else keys
        return " / ".join(str(self.values[k]) or "(none)" for k in keys) or "all runs"

    def describe(self, keys):
        return ", ".join("%s=%s" % (k, self.values[k]) for k in keys)

    def server_flags(self):
        c = self.values["consistency"]
        flags = shlex.split(self.study.top.get("server_flags", ""))
        flags.append("--consistency=" + c.split(":")[0])
        if c.startswith("ssp:"):
            flags.append("--staleness=" + c.split(":")[1])
        if "server_flags" in self.study.grid:
            flags += shlex.split(self.values["server_flags"])
        return flags + self._override("server_flags")

    def worker_flags(self, seed):
        flags = shlex.split(self.study.top.get("worker_flags", ""))
        if "worker_flags" in self.study.grid:
            flags += shlex.split(self.values["worker_flags"])
        if "codec" in self.study.grid or "codec" in self.study.top:
            flags.append("--codec=" + self.values["codec"])
        if self.values["pull_codec"]:
            flags.append("--pull_codec=" + self.values["pull_codec"])
        flags += self._override("worker_flags")
        if self.study.seed_flag:
            flags.append(self.study.seed_flag.format(seed=seed))
        return flags

    def psrun_flags(self):
        return shlex.split(self.study.top.get("psrun_flags", "")) + self._override("psrun_flags")

    def _override(self, what):
        out = []
        for o in self.study.overrides:
            if all(self.values[k] == v for k, v in o["when"].items()):
                out += shlex.split(o.get(what, ""))
        return out

    def settings(self, seed):
        """Everything a run depends on (a finished run with other settings is
        not reused); its hash names the run's folder."""
        return {"values": {k: self.values[k] for k in GRID_KEYS}, "seed": seed,
                "worker_cmd": self.study.top.get("worker_cmd"),
                "config": self.study.config_text, "server_flags": self.server_flags(),
                "worker_flags": self.worker_flags(seed), "psrun_flags": self.psrun_flags(),
                "straggler_flag": self.study.straggler_flag}

    def slug(self):
        keys = list(self.study.grid) or ["consistency"]
        text = "_".join(_SLUG_PREFIX.get(k, "") + (re.sub(
            r"[^A-Za-z0-9.]+", "-", str(self.values[k])).strip("-") or "x") for k in keys)
        s = self.settings(0)
        s.pop("seed")
        s["worker_flags"] = self.worker_flags("")
        h = hashlib.sha256(json.dumps(s, sort_keys=True).encode()).hexdigest()[:8]
        return (text[:80] + "-" + h)


class Study:
    """A parsed, validated study file."""

    def __init__(self, doc, path="<study>"):
        if not isinstance(doc, dict):
            raise GridError("%s: a study is a JSON object" % path)
        self.path = path
        for k in doc:
            if k not in TOP_KEYS and k not in GRID_KEYS:
                raise GridError("unknown key '%s' in %s (known: %s)" % (
                    k, path, ", ".join(TOP_KEYS + GRID_KEYS)))
        self.top = {}
        for k, v in doc.items():
            if k in GRID_KEYS:
                self.top[k] = canonical(k, v, in_grid=False)
            elif k not in ("grid", "overrides"):
                self.top[k] = v
        grid = doc.get("grid", {})
        if not isinstance(grid, dict):
            raise GridError("%s: 'grid' must be an object {key: [values]}" % path)
        self.grid = {}
        for k, vals in grid.items():
            if k == "seeds":
                raise GridError("grid key 'seeds': seeds are a top-level key (\"seeds\": [1, 2, 3])")
            if k not in GRID_KEYS:
                raise GridError("unknown grid key '%s' in %s (known: %s)" % (
                    k, path, ", ".join(GRID_KEYS)))
            if k in doc and not k.endswith("_flags"):  # flags: the grid's are added
                raise GridError("grid key '%s' is also set at the top level" % k)
            vals = vals if isinstance(vals, list) else [vals]
            if not vals:
                raise GridError("grid key '%s' has no values" % k)
            canon = [canonical(k, v) for v in vals]
            if len(set(map(str, canon))) != len(canon):
                raise GridError("grid key '%s' lists a value twice: %s" % (k, vals))
            self.grid[k] = canon
        self.varying = [k for k, v in self.grid.items() if len(v) > 1]
        self.seeds = doc.get("seeds", [1, 2, 3])
        if not isinstance(self.seeds, list) or not self.seeds or any(
                isinstance(s, bool) or not isinstance(s, int) for s in self.seeds) or \
                len(set(self.seeds)) != len(self.seeds):
            raise GridError("key 'seeds': %r is not a list of distinct integers" % (self.seeds,))
        self.seed_flag = self._template("seed_flag", "--seed={seed}", "seed")
        self.straggler_flag = self._template("straggler_flag", "--slowdown={factor}", "factor")
        self.metric = doc.get("metric", "test_acc")
        if not isinstance(self.metric, str) or not re.match(r"^[A-Za-z_][A-Za-z0-9_.]*$",
                                                             self.metric):
            raise GridError("key 'metric': %r is not a metric name" % (self.metric,))
        hib = doc.get("higher_is_better")
        self.higher_is_better = (not any(w in self.metric.lower() for w in _LOWER_IS_BETTER)
                                 if hib is None else hib)
        if not isinstance(self.higher_is_better, bool):
            raise GridError("key 'higher_is_better': %r is not true or false" % (hib,))
        self.target = doc.get("target")
        if self.target is not None and (isinstance(self.target, bool) or
                                        not isinstance(self.target, (int, float))):
            raise GridError("key 'target': %r is not a number" % (self.target,))
        self.final_evals = doc.get("final_evals", 1)
        _int("final_evals", self.final_evals, 1, False)
        self.eval_rank = doc.get("eval_rank", 0)
        _int("eval_rank", self.eval_rank, 0, False)
        self.timeout_s = doc.get("timeout_s", 1800)
        if isinstance(self.timeout_s, bool) or not isinstance(self.timeout_s, (int, float)) or \
                self.timeout_s <= 0:
            raise GridError("key 'timeout_s': %r is not a number of seconds > 0" % (self.timeout_s,))
        self.tolerance = doc.get("tolerance", {})
        if not isinstance(self.tolerance, dict) or any(
                not isinstance(v, (int, float)) or isinstance(v, bool) or v < 0
                for v in self.tolerance.values()):
            raise GridError("key 'tolerance': %r is not {figure: band >= 0}" % (self.tolerance,))
        for k in ("worker_cmd", "config", "psrun_flags", "name"):
            if k in self.top and not isinstance(self.top[k], str):
                raise GridError("key '%s': %r is not a string" % (k, self.top[k]))
        if "psrun_flags" in self.top:
            try:
                shlex.split(self.top["psrun_flags"])
            except ValueError as e:
                raise GridError("key 'psrun_flags': %s" % e)
        self.config_text = None
        if self.top.get("config"):
            try:
                with open(self.top["config"]) as f:
                    self.config_text = f.read()
            except OSError as e:
                raise GridError("key 'config': cannot read %s: %s" % (self.top["config"], e))
        self.notes = doc.get("notes", [])
        self.notes = [self.notes] if isinstance(self.notes, str) else self.notes
        if not isinstance(self.notes, list) or any(not isinstance(n, str) for n in self.notes):
            raise GridError("key 'notes': a string or a list of strings")
        self.overrides = self._overrides(doc.get("overrides", []))
        self.name = self.top.get("name") or os.path.splitext(os.path.basename(path))[0]
        self.configs = self._expand()

    def _template(self, key, default, field):
        t = self.top.get(key, default)
        if not isinstance(t, str):
            raise GridError("key '%s': %r is not a string" % (key, t))
        try:
            t.format(**{field: 1})
        except (KeyError, IndexError, ValueError) as e:
            raise GridError("key '%s': %r: only {%s} may be substituted (%s)" % (key, t, field, e))
        return t

    def _overrides(self, items):
        if not isinstance(items, list):
            raise GridError("key 'overrides': a list of {\"when\": {...}, \"server_flags\": ...}")
        out = []
        for i, o in enumerate(items):
            if not isinstance(o, dict) or not isinstance(o.get("when"), dict):
                raise GridError("key 'overrides'[%d]: needs \"when\": {grid key: value}" % i)
            for k in o:
                if k not in ("when", "server_flags", "worker_flags", "psrun_flags"):
                    raise GridError("key 'overrides'[%d]: unknown key '%s' (when, server_flags, "
                                    "worker_flags, psrun_flags)" % (i, k))
            when = {}
            for k, v in o["when"].items():
                if k not in GRID_KEYS:
                    raise GridError("key 'overrides'[%d]: unknown grid key '%s' in when" % (i, k))
                when[k] = canonical(k, v)
            out.append(dict(o, when=when))
        return out

    def _expand(self):
        base = dict(DEFAULTS)
        base.update({k: v for k, v in self.top.items() if k in GRID_KEYS and k not in self.grid})
        keys = list(self.grid)
        configs = []
        for combo in itertools.product(*(self.grid[k] for k in keys)):
            values = dict(base)
            values.update(zip(keys, combo))
            self._check(values)
            configs.append(Config(self, values))
        return configs

    def _check(self, v):
        """Cross-key checks, naming the key."""
        def key(k):
            return _where(k, k in self.grid)
        if v["link"] != "none" and not v["hosts"]:
            raise GridError("%s: a shaped link (%s) needs emulated hosts: set hosts >= 1 "
                            "(psrun --emulate_hosts N)" % (key("link"), v["link"]))
        if v["latency"] and not v["hosts"]:
            raise GridError("%s: needs emulated hosts (hosts >= 1)" % key("latency"))
        if v["shard_hosts"] and not (v["hosts"] and v["shard_hosts"] <= v["hosts"]):
            raise GridError("%s: %d is not in [1, hosts]" % (key("shard_hosts"), v["shard_hosts"]))
        s = v["straggler"]
        if s != "none" and "@" in s and int(s.split("@")[1]) >= v["workers"]:
            raise GridError("%s: rank %s is not below workers=%d" % (
                key("straggler"), s.split("@")[1], v["workers"]))
        if s != "none" and v["workers"] < 2:
            raise GridError("%s: a straggler needs workers >= 2" % key("straggler"))
        if self.eval_rank >= v["workers"]:
            raise GridError("key 'eval_rank': %d is not below workers=%d" % (
                self.eval_rank, v["workers"]))

    def uses_hosts(self):
        return any(c.values["hosts"] for c in self.configs)


def load(path):
    """The Study in the file at `path`; GridError naming what is wrong."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError as e:
        raise GridError("cannot read study file %s: %s" % (path, e))
    try:
        doc = json.loads(_strip_comments(text))
    except ValueError as e:
        raise GridError("%s is not JSON (comments: lines starting with #): %s" % (path, e))
    return Study(doc, path)
