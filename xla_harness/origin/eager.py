"""A step's jaxpr evaluated one equation at a time, and where its non-finite values are born.

What ``jax_debug_nans`` does for one jitted call (rerun it op by op, stop at the first primitive
that made a NaN), done after the fact on a state and a batch the run already holds, without the flag
and without changing the measured program, and with two differences that decide whose NaN it is:

* an **inf** counts (``exp`` overflowing float32 is where the step went wrong, not the ``mul`` that
  later made ``inf * 0 = NaN`` of it);
* the equation named is the earliest **birth** among the *ancestors of the step's non-finite
  outputs*: a non-finite value made from finite operands, or a NaN made from operands that held none.
  A ``-inf`` a program uses on purpose (an attention mask) and absorbs again (``exp(-inf) = 0``) is
  never named, because no non-finite output descends from it.

Call-like equations (``jit``/``pjit``, ``custom_jvp_call``, ``custom_vjp_call``, ``checkpoint``,
``closed_call``) are entered, so an equation of the user's inside a jitted helper is named; loops and
conditionals (``scan``, ``while``, ``cond``) run as one equation each, and a birth inside one names the
loop. Each equation's place is its :class:`~xla_harness.origin.births.Site`: the path of equation
indices through the nesting, the primitive and the source lines jax recorded for it (jax's own frames
left out), innermost first. What an evaluation reports (sites, births, the :class:`Evaluation`) is
:mod:`~xla_harness.origin.births`'s.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from xla_harness.origin.births import Birth, Evaluation, Operand, Site, SourceLine

# Call-like primitives whose body is evaluated equation by equation: primitive -> the parameter that
# holds the body (a ClosedJaxpr or a Jaxpr whose inputs are the equation's operands, in order).
CALL_BODIES = {
    "pjit": "jaxpr", "jit": "jaxpr", "closed_call": "call_jaxpr", "core_call": "call_jaxpr",
    "custom_jvp_call": "call_jaxpr", "custom_vjp_call": "call_jaxpr", "custom_vjp_call_jaxpr": "fun_jaxpr",
    "checkpoint": "jaxpr", "remat": "jaxpr", "remat2": "jaxpr",
}
# How far back from a NaN-making product its zero operand is followed to the select that made it.
MASK_SEARCH_DEPTH = 8
# Primitives a cotangent passes through unchanged in its zeros on its way from a select to a product.
ZERO_PRESERVING = frozenset({
    "convert_element_type", "broadcast_in_dim", "reshape", "squeeze", "expand_dims", "transpose", "copy",
    "copy_p", "neg", "mul", "reduce_sum", "add_any", "pjit", "jit", "reduce_precision", "select_n",
})
MAX_BIRTHS = 10_000  # births remembered per evaluation (a program that masks with -inf makes many)


def inexact(dtype) -> bool:
    """A floating or complex dtype (what can hold a NaN or an inf); never a typed PRNG key's."""
    import jax.numpy as jnp

    return not is_key_dtype(dtype) and bool(jnp.issubdtype(dtype, jnp.inexact))


def is_key_dtype(dtype) -> bool:
    """A typed PRNG key's dtype (``jax.random.key``): no numpy array holds one."""
    import jax

    try:
        return bool(jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key))
    except TypeError:
        return False


def host(x) -> np.ndarray:
    """``x`` on the host: a typed PRNG key array as its key data (the integers it holds)."""
    import jax

    dtype = getattr(x, "dtype", None)
    if dtype is not None and is_key_dtype(dtype):
        return np.asarray(jax.random.key_data(x))
    return np.asarray(x)


def source_lines(eqn) -> tuple[SourceLine, ...]:
    """The frames jax recorded for ``eqn`` that are not jax's own or the standard library's, innermost
    first (``start_line`` from jax 0.4.36, ``line_num`` before)."""
    from jax._src import source_info_util

    tb = getattr(eqn.source_info, "traceback", None)
    out = []
    for f in source_info_util.user_frames(tb):
        line: Any = getattr(f, "start_line", None)
        if line is None:
            line = getattr(f, "line_num", 0)
        out.append(SourceLine(str(f.file_name), int(line or 0), str(f.function_name)))
    return tuple(out)


def _first_bad(a: np.ndarray) -> tuple[tuple[int, ...], str, int]:
    """(index, kind, count) of the first non-finite element of ``a`` (C order)."""
    bad = ~np.isfinite(a)
    flat = int(np.argmax(bad.reshape(-1))) if a.ndim else 0
    index = tuple(int(i) for i in np.unravel_index(flat, a.shape)) if a.ndim else ()
    v = a[index] if a.ndim else a[()]
    if np.iscomplexobj(v):
        v = v.real if not np.isfinite(v.real) else v.imag
    kind = "nan" if np.isnan(v) else ("inf" if v > 0 else "-inf")
    return index, kind, int(bad.sum())


def _element(a: np.ndarray, index: tuple[int, ...], shape: tuple[int, ...]) -> float | None:
    if a.ndim == 0:
        v = a[()]
    elif a.shape == shape:
        v = a[index]
    else:
        return None
    try:
        return float(np.real(v))
    except (TypeError, ValueError):
        return None


class Stopped(Exception):  # noqa: N818 - a request, not an error
    """The caller's ``should_stop`` said stop: nothing was decided (the step is left for later)."""


@dataclass
class _Walk:
    """One evaluation's bookkeeping: ancestry of non-finite values, births, captures."""

    capture: frozenset
    order: int = 0
    births: dict[int, Birth] = field(default_factory=dict)
    captured: dict[tuple[int, ...], tuple[list, list]] = field(default_factory=dict)
    should_stop: Callable[[], bool] = lambda: False
    upcast: bool = False  # every floating value in float64 (the float64 evaluation)


def _wide(x, upcast: bool):
    """With ``upcast``, a floating value narrower than float64 (a literal, a constant, a result an
    explicit float32 cast or a bitcast made) as float64, its weak type kept; else ``x``."""
    if not upcast:
        return x
    dtype = getattr(x, "dtype", None)
    if dtype is None:
        dtype = np.asarray(x).dtype
    if not inexact(dtype) or np.dtype(dtype).kind == "c" or np.dtype(dtype).itemsize >= 8:
        return x
    import jax.numpy as jnp

    if not hasattr(x, "weak_type"):  # a literal's Python or numpy number
        return np.float64(x) if np.ndim(x) == 0 else np.asarray(x, np.float64)
    try:
        from jax._src.lax import lax as lax_internal

        return lax_internal._convert_element_type(x, np.dtype(np.float64), weak_type=bool(x.weak_type))
    except (ImportError, AttributeError, TypeError):  # pragma: no cover
        return jnp.asarray(x, jnp.float64)


WIDENED_PARAMS = ("new_dtype", "preferred_element_type")  # a float32 target of these becomes float64


def _widened(params: dict) -> dict:
    out = dict(params)
    for key in WIDENED_PARAMS:
        dtype = out.get(key)
        if dtype is not None and inexact(dtype) and np.dtype(dtype).kind == "f" and np.dtype(dtype).itemsize < 8:
            out[key] = np.dtype(np.float64)
    return out


def _body(eqn):
    """(jaxpr, consts) of a call-like equation's body, or None to bind the equation whole."""
    key = CALL_BODIES.get(eqn.primitive.name)
    body = eqn.params.get(key) if key else None
    if body is None:
        return None
    jaxpr = getattr(body, "jaxpr", body)
    consts = list(getattr(body, "consts", []) or [])
    if not hasattr(jaxpr, "eqns") or len(jaxpr.invars) != len(eqn.invars) or len(jaxpr.outvars) != len(eqn.outvars):
        return None
    if len(getattr(jaxpr, "constvars", [])) != len(consts):
        return None
    return jaxpr, consts


def _bind(eqn, invals: list, upcast: bool = False) -> list:
    """``eqn``'s primitive bound eagerly on ``invals``. With ``upcast`` (the float64 evaluation) its
    float32 targets are float64 and so are its results; an equation whose body is typed (a loop, a
    conditional: jax checks their operands against it) that refuses float64 operands gets them at the
    types it was traced with, as it would have in the float64 trace."""
    got = eqn.primitive.get_bind_params(eqn.params)  # jax >= 0.12: the params; before: (subfuns, params)
    subfuns, params = (got if isinstance(got, tuple) else ([], got))
    if upcast and eqn.primitive.name != "bitcast_convert_type":  # a bitcast keeps its bits' type
        params = _widened(params)
    ctx = getattr(getattr(eqn, "ctx", None), "manager", None)

    def bind(values):
        if ctx is not None:
            with ctx:
                return eqn.primitive.bind(*subfuns, *values, **params)
        return eqn.primitive.bind(*subfuns, *values, **params)

    try:
        out = bind(invals)
    except (TypeError, ValueError):
        if not upcast:
            raise
        out = bind([_as_traced(x, v) for x, v in zip(invals, eqn.invars, strict=True)])
    outs = list(out) if eqn.primitive.multiple_results else [out]
    return [_wide(x, upcast) for x in outs]


def _as_traced(x, var):
    """``x`` at the dtype ``var`` was traced with (float64 narrowed back where the trace said float32)."""
    dtype = getattr(getattr(var, "aval", None), "dtype", None)
    if dtype is None or getattr(x, "dtype", dtype) == dtype or not inexact(dtype):
        return x
    try:
        from jax._src.lax import lax as lax_internal

        return lax_internal._convert_element_type(x, dtype, weak_type=bool(getattr(x, "weak_type", False)))
    except (ImportError, AttributeError, TypeError):  # pragma: no cover
        return x.astype(dtype)


def _jitted_name(eqn) -> str | None:
    """The name of the function a ``jit``/``pjit``/``closed_call`` equation calls, else None."""
    if eqn.primitive.name not in ("pjit", "jit", "closed_call", "core_call"):
        return None
    name = eqn.params.get("name")
    return str(name) if name else None


def _composed(inner: tuple[SourceLine, ...], outer: tuple[tuple[SourceLine, ...], str | None] | None
              ) -> tuple[SourceLine, ...]:
    """An equation's lines inside a body: jax traces a jitted function once per signature and reuses
    that trace, so below the function's own frames its lines are those of the *first* call, wherever
    it was. Kept: the frames up to the jitted function's own, then the lines of the call that entered
    the body here; a body none of whose frames is the function's (jax's own helpers: ``jnp.where`` is
    a jitted ``_where``) takes the entering call's lines alone. Outside a body, or in a body that is
    not a jitted function's (``custom_jvp``, ``checkpoint``), the equation's own lines (the entering
    call's where it has none)."""
    if outer is None:
        return inner
    lines, name = outer
    if name is None:
        return inner or lines
    own = next((i for i, f in enumerate(inner) if f.function == name or f.function.endswith("." + name)), None)
    return lines if own is None else inner[:own + 1] + lines


def _run(walk: _Walk, jaxpr, consts: list, args: list, prefix: tuple[int, ...],
         arg_ancestry: list[frozenset], arg_sites: list[Site | None],
         outer: tuple[tuple[SourceLine, ...], str | None] | None = None,
         arg_data: list[bool] | None = None) -> tuple[list, list[frozenset], list, list[bool]]:
    """Evaluate ``jaxpr`` on ``args``; returns its outputs, their ancestries, per output the (site,
    equation) that made it inside (None: an input or a literal passed through), and whether each
    depends on the step's arguments (``arg_data``: whether each argument does; all, by default).
    ``outer``: the lines of the call that entered this body and the jitted function's name; each
    equation's lines are composed with them (:func:`_composed`)."""
    from jax._src.core import Literal

    env: dict[Any, Any] = {}
    anc: dict[Any, frozenset] = {}
    made: dict[Any, tuple[Site, Any]] = {}  # var -> (site, eqn) of the equation that made it
    entry_sites: dict[Any, Site | None] = {}
    for v, x in zip(jaxpr.constvars, consts, strict=True):
        env[v] = _wide(x, walk.upcast)
    data: dict[Any, bool] = {}  # var -> whether it depends on the step's arguments (not constants alone)
    for v, x, a, s, d in zip(jaxpr.invars, args, arg_ancestry, arg_sites, arg_data or [True] * len(args),
                             strict=True):
        env[v], anc[v], entry_sites[v], data[v] = x, a, s, d

    def read(v):
        return _wide(v.val, walk.upcast) if isinstance(v, Literal) else env[v]

    def site_of(v) -> Site | None:
        if isinstance(v, Literal):
            return None
        if v in made:
            return made[v][0]
        return entry_sites.get(v)

    for i, eqn in enumerate(jaxpr.eqns):
        if walk.should_stop():
            raise Stopped
        path = (*prefix, i)
        site = Site(path, eqn.primitive.name, _composed(source_lines(eqn), outer))
        invals = [read(v) for v in eqn.invars]
        in_anc = [frozenset() if isinstance(v, Literal) else anc.get(v, frozenset()) for v in eqn.invars]
        in_data = [not isinstance(v, Literal) and data.get(v, False) for v in eqn.invars]
        body = _body(eqn)
        inner: list = [None] * len(eqn.outvars)
        if body is not None:
            outs, out_anc, inner, out_data = _run(walk, body[0], body[1], invals, path, in_anc,
                                                  [site_of(v) for v in eqn.invars],
                                                  (site.frames, _jitted_name(eqn)), in_data)
        else:
            outs = _bind(eqn, invals, walk.upcast)
            out_anc = _ancestry(walk, eqn, site, invals, in_anc, outs, [site_of(v) for v in eqn.invars],
                                made, any(in_data))
            out_data = [any(in_data)] * len(outs)
        walk.order += 1
        if path in walk.capture:
            walk.captured[path] = ([host(x) for x in invals], [host(x) for x in outs])
        for v, x, a, m, d in zip(eqn.outvars, outs, out_anc, inner, out_data, strict=True):
            env[v], anc[v], data[v] = x, a, d
            made[v] = m if m is not None else (site, eqn)  # a body's output: the equation inside that made it
    out_vals = [read(v) for v in jaxpr.outvars]
    out_anc = [frozenset() if isinstance(v, Literal) else anc.get(v, frozenset()) for v in jaxpr.outvars]
    return (out_vals, out_anc, [None if isinstance(v, Literal) else made.get(v) for v in jaxpr.outvars],
            [not isinstance(v, Literal) and data.get(v, False) for v in jaxpr.outvars])


def _elementwise(hosts: list[np.ndarray], shape: tuple[int, ...]) -> bool:
    """Every operand either a scalar or of the output's shape: element i of the output is made of
    element i of each operand (the elementwise primitives; a select, a comparison)."""
    return all(h.ndim == 0 or h.shape == shape for h in hosts)


def _at_each(h: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    return np.broadcast_to(h, shape) if h.ndim == 0 else h


def _ancestry(walk: _Walk, eqn, site: Site, invals: list, in_anc: list[frozenset], outs: list,
              in_sites: list[Site | None], made: dict, data: bool = True) -> list[frozenset]:
    """Each output's births: none where it is finite; its non-finite operands' where it descends from
    them; itself where it is a birth (non-finite from finite operands, a NaN from NaN-free ones).
    For an elementwise equation both are decided element by element (a ``-inf`` a mask put in one
    element neither hides an overflow in another nor is inherited by a finite result), for any
    other from the whole operands."""
    from jax._src.core import Literal

    hosts = None
    result: list[frozenset] = []
    for k, out in enumerate(outs):
        dtype = getattr(out, "dtype", None)
        if dtype is None or not inexact(dtype):
            result.append(frozenset())
            continue
        a = host(out)
        bad = ~np.isfinite(a)
        if not bad.any():
            result.append(frozenset())
            continue
        if hosts is None:
            hosts = [host(x) for x in invals]
        floats = [(h, anc) for h, anc in zip(hosts, in_anc, strict=True) if inexact(h.dtype)]
        if _elementwise([h for h, _ in floats], a.shape):
            op_bad = [~np.isfinite(_at_each(h, a.shape)) for h, _ in floats]
            op_nan = [np.isnan(_at_each(h, a.shape)) for h, _ in floats]
            any_bad = np.any(np.stack(op_bad), axis=0) if op_bad else np.zeros(a.shape, bool)
            any_nan = np.any(np.stack(op_nan), axis=0) if op_nan else np.zeros(a.shape, bool)
            born_at = (bad & ~any_bad) | (np.isnan(a) & ~any_nan)
            # a non-finite value no equation made (jnp.nan, jnp.inf written into the program) is born where
            # it first meets the step's data, unless a value with a history is non-finite there too
            constant = [ob for (_, anc), ob in zip(floats, op_bad, strict=True) if not anc]
            traced = [ob for (_, anc), ob in zip(floats, op_bad, strict=True) if anc]
            none = np.zeros(a.shape, bool)
            from_constant = bad & (np.any(np.stack(constant), axis=0) if constant and data else none) & \
                ~(np.any(np.stack(traced), axis=0) if traced else none)
            born_at = born_at | from_constant
            inherited = frozenset().union(*(anc for (h, anc), ob in zip(floats, op_bad, strict=True)
                                            if (ob & bad).any()))
        else:
            operands_bad = any(not bool(np.isfinite(h).all()) for h, _ in floats)
            operands_nan = any(bool(np.isnan(h).any()) for h, _ in floats)
            constants_only = data and operands_bad and \
                all(anc == frozenset() for h, anc in floats if not np.isfinite(h).all())
            from_constant = bad if constants_only else np.zeros(a.shape, bool)
            born_at = np.asarray(bad if not operands_bad or constants_only else
                                 (np.isnan(a) if not operands_nan else np.zeros(a.shape, bool)), bool)
            inherited = frozenset().union(*(anc for _, anc in floats))
        if not born_at.any():
            result.append(inherited)
            continue
        flat = int(np.argmax(born_at.reshape(-1)))
        index = tuple(int(i) for i in np.unravel_index(flat, a.shape)) if a.ndim else ()
        v = a[index] if a.ndim else a[()]
        v = v.real if np.iscomplexobj(v) and not np.isfinite(v.real) else (v.imag if np.iscomplexobj(v) else v)
        kind = "nan" if np.isnan(v) else ("inf" if v > 0 else "-inf")
        operands = []
        for var, h, s in zip(eqn.invars, hosts, in_sites, strict=True):
            value = _element(h, index, a.shape)
            finite = bool(np.isfinite(value)) if value is not None else \
                (bool(np.isfinite(h).all()) if inexact(h.dtype) else True)
            operands.append(Operand(finite, value, s, isinstance(var, Literal)))
        birth = Birth(walk.order, site, kind, index, int(bad.sum()), int(a.size), operands, k,
                      nan_from_inf=kind == "nan" and not all(o.finite for o in operands),
                      from_constant=bool(np.asarray(from_constant, bool).reshape(-1)[flat]))
        if birth.nan_from_inf:
            birth.masked_by = _masking_select(eqn, operands, made)
        if len(walk.births) < MAX_BIRTHS:
            walk.births[walk.order] = birth
        result.append(inherited | {walk.order})
    return result


def _masking_select(eqn, operands: list[Operand], made: dict) -> Site | None:
    """For ``0 * inf`` (or ``0 / 0``-like products) made of a zero operand and an infinite one: the
    ``select_n`` the zero came from (a ``jnp.where`` whose transpose routed a zero cotangent into a
    branch whose derivative is infinite), followed back through at most :data:`MASK_SEARCH_DEPTH`
    equations that keep zeros zero; None when there is none."""
    from jax._src.core import Literal

    if eqn.primitive.name not in ("mul", "div", "dot_general"):
        return None
    if not any(o.value is not None and not np.isfinite(o.value) for o in operands):
        return None
    for v, o in zip(eqn.invars, operands, strict=True):
        if o.value != 0.0 or isinstance(v, Literal):
            continue
        frontier, seen = [v], 0
        while frontier and seen < MASK_SEARCH_DEPTH:
            nxt = []
            for var in frontier:
                entry = made.get(var)
                if entry is None:
                    continue
                site, producer = entry
                seen += 1
                if producer.primitive.name == "select_n":
                    return site
                if producer.primitive.name in ZERO_PRESERVING:
                    nxt += [u for u in producer.invars if not isinstance(u, Literal)]
            frontier = nxt
    return None


def evaluate(closed_jaxpr, args: Sequence, checked: Sequence[bool], capture: Sequence[tuple[int, ...]] = (),
             should_stop: Callable[[], bool] = lambda: False, upcast: bool = False) -> Evaluation:
    """Evaluate ``closed_jaxpr`` on ``args`` one equation at a time (each primitive bound eagerly, on
    the device the arguments lie on); ``checked``: which flat outputs count as the step's (the new
    state, the loss). The values at the equations whose paths are in ``capture`` are kept (host
    copies). ``should_stop`` is polled between equations (a stop request): :class:`Stopped` is raised
    when it says so. ``upcast``: every floating value in float64, explicit float32 casts, constants
    and literals included (the float64 evaluation; give it float64 arguments). A non-finite argument
    is an ancestor of what it makes non-finite: :attr:`Evaluation.inputs` names the arguments the
    non-finite outputs descend from."""
    walk = _Walk(frozenset(tuple(p) for p in capture), should_stop=should_stop, upcast=upcast)
    jaxpr = closed_jaxpr.jaxpr
    seeds = [frozenset({-(i + 1)}) if inexact(getattr(x, "dtype", np.float32)) and
             not bool(np.isfinite(host(x)).all()) else frozenset() for i, x in enumerate(args)]
    outs, out_anc, _, _ = _run(walk, jaxpr, list(closed_jaxpr.consts), list(args), (), seeds, [None] * len(args))
    if len(checked) != len(outs):
        raise ValueError(f"{len(checked)} output flags for {len(outs)} outputs")
    hosts = [host(x) for x in outs]
    nonfinite = [i for i, (h, c) in enumerate(zip(hosts, checked, strict=True))
                 if c and inexact(h.dtype) and not bool(np.isfinite(h).all())]
    ancestors = frozenset().union(*(out_anc[i] for i in nonfinite)) if nonfinite else frozenset()
    births = [walk.births[o] for o in sorted(ancestors) if o in walk.births]
    inputs = sorted(-o - 1 for o in ancestors if o < 0)
    return Evaluation(hosts, nonfinite, births, walk.captured, walk.order, inputs)
