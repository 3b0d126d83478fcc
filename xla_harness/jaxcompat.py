"""Shims for the jax versions the harness supports (0.9 to 0.12): one place for API differences.

Each shim detects the feature (a parameter, an attribute), never compares version strings, and
on a newer jax calls jax's own function unchanged, so the traced program is the one jax builds.
On an older jax it builds the same operations jax's newer implementation does.

* :func:`one_hot`: ``jax.nn.one_hot(..., out_sharding=)`` is jax >= 0.11; before it, an
  explicit-axes caller gets jax 0.11's implementation: the comparison with an iota whose class
  axis is sharded as ``out_sharding`` says (no resharding; on jax 0.12 both give the same jaxpr
  and StableHLO, ``tests/test_jaxcompat.py`` checks values and sharding on every jax).
* :func:`xla_hlo`: jaxlib's C++ HLO text parser (``hlo_module_from_text``) is
  ``jax._src.lib.hlo`` from jaxlib 0.10, ``jax._src.lib._jax`` before; the parsed module's
  instructions with their shapes and operands are readable from jaxlib 0.12
  (:func:`xla_hlo_reads_structure`: 0.9 lists no instructions, 0.10/0.11 no shapes).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable


@functools.cache
def one_hot_takes_out_sharding() -> bool:
    """True when ``jax.nn.one_hot`` has an ``out_sharding`` parameter (jax >= 0.11)."""
    import jax

    try:
        return "out_sharding" in inspect.signature(jax.nn.one_hot).parameters
    except (TypeError, ValueError):  # pragma: no cover - a wrapped function without a signature
        return False


def one_hot(x, num_classes: int, *, dtype=None, out_sharding=None):
    """``jax.nn.one_hot(x, num_classes, dtype=dtype, out_sharding=out_sharding)`` on any
    supported jax; the classes go on the last axis. ``out_sharding`` is a ``NamedSharding``
    whose spec, without its last entry, is the spec of ``x`` (as jax requires)."""
    import jax

    if out_sharding is None:
        return jax.nn.one_hot(x, num_classes, dtype=dtype)
    if one_hot_takes_out_sharding():
        return jax.nn.one_hot(x, num_classes, dtype=dtype, out_sharding=out_sharding)
    return _one_hot_explicit(x, num_classes, dtype, out_sharding)


def _one_hot_explicit(x, num_classes: int, dtype, out_sharding):
    """What jax >= 0.11 does for ``one_hot(out_sharding=)``: ``x[..., None] == iota`` with the
    iota of shape [1, ..., 1, num_classes] sharded on its last axis as ``out_sharding``'s, under
    a jit named ``_one_hot`` as jax's (so the traced program has the same structure)."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding

    if not isinstance(out_sharding, NamedSharding):
        raise TypeError(f"out_sharding must be a NamedSharding on this jax ({jax.__version__}), "
                        f"got {type(out_sharding).__name__}")
    dtype = jnp.result_type(float) if dtype is None else jnp.dtype(dtype)  # jax's default float
    return _one_hot_jit()(jnp.asarray(x), num_classes=int(num_classes), dtype=dtype, out_sharding=out_sharding)


@functools.cache
def _one_hot_jit():
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    def _one_hot(x, *, num_classes, dtype, out_sharding):
        spec = tuple(out_sharding.spec) + (None,) * (x.ndim + 1 - len(out_sharding.spec))
        iota_sharding = NamedSharding(out_sharding.mesh, P(*(None,) * x.ndim, spec[x.ndim]))
        lhs = jax.lax.expand_dims(x, (x.ndim,))
        rhs = jax.lax.broadcasted_iota(x.dtype, (1,) * x.ndim + (num_classes,), x.ndim, out_sharding=iota_sharding)
        return (lhs == rhs).astype(dtype)

    return jax.jit(_one_hot, static_argnames=("num_classes", "dtype", "out_sharding"))


@functools.cache
def xla_hlo():
    """The jaxlib module with ``hlo_module_from_text`` (XLA's own HLO text parser), or None when
    this jaxlib exposes none. Private jaxlib API: used to check HLO text against XLA."""
    try:
        from jax._src import lib
    except ImportError:  # pragma: no cover - jax without its private lib package
        return None
    for name in ("hlo", "_jax"):
        module = getattr(lib, name, None)
        if module is not None and hasattr(module, "hlo_module_from_text"):
            return module
    return None


@functools.cache
def xla_hlo_reads_structure() -> bool:
    """True when a module parsed by :func:`xla_hlo` lists its computations' instructions with
    their shapes and operands (jaxlib >= 0.12), what :mod:`xla_harness.hlo.xla_oracle` reads."""
    module = xla_hlo()
    if module is None:
        return False
    comp, ins = getattr(module, "HloComputation", None), getattr(module, "HloInstruction", None)
    return hasattr(comp, "instructions") and all(hasattr(ins, a) for a in ("shape", "operands", "opcode", "name"))


def enable_x64():
    """A context manager turning float64 on: ``jax.enable_x64(True)`` (jax >= 0.12), else the
    experimental one (jax <= 0.11)."""
    import jax

    if hasattr(jax, "enable_x64"):
        return jax.enable_x64(True)
    from jax.experimental import enable_x64 as experimental_enable_x64

    return experimental_enable_x64()


def compiled_call(compiled) -> Callable:
    """What calling a ``jax.stages.Compiled`` runs once it has been called: the executable's C++ call
    that ``Compiled.__call__`` makes and forwards every call to (``_call``, in the jax versions the
    harness supports), or the ``Compiled`` itself where this jax keeps none. Calling it skips one
    Python frame per call of the step (the stress loop's host time per step)."""
    call = getattr(compiled, "_call", None)
    return call if callable(call) else compiled
