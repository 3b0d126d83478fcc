"""MLX: the ops namespace and the modes eager (mx.grad), compile (mx.compile of mx.grad),
vjp and jvp. Loops are Python loops (MLX traces them). Every case is elementwise."""

from __future__ import annotations

import functools

import numpy as np

from xla_harness.gradcheck.frameworks import Unsupported

NAME = "mlx"
MODES = ("eager", "compile", "vjp", "jvp")


def available() -> str:
    try:
        import mlx.core  # noqa: F401
    except ImportError as exc:
        return f"cannot import mlx.core ({exc})"
    return ""


def version() -> str:
    from importlib.metadata import version as dist_version

    return dist_version("mlx")


def modes() -> tuple[str, ...]:
    return MODES


class Ops:
    """The namespace ``F`` for MLX (arrays of points in and out)."""

    def __init__(self):
        import mlx.core as mx

        self.mx = mx
        for name in ("sqrt", "rsqrt", "reciprocal", "log", "log1p", "exp", "sin", "cos", "tanh", "arcsin",
                     "arccos", "arctanh", "arccosh", "arctan2", "floor", "clip", "ones_like", "sigmoid", "erf"):
            setattr(self, name, getattr(mx, name))

    def cbrt(self, x):
        raise Unsupported("MLX has no cbrt op")

    def softplus(self, x):
        return self.mx.logaddexp(x, self.mx.zeros_like(x))

    def where(self, cond, a, b):
        mx = self.mx
        return mx.where(mx.array(cond) if isinstance(cond, bool) else cond, a, b)

    def pow(self, a, b):
        return self.mx.power(a, b)

    def select_n(self, index, *branches):
        out = branches[-1]
        for k in range(len(branches) - 2, -1, -1):
            out = self.mx.where(index == float(k), branches[k], out)
        return out

    def fori(self, n, body, init):
        acc = init
        for _ in range(n):
            acc = body(acc)
        return acc

    scan = fori
    while_ = fori


@functools.cache
def ops() -> Ops:
    return Ops()


def gradient(case, mode: str, x: np.ndarray) -> np.ndarray:
    import mlx.core as mx

    F = ops()
    xs = mx.array(np.asarray(x, np.float32))

    def f(v):
        return case.fn(F, v)

    def total(v):
        return f(v).sum()

    if mode == "eager":
        g = mx.grad(total)(xs)
    elif mode == "compile":
        g = mx.compile(mx.grad(total))(xs)
    elif mode == "vjp":
        g = mx.vjp(f, [xs], [mx.ones_like(xs)])[1][0]
    elif mode == "jvp":
        g = mx.jvp(f, [xs], [mx.ones_like(xs)])[1][0]
    else:
        raise ValueError(f"unknown mlx mode {mode!r}")
    return np.array(g, dtype=np.float32)
