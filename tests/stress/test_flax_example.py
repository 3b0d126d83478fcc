"""The Flax NNX example (examples/flax_tied): loads as a --program, trains, and shows the tied pattern."""

import json
from pathlib import Path

import jax
import numpy as np
import pytest

from xla_harness.cli import main
from xla_harness.hlo.parser import parse_module
from xla_harness.hlo.tied import tied_summary
from xla_harness.programs.interface import TrainProgram, load_program
from xla_harness.stress.device.inject import step_keys
from xla_harness.stress.proof.fingerprint import fingerprint
from xla_harness.stress.report import summary as report
from xla_harness.stress.results import store as results
from xla_harness.stress.runner import check_same_program, initial_state, prepare
from xla_harness.stress.spec import StressSpec

pytest.importorskip("flax", reason="not checked: flax is not installed (make setup installs it; "
                                   "pip install -e '.[flax]')")

ROOT = Path(__file__).resolve().parents[2]


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


@pytest.mark.slow
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


@pytest.mark.slow
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


SMALL = ["--program-option", "vocab=128", "--program-option", "d_model=32", "--program-option", "ffn=64",
         "--program-option", "layers=1", "--program-option", "seq=16"]


@pytest.mark.slow
def test_flax_step_under_the_harness_is_a_plain_user_jit(monkeypatch):
    """Same program: the step the harness runs has the fingerprint (optimized HLO, aliasing, buffer
    sizes) of the user's own ``jax.jit(step, donate_argnums=(0, 1))``, built here from the example."""
    monkeypatch.chdir(ROOT)
    spec = StressSpec(program="examples/flax_tied/program.py:program", seeds=(1,), steps=1)
    h = prepare(spec, spec.configs()[0])
    state = initial_state(h, 1)
    batch = h.program.batch(step_keys(1, 0)[0], 0)
    h = check_same_program(h, state.params, state.opt_state, batch)
    ours = h.fingerprint
    user_program = load_program("examples/flax_tied/program.py:program")
    user = jax.jit(user_program.step, donate_argnums=(0, 1)).lower(state.params, state.opt_state, batch).compile()
    assert fingerprint(user) == ours
    assert ours["alias_size_in_bytes"] > 0  # the donated state is aliased, as in the user's loop
    # The fingerprint tells programs apart: the barrier variant of the same model compiles differently.
    barrier = load_program("examples/flax_tied/program.py:make_program", variant="barrier")
    other = jax.jit(barrier.step, donate_argnums=(0, 1)).lower(state.params, state.opt_state, batch).compile()
    assert fingerprint(other)["hlo_sha256"] != ours["hlo_sha256"]


@pytest.mark.slow
def test_flax_example_through_the_cli(monkeypatch, tmp_path, capsys):
    """`xla-harness stress --program examples/flax_tied/program.py:make_program`: planted NaNs in the
    embedding table are found exactly, the printed fingerprint is the plain jit's, and the table
    reads back with `report`."""
    monkeypatch.chdir(ROOT)
    out = tmp_path / "o"
    rc = main(["stress", "--program", "examples/flax_tied/program.py:make_program", *SMALL, "--seeds", "1",
               "--steps", "12", "--inject-rate", "0.25", "--out", str(out), "--quiet"])
    text = capsys.readouterr().out
    assert rc == 0
    (label,) = {b.label for b in results.read_results(out / "stress.jsonl").blocks}
    assert label.startswith("examples/flax_tied/program.py:make_program[") and "vocab=128" in label
    assert f"step fingerprint {label}: " in text and "= plain jax.jit(step, donate_argnums=(0, 1))" in text
    steps = [s for b in results.read_results(out / "stress.jsonl").blocks for s in b.steps]
    planted = [s.step for s in steps if s.injected]
    assert planted and [s.step for s in steps if not s.finite] == planted
    # The fault lands in the largest parameter: the tied table nnx.Embed holds.
    assert {s.first_bad for s in steps if not s.finite} == {"param:['embed']['embedding'].value"}
    assert main(["report", str(out), "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)["configs"]
    assert row["nonfinite"] == len(planted) and row["steps"] == 12
    assert report.load_table([out]).gaps == []
