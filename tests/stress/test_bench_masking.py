"""The interval bench/masking_overhead.py reports for the median ratio (no timing here)."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from xla_harness.stress.report.stats import binom_cdf

_spec = importlib.util.spec_from_file_location(
    "masking_overhead", Path(__file__).resolve().parents[2] / "bench/masking_overhead.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


@pytest.mark.parametrize("n", [6, 9, 31, 41, 100])
def test_median_interval_is_the_tightest_order_statistic_interval_with_95_percent_coverage(n):
    values = list(np.random.default_rng(n).permutation(np.arange(n, dtype=float)))
    lo, hi = bench.median_interval(values)
    k = int(lo) + 1  # values are 0..n-1, so x_(k) = k - 1
    assert hi == n - k  # symmetric: x_(n+1-k)
    assert 1 - 2 * binom_cdf(k - 1, n, 0.5) >= 0.95  # coverage of [x_(k), x_(n+1-k)]
    assert 1 - 2 * binom_cdf(k, n, 0.5) < 0.95  # the next tighter interval does not cover


def test_median_interval_refuses_too_few_rounds():
    with pytest.raises(ValueError, match="too few"):
        bench.median_interval([1.0, 2.0, 3.0, 4.0, 5.0])


def test_median_interval_covers_the_true_median_of_a_known_distribution():
    rng = np.random.default_rng(7)
    hits = sum(lo <= 1.0 <= hi for lo, hi in
               (bench.median_interval(list(rng.lognormal(0.0, 0.1, 31))) for _ in range(2000)))
    assert 0.94 <= hits / 2000 <= 0.99  # exact coverage for n = 31 is 0.971
