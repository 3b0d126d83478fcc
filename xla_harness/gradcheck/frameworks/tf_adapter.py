"""TensorFlow: the ops namespace and the modes eager (GradientTape), graph (tf.function) and
jit_compile (tf.function(jit_compile=True), i.e. tf2xla + XLA). Every case is elementwise,
so the gradient of sum(f(x)) is the per-point derivative.

``jit_patched`` is jit_compile with the gradients of sqrt, rsqrt and reciprocal computed by
the ops of ``xla_harness/gradcheck/tf_oplib`` (the tf2xla lowerings of patches/tensorflow/0001,
compiled against the installed TF and registered as HarnessSqrtGrad etc.); it is offered
only when that library is built (``XLA_HARNESS_TF_OPLIB`` names the .so).
"""

from __future__ import annotations

import functools
import os

import numpy as np

from xla_harness.gradcheck.frameworks import Unsupported

NAME = "tf"
MODES = ("eager", "graph", "jit_compile")
PATCHED_MODE = "jit_patched"
OPLIB_ENV = "XLA_HARNESS_TF_OPLIB"


def available() -> str:
    try:
        import tensorflow  # noqa: F401
    except ImportError as exc:
        return f"cannot import tensorflow ({exc})"
    # XLA registers its JIT kernels once, at the first compilation: load the library first.
    oplib()
    return ""


def version() -> str:
    import tensorflow as tf

    return tf.__version__


def modes() -> tuple[str, ...]:
    return (*MODES, PATCHED_MODE) if os.environ.get(OPLIB_ENV) else MODES


@functools.cache
def oplib():
    """The loaded op library with the patched lowerings, or None when none is built."""
    path = os.environ.get(OPLIB_ENV, "")
    if not path:
        return None
    import tensorflow as tf

    return tf.load_op_library(path)


class Ops:
    """The namespace ``F`` for TensorFlow (vectors of points in and out)."""

    def __init__(self, patched: bool = False):
        import tensorflow as tf

        self.tf = tf
        m = tf.math
        for name, fn in {"sqrt": m.sqrt, "rsqrt": m.rsqrt, "reciprocal": m.reciprocal, "log": m.log,
                         "log1p": m.log1p, "exp": m.exp, "sin": m.sin, "cos": m.cos, "tanh": m.tanh,
                         "arcsin": m.asin, "arccos": m.acos, "arctanh": m.atanh, "arccosh": m.acosh,
                         "arctan2": m.atan2, "floor": m.floor, "ones_like": tf.ones_like,
                         "sigmoid": m.sigmoid, "softplus": tf.nn.softplus, "erf": m.erf}.items():
            setattr(self, name, fn)
        if patched:
            self._use_patched_gradients(oplib())

    def _use_patched_gradients(self, lib):
        """sqrt, rsqrt, reciprocal whose gradient ops are the patched lowerings (same formula
        and operands as TF's registered gradients: SqrtGrad(y, dy) etc.)."""
        tf = self.tf

        def wrap(forward, grad_op):
            @tf.custom_gradient
            def f(x):
                y = forward(x)
                return y, lambda dy: grad_op(y=y, dy=dy)
            return f

        self.sqrt = wrap(tf.math.sqrt, lib.harness_sqrt_grad)
        self.rsqrt = wrap(tf.math.rsqrt, lib.harness_rsqrt_grad)
        self.reciprocal = wrap(tf.math.reciprocal, lib.harness_reciprocal_grad)

    def cbrt(self, x):
        raise Unsupported("TensorFlow has no cbrt op")

    def where(self, cond, a, b):
        tf = self.tf
        return tf.where(tf.convert_to_tensor(cond), a, b)

    def pow(self, a, b):
        return self.tf.pow(a, b)

    def clip(self, x, lo, hi):
        return self.tf.clip_by_value(x, lo, hi)

    def select_n(self, index, *branches):
        out = branches[-1]
        for k in range(len(branches) - 2, -1, -1):
            out = self.tf.where(index == float(k), branches[k], out)
        return out

    def fori(self, n, body, init):
        # maximum_iterations makes the loop reverse-differentiable under XLA.
        return self.tf.while_loop(lambda acc: True, lambda acc: (body(acc),), (init,), maximum_iterations=n)[0]

    def scan(self, n, body, init):
        tf = self.tf
        return tf.scan(lambda acc, _: body(acc), tf.range(n), initializer=init)[-1]

    def while_(self, n, body, init):
        tf = self.tf
        return tf.while_loop(lambda i, acc: i < n, lambda i, acc: (i + 1, body(acc)), (tf.constant(0), init))[1]


@functools.cache
def ops(patched: bool = False) -> Ops:
    return Ops(patched)


def gradient(case, mode: str, x: np.ndarray) -> np.ndarray:
    import tensorflow as tf

    if mode not in modes():
        raise ValueError(f"unknown tf mode {mode!r}")
    oplib()  # before the first XLA compilation, which registers the JIT kernels once
    F = ops(patched=mode == PATCHED_MODE)

    def grad(xs):
        with tf.GradientTape() as tape:
            tape.watch(xs)
            y = tf.reduce_sum(case.fn(F, xs))
        return tape.gradient(y, xs, unconnected_gradients=tf.UnconnectedGradients.ZERO)

    if mode == "graph":
        grad = tf.function(grad, autograph=False)
    elif mode in ("jit_compile", PATCHED_MODE):
        grad = tf.function(grad, autograph=False, jit_compile=True)
    return np.asarray(grad(tf.constant(np.asarray(x, np.float32))))
