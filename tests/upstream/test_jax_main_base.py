"""The jax series' second base, jax-ml/jax main (series.toml: base, checked_against): the whole
default series applies there in order, checked the way `make patches-check JAX_SRC=...` does.

The tree comes from $XLA_HARNESS_JAX_MAIN, else ~/.cache/xla-harness/jax-main (a checkout or an
export of jax main, e.g. `git archive main | tar -x -C ~/.cache/xla-harness/jax-main`); where
there is none the test is skipped with a line saying so."""

import os
from pathlib import Path

import pytest

from xla_harness.upstream.patchcheck import check_upstream
from xla_harness.upstream.series import load_series

JAX_MAIN = Path(os.environ.get("XLA_HARNESS_JAX_MAIN", Path.home() / ".cache" / "xla-harness" / "jax-main"))


def test_series_toml_records_both_jax_bases():
    jax = load_series().upstream("jax")
    assert "sdist" in jax.base and "jax-ml/jax main" in jax.base
    assert "main" in jax.checked_against and len(jax.base_sha256) == 64


@pytest.mark.skipif(not (JAX_MAIN / "jax" / "__init__.py").is_file(),
                    reason=f"not checked: no jax main tree at {JAX_MAIN} (set XLA_HARNESS_JAX_MAIN)")
def test_default_jax_series_applies_to_jax_main():
    series = load_series()
    results = check_upstream(series, series.upstream("jax"), JAX_MAIN, "default")
    assert [r.status for r in results] == ["applies"] * len(series.upstream("jax").select("default")), \
        "\n".join(r.line() for r in results)
