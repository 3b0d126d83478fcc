"""JAX: the ops namespace and the modes eager, jit, vjp, jvp (each case vmapped over its points)."""

from __future__ import annotations

import functools

import numpy as np

from xla_harness.errors import HarnessError

NAME = "jax"
MODES = ("eager", "jit", "vjp", "jvp")


def available() -> str:
    try:
        import jax  # noqa: F401
    except ImportError as exc:
        return f"cannot import jax ({exc})"
    return ""


def version() -> str:
    import jax

    return jax.__version__


class Ops:
    """The namespace ``F`` for jax (scalars in, scalars out)."""

    def __init__(self):
        import jax
        import jax.numpy as jnp
        from jax import lax

        self.jnp, self.lax = jnp, lax
        for name in ("sqrt", "log", "log1p", "exp", "sin", "cos", "tanh", "cbrt", "arcsin", "arccos",
                     "arctanh", "arccosh", "arctan2", "floor", "clip", "ones_like", "reciprocal", "power"):
            setattr(self, name, getattr(jnp, name))
        self.rsqrt = lax.rsqrt
        self.sigmoid = jax.nn.sigmoid
        self.softplus = jax.nn.softplus
        self.erf = jax.scipy.special.erf

    def where(self, cond, a, b):
        return self.jnp.where(cond, a, b)

    def pow(self, a, b):
        return self.jnp.power(a, b)

    def select_n(self, index, *branches):
        return self.lax.select_n(index.astype(self.jnp.int32), *branches)

    def fori(self, n, body, init):
        return self.lax.fori_loop(0, n, lambda i, acc: body(acc), init)

    def scan(self, n, body, init):
        return self.lax.scan(lambda acc, _: (body(acc), None), init, None, length=n)[0]

    def while_(self, n, body, init):
        return self.lax.while_loop(lambda s: s[0] < n, lambda s: (s[0] + 1, body(s[1])), (0, init))[1]


@functools.cache
def ops() -> Ops:
    return Ops()


def bind(case):
    """The case as a jax function of one scalar."""
    F = ops()
    return lambda x: case.fn(F, x)


def gradient(case, mode: str, x: np.ndarray) -> np.ndarray:
    """d f / d x at each point, float32, computed in ``mode`` (the case vmapped over its points)."""
    import jax
    import jax.numpy as jnp

    f = bind(case)
    xs = jnp.asarray(x, jnp.float32)
    if mode == "eager":
        return np.asarray(jax.vmap(jax.grad(f))(xs))
    if mode == "jit":
        return np.asarray(jax.jit(jax.vmap(jax.grad(f)))(xs))
    F = jax.vmap(f)
    if mode == "vjp":
        _, pullback = jax.vjp(F, xs)
        return np.asarray(pullback(jnp.ones_like(xs))[0])
    if mode == "jvp":
        return np.asarray(jax.jvp(F, (xs,), (jnp.ones_like(xs),))[1])
    raise HarnessError(f"unknown mode {mode!r}; expected one of {', '.join(MODES)}")


def modes() -> tuple[str, ...]:
    return MODES
