"""A Flax NNX language model that ties its embedding the way real models do, as a harness program.

The token lookup is ``nnx.Embed.__call__`` (a gather of the embedding table) and the output logits
are ``nnx.Embed.attend`` (a dot with the same table), so the table gets two gradient paths: the
pattern of jax-ml/jax#35409. The training step is the plain functional NNX + optax step a user
jits: ``nnx.merge`` the parameters into the model, ``jax.value_and_grad`` the loss, ``optax.adamw``.

Run it through the harness with ``--program examples/flax_tied/program.py:program`` (needs the
``flax`` extra: ``pip install -e '.[flax]'``). ``make_program(**sizes)`` builds other sizes, and
``make_program(variant="barrier")`` (or ``onehot``, ``sumgrad``) the same model with a workaround
of :mod:`xla_harness.programs.variants` written into its two uses of the table.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from xla_harness.programs.interface import TrainProgram, step_from_loss


class Block(nnx.Module):
    """Pre-norm causal self-attention and a gated MLP."""

    def __init__(self, d_model: int, heads: int, ffn: int, *, rngs: nnx.Rngs):
        self.heads = heads
        self.norm1 = nnx.RMSNorm(d_model, rngs=rngs)
        self.qkv = nnx.Linear(d_model, 3 * d_model, use_bias=False, rngs=rngs)
        self.out = nnx.Linear(d_model, d_model, use_bias=False, rngs=rngs)
        self.norm2 = nnx.RMSNorm(d_model, rngs=rngs)
        self.gate = nnx.Linear(d_model, ffn, use_bias=False, rngs=rngs)
        self.up = nnx.Linear(d_model, ffn, use_bias=False, rngs=rngs)
        self.down = nnx.Linear(ffn, d_model, use_bias=False, rngs=rngs)

    def __call__(self, x):
        b, t, d = x.shape
        q, k, v = jnp.split(self.qkv(self.norm1(x)), 3, axis=-1)
        q, k, v = (z.reshape(b, t, self.heads, d // self.heads) for z in (q, k, v))
        mask = nnx.make_causal_mask(jnp.ones((b, t)))
        x = x + self.out(nnx.dot_product_attention(q, k, v, mask=mask).reshape(b, t, d))
        h = self.norm2(x)
        return x + self.down(nnx.silu(self.gate(h)) * self.up(h))


class TiedLM(nnx.Module):
    def __init__(self, vocab: int, d_model: int, heads: int, ffn: int, layers: int, *, rngs: nnx.Rngs):
        self.embed = nnx.Embed(vocab, d_model, rngs=rngs)
        self.blocks = nnx.List([Block(d_model, heads, ffn, rngs=rngs) for _ in range(layers)])
        self.norm = nnx.RMSNorm(d_model, rngs=rngs)

    def __call__(self, tokens, ops=None):
        if ops is None:
            x = self.embed(tokens)  # lookup: gather from the table
        else:  # a workaround variant (xla_harness.programs.variants) writes the two uses of the table
            w_lookup, w_out = ops.split(self.embed.embedding[...])
            x = ops.lookup(w_lookup, tokens)
        for block in self.blocks:
            x = block(x)
        if ops is None:
            return self.embed.attend(self.norm(x))  # logits: dot with the same table
        return ops.unembed(self.norm(x), w_out)


def make_program(vocab: int = 512, d_model: int = 64, heads: int = 4, ffn: int = 256, layers: int = 2,
                 batch: int = 8, seq: int = 32, lr: float = 1e-3, variant: str | None = None) -> TrainProgram:
    """The program; ``variant`` names a workaround of :mod:`xla_harness.programs.variants` (None: the
    model as written, with ``nnx.Embed.__call__`` and ``nnx.Embed.attend``)."""
    from xla_harness.programs import variants

    ops = None if variant is None else variants.tied_ops(variant)
    sizes = dict(vocab=vocab, d_model=d_model, heads=heads, ffn=ffn, layers=layers)
    graphdef, _ = nnx.split(nnx.eval_shape(lambda: TiedLM(**sizes, rngs=nnx.Rngs(0))))
    optimizer = optax.adamw(lr)

    def init(key):
        _, params = nnx.split(TiedLM(**sizes, rngs=nnx.Rngs(params=key)))
        return params, optimizer.init(params)

    def batch_fn(key, step):
        return jax.random.randint(jax.random.fold_in(key, step), (batch, seq + 1), 0, vocab, dtype=jnp.int32)

    def loss_fn(params, tokens):
        model = nnx.merge(graphdef, params)
        logits = model(tokens[:, :-1], ops)
        return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()

    name = "flax-tied" if variant is None else f"flax-tied+{variant}"
    return TrainProgram(name=name, init=init, batch=batch_fn, step=step_from_loss(loss_fn, optimizer),
                        options={**sizes, "batch": batch, "seq": seq, "lr": lr, "variant": variant})


program = make_program()
