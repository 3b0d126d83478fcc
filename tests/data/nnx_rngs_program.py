"""A Flax NNX model whose state holds its rngs (a typed PRNG key and a counter), as a TrainProgram:
parameters and rng state in the harness's params, Adam's state; NaN in the loss and gradient at ``nan_steps``."""

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from xla_harness.programs.interface import TrainProgram


class Model(nnx.Module):
    def __init__(self, rngs):
        self.lin = nnx.Linear(4, 3, rngs=rngs)
        self.drop = nnx.Dropout(0.1, rngs=rngs)

    def __call__(self, x):
        return self.drop(self.lin(x))


def make(nan_steps=()):
    opt = optax.adam(1e-2)
    bad = jnp.asarray(list(nan_steps) or [-1])
    graphdef, _, _ = nnx.split(Model(nnx.Rngs(0, dropout=1)), nnx.Param, ...)

    def init(key):
        _, params, rest = nnx.split(Model(nnx.Rngs(params=key, dropout=jax.random.fold_in(key, 1))), nnx.Param, ...)
        params, rest = nnx.to_pure_dict(params), nnx.to_pure_dict(rest)
        return {"params": params, "rngs": rest}, opt.init(params)

    def batch(key, step):
        return {"x": jax.random.normal(key, (8, 4)), "step": jnp.asarray(step, jnp.int32)}

    def step(state, opt_state, b):
        _, abs_params, abs_rest = nnx.split(nnx.eval_shape(lambda: Model(nnx.Rngs(0, dropout=1))), nnx.Param, ...)
        nnx.replace_by_pure_dict(abs_params, state["params"])
        nnx.replace_by_pure_dict(abs_rest, state["rngs"])
        model = nnx.merge(graphdef, abs_params, abs_rest)

        def loss_fn(m):
            return jnp.mean(m(b["x"]) ** 2) + jnp.where(jnp.any(bad == b["step"]), jnp.nan, 0.0)

        loss, grads = nnx.value_and_grad(loss_fn)(model)
        _, new_params, new_rest = nnx.split(model, nnx.Param, ...)
        params = nnx.to_pure_dict(new_params)
        updates, opt_state = opt.update(nnx.to_pure_dict(grads), opt_state, params)
        return {"params": optax.apply_updates(params, updates), "rngs": nnx.to_pure_dict(new_rest)}, opt_state, \
            {"loss": loss}

    return TrainProgram(name="nnx", init=init, batch=batch, step=step)
