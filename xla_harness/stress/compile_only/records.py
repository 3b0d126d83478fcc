"""The records of ``stress --compile-only``: ``OUT/compile.jsonl`` read and validated line by line
(:func:`record_problem`, what every reader relies on), a torn last line repaired, and the options of a
configuration in the form a record holds them."""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable
from pathlib import Path

from xla_harness.errors import HarnessError
from xla_harness.names import COMPILE_RESULTS
from xla_harness.stress.results import jsonl


def _is_count(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _is_seconds(v) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and v >= 0


def _str_map(v) -> bool:
    return isinstance(v, dict) and all(isinstance(k, str) and isinstance(x, str) for k, x in v.items())


# What every reader of a compile record relies on: (field, its check, what it must be); a field marked
# optional may be absent (records written before it existed).
_FIELDS: tuple[tuple[str, Callable[[object], bool], str, bool], ...] = (
    ("label", lambda v: isinstance(v, str) and bool(v), "a non-empty string", False),
    ("target", lambda v: isinstance(v, str) and bool(v), "a non-empty string", False),
    ("program", lambda v: isinstance(v, str), "a string", True),
    ("options", lambda v: isinstance(v, dict), "an object", True),
    ("devices", lambda v: _is_count(v) and v != 0, "a device count", True),
    ("device_kind", lambda v: isinstance(v, str), "a string", True),
    ("compile_cpu_s", _is_seconds, "a number of seconds", False),
    ("versions", _str_map, "an object of version strings", True),
    ("env", _str_map, "an object of strings", True),
    ("protocol", lambda v: v in ("train", "frozen"), "train or frozen", True),
    ("hlo", lambda v: isinstance(v, str) and not Path(v).is_absolute() and ".." not in Path(v).parts,
     "a path inside the results folder", True),
)
_FINGERPRINT = (("id", lambda v: isinstance(v, str) and bool(v), "a string"),
                ("instructions", _is_count, "a count"))
_SCAN = (("hazard", _is_count, "a count"), ("decisions", _is_count, "a count"))
_SCAN_OPTIONAL = (("backend", lambda v: isinstance(v, str), "a string"), ("aliased", _is_count, "a count"),
                  ("layout-preserving-miss", _is_count, "a count"), ("nondeterministic", _is_count, "a count"))


def record_problem(rec: object) -> str | None:
    """What makes ``rec`` no compile record (the first field wrong), or None."""
    if not isinstance(rec, dict) or rec.get("kind") != "compile":
        return "not a compile record"
    for name, ok, what, optional in _FIELDS:
        if name not in rec:
            if optional:
                continue
            return f"no {name}"
        if not ok(rec[name]):
            return f"{name} must be {what}, got {json.dumps(rec[name])[:60]}"
    return _parts_problem(rec)


def _parts_problem(rec: dict) -> str | None:
    """What is wrong with a compile record's fingerprint or scan, or None."""
    for part, fields in (("fingerprint", _FINGERPRINT), ("scan", _SCAN)):
        sub = rec.get(part)
        if not isinstance(sub, dict):
            return f"{part} must be an object"
        for name, ok, what in fields:
            if name not in sub or not ok(sub[name]):
                return f"{part}.{name} must be {what}, got {json.dumps(sub.get(name))[:60]}"
    for name in ("fingerprint.temp_size_in_bytes", "fingerprint.alias_size_in_bytes"):
        v = rec["fingerprint"].get(name.split(".")[1], -1)
        if not (isinstance(v, int) and not isinstance(v, bool) and v >= -1):
            return f"{name} must be a byte count, got {json.dumps(v)[:60]}"
    for name, ok, what in _SCAN_OPTIONAL:
        if name in rec["scan"] and not ok(rec["scan"][name]):
            return f"scan.{name} must be {what}, got {json.dumps(rec['scan'][name])[:60]}"
    alias = rec["scan"].get("compiler_alias", {})
    if not (isinstance(alias, dict) and all(_is_count(v) for v in alias.values())):
        return "scan.compiler_alias must be an object of counts"
    return None


def parse_records(path: Path, data: bytes) -> tuple[list[tuple[int, dict]], bytes | None]:
    """(lineno, record) of every complete line of ``data``, and the last line when it lacks its
    newline and is not a whole record (a write in progress or one cut short); HarnessError
    ``FILE:LINE`` naming the first line that is not a compile record."""
    parts, tail = jsonl.split_lines(data)
    out: list[tuple[int, dict]] = []
    for n, raw in enumerate([*parts, *([tail] if tail is not None else [])], 1):
        if not raw.strip():
            continue
        problem: str | None
        try:
            rec = json.loads(raw)
        except (ValueError, RecursionError):
            rec = None
            problem = "not a JSON line"
        else:
            problem = record_problem(rec)
            if problem is not None and problem != "not a compile record":
                problem = f"not a compile record ({problem})"
        if problem is not None:
            if n == len(parts) + 1:  # the unterminated last line: not (yet) a record
                return out, tail
            raise HarnessError(f"{path}:{n}: {problem}")
        out.append((n, rec))
    return out, None


def read_compile_records(path: Path) -> list[dict]:
    """The records of one ``compile.jsonl``, every line validated; HarnessError ``FILE:LINE`` for a line
    that is not one. An unterminated last line that is not a whole record is a write in progress (or
    one a kill cut short, which --resume repairs) and is left out."""
    from xla_harness.runtime.files import read_regular

    return [rec for _, rec in parse_records(path, read_regular(path))[0]]


def repair_tail(path: Path, data: bytes, tail: bytes | None) -> None:
    """A last line cut short by a kill: removed (with a warning; its compile runs again); a whole last
    record lacking its newline: completed."""
    if data and tail is None and not data.endswith(b"\n"):
        jsonl.end_line(path)
    elif tail is not None:
        jsonl.cut_tail(path, data, tail)
        line = data.count(b"\n") + 1
        sys.stderr.write(f"warning: {path}:{line}: removed a truncated last line (an interrupted write); its "
                         "configuration is compiled again\n")



def jsonable_options(options: dict) -> dict:
    return json.loads(json.dumps({k: v for k, v in options.items() if k != "devices"} |
                                 ({"devices": options["devices"]} if isinstance(options.get("devices"), int)
                                  else {}), default=str))


def load_compile_records(folders: list[Path]) -> list[dict]:
    """Every compile record of ``OUT/compile.jsonl`` in each folder (and its subfolders, one per jax
    version in a matrix), in file order; HarnessError naming a line that is not a compile record."""
    records = []
    for folder in folders:
        for path in sorted(Path(folder).rglob(COMPILE_RESULTS)):
            records.extend(read_compile_records(path))
    return records
