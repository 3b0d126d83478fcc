"""Copies of the training state in buffers of their own, on the device, each leaf's type kept (dtype,
weak type, typed PRNG keys): the per-step commit's backup, the block protocol's restore point, a
restored snapshot."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from xla_harness.stress.device.leaves import is_floating


def new_buffer(x):
    """``x`` again in a buffer of its own, same dtype *and weak type*: ``x + 0`` with a Python 0
    (weak) keeps a weakly typed leaf weak, where ``x + zeros((), dtype)`` would make it strong and
    the step fed with it would compile to another program."""
    if is_floating(x):
        return x + 0
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):  # a typed key: its bits copied, its impl kept
        return jax.random.wrap_key_data(jax.random.key_data(x) * 1, impl=jax.random.key_impl(x))
    return x & True if jnp.result_type(x) == jnp.bool_ else x * 1  # bool * 1 would be an integer


@jax.jit
def copy_tree(tree):
    """A copy of a pytree in new buffers (the rollback backup), each leaf's type kept."""
    return jax.tree_util.tree_map(new_buffer, tree)
