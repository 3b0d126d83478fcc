"""The known bug classes a program's non-finite value can be an instance of (a ``jnp.where`` gradient
trap, Adam's eps=0 on a zero gradient, 0/0, x/0, log(0), sqrt of a negative value, exp overflowing
float32, a NaN constant...): :data:`KNOWN` names them as a sentence puts them, :func:`known_class`
decides which one the first non-finite birth of a step is, with its fix.
"""

from __future__ import annotations

from xla_harness.origin.births import Birth, Evaluation

# The bug classes known_class names, as a sentence puts them.
KNOWN = {"where-gradient-trap": "a jnp.where gradient trap", "adaptive-optimizer-eps-0": "Adam/RMSProp eps=0 on a zero "
         "gradient", "zero-over-zero": "0/0", "division-by-zero": "x/0", "log-of-zero": "log(0)",
         "log-of-negative": "log of a negative value", "sqrt-of-negative": "sqrt of a negative value",
         "rsqrt-of-zero": "1/sqrt(0)", "exp-overflow": "exp overflowing float32",
         "sqrt-at-zero": "the derivative of sqrt at 0", "non-finite-constant": "a NaN or inf constant in the program"}


def known_class(first: Birth, where: dict, ev: Evaluation) -> tuple[str | None, str | None]:
    """(name, fix) of a bug class the first birth is an instance of, else (None, None)."""
    masked = next((b for b in ev.births if b.masked_by is not None), None)
    prim = first.site.primitive
    ops = [o.value for o in first.operands]
    lib = (where.get("library") or {}).get("file", "") if where else ""
    if first.from_constant:
        return ("non-finite-constant", "a NaN or an inf the program holds as a constant (jnp.nan, jnp.inf, a "
                                       "mask's fill value) reaches the step's outputs: follow where it is used")
    if masked is not None:
        return ("where-gradient-trap",
                "the branch a jnp.where masks out has an infinite derivative there, and the where's zero "
                "cotangent times it is 0 * inf = NaN: keep the masked branch finite (jnp.where(mask, x, safe) "
                "inside it), or use jax with the zero-cotangent masking patch (jax_zero_cotangent_masking)")
    if prim == "div" and len(ops) == 2 and ops[0] == 0.0 and ops[1] == 0.0:
        if "optax" in lib:
            return ("adaptive-optimizer-eps-0",
                    "an Adam/RMSProp-style update m / (sqrt(v) + eps) with eps = 0 on a zero gradient is 0/0: "
                    "give the optimizer eps > 0")
        return "zero-over-zero", "0/0 (a mean over nothing, a norm of zero): guard the denominator"
    if prim == "div" and len(ops) == 2 and ops[1] == 0.0:
        below = first.operands[1].producer
        if below is not None and below.primitive in ("sqrt", "rsqrt"):  # jax's sqrt derivative: 0.5 / sqrt(x)
            return ("sqrt-at-zero", "the derivative of sqrt at 0 is infinite: keep its argument away from 0 "
                                    "(jnp.sqrt(x + eps)), or use a norm that is safe at 0")
        return "division-by-zero", "x/0: guard the denominator"
    if prim == "log" and ops and ops[0] is not None and ops[0] <= 0.0:
        return ("log-of-zero" if ops[0] == 0.0 else "log-of-negative",
                "log of a value <= 0: clamp its argument (jnp.log(jnp.maximum(x, tiny))) or work in log space")
    if prim in ("sqrt", "rsqrt") and ops and ops[0] is not None and ops[0] < 0.0:
        return "sqrt-of-negative", "sqrt of a negative value: clamp its argument at 0"
    if prim == "rsqrt" and ops and ops[0] == 0.0:
        return "rsqrt-of-zero", "1/sqrt(0): add an epsilon under the root"
    if prim == "exp" and first.kind == "inf":
        return "exp-overflow", "exp overflows float32 above 88.7: subtract the maximum first or work in log space"
    return None, None
