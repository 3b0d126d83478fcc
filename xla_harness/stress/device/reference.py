"""The float64 reference: recompute a sampled step on the CPU in float64 and compare the
applied update with it per leaf and per row, so finite-but-wrong updates are flagged."""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from xla_harness.jaxcompat import enable_x64
from xla_harness.programs.interface import TrainProgram
from xla_harness.stress.device.leaves import leaf_names

# Relative tolerance of the float64 reference check per floating dtype: whole leaf (2-norm) and per row.
REFERENCE_RTOL = {"float32": 2e-2, "bfloat16": 0.3, "float16": 0.1, "float64": 1e-6}
ROW_RTOL = {"float32": 0.5, "bfloat16": 0.75, "float16": 0.6, "float64": 1e-3}


def _to64(x):
    """Floating leaves (bf16 included) to float64; integer leaves (step counts) unchanged."""
    a = np.asarray(x)
    if a.dtype == jnp.bfloat16 or np.issubdtype(a.dtype, np.floating):
        return jnp.asarray(a.astype(np.float64))
    return jnp.asarray(a)


def _ulp(pa: np.ndarray) -> np.ndarray:
    """Per-element spacing of the parameter dtype at the applied value (rounding of p + u)."""
    if pa.dtype == jnp.bfloat16:
        return np.abs(pa.astype(np.float64)) * 2.0**-7 + np.finfo(np.float32).tiny
    return np.abs(np.spacing(pa.astype(np.promote_types(pa.dtype, np.float32)))).astype(np.float64)


def compare_update(name: str, before: np.ndarray, after: np.ndarray, u: np.ndarray, chunk_rows: int = 8192) -> dict:
    """Does the applied change d = after - before match the float64 update u?

    Whole leaf: |d - u| <= rtol |u| + ||ulp||. Per row (first axis of a matrix): the same
    with the row's own norms and ROW_RTOL, so one lost or doubled row of a 100k-row matrix
    is an error of 100% of that row, not 1/sqrt(100k) of the leaf. Rows are processed in
    chunks, so a 100k x 2048 matrix needs a few chunk-sized float64 temporaries, not copies of it.
    """
    after = np.asarray(after)
    dt = str(after.dtype)
    rtol, row_rtol = REFERENCE_RTOL.get(dt, 2e-2), ROW_RTOL.get(dt, 0.5)
    shape = after.shape
    rows = shape[0] if len(shape) >= 2 else 1
    b2, a2, u2 = (np.asarray(x).reshape(rows, -1) for x in (before, after, np.asarray(u).reshape(shape)))
    err_sq = u_sq = ulp_sq = 0.0
    worst_row, row_ratio = None, 0.0
    for lo in range(0, rows, chunk_rows):
        a = a2[lo:lo + chunk_rows]
        d = a.astype(np.float64) - b2[lo:lo + chunk_rows].astype(np.float64)
        uc = u2[lo:lo + chunk_rows].astype(np.float64)
        ulp = _ulp(a)
        e_r = np.sum((d - uc) ** 2, axis=1)
        u_r = np.sum(uc * uc, axis=1)
        l_r = np.sum(ulp * ulp, axis=1)
        err_sq, u_sq, ulp_sq = err_sq + e_r.sum(), u_sq + u_r.sum(), ulp_sq + l_r.sum()
        if len(shape) >= 2:
            allowed = row_rtol * np.sqrt(u_r) + np.sqrt(l_r)
            e = np.sqrt(e_r)
            with np.errstate(divide="ignore", invalid="ignore"):
                r = np.where(allowed > 0, e / np.where(allowed > 0, allowed, 1.0), np.where(e > 0, np.inf, 0.0))
            i = int(np.argmax(r))
            if worst_row is None or r[i] > row_ratio:
                worst_row, row_ratio = lo + i, float(r[i])
    leaf_allowed = rtol * math.sqrt(u_sq) + math.sqrt(ulp_sq)
    err = math.sqrt(err_sq)
    leaf_ratio = err / leaf_allowed if leaf_allowed > 0 else (0.0 if err == 0 else math.inf)
    return {"leaf": name, "ratio": max(leaf_ratio, row_ratio), "leaf_ratio": leaf_ratio, "row_ratio": row_ratio,
            "row": worst_row}


def reference_check(program: TrainProgram, params_before, opt_before, batch, params_after) -> dict:
    """Recompute one step in float64 on the CPU (same state, same batch) and compare per leaf and row."""
    cpu = jax.devices("cpu")[0]
    names = leaf_names(params_before)
    with jax.default_device(cpu), enable_x64():
        p64 = jax.tree_util.tree_map(_to64, params_before)
        o64 = jax.tree_util.tree_map(_to64, opt_before)
        b64 = jax.tree_util.tree_map(jnp.asarray, batch)
        ref_p, _, aux = jax.jit(program.step)(p64, o64, b64)
        u_leaves = [np.asarray(r) - np.asarray(p) for r, p in zip(
            jax.tree_util.tree_leaves(ref_p), jax.tree_util.tree_leaves(p64), strict=True)]
        loss64 = float(np.asarray(aux["loss"]))
    worst: dict[str, Any] = {"ratio": 0.0, "leaf": None, "row": None}  # compare_update's keys
    for name, u, pb, pa in zip(names, u_leaves, jax.tree_util.tree_leaves(params_before),
                               jax.tree_util.tree_leaves(params_after), strict=True):
        if not np.issubdtype(np.asarray(pa).dtype, np.floating) and np.asarray(pa).dtype != jnp.bfloat16:
            continue
        c = compare_update(name, np.asarray(pb), np.asarray(pa), u)
        if c["ratio"] > worst["ratio"]:
            worst = c
    return {"ok": bool(worst["ratio"] <= 1.0), "worst_ratio": worst["ratio"], "worst_leaf": worst["leaf"],
            "worst_row": worst["row"], "loss64": loss64}
