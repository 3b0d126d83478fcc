"""Checkpoints of one (configuration, seed) so ``--resume`` need not replay from step 0: the file format
(:func:`save_checkpoint`, :func:`load_checkpoint`), when the train protocol writes one
(:class:`Checkpointer`), and a checkpoint as the block protocol's older restore point
(:class:`CheckpointPoint`)."""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from xla_harness.errors import HarnessError
from xla_harness.stress.proof.harness import Harnessed
from xla_harness.stress.proof.same_program import abstract_like


def checkpoint_path(out: Path, label: str, seed: int) -> Path:
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", label.replace("=", "-"))
    return out / "ckpt" / f"{safe}_seed{seed}.npz"


def _is_key(dtype) -> bool:
    return jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)


def save_checkpoint(path: Path, step: int, params, opt_state) -> None:
    """Atomically write (step, state) so --resume need not replay from step 0 (a typed PRNG key as its
    key data)."""
    leaves = jax.tree_util.tree_leaves((params, opt_state))
    arrays = {f"a{i}": np.asarray(jax.device_get(jax.random.key_data(x) if _is_key(x.dtype) else x))
              for i, x in enumerate(leaves)}
    tmp = path.with_suffix(".tmp.npz")
    # Any: recent numpy stubs type savez(..., allow_pickle: bool, **kwds) and mypy matches '**' against
    # allow_pickle (the keys are 'a0', 'a1', ...); a type: ignore would be unused with older stubs.
    stored: dict[str, Any] = {k: (v.view(np.uint16) if v.dtype == jnp.bfloat16 else v) for k, v in arrays.items()}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as fh:
            np.savez(fh, step=np.int64(step), **stored)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError as exc:  # a full disk, a read-only folder: the checkpoint named, the last good one kept
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise HarnessError(f"cannot write the checkpoint {path}: {exc.strerror or exc}") from None


def as_weak(x):
    """``x`` as a weakly typed array (what a step returns for a weak leaf); ``x`` unchanged where this
    jax has no way to say so (the same-program check then refuses the resumed run, naming the leaf)."""
    try:
        from jax._src.lax import lax as lax_internal

        return lax_internal._convert_element_type(x, weak_type=True)
    except (ImportError, AttributeError, TypeError):
        return x


def load_checkpoint(path: Path, like) -> tuple[int, Any] | None:
    """(step, state) from a checkpoint whose leaves match ``like`` (arrays or ``ShapeDtypeStruct``s:
    dtype, shape, weak type and sharding are restored from it); None if absent or unusable."""
    try:
        with np.load(path) as z:
            step = int(z["step"])
            leaves, treedef = jax.tree_util.tree_flatten(like)
            out = []
            for i, ref in enumerate(leaves):
                a = z[f"a{i}"]
                sharding = getattr(ref, "sharding", None)
                if _is_key(ref.dtype):
                    impl = getattr(ref.dtype, "_impl", None)
                    if impl is None or a.shape != tuple(ref.shape) + tuple(impl.key_shape):
                        return None
                    out.append(jax.random.wrap_key_data(jax.device_put(a, sharding), impl=impl))
                    continue
                if ref.dtype == jnp.bfloat16:
                    a = a.view(jnp.bfloat16)
                if a.shape != ref.shape:
                    return None
                leaf = jax.device_put(a.astype(ref.dtype), sharding)  # no sharding: uncommitted, as jit's
                out.append(as_weak(leaf) if getattr(ref, "weak_type", False) else leaf)
            return step, jax.tree_util.tree_unflatten(treedef, out)
    except (OSError, KeyError, ValueError):
        return None


@dataclass
class CheckpointPoint:
    path: Path
    step: int
    like: tuple  # the state's leaves as the step returns them (ShapeDtypeStructs)

    def restore(self) -> tuple:
        got = load_checkpoint(self.path, self.like)
        if got is None or got[0] != self.step:
            raise HarnessError(f"the checkpoint {self.path} written at step {self.step} could not be read back")
        return tuple(got[1])


@dataclass
class Checkpointer:
    """The train protocol's ``--resume`` checkpoints of one (configuration, seed): due every
    ``every_seconds`` and when a stop is requested; written only after the results sink has put every
    line before it on disk (``before_save``), so a checkpoint is never ahead of the records. What it
    writes is also the block protocol's newest restore point."""

    h: Harnessed
    path: Path
    every_seconds: float
    should_stop: Callable[[], bool]
    before_save: Callable[[], None] = lambda: None
    last: float = field(default_factory=time.monotonic)

    def due(self) -> bool:
        return self.should_stop() or time.monotonic() - self.last >= self.every_seconds

    def save(self, step: int, params, opt_state) -> CheckpointPoint:
        self.before_save()
        self.h.counters.to_host(lambda tree: save_checkpoint(self.path, step, *tree), (params, opt_state))
        self.last = time.monotonic()
        return CheckpointPoint(self.path, step, abstract_like((params, opt_state)))
