"""Text of the standalone repro.py put into repro bundles (needs only jax and numpy).

It rebuilds the tied-embedding training step from the bundled config (same architecture
as harness/models/tied_embedding.py, with a plain Adam), runs the bundled seeds and steps,
decides finiteness per step and prints JSON. Kept free of this package on purpose: the
bundle goes to people who do not install the harness.
"""

REPRO = r'''#!/usr/bin/env python3
"""Standalone reproducer: tied-embedding training steps, non-finite update counts.

    python repro.py [--json]          # uses config.json beside this file
Needs only jax and numpy. Prints per seed: non-finite steps and the loss of every step.
"""
import json, sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

CFG = json.loads((Path(__file__).parent / "config.json").read_text())
M = CFG["model"]
DT = {"f32": jnp.float32, "bf16": jnp.bfloat16}[M["dtype"]]


def acc(x):
    return x.astype(jnp.promote_types(x.dtype, jnp.float32))


def init(key):
    d, f = M["d_model"], 4 * M["d_model"]
    ks = jax.random.split(key, 2 + M["layers"])
    dense = lambda k, s, n: (jax.random.normal(k, s, jnp.float32) / jnp.sqrt(n)).astype(DT)
    layers = []
    for i in range(M["layers"]):
        k = jax.random.split(ks[2 + i], 6)
        layers.append({"norm1": jnp.ones((d,), DT), "wqkv": dense(k[0], (d, 3 * d), d), "wo": dense(k[1], (d, d), d),
                       "norm2": jnp.ones((d,), DT), "w1": dense(k[2], (d, f), d), "w2": dense(k[3], (f, d), f)})
    p = {"embed": (0.02 * jax.random.normal(ks[0], (M["vocab"], d), jnp.float32)).astype(DT), "layers": layers,
         "final_norm": jnp.ones((d,), DT)}
    if M["mode"] == "sparse_only":
        p["unembed"] = (0.02 * jax.random.normal(ks[1], (M["vocab"], d), jnp.float32)).astype(DT)
    return p


def norm(x, s):
    a = acc(x)
    return (a * jax.lax.rsqrt(jnp.mean(a * a, -1, keepdims=True) + 1e-6) * acc(s)).astype(x.dtype)


def block(p, x):
    b, s, d = x.shape
    h, hd = M["heads"], d // M["heads"]
    y = norm(x, p["norm1"])
    q, k, v = (t.reshape(b, s, h, hd) for t in jnp.split(y @ p["wqkv"], 3, -1))
    att = acc(jnp.einsum("bqhd,bkhd->bhqk", q, k)) / jnp.sqrt(hd)
    att = jax.nn.softmax(jnp.where(jnp.tril(jnp.ones((s, s), bool)), att, -1e30), -1).astype(x.dtype)
    x = x + jnp.einsum("bhqk,bkhd->bqhd", att, v).reshape(b, s, d) @ p["wo"]
    return x + jax.nn.gelu(norm(x, p["norm2"]) @ p["w1"]) @ p["w2"]


def logits(p, tok):
    w = p["embed"]
    x = jnp.take(jax.lax.stop_gradient(w) if M["mode"] == "dense_only" else w, tok, axis=0)
    blk = jax.checkpoint(block) if M["remat"] else block
    for lp in p["layers"]:
        x = blk(lp, x)
    return acc(norm(x, p["final_norm"]) @ (p["unembed"] if M["mode"] == "sparse_only" else w).T)


def xent(p, tok):
    lg = logits(p, tok[:, :-1])
    return jnp.mean(jax.nn.logsumexp(lg, -1) - jnp.take_along_axis(lg, tok[:, 1:, None], -1)[..., 0])


def batches(key):
    ka, kb = jax.random.split(key)
    a = jax.random.randint(ka, (M["batch"], M["seq"]), 0, M["vocab"], dtype=jnp.int32)
    b = jax.random.randint(kb, (M["batch"], 2 * M["seq"]), 0, max(1, M["vocab"] // 8), dtype=jnp.int32)
    return a, b


LR, B1, B2, EPS = CFG["learning_rate"], 0.9, 0.999, 1e-8


@jax.jit
def step(p, m, v, t, seed, i):
    kd, _ = jax.random.split(jax.random.fold_in(jax.random.key(seed), i))
    a, b = batches(kd)
    loss, g = jax.value_and_grad(lambda p: xent(p, a) + xent(p, b))(p)
    t1 = t + 1
    m1 = jax.tree.map(lambda m, g: B1 * m + (1 - B1) * g, m, g)
    v1 = jax.tree.map(lambda v, g: B2 * v + (1 - B2) * g * g, v, g)
    upd = jax.tree.map(lambda m, v: -LR * (m / (1 - B1 ** t1)) / (jnp.sqrt(v / (1 - B2 ** t1)) + EPS), m1, v1)
    fin = lambda tree: jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)]))
    ok = jnp.isfinite(loss) & fin(g) & fin(upd)
    p1 = jax.tree.map(lambda x, u: jnp.where(ok, (x + u).astype(x.dtype), x), p, upd)
    keep = lambda new, old: jax.tree.map(lambda a, b: jnp.where(ok, a, b), new, old)
    return p1, keep(m1, m), keep(v1, v), jnp.where(ok, t1, t), ok, loss


def main():
    out = {"jax": jax.__version__, "backend": jax.default_backend(), "seeds": {}}
    for seed in CFG["seeds"]:
        p = init(jax.random.key(seed))
        m = jax.tree.map(jnp.zeros_like, p)
        v = jax.tree.map(jnp.zeros_like, p)
        t = jnp.int32(0)
        oks, losses = [], []
        for i in range(CFG["steps"]):
            p, m, v, t, ok, loss = step(p, m, v, t, np.uint32(seed), np.int32(i))
            oks.append(ok)
            losses.append(loss)
        oks, losses = jax.device_get((oks, losses))
        out["seeds"][str(seed)] = {"nonfinite": int(sum(not o for o in oks)),
                                   "losses": [float(x) for x in losses]}
    if "--json" in sys.argv:
        print(json.dumps(out))
    else:
        for s, r in out["seeds"].items():
            print(f"seed {s}: {r['nonfinite']}/{CFG['steps']} non-finite steps")


if __name__ == "__main__":
    main()
'''
