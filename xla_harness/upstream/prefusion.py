"""Dump pre-fusion HLO modules of a set of JAX programs (CPU), for measuring how many fusion
decisions a patch to the fusion pass changes (``python -m xla_harness.upstream.xlatest
blast-radius``).

    python -m xla_harness.upstream.prefusion --out DIR

Each program is jitted and compiled on CPU with ``--xla_dump_hlo_pass_re=fusion``; XLA then
writes ``*.before_fusion.txt``: the module as the CPU pipeline hands it to its fusion pass
(after layout assignment and simplification). The programs cover the in-place ops that
reach the fusion decision: scatter (embedding gradients, ``.at[].add``, segment sums) and
dynamic-update-slice (scan outputs, cache updates), with and without remat.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from collections.abc import Callable
from pathlib import Path


def _programs() -> dict[str, Callable[[], tuple[Callable, tuple]]]:
    import jax
    import jax.numpy as jnp

    from xla_harness.programs import tied_embedding as te

    k = jax.random.PRNGKey(0)
    w = jax.random.normal(k, (256, 64))
    idx = jax.random.randint(k, (32,), 0, 256)
    x = jax.random.normal(k, (8, 64))

    def tied(mode: str, remat: bool):
        cfg = te.ModelConfig(mode=mode, remat=remat)
        params = te.init_params(cfg, k)
        batches = te.make_batches(cfg, k)
        return jax.grad(lambda p, b: te.loss_fn(p, b, cfg)), (params, batches)

    progs: dict[str, Callable[[], tuple[Callable, tuple]]] = {}
    for mode in te.MODES:
        for remat in (True, False):
            progs[f"tied_{mode}_remat{int(remat)}"] = functools.partial(tied, mode, remat)
    progs["embedding_grad"] = lambda: (jax.grad(lambda w: jnp.take(w, idx, axis=0).sum()), (w,))
    progs["transposed_scatter_add"] = lambda: (lambda w, u: w.T.at[idx % 64].add(u), (w, jnp.ones((32, 256))))
    progs["scatter_then_dot"] = lambda: (lambda w, u: (w.T.at[idx % 64].add(u), x @ w.T), (w, jnp.ones((32, 256))))
    progs["segment_sum_grad"] = lambda: (
        jax.grad(lambda v: jax.ops.segment_sum(v * v, idx % 16, 16).sum()), (jnp.ones((32, 8)),))

    def scan_stack(c, xs):
        return jax.lax.scan(lambda c, x: (jnp.tanh(c @ w[:64] + x), c), c, xs)

    progs["scan_stack"] = lambda: (scan_stack, (jnp.ones((8, 64)), jnp.ones((10, 8, 64))))
    progs["scan_stack_grad"] = lambda: (
        jax.grad(lambda c, xs: scan_stack(c, xs)[1].sum()), (jnp.ones((8, 64)), jnp.ones((10, 8, 64))))

    def cache_update(cache, new, pos):
        return jax.lax.dynamic_update_slice(cache, new.T, (0, pos))

    progs["kv_cache_update"] = lambda: (cache_update, (jnp.ones((64, 128)), jnp.ones((4, 64)), 3))

    def mlp_step(params, x, y):
        def loss(p):
            h = jax.nn.relu(x @ p[0])
            return jnp.mean((h @ p[1] - y) ** 2)
        g = jax.grad(loss)(params)
        return [p - 0.1 * gp for p, gp in zip(params, g, strict=True)]

    progs["mlp_step"] = lambda: (mlp_step, ([jnp.ones((64, 128)), jnp.ones((128, 8))], x, jnp.ones((8, 8))))
    progs["sort_gather_grad"] = lambda: (jax.grad(lambda v: jnp.sort(v)[::2].sum() * v[jnp.argsort(v)][0]),
                                         (jnp.arange(64.0),))
    progs["one_hot_xent_grad"] = lambda: (
        jax.grad(lambda w: -(jax.nn.log_softmax(x @ w.T) * jax.nn.one_hot(idx[:8], 256)).sum()), (w,))
    progs["cumsum_topk"] = lambda: (lambda v: (jnp.cumsum(v, axis=0), jax.lax.top_k(v, 4)), (w,))
    progs["conv_grad"] = lambda: (
        jax.grad(lambda k_: jax.lax.conv(jnp.ones((2, 3, 16, 16)), k_, (1, 1), "SAME").sum()),
        (jnp.ones((4, 3, 3, 3)),))
    return progs


def dump(out: Path) -> list[str]:
    """Compile every program; returns their names (the dump goes to XLA_FLAGS' directory)."""
    import jax

    names = []
    for name, make in _programs().items():
        fn, args = make()
        jax.jit(fn).lower(*args).compile()
        names.append(name)
    return names


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m xla_harness.upstream.prefusion", description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="dump directory")
    args = ap.parse_args(argv)
    out = Path(args.out)
    if "jax" in sys.modules:
        print("error: XLA_FLAGS must be set before jax is imported; run this module on its own", file=sys.stderr)
        return 2
    os.environ["JAX_PLATFORMS"] = "cpu"
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + f" --xla_dump_to={out} --xla_dump_hlo_as_text"
                               " --xla_dump_hlo_pass_re=^fusion$").strip()
    names = dump(out)
    n = len(list(out.glob("*.before_fusion.txt")))
    print(f"prefusion: {len(names)} programs compiled on CPU, {n} pre-fusion modules in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
