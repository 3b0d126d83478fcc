#!/usr/bin/env python3
"""Standalone reproducer: tied-embedding training steps, non-finite update counts.

    python repro.py [--json] [--config FILE]     # default: config.json beside this file

Needs only jax and numpy (bundles go to people who do not install xla-harness). The training
step is plain Adam, jitted with its state donated, with nothing added to it; finiteness is
decided by a separate jitted check of its outputs, and a non-finite step is rolled back to a
copy of the previous parameters and optimizer state taken outside the step, so one event counts
once. Prints per seed
the non-finite steps and the loss of every step.

This file is a module of xla-harness (xla_harness/repro/standalone.py) and is copied verbatim into
every bundle as repro.py; `xla-harness bundle --check` runs the harness's own copy.
"""

import json
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

B1, B2, EPS = 0.9, 0.999, 1e-8


def _dtype(model):
    return {"f32": jnp.float32, "bf16": jnp.bfloat16}[model["dtype"]]


def _acc(x):
    return x.astype(jnp.promote_types(x.dtype, jnp.float32))


def init(model, key):
    dt = _dtype(model)
    d, f = model["d_model"], 4 * model["d_model"]
    ks = jax.random.split(key, 2 + model["layers"])

    def dense(k, shape, fan_in):
        return (jax.random.normal(k, shape, jnp.float32) / jnp.sqrt(fan_in)).astype(dt)

    layers = []
    for i in range(model["layers"]):
        k = jax.random.split(ks[2 + i], 6)
        layers.append({"norm1": jnp.ones((d,), dt), "wqkv": dense(k[0], (d, 3 * d), d),
                       "wo": dense(k[1], (d, d), d), "norm2": jnp.ones((d,), dt),
                       "w1": dense(k[2], (d, f), d), "w2": dense(k[3], (f, d), f)})
    params = {"embed": (0.02 * jax.random.normal(ks[0], (model["vocab"], d), jnp.float32)).astype(dt),
              "layers": layers, "final_norm": jnp.ones((d,), dt)}
    if model["mode"] == "sparse_only":
        params["unembed"] = (0.02 * jax.random.normal(ks[1], (model["vocab"], d), jnp.float32)).astype(dt)
    return params


def _norm(x, scale):
    a = _acc(x)
    return (a * jax.lax.rsqrt(jnp.mean(a * a, -1, keepdims=True) + 1e-6) * _acc(scale)).astype(x.dtype)


def _block(model, p, x):
    b, s, d = x.shape
    h, hd = model["heads"], d // model["heads"]
    y = _norm(x, p["norm1"])
    q, k, v = (t.reshape(b, s, h, hd) for t in jnp.split(y @ p["wqkv"], 3, -1))
    att = _acc(jnp.einsum("bqhd,bkhd->bhqk", q, k)) / jnp.sqrt(hd)
    att = jax.nn.softmax(jnp.where(jnp.tril(jnp.ones((s, s), bool)), att, -1e30), -1).astype(x.dtype)
    x = x + jnp.einsum("bhqk,bkhd->bqhd", att, v).reshape(b, s, d) @ p["wo"]
    return x + jax.nn.gelu(_norm(x, p["norm2"]) @ p["w1"]) @ p["w2"]


def logits(model, params, tokens):
    w = params["embed"]
    x = jnp.take(jax.lax.stop_gradient(w) if model["mode"] == "dense_only" else w, tokens, axis=0)

    def blk(p, x):
        return _block(model, p, x)

    if model["remat"]:
        blk = jax.checkpoint(blk)
    for lp in params["layers"]:
        x = blk(lp, x)
    out_w = params["unembed"] if model["mode"] == "sparse_only" else w
    return _acc(_norm(x, params["final_norm"]) @ out_w.T)


def _xent(model, params, tokens):
    lg = logits(model, params, tokens[:, :-1])
    return jnp.mean(jax.nn.logsumexp(lg, -1) - jnp.take_along_axis(lg, tokens[:, 1:, None], -1)[..., 0])


def batches(model, key):
    ka, kb = jax.random.split(key)
    a = jax.random.randint(ka, (model["batch"], model["seq"]), 0, model["vocab"], dtype=jnp.int32)
    b = jax.random.randint(kb, (model["batch"], 2 * model["seq"]), 0, max(1, model["vocab"] // 8),
                           dtype=jnp.int32)
    return a, b


def make_step(model, learning_rate):
    """The training step, (params, m, v, t, seed, i) -> (params, m, v, t, loss), nothing added."""

    def step(p, m, v, t, seed, i):
        kd, _ = jax.random.split(jax.random.fold_in(jax.random.key(seed), i))
        a, b = batches(model, kd)
        loss, g = jax.value_and_grad(lambda p: _xent(model, p, a) + _xent(model, p, b))(p)
        t1 = t + 1
        m1 = jax.tree.map(lambda m, g: B1 * m + (1 - B1) * g, m, g)
        v1 = jax.tree.map(lambda v, g: B2 * v + (1 - B2) * g * g, v, g)
        p1 = jax.tree.map(
            lambda x, m, v: (x - learning_rate * (m / (1 - B1 ** t1)) / (jnp.sqrt(v / (1 - B2 ** t1)) + EPS)
                             ).astype(x.dtype), p, m1, v1)
        return p1, m1, v1, t1, loss

    return jax.jit(step, donate_argnums=(0, 1, 2, 3))


@jax.jit
def _copy(tree):
    return jax.tree.map(jnp.copy, tree)


@jax.jit
def all_finite(tree):
    """The check, a program of its own: every leaf of the step's outputs finite."""
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)]))


def run(cfg):
    model = cfg["model"]
    step = make_step(model, cfg["learning_rate"])
    out = {"jax": jax.__version__, "backend": jax.default_backend(), "seeds": {}}
    for seed in cfg["seeds"]:
        state = init(model, jax.random.key(seed))
        state = (state, jax.tree.map(jnp.zeros_like, state), jax.tree.map(jnp.zeros_like, state), jnp.int32(0))
        nonfinite, losses = 0, []
        for i in range(cfg["steps"]):
            kept = _copy(state)  # outside the step: the step's own buffers are donated as in training
            *new_state, loss = step(*state, np.uint32(seed), np.int32(i))
            if bool(all_finite((new_state, loss))):
                state = tuple(new_state)
            else:  # roll back: the previous state is kept, so one event counts once
                state = kept
                nonfinite += 1
            losses.append(float(loss))
        out["seeds"][str(seed)] = {"nonfinite": nonfinite, "losses": losses}
    return out


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    path = Path(__file__).parent / "config.json"
    if "--config" in argv:
        path = Path(argv[argv.index("--config") + 1])
    cfg = json.loads(path.read_text())
    out = run(cfg)
    if "--json" in argv:
        print(json.dumps(out))
    else:
        for s, r in out["seeds"].items():
            print(f"seed {s}: {r['nonfinite']}/{cfg['steps']} non-finite steps")


if __name__ == "__main__":
    main()
