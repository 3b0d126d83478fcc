"""The Flax NNX example (examples/flax_tied): loads as a --program, trains, and shows the tied pattern."""

from pathlib import Path

import jax
import numpy as np
import pytest

from harness.hlo.parser import parse_module
from harness.hlo.tied import tied_summary
from harness.programs.interface import TrainProgram, load_program

pytest.importorskip("flax", reason="not checked: flax is not installed (pip install -e '.[flax]')")

ROOT = Path(__file__).resolve().parents[1]


def _table(params):
    (leaf,) = jax.tree.leaves(params["embed"])
    return np.asarray(leaf)


def _run(program, steps):
    key = jax.random.key(0)
    params, opt_state = program.init(key)
    exe = program.jit().lower(params, opt_state, program.batch(key, 0)).compile()
    losses = []
    for step in range(steps):
        params, opt_state, aux = exe(params, opt_state, program.batch(key, step))
        losses.append(float(aux["loss"]))
    summary = tied_summary(parse_module(exe.as_text()), (program.options["vocab"], program.options["d_model"]))
    return summary, np.array(losses), _table(params)


def test_flax_example_takes_a_workaround_variant(monkeypatch):
    """The barrier variant written into the Flax model: the lookup's gradient is scattered into
    fresh zeros, not onto the dense gradient, and the trajectory is the model's own."""
    monkeypatch.chdir(ROOT)
    plain = load_program("examples/flax_tied/program.py:make_program")  # a factory works too
    base = _run(plain, 5)
    barrier = _run(load_program("examples/flax_tied/program.py:make_program", variant="barrier"), 5)
    assert base[0].scatter_onto_dense >= 1
    assert barrier[0].scatters and {s.in_place_source for s in barrier[0].scatters} == {"broadcast"}
    np.testing.assert_allclose(barrier[1], base[1], rtol=1e-5)
    np.testing.assert_allclose(barrier[2], base[2], atol=1e-5, rtol=0)


def test_flax_tied_example_runs_and_has_the_tied_pattern(monkeypatch):
    monkeypatch.chdir(ROOT)
    program = load_program("examples/flax_tied/program.py:program")
    assert isinstance(program, TrainProgram) and program.name == "flax-tied"
    key = jax.random.key(0)
    params, opt_state = program.init(key)
    vocab, d_model = program.options["vocab"], program.options["d_model"]
    assert _table(params).shape == (vocab, d_model)
    exe = program.jit().lower(params, opt_state, program.batch(key, 0)).compile()
    table0 = _table(params).copy()
    losses = []
    for step in range(3):
        params, opt_state, aux = exe(params, opt_state, program.batch(key, step))
        losses.append(float(aux["loss"]))
    assert np.all(np.isfinite(losses))
    assert abs(losses[0] - np.log(vocab)) < 1.0  # untrained: about uniform over the vocabulary
    assert not np.array_equal(_table(params), table0)
    # nnx.Embed.__call__ gathers from the table, nnx.Embed.attend multiplies by it: the compiled
    # step scatters the lookup's gradient onto the dense gradient of the same table.
    summary = tied_summary(parse_module(exe.as_text()), (vocab, d_model))
    assert summary.gathers >= 1 and summary.dots >= 2
    assert summary.scatter_onto_dense >= 1
