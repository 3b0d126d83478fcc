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


def test_flax_tied_example_runs_and_has_the_tied_pattern(monkeypatch):
    monkeypatch.chdir(ROOT)
    program = load_program("examples/flax_tied/program.py:program")
    assert isinstance(program, TrainProgram) and program.name == "flax-tied"
    key = jax.random.key(0)
    params, opt_state = program.init(key)
    vocab, d_model = program.options["vocab"], program.options["d_model"]
    def table(params):
        (leaf,) = jax.tree.leaves(params["embed"])
        return np.asarray(leaf)

    assert table(params).shape == (vocab, d_model)
    exe = program.jit().lower(params, opt_state, program.batch(key, 0)).compile()
    table0 = table(params).copy()
    losses = []
    for step in range(3):
        params, opt_state, aux = exe(params, opt_state, program.batch(key, step))
        losses.append(float(aux["loss"]))
    assert np.all(np.isfinite(losses))
    assert abs(losses[0] - np.log(vocab)) < 1.0  # untrained: about uniform over the vocabulary
    assert not np.array_equal(table(params), table0)
    # nnx.Embed.__call__ gathers from the table, nnx.Embed.attend multiplies by it: the compiled
    # step scatters the lookup's gradient onto the dense gradient of the same table.
    summary = tied_summary(parse_module(exe.as_text()), (vocab, d_model))
    assert summary.gathers >= 1 and summary.dots >= 2
    assert summary.scatter_onto_dense >= 1
