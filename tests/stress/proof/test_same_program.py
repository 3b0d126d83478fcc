"""The "same program" proof can fail: each way a harness could change the program it measures is
planted here and caught (weak types, dtypes, shardings and committedness of the arguments,
donation), and a weakly typed leaf next to bf16 parameters keeps the plain loop's losses bit for bit."""

from __future__ import annotations

from dataclasses import replace

import jax
import jax.numpy as jnp
import pytest

from xla_harness.errors import HarnessError
from xla_harness.programs.interface import TrainProgram
from xla_harness.stress.device import checker
from xla_harness.stress.device.inject import step_keys
from xla_harness.stress.loop import snapshot
from xla_harness.stress.runner import (
    check_fed_back,
    check_same_program,
    initial_state,
    prepare,
    run_config,
)
from xla_harness.stress.spec import StressSpec


def weak_scale_program() -> TrainProgram:
    """bf16 weights and a weakly typed f32 scale the step returns as it got it: weak x bf16 stays bf16
    in a plain loop; made strong, the product becomes f32 and the losses change."""

    def init(key):
        w = (jax.random.normal(key, (16, 8)) * 0.3).astype(jnp.bfloat16)
        return {"w": w, "scale": jnp.asarray(0.75)}, {"count": jnp.zeros((), jnp.int32)}

    def batch(key, step):
        kx, ky = jax.random.split(key)
        return jax.random.normal(kx, (4, 16)).astype(jnp.bfloat16), jax.random.normal(ky, (4, 8))

    def loss_fn(w, scale, b):
        x, y = b
        pred = (x @ w) * scale  # bf16 with a weak scale; f32 with a strong one
        return jnp.mean((pred.astype(jnp.float32) - y) ** 2)

    def step(params, opt, b):
        loss, g = jax.value_and_grad(loss_fn)(params["w"], params["scale"], b)
        new = {"w": (params["w"] - 0.1 * g).astype(jnp.bfloat16), "scale": params["scale"]}
        return new, {"count": opt["count"] + 1}, {"loss": loss}

    return TrainProgram(name="weak-scale", init=init, batch=batch, step=step)


def _harness(program: TrainProgram, steps: int = 8, **spec):
    spec = StressSpec(program="weak-scale", seeds=(1,), steps=steps, block=4, **spec)
    return prepare(spec, {}, program)


def _harness_losses(program: TrainProgram, steps: int = 8, **spec) -> list[float]:
    h = _harness(program, steps, **spec)
    state = initial_state(h, 1)
    batch = h.program.batch(step_keys(1, 0)[0], 0)
    h = check_same_program(h, state.params, state.opt_state, batch)
    return [r.loss for block in run_config(h, 1, state) for r in block.records]


def _plain_losses(program: TrainProgram, steps: int = 8) -> list[float]:
    step = jax.jit(program.step, donate_argnums=(0, 1))
    params, opt = program.init(jax.random.key(1))
    out = []
    for s in range(steps):
        params, opt, aux = step(params, opt, program.batch(step_keys(1, s)[0], s))
        out.append(float(aux["loss"]))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("commit", ["block", "step"])
def test_weak_type_leaf_keeps_the_plain_loops_losses_bit_for_bit(commit):
    program = weak_scale_program()
    assert program.init(jax.random.key(0))[0]["scale"].weak_type
    assert _harness_losses(program, commit=commit) == _plain_losses(program)


@pytest.mark.slow
def test_a_copy_that_makes_a_weak_leaf_strong_is_refused(monkeypatch):
    """Per-step commit: plant the old backup copy (``x + zeros((), dtype)``: strong): the first
    feedback is refused."""
    monkeypatch.setattr(checker, "new_buffer", lambda x: x + jnp.zeros((), x.dtype) if jnp.issubdtype(
        x.dtype, jnp.floating) else x * 1)
    with pytest.raises(HarnessError, match=r"\['scale'\] back with weak type False where the step returned True"):
        _harness_losses(weak_scale_program(), commit="step")


@pytest.mark.slow
def test_a_restore_that_makes_a_weak_leaf_strong_is_refused(monkeypatch):
    """Block commit: a step whose new state is not finite (an injected NaN) is rolled back from the
    block's device copy (or, where copies do not fit, a host snapshot); plant a restore that forgets
    the weak type: the restored state is refused before it is fed back."""
    from xla_harness.stress.loop import restore

    def strong(self):
        return tuple(jax.tree_util.tree_map(lambda x: x.astype(x.dtype), self.copy))

    monkeypatch.setattr(restore.DevicePoint, "restore", strong)
    with pytest.raises(HarnessError, match=r"\['scale'\] back with weak type False where the step returned True"):
        _harness_losses(weak_scale_program(), commit="block", inject_rate=0.5)
    monkeypatch.undo()
    # The host snapshot's restore, held to the same check.
    from xla_harness.stress.proof.harness import abstract, check_fed_back

    h = _harness(weak_scale_program(), commit="block")
    params = initial_state(h, 1).params
    taken = snapshot.HostSnapshot()
    taken.take(params)
    check_fed_back(h, taken.restore(), abstract(params))  # the real restore keeps the weak type
    monkeypatch.setattr(snapshot, "as_weak", lambda x: x)
    with pytest.raises(HarnessError, match=r"\['scale'\] back with weak type False where the step returned True"):
        check_fed_back(h, taken.restore(), abstract(params))
    monkeypatch.undo()  # the same run with the real restore goes through, the NaN counted
    h = _harness(weak_scale_program(), commit="block", inject_rate=0.5)
    records = [r for b in run_config(h, 1, initial_state(h, 1)) for r in b.records]
    assert any(not r.finite for r in records)


@pytest.mark.slow
@pytest.mark.parametrize("plant,says", [
    ("donation", "donated_invars"),
    ("dtype", "global_in_avals"),
    ("weak type", "global_in_avals"),
    ("committed", "committed"),
])
def test_changed_arguments_or_donation_are_refused(plant, says):
    program = weak_scale_program()
    h = _harness(program)
    state = initial_state(h, 1)
    params, opt = state.params, state.opt_state
    batch = h.program.batch(step_keys(1, 0)[0], 0)
    if plant == "donation":  # the harness's step jitted without the user's donation
        h = replace(h, jitted=jax.jit(program.step))
    elif plant == "dtype":  # a leaf's dtype changed on the way in
        params = {**params, "scale": params["scale"].astype(jnp.float16)}
    elif plant == "weak type":  # a weakly typed leaf made strong (same dtype)
        params = {**params, "scale": params["scale"].astype(jnp.float32)}
        assert not params["scale"].weak_type
    else:  # committed to a device (a plain loop's arrays are not)
        params = jax.device_put(params, jax.devices()[0])
    with pytest.raises(HarnessError, match=f"differs from a plain loop's jax.jit of it \\([^)]*{says}"):
        h = check_same_program(h, params, opt, batch)


@pytest.mark.slow
def test_unchanged_arguments_pass_and_record_the_fingerprint():
    h = _harness(weak_scale_program())
    state = initial_state(h, 1)
    h = check_same_program(h, state.params, state.opt_state, h.program.batch(step_keys(1, 0)[0], 0))
    fp = h.fingerprint
    assert fp == h.fingerprint and len(fp["id"]) == 16


def test_fed_back_sharding_change_is_refused():
    """A leaf fed back on another device than the step returned it on."""
    h = _harness(weak_scale_program())
    a = jax.device_put(jnp.ones(3), jax.devices()[0])
    b = jax.device_put(jnp.ones(3), jax.devices()[1])
    check_fed_back(h, {"w": a}, {"w": a})
    with pytest.raises(HarnessError, match=r"\['w'\] back with sharding"):
        check_fed_back(h, {"w": b}, {"w": a})


def test_fed_back_dtype_change_is_refused():
    h = _harness(weak_scale_program())
    with pytest.raises(HarnessError, match=r"\['w'\] back with dtype float32 where the step returned bfloat16"):
        check_fed_back(h, {"w": jnp.ones(3)}, {"w": jnp.ones(3, jnp.bfloat16)})



def test_the_plain_loop_is_traced_anew_and_nothing_else_compiles_again():
    """The proof's plain loop shares no trace with the harness's (the step's body is traced twice:
    once for each lowering, so a lowering the harness got wrong cannot be read back from jax's
    cache as the plain loop's), and the caches are not cleared: a jitted function the user's batch
    calls compiles once, not again after the proof."""
    from xla_harness.stress.runner import check_same_program, first_batch

    traces = []

    @jax.jit
    def features(key):
        return jax.random.normal(key, (4,))

    base = weak_scale_program()

    def step(params, opt_state, batch):
        traces.append(1)
        return base.step(params, opt_state, batch)

    def batch(key, s):
        features(key)  # a jitted function of the user's, compiled the first time it runs
        return base.batch(key, s)

    program = TrainProgram(name="traced", init=base.init, batch=batch, step=step)
    h = _harness(program)
    state = initial_state(h, 1)
    b = first_batch(h, 1)
    assert features._cache_size() == 1
    h = check_same_program(h, state.params, state.opt_state, b)
    assert len(traces) == 2  # the harness's lowering and the plain loop's, each its own trace
    first_batch(h, 1)
    assert features._cache_size() == 1  # the proof emptied no cache: the batch's function did not compile again
