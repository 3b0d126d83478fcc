"""The declared public API: every name in ``xla_harness.__all__`` resolves, importing the package
imports no jax, and the names do what README's examples use them for."""

import subprocess
import sys
from pathlib import Path

import pytest

import xla_harness

HLO = Path(__file__).parents[1] / "hlo"


def test_every_public_name_resolves():
    for name in xla_harness.__all__:
        assert getattr(xla_harness, name) is not None, name
    assert set(xla_harness.__all__) <= set(dir(xla_harness))
    with pytest.raises(AttributeError, match="no attribute 'runner'"):
        xla_harness.runner  # noqa: B018 - an internal module is not an attribute of the package


@pytest.mark.slow
def test_import_costs_no_jax():
    code = "import sys, xla_harness; print('jax' in sys.modules, xla_harness.__version__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", xla_harness.__version__]


def test_scan_text_reads_and_classifies_a_fixture():
    findings, _, backend = xla_harness.scan_text((HLO / "transpose_moves_data.hlo").read_text())
    assert backend == "unknown" and [f.cls for f in findings] == ["hazard"] and findings[0].path == ["transpose"]


def test_stats_is_the_statistics_module():
    assert xla_harness.stats.upper_bound(0, 80) == pytest.approx(1 - 0.05 ** (1 / 80))


def test_all_names_exactly_the_lazy_exports():
    assert set(xla_harness.__all__) == {"__version__", *xla_harness._EXPORTS}


def test_origin_of_says_whose_nan_it_is():
    import jax.numpy as jnp

    def step(params, opt_state, batch):
        return params, opt_state, {"loss": jnp.sum(batch)}

    o = xla_harness.origin_of(step, ({"w": jnp.ones(2)}, ()), jnp.array([1.0, jnp.nan]), replay=None)
    assert isinstance(o, xla_harness.Origin) and o.cls == "input" and "batch[1] is NaN" in o.summary
