"""The same-program proof, with one compile: the step the harness calls, lowered on the arguments
it will call it with, against a plain loop's ``jax.jit`` of the user's step lowered on the
arguments a plain loop has, independently of it (a new ``jax.jit`` of a new function object that
calls the user's step, so no trace or lowering of the harness's is found in jax's caches; the
caches are not cleared, so nothing else the user's code compiled, inside its ``batch`` or ``init``,
compiles again). The two lowerings must be equal in everything that decides the executable: the
StableHLO module without debug information, and the compile arguments jax hands XLA with it
(argument and result avals with their weak types, shardings, layouts, committedness, donation,
compiler options, devices). Then the harness's lowering is compiled, once, and that executable is
the one the run calls (:class:`ProvenStep`).

A plain loop compiles its step once per input signature it meets: the signature of ``init``'s
state at step 0, and that of what the step returns from step 1 on (usually the same; a leaf whose
committedness or weak type the step changes makes a second one). :class:`ProvenStep` does the
same: one executable per signature, each proven and compiled once; the run's first feedbacks and
every restored state are held to the signature they are fed with (``runner.check_fed_back``).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from xla_harness.errors import HarnessError
from xla_harness.jaxcompat import compiled_call
from xla_harness.stress.proof.fingerprint import fingerprint

# compile_args of a jax lowering that decide the executable (where this jax records them).
_COMPILE_ARGS = ("global_in_avals", "global_out_avals", "in_shardings", "out_shardings", "in_layouts",
                 "out_layouts", "committed", "kept_var_idx", "num_devices", "tuple_args", "backend",
                 "ordered_effects", "unordered_effects", "intermediate_shardings", "mut")
# The same, held on the lowering object itself (jax's MeshComputation).
_LOWERING_ATTRS = ("_donated_invars", "_platforms", "_compiler_options_kvs", "_device_list")
_MODULE_NAME = re.compile(r"^module @[\w.$-]+", re.MULTILINE)
_ADDRESS = re.compile(r" at 0x[0-9a-f]+")


def _text(value: Any) -> str:
    """A repr without object addresses (two equal shardings built apart print alike)."""
    return _ADDRESS.sub("", repr(value))


def lowering_identity(lowered) -> dict[str, str]:
    """What decides the executable a ``jax.stages.Lowered`` compiles to: its StableHLO without
    debug information (hashed, the module's name left out) and the compile arguments, as text."""
    low = getattr(lowered, "_lowering", None)
    try:
        text = lowered.as_text(debug_info=False)
    except TypeError:  # a jax without the keyword prints no locations by default
        text = lowered.as_text()
    out = {"stablehlo_sha256": hashlib.sha256(_MODULE_NAME.sub("module @m", text).encode()).hexdigest()}
    args = getattr(low, "compile_args", {}) or {}
    for key in _COMPILE_ARGS:
        if key in args:
            out[key] = _text(args[key])
    for attr in _LOWERING_ATTRS:
        if low is not None and hasattr(low, attr):
            out[attr.lstrip("_")] = _text(getattr(low, attr))
    return out


def compare_lowerings(ours: dict[str, str], plain: dict[str, str], label: str) -> None:
    """HarnessError naming the first part of :func:`lowering_identity` in which the harness's
    lowering differs from the plain loop's (a part only one of them records counts as different)."""
    diff = [k for k in sorted(set(ours) | set(plain)) if ours.get(k) != plain.get(k)]
    if diff:
        first = diff[0]
        raise HarnessError(f"{label}: the step the harness runs differs from a plain loop's jax.jit of it "
                           f"({', '.join(diff)}: {_short(ours.get(first))} vs {_short(plain.get(first))}); "
                           "refusing to measure a different program")


def _short(text: str | None, limit: int = 160) -> str:
    if text is None:
        return "(not recorded)"
    return text if len(text) <= limit else text[:limit] + "..."


def leaf_signature(x) -> tuple:
    """What decides which program a jitted step compiles for an argument leaf: shape, dtype, weak
    type, sharding, layout (where the array reports one) and committedness."""
    layout = getattr(x, "format", None) or getattr(x, "layout", None)
    committed = getattr(x, "committed", getattr(x, "_committed", None))
    return (tuple(jnp.shape(x)), str(jnp.result_type(x)), bool(getattr(x, "weak_type", False)),
            repr(getattr(x, "sharding", None)), repr(layout), committed)


def signature(tree) -> tuple:
    """The signature of a pytree of arrays: its structure and every leaf's :func:`leaf_signature`."""
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    return (str(treedef), tuple(leaf_signature(x) for x in leaves))


_PARTS = ("shape", "dtype", "weak type", "sharding", "layout", "committedness")
_ARGS = ("params", "opt_state", "batch")


def signature_change(old: tuple | None, new: tuple) -> str:
    """In words, what differs between two :func:`signature`s of ``(params, opt_state, batch)``: the
    first leaf whose signature changed (its position among the leaves) and in what."""
    if old is None or old[0] != new[0]:
        return "arguments of another structure"
    for i, (a, b) in enumerate(zip(old[1], new[1], strict=False)):
        if a != b:
            part = next(k for k in range(len(a)) if a[k] != b[k])
            return f"leaf {i} of another {_PARTS[part]} ({a[part]} before, {b[part]} now)"
    return "arguments of another signature"


def abstract_like(tree):
    """``tree``'s arrays as the ``ShapeDtypeStruct``s a plain loop's next call would be lowered on:
    shape, dtype, weak type, and the sharding of a committed leaf (an uncommitted one has none)."""
    def one(x):
        committed = bool(getattr(x, "committed", getattr(x, "_committed", False)))
        return jax.ShapeDtypeStruct(x.shape, x.dtype, weak_type=bool(getattr(x, "weak_type", False)),
                                    sharding=x.sharding if committed else None)

    return jax.tree_util.tree_map(one, tree)


class ProvenStep:
    """The user's step as the harness calls it: for each input signature, the harness's lowering
    proven equal to an independent plain loop's (:func:`compare_lowerings`) and compiled once; a
    call runs the executable of the signature last proven (``jax.stages.Compiled``, which refuses
    arguments of another shape or dtype instead of compiling again).

    ``jitted``: the step jitted as the user jits it (what the harness lowers); ``plain``: a factory
    of a fresh plain ``jax.jit`` of the user's step (what a user writes)."""

    def __init__(self, jitted, plain: Callable[[], Any], label: str,
                 on_new_signature: Callable[[str], None] = lambda said: None) -> None:
        self.jitted = jitted
        self._plain = plain
        self.label = label
        self.on_new_signature = on_new_signature  # told, in words, when a call met another signature
        self._by_signature: dict[tuple, Any] = {}
        self._fingerprints: dict[tuple, dict] = {}
        self.current: Any = None
        self.current_signature: tuple | None = None
        self.compiles = 0
        self._run: Callable | None = None  # what calling ``current`` runs, once it has run (one frame less)

    @property
    def direct(self) -> Callable:
        """What a loop may call in place of this object, one Python frame less a step: the current
        executable's own call once it has run, else this object. A call of it that raises TypeError or
        ValueError (arguments of another signature) is to be made again through this object, which
        follows the new signature; after :meth:`follow` or such a call, take ``direct`` again."""
        return self._run if self._run is not None else self

    def __call__(self, params, opt_state, batch):
        run = self._run
        if run is None:
            if self.current is None:
                raise HarnessError("internal: the step was called before the same-program proof compiled it")
            run = self.current
        try:
            out = run(params, opt_state, batch)
        except (TypeError, ValueError):
            # An executable refuses arguments of another signature (a batch whose shape changed, say)
            # where a plain loop would compile again: so does this, proven first, and says so (an
            # event counted in ``compiles`` and told to ``on_new_signature``); anything else is the
            # step's own error.
            args = (params, opt_state, batch)
            new = signature(args)
            if new == self.current_signature:
                raise
            said = signature_change(self.current_signature, new)
            self.follow(new, args)
            self.on_new_signature(f"{self.label}: the step was called with {said}; proven against a plain loop "
                                  f"and compiled again, as jax.jit compiles again (compile {self.compiles} of the "
                                  "step)")
            return self.current(params, opt_state, batch)
        if self._run is None:
            self._run = compiled_call(self.current)
        return out

    def prove(self, args: tuple, plain_args: tuple, signature: tuple) -> dict:
        """Lower the harness's call on ``args`` and a plain loop's on ``plain_args``, refuse if they
        differ, compile the harness's lowering (once per ``signature``) and make it the current
        executable. Returns the compiled step's fingerprint."""
        if signature in self._by_signature:
            self.current, self.current_signature, self._run = self._by_signature[signature], signature, None
            return self._fingerprints[signature]
        ours = self.jitted.lower(*args)
        plain = self._plain().lower(*plain_args)  # a function jax has not traced: nothing shared
        compare_lowerings(lowering_identity(ours), lowering_identity(plain), self.label)
        compiled = ours.compile()
        self.compiles += 1
        fp = fingerprint(compiled)
        self._by_signature[signature], self._fingerprints[signature] = compiled, fp
        self.current, self.current_signature, self._run = compiled, signature, None
        return fp

    def follow(self, signature: tuple, args: tuple) -> None:
        """Make the executable of ``signature`` (the signature of ``args``, what the harness is
        about to feed) the current one: proven and compiled on first sight against a plain loop
        fed ``args``' leaves as the step returned them (:func:`abstract_like`), as a plain loop
        compiles its step again when its arguments' signature changes."""
        if signature == self.current_signature:
            return
        self.prove(args, abstract_like(args), signature)
