"""What identifies a compiled step: its optimized HLO without debug information, the
input/output aliasing XLA chose and its buffer sizes; and the step as a user jits it by
hand, which the harness's step must match."""

from __future__ import annotations

import functools
import hashlib
import json
import re

import jax

from xla_harness.programs.interface import TrainProgram

_METADATA = re.compile(r",?\s*metadata=\{[^{}]*\}")


_DEBUG_TABLES = ("FileNames", "FunctionNames", "FileLocations", "StackFrames")


def normalise_hlo_text(text: str) -> str:
    """HLO text without what only says where it was traced from: the module name, op metadata
    and the source-location tables (they hold the caller's line, which differs per call site)."""
    first, _, rest = text.partition("\n")
    header = re.sub(r"^HloModule [^ ,]+", "HloModule m", first)
    blocks = [b for b in rest.split("\n\n") if b.strip().split("\n", 1)[0].strip() not in _DEBUG_TABLES]
    return header + "\n" + _METADATA.sub("", "\n\n".join(blocks))


def _alias_config(header: str) -> str:
    """The ``input_output_alias={...}`` of an HloModule line (balanced braces), or ''."""
    start = header.find("input_output_alias={")
    if start < 0:
        return ""
    i = depth = start + len("input_output_alias=")
    depth = 0
    for j in range(i, len(header)):
        depth += {"{": 1, "}": -1}.get(header[j], 0)
        if depth == 0:
            return header[i + 1:j].strip()
    return header[i + 1:].strip()


def fingerprint(compiled) -> dict:
    """What identifies a compiled step: its optimized HLO (normalised by :func:`normalise_hlo_text`),
    the input/output aliasing XLA chose and the sizes of its buffers."""
    text = compiled.as_text()
    body = normalise_hlo_text(text)
    out = {"hlo_sha256": hashlib.sha256(body.encode()).hexdigest(),
           "input_output_alias": _alias_config(text.partition("\n")[0]),
           "instructions": body.count(" = ")}
    try:
        mem = compiled.memory_analysis()
    except Exception:  # noqa: BLE001 - not every backend reports it
        mem = None
    for name in ("argument_size_in_bytes", "output_size_in_bytes", "alias_size_in_bytes", "temp_size_in_bytes"):
        out[name] = int(getattr(mem, name, -1)) if mem is not None else -1
    out["id"] = hashlib.sha256(json.dumps(out, sort_keys=True).encode()).hexdigest()[:16]
    return out


def plain_jit(program: TrainProgram, donate_argnums: tuple[int, ...], fresh: bool = False) -> jax.stages.Wrapped:
    """The step as a user jits it by hand: ``jax.jit(step, donate_argnums=..., **jit_kwargs)``.
    ``fresh``: of a new function object that calls the step (same name, same program), so jax's
    trace and lowering caches, keyed on the function, hold nothing for it: its lowering is made anew
    (the same-program proof's independent plain loop)."""
    step = program.step
    if fresh:
        inner = step

        @functools.wraps(inner)
        def step(*args, **kwargs):
            return inner(*args, **kwargs)

    return jax.jit(step, donate_argnums=donate_argnums, **program.jit_kwargs)
