"""A step whose arguments change signature mid-run (a last, smaller batch): a plain ``jax.jit`` loop
compiles again, and so does the harness, as an explicit event: the new signature proven against a
plain loop, compiled, counted in the step's compiles and said on stderr (what changed), with every
step recorded under both commits. Planted: an executable that is not proven again refuses the call."""

from __future__ import annotations

from dataclasses import replace

import jax
import jax.numpy as jnp
import optax
import pytest

from xla_harness.errors import HarnessError
from xla_harness.programs.interface import TrainProgram, step_from_loss
from xla_harness.stress.loop.block_size import new_block_size
from xla_harness.stress.proof import harness as harness_module
from xla_harness.stress.proof import same_program as proof
from xla_harness.stress.runner import check_same_program, first_batch, initial_state, prepare, run_config
from xla_harness.stress.spec import StressSpec

SMALL_FROM = 6  # steps from here get a batch of 2 rows instead of 4


def _program() -> TrainProgram:
    opt = optax.sgd(0.1)

    def init(key):
        params = {"w": jax.random.normal(key, (3,))}
        return params, opt.init(params)

    def batch(key, step):  # traced (for the proof's plain loop), the step is no int: the first batches' shape
        return jax.random.normal(key, (2 if isinstance(step, int) and step >= SMALL_FROM else 4, 3))

    def loss(params, x):
        return jnp.mean((x @ params["w"]) ** 2)

    return TrainProgram(name="shrinking-batch", init=init, batch=batch, step=step_from_loss(loss, opt),
                        donate_argnums=(0, 1))


@pytest.mark.parametrize("commit", ["block", "step"])
def test_a_batch_that_changes_shape_is_proven_compiled_again_counted_and_said(commit, capsys):
    spec = StressSpec(program="shrinking-batch", seeds=(1,), steps=10, commit=commit, block=4)
    h = prepare(spec, {}, _program())
    state = initial_state(h, 1)
    h = check_same_program(h, state.params, state.opt_state, first_batch(h, 1))
    assert h.step_compiles == 1
    records = [r for b in run_config(h, 1, state, block_size=new_block_size(spec)) for r in b.records]
    assert [r.step for r in records] == list(range(10)) and all(r.finite for r in records)
    assert h.step_compiles == 2
    err = capsys.readouterr().err
    assert err.count("warning: ") == 1 and "another shape ((4, 3) before, (2, 3) now)" in err
    assert "compile 2 of the step" in err


def test_a_step_not_proven_again_refuses_the_new_signature(monkeypatch):
    monkeypatch.setattr(proof.ProvenStep, "follow", lambda self, sig, args: None)  # planted: no new executable
    spec = StressSpec(program="shrinking-batch", seeds=(1,), steps=10, commit="step", block=4)
    h = prepare(spec, {}, _program())
    state = initial_state(h, 1)
    h = check_same_program(h, state.params, state.opt_state, first_batch(h, 1))
    with pytest.raises(HarnessError, match="step raised TypeError: Argument types differ"):
        list(run_config(h, 1, state))


def test_the_block_loop_counts_each_call_once_across_a_new_signature(monkeypatch):
    """The block loop calls the step's executable and the row writer with no counting frame and tells the
    counters what it called; across the refused call that a new signature makes (the step made again
    through ``call_step``, which counts its own) the count still equals the calls themselves, logged by
    the functions that run them."""
    calls = {"row": 0, "copy": 0}

    def logged(name, fn):
        def call(*args):
            out = fn(*args)
            calls[name] += 1
            return out
        return call

    monkeypatch.setattr(harness_module, "copy_tree", logged("copy", harness_module.copy_tree))
    spec = StressSpec(program="shrinking-batch", seeds=(1,), steps=10, commit="block", block=4)
    h = prepare(spec, {}, _program())
    state = initial_state(h, 1)
    h = check_same_program(h, state.params, state.opt_state, first_batch(h, 1))
    h = replace(h, write_row=h.counters.counted(logged("row", h.write_row.fn)))
    before, calls["copy"] = h.counters.dispatches, 0
    records = [r for b in run_config(h, 1, state, block_size=new_block_size(spec)) for r in b.records]
    assert len(records) == 10 and h.step_compiles == 2  # each step ran once; the new signature was met
    assert calls["row"] == 10 and calls["copy"] >= 1
    assert h.counters.dispatches - before == len(records) + calls["row"] + calls["copy"]
