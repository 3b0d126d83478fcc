"""Whose NaN is it: one failing step's origin, decided from the state before it and its batch.

In this order, cheapest first, and stopping at the first that decides (blame last):

``input``
    a non-finite value in the batch or in the state before the step (init, a checkpoint): the leaf
    path and its first indices; nothing is replayed or evaluated.
``race``
    the compiled step, replayed ``replays`` times from that same state and batch, is finite or
    bit-different on some replay: the failure does not replay, as a race's does not.
``program``
    every replay non-finite and bit-identical, the step's jaxpr evaluated op by op in float32 non-finite,
    and the same on the CPU in float64: the math itself makes it; the first equation that made a
    non-finite value and the user's file:line that traced it (:mod:`~xla_harness.origin.eager`).
``precision``
    eager float32 non-finite, float64 finite: float32's range; the equation that overflowed or
    underflowed and the value float64 gives there.
``compiler``
    eager float32 finite, compiled non-finite on every replay: only now is the compiler the suspect.
``unknown``
    anything the above cannot decide (no replay possible, eager evaluation raised), with the reason.

Pure of I/O: the caller passes the step function, host copies of the state and batch, and a
``replay`` function running the compiled executable once; :mod:`xla_harness.stress.explain` does that
for a stress run. The user's file:line of an equation is :mod:`~xla_harness.origin.source`'s, the
known bug classes (:func:`~xla_harness.origin.known.known_class`) :mod:`~xla_harness.origin.known`'s.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from xla_harness.names import DEFAULT_REPLAYS
from xla_harness.origin import eager
from xla_harness.origin.births import Birth, Evaluation, json_float
from xla_harness.origin.eager import Stopped
from xla_harness.origin.known import known_class
from xla_harness.origin.source import locate, where_text

CLASSES = ("input", "race", "program", "precision", "compiler", "unknown", "planted")
SUSPECTS = frozenset({"race", "compiler"})  # the classes for which variants and pass bisection run
CHECKED_AUX = ("loss", "grads", "updates")  # what the harness checks of a step's aux (besides the new state)
SHOWN_LEAVES = 4


@dataclass(frozen=True)
class Origin:
    """One failing step's origin: its class, one sentence for the user, where (file:line, primitive;
    None for ``input``/``race``/``compiler``/``unknown``), and the evidence it rests on."""

    cls: str
    summary: str
    where: dict | None = None
    evidence: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.cls not in CLASSES:
            raise ValueError(f"origin class {self.cls!r} is not one of {', '.join(CLASSES)}")

    def to_json(self) -> dict:
        return {"class": self.cls, "summary": self.summary, "where": self.where, "evidence": self.evidence}

    @classmethod
    def from_json(cls, obj: Any) -> Origin:
        """An origin as :meth:`to_json` wrote it; ValueError saying what is wrong otherwise."""
        if not isinstance(obj, dict):
            raise ValueError("an origin is a JSON object")
        kind, summary, where, evidence = obj.get("class"), obj.get("summary"), obj.get("where"), obj.get("evidence")
        if not isinstance(kind, str) or kind not in CLASSES:
            raise ValueError(f"origin class {str(kind)[:30]!r} is not one of {', '.join(CLASSES)}")
        if not isinstance(summary, str):
            raise ValueError("an origin's summary is a string")
        if where is not None and not (isinstance(where, dict) and isinstance(where.get("file"), str | None)
                                      and isinstance(where.get("line"), int | None)
                                      and not isinstance(where.get("line"), bool)):
            raise ValueError("an origin's where is null or {\"file\": ..., \"line\": ...} (each may be null: no "
                             "source line recorded)")
        if not isinstance(evidence, dict):
            raise ValueError("an origin's evidence is a JSON object")
        return cls(kind, summary, where, evidence)


@dataclass(frozen=True)
class Replayed:
    """One replay of the compiled step: whether its checked outputs were finite, and a digest of the
    bytes of each output leaf (bitwise equality across replays)."""

    finite: bool
    digests: tuple[str, ...]
    names: tuple[str, ...] = ()  # the output leaves' paths, for naming the ones that differ
    nonfinite: str = ""  # a digest of where the checked outputs are not finite ("": nowhere)


def replayed(leaves: Sequence[np.ndarray], checked: Sequence[bool], names: Sequence[str] = ()) -> Replayed:
    """What one replay gave, from its output leaves on the host (a typed key as its key data) and which
    of them the harness checks."""
    import hashlib

    finite, where = True, hashlib.sha1()
    for i, (a, c) in enumerate(zip(leaves, checked, strict=True)):
        if c and eager.inexact(a.dtype):
            bad = ~np.isfinite(a)
            if bad.any():
                finite = False
                where.update(str(i).encode() + np.packbits(bad.reshape(-1)).tobytes())
    return Replayed(finite, tuple(hashlib.sha1(np.ascontiguousarray(a).tobytes()).hexdigest() for a in leaves),
                    tuple(names), "" if finite else where.hexdigest())


# ----------------------------------------------------------------------------- leaves


def _paths(tree) -> list[tuple[str, Any]]:
    import jax

    return [(jax.tree_util.keystr(p), x) for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]]


def nonfinite_leaves(tree, prefix: str) -> list[dict]:
    """Every floating leaf of ``tree`` holding a non-finite value: its path (``prefix`` + keystr),
    the first such element's index and kind, and how many there are."""
    found = []
    for path, x in _paths(tree):
        if not eager.inexact(x.dtype if hasattr(x, "dtype") else np.asarray(x).dtype):
            continue  # integers, booleans, typed PRNG keys: never non-finite
        a = np.asarray(x)
        if bool(np.isfinite(a).all()):
            continue
        index, kind, count = eager._first_bad(a)
        found.append({"leaf": prefix + path, "index": list(index), "kind": kind, "count": count, "size": int(a.size)})
    return found


def checked_outputs(out_tree) -> list[bool]:
    """Which flat outputs of ``step(...) -> (params, opt_state, aux)`` the harness checks: every
    leaf of the new params and optimizer state, and ``aux``'s loss, grads and updates."""
    flags = []
    for path, _ in _paths_of_shapes(out_tree):
        top = path[0] if path else None
        key = getattr(path[1], "key", None) if len(path) > 1 else None
        flags.append(getattr(top, "idx", None) in (0, 1) or (getattr(top, "idx", None) == 2 and key in CHECKED_AUX))
    return flags


def _paths_of_shapes(tree) -> list[tuple[tuple, Any]]:
    import jax

    return list(jax.tree_util.tree_flatten_with_path(tree)[0])


def _element_text(leaf: dict) -> str:
    index = ", ".join(str(i) for i in leaf["index"])
    value = {"nan": "NaN", "inf": "inf", "-inf": "-inf"}[leaf["kind"]]
    at = f"{leaf['leaf']}[{index}]" if leaf["index"] else leaf["leaf"]
    more = f" ({leaf['count']} of {leaf['size']} elements non-finite)" if leaf["count"] > 1 else ""
    return f"{at} is {value}{more}"


# ----------------------------------------------------------------------------- the decision


def _value(x: float | None) -> str:
    if x is None:
        return "?"
    return f"{x:.4g}"


def _trace(step: Callable, args: tuple):
    import jax

    closed = jax.make_jaxpr(step)(*args)
    out_tree = jax.eval_shape(step, *args)
    return closed, checked_outputs(out_tree)


def _to_device(tree, dtype64: bool = False):
    """Each leaf on one device (the default one; the CPU for float64), its weak type kept (a weak
    float32 scalar times a float16 array is float16 arithmetic: promoting it would change the program);
    with ``dtype64`` every floating leaf in float64, weak where it was."""
    import jax
    import jax.numpy as jnp

    device = jax.devices("cpu")[0] if dtype64 else jax.devices()[0]

    def put(x):
        if eager.is_key_dtype(getattr(x, "dtype", None)):
            return jax.device_put(x, device)
        x = jax.device_put(x if isinstance(x, jax.Array) else jnp.asarray(np.asarray(x)), device)
        if dtype64 and eager.inexact(x.dtype) and not jnp.iscomplexobj(x):
            x = _cast(x, np.dtype(np.float64))
        return x

    return jax.tree_util.tree_map(put, tree)


def _cast(x, dtype):
    """``x`` as ``dtype``, its weak type kept."""
    try:
        from jax._src.lax import lax as lax_internal

        return lax_internal._convert_element_type(x, dtype, weak_type=bool(getattr(x, "weak_type", False)))
    except (ImportError, AttributeError, TypeError):  # pragma: no cover - a jax without the internal name
        return x.astype(dtype)


def eager_float32(step: Callable, args: tuple, capture: Sequence[tuple[int, ...]] = (),
                  should_stop: Callable[[], bool] = lambda: False) -> Evaluation:
    """The step's jaxpr on ``args`` as they are (float32), one equation at a time on the default device."""
    import jax

    dev = _to_device(args)
    closed, checked = _trace(step, dev)
    return eager.evaluate(closed, jax.tree_util.tree_leaves(dev), checked, capture, should_stop)


def eager_float64(step: Callable, args: tuple, capture: Sequence[tuple[int, ...]] = (),
                  should_stop: Callable[[], bool] = lambda: False) -> Evaluation:
    """The step traced again with every floating leaf in float64 and evaluated op by op on the CPU
    (TPUs have no float64; on a GPU the host holds it too), every floating value in float64: an
    explicit ``.astype(jnp.float32)`` in the step, its constants and literals included."""
    import jax

    from xla_harness.jaxcompat import enable_x64

    with enable_x64(), jax.default_device(jax.devices("cpu")[0]):
        dev = _to_device(args, dtype64=True)
        closed, checked = _trace(step, dev)
        return eager.evaluate(closed, jax.tree_util.tree_leaves(dev), checked, capture, should_stop, upcast=True)


def _describe(exc: BaseException) -> str:
    """``Type: message`` in one line; a message carrying a traceback (a host callback's) gives its last
    line, where the error that was raised is named."""
    lines = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip()]
    text = lines[0] if lines else ""
    if len(lines) > 1 and "Traceback" in text:
        text = f"{text.split('Traceback')[0].strip()} {lines[-1]}".strip()
    return type(exc).__name__ + (f": {text[:300]}" if text else "")


def _replays(replay: Callable[[], Replayed] | None, n: int, should_stop: Callable[[], bool],
             seconds: dict) -> list[Replayed] | Origin:
    """``n`` replays (none without ``replay``), or the origin they decide: ``race``, or ``unknown`` when
    the executable raised."""
    if replay is None or n <= 0:
        return []
    t = time.perf_counter()
    out = []
    try:
        for _ in range(n):
            if should_stop():
                raise Stopped
            out.append(replay())
    except (KeyboardInterrupt, Stopped):
        raise
    except Exception as exc:  # noqa: BLE001 - the user's executable: a reason, never a crash
        return Origin("unknown", f"the compiled step could not be replayed: {_describe(exc)}", None,
                      {"reason": "replay-failed", "error": _describe(exc)})
    seconds["replays"] = round(time.perf_counter() - t, 3)
    return _race_origin(out, seconds) or out


def origin_of(step: Callable, state_before: tuple, batch, replay: Callable[[], Replayed] | None, *,
              replays: int = DEFAULT_REPLAYS, user_folders: Sequence[str] = (),
              should_stop: Callable[[], bool] = lambda: False,
              masking: Callable[[], Any] | None = None) -> Origin:
    """The origin of one failing step (see the module docstring). ``step(params, opt_state, batch)`` is
    the user's step function (traced here for the op-by-op evaluation); ``state_before`` is
    ``(params, opt_state)`` before the step, ``batch`` its batch (host or device arrays); ``replay()``
    runs the compiled step once from fresh copies of them (None: it cannot run here, e.g. compiled
    ahead of time for a device not present). ``user_folders``: where the user's program lives, so
    the line named is theirs. ``masking``: a context manager factory turning jax's zero-cotangent
    masking on (a patched jax), used to confirm a where-gradient trap. ``should_stop`` is polled
    between replays and equations: :class:`~xla_harness.origin.eager.Stopped` when it says stop."""
    params, opt_state = state_before
    args = (params, opt_state, batch)
    seconds: dict[str, float] = {}
    bad = nonfinite_leaves(batch, "batch") + nonfinite_leaves(params, "params") + \
        nonfinite_leaves(opt_state, "opt_state")
    ev32: Evaluation | None = None
    notes: dict[str, Any] = {}
    if bad:  # a non-finite input: it is the origin if what failed descends from it
        found = _input_origin(step, args, bad, seconds, should_stop)
        if isinstance(found, Origin):
            return found
        ev32, notes["nonfinite_inputs_not_used"] = found, bad
    replayed = _replays(replay, replays, should_stop, seconds)
    if isinstance(replayed, Origin):
        return replayed
    runs = replayed
    if len({r.digests for r in runs}) > 1:  # non-finite in the same places: the finite bits differ
        notes["finite_bits_differ"] = _differing(runs)
    if ev32 is None:
        got = _eager32(step, args, should_stop, seconds, {"replays": len(runs), **notes})
        if isinstance(got, Origin):
            return got
        ev32 = got
    identical = "bit-identical" if "finite_bits_differ" not in notes else "non-finite in the same places"
    replay_text = f"{len(runs)}/{len(runs)} replays non-finite, {identical}" if runs else "not replayed"
    base = {"replays": len(runs), "nonfinite": len(runs), "equations": ev32.equations, "seconds": seconds, **notes}
    if ev32.finite:
        if not runs:
            return Origin("unknown", "eager float32 is finite, but the compiled step could not be replayed here "
                                     "to show it fails on every run (compiler or race cannot be told apart)", None,
                          {**base, "reason": "no-replay", "eager_float32": "finite"})
        return Origin("compiler", f"the compiler's: every replay of the compiled step is non-finite ({replay_text}), "
                                  "the step evaluated op by op in float32 is finite", None,
                      {**base, "eager_float32": "finite"})
    first = ev32.first
    if first is None:  # non-finite outputs with no birth among them: cannot happen with finite inputs
        return Origin("unknown", "eager float32 is non-finite but no equation could be named", None,
                      {**base, "reason": "no-birth"})
    t = time.perf_counter()
    try:
        ev64 = eager_float64(step, args, capture=[first.site.path], should_stop=should_stop)
    except (KeyboardInterrupt, Stopped):
        raise
    except Exception as exc:  # noqa: BLE001
        return Origin("unknown", f"eager float32 is non-finite, but the float64 run failed: {_describe(exc)}",
                      locate(first.site, user_folders), {**base, "reason": "float64-failed", "error": _describe(exc)})
    seconds["eager_float64"] = round(time.perf_counter() - t, 3)
    return _program_or_precision(ev32, ev64, first, base, replay_text, user_folders, masking, step, args,
                                 should_stop)


def _eager32(step: Callable, args: tuple, should_stop: Callable[[], bool], seconds: dict,
             evidence: dict) -> Evaluation | Origin:
    """The step op by op in float32, or the ``unknown`` origin saying why it could not be."""
    t = time.perf_counter()
    try:
        ev = eager_float32(step, args, should_stop=should_stop)
    except (KeyboardInterrupt, Stopped):
        raise
    except Exception as exc:  # noqa: BLE001 - a custom kernel, a primitive without an eager rule
        return Origin("unknown", f"the step could not be evaluated op by op: {_describe(exc)}", None,
                      {"reason": "eager-failed", "error": _describe(exc), "seconds": seconds, **evidence})
    seconds["eager_float32"] = round(time.perf_counter() - t, 3)
    return ev


def _input_origin(step: Callable, args: tuple, bad: list[dict], seconds: dict,
                  should_stop: Callable[[], bool]) -> Origin | Evaluation:
    """``input`` when the step's non-finite outputs descend from a non-finite input (the op-by-op
    float32 evaluation follows it; an input the step masks or never uses is not the origin: the
    evaluation is returned for the decision to go on), or when the step cannot be evaluated op by op
    to say (then the input is all that is known, and the origin says so)."""
    t = time.perf_counter()
    try:
        ev = eager_float32(step, args, should_stop=should_stop)
    except (KeyboardInterrupt, Stopped):
        raise
    except Exception as exc:  # noqa: BLE001 - a custom kernel: the input is the origin, unconfirmed
        ev, why = None, _describe(exc)
    seconds["eager_float32"] = round(time.perf_counter() - t, 3)
    if ev is not None:
        names = [p for p, _ in _paths(args)]
        prefixes = ("params", "opt_state", "batch")
        used = {prefixes[int(n[1])] + n[n.index("]") + 1:] for n in (names[i] for i in ev.inputs)}
        shown_bad = [b for b in bad if b["leaf"] in used]
        if not shown_bad:
            return ev
        bad = shown_bad
    what = "your batch" if bad[0]["leaf"].startswith("batch") else "the state before the step"
    shown = "; ".join(_element_text(b) for b in bad[:SHOWN_LEAVES])
    more = f" (and {len(bad) - SHOWN_LEAVES} more leaves)" if len(bad) > SHOWN_LEAVES else ""
    evidence: dict[str, Any] = {"leaves": bad, "replayed": 0, "seconds": seconds,
                                "descends": ev is not None}
    if ev is None:
        evidence["error"] = why
    tail = "" if ev is not None else f" (not followed op by op: {why})"
    return Origin("input", f"non-finite input in {what}: {shown}{more}{tail}", None, evidence)


def _race_origin(runs: list[Replayed], seconds: dict) -> Origin | None:
    """``race`` when some replay is finite, or the replays are non-finite in different places. Replays
    that differ only in their finite bits (a GPU's atomic scatter-add and reductions) do not make a
    deterministic NaN a race: they are recorded (``finite_bits_differ``) and the decision goes on."""
    finite = sum(r.finite for r in runs)
    distinct = len({r.digests for r in runs})
    if not finite and len({r.nonfinite for r in runs}) <= 1:
        return None
    differ = _differing(runs)
    k = len(runs) - finite
    text = (f"a race or other nondeterminism (it does not replay): from the same state and batch, {k}/{len(runs)} "
            "replays non-finite")
    if differ:
        text += f"; outputs differ bitwise in {', '.join(differ[:3])}"
        text += f" and {len(differ) - 3} more" if len(differ) > 3 else ""
    return Origin("race", text, None, {"replays": len(runs), "nonfinite": k, "distinct": distinct,
                                       "differing_leaves": differ, "seconds": seconds})


def _differing(runs: list[Replayed]) -> list[str]:
    if not runs:
        return []
    first = runs[0]
    names = first.names or tuple(f"output {i}" for i in range(len(first.digests)))
    return [names[i] for i in range(len(first.digests)) if any(r.digests[i] != first.digests[i] for r in runs[1:])]


def _at(ev: Evaluation, birth: Birth) -> dict | None:
    """float64's value where float32's birth happened (its result and operands at the birth's index),
    when the float64 program has the same equation at that path."""
    got = ev.captured.get(birth.site.path)
    if got is None:
        return None
    operands, results = got
    if birth.output >= len(results):
        return None
    out = results[birth.output]
    value = eager._element(out, birth.index, tuple(out.shape))
    return {"value": json_float(value),
            "operands": [json_float(eager._element(o, birth.index, tuple(out.shape))) for o in operands]}


def _program_or_precision(ev32: Evaluation, ev64: Evaluation, first: Birth, base: dict, replay_text: str,
                          user_folders: Sequence[str], masking, step, args, should_stop) -> Origin:
    where = locate(first.site, user_folders)
    name, fix = known_class(first, where, ev32)
    op_text = ", ".join(_value(o.value) for o in first.operands)
    made = f"{first.site.primitive}({op_text}) = {first.kind.replace('nan', 'NaN')}"
    evidence = {**base, "eager_float32": "non-finite", "first": first.to_json(),
                "eager_float64": "finite" if ev64.finite else "non-finite"}
    if name:
        evidence["known_class"], evidence["fix"] = name, fix
    masked = next((b for b in ev32.births if b.masked_by is not None), None)
    if masked is not None and masked.masked_by is not None:
        evidence["where_select"] = locate(masked.masked_by, user_folders)
        evidence["nan_at"] = {**locate(masked.site, user_folders), "birth": masked.to_json()}
        if masking is not None:
            evidence["masking_rerun"] = _masking_rerun(masking, step, args, should_stop)
    nan = ev32.first_nan
    if nan is not None and nan is not first and "nan_at" not in evidence:
        evidence["nan_at"] = {**locate(nan.site, user_folders), "birth": nan.to_json()}
    if ev64.finite:
        f64 = _at(ev64, first)
        evidence["float64_at_first"] = f64
        value = f64.get("value") if f64 else None
        should = f", where float64 gives {_value(value) if isinstance(value, float) else value}" \
            if value is not None else ""
        return Origin("precision", f"float32's range: {made} at {where_text(where)}{should}"
                                   + (f"; {fix}" if fix else "")
                                   + f" (op by op: non-finite in float32, finite in float64 on the CPU; {replay_text})",
                      where, evidence)
    if masked is not None and masked.masked_by is not None:
        text = (f"your program's own math, a jnp.where gradient trap: the where at "
                f"{where_text(evidence['where_select'])} masks a branch whose derivative is {made} at "
                f"{where_text(where)}; {fix}")
        if evidence.get("masking_rerun") == "finite":
            text += " (confirmed: finite with jax_zero_cotangent_masking on)"
    else:
        text = f"your program's own math: {made} at {where_text(where)}" + (f"; {fix}" if fix else "")
    return Origin("program", text + f" (op by op: non-finite in float32 and in float64; {replay_text})", where,
                  evidence)


def _masking_rerun(masking: Callable[[], Any], step, args, should_stop) -> str:
    """"finite"/"non-finite": the step evaluated op by op again with zero-cotangent masking on."""
    try:
        with masking():
            ev = eager_float32(step, args, should_stop=should_stop)
    except (KeyboardInterrupt, Stopped):
        raise
    except Exception as exc:  # noqa: BLE001
        return f"failed: {_describe(exc)}"
    return "finite" if ev.finite else "non-finite"


def masking_flag() -> Callable[[], Any] | None:
    """The context manager turning ``jax_zero_cotangent_masking`` on, where this jax has the option
    (the patched jax of this project's series); None on a stock jax."""
    try:
        from jax._src import config as jax_config
    except ImportError:  # pragma: no cover
        return None
    flag = getattr(jax_config, "zero_cotangent_masking", None)
    if flag is None or not callable(flag):
        return None
    return lambda: flag(True)
