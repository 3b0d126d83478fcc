"""A fault that lives only in the compiled program: a training step whose compiled module has its
learning rate replaced by NaN when XLA compiles it (the jaxpr, and so the step evaluated op by op, is
untouched). Every execution of the compiled step is non-finite; the program's own math is not: the
origin a test expects is ``compiler``. Used by tests/origin and tests/stress as a user's program."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import optax
from jax._src.interpreters import pxla

from xla_harness.programs.interface import TrainProgram

LEARNING_RATE = 0.012345  # the constant the "compiler" turns into NaN
_PLANTED = re.compile(r"dense<-?1\.234500e-02>")
_compile = pxla.MeshComputation.compile


def _faulty_compile(self, *args, **kwargs):
    text = str(self._hlo)
    if "faulty_compiled_step" in text.split("\n", 1)[0] and _PLANTED.search(text):
        from jax._src.lib.mlir import ir

        self._hlo = ir.Module.parse(_PLANTED.sub("dense<0x7FC00000>", text), context=self._hlo.context)
    return _compile(self, *args, **kwargs)


pxla.MeshComputation.compile = _faulty_compile


def make():
    opt = optax.sgd(LEARNING_RATE)

    def init(key):
        params = {"w": jax.random.normal(key, (4, 3))}
        return params, opt.init(params)

    def batch(key, step):
        return {"x": jax.random.normal(key, (8, 4))}

    def loss(params, b):
        return jnp.mean((b["x"] @ params["w"]) ** 2)

    def faulty_compiled_step(params, opt_state, b):
        value, grads = jax.value_and_grad(loss)(params, b)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, {"loss": value}

    return TrainProgram(name="compiled-fault", init=init, batch=batch, step=faulty_compiled_step)
