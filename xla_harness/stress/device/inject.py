"""Per-step random keys and fault injection.

Every step's (data key, fault key) is a pure function of (seed, step); which steps get a
fault is planned on the host (:func:`injected_steps`) and the injector corrupts the step's
*output* between calls: NaN/inf kinds prove the detector, the finite kinds (a lost or
doubled row of the target matrix's update) prove the float64 reference check.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from xla_harness.errors import HarnessError
from xla_harness.stress.device.leaves import is_floating, leaf_names


@jax.jit
def _step_keys(seed, step):
    key = jax.random.fold_in(jax.random.key(seed), step)
    k_data, k_fault = jax.random.split(key)
    return k_data, k_fault


def step_keys(seed, step) -> tuple[jax.Array, jax.Array]:
    """(data key, fault key) of one step: a pure function of (seed, step)."""
    return _step_keys(np.uint32(seed), np.int32(step))


def injected_steps(seed: int, steps: int, rate: float) -> np.ndarray:
    """The steps fault injection corrupts for (seed, rate): what a perfect detector reports."""
    if rate <= 0.0:
        return np.zeros(0, np.int64)
    hits = jax.vmap(lambda s: jax.random.uniform(
        jax.random.split(jax.random.fold_in(jax.random.key(seed), s))[1]) < rate)(
        jnp.arange(steps, dtype=jnp.int32))
    return np.flatnonzero(np.asarray(hits))


def target_index(params, target_leaf: str | None) -> int:
    """Index (in tree_leaves order) of the parameter leaf faults are injected into."""
    names = leaf_names(params)
    leaves = jax.tree_util.tree_leaves(params)
    if target_leaf is not None:
        if target_leaf not in names:
            raise HarnessError(f"target leaf {target_leaf} is not a parameter (have {', '.join(names[:8])}...)")
        return names.index(target_leaf)
    floats = [i for i, x in enumerate(leaves) if is_floating(x)]
    if not floats:
        raise HarnessError("the program has no floating-point parameter to inject faults into")
    return max(floats, key=lambda i: leaves[i].size)


def opt_target_index(opt_state, like) -> int:
    """The last optimizer-state leaf shaped like the target parameter (Adam's second moment)."""
    cands = [i for i, x in enumerate(jax.tree_util.tree_leaves(opt_state))
             if is_floating(x) and x.shape == like.shape]
    if not cands:
        raise HarnessError("no optimizer-state leaf has the target parameter's shape; "
                           "nan-opt/inf-opt injection needs one")
    return cands[-1]


def make_injector(kind: str, p_index: int, o_index: int | None) -> Callable:
    """jit(old_params, new_params, new_opt, key) -> (new_params, new_opt), one leaf corrupted."""

    def corrupt_element(x, key, value):
        flat = x.reshape(-1)
        idx = jax.random.randint(key, (), 0, flat.size)
        return flat.at[idx].set(jnp.asarray(value, x.dtype)).reshape(x.shape)

    def inject(old_params, new_params, new_opt, key):
        p_leaves, p_def = jax.tree_util.tree_flatten(new_params)
        o_leaves, o_def = jax.tree_util.tree_flatten(new_opt)
        if kind == "nan":
            p_leaves[p_index] = corrupt_element(p_leaves[p_index], key, jnp.nan)
        elif kind in ("nan-opt", "inf-opt"):
            o_leaves[o_index] = corrupt_element(o_leaves[o_index], key, jnp.nan if kind == "nan-opt" else jnp.inf)
        else:  # a lost or doubled row of the target matrix's update (finite, wrong)
            new, old = p_leaves[p_index], jax.tree_util.tree_leaves(old_params)[p_index]
            rows = new.reshape(new.shape[0], -1) if new.ndim else new.reshape(1, 1)
            upd = rows.astype(jnp.float32) - (old.reshape(rows.shape)).astype(jnp.float32)
            moved = jnp.any(upd != 0, axis=1)
            r = jnp.argmax(jnp.where(moved, jax.random.uniform(key, moved.shape), -1.0))
            fixed = old.reshape(rows.shape)[r] if kind == "lost-row" else (rows[r] + upd[r]).astype(new.dtype)
            p_leaves[p_index] = rows.at[r].set(fixed).reshape(new.shape)
        return jax.tree_util.tree_unflatten(p_def, p_leaves), jax.tree_util.tree_unflatten(o_def, o_leaves)

    return jax.jit(inject, donate_argnums=(1, 2))
