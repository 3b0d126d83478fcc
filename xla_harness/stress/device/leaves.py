"""What the harness asks of a state's leaves: their names (``['embed']``, as ``jax.tree_util.keystr``
prints the path) and whether a leaf is floating point (what finiteness checks read; integers, booleans
and typed PRNG keys are not), and whether each is finite, read in as few reductions as the shapes allow."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def leaf_names(tree) -> list[str]:
    return [jax.tree_util.keystr(path) for path, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]


def is_floating(x) -> bool:
    return jnp.issubdtype(jnp.asarray(x).dtype if not hasattr(x, "dtype") else x.dtype, jnp.floating)


def all_finite_by_shape(leaves: list) -> list[jax.Array]:
    """Per leaf, whether every element is finite, as ``[jnp.all(jnp.isfinite(x)) for x in leaves]``
    says, but leaves of one shape are reduced together: one variadic reduce per shape (the parameters,
    their gradients and both Adam moments of a weight share one), which a GPU runs as one kernel
    instead of one per leaf. No leaf is reshaped, so a sharded leaf is read where it lies."""
    groups: dict[tuple, list[int]] = {}
    for i, x in enumerate(leaves):
        groups.setdefault(tuple(x.shape), []).append(i)
    flags: list = [None] * len(leaves)
    for shape, members in groups.items():
        if len(members) == 1 or not shape:
            for i in members:
                flags[i] = jnp.all(jnp.isfinite(leaves[i]))
            continue
        operands = [jnp.isfinite(leaves[i]) for i in members]
        reduced = jax.lax.reduce(operands, [jnp.bool_(True)] * len(members),
                                 lambda a, b: [jnp.logical_and(x, y) for x, y in zip(a, b, strict=True)],
                                 tuple(range(len(shape))))
        for i, flag in zip(members, reduced, strict=True):
            flags[i] = flag
    return flags
