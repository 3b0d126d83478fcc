"""What the block protocol keeps of every step's first execution, on the device: one row per step in a
block's one float32 array ``[ROWS, 3]``: the step's loss as float32; the position of the first
non-finite value among the loss, ``aux["grads"]``, ``aux["updates"]``, the new parameters and the new
optimizer state, or -1; and 1.0 when the new state (parameters and optimizer state) is finite. One
jitted function writes it after each step (:func:`make_row_writer`), reading the step's outputs and
writing 12 bytes. The array is fetched once per block.

The per-step protocols keep their flags the same way (:class:`FlagPacker`): a row per step, one
array per block, one fetch.

The writer compiles once per state signature (the array has a fixed number of rows: each write moves
the rows up by one and puts the new row last, so a block of k steps holds its rows in the last k, in
order, and no index travels with the array), so no block length, however it changes, compiles
anything; the same writer records the steps a recompute runs again.

:class:`RowLayout` turns a row's code back into the name the per-step protocol gives the first bad
value (``loss``, ``grad:params['w']``, ``param:...``, ``opt:...``), in the same order it looks.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from xla_harness.names import BLOCK_ROWS as ROWS
from xla_harness.stress.device.leaves import all_finite_by_shape, is_floating, leaf_names

_STAGES = (("grads", "grad"), ("updates", "update"))


def _ok_parts(new_params, new_opt, aux) -> tuple[list[jax.Array], int]:
    """Per checked value, in the per-step protocol's order, whether it is finite (the loss, then each
    floating leaf of aux['grads'], aux['updates'], the new parameters, the new optimizer state), and
    where the state's begin: each leaf read once (:func:`all_finite_by_shape`)."""
    checked = []
    for key, _ in _STAGES:
        if key in aux:
            checked += [x for x in jax.tree_util.tree_leaves(aux[key]) if is_floating(x)]
    state_from = 1 + len(checked)
    checked += [x for x in jax.tree_util.tree_leaves((new_params, new_opt)) if is_floating(x)]
    loss_ok = jnp.all(jnp.isfinite(jnp.asarray(aux["loss"]).astype(jnp.float32)))
    return [loss_ok, *all_finite_by_shape(checked)], state_from


def write_row(rows, new_params, new_opt, aux):
    """``rows`` moved up by one row, its last row set to (the loss as float32, the first non-finite
    value's position or -1, 1.0 when the new state is finite). The position and the state's flag are
    chains of scalar selects and ands over the leaves' flags (the first False wins, as ``argmin``
    says), not reductions of their stack: they fuse with the row's write, one kernel (a CPU thunk)
    less a step than ``argmin`` and ``all`` (bench/row_check.py counts them)."""
    parts, state_from = _ok_parts(new_params, new_opt, aux)
    code = jnp.float32(-1)
    for i in reversed(range(len(parts))):
        code = jnp.where(parts[i], code, jnp.float32(i))
    state_ok = functools.reduce(jnp.logical_and, parts[state_from:], jnp.bool_(True))
    loss = jnp.asarray(aux["loss"]).astype(jnp.float32)
    row = jnp.stack([loss, code, state_ok.astype(jnp.float32)])[None]
    return jnp.concatenate([rows[1:], row])


def make_row_writer() -> Callable:
    """jit(rows, new_params, new_opt, aux) -> rows': :func:`write_row`, ``rows`` donated."""
    return jax.jit(write_row, donate_argnums=(0,))


def new_rows() -> jax.Array:
    """A block's empty array (a device array of its own)."""
    return jnp.zeros((ROWS, 3), jnp.float32)


def last_rows(host: np.ndarray, k: int) -> np.ndarray:
    """The rows of the last ``k`` writes, oldest first."""
    return host[host.shape[0] - k:] if k else host[:0]


@dataclass(frozen=True)
class RowLayout:
    """The names behind a row's code: position 0 is the loss, then one per checked leaf."""

    names: tuple[str, ...]

    @staticmethod
    def of(new_params, new_opt, aux) -> RowLayout:
        names = ["loss"]
        for key, stage in _STAGES:
            if key in aux:
                names += [f"{stage}:{n}" for n, x in zip(leaf_names(aux[key]), jax.tree_util.tree_leaves(aux[key]),
                                                          strict=True) if is_floating(x)]
        for stage, tree in (("param", new_params), ("opt", new_opt)):
            names += [f"{stage}:{n}" for n, x in zip(leaf_names(tree), jax.tree_util.tree_leaves(tree), strict=True)
                      if is_floating(x)]
        return RowLayout(tuple(names))

    def read(self, row) -> tuple[float | None, str | None]:
        """(the loss, None where it is not finite; the first bad value's name, None where every value
        was finite)."""
        loss, code = float(row[0]), int(row[1])
        bad = None if code < 0 else (self.names[code] if code < len(self.names) else "?")
        return (loss if math.isfinite(loss) else None), bad


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
