"""The stress results schema: typed records, one validator per record (the run label of a
configuration is the program interface's :func:`~xla_harness.programs.interface.label`).

A results file (``stress.jsonl``, ``stress.p<i>.jsonl``) is JSON Lines:

* line 1, a :class:`Header`: ``{"kind": "header", "spec": {...}, "fingerprint": "...", "time", "env"}``;
  ``fingerprint`` hashes the spec's options that decide what a step computes (not the seeds,
  steps, modes or remat settings it asks for), so two runs whose steps may be pooled share it;
  the spec's ``jax_config`` (the jax settings that change the lowered or compiled program, as the
  process read them: ``provenance.jax_settings``) is one of them. A header written before the settings
  were recorded has none: its settings are unknown, its fingerprint is the one it always had, and
  it pools only with runs that lack them too;
* every later line, a :class:`Block` of consecutive steps of one (configuration, seed), each
  step a :class:`Step`, or a :class:`StepOrigin`: whose a failing step's NaN is
  (:mod:`xla_harness.origin`; ``stress --explain``), written once its configuration's seeds have run,
  after the blocks that recorded its steps.

``parse_record`` turns one decoded JSON value into a record or raises :class:`RecordError`
with a sentence saying what is wrong; readers prefix it with ``FILE:LINE:``. A JSON boolean is
never read as an integer. ``check_block_in_spec`` refuses a block that contradicts its file's
header (another program, a label that is not its config's or not one the spec asks for, a seed
or step the spec does not run).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from xla_harness.names import BUILTIN_PROGRAM
from xla_harness.origin.classify import Origin
from xla_harness.programs.interface import label

SCHEMA = 1
# Spec keys that say which trials a run asks for rather than what one trial computes.
RUN_SHAPE_KEYS = frozenset({"modes", "remats", "seeds", "steps", "block", "reference", "reference_every",
                            "checkpoint_seconds", "variants", "commit"})
# Spec keys a --resume may change: how often state is checkpointed and how often it is checked (both
# commit modes count the same steps), not what is measured.
RESUMABLE_KEYS = frozenset({"checkpoint_seconds", "commit", "block"})
MAX_INDEX = 2**62


class RecordError(ValueError):
    """One record breaks the schema; the message is one sentence without location."""


def spec_labels(spec: Mapping[str, Any]) -> list[str]:
    """The labels a stress spec asks for, in matrix order (each configuration's variants together)."""
    program = spec.get("program", BUILTIN_PROGRAM)
    if program != BUILTIN_PROGRAM:
        configs = [dict(spec.get("program_options") or {})]
    else:
        configs = [{"mode": m, "remat": r, "dtype": spec["dtype"]} for m in spec["modes"] for r in spec["remats"]]
    variants = spec.get("variants") or []
    if variants:
        configs = [{**c, "variant": v} for c in configs for v in variants]
    return [label(c, program) for c in configs]


# The built-in model's own flags (--vocab, --d-model, ...): they say nothing of any other program, whose
# headers leave them out (headers written before kept them; read back, they are dropped).
BUILTIN_MODEL_KEYS = frozenset({"dtype", "learning_rate", "vocab", "d_model", "layers", "heads", "seq", "batch"})


def own_spec(spec: Mapping[str, Any]) -> dict:
    """``spec`` without the built-in model's flags when it runs another program."""
    if spec.get("program", BUILTIN_PROGRAM) == BUILTIN_PROGRAM:
        return dict(spec)
    return {k: v for k, v in spec.items() if k not in BUILTIN_MODEL_KEYS}


def spec_fingerprint(spec: Mapping[str, Any]) -> str:
    """sha256 (16 hex digits) of the spec's options that decide what a step computes."""
    core = {k: v for k, v in spec.items() if k not in RUN_SHAPE_KEYS}
    return hashlib.sha256(json.dumps(core, sort_keys=True).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Header:
    spec: dict
    fingerprint: str
    env: dict
    time: str

    def to_json(self) -> dict:
        return {"kind": "header", "schema": SCHEMA, "spec": self.spec, "fingerprint": self.fingerprint,
                "env": self.env, "time": self.time}


@dataclass(frozen=True)
class Step:
    step: int
    finite: bool
    first_bad: str | None
    max_abs_update: float | None
    loss: float | None
    reference: dict | None = None
    injected: str | None = None  # the fault planted at this step, if any
    nondet: bool = False  # outputs (frozen; train: files of earlier versions' replays) differ from another call
    # Where a nondet step differed: per output leaf that changed, {"leaf", "elements", "max_abs", "max_ulp"}
    # (frozen: every leaf of (params, opt_state, aux); train: the loss only). None: not recorded.
    nondet_detail: tuple[dict, ...] | None = None

    @classmethod
    def of_row(cls, step: int, loss: float | None, first_bad: str | None, injected: str | None) -> Step:
        """``Step(step, first_bad is None, first_bad, None, loss, injected=injected)``, made without the
        frozen dataclass's checked assignment per field (the block loop makes one per step: this takes a
        third of the time); the fields left out are their defaults, read from the class."""
        record = object.__new__(cls)
        object.__setattr__(record, "__dict__", {"step": step, "finite": first_bad is None, "first_bad": first_bad,
                                                "max_abs_update": None, "loss": loss, "injected": injected})
        return record

    def to_json(self) -> dict:
        d: dict[str, object] = {"step": self.step, "finite": self.finite, "first_bad": self.first_bad,
             "max_abs_update": self.max_abs_update, "loss": self.loss}
        if self.reference is not None:
            d["reference"] = self.reference
        if self.injected is not None:
            d["injected"] = self.injected
        if self.nondet:
            d["nondet"] = True
        if self.nondet_detail is not None:
            d["nondet_detail"] = list(self.nondet_detail)
        return d


@dataclass(frozen=True)
class Block:
    label: str
    seed: int
    start: int
    end: int
    nonfinite: int
    silent: int
    steps: tuple[Step, ...]
    config: dict
    env: dict
    time: str
    program: str = BUILTIN_PROGRAM
    protocol: str = "train"
    fingerprint: dict | None = None  # of the compiled step (stress.fingerprint.fingerprint)
    donate_argnums: tuple[int, ...] = ()
    # How the state at the block's end was rebuilt by recomputing from a restore point (its last step's
    # new state was not finite and was rolled back): {"from": step, "steps": steps run again, "nondet":
    # [steps whose recomputed loss differed from their record], optional "nonfinite": [steps whose
    # recomputed new state was not finite], "tries": recomputes tried, "unrecoverable": true}. (Older
    # files: the state at the block's start, from ``from`` < start.)
    recompute: dict | None = None
    # TrainProgram.options: what the program says it was built with (sizes, flags); None: it said nothing
    # (or the file predates the field). ``config`` is what was asked of its factory.
    built_with: dict | None = None
    # The --commit the block ran under (a --resume may change it: both count the same steps); None: a
    # file from before the field.
    commit: str | None = None

    @property
    def injected(self) -> int:
        return sum(s.injected is not None for s in self.steps)

    def to_json(self, steps: bool = True) -> dict:
        """The record as JSON; ``steps=False``: without its steps (their own writer writes them)."""
        return {"kind": "block", "label": self.label, "seed": self.seed, "start": self.start, "end": self.end,
                "nonfinite": self.nonfinite, "silent": self.silent, "injected": self.injected,
                **({"steps": [s.to_json() for s in self.steps]} if steps else {}),
                "config": self.config, "program": self.program,
                "protocol": self.protocol, "fingerprint": self.fingerprint,
                "donate_argnums": list(self.donate_argnums), "env": self.env, "time": self.time,
                **({"recompute": self.recompute} if self.recompute is not None else {}),
                **({"built_with": self.built_with} if self.built_with is not None else {}),
                **({"commit": self.commit} if self.commit is not None else {})}


@dataclass(frozen=True)
class StepOrigin:
    """The origin of one failing step (:class:`xla_harness.origin.classify.Origin`), decided after the
    measurement from the state before the step; ``seconds``: what deciding it cost."""

    label: str
    seed: int
    step: int
    origin: Origin
    seconds: float
    time: str

    def to_json(self) -> dict:
        return {"kind": "origin", "label": self.label, "seed": self.seed, "step": self.step,
                "origin": self.origin.to_json(), "seconds": self.seconds, "time": self.time}


Record = Header | Block | StepOrigin


# ----------------------------------------------------------------------------- validation


def _need(obj: Mapping, key: str, kinds: type | tuple, what: str) -> Any:
    if key not in obj:
        raise RecordError(f"{what} lacks the key {key!r}")
    return _typed(obj[key], kinds, f"{what} {key!r}")


def _typed(value: Any, kinds: type | tuple, what: str) -> Any:
    kinds = kinds if isinstance(kinds, tuple) else (kinds,)
    is_bool = isinstance(value, bool)
    ok = (value is None and None in kinds) or any(
        k is not None and isinstance(value, k) and (k is bool or not is_bool) for k in kinds)
    if not ok:
        names = " or ".join("null" if k is None else k.__name__ for k in kinds)
        raise RecordError(f"{what} must be {names}, got {json.dumps(value)[:40]}")
    return value


def _int(obj: Mapping, key: str, what: str, lo: int = 0, hi: int = MAX_INDEX) -> int:
    v = _need(obj, key, int, what)
    if not lo <= v < hi:
        raise RecordError(f"{what} {key!r} must be in [{lo}, {hi}), got {v}")
    return v


def _number_or_null(obj: Mapping, key: str, what: str) -> float | None:
    v = _need(obj, key, (int, float, None), what)
    if v is not None and not math.isfinite(v):
        raise RecordError(f"{what} {key!r} must be a finite number or null")
    return v


def _unique_list(spec: Mapping, key: str, kinds: type | tuple) -> list:
    items = _need(spec, key, list, "spec")
    if not items:
        raise RecordError(f"spec {key!r} is empty")
    for v in items:
        _typed(v, kinds, f"an entry of spec {key!r}")
    if len({json.dumps(v) for v in items}) != len(items):
        raise RecordError(f"spec {key!r} lists a value twice")
    return items


def parse_spec(spec: Any) -> dict:
    """Validate the keys of a stress spec that readers rely on; other keys pass as they are."""
    _typed(spec, dict, "the header's 'spec'")
    _unique_list(spec, "modes", str)
    _unique_list(spec, "remats", bool)
    for s in _unique_list(spec, "seeds", int):
        if not 0 <= s < 2**31:
            raise RecordError(f"spec seed {s} is outside [0, 2**31)")
    _int(spec, "steps", "spec", lo=1)
    if spec.get("program", BUILTIN_PROGRAM) == BUILTIN_PROGRAM:
        _need(spec, "dtype", str, "spec")
    if spec.get("variants"):
        _unique_list(spec, "variants", str)
    if "jax_config" in spec:
        _need(spec, "jax_config", dict, "spec")
    return own_spec(spec)


def parse_header(obj: Mapping) -> Header:
    spec = parse_spec(obj.get("spec"))
    fp = spec_fingerprint(spec)
    # a header written before a user program's spec left the built-in model's flags out hashed them
    if "fingerprint" in obj and obj["fingerprint"] != fp and obj["fingerprint"] != spec_fingerprint(obj["spec"]):
        raise RecordError(f"header fingerprint {str(obj['fingerprint'])[:20]!r} does not match its spec ({fp})")
    if "schema" in obj and (isinstance(obj["schema"], bool) or obj["schema"] != SCHEMA):
        raise RecordError(f"results schema {obj['schema']!r} is not the one this harness reads ({SCHEMA})")
    env = _need(obj, "env", dict, "header") if "env" in obj else {}
    time = _need(obj, "time", str, "header") if "time" in obj else ""
    return Header(spec=spec, fingerprint=fp, env=env, time=time)


_PLAIN_STEP = ("step", "finite", "first_bad", "max_abs_update", "loss")


def _plain_step(obj: Any) -> Step | None:
    """The common record (exactly the five keys, each of its exact type, numbers finite), read without
    the general checks' per-key calls; None for anything else (the general path then says what is
    wrong, or reads the optional keys)."""
    if type(obj) is not dict or len(obj) != 5:
        return None
    try:
        step, finite, bad, upd, loss = (obj[k] for k in _PLAIN_STEP)
    except KeyError:
        return None
    if type(step) is not int or not 0 <= step < MAX_INDEX or type(finite) is not bool:
        return None
    if bad is not None and type(bad) is not str:
        return None
    for x in (upd, loss):
        if x is not None and (type(x) is not float or not math.isfinite(x)):
            return None
    return Step(step=step, finite=finite, first_bad=bad, max_abs_update=upd, loss=loss)


def parse_step(obj: Any, what: str) -> Step:
    plain = _plain_step(obj)
    if plain is not None:
        return plain
    _typed(obj, dict, what)
    ref = obj.get("reference")
    if ref is not None:
        _typed(ref, dict, f"{what} 'reference'")
        _need(ref, "ok", bool, f"{what} reference")
    return Step(step=_int(obj, "step", what), finite=_need(obj, "finite", bool, what),
                first_bad=_need(obj, "first_bad", (str, None), what),
                max_abs_update=_number_or_null(obj, "max_abs_update", what),
                loss=_number_or_null(obj, "loss", what), reference=ref,
                injected=_need(obj, "injected", (str, None), what) if "injected" in obj else None,
                nondet=_need(obj, "nondet", bool, what) if "nondet" in obj else False,
                nondet_detail=_nondet_detail(obj, what) if "nondet_detail" in obj else None)


def _nondet_detail(obj: Mapping, what: str) -> tuple[dict, ...]:
    rows = _need(obj, "nondet_detail", list, what)
    if not obj.get("nondet"):
        raise RecordError(f"{what} has a nondet_detail but is not marked nondet")
    for i, row in enumerate(rows):
        where = f"{what} nondet_detail {i}"
        _typed(row, dict, where)
        _need(row, "leaf", str, where)
        _int(row, "elements", where, lo=1)
        _number_or_null(row, "max_abs", where)
        _number_or_null(row, "max_ulp", where)
    return tuple(rows)


def _check_steps(steps: tuple[Step, ...], start: int, end: int) -> None:
    if end <= start:
        raise RecordError(f"block end {end} is not after its start {start}")
    if len(steps) != end - start or [s.step for s in steps] != list(range(start, end)):
        raise RecordError(f"block steps are not exactly steps {start}..{end - 1} in order")


def check_block(block: Block) -> None:
    """RecordError unless a block made in this process holds what a reader checks of it: its steps
    exactly start..end-1 in order, each a :class:`Step`, and its counts those of its steps."""
    if not all(type(s) is Step for s in block.steps):
        raise RecordError("block steps must be Step records")
    _check_steps(block.steps, block.start, block.end)
    if block.nonfinite != sum(not s.finite for s in block.steps):
        raise RecordError(f"block nonfinite {block.nonfinite} does not match its steps")
    if block.silent != sum(1 for s in block.steps if s.reference and not s.reference.get("ok")):
        raise RecordError(f"block silent {block.silent} does not match its steps")


def parse_block(obj: Mapping) -> Block:
    what = "block"
    start, end = _int(obj, "start", what), _int(obj, "end", what)
    if end <= start:
        raise RecordError(f"block end {end} is not after its start {start}")
    raw_steps = _need(obj, "steps", list, what)
    steps = tuple(parse_step(s, f"step {i} of the block") for i, s in enumerate(raw_steps))
    _check_steps(steps, start, end)
    nonfinite = _int(obj, "nonfinite", what)
    if nonfinite != sum(not s.finite for s in steps):
        raise RecordError(f"block nonfinite {nonfinite} does not match its steps")
    silent = _int(obj, "silent", what) if "silent" in obj else 0
    config = _need(obj, "config", dict, what)
    if "injected" in obj and _int(obj, "injected", what) != sum(s.injected is not None for s in steps):
        raise RecordError(f"block injected {obj['injected']} does not match its steps")
    donate = _need(obj, "donate_argnums", list, what) if "donate_argnums" in obj else []
    for d in donate:
        _typed(d, int, "an entry of block 'donate_argnums'")

    def optional(key: str, kinds, default):
        return _need(obj, key, kinds, what) if key in obj else default

    recompute = optional("recompute", (dict, None), None)
    if recompute is not None:
        _check_recompute(recompute, end)

    return Block(label=_need(obj, "label", str, what), seed=_int(obj, "seed", what, hi=2**31), start=start, end=end,
                 nonfinite=nonfinite, silent=silent, steps=steps, config=config,
                 env=optional("env", dict, {}), time=optional("time", str, ""),
                 program=optional("program", str, BUILTIN_PROGRAM), protocol=optional("protocol", str, "train"),
                 fingerprint=optional("fingerprint", (dict, None), None), donate_argnums=tuple(donate),
                 recompute=recompute, built_with=optional("built_with", (dict, None), None),
                 commit=optional("commit", (str, None), None))


def _check_recompute(recompute: Mapping, end: int) -> None:
    origin = _int(recompute, "from", "block recompute")
    _int(recompute, "steps", "block recompute")
    for key in ("nondet", "nonfinite"):
        if key == "nonfinite" and key not in recompute:
            continue
        for t in _need(recompute, key, list, "block recompute"):
            _typed(t, int, f"an entry of block recompute '{key}'")
            if not origin <= t < end:
                raise RecordError(f"block recompute marks step {t}, not one between its origin {origin} and the "
                                  f"block's end {end}")
    if "tries" in recompute:
        _int(recompute, "tries", "block recompute")
    if "unrecoverable" in recompute:
        _need(recompute, "unrecoverable", bool, "block recompute")


def check_block_in_spec(block: Block, spec: Mapping[str, Any]) -> None:
    """A block agrees with the spec of its file's header, or RecordError says where it does not."""
    program = spec.get("program", BUILTIN_PROGRAM)
    if block.program != program:
        raise RecordError(f"block program {block.program!r} is not its header's ({program!r})")
    own = label(block.config, block.program)
    if block.label != own:
        raise RecordError(f"block label {block.label!r} is not the label of its config ({own!r})")
    if block.label not in spec_labels(spec):
        raise RecordError(f"block label {block.label!r} is not a configuration its header's spec runs")
    if block.seed not in spec["seeds"]:
        raise RecordError(f"block seed {block.seed} is not one of its header's spec seeds")
    if block.end > spec["steps"]:
        raise RecordError(f"block ends at step {block.end}, past its header's spec steps ({spec['steps']})")


def parse_origin(obj: Mapping) -> StepOrigin:
    what = "origin"
    try:
        origin = Origin.from_json(obj.get("origin"))
    except ValueError as exc:
        raise RecordError(f"{what}: {exc}") from None
    seconds = _need(obj, "seconds", (int, float), what)
    if not math.isfinite(seconds) or seconds < 0:
        raise RecordError(f"{what} seconds must be a finite number >= 0")
    return StepOrigin(_need(obj, "label", str, what), _int(obj, "seed", what, hi=2**31),
                      _int(obj, "step", what), origin, float(seconds), _need(obj, "time", str, what))


def check_origin_in_spec(rec: StepOrigin, spec: Mapping[str, Any]) -> None:
    """An origin names a configuration, seed and step its file's header runs."""
    if rec.label not in spec_labels(spec):
        raise RecordError(f"origin label {rec.label!r} is not a configuration its header's spec runs")
    if rec.seed not in spec["seeds"]:
        raise RecordError(f"origin seed {rec.seed} is not one of its header's spec seeds")
    if rec.step >= spec["steps"]:
        raise RecordError(f"origin step {rec.step} is past its header's spec steps ({spec['steps']})")


def parse_record(obj: Any) -> Record:
    """A decoded JSON value as a Header, a Block or a StepOrigin; RecordError says what is wrong."""
    if not isinstance(obj, dict):
        raise RecordError(f"not a results record (a JSON {type(obj).__name__}, not an object)")
    kind = obj.get("kind")
    if kind == "header":
        return parse_header(obj)
    if kind == "block":
        return parse_block(obj)
    if kind == "origin":
        return parse_origin(obj)
    raise RecordError(f"not a results record (kind {json.dumps(kind)[:30]}, expected \"header\", \"block\" or "
                      "\"origin\")")


def _reject_constant(name: str) -> float:
    raise RecordError(f"{name} is not a JSON number")


def parse_line(raw: bytes) -> Record:
    """One line of a results file (bytes, without its newline) as a record."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RecordError(f"not UTF-8 text (byte {exc.start})") from None
    try:
        obj = json.loads(text, parse_constant=_reject_constant)
    except RecursionError:
        raise RecordError("JSON nested too deeply") from None
    except RecordError:
        raise
    except ValueError as exc:
        raise RecordError(f"not a JSON line ({str(exc).split(':')[0]})") from None
    return parse_record(obj)
