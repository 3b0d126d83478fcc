"""Programs whose NaN has a known cause, planted for the origin tests (tests/origin, tests/stress,
tests/triage): ``make(kind=...)``. Failing steps are FAIL_STEPS (every step for init-nan and
adam-eps0). The losses live in the sibling module whose_losses.py, as a program of several files has
them; ``zero-over-zero-inline`` keeps its loss here. Each planted line ends in ``# plant: KIND``.

kinds and the origin each must get: batch-nan (input, a NaN in the batch), init-nan (input, a NaN
in the initial parameters), zero-over-zero, log-zero, where-trap, adam-eps0, zero-over-zero-inline
(program), loss-nan-constant (program: a NaN constant in the loss alone, the state stays finite),
overflow (precision: float64 survives it), clean (nothing fails)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
import whose_losses

from xla_harness.programs.interface import TrainProgram, step_from_loss

FAIL_STEPS = (3, 11)
KINDS = ("clean", "batch-nan", "init-nan", "zero-over-zero", "log-zero", "where-trap", "overflow", "adam-eps0",
         "zero-over-zero-inline", "loss-nan-constant")


def inline_mean(params, b):
    h = b["x"] @ params["w"] + params["b"]
    return jnp.sum(b["keep"][:, None] * h) / jnp.sum(b["keep"])  # plant: zero-over-zero-inline


LOSSES = {"clean": whose_losses.regression, "batch-nan": whose_losses.regression, "init-nan": whose_losses.regression,
          "zero-over-zero": whose_losses.mean_of_selected, "log-zero": whose_losses.log_likelihood,
          "where-trap": whose_losses.masked_root, "overflow": whose_losses.log_sum_exp,
          "adam-eps0": whose_losses.regression, "zero-over-zero-inline": inline_mean,
          "loss-nan-constant": whose_losses.flagged}


def make(kind: str = "clean"):
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}")
    # adam-eps0: "unused" gets a zero gradient, so m / (sqrt(v) + 0) is 0/0 from the first step
    opt = optax.adam(1e-2, eps=0.0) if kind == "adam-eps0" else optax.sgd(1e-2)

    def init(key):
        params = {"w": jax.random.normal(key, (4, 3)), "b": jnp.zeros((3,))}
        if kind == "init-nan":
            params["b"] = params["b"].at[1].set(jnp.nan)
        if kind == "adam-eps0":
            params["unused"] = jnp.ones((2,))
        return params, opt.init(params)

    def batch(key, step):
        fail = (step == FAIL_STEPS[0]) | (step == FAIL_STEPS[1])
        x = jax.random.normal(key, (8, 4))
        if kind == "batch-nan":
            x = x.at[2, 1].set(jnp.where(fail, jnp.nan, x[2, 1]))
        # keep: which rows count; none of them at a failing step (an empty selection, a zero)
        keep = jnp.where(fail, jnp.zeros((8,)), jnp.ones((8,)))
        shift = jnp.where(fail, 100.0, 0.0)  # exp(h + 100) overflows float32 (above 88.7), not float64
        noise = jax.random.fold_in(jax.random.key(0), step)  # a typed PRNG key, as a dropout key travels
        return {"x": x, "keep": keep, "shift": shift, "noise": noise}

    return TrainProgram(name=f"whose-{kind}", init=init, batch=batch, step=step_from_loss(LOSSES[kind], opt))
