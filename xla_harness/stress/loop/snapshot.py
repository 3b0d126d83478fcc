"""A copy of the training state in host memory: the block protocol's restore point once failures are
frequent enough to pay for one (:mod:`~xla_harness.stress.loop.restore`; a run that never fails never
takes one).

The copy lives in numpy buffers allocated once and reused for every later copy of the same
shapes, so after the first one a snapshot is a ``memcpy`` (CPU) or a device-to-host transfer
(GPU, TPU) and never a second copy of the state in device memory. It is taken shard by shard
(only the shards this process holds), so a sharded or multi-process state is copied and restored
in place. While it is taken, the harness holds no reference to a device buffer past the copy: a
buffer the user's step donates is donated (a live numpy view of a CPU buffer would make the
runtime copy instead).

:meth:`HostSnapshot.restore` rebuilds every leaf with its shape, dtype, weak type, sharding and
committedness, in a buffer of its own (never aliasing the reused host buffers); the caller holds
the result to the step's signatures with ``check_fed_back``.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import numpy as np

from xla_harness.stress.device.copies import copy_tree
from xla_harness.stress.loop.checkpoint import as_weak


@dataclass
class _Leaf:
    shape: tuple
    dtype: object
    weak_type: bool
    committed: bool
    sharding: object
    devices: list  # one per buffer, in the order of ``buffers``
    buffers: list  # numpy, one per addressable shard
    key_impl: object = None  # a typed PRNG key leaf: its implementation (the buffers hold its key data)


def _committed(x) -> bool:
    return bool(getattr(x, "committed", getattr(x, "_committed", True)))


class HostSnapshot:
    """Host copies of a pytree of jax Arrays, the buffers reused from one :meth:`take` to the next."""

    def __init__(self) -> None:
        self._leaves: list[_Leaf] = []
        self._treedef = None
        self.nbytes = 0

    def take(self, tree) -> None:
        """Copy ``tree`` (jax Arrays) into host memory; blocks until the copy is complete."""
        leaves, treedef = jax.tree_util.tree_flatten(tree)
        impls = [jax.random.key_impl(x) if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key) else None
                 for x in leaves]
        leaves = [jax.random.key_data(x) if impl is not None else x for x, impl in zip(leaves, impls, strict=True)]
        shards = [list(x.addressable_shards) for x in leaves]
        for per_leaf in shards:  # start every transfer before waiting for any (accelerators)
            for sh in per_leaf:
                sh.data.copy_to_host_async()
        reuse = self._treedef is not None and treedef == self._treedef and all(
            old.shape == x.shape and old.dtype == x.dtype and len(old.buffers) == len(s)
            and all(b.shape == sh.data.shape for b, sh in zip(old.buffers, s, strict=True))
            for old, x, s in zip(self._leaves, leaves, shards, strict=True))
        new_leaves = []
        for i, (x, per_leaf) in enumerate(zip(leaves, shards, strict=True)):
            bufs = self._leaves[i].buffers if reuse else [None] * len(per_leaf)
            out = []
            for b, sh in zip(bufs, per_leaf, strict=True):
                view = np.asarray(sh.data)
                if b is None:
                    b = np.empty(view.shape, view.dtype)
                np.copyto(b, view)
                del view  # no reference to the device buffer survives the copy
                out.append(b)
            new_leaves.append(_Leaf(tuple(x.shape), x.dtype, bool(getattr(x, "weak_type", False)), _committed(x),
                                    x.sharding, [sh.data.devices().pop() for sh in per_leaf], out, impls[i]))
        self._leaves, self._treedef = new_leaves, treedef
        self.nbytes = sum(b.nbytes for leaf in new_leaves for b in leaf.buffers)

    def restore(self):
        """The snapshot as a pytree of new jax Arrays (each in a device buffer of its own)."""
        if self._treedef is None:
            raise ValueError("restore before take")
        out = []
        for leaf in self._leaves:
            if not leaf.committed and len(leaf.buffers) == 1:
                arr = jax.device_put(leaf.buffers[0].copy())  # uncommitted, as the step returned it
            else:
                arr = jax.make_array_from_single_device_arrays(
                    leaf.shape, leaf.sharding,
                    [jax.device_put(b.copy(), d) for b, d in zip(leaf.buffers, leaf.devices, strict=True)])
            if leaf.key_impl is not None:
                arr = jax.random.wrap_key_data(arr, impl=leaf.key_impl)
            out.append(as_weak(arr) if leaf.weak_type else arr)
        # A buffer of XLA's own for every leaf (device_put may alias the host copy on CPU).
        return copy_tree(jax.tree_util.tree_unflatten(self._treedef, out))
