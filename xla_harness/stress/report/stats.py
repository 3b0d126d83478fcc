"""Honest statistics for "k of n steps were non-finite".

Steps of a stress run are treated as Bernoulli trials. All functions are pure and
use only the standard library, so they run wherever the harness runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

from xla_harness.errors import HarnessError

# Two-sided normal quantiles for the confidence levels users ask for; others are solved.
_Z = {0.90: 1.6448536269514722, 0.95: 1.959963984540054, 0.99: 2.5758293035489004}


def _check(k: int, n: int) -> None:
    if n < 0 or k < 0 or k > n:
        raise HarnessError(f"invalid counts: {k} of {n}")


def _check_conf(confidence: float) -> None:
    if not 0.0 < confidence < 1.0:
        raise HarnessError(f"confidence must be in (0, 1), got {confidence}")


def normal_quantile(p: float) -> float:
    """Inverse of the standard normal CDF, by bisection on math.erf (exact to ~1e-12)."""
    if not 0.0 < p < 1.0:
        raise HarnessError(f"quantile probability must be in (0, 1), got {p}")
    lo, hi = -40.0, 40.0
    for _ in range(200):
        mid = (lo + hi) / 2
        if 0.5 * (1 + math.erf(mid / math.sqrt(2))) < p:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def _z(confidence: float) -> float:
    _check_conf(confidence)
    return _Z.get(round(confidence, 6)) or normal_quantile(0.5 + confidence / 2)


def wilson(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion; (0, 1) when n == 0."""
    _check(k, n)
    if n == 0:
        return (0.0, 1.0)
    z = _z(confidence)
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    lo, hi = max(0.0, centre - half), min(1.0, centre + half)
    # At the boundaries the interval must contain the observed proportion exactly.
    if k == 0:
        lo = 0.0
    if k == n:
        hi = 1.0
    return (lo, hi)


def binom_cdf(k: int, n: int, p: float) -> float:
    """P[X <= k] for X ~ Binomial(n, p), summed in log space."""
    if k < 0:
        return 0.0
    if k >= n:
        return 1.0
    if p <= 0.0:
        return 1.0
    if p >= 1.0:
        return 0.0
    lp, lq = math.log(p), math.log1p(-p)
    terms = [math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * lp + (n - i) * lq
             for i in range(k + 1)]
    m = max(terms)
    return min(1.0, math.exp(m) * sum(math.exp(t - m) for t in terms))


def _solve(f, target: float) -> float:
    """p in [0, 1] with f(p) == target for f decreasing in p (bisection)."""
    lo, hi = 0.0, 1.0
    for _ in range(100):
        mid = (lo + hi) / 2
        if f(mid) > target:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def clopper_pearson(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Exact (conservative) Clopper-Pearson interval; (0, 1) when n == 0."""
    _check(k, n)
    _check_conf(confidence)
    if n == 0:
        return (0.0, 1.0)
    alpha = 1 - confidence
    lo = 0.0 if k == 0 else _solve(lambda p: binom_cdf(k - 1, n, p), 1 - alpha / 2)
    hi = 1.0 if k == n else _solve(lambda p: binom_cdf(k, n, p), alpha / 2)
    return (lo, hi)


def upper_bound(k: int, n: int, confidence: float = 0.95) -> float:
    """One-sided exact (Clopper-Pearson) upper bound on the rate: the p with P[X <= k | n, p] = 1 - confidence.

    The same method as :func:`runs_needed`: with k = 0 it is 1 - (1 - confidence)**(1/n), so
    runs_needed(b) clean steps give an upper bound <= b.
    """
    _check(k, n)
    _check_conf(confidence)
    if n == 0 or k == n:
        return 1.0
    if k == 0:
        return 1 - (1 - confidence) ** (1 / n)
    return _solve(lambda p: binom_cdf(k, n, p), 1 - confidence)


def runs_needed(p_upper: float, confidence: float = 0.95) -> int:
    """Failure-free steps needed to claim, at ``confidence``, that the rate is below ``p_upper``.

    With zero failures in n steps the one-sided exact bound is 1 - (1 - confidence)**(1/n);
    the smallest n with that bound <= p_upper is ceil(log(1 - confidence) / log(1 - p_upper)).
    """
    _check_conf(confidence)
    if not 0.0 < p_upper < 1.0:
        raise HarnessError(f"p_upper must be in (0, 1), got {p_upper}")
    return math.ceil(math.log(1 - confidence) / math.log1p(-p_upper) - 1e-12)


def fisher_exact(k1: int, n1: int, k2: int, n2: int) -> float:
    """Two-sided Fisher exact test p-value for k1/n1 vs k2/n2."""
    _check(k1, n1)
    _check(k2, n2)
    total_k, total = k1 + k2, n1 + n2

    def logp(a: int) -> float:
        return (math.lgamma(total_k + 1) - math.lgamma(a + 1) - math.lgamma(total_k - a + 1)
                + math.lgamma(total - total_k + 1) - math.lgamma(n1 - a + 1)
                - math.lgamma(total - total_k - n1 + a + 1)
                - (math.lgamma(total + 1) - math.lgamma(n1 + 1) - math.lgamma(total - n1 + 1)))

    lo, hi = max(0, total_k - n2), min(total_k, n1)
    observed = logp(k1)
    p = sum(math.exp(logp(a)) for a in range(lo, hi + 1) if logp(a) <= observed + 1e-9)
    return min(1.0, p)


def _gammaincc(a: float, x: float) -> float:
    """Regularised upper incomplete gamma Q(a, x) (series below a + 1, continued fraction above)."""
    if x <= 0:
        return 1.0
    lg = math.lgamma(a)
    if x < a + 1:
        term = total = 1.0 / a
        ap = a
        for _ in range(1000):
            ap += 1
            term *= x / ap
            total += term
            if abs(term) < abs(total) * 1e-15:
                break
        return max(0.0, 1.0 - total * math.exp(-x + a * math.log(x) - lg))
    b, c, d = x + 1 - a, 1e300, 1 / (x + 1 - a)
    h = d
    for i in range(1, 1000):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = 1e-300 if abs(d) < 1e-300 else d
        c = b + an / c
        c = 1e-300 if abs(c) < 1e-300 else c
        d = 1 / d
        h *= d * c
        if abs(d * c - 1) < 1e-15:
            break
    return min(1.0, math.exp(-x + a * math.log(x) - lg) * h)


def chi2_sf(x: float, df: int) -> float:
    """P[X >= x] for X ~ chi-square(df)."""
    if df <= 0:
        raise HarnessError(f"degrees of freedom must be positive, got {df}")
    return _gammaincc(df / 2, x / 2)


def seed_dispersion(per_seed: list[tuple[int, int]]) -> dict:
    """Do the seeds share one rate? Per-seed rates, their range, and the chi-square test of
    homogeneity (k x 2 table; p small: the rate depends on the seed, so pooled steps are not
    exchangeable trials and the pooled interval is too narrow)."""
    seeds = [(k, n) for k, n in per_seed if n > 0]
    rates = [k / n for k, n in seeds]
    out = {"rates": rates, "min": min(rates, default=0.0), "max": max(rates, default=0.0), "p_value": None}
    big_k, big_n = sum(k for k, _ in seeds), sum(n for _, n in seeds)
    if len(seeds) < 2 or big_k in (0, big_n):
        return out
    p = big_k / big_n
    x2 = sum((k - n * p) ** 2 / (n * p) + ((n - k) - n * (1 - p)) ** 2 / (n * (1 - p)) for k, n in seeds)
    out["chi2"] = x2
    out["p_value"] = chi2_sf(x2, len(seeds) - 1)
    return out


def fisher_exact_rational(k1: int, n1: int, k2: int, n2: int) -> Fraction:
    """The two-sided Fisher exact p of k1/n1 vs k2/n2 as an exact fraction (integer binomials: no
    rounding, no tie tolerance). Costly for many failures; :func:`fisher_exact` is the float form."""
    _check(k1, n1)
    _check(k2, n2)
    total_k, total = k1 + k2, n1 + n2
    lo, hi = max(0, total_k - n2), min(total_k, n1)
    weight = {a: math.comb(total_k, a) * math.comb(total - total_k, n1 - a) for a in range(lo, hi + 1)}
    observed = weight[k1]
    return Fraction(sum(w for w in weight.values() if w <= observed), math.comb(total, n1))


def _below(k1: int, n1: int, k2: int, n2: int, alpha: float) -> bool:
    """p(k1/n1 vs k2/n2) < alpha, decided exactly where the float p is too close to alpha to tell."""
    p = fisher_exact(k1, n1, k2, n2)
    if abs(p - alpha) > 1e-7 * alpha:
        return p < alpha
    return fisher_exact_rational(k1, n1, k2, n2) < Fraction(str(alpha))


def clean_steps_to_show_fix(k: int, n: int, alpha: float = 0.05, limit: int = 10**7) -> int | None:
    """Failure-free steps after which a fix is shown against a measured k/n: the smallest m
    with two-sided Fisher p(k/n vs 0/m) < alpha (exactly: at 1/1000 the answer is 19,001, where
    p = 1000/20001; at 19,000 p is exactly 0.05). None when k == 0 (nothing to beat) or beyond ``limit``."""
    _check(k, n)
    if k == 0:
        return None
    lo, hi = 1, 1
    while not _below(k, n, 0, hi, alpha):
        lo, hi = hi + 1, hi * 2
        if hi > limit:
            return None
    while lo < hi:
        mid = (lo + hi) // 2
        if _below(k, n, 0, mid, alpha):
            hi = mid
        else:
            lo = mid + 1
    return lo


@dataclass(frozen=True)
class Rate:
    k: int
    n: int
    confidence: float = 0.95

    @property
    def rate(self) -> float:
        return self.k / self.n if self.n else 0.0

    @property
    def ci(self) -> tuple[float, float]:
        return wilson(self.k, self.n, self.confidence)

    @property
    def upper(self) -> float:
        """One-sided exact upper bound (the method runs_needed uses)."""
        return upper_bound(self.k, self.n, self.confidence)

    def to_dict(self) -> dict:
        lo, hi = self.ci
        return {"nonfinite": self.k, "steps": self.n, "rate": self.rate, "upper": self.upper,
                "ci_low": lo, "ci_high": hi, "confidence": self.confidence}


@dataclass(frozen=True)
class Comparison:
    a: Rate
    b: Rate
    p_value: float
    alpha: float

    @property
    def significant(self) -> bool:
        return self.p_value < self.alpha

    def sentence(self) -> str:
        verdict = "differ significantly" if self.significant else "do not differ significantly"
        return (f"{self.a.k}/{self.a.n} vs {self.b.k}/{self.b.n}: rates {verdict} "
                f"(Fisher exact p = {self.p_value:.3g}, alpha = {self.alpha})")


def compare(k1: int, n1: int, k2: int, n2: int, alpha: float = 0.05) -> Comparison:
    """Is the non-finite rate of configuration A different from B (e.g. before/after a patch)?"""
    return Comparison(Rate(k1, n1), Rate(k2, n2), fisher_exact(k1, n1, k2, n2), alpha)
