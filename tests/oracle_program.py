"""An execution oracle: a training step that draws its NaN per *execution* (a host callback with its own
random generator, so the NaN is not a function of the step's inputs, as a race's is not) and logs
every execution: its index, the step (from the batch), whether the state it started from was finite,
and what it drew. Test programs load it by path, as a user's program is loaded.

Each log entry: ``[execution, step, input finite, drew a NaN, where it went, process id]``.

``where`` says where a drawn NaN goes: ``loss`` (the loss only: gradients and new state finite),
``state`` (an unused parameter: the new state is not finite, the loss is), ``both`` (the loss and,
through the gradient, the parameters), ``mixed`` (one of the three per execution). ``nan_execs``:
executions that draw a NaN whatever ``p`` says. ``perturb``: a finite perturbation of the loss on
about half of the executions (finite nondeterminism)."""

from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax

from xla_harness.programs.interface import TrainProgram

KINDS = ("loss", "state", "both")


def make(p=0.0, where="both", seed=0, nan_execs=(), perturb=0.0, log="", key_in_state=False):
    opt = optax.sgd(0.05)
    rng = np.random.default_rng(seed)
    calls = [0]
    entries: list[list] = []
    out = open(log, "a", buffering=1) if log else None  # noqa: SIM115 - the program's life

    def draw(step, finite):
        i = calls[0]
        calls[0] += 1
        nan = i in tuple(nan_execs) or (p > 0 and rng.random() < p)
        kind = KINDS[int(rng.integers(3))] if where == "mixed" else where
        noise = perturb if perturb and rng.random() < 0.5 else 0.0
        entry = [i, int(step), bool(finite), bool(nan), kind if nan else None, os.getpid()]
        entries.append(entry)
        if out is not None:
            out.write(json.dumps(entry) + "\n")
        code = KINDS.index(kind) + 1 if nan else 0
        return np.asarray([code, noise], np.float32)

    def init(key):
        params = {"w": jax.random.normal(key, (4, 3)), "u": jnp.zeros((3,))}
        if key_in_state:
            params = {**params, "rng": jax.random.key(7)}
        return params, opt.init({k: v for k, v in params.items() if k != "rng"})

    def batch(key, step):
        return {"x": jax.random.normal(key, (8, 4)), "step": jnp.asarray(step, jnp.int32)}

    def step(params, opt_state, b):
        floats = [x for x in jax.tree_util.tree_leaves((params, opt_state))
                  if jnp.issubdtype(x.dtype, jnp.floating)]
        finite = jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in floats]))
        got = jax.experimental.io_callback(draw, jax.ShapeDtypeStruct((2,), jnp.float32), b["step"], finite)
        code, noise = got[0], got[1]
        nan = jnp.float32(jnp.nan)
        into_loss = jnp.where((code == 1) | (code == 3), nan, 0.0)
        into_grad = jnp.where(code == 3, nan, 0.0)
        into_state = jnp.where(code == 2, nan, 0.0)
        trained = {k: v for k, v in params.items() if k != "rng"}

        def loss_fn(q):
            base = jnp.mean(jnp.tanh(b["x"] @ q["w"]) ** 2)
            return base + noise + into_grad * jnp.sum(q["w"]), base

        (_, base), grads = jax.value_and_grad(loss_fn, has_aux=True)(trained)
        loss = base + noise + into_loss
        updates, new_opt = opt.update(grads, opt_state, trained)
        new = optax.apply_updates(trained, updates)
        new = {**new, "u": new["u"] + into_state}
        if key_in_state:
            new = {**new, "rng": jax.random.split(params["rng"])[0]}
        return new, new_opt, {"loss": loss}

    program = TrainProgram(name="oracle", init=init, batch=batch, step=step)
    LOGS[id(program)] = entries
    return program


LOGS: dict[int, list] = {}  # id(program) -> its executions, for tests that build the program in-process


def entries_of(program) -> list[list]:
    return LOGS[id(program)]


def expected(entries: list[list], steps: range) -> tuple[list[int], list[int]]:
    """(the steps whose first execution from a finite state drew a NaN, the steps with no execution
    from a finite state at all)."""
    first: dict[int, bool] = {}
    for _, step, finite, nan, *_ in entries:
        if finite and step not in first:
            first[step] = nan
    return sorted(t for t in steps if first.get(t)), [t for t in steps if t not in first]
