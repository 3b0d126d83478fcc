"""What ``stress --compile-only`` compiles into a folder that already holds records: the records read
back and held to the run (same options, same conditions: :data:`RUN_KEYS`, same jax settings), the
configurations already compiled skipped, and no module or buffer assignment ever replaced."""

from __future__ import annotations

import hashlib
import re
import sys
from pathlib import Path

from xla_harness.errors import HarnessError
from xla_harness.stress.compile_only.records import COMPILE_RESULTS, jsonable_options, parse_records
from xla_harness.stress.results.provenance import JAX_CONFIG_KEY
from xla_harness.targets.spec import Target


def _slug(label: str) -> str:
    digest = hashlib.sha256(label.encode()).hexdigest()[:8]
    return re.sub(r"[^A-Za-z0-9_.=-]+", "_", label)[:80] + "-" + digest


# What decides a compile besides the configuration's own options: a record of the same target that
# differs in any of these was compiled under other conditions.
RUN_KEYS = ("program", "versions", "env", "protocol", "autotune_sha256")


def _inputs(rec: dict) -> dict:
    """What decided a record's compile (defaults for records written before a key existed)."""
    return {"program": rec.get("program"), "options": rec.get("options", {}), "versions": rec.get("versions", {}),
            "env": rec.get("env", {}), "protocol": rec.get("protocol", "train"),
            "autotune_sha256": rec.get("autotune_sha256")}


def _first_difference(old: dict, new: dict, keys) -> str | None:
    for k in keys:
        a, b = old.get(k), new.get(k)
        if a == b:
            continue
        if isinstance(a, dict) and isinstance(b, dict):
            sub = next(f"{k}.{x}" for x in sorted(set(a) | set(b), key=str) if a.get(x) != b.get(x))
            x = sub.split(".", 1)[1]
            return f"{sub}={a.get(x)!r}, now {b.get(x)!r}"
        return f"{k}={a!r}, now {b!r}"
    return None


def _stem_files(stem: Path) -> list[Path]:
    return [Path(f"{stem}{suffix}") for suffix in (".after_optimizations.txt",
                                                  ".after_optimizations-buffer-assignment.txt",
                                                  ".after_optimizations-buffer-assignment-values.txt",
                                                  ".after_optimizations-live-range.txt", ".autotune.txt")]


def _read_done(results: Path, resume: bool, target: Target, run: dict,
               ours: dict[str, dict]) -> tuple[dict[str, dict], bytes, bytes | None]:
    """The records of ``target`` in ``results`` by label (and the file's bytes and torn tail). HarnessError
    for a file of another run (without --resume), a line that is not a record, a record of one of
    ``ours`` (label -> options) compiled with other options, or records of ``target`` compiled under
    other conditions (:data:`RUN_KEYS`); the options are compared first (they are what a user changed:
    --devices also changes the host's XLA_FLAGS)."""
    from xla_harness.runtime.files import read_regular

    if not results.exists() and not results.is_symlink():
        return {}, b"", None
    data = read_regular(results)
    if data.strip() and not resume:
        raise HarnessError(f"{results} exists; pass --resume to add to it, or choose another --out")
    records, tail = parse_records(results, data)
    done: dict[str, dict] = {}
    for n, rec in records:
        if rec["target"] != target.text:
            continue
        if rec["label"] in ours:
            diff = _first_difference({"options": rec.get("options", {})}, {"options": ours[rec["label"]]},
                                     ("options",))
            if diff:
                raise HarnessError(f"{results}:{n}: {rec['label']} was compiled with other options ({diff}); use a "
                                   "new --out or the same options")
        diff = _first_difference(_inputs(rec), run, RUN_KEYS)
        if diff:
            raise HarnessError(f"{results}:{n}: compiled under other conditions ({diff}); use a new --out or the "
                               "same settings")
        if rec["label"] in ours and JAX_CONFIG_KEY in run:
            _check_settings(results, n, rec, run[JAX_CONFIG_KEY])
        done[rec["label"]] = {**rec, "_line": n}
    return done, data, tail


def _check_settings(results: Path, n: int, rec: dict, settings: dict) -> None:
    """A record of one of the run's labels compiled under other jax settings is refused (its record and a
    new one would be two programs under one label); one written before the settings were recorded is
    kept as compiled, with a warning."""
    from xla_harness.stress.results.provenance import settings_difference

    if JAX_CONFIG_KEY not in rec:
        sys.stderr.write(f"warning: {results}:{n}: {rec['label']} was recorded without its jax settings (before "
                         "the harness recorded them); kept as compiled, not compiled again\n")
        return
    diff = settings_difference(rec[JAX_CONFIG_KEY], settings)
    if diff:
        raise HarnessError(f"{results}:{n}: {rec['label']} was compiled under other jax settings ({diff}); "
                           "compile into another --out")


def plan_compiles(out: Path | None, resume: bool, target: Target, run: dict, configs: list[tuple[str, dict]]):
    """(what to compile: (label, options, stem), the file's bytes, its torn tail): a configuration whose
    record was compiled from the same options is skipped, one recorded with others refused; a module,
    buffer assignment or autotune file already where a configuration would write it is refused."""
    if out is None:
        return [(label, options, None) for label, options in configs], b"", None
    results = out / COMPILE_RESULTS
    done, data, tail = _read_done(results, resume, target, run,
                                  {label: jsonable_options(options) for label, options in configs})
    todo = []
    for label, options in configs:
        if label in done:
            continue
        stem = out / "hlo" / _slug(f"{target.text}-{label}")
        there = [f for f in _stem_files(stem) if f.exists() or f.is_symlink()]
        if there:
            raise HarnessError(f"{there[0]} already exists and {results} has no record of it; refusing to "
                               "replace it (move it away, or choose another --out)")
        todo.append((label, options, stem))
    return todo, data, tail
