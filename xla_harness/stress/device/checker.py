"""The checker outside the measured step: separate jitted functions over the step's inputs
and outputs (is the loss finite, every new parameter and optimizer-state leaf,
``aux["grads"]``/``aux["updates"]`` when the step exposes them; max |new - old|), and the
train protocol's commit, which rolls back to the last good state after a non-finite step.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from xla_harness.stress.device.copies import new_buffer
from xla_harness.stress.device.leaves import all_finite_by_shape, is_floating


def _finite_per_leaf(trees: dict) -> dict[str, jax.Array]:
    """Per tree, one flag per floating leaf: every tree's leaves in one pass, leaves of one shape
    reduced together (:func:`~xla_harness.stress.device.leaves.all_finite_by_shape`)."""
    leaves = {k: [x for x in jax.tree_util.tree_leaves(t) if is_floating(x)] for k, t in trees.items()}
    flags = all_finite_by_shape([x for xs in leaves.values() for x in xs])
    out, i = {}, 0
    for k, xs in leaves.items():
        out[k] = jnp.stack(flags[i:i + len(xs)]) if xs else jnp.ones((0,), bool)
        i += len(xs)
    return out


def _max_abs_change(old, new) -> jax.Array:
    vals = [jnp.max(jnp.abs(n.astype(jnp.float32) - o.astype(jnp.float32))) if n.size else jnp.float32(0)
            for o, n in zip(jax.tree_util.tree_leaves(old), jax.tree_util.tree_leaves(new), strict=True)
            if is_floating(n)]
    return jnp.max(jnp.stack(vals)) if vals else jnp.float32(0)


def _flags(old_params, new_params, new_opt, aux) -> dict:
    loss = jnp.asarray(aux["loss"]).astype(jnp.float32)
    checked = {"params_ok": new_params, "opt_ok": new_opt,
               **{f"{extra}_ok": aux[extra] for extra in ("grads", "updates") if extra in aux}}
    flags = {
        "loss": loss,
        "loss_ok": jnp.all(jnp.isfinite(loss)),
        **_finite_per_leaf(checked),
        "max_abs_update": _max_abs_change(old_params, new_params),
    }
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
        copy = jax.tree_util.tree_map(new_buffer, nxt)
        return flags, nxt[0], nxt[1], copy[0], copy[1]

    return jax.jit(commit, donate_argnums=(0, 1, 2, 3))


def _all_finite(tree) -> jax.Array:
    leaves = all_finite_by_shape([x for x in jax.tree_util.tree_leaves(tree) if is_floating(x)])
    return jnp.all(jnp.stack(leaves)) if leaves else jnp.bool_(True)


def make_state_check() -> Callable:
    """jit(params, opt_state) -> one flag: every floating leaf finite (the block protocol's check at
    the end of a block of steps; reads the state once, writes nothing)."""
    def state_finite(params, opt_state):
        return _all_finite((params, opt_state))

    return jax.jit(state_finite)
