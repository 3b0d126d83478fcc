"""Bitwise comparison of a step's outputs and, where they differ, by how much (elements, largest
absolute difference, ULPs), on the device: the frozen protocol's nondeterminism check
(:func:`make_repeat_check`). Bits, not values: 0.0 and -0.0 differ, NaN payloads are compared,
typed PRNG keys by their key data."""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from xla_harness.stress.device.copies import new_buffer


def _bits(x) -> jax.Array:
    """``x`` as integers with the same bits (floats) or as it is: bitwise comparison, NaN payloads and
    signed zeros included."""
    x = jnp.asarray(x)
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
        return jax.random.key_data(x)
    if jnp.issubdtype(x.dtype, jnp.floating):
        return jax.lax.bitcast_convert_type(x, jnp.dtype(f"uint{8 * x.dtype.itemsize}"))
    return x


def bitwise_equal(a, b) -> jax.Array:
    same = [jnp.all(_bits(x) == _bits(y)) for x, y in zip(jax.tree_util.tree_leaves(a),
                                                          jax.tree_util.tree_leaves(b), strict=True)]
    return jnp.all(jnp.stack(same)) if same else jnp.bool_(True)


def _ordered(x) -> jax.Array:
    """A float's bits as int32 keys in the float's own order (adjacent floats differ by 1): the ULP
    distance of two floats is the difference of their keys."""
    width = x.dtype.itemsize * 8
    bits = jax.lax.bitcast_convert_type(x, jnp.dtype(f"int{width}")).astype(jnp.int32)
    sign = jnp.int32(1 << (width - 1)) if width < 32 else jnp.int32(-(2**31))
    magnitude = bits & (~sign if width == 32 else jnp.int32((1 << (width - 1)) - 1))
    negative = (bits < 0) if width == 32 else (bits & sign) != 0
    return jnp.where(negative, -magnitude, magnitude)


def leaf_difference(a, b) -> jax.Array:
    """[elements that differ in any bit, largest |a - b|, largest distance in ULPs] of two arrays of one
    shape (float32; floats: ULPs of their own type; integers and booleans: the difference itself)."""
    a, b = jnp.asarray(a), jnp.asarray(b)
    if jax.dtypes.issubdtype(a.dtype, jax.dtypes.prng_key):
        a, b = jax.random.key_data(a), jax.random.key_data(b)
    if a.size == 0:
        return jnp.zeros((3,), jnp.float32)
    differs = _bits(a) != _bits(b)
    count = jnp.sum(differs).astype(jnp.float32)
    if jnp.issubdtype(a.dtype, jnp.floating) and a.dtype.itemsize <= 4:
        gap = jnp.abs(a.astype(jnp.float32) - b.astype(jnp.float32))
        ka, kb = _ordered(a), _ordered(b)
        same = (ka >= 0) == (kb >= 0)  # no int32 overflow within one sign; across signs in float32
        ulp = jnp.where(same, jnp.abs(ka - kb).astype(jnp.float32),
                        jnp.abs(ka).astype(jnp.float32) + jnp.abs(kb).astype(jnp.float32))
    elif jnp.issubdtype(a.dtype, jnp.floating):  # float64: its gap, ULPs of float32 are meaningless
        gap = jnp.abs(a - b).astype(jnp.float32)
        ulp = jnp.full(a.shape, jnp.nan, jnp.float32)
    else:
        gap = jnp.abs(a.astype(jnp.float32) - b.astype(jnp.float32))
        ulp = gap
    gap, ulp = jnp.where(differs, jnp.nan_to_num(gap, nan=jnp.inf), 0.0), jnp.where(differs, ulp, 0.0)
    return jnp.stack([count, jnp.max(gap), jnp.max(ulp)])


def differences(a, b) -> jax.Array:
    """float32[leaves, 3]: :func:`leaf_difference` of every leaf of two pytrees of one structure."""
    rows = [leaf_difference(x, y) for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b),
                                                   strict=True)]
    return jnp.stack(rows) if rows else jnp.zeros((0, 3), jnp.float32)


def make_repeat_check() -> Callable:
    """jit(first, first_ok, outputs, ok) -> (differs, detail, first', first_ok'): the frozen protocol's
    nondeterminism check. ``first`` holds the outputs of the seed's first finite call (all of them:
    parameters, optimizer state, aux), ``first_ok`` whether there was one yet; a finite call whose
    outputs differ from them in any bit ``differs``, and ``detail`` (:func:`differences`, zero
    unless it differs) says in which leaves, how many elements, by how much. Everything stays on
    device; ``first`` is donated (kept in place, or replaced by ``outputs`` until a finite call is
    seen)."""

    def repeat(first, first_ok, outputs, ok):
        differs = first_ok & ok & ~bitwise_equal(first, outputs)
        n = len(jax.tree_util.tree_leaves(outputs))
        # computed only when the call differs (a conditional: no extra pass over the outputs otherwise)
        detail = jax.lax.cond(differs, lambda: differences(first, outputs), lambda: jnp.zeros((n, 3), jnp.float32))
        kept = jax.tree_util.tree_map(lambda f, o: jnp.where(first_ok, f, o), first, outputs)
        return differs, detail, kept, first_ok | ok

    return jax.jit(repeat, donate_argnums=(0,))


@jax.jit
def start_repeat(outputs):
    """The repeat check's state before a seed's first call: a copy of that call's outputs (donated to
    the check, which replaces it by the outputs of the first finite call) and ``first_ok`` false, as
    jitted outputs, so the seed's first call runs the same check, in the same signature, as every
    later call (nothing compiles after it)."""
    return jax.tree_util.tree_map(new_buffer, outputs), jnp.zeros((), jnp.bool_)
