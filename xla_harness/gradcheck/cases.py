"""The gradcheck registry: small scalar functions, evaluation points, expected derivatives.

Each case is written once, framework-neutral: ``fn(F, x)`` where ``F`` is an ops namespace
(``xla_harness/gradcheck/frameworks``: jax, tf, mlx) with ``where``, ``sqrt``, ``fori`` and so
on, and ``x`` a scalar (jax, vmapped over the points) or a vector of points (tf, mlx; every
case is elementwise). ``expected`` is the analytic derivative at each point where one is known (for a
where-guard: the derivative of the live branch, 0 where the guarded branch is dead);
``smooth`` marks the points where central finite differences are a valid oracle.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Case:
    name: str
    kind: str  # where-guard | select-jvp | loop | corpus | determinism
    fn: Callable  # fn(F, x): F an ops namespace from xla_harness.gradcheck.frameworks
    points: tuple[float, ...]
    expected: tuple[float, ...] | None = None
    smooth: tuple[bool, ...] | None = None  # per point: finite differences valid here
    reverse: bool = True  # False: forward mode only (while_loop)
    second_order: tuple[float, ...] | None = None  # expected second derivative
    note: str = ""
    dead: tuple[bool, ...] | None = None  # where-guards: points where the guarded branch is dead


REGISTRY: list[Case] = []


def case(*args, **kwargs) -> None:
    REGISTRY.append(Case(*args, **kwargs))


X4 = (-1.0, 0.0, 1.0, 4.0)

# --- where-guarded singularities (TensorFlow report; JAX leaks in eager and jit) -----------
case("where_sqrt", "where-guard", lambda F, x: F.where(x > 0, F.sqrt(x), 0.0), X4,
     expected=(0.0, 0.0, 0.5, 0.25), smooth=(True, False, True, True),
     note="grad of where(x > 0, sqrt(x), 0): the dead branch's derivative is inf/NaN", dead=(True, True, False, False))
case("where_reciprocal", "where-guard", lambda F, x: F.where(x > 0, 1.0 / x, 1.0), X4,
     expected=(0.0, 0.0, -1.0, -0.0625), smooth=(True, False, True, True), dead=(True, True, False, False),
     note="1.0 / x: a division (TF: RealDiv, whose gradient no kernel guards)")
case("where_reciprocal_op", "where-guard", lambda F, x: F.where(x > 0, F.reciprocal(x), 1.0), X4,
     expected=(0.0, 0.0, -1.0, -0.0625), smooth=(True, False, True, True), dead=(True, True, False, False),
     note="the reciprocal op (TF: Reciprocal, gradient ReciprocalGrad)")
case("where_log", "where-guard", lambda F, x: F.where(x > 0, F.log(x), -100.0), X4,
     expected=(0.0, 0.0, 1.0, 0.25), smooth=(True, False, True, True),
     note="NaN even in TF eager: the forward log(0) is -inf", dead=(True, True, False, False))
case("where_sqrt_neg", "where-guard", lambda F, x: F.where(x > 0, F.sqrt(x), 0.0), (-1.0, -0.5),
     expected=(0.0, 0.0), smooth=(True, True), note="sqrt of a negative in the dead branch",
     dead=(True, True))
case("safe_distance_identical", "where-guard",
     lambda F, x: (lambda d2: F.where(d2 > 0, F.sqrt(d2), 0.0))((x - x) ** 2),
     (0.0, 1.0, -2.0), expected=(0.0, 0.0, 0.0), smooth=(True, True, True),
     note="distance between identical points, guarded with a single where", dead=(True, True, True))
case("safe_l2_normalize", "where-guard",
     lambda F, x: (lambda n: F.where(n > 0, x / n, 0.0))(F.sqrt(x * x)),
     (0.0, 2.0, -3.0), expected=(0.0, 0.0, 0.0), smooth=(False, True, True),
     note="x / |x| guarded at 0: derivative 0 away from 0", dead=(True, False, False))
case("where_rsqrt", "where-guard", lambda F, x: F.where(x > 0, F.rsqrt(x), 0.0), X4,
     expected=(0.0, 0.0, -0.5, -0.0625), smooth=(True, False, True, True), dead=(True, True, False, False))
case("where_pow_half", "where-guard", lambda F, x: F.where(x > 0, x ** 0.5, 0.0), X4,
     expected=(0.0, 0.0, 0.5, 0.25), smooth=(True, False, True, True), dead=(True, True, False, False))

# --- select/where JVP with constant/partly traced operands (the MLX #3633 class) ------------
case("select_const_cond_true", "select-jvp", lambda F, x: F.where(True, x * x, 3.0), (1.5, -2.0),
     expected=(3.0, -4.0), smooth=(True, True))
case("select_const_cond_false", "select-jvp", lambda F, x: F.where(False, x * x, 3.0 * x), (1.5, -2.0),
     expected=(3.0, 3.0), smooth=(True, True))
case("select_const_true_branch", "select-jvp", lambda F, x: F.where(x > 0, 2.0, x * x), (1.0, -3.0),
     expected=(0.0, -6.0), smooth=(True, True))
case("select_const_false_branch", "select-jvp", lambda F, x: F.where(x > 0, x ** 3, -1.0), (2.0, -1.0),
     expected=(12.0, 0.0), smooth=(True, True))
case("select_const_branch_mlx3633", "select-jvp", lambda F, x: F.where(x < -1, 999.0, x * x), (3.0, -2.0),
     expected=(6.0, 0.0), smooth=(True, True), note="ml-explore/mlx#3633: jvp of where(t < -1, 999, t*t)")
case("select_traced_cond_only", "select-jvp",
     lambda F, x: F.where(F.sin(x) > 0, 5.0, 7.0), (1.0, -1.0), expected=(0.0, 0.0), smooth=(True, True))
case("select_both_branches", "select-jvp", lambda F, x: F.where(x > 0, F.sin(x), F.cos(x)),
     (0.7, -0.7), expected=(math.cos(0.7), math.sin(0.7)), smooth=(True, True))
case("select_n_three_way", "select-jvp",
     lambda F, x: F.select_n(F.clip(F.floor(x + 1.0), 0.0, 2.0), x, 2 * x, x * x),
     (-0.5, 0.5, 1.5), expected=(1.0, 2.0, 3.0), smooth=(True, True, True))


# --- reverse mode through loops whose body Jacobian depends on x (the Nx class) ------------
# F.fori: jax fori_loop, tf.while_loop with maximum_iterations, mlx a Python loop.
def _fori(body, n):
    return lambda F, x: F.fori(n, lambda acc: body(F, acc, x), F.ones_like(x))


def _scan(body, n):
    return lambda F, x: F.scan(n, lambda acc: body(F, acc, x), F.ones_like(x))


def _while(body, n):
    return lambda F, x: F.while_(n, lambda acc: body(F, acc, x), F.ones_like(x))


LOOP_BODIES = {
    "acc_times_x": (lambda F, acc, x: acc * x, lambda x, n: n * x ** (n - 1),
                    lambda x, n: n * (n - 1) * x ** (n - 2)),
    "acc_div_x": (lambda F, acc, x: acc / x, lambda x, n: -n * x ** (-n - 1),
                  lambda x, n: n * (n + 1) * x ** (-n - 2)),
    "acc_plus_acc_x": (lambda F, acc, x: acc + acc * x, lambda x, n: n * (1 + x) ** (n - 1),
                       lambda x, n: n * (n - 1) * (1 + x) ** (n - 2)),
    "acc_times_x_minus_2": (lambda F, acc, x: acc * (x - 2), lambda x, n: n * (x - 2) ** (n - 1),
                            lambda x, n: n * (n - 1) * (x - 2) ** (n - 2)),
    "acc_times_neg_x": (lambda F, acc, x: acc * (-x), lambda x, n: n * (-1) ** n * x ** (n - 1),
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
         note="while loop without a bound: forward mode only")
case("fori_sin_acc_x_n3", "loop", _fori(lambda F, acc, x: F.sin(acc * x), 3), (0.3, 0.9), smooth=(True, True))

# --- corpus: the primitives whose rules the masking patch touches, at ordinary points -------
CORPUS = {
    "sqrt": (lambda F, x: F.sqrt(x), (0.3, 2.0, 7.5)), "rsqrt": (lambda F, x: F.rsqrt(x), (0.3, 2.0)),
    "cbrt": (lambda F, x: F.cbrt(x), (0.3, -2.0, 8.0)), "log": (lambda F, x: F.log(x), (0.3, 2.0)),
    "log1p": (lambda F, x: F.log1p(x), (-0.5, 0.3, 3.0)), "asin": (lambda F, x: F.arcsin(x), (-0.4, 0.3)),
    "acos": (lambda F, x: F.arccos(x), (-0.4, 0.3)), "atanh": (lambda F, x: F.arctanh(x), (-0.4, 0.3)),
    "acosh": (lambda F, x: F.arccosh(x), (1.5, 3.0)),
    "atan2_x": (lambda F, x: F.arctan2(x, 0.7 + 0 * x), (-1.0, 0.5)),
    "atan2_y": (lambda F, x: F.arctan2(0.7 + 0 * x, x), (-1.0, 0.5)),
    "div_num": (lambda F, x: x / 1.7, (-1.0, 0.5)), "div_den": (lambda F, x: 1.7 / x, (-1.0, 0.5)),
    "pow_base": (lambda F, x: x ** 2.5, (0.5, 3.0)), "pow_exp": (lambda F, x: F.pow(2.5, x), (-1.0, 0.5)),
    "exp": (lambda F, x: F.exp(x), (-1.0, 0.5)), "sin": (lambda F, x: F.sin(x), (-1.0, 0.5)),
    "tanh": (lambda F, x: F.tanh(x), (-1.0, 0.5)), "logistic": (lambda F, x: F.sigmoid(x), (-1.0, 0.5)),
    "erf": (lambda F, x: F.erf(x), (-1.0, 0.5)), "softplus": (lambda F, x: F.softplus(x), (-1.0, 0.5)),
    "norm_composite": (lambda F, x: F.sqrt(x * x + 1.0) / (1 + x * x), (-1.0, 0.5)),
}
for cname, (fn, points) in CORPUS.items():  # not 'pts': the loop cases above bind it (3 points)
    case(f"corpus_{cname}", "corpus", fn, points, smooth=(True,) * len(points))


def by_name() -> dict[str, Case]:
    return {c.name: c for c in REGISTRY}
