"""The README's quickstart program: a tiny tied-embedding language model, written as a user jits it.

The table ``W`` is used twice, as the lookup ``W[tokens]`` and as the output projection
``h @ W.T``, so its gradient has a gather/scatter path and a dot path: the pattern of
jax-ml/jax#35409, small enough to run in seconds on a laptop CPU::

    xla-harness stress --program examples/quickstart/my_model.py:make --seeds 1,2 --steps 20
    xla-harness stress --program examples/quickstart/my_model.py:make --program-option vocab=1024

Replace the body of ``make`` with your own model: ``init``, ``batch`` and ``loss`` (or your own
``step``) are all the harness needs (see ``xla_harness/programs/interface.py``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from xla_harness.programs.interface import TrainProgram, step_from_loss


def make(vocab=256, width=64, seq=32, batch_size=8, lr=1e-3):
    """Options come from ``--program-option KEY=VALUE`` (e.g. ``width=128``)."""
    opt = optax.adamw(lr)

    def init(key):  # -> (params, opt_state)
        k_w, k_h = jax.random.split(key)
        params = {
            "W": jax.random.normal(k_w, (vocab, width)) * 0.02,  # tied: lookup and output projection
            "hidden": jax.random.normal(k_h, (width, width)) / jnp.sqrt(width),
        }
        return params, opt.init(params)

    def batch(key, step):  # -> the step's third argument: any pytree
        return jax.random.randint(key, (batch_size, seq + 1), 0, vocab)

    def loss(params, tokens):  # -> a scalar
        x = params["W"][tokens[:, :-1]]  # lookup: gather from W
        h = jnp.tanh(x @ params["hidden"])
        logits = h @ params["W"].T  # output projection: a dot with the same W
        return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()

    return TrainProgram(name="my_model", init=init, batch=batch, step=step_from_loss(loss, opt),
                        donate_argnums=(0, 1), target_leaf="['W']",
                        options={"vocab": vocab, "width": width, "seq": seq, "batch_size": batch_size, "lr": lr})
