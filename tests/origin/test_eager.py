"""The op-by-op evaluation names where a non-finite value was born: the earliest birth among the
ancestors of the non-finite outputs, an inf counted (exp, not the mul that made NaN of it), a -inf the
program absorbs never named, bodies of jitted helpers entered, and the select behind a where-gradient
trap found across the jit jax wraps jnp.where in. Each expectation is planted in the function tested."""

from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from xla_harness.origin.eager import evaluate


def _run(f, *args):
    closed = jax.make_jaxpr(f)(*args)
    return evaluate(closed, args, [True] * len(closed.jaxpr.outvars))


def _line_of(f, marker: str) -> int:
    lines, start = inspect.getsourcelines(f)
    return start + next(i for i, text in enumerate(lines) if marker in text)


def overflowing(x):
    y = jnp.exp(x * 100.0)  # mark: exp
    return jnp.sum(y * 0.0)


def test_an_overflow_is_named_at_the_exp_not_at_the_nan_it_becomes():
    ev = _run(overflowing, jnp.array([0.5, 1.0, 2.0]))
    assert not ev.finite
    assert [b.site.primitive for b in ev.births] == ["exp", "mul"]  # inf born at exp, NaN at inf * 0
    first = ev.first
    assert (first.site.primitive, first.kind, first.index) == ("exp", "inf", (1,))
    assert first.operands[0].value == pytest.approx(100.0)
    assert first.site.frames[0].file == __file__ and first.site.frames[0].line == _line_of(overflowing, "mark: exp")
    assert ev.first_nan.site.primitive == "mul" and ev.first_nan.nan_from_inf


def test_a_masking_minus_inf_that_is_absorbed_is_never_named():
    mask = jnp.array([True, False, True])

    def attention(x):
        scores = jnp.where(mask, x, -jnp.inf)
        return jnp.sum(jax.nn.softmax(scores) * jnp.arange(3.0))

    ev = _run(jax.grad(attention), jnp.array([0.1, 0.2, 0.3]))
    assert ev.finite and ev.births == []


def test_a_fully_masked_row_names_where_nan_was_made_from_infinities():
    def attention(x):
        scores = jnp.where(jnp.zeros(3, bool), x, -jnp.inf)  # every entry masked
        return jnp.sum(jax.nn.softmax(scores))

    ev = _run(attention, jnp.array([0.1, 0.2, 0.3]))
    assert not ev.finite
    # the mask's -inf fill, where it meets the data: a constant of the program that reaches the output
    assert (ev.first.site.primitive, ev.first.kind, ev.first.from_constant) == ("select_n", "-inf", True)
    assert ev.first_nan.nan_from_inf  # then -inf - (-inf) = NaN in the softmax


@jax.jit
def _helper(x):
    return jnp.log(x)  # mark: helper


def test_the_body_of_a_jitted_helper_is_entered_and_its_line_named():
    ev = _run(lambda x: _helper(x) * 2.0, jnp.array([1.0, 0.0]))
    first = ev.first
    assert first.site.primitive == "log" and len(first.site.path) == 2  # inside the jit equation
    assert first.site.frames[0].line == _line_of(_helper.__wrapped__, "mark: helper")


def masked_root(x):
    return jnp.sum(jnp.where(x > 0, jnp.sqrt(x), 0.0))  # mark: where


def test_the_select_behind_a_where_gradient_trap_is_found():
    ev = _run(jax.grad(masked_root), jnp.array([0.0, 1.0, 4.0]))
    assert not ev.finite
    trap = next(b for b in ev.births if b.masked_by is not None)
    assert trap.site.primitive == "mul" and trap.nan_from_inf
    assert trap.masked_by.primitive == "select_n"
    assert trap.masked_by.frames[0].line == _line_of(masked_root, "mark: where")


def test_a_nan_that_never_reaches_a_checked_output_is_not_a_failure():
    def f(x):
        return x + 1.0, jnp.log(x - 10.0)

    closed = jax.make_jaxpr(f)(jnp.ones(2))
    ev = evaluate(closed, [jnp.ones(2)], [True, False])  # the second output is not the step's
    assert ev.finite and ev.births == []
    ev = evaluate(closed, [jnp.ones(2)], [True, True])
    assert ev.nonfinite == [1] and ev.first.site.primitive == "log"


def test_a_loop_is_one_equation():
    def f(x):
        return jax.lax.fori_loop(0, 3, lambda i, y: y * 1e20, x)

    ev = _run(f, jnp.ones(2))
    assert not ev.finite
    assert ev.first.site.primitive in ("scan", "while") and ev.first.kind == "inf"


def test_captured_values_are_the_equation_operands_and_results():
    closed = jax.make_jaxpr(overflowing)(jnp.array([1.0]))
    path = next((i,) for i, e in enumerate(closed.jaxpr.eqns) if e.primitive.name == "exp")
    ev = evaluate(closed, [jnp.array([1.0])], [True], capture=[path])
    operands, results = ev.captured[path]
    np.testing.assert_allclose(operands[0], [100.0])
    assert np.isinf(results[0]).all()


@jax.jit
def _logged(x):
    return jnp.log(x)  # mark: logged


def _first_site(x):
    return _logged(x)  # mark: first call


def _second_site(x):
    return _logged(x) * 2.0  # mark: second call


def test_a_jitted_helper_traced_once_names_the_call_that_failed():
    """jax reuses a jitted function's first trace: below the function's own frame, its equations carry
    the first call's lines. The line named is the function's own, then the call that failed."""
    assert _run(_first_site, jnp.array([1.0, 2.0])).finite  # traced, and cached, from here first
    frames = _run(_second_site, jnp.array([1.0, 0.0])).first.site.frames
    assert frames[0].line == _line_of(_logged.__wrapped__, "mark: logged")
    assert frames[1].line == _line_of(_second_site, "mark: second call")


def masked_overflow(x):
    logits = jnp.where(jnp.array([True, False]), x * 100.0, -jnp.inf)  # a mask in one element
    return jnp.sum(jnp.exp(logits))  # mark: masked exp


def test_a_mask_in_one_element_does_not_hide_an_overflow_in_another():
    """Births are decided element by element for elementwise equations: exp(100) = inf is born though
    its operand holds the mask's -inf elsewhere (where exp gives a finite 0)."""
    ev = _run(masked_overflow, jnp.array([1.0, 0.5]))
    assert (ev.first.site.primitive, ev.first.kind, ev.first.index) == ("exp", "inf", (0,))
    assert ev.first.site.frames[0].line == _line_of(masked_overflow, "mark: masked exp")


def test_a_non_finite_argument_is_followed_to_what_it_makes():
    def f(x, bias):
        return jnp.sum(x * 2.0), jnp.sum(jnp.exp(bias))  # bias's -inf gives exp 0: absorbed

    x, bias = jnp.array([1.0, jnp.nan]), jnp.array([0.0, -jnp.inf])
    closed = jax.make_jaxpr(f)(x, bias)
    ev = evaluate(closed, [x, bias], [True, True])
    assert ev.nonfinite == [0] and ev.inputs == [0] and ev.births == []


def test_float64_evaluation_widens_an_explicit_float32_cast():
    from xla_harness.jaxcompat import enable_x64

    def f(x):
        return jnp.sum(jnp.exp(x.astype(jnp.float32) * 100.0))

    with enable_x64():
        x = jnp.array([1.0], jnp.float64)
        closed = jax.make_jaxpr(f)(x)
        assert not evaluate(closed, [x], [True]).finite  # as traced: exp in float32 overflows
        ev = evaluate(closed, [x], [True], upcast=True)
    assert ev.finite and ev.outputs[0].dtype == np.float64
