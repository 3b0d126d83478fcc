"""A record's results line (:func:`dumps`): a block's own keys by ``json.dumps``, its common step
records (the five keys, each of its plain type, numbers finite: what the block loop makes for almost
every step) by :func:`plain_step_text` to the characters ``json.dumps(..., sort_keys=True)`` writes,
any other record by ``json.dumps``."""

from __future__ import annotations

import json
import math

from xla_harness.stress.results.records import Block, Record, Step, parse_record


def dumps(record: Record | dict) -> str:
    """One JSON line (without newline) for a record; dicts are validated first. The text is
    ``json.dumps(record.to_json(), sort_keys=True, allow_nan=False)``; a block's common step records
    (the five keys, nothing else) are written by :func:`plain_step_text`, in a fifth of the time, to
    the same characters (tests/stress/results/test_step_record.py holds the two to each other)."""
    if isinstance(record, dict):
        record = parse_record(record)
    if isinstance(record, Block):
        return block_text(record)
    return json.dumps(record.to_json(), sort_keys=True, allow_nan=False)


def block_text(block: Block) -> str:
    """The JSON line of a block, as ``json.dumps(block.to_json(), sort_keys=True, allow_nan=False)``."""
    whole = block.to_json(steps=False)
    after = {k: whole.pop(k) for k in [k for k in whole if k > "steps"]}  # "time" (sorted keys)
    head = json.dumps(whole, sort_keys=True, allow_nan=False)
    steps = "[" + ", ".join([_step_text(s) for s in block.steps]) + "]"
    tail = json.dumps(after, sort_keys=True, allow_nan=False)[1:] if after else "}"
    return f'{head[:-1]}, "steps": {steps}{", " if after else ""}{tail}'


def _step_text(step: Step) -> str:
    return plain_step_text(step) or json.dumps(step.to_json(), sort_keys=True, allow_nan=False)


_ENCODE_STRING = json.encoder.encode_basestring_ascii  # what json.dumps writes a string with (ensure_ascii)


def plain_step_text(s: Step) -> str | None:
    """The JSON of a common step record (the five keys, each of its plain type, numbers finite), as
    ``json.dumps(..., sort_keys=True)`` writes it; None for any other record."""
    if s.reference is not None or s.injected is not None or s.nondet or s.nondet_detail is not None:
        return None
    if type(s.step) is not int or type(s.finite) is not bool or not (s.first_bad is None or type(s.first_bad) is str):
        return None
    for x in (s.loss, s.max_abs_update):
        if x is not None and (type(x) is not float or not math.isfinite(x)):
            return None
    return (f'{{"finite": {"true" if s.finite else "false"}, '
            f'"first_bad": {"null" if s.first_bad is None else _ENCODE_STRING(s.first_bad)}, '
            f'"loss": {"null" if s.loss is None else float.__repr__(s.loss)}, '
            f'"max_abs_update": {"null" if s.max_abs_update is None else float.__repr__(s.max_abs_update)}, '
            f'"step": {int.__repr__(s.step)}}}')
