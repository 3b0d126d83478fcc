import math
from fractions import Fraction

import pytest

from xla_harness.errors import HarnessError
from xla_harness.stress.report import stats


def test_wilson_matches_textbook_values():
    # 34 of 80 (jax-ml/jax#35409): Wilson 95% interval computed by hand from the formula.
    lo, hi = stats.wilson(34, 80)
    assert lo == pytest.approx(0.3226, abs=1e-4)
    assert hi == pytest.approx(0.5343, abs=1e-4)
    assert stats.wilson(0, 80)[0] == 0.0
    assert stats.wilson(0, 80)[1] == pytest.approx(0.0458, abs=1e-3)
    assert stats.wilson(80, 80)[1] == 1.0
    assert stats.wilson(0, 0) == (0.0, 1.0)


def test_clopper_pearson_contains_wilson_and_known_bound():
    # Zero of n: exact upper bound is 1 - (alpha/2)**(1/n).
    lo, hi = stats.clopper_pearson(0, 80)
    assert lo == 0.0
    assert hi == pytest.approx(1 - 0.025 ** (1 / 80), rel=1e-6)
    cl, ch = stats.clopper_pearson(34, 80)
    wl, wh = stats.wilson(34, 80)
    assert cl <= wl and ch >= wh  # exact interval is the more conservative one


def test_binom_cdf_against_direct_sum():
    n, p = 12, 0.3
    direct = sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(5))
    assert stats.binom_cdf(4, n, p) == pytest.approx(direct, rel=1e-12)


def test_runs_needed_is_smallest_sufficient_n():
    n = stats.runs_needed(0.05, 0.95)
    assert n == 59  # the classic "rule of three" neighbourhood: 3/59 ~ 0.051
    assert 1 - 0.05 ** (1 / n) <= 0.05 < 1 - 0.05 ** (1 / (n - 1))
    assert stats.runs_needed(0.01, 0.99) == 459


def test_compare_separates_reported_rates_from_zero():
    c = stats.compare(34, 80, 0, 80)
    assert c.significant and c.p_value < 1e-10
    same = stats.compare(3, 40, 4, 40)
    assert not same.significant and same.p_value > 0.5
    assert "do not differ" in same.sentence()


def test_fisher_exact_known_value():
    # Classic tea-tasting table [[3,1],[1,3]]: two-sided p = 0.4857.
    assert stats.fisher_exact(3, 4, 1, 4) == pytest.approx(0.4857, abs=1e-4)


@pytest.mark.parametrize("args", [(5, 3), (-1, 3)])
def test_bad_counts_raise(args):
    with pytest.raises(HarnessError):
        stats.wilson(*args)


def test_bad_confidence_raises():
    with pytest.raises(HarnessError):
        stats.runs_needed(0.1, 1.5)
    assert stats.wilson(5, 10, 0.8)[0] < stats.wilson(5, 10, 0.5)[0]


def test_table_bound_and_runs_needed_use_one_method():
    # runs_needed(b) clean steps give a table upper bound <= b; one step fewer does not.
    for b in (0.05, 0.01, 0.2):
        n = stats.runs_needed(b)
        assert stats.upper_bound(0, n) <= b < stats.upper_bound(0, n - 1)
    # With failures it is the one-sided exact bound: the upper end of the two-sided 90% interval.
    assert stats.upper_bound(34, 80) == pytest.approx(stats.clopper_pearson(34, 80, 0.90)[1], rel=1e-6)
    assert stats.Rate(0, 59).to_dict()["upper"] < 0.05


def test_chi2_survival_known_values():
    assert stats.chi2_sf(3.841458820694124, 1) == pytest.approx(0.05, rel=1e-6)
    assert stats.chi2_sf(5.991464547107979, 2) == pytest.approx(0.05, rel=1e-6)
    assert stats.chi2_sf(2.0, 2) == pytest.approx(math.exp(-1.0), rel=1e-9)  # df 2: exp(-x/2)


def test_seed_dispersion_flags_seeds_that_disagree():
    same = stats.seed_dispersion([(5, 40), (6, 40), (4, 40)])
    assert same["p_value"] > 0.5 and (same["min"], same["max"]) == (0.1, 0.15)
    apart = stats.seed_dispersion([(20, 40), (0, 40), (10, 40)])
    assert apart["p_value"] < 1e-3
    assert stats.seed_dispersion([(0, 40), (0, 40)])["p_value"] is None  # nothing to compare


def test_clean_steps_to_show_fix_is_the_smallest_sufficient_count():
    m = stats.clean_steps_to_show_fix(34, 80)
    assert stats.fisher_exact(34, 80, 0, m) < 0.05 <= stats.fisher_exact(34, 80, 0, m - 1)
    assert stats.clean_steps_to_show_fix(0, 80) is None
    # One failure in 1000 is shown fixed only after 19x as many clean steps: p = 1000 / (1000 + m)
    # exactly, so m = 19,000 gives p = 0.05 (not below) and 19,001 is the answer. A float sum puts
    # p(19,000) at 0.04999999999983838 and would answer 19,000.
    rare = stats.clean_steps_to_show_fix(1, 1000)
    assert rare == 19_001
    assert stats.fisher_exact_rational(1, 1000, 0, 19_000) == Fraction(1, 20)
    assert stats.fisher_exact_rational(1, 1000, 0, 19_001) == Fraction(1000, 20_001)


@pytest.mark.parametrize("k,n", [(1, 1000), (2, 50), (3, 100), (5, 40), (1, 20), (7, 7), (34, 80)])
def test_clean_steps_to_show_fix_matches_scipy(k, n):
    scipy_stats = pytest.importorskip("scipy.stats")
    m = stats.clean_steps_to_show_fix(k, n)
    assert scipy_stats.fisher_exact([[k, n - k], [0, m]]).pvalue < 0.05
    assert scipy_stats.fisher_exact([[k, n - k], [0, m - 1]]).pvalue >= 0.05
    assert float(stats.fisher_exact_rational(k, n, 0, m)) == pytest.approx(
        scipy_stats.fisher_exact([[k, n - k], [0, m]]).pvalue, rel=1e-9)
