"""The JAX masking patch, tested in two venvs by `make patches-jax-check`:

XLA_HARNESS_JAX_VARIANT=stock    .venv (PyPI jax 0.12.0.1): the where-guard NaN is real,
                                 and the stock gradients of the registry are recorded;
XLA_HARNESS_JAX_VARIANT=patched  .venv-jax-patched (same jaxlib, jax sdist + patch 0001):
                                 flag off is bit-identical to stock; flag on gives exact zeros.

Without the variable (a plain `pytest`) these tests are skipped: they are only meaningful
against a known jax build, and the make target runs them in both.
"""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from harness.gradcheck import check
from harness.gradcheck.cases import REGISTRY

VARIANT = os.environ.get("XLA_HARNESS_JAX_VARIANT")
STOCK = os.environ.get("XLA_HARNESS_STOCK_GRADS", "")
pytestmark = pytest.mark.skipif(VARIANT is None, reason="run by `make patches-jax-check` in both venvs")

GUARDS = [c for c in REGISTRY if c.kind == "where-guard"]
CORPUS = [c for c in REGISTRY if c.kind != "where-guard"]
patched_only = pytest.mark.skipif(VARIANT != "patched", reason="patched venv only")
stock_only = pytest.mark.skipif(VARIANT != "stock", reason="stock venv only")


@pytest.fixture
def masking():
    jax.config.update("jax_zero_cotangent_masking", True)
    yield
    jax.config.update("jax_zero_cotangent_masking", False)


def _grads(case, mode="eager"):
    if not case.reverse:
        mode = "jvp"
    return check.gradient(case, mode, np.asarray(case.points))


def test_variant_is_the_jax_under_test():
    assert VARIANT in ("stock", "patched")
    assert hasattr(jax.lax, "masked_scale") == (VARIANT == "patched")
    assert jax.__version__ == "0.12.0.1"


@stock_only
@pytest.mark.parametrize("case", GUARDS, ids=lambda c: c.name)
def test_stock_where_guards_leak_nan(case):
    for mode in ("eager", "jit"):
        g = _grads(case, mode)
        assert np.isnan(g).any(), f"{case.name} {mode}: expected the NaN leak, got {g}"


@stock_only
def test_record_stock_gradients():
    assert STOCK, "XLA_HARNESS_STOCK_GRADS must name the file to write"
    grads = {c.name: _grads(c) for c in REGISTRY}
    assert len(grads) >= 50
    os.makedirs(os.path.dirname(STOCK) or ".", exist_ok=True)
    np.savez(STOCK, **grads)


@patched_only
def test_flag_off_is_bit_identical_to_stock():
    stock = np.load(STOCK)
    assert len(stock.files) >= 50
    assert not jax.config.jax_zero_cotangent_masking
    for c in REGISTRY:
        got = _grads(c)
        assert np.array_equal(got, stock[c.name], equal_nan=True), (c.name, got, stock[c.name])


@patched_only
@pytest.mark.parametrize("case", GUARDS, ids=lambda c: c.name)
def test_flag_on_where_guards_are_exact(case, masking):
    for mode in ("eager", "jit", "vjp", "jvp"):
        g = _grads(case, mode)
        assert np.all(np.isfinite(g)), (case.name, mode, g)
        np.testing.assert_allclose(g, case.expected, rtol=1e-6, atol=1e-6)
        dead = np.asarray(case.dead)
        assert np.all(g[dead] == 0.0), (case.name, mode, g)  # exact zeros, not tiny numbers


@patched_only
def test_flag_on_ordinary_points_within_one_ulp_of_stock(masking):
    stock = np.load(STOCK)
    for c in CORPUS:
        got = _grads(c)
        ref = stock[c.name]
        ulp = np.spacing(np.abs(ref).astype(np.float32))
        assert np.all(np.abs(got - ref) <= ulp), (c.name, got, ref)


@patched_only
def test_flag_on_agrees_with_float64_finite_differences(masking):
    for c in REGISTRY:
        if not c.smooth:
            continue
        smooth = np.asarray(c.smooth)
        got = _grads(c)
        fd = check.finite_differences(c, np.asarray(c.points))
        np.testing.assert_allclose(got[smooth], fd[smooth], rtol=2e-3, atol=1e-5, err_msg=c.name)


@patched_only
def test_second_order_and_jvp_of_grad(masking):
    f = lambda x: jnp.where(x > 0, jnp.sqrt(x), 0.0)  # noqa: E731
    x = jnp.array([-1.0, 0.0, 4.0])
    g2 = jax.vmap(jax.grad(jax.grad(f)))(x)
    np.testing.assert_allclose(g2, [0.0, 0.0, -1.0 / 32.0])
    _, t = jax.jvp(jax.vmap(jax.grad(f)), (x,), (jnp.ones(3),))
    np.testing.assert_allclose(t, [0.0, 0.0, -1.0 / 32.0])


@patched_only
def test_shard_map_on_two_cpu_devices(masking):
    from jax.sharding import Mesh
    from jax.sharding import PartitionSpec as P

    assert jax.device_count() >= 2
    mesh = Mesh(np.array(jax.devices()[:2]), ("x",))
    f = lambda x: jnp.where(x > 0, jnp.sqrt(x), 0.0)  # noqa: E731
    g = jax.jit(jax.shard_map(jax.vmap(jax.grad(f)), mesh=mesh, in_specs=P("x"), out_specs=P("x")))
    np.testing.assert_array_equal(g(jnp.array([-1.0, 0.0, 1.0, 4.0])), [0.0, 0.0, 0.5, 0.25])


@patched_only
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16, jnp.float32])
def test_low_precision_dtypes(dtype, masking):
    f = lambda x: jnp.where(x > 0, jnp.sqrt(x), jnp.zeros_like(x))  # noqa: E731
    g = jax.vmap(jax.grad(f))(jnp.array([-1.0, 0.0, 1.0, 4.0], dtype))
    assert g.dtype == dtype
    np.testing.assert_array_equal(np.asarray(g, np.float32), [0.0, 0.0, 0.5, 0.25])


@patched_only
def test_complex_and_primitive_rules():
    t = jnp.array([0.0 + 0.0j, 1.0 + 2.0j], jnp.complex64)
    d = jnp.array([np.inf + 0j, 2.0 + 0j], jnp.complex64)
    np.testing.assert_array_equal(jax.lax.masked_scale(t, d), [0.0, 2.0 + 4.0j])
    tr = jnp.array([0.0, 3.0])
    np.testing.assert_array_equal(jax.lax.masked_scale(tr, jnp.array([0.0, 2.0]), op="div"), [0.0, 1.5])
    with pytest.raises(ValueError):
        jax.lax.masked_scale(tr, tr, op="add")
    hlo = jax.jit(lambda a, b: jax.lax.masked_scale(a, b)).lower(tr, tr).as_text()
    assert "select" in hlo and "compare" in hlo
