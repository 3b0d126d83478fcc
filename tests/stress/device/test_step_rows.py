"""The block protocol's row (xla_harness.stress.device.step_rows): leaves of one shape are reduced together,
and the row says what one reduction per leaf would: the same flags, the same first bad value, for any
planted non-finite element in any leaf of any dtype or shape."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from xla_harness.stress.device import step_rows

ROOT = Path(__file__).resolve().parents[3]
SHAPES = [(), (0,), (3,), (4, 3), (3, 4), (2, 3, 2)]
DTYPES = [np.float32, jnp.bfloat16, np.float16]


def per_leaf(leaves):
    return [jnp.all(jnp.isfinite(x)) for x in leaves]


@st.composite
def planted(draw):
    """Leaves of repeated shapes and mixed dtypes, some with a NaN or an infinity planted."""
    n = draw(st.integers(1, 9))
    leaves = []
    for _ in range(n):
        shape = draw(st.sampled_from(SHAPES))
        x = np.ones(shape, dtype=draw(st.sampled_from(DTYPES)))
        if x.size and draw(st.booleans()):
            x.reshape(-1)[draw(st.integers(0, x.size - 1))] = draw(st.sampled_from([np.nan, np.inf, -np.inf]))
        leaves.append(jnp.asarray(x))
    return leaves


def disagreements(flags_of, leaves) -> list[int]:
    got = [bool(f) for f in flags_of(leaves)]
    want = [bool(f) for f in per_leaf(leaves)]
    return [i for i, (a, b) in enumerate(zip(got, want, strict=True)) if a != b]


@settings(max_examples=60, deadline=None)
@given(planted())
def test_flags_by_shape_equal_one_reduction_per_leaf(leaves):
    assert disagreements(step_rows.all_finite_by_shape, leaves) == []
    assert disagreements(jax.jit(step_rows.all_finite_by_shape), leaves) == []


def test_a_grouping_that_checks_one_member_is_caught():
    def first_member_only(leaves):  # a planted fault: a group's flag read from its first leaf alone
        flags = step_rows.all_finite_by_shape(leaves)
        first: dict = {}
        return [first.setdefault(tuple(x.shape), f) for x, f in zip(leaves, flags, strict=True)]

    bad = jnp.ones((4, 3)).at[1, 2].set(jnp.nan)
    assert disagreements(first_member_only, [jnp.ones((4, 3)), bad]) == [1]
    assert disagreements(step_rows.all_finite_by_shape, [jnp.ones((4, 3)), bad]) == []


PLANTS = {"loss": ("aux", "loss"), "grad:w": ("aux", "grads", "w"), "grad:b": ("aux", "grads", "b"),
          "param:w": ("params", "w"), "param:b": ("params", "b"), "param:v": ("params", "v"),
          "opt:w": ("opt", 0, "w"), "opt:b": ("opt", 0, "b"), "opt:v": ("opt", 0, "v")}


def _tree(*nan_at: str | None):
    params = {"w": jnp.ones((4, 3)), "b": jnp.ones(3), "v": jnp.ones((4, 3), jnp.bfloat16), "n": jnp.ones(3, jnp.int32)}
    opt = ({"w": jnp.ones((4, 3)), "b": jnp.ones(3), "v": jnp.ones((4, 3))}, jnp.zeros((), jnp.int32))
    aux = {"loss": jnp.float32(1.0), "grads": {"w": jnp.ones((4, 3)), "b": jnp.ones(3)}}
    tree = {"params": params, "opt": opt, "aux": aux}
    for where in nan_at:
        if where is None:
            continue
        path = PLANTS[where]
        node = tree
        for k in path[:-1]:
            node = node[k]
        x = node[path[-1]]
        node[path[-1]] = jnp.where(jnp.arange(x.size).reshape(x.shape) == x.size - 1, jnp.nan, x).astype(x.dtype)
    return tree["params"], tree["opt"], tree["aux"]


@pytest.mark.parametrize("nan_at", [None, "loss", "grad:w", "param:b", "param:v", "opt:w"])
def test_the_row_names_the_first_bad_value_and_the_state_flag(nan_at):
    p, o, aux = _tree(nan_at)
    layout = step_rows.RowLayout.of(p, o, aux)
    rows = step_rows.new_rows()
    rows = step_rows.make_row_writer()(rows, p, o, aux)
    row = step_rows.last_rows(np.asarray(rows), 1)[0]
    loss, bad = layout.read(row)
    assert (np.asarray(rows)[:-1] == 0).all()  # the one write is the last row; the rest untouched
    if nan_at is None:
        assert bad is None and loss == 1.0 and row[2] == 1.0
        return
    want = {"loss": "loss", "grad:w": "grad:['w']", "param:b": "param:['b']", "param:v": "param:['v']",
            "opt:w": "opt:[0]['w']"}[nan_at]
    assert bad == want
    assert row[2] == (0.0 if nan_at.startswith(("param", "opt")) else 1.0)  # the new state's flag


def test_leaves_of_one_shape_are_one_reduction(monkeypatch):
    """Machine-independent: the lowered writer holds one reduce per distinct shape, where one
    reduction per leaf holds one per leaf (the row's own reductions, the loss's included, aside)."""
    p, o, aux = _tree()
    rows = step_rows.new_rows()

    def reduces() -> int:
        fresh = jax.jit(lambda *args: step_rows.write_row(*args))  # a new trace, not the cached one
        return fresh.lower(rows, p, o, aux).as_text().count("stablehlo.reduce")

    by_shape = reduces()
    monkeypatch.setattr(step_rows, "all_finite_by_shape", per_leaf)
    one_per_leaf = reduces()
    floating = [x for x in jax.tree_util.tree_leaves((aux["grads"], p, o)) if jnp.issubdtype(x.dtype, jnp.floating)]
    shapes = {tuple(x.shape) for x in floating}
    assert len(floating) == 8 and len(shapes) == 2
    assert one_per_leaf - by_shape == len(floating) - len(shapes)


def _oracle(p, o, aux) -> tuple[int, float]:
    """(the first non-finite value's position in the row's order, or -1; 1.0 when the new state is
    finite), from numpy on the host: one check per leaf, in the per-step protocol's order."""
    floating = [np.asarray(x) for x in jax.tree_util.tree_leaves(aux["grads"]) + jax.tree_util.tree_leaves((p, o))
                if jnp.issubdtype(x.dtype, jnp.floating)]  # bfloat16 included, the int leaf not
    ok = [bool(np.isfinite(np.asarray(aux["loss"])).all())] + [bool(np.isfinite(x).all()) for x in floating]
    state = ok[1 + len(jax.tree_util.tree_leaves(aux["grads"])):]
    return (ok.index(False) if False in ok else -1), float(all(state))


def _written(write, p, o, aux) -> tuple[int, float]:
    row = step_rows.last_rows(np.asarray(jax.jit(write)(step_rows.new_rows(), p, o, aux)), 1)[0]
    return int(row[1]), float(row[2])


@settings(max_examples=30, deadline=None)
@given(st.sets(st.sampled_from(sorted(PLANTS)), max_size=4))
def test_the_row_names_the_first_of_any_set_of_bad_values(bad):
    """Any set of poisoned values (the loss, gradients, parameters, optimizer state): the row's code is
    the first in the per-step protocol's order, and its state flag is whether every parameter and
    optimizer leaf is finite, as numpy says one leaf at a time."""
    p, o, aux = _tree(*bad)
    assert _written(step_rows.write_row, p, o, aux) == _oracle(p, o, aux)


def test_a_row_that_names_the_last_bad_value_is_caught():
    """A planted mutant of the select chain (the last bad value wins): the oracle tells them apart."""
    def last_wins(rows, new_params, new_opt, aux):
        parts, state_from = step_rows._ok_parts(new_params, new_opt, aux)
        code = jnp.float32(-1)
        for i, ok in enumerate(parts):
            code = jnp.where(ok, code, jnp.float32(i))
        row = jnp.stack([jnp.asarray(aux["loss"]).astype(jnp.float32), code, jnp.float32(1)])[None]
        return jnp.concatenate([rows[1:], row])

    p, o, aux = _tree("grad:b", "opt:v")
    assert _written(last_wins, p, o, aux) != _oracle(p, o, aux)
    assert _written(step_rows.write_row, p, o, aux) == _oracle(p, o, aux) == (1, 0.0)  # grads sort as b, w


def test_the_row_is_one_fused_write_after_the_leaves_reductions():
    """Machine-independent: the lowered writer's reductions are the leaves' own, one per shape (and the
    loss's): the first bad position and the state's flag add none (an ``argmin`` and an ``all`` over
    the flags' stack added two, each a kernel on a GPU and a thunk on the CPU)."""
    p, o, aux = _tree()
    text = jax.jit(step_rows.write_row).lower(step_rows.new_rows(), p, o, aux).as_text()
    floating = [x for x in jax.tree_util.tree_leaves((aux["grads"], p, o)) if jnp.issubdtype(x.dtype, jnp.floating)]
    shapes = {tuple(x.shape) for x in floating}
    loss_reduces = jax.jit(lambda x: jnp.all(jnp.isfinite(x))).lower(jnp.float32(1)).as_text().count("stablehlo.reduce")
    assert text.count("stablehlo.reduce") == len(shapes) + loss_reduces


@pytest.mark.slow
def test_the_row_check_bench_runs_at_tiny_size(tmp_path):
    out = tmp_path / "row.json"
    done = subprocess.run([sys.executable, str(ROOT / "bench/row_check.py"), "--size", "tiny", "--steps", "8",
                           "--rounds", "1", "--json", str(out)], capture_output=True, text=True, timeout=600,
                          cwd=ROOT)
    assert done.returncode == 0, done.stderr
    import json

    got = json.loads(out.read_text())
    assert set(got["writers"]) == {"loss-only", "per-leaf", "by-shape", "one-reduce"}
    kernels = {k: v["kernels"] for k, v in got["writers"].items()}
    assert kernels["loss-only"] < kernels["by-shape"] < kernels["per-leaf"], kernels
    bad = subprocess.run([sys.executable, str(ROOT / "bench/row_check.py"), "--steps", "0"], capture_output=True,
                         text=True, timeout=300, cwd=ROOT)
    assert bad.returncode == 2 and bad.stderr.startswith("error: ")


def test_bench_counts_what_launches():
    spec = importlib.util.spec_from_file_location("row_check", ROOT / "bench/row_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    text = jax.jit(lambda x, y: (jnp.sum(x), jnp.sum(y))).lower(jnp.ones(3), jnp.ones(4)).compile().as_text()
    assert module.launches(text) >= 1


def test_a_block_of_rows_reads_back_in_order_and_a_recompute_chunk_too():
    """Each write moves the rows up by one: k writes are the last k rows, oldest first (what a block's
    and a recompute chunk's reader takes); a reader that took the first k rows would read zeros."""
    p, o, aux = _tree()
    write = step_rows.make_row_writer()
    rows = step_rows.new_rows()
    for loss in (1.0, 2.0, 3.0):
        rows = write(rows, p, o, {**aux, "loss": jnp.float32(loss)})
    host = np.asarray(rows)
    assert step_rows.last_rows(host, 3)[:, 0].tolist() == [1.0, 2.0, 3.0]
    assert step_rows.last_rows(host, 2)[:, 0].tolist() == [2.0, 3.0]
    assert step_rows.last_rows(host, 0).shape == (0, 3)
    assert host[:3, 0].tolist() == [0.0, 0.0, 0.0]
