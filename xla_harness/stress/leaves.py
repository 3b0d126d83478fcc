"""What the harness asks of a state's leaves: their names (``['embed']``, as ``jax.tree_util.keystr``
prints the path) and whether a leaf is floating point (what finiteness checks read; integers, booleans
and typed PRNG keys are not)."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def leaf_names(tree) -> list[str]:
    return [jax.tree_util.keystr(path) for path, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]


def is_floating(x) -> bool:
    return jnp.issubdtype(jnp.asarray(x).dtype if not hasattr(x, "dtype") else x.dtype, jnp.floating)
