"""The checker outside the measured step: separate jitted functions over the step's inputs
and outputs (is the loss finite, every new parameter and optimizer-state leaf,
``aux["grads"]``/``aux["updates"]`` when the step exposes them; max |new - old|), and the
train protocol's commit, which rolls back to the last good state after a non-finite step.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from xla_harness.stress.inject import _floating


def _finite_per_leaf(tree) -> jax.Array:
    leaves = [x for x in jax.tree_util.tree_leaves(tree) if _floating(x)]
    if not leaves:
        return jnp.ones((0,), bool)
    return jnp.stack([jnp.all(jnp.isfinite(x)) for x in leaves])


def _max_abs_change(old, new) -> jax.Array:
    vals = [jnp.max(jnp.abs(n.astype(jnp.float32) - o.astype(jnp.float32))) if n.size else jnp.float32(0)
            for o, n in zip(jax.tree_util.tree_leaves(old), jax.tree_util.tree_leaves(new), strict=True)
            if _floating(n)]
    return jnp.max(jnp.stack(vals)) if vals else jnp.float32(0)


def _flags(old_params, new_params, new_opt, aux) -> dict:
    loss = jnp.asarray(aux["loss"]).astype(jnp.float32)
    flags = {
        "loss": loss,
        "loss_ok": jnp.all(jnp.isfinite(loss)),
        "params_ok": _finite_per_leaf(new_params),
        "opt_ok": _finite_per_leaf(new_opt),
        "max_abs_update": _max_abs_change(old_params, new_params),
    }
    for extra in ("grads", "updates"):
        if extra in aux:
            flags[f"{extra}_ok"] = _finite_per_leaf(aux[extra])
    ok = flags["loss_ok"]
    for k, v in flags.items():
        if k.endswith("_ok") and k != "loss_ok":
            ok = ok & jnp.all(v)
    flags["ok"] = ok
    flags["state_ok"] = jnp.all(flags["params_ok"]) & jnp.all(flags["opt_ok"])
    return flags


def make_checker() -> Callable:
    """jit(old_params, new_params, new_opt, aux) -> flags (frozen protocol: outputs are discarded)."""
    return jax.jit(_flags)


def make_commit() -> Callable:
    """jit(backup_p, backup_o, new_p, new_o, aux) -> (flags, next_p, next_o, backup_p', backup_o').

    Train protocol: the next state is the step's output when its new state (parameters and optimizer
    state) is finite, else the backup (rollback of params *and* optimizer state); a step with a
    non-finite loss or gradient but a finite new state is recorded non-finite and not rolled back (a
    plain loop goes on from it). The new backup is a separate copy of the next state.
    """

    def commit(backup_p, backup_o, new_p, new_o, aux):
        flags = _flags(backup_p, new_p, new_o, aux)
        ok = flags["state_ok"]
        nxt = jax.tree_util.tree_map(lambda n, b: jnp.where(ok, n, b), (new_p, new_o), (backup_p, backup_o))
        copy = jax.tree_util.tree_map(_new_buffer, nxt)
        return flags, nxt[0], nxt[1], copy[0], copy[1]

    return jax.jit(commit, donate_argnums=(0, 1, 2, 3))


def _new_buffer(x):
    """``x`` again in a buffer of its own, same dtype *and weak type*: ``x + 0`` with a Python 0
    (weak) keeps a weakly typed leaf weak, where ``x + zeros((), dtype)`` would make it strong and
    the step fed with it would compile to another program."""
    if _floating(x):
        return x + 0
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):  # a typed key: its bits copied, its impl kept
        return jax.random.wrap_key_data(jax.random.key_data(x) * 1, impl=jax.random.key_impl(x))
    return x & True if jnp.result_type(x) == jnp.bool_ else x * 1  # bool * 1 would be an integer


@jax.jit
def _copy(tree):
    """A copy of a pytree in new buffers (the rollback backup), each leaf's type kept."""
    return jax.tree_util.tree_map(_new_buffer, tree)


def _all_finite(tree) -> jax.Array:
    leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree_util.tree_leaves(tree) if _floating(x)]
    return jnp.all(jnp.stack(leaves)) if leaves else jnp.bool_(True)


def make_state_check() -> Callable:
    """jit(params, opt_state) -> one flag: every floating leaf finite (the block protocol's check at
    the end of a block of steps; reads the state once, writes nothing)."""
    def state_finite(params, opt_state):
        return _all_finite((params, opt_state))

    return jax.jit(state_finite)


def _bits(x) -> jax.Array:
    """``x`` as integers with the same bits (floats) or as it is: bitwise comparison, NaN payloads and
    signed zeros included."""
    x = jnp.asarray(x)
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
        return jax.random.key_data(x)
    if jnp.issubdtype(x.dtype, jnp.floating):
        return jax.lax.bitcast_convert_type(x, jnp.dtype(f"uint{8 * x.dtype.itemsize}"))
    return x


def _bitwise_equal(a, b) -> jax.Array:
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


def _leaf_difference(a, b) -> jax.Array:
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
    """float32[leaves, 3]: :func:`_leaf_difference` of every leaf of two pytrees of one structure."""
    rows = [_leaf_difference(x, y) for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b),
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
        differs = first_ok & ok & ~_bitwise_equal(first, outputs)
        n = len(jax.tree_util.tree_leaves(outputs))
        # computed only when the call differs (a conditional: no extra pass over the outputs otherwise)
        detail = jax.lax.cond(differs, lambda: differences(first, outputs), lambda: jnp.zeros((n, 3), jnp.float32))
        kept = jax.tree_util.tree_map(lambda f, o: jnp.where(first_ok, f, o), first, outputs)
        return differs, detail, kept, first_ok | ok

    return jax.jit(repeat, donate_argnums=(0,))


def bucket(n: int) -> int:
    """The power of two at or above ``n`` (a block's size)."""
    return 1 << max(0, n - 1).bit_length()


def _write_flags(rows, n, flags):
    row = jnp.concatenate([jnp.ravel(x).astype(jnp.float32) for x in jax.tree_util.tree_leaves(flags)])
    return jax.lax.dynamic_update_slice(rows, row[None], (n, jnp.int32(0))), n + 1


_WRITE_FLAGS = jax.jit(_write_flags, donate_argnums=(0,))


class FlagPacker:
    """The flags of a block's steps (dicts of device arrays, one per step) written one row per step into
    one float32 array [rows, F] on the device as the steps run (one jitted write per step, the row's
    index a device scalar it returns incremented), and read back into host dicts. ``rows``: the
    largest block (a power of two at or above the sync size), so the write compiles once per flag
    layout, whatever the blocks' lengths."""

    def __init__(self, rows: int = 16) -> None:
        self.rows = bucket(rows)

    def start(self, flags: dict) -> tuple[jax.Array, jax.Array, tuple]:
        """A block's empty array for flags shaped like ``flags``, its first index, its layout for
        :meth:`unpack`."""
        leaves, treedef = jax.tree_util.tree_flatten(flags)
        layout = (treedef, [(int(np.prod(x.shape)), x.shape, x.dtype) for x in leaves])
        width = sum(size for size, _, _ in layout[1])
        return jnp.zeros((self.rows, width), jnp.float32), jnp.zeros((), jnp.int32), layout

    @staticmethod
    def write(rows: jax.Array, n: jax.Array, flags: dict) -> tuple[jax.Array, jax.Array]:
        return _WRITE_FLAGS(rows, n, flags)

    @staticmethod
    def unpack(host: np.ndarray, n: int, layout: tuple) -> list[dict]:
        treedef, parts = layout
        out = []
        for row in host[:n]:
            values, i = [], 0
            for size, shape, dtype in parts:
                chunk = row[i:i + size].reshape(shape)
                values.append(chunk != 0 if dtype == jnp.bool_ else chunk)
                i += size
            out.append(jax.tree_util.tree_unflatten(treedef, values))
        return out
