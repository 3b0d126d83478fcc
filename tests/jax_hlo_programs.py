"""jax programs whose --xla_dump_to dumps the reader is checked on against XLA's parser
(tests/hlo/test_hlo_reader.py, and tools/hlo_corpus.py dump-jax for the by-hand corpus): loops,
scan, while, remat, custom calls, donation, sharding and collectives on 8 host devices."""

import textwrap

JAX_PROGRAMS = textwrap.dedent("""
    import jax, jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec as P
    x = jnp.arange(64.0).reshape(8, 8)
    idx = jnp.array([1, 3, 5])

    def loop(x):
        return jax.lax.fori_loop(0, 5, lambda i, c: c * 1.01 + jnp.sin(c), x)

    def scan(x):
        return jax.lax.scan(lambda c, r: (c + r, c.sum()), jnp.zeros(8), x)

    def remat(w, x):
        f = jax.checkpoint(lambda w, x: jnp.tanh(x @ w) @ w.T)
        return jax.grad(lambda w: f(w, x).sum())(w)

    def tied(w, i, h):
        return jax.grad(lambda w: (w[i].sum() + (h @ w.T).sum()))(w)

    def while_(x):
        return jax.lax.while_loop(lambda c: c[0] < 4, lambda c: (c[0] + 1, c[1] @ c[1].T), (0, x))

    def custom(x):
        return jnp.linalg.qr(x)[0], jnp.sort(x, axis=0), jnp.fft.fft(x).real

    def dus(x):
        return jax.lax.dynamic_update_slice(x, jnp.ones((2, 8)), (3, 0)), x.at[idx].add(1.0)

    jax.jit(loop)(x); jax.jit(scan)(x); jax.jit(remat)(x, x); jax.jit(tied)(x, idx, x)
    jax.jit(while_)(x); jax.jit(custom)(x)
    jax.jit(dus, donate_argnums=0)(x + 0)
    mesh = jax.sharding.Mesh(jax.devices(), ("d",))
    xs = jax.device_put(jnp.arange(512.0).reshape(64, 8), NamedSharding(mesh, P("d")))
    jax.jit(lambda a: (a.sum(0), a @ a.T, jnp.roll(a, 1, axis=0)))(xs)
    ppermute = jax.shard_map(lambda a: (jax.lax.ppermute(a, "d", [(i, (i + 1) % 8) for i in range(8)]),
                                        jax.lax.psum(a, "d"), jax.lax.all_gather(a, "d")),
                             mesh=mesh, in_specs=P("d"), out_specs=(P("d"), P(), P("d")), check_vma=False)
    jax.jit(ppermute)(xs)
""")
