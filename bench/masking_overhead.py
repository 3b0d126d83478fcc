"""Cost of jax_zero_cotangent_masking on training steps: flag off vs on, same process.

Two jitted steps (forward, backward, Adam), each compiled with the flag off and on (the flag
is part of the jit key): a small pre-LayerNorm transformer with untied embeddings (LayerNorm
through sqrt and div, log-softmax cross-entropy) and the tied-embedding model of the stress
harness (xla_harness.programs.tied_embedding: RMSNorm through rsqrt, logsumexp, remat). Each
round times STEPS steps with the flag off and STEPS with it on, the order alternating from
round to round; the figure per model is the median of the per-round ratios on/off with a
distribution-free 95% interval for that median (order statistics of the ratios, binomial
with p = 1/2), plus the ratio of median step times and the HLO instruction counts.
Targets: median ratio <= 1.03 on CPU. Needs the patched jax: run under .venv-jax-patched
(re-executes itself there if found).

    python bench/masking_overhead.py [--rounds 31] [--steps 10] [--models transformer,tied]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from xla_harness.stress.report.stats import binom_cdf  # noqa: E402


def median_interval(values: list[float], confidence: float = 0.95) -> tuple[float, float]:
    """Order-statistic interval for the median: [x_(k), x_(n+1-k)] with the largest k such that
    P(Binomial(n, 1/2) <= k - 1) <= (1 - confidence) / 2; coverage >= confidence."""
    xs, n = sorted(values), len(values)
    k = 0
    while k + 1 <= n // 2 and binom_cdf(k, n, 0.5) <= (1 - confidence) / 2:
        k += 1
    if k == 0:
        raise ValueError(f"{n} rounds are too few for a {confidence:.0%} interval of the median")
    return xs[k - 1], xs[n - k]


def transformer_program(vocab=512, d_model=128, layers=2, heads=4, seq=32, batch=8):
    """A small untied pre-LayerNorm transformer step: (params, opt_state, tokens) -> new state, loss."""
    import jax
    import jax.numpy as jnp
    import optax

    def layer_norm(x, g, b):
        mu = jnp.mean(x, -1, keepdims=True)
        var = jnp.mean(jnp.square(x - mu), -1, keepdims=True)
        return (x - mu) / jnp.sqrt(var + 1e-5) * g + b

    def init(key):
        ks = iter(jax.random.split(key, 4 + 4 * layers))
        dense = lambda k, m, n: jax.random.normal(k, (m, n), jnp.float32) / jnp.sqrt(m)  # noqa: E731
        p = {"embed": dense(next(ks), vocab, d_model), "unembed": dense(next(ks), d_model, vocab),
             "pos": 0.02 * jax.random.normal(next(ks), (seq, d_model)), "lnf": (jnp.ones(d_model), jnp.zeros(d_model)),
             "layers": []}
        for _ in range(layers):
            p["layers"].append({"ln1": (jnp.ones(d_model), jnp.zeros(d_model)),
                                "ln2": (jnp.ones(d_model), jnp.zeros(d_model)),
                                "qkv": dense(next(ks), d_model, 3 * d_model), "o": dense(next(ks), d_model, d_model),
                                "w1": dense(next(ks), d_model, 4 * d_model),
                                "w2": dense(next(ks), 4 * d_model, d_model)})
        return p

    def loss_fn(p, tokens):
        x = p["embed"][tokens[:, :-1]] + p["pos"][: seq - 1]
        s, hd = seq - 1, d_model // heads
        for lp in p["layers"]:
            h = layer_norm(x, *lp["ln1"])
            q, k, v = (t.reshape(batch, s, heads, hd) for t in jnp.split(h @ lp["qkv"], 3, -1))
            att = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(jnp.float32(hd))
            att = jax.nn.softmax(jnp.where(jnp.tril(jnp.ones((s, s), bool)), att, -1e30), -1)
            x = x + jnp.einsum("bhqk,bkhd->bqhd", att, v).reshape(batch, s, d_model) @ lp["o"]
            x = x + jax.nn.gelu(layer_norm(x, *lp["ln2"]) @ lp["w1"]) @ lp["w2"]
        logp = jax.nn.log_softmax(layer_norm(x, *p["lnf"]) @ p["unembed"], -1)
        return -jnp.mean(jnp.take_along_axis(logp, tokens[:, 1:, None], -1))

    opt = optax.adam(1e-3)

    def step(p, o, tokens):
        loss, g = jax.value_and_grad(loss_fn)(p, tokens)
        upd, o = opt.update(g, o, p)
        return optax.apply_updates(p, upd), o, loss

    jstep = jax.jit(step, donate_argnums=(0, 1))
    tokens = jax.random.randint(jax.random.key(1), (batch, seq), 0, vocab, dtype=jnp.int32)

    def fresh():
        p = init(jax.random.key(0))
        return p, opt.init(p)

    def call(state, i):
        p, o, loss = jstep(state[0], state[1], tokens)
        return (p, o), loss

    def n_ops():
        p, o = fresh()
        return jstep.lower(p, o, tokens).compile().as_text().count(" = ")

    def grads():
        return jax.jit(jax.grad(loss_fn))(init(jax.random.key(0)), tokens)

    return f"transformer (untied, LayerNorm, V={vocab} D={d_model} L={layers})", fresh, call, n_ops, grads


def tied_program():
    """The stress harness's built-in tied-embedding step (full mode, remat), jitted as a user does."""
    import jax

    from xla_harness.programs.interface import load_program
    from xla_harness.stress.device.inject import step_keys

    prog = load_program("tied-embedding", mode="full", remat=True, d_model=128, vocab=1024, seq=32, layers=2,
                        heads=4)
    step = prog.jit()

    def fresh():
        return prog.init(jax.random.key(1))

    def call(state, i):
        p, o, aux = step(state[0], state[1], prog.batch(step_keys(1, i)[0], i))
        return (p, o), aux["loss"]

    def n_ops():
        p, o = fresh()
        return step.lower(p, o, prog.batch(step_keys(1, 0)[0], 0)).compile().as_text().count(" = ")

    def grads():
        from xla_harness.programs.tied_embedding import ModelConfig, init_params, loss_fn, make_batches

        cfg = ModelConfig(mode="full", remat=True, d_model=128, vocab=1024, seq=32, layers=2, heads=4)
        batches = make_batches(cfg, jax.random.key(2))
        return jax.jit(jax.grad(loss_fn), static_argnums=2)(init_params(cfg, jax.random.key(1)), batches, cfg)

    return "tied-embedding (full, remat, V=1024 D=128 L=2)", fresh, call, n_ops, grads


def gradient_difference(grads) -> str:
    """How the jitted gradient at one ordinary point differs between flag off and on."""
    import jax
    import numpy as np

    flat = {}
    for flag in (False, True):
        with jax.zero_cotangent_masking(flag):
            flat[flag] = np.concatenate([np.ravel(np.asarray(g, np.float64))
                                         for g in jax.tree_util.tree_leaves(grads())])
    off, on = flat[False], flat[True]
    differ = off != on
    rel = np.abs(on - off)[differ] / np.maximum(np.abs(off[differ]), np.finfo(np.float32).tiny)
    return (f"{differ.mean():.1%} of {off.size} gradient elements differ; median relative difference of "
            f"those {np.median(rel) if rel.size else 0:.1e}; max |on - off| / max |off| "
            f"{np.abs(on - off).max() / np.abs(off).max():.1e}; all finite: off {np.isfinite(off).all()}, "
            f"on {np.isfinite(on).all()}")


def measure(name, fresh, call, n_ops, grads, rounds: int, steps: int) -> None:
    import jax

    def timed(flag: bool) -> float:
        with jax.zero_cotangent_masking(flag):
            state = fresh()
            state, loss = call(state, 0)  # compiled already after the first round; a warm step
            jax.block_until_ready(loss)
            t0 = time.perf_counter()
            for i in range(steps):
                state, loss = call(state, i)
            jax.block_until_ready((state, loss))
            return (time.perf_counter() - t0) / steps

    ops = {}
    for flag in (False, True):
        with jax.zero_cotangent_masking(flag):
            ops[flag] = n_ops()
        timed(flag)  # compile and warm up
    off, on, ratios = [], [], []
    for r in range(rounds):
        order = (False, True) if r % 2 == 0 else (True, False)
        t = {flag: timed(flag) for flag in order}
        off.append(t[False])
        on.append(t[True])
        ratios.append(t[True] / t[False])
    lo, hi = median_interval(ratios)
    print(f"{name}: {rounds} rounds x {steps} steps, order alternating")
    print(f"  flag off {statistics.median(off) * 1e3:8.3f} ms/step (median)   HLO instructions {ops[False]}")
    print(f"  flag on  {statistics.median(on) * 1e3:8.3f} ms/step (median)   HLO instructions {ops[True]} "
          f"({ops[True] - ops[False]:+d})")
    print(f"  ratio on/off: median of per-round ratios {statistics.median(ratios):.3f} "
          f"[95% interval {lo:.3f}, {hi:.3f}]; ratio of medians {statistics.median(on) / statistics.median(off):.3f}")
    print(f"  jitted gradient, flag on vs off: {gradient_difference(grads)}")
    print(f"  median ratio in rounds run off-first {statistics.median(ratios[0::2]):.3f}, "
          f"on-first {statistics.median(ratios[1::2]):.3f} (a gap means the order matters)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=31)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--models", default="transformer,tied")
    args = ap.parse_args()
    import jax

    if not hasattr(jax, "zero_cotangent_masking"):
        patched = ROOT / ".venv-jax-patched" / "bin" / "python"
        if patched.exists() and not os.environ.get("XLA_HARNESS_BENCH_REEXEC"):
            env = {**os.environ, "XLA_HARNESS_BENCH_REEXEC": "1", "PYTHONPATH": str(ROOT)}
            return subprocess.call([str(patched), __file__, *sys.argv[1:]], env=env)
        sys.stderr.write("error: this jax has no zero-cotangent masking; build .venv-jax-patched with "
                         "'make jax-patched-venv' first\n")
        return 2
    builders = {"transformer": transformer_program, "tied": tied_program}
    models = [m for m in args.models.split(",") if m]
    if args.rounds < 6 or any(m not in builders for m in models):
        sys.stderr.write(f"error: --rounds must be >= 6 and --models a subset of {','.join(builders)}\n")
        return 2
    print(f"jax {jax.__version__} ({jax.default_backend()}, {jax.devices()[0].device_kind}), "
          f"{os.cpu_count()} CPUs visible")
    for m in models:
        measure(*builders[m](), rounds=args.rounds, steps=args.steps)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
