"""The gradcheck registry: small scalar functions, evaluation points, expected derivatives.

Every function maps a float scalar to a float scalar; the checker vmaps it over the
points. ``expected`` is the analytic derivative at each point where one is known (for a
where-guard: the derivative of the live branch, 0 where the guarded branch is dead);
``smooth`` marks the points where central finite differences are a valid oracle.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import jax
import jax.numpy as jnp
from jax import lax


@dataclass(frozen=True)
class Case:
    name: str
    kind: str  # where-guard | select-jvp | loop | corpus | determinism
    fn: Callable
    points: tuple[float, ...]
    expected: tuple[float, ...] | None = None
    smooth: tuple[bool, ...] | None = None  # per point: finite differences valid here
    reverse: bool = True  # False: forward mode only (while_loop)
    second_order: tuple[float, ...] | None = None  # expected second derivative
    note: str = ""
    dead: tuple[bool, ...] | None = None  # where-guards: points where the guarded branch is dead


def _where(cond, a, b):
    return jnp.where(cond, a, b)


REGISTRY: list[Case] = []


def case(*args, **kwargs) -> None:
    REGISTRY.append(Case(*args, **kwargs))


X4 = (-1.0, 0.0, 1.0, 4.0)

# --- where-guarded singularities (TensorFlow report; JAX leaks in eager and jit) -----------
case("where_sqrt", "where-guard", lambda x: _where(x > 0, jnp.sqrt(x), 0.0), X4,
     expected=(0.0, 0.0, 0.5, 0.25), smooth=(True, False, True, True),
     note="grad of where(x > 0, sqrt(x), 0): the dead branch's derivative is inf/NaN", dead=(True, True, False, False))
case("where_reciprocal", "where-guard", lambda x: _where(x > 0, 1.0 / x, 1.0), X4,
     expected=(0.0, 0.0, -1.0, -0.0625), smooth=(True, False, True, True), dead=(True, True, False, False))
case("where_log", "where-guard", lambda x: _where(x > 0, jnp.log(x), -100.0), X4,
     expected=(0.0, 0.0, 1.0, 0.25), smooth=(True, False, True, True),
     note="NaN even in TF eager: the forward log(0) is -inf", dead=(True, True, False, False))
case("where_sqrt_neg", "where-guard", lambda x: _where(x > 0, jnp.sqrt(x), 0.0), (-1.0, -0.5),
     expected=(0.0, 0.0), smooth=(True, True), note="sqrt of a negative in the dead branch",
     dead=(True, True))
case("safe_distance_identical", "where-guard",
     lambda x: (lambda d2: _where(d2 > 0, jnp.sqrt(d2), 0.0))((x - x) ** 2),
     (0.0, 1.0, -2.0), expected=(0.0, 0.0, 0.0), smooth=(True, True, True),
     note="distance between identical points, guarded with a single where", dead=(True, True, True))
case("safe_l2_normalize", "where-guard",
     lambda x: (lambda n: _where(n > 0, x / n, 0.0))(jnp.sqrt(x * x)),
     (0.0, 2.0, -3.0), expected=(0.0, 0.0, 0.0), smooth=(False, True, True),
     note="x / |x| guarded at 0: derivative 0 away from 0", dead=(True, False, False))
case("where_rsqrt", "where-guard", lambda x: _where(x > 0, lax.rsqrt(x), 0.0), X4,
     expected=(0.0, 0.0, -0.5, -0.0625), smooth=(True, False, True, True), dead=(True, True, False, False))
case("where_pow_half", "where-guard", lambda x: _where(x > 0, x ** 0.5, 0.0), X4,
     expected=(0.0, 0.0, 0.5, 0.25), smooth=(True, False, True, True), dead=(True, True, False, False))

# --- select/where JVP with constant/partly traced operands (the MLX #3633 class) ------------
case("select_const_cond_true", "select-jvp", lambda x: _where(True, x * x, 3.0), (1.5, -2.0),
     expected=(3.0, -4.0), smooth=(True, True))
case("select_const_cond_false", "select-jvp", lambda x: _where(False, x * x, 3.0 * x), (1.5, -2.0),
     expected=(3.0, 3.0), smooth=(True, True))
case("select_const_true_branch", "select-jvp", lambda x: _where(x > 0, 2.0, x * x), (1.0, -3.0),
     expected=(0.0, -6.0), smooth=(True, True))
case("select_const_false_branch", "select-jvp", lambda x: _where(x > 0, x ** 3, -1.0), (2.0, -1.0),
     expected=(12.0, 0.0), smooth=(True, True))
case("select_traced_cond_only", "select-jvp",
     lambda x: _where(jnp.sin(x) > 0, 5.0, 7.0), (1.0, -1.0), expected=(0.0, 0.0), smooth=(True, True))
case("select_both_branches", "select-jvp", lambda x: _where(x > 0, jnp.sin(x), jnp.cos(x)),
     (0.7, -0.7), expected=(math.cos(0.7), math.sin(0.7)), smooth=(True, True))
case("select_n_three_way", "select-jvp",
     lambda x: lax.select_n(jnp.clip(jnp.floor(x + 1.0), 0, 2).astype(jnp.int32), x, 2 * x, x * x),
     (-0.5, 0.5, 1.5), expected=(1.0, 2.0, 3.0), smooth=(True, True, True))


# --- reverse mode through loops whose body Jacobian depends on x (the Nx class) ------------
def _fori(body, n):
    return lambda x: lax.fori_loop(0, n, lambda i, acc: body(acc, x), jnp.ones_like(x))


def _scan(body, n):
    return lambda x: lax.scan(lambda acc, _: (body(acc, x), None), jnp.ones_like(x), None, length=n)[0]


def _while(body, n):
    return lambda x: lax.while_loop(lambda s: s[0] < n, lambda s: (s[0] + 1, body(s[1], x)),
                                    (0, jnp.ones_like(x)))[1]


LOOP_BODIES = {
    "acc_times_x": (lambda acc, x: acc * x, lambda x, n: n * x ** (n - 1), lambda x, n: n * (n - 1) * x ** (n - 2)),
    "acc_div_x": (lambda acc, x: acc / x, lambda x, n: -n * x ** (-n - 1), lambda x, n: n * (n + 1) * x ** (-n - 2)),
    "acc_plus_acc_x": (lambda acc, x: acc + acc * x, lambda x, n: n * (1 + x) ** (n - 1),
                       lambda x, n: n * (n - 1) * (1 + x) ** (n - 2)),
    "acc_times_x_minus_2": (lambda acc, x: acc * (x - 2), lambda x, n: n * (x - 2) ** (n - 1),
                            lambda x, n: n * (n - 1) * (x - 2) ** (n - 2)),
    "acc_times_neg_x": (lambda acc, x: acc * (-x), lambda x, n: n * (-1) ** n * x ** (n - 1),
                        lambda x, n: n * (n - 1) * (-1) ** n * x ** (n - 2)),
}
LOOP_POINTS = (1e-3, 0.5, -0.7)
for bname, (body, d1, d2) in LOOP_BODIES.items():
    for n in (2, 3, 4):
        pts = LOOP_POINTS
        case(f"fori_{bname}_n{n}", "loop", _fori(body, n), pts, expected=tuple(d1(x, n) for x in pts),
             smooth=(True,) * 3, second_order=tuple(d2(x, n) for x in pts))
    case(f"scan_{bname}_n3", "loop", _scan(body, 3), LOOP_POINTS,
         expected=tuple(d1(x, 3) for x in LOOP_POINTS), smooth=(True,) * 3)
    case(f"while_{bname}_n3", "loop", _while(body, 3), LOOP_POINTS,
         expected=tuple(d1(x, 3) for x in LOOP_POINTS), smooth=(True,) * 3, reverse=False,
         note="while_loop: forward mode only")
case("fori_sin_acc_x_n3", "loop", _fori(lambda acc, x: jnp.sin(acc * x), 3), (0.3, 0.9), smooth=(True, True))

# --- corpus: the primitives whose rules the masking patch touches, at ordinary points -------
CORPUS = {
    "sqrt": (jnp.sqrt, (0.3, 2.0, 7.5)), "rsqrt": (lax.rsqrt, (0.3, 2.0)), "cbrt": (jnp.cbrt, (0.3, -2.0, 8.0)),
    "log": (jnp.log, (0.3, 2.0)), "log1p": (jnp.log1p, (-0.5, 0.3, 3.0)), "asin": (jnp.arcsin, (-0.4, 0.3)),
    "acos": (jnp.arccos, (-0.4, 0.3)), "atanh": (jnp.arctanh, (-0.4, 0.3)), "acosh": (jnp.arccosh, (1.5, 3.0)),
    "atan2_x": (lambda x: jnp.arctan2(x, 0.7), (-1.0, 0.5)), "atan2_y": (lambda x: jnp.arctan2(0.7, x), (-1.0, 0.5)),
    "div_num": (lambda x: x / 1.7, (-1.0, 0.5)), "div_den": (lambda x: 1.7 / x, (-1.0, 0.5)),
    "pow_base": (lambda x: x ** 2.5, (0.5, 3.0)), "pow_exp": (lambda x: 2.5 ** x, (-1.0, 0.5)),
    "exp": (jnp.exp, (-1.0, 0.5)), "sin": (jnp.sin, (-1.0, 0.5)), "tanh": (jnp.tanh, (-1.0, 0.5)),
    "logistic": (jax.nn.sigmoid, (-1.0, 0.5)), "erf": (jax.scipy.special.erf, (-1.0, 0.5)),
    "softplus": (jax.nn.softplus, (-1.0, 0.5)), "norm_composite": (lambda x: jnp.sqrt(x * x + 1.0) / (1 + x * x), (-1.0, 0.5)),
}
for cname, (fn, pts) in CORPUS.items():
    case(f"corpus_{cname}", "corpus", fn, pts, smooth=(True,) * len(pts))


def by_name() -> dict[str, Case]:
    return {c.name: c for c in REGISTRY}
