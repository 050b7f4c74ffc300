"""Statistics of repeated runs: means, Student-t confidence intervals and
verdicts on claims, standard library only.

Every study runs each configuration with several seeds (model init and data
order); a figure is then a mean with a 95% t-interval,

    mean +- t_{0.975, n-1} * s / sqrt(n),

and a claim compares configurations through the interval of a difference of
means (Welch: unequal variances, Welch-Satterthwaite degrees of freedom).
A claim is judged by where that interval lies:
    reproduced      the whole interval is on the side the claim predicts;
    not reproduced  the whole interval is on the other side (or inside a
                    tolerance band when the claim is "about equal"), or
                    the interval straddles the threshold (inconclusive:
                    said so in the verdict).
"""
import math


# ------------------------------------------------------------ distributions
def _betacf(a, b, x):
    """Continued fraction of the incomplete beta function (Lentz)."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 400):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-15:
            break
    return h


def betainc(a, b, x):
    """Regularised incomplete beta function I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    lbeta = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
    front = math.exp(lbeta + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_cdf(t, df):
    """P(T <= t) for Student's t with df degrees of freedom (df > 0)."""
    x = df / (df + t * t)
    tail = 0.5 * betainc(df / 2.0, 0.5, x)
    return 1.0 - tail if t >= 0 else tail


def t_ppf(p, df):
    """Quantile of Student's t: the t with t_cdf(t, df) = p, 0 < p < 1."""
    if not 0.0 < p < 1.0:
        raise ValueError("p must be in (0, 1)")
    if p < 0.5:
        return -t_ppf(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12 * max(1.0, hi):
            break
    return 0.5 * (lo + hi)


# ---------------------------------------------------------------- summaries
class _Interval:
    """mean +- half: the interval's ends (None when there is no mean)."""
    mean = half = None

    @property
    def lo(self):
        return None if self.mean is None else self.mean - self.half

    @property
    def hi(self):
        return None if self.mean is None else self.mean + self.half


class Estimate(_Interval):
    """Mean of n values with a two-sided t confidence interval.

    n = 1 gives the value with an unbounded interval (half = inf); n = 0 an
    empty estimate (mean None)."""

    def __init__(self, values, confidence=0.95):
        vals = [float(v) for v in values if v is not None and
                math.isfinite(float(v))]
        self.values = vals
        self.n = len(vals)
        self.confidence = confidence
        if self.n == 0:
            self.mean = self.sd = self.half = None
            return
        self.mean = sum(vals) / self.n
        if self.n == 1:
            self.sd, self.half = 0.0, math.inf
            return
        var = sum((v - self.mean) ** 2 for v in vals) / (self.n - 1)
        self.sd = math.sqrt(var)
        self.half = t_ppf(0.5 + confidence / 2.0, self.n - 1) * \
            self.sd / math.sqrt(self.n)

    def fmt(self, digits=3, pct=False, unit=""):
        """'0.871 +- 0.004' (or '87.1% +- 0.4' with pct); 'n/a' if empty."""
        if self.mean is None:
            return "n/a"
        scale = 100.0 if pct else 1.0
        m = ("%%.%df" % digits) % (self.mean * scale)
        if pct:
            m += "%"
        if self.n < 2:
            return m + unit + " (1 run)"
        h = ("%%.%df" % digits) % (self.half * scale)
        return "%s%s +- %s" % (m, unit, h)

    def __repr__(self):
        return "Estimate(n=%d, mean=%r, half=%r)" % (self.n, self.mean,
                                                       self.half)


class Difference(_Interval):
    """Difference of means a - b with Welch's t-interval."""

    def __init__(self, a, b, confidence=0.95):
        a = a if isinstance(a, Estimate) else Estimate(a, confidence)
        b = b if isinstance(b, Estimate) else Estimate(b, confidence)
        self.a, self.b = a, b
        self.confidence = confidence
        if a.mean is None or b.mean is None:
            self.mean = self.half = self.df = None
            return
        self.mean = a.mean - b.mean
        if a.n < 2 or b.n < 2:
            self.half, self.df = math.inf, None
            return
        va, vb = a.sd ** 2 / a.n, b.sd ** 2 / b.n
        se = math.sqrt(va + vb)
        if se == 0.0:
            self.half, self.df = 0.0, a.n + b.n - 2
            return
        self.df = (va + vb) ** 2 / (va ** 2 / (a.n - 1) + vb ** 2 / (b.n - 1))
        self.half = t_ppf(0.5 + confidence / 2.0, self.df) * se

    def fmt(self, digits=3, scale=1.0, unit=""):
        if self.mean is None:
            return "n/a"
        f = "%%+.%df" % digits
        if not math.isfinite(self.half):
            return (f % (self.mean * scale)) + unit + " (interval needs >= 2 runs each)"
        return "%s%s [%s, %s]" % (f % (self.mean * scale), unit,
                                  f % (self.lo * scale), f % (self.hi * scale))


def verdict_greater(diff, threshold=0.0):
    """Claim: the true difference is > threshold.

    ('reproduced' | 'not reproduced' | 'inconclusive', reason)."""
    if diff.mean is None:
        return "not measured", "no runs"
    if diff.lo > threshold:
        return "reproduced", "the 95%% interval lies above %g" % threshold
    if diff.hi <= threshold:
        return "not reproduced", "the 95%% interval lies at or below %g" % \
            threshold
    return "inconclusive", "the 95%% interval contains %g" % threshold


def verdict_within(diff, tolerance):
    """Claim: |true difference| <= tolerance (about equal)."""
    if diff.mean is None:
        return "not measured", "no runs"
    if -tolerance <= diff.lo and diff.hi <= tolerance:
        return "reproduced", "the 95%% interval lies within +-%g" % tolerance
    if diff.lo > tolerance or diff.hi < -tolerance:
        return "not reproduced", "the 95%% interval lies outside +-%g" % \
            tolerance
    return "inconclusive", "the 95%% interval reaches beyond +-%g" % tolerance


def headline(verdict):
    """The word a claim's title gets: inconclusive counts as not reproduced
    (the claim is not supported by the runs), said so."""
    return {"inconclusive": "not reproduced (inconclusive)"}.get(verdict,
                                                                 verdict)


def combine(verdicts):
    """Several sub-claims: reproduced if all are, partly if some are."""
    v = [x for x in verdicts if x != "not measured"]
    if not v:
        return "not measured"
    if all(x == "reproduced" for x in v):
        return "reproduced"
    if any(x == "reproduced" for x in v):
        return "partly reproduced"
    if all(x == "not reproduced" for x in v):
        return "not reproduced"
    return "not reproduced (inconclusive)"


# ------------------------------------------------------------------- curves
def band(curves, xs=None, points=40):
    """Mean curve with a 95% t-band over several runs' (x, y) curves.

    Each curve is linearly interpolated on a common grid xs (default: points
    evenly spaced up to the shortest run's last x, so every run covers it).
    Returns [(x, mean, lo, hi, n)]."""
    curves = [sorted(c) for c in curves if c]
    if not curves:
        return []
    if xs is None:
        x0 = max(c[0][0] for c in curves)
        x1 = min(c[-1][0] for c in curves)
        if x1 <= x0:
            xs = [x0]
        else:
            xs = [x0 + (x1 - x0) * i / (points - 1) for i in range(points)]
    out = []
    for x in xs:
        ys = [interp(c, x) for c in curves]
        ys = [y for y in ys if y is not None]
        e = Estimate(ys)
        if e.mean is None:
            continue
        half = e.half if math.isfinite(e.half) else 0.0
        out.append((x, e.mean, e.mean - half, e.mean + half, e.n))
    return out


def interp(curve, x):
    """y at x on a sorted [(x, y)] curve (None outside its x range)."""
    if not curve or x < curve[0][0] or x > curve[-1][0]:
        return None
    for (x0, y0), (x1, y1) in zip(curve, curve[1:]):
        if x0 <= x <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return curve[-1][1]


def proportion(k, n, confidence=0.95):
    """(k/n, lo, hi): the Clopper-Pearson (exact binomial) interval of a
    proportion of k successes in n trials."""
    if n <= 0:
        return None, None, None
    a = 1.0 - confidence

    def inv(p, x, y):  # the q with betainc(x, y, q) = p, by bisection
        lo, hi = 0.0, 1.0
        for _ in range(200):
            mid = 0.5 * (lo + hi)
            if betainc(x, y, mid) < p:
                lo = mid
            else:
                hi = mid
        return 0.5 * (lo + hi)

    lo = 0.0 if k == 0 else inv(a / 2, k, n - k + 1)
    hi = 1.0 if k == n else inv(1 - a / 2, k + 1, n - k)
    return k / n, lo, hi


def fisher_exact(k1, n1, k2, n2):
    """Two-sided p-value of Fisher's exact test that k1/n1 and k2/n2 come
    from one proportion (the tables as or less likely than the observed)."""
    def lchoose(n, k):
        return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)
    k, n = k1 + k2, n1 + n2

    def p(x):  # hypergeometric probability of x successes in group 1
        return math.exp(lchoose(n1, x) + lchoose(n2, k - x) - lchoose(n, k))
    lo, hi = max(0, k - n2), min(k, n1)
    p_obs = p(k1)
    return min(1.0, sum(p(x) for x in range(lo, hi + 1)
                        if p(x) <= p_obs * (1 + 1e-9)))
