"""The three modes really differ in which paths carry gradient into the tied matrix W."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from xla_harness.errors import HarnessError
from xla_harness.programs.tied_embedding import ModelConfig, init_params, loss_fn, make_batches

from ..helpers import TINY


def _grads(mode, params=None):
    cfg = ModelConfig(mode=mode, remat=False, **TINY)
    params = params or init_params(cfg, jax.random.key(0))
    batches = make_batches(cfg, jax.random.key(1))
    return params, batches, jax.grad(loss_fn)(params, batches, cfg)


def _unused_rows(batches, vocab):
    used = np.zeros(vocab, bool)
    for b in batches:
        used[np.asarray(b[:, :-1]).ravel()] = True  # inputs go through the lookup
    return np.flatnonzero(~used)


@pytest.mark.slow
def test_sparse_only_gradient_reaches_only_looked_up_rows():
    params, batches, g = _grads("sparse_only")
    unused = _unused_rows(batches, TINY["vocab"])
    assert unused.size > 0, "test data must leave some vocabulary rows unused"
    gw = np.asarray(g["embed"])
    assert np.all(gw[unused] == 0.0)  # scatter-add only: untouched rows get exactly nothing
    assert np.count_nonzero(np.abs(gw).sum(1)) == TINY["vocab"] - unused.size
    assert np.all(np.abs(np.asarray(g["unembed"])).sum(1) > 0)  # the untied output matrix is dense


def test_dense_only_gradient_is_dense_and_has_no_scatter_part():
    _, batches, g = _grads("dense_only")
    gw = np.asarray(g["embed"])
    assert np.all(np.abs(gw).sum(1) > 0)  # every row gets a logit gradient
    assert "unembed" not in g


def test_full_gradient_is_the_sum_of_both_paths():
    params, batches, g_full = _grads("full")
    _, _, g_dense = _grads("dense_only", params)
    # The sparse path alone, evaluated at the same W: an untied model whose output matrix is W.
    sparse_params = {**params, "unembed": jax.lax.stop_gradient(params["embed"])}
    _, _, g_sparse = _grads("sparse_only", sparse_params)
    np.testing.assert_allclose(np.asarray(g_full["embed"]),
                               np.asarray(g_dense["embed"]) + np.asarray(g_sparse["embed"]),
                               rtol=1e-4, atol=1e-7)
    unused = _unused_rows(batches, TINY["vocab"])
    # On rows no token looks up, full and dense-only agree exactly: no scatter contribution.
    np.testing.assert_array_equal(np.asarray(g_full["embed"])[unused], np.asarray(g_dense["embed"])[unused])
    assert not np.allclose(np.asarray(g_full["embed"]), np.asarray(g_dense["embed"]))


@pytest.mark.slow
def test_remat_changes_the_program_not_the_gradient():
    cfg_on = ModelConfig(mode="full", remat=True, **TINY)
    cfg_off = ModelConfig(mode="full", remat=False, **TINY)
    params = init_params(cfg_on, jax.random.key(0))
    batches = make_batches(cfg_on, jax.random.key(1))
    g_on = jax.grad(loss_fn)(params, batches, cfg_on)
    g_off = jax.grad(loss_fn)(params, batches, cfg_off)
    np.testing.assert_allclose(np.asarray(g_on["embed"]), np.asarray(g_off["embed"]), rtol=1e-5, atol=1e-8)
    jaxpr_on = str(jax.make_jaxpr(lambda p: jax.grad(loss_fn)(p, batches, cfg_on))(params))
    assert "remat" in jaxpr_on or "checkpoint" in jaxpr_on


def test_batches_are_heterogeneous():
    cfg = ModelConfig(**TINY)
    a, b = make_batches(cfg, jax.random.key(3))
    assert a.shape == (8, 8) and b.shape == (8, 16)
    assert int(jnp.max(b)) < TINY["vocab"] // 8 <= int(jnp.max(a))


@pytest.mark.slow
def test_bf16_model_runs():
    cfg = ModelConfig(dtype="bf16", **TINY)
    params = init_params(cfg, jax.random.key(0))
    assert params["embed"].dtype == jnp.bfloat16
    loss = loss_fn(params, make_batches(cfg, jax.random.key(1)), cfg)
    assert loss.dtype == jnp.float32 and jnp.isfinite(loss)


@pytest.mark.parametrize("kw", [dict(mode="tied"), dict(dtype="f16"), dict(heads=3), dict(seq=1), dict(vocab=0)])
def test_bad_model_config(kw):
    with pytest.raises(HarnessError):
        ModelConfig(**{**TINY, **kw})
