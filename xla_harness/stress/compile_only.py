"""``stress --compile-only``: compile every configuration (and variant) of a stress matrix for a
target, fingerprint and scan each, run nothing.

Each configuration's program is built for the target's devices (:func:`target_options`), its step
compiled from abstract state (:func:`xla_harness.targets.compile.compile_step`), and one record
written per configuration to ``OUT/compile.jsonl`` (flushed per line; ``--resume`` skips the
configurations already recorded), with the optimized HLO and the compiler's buffer assignment
and its values file beside it. A full-size TPU compile takes minutes: a killed matrix loses at most
the compile in progress.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import math
import os
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from xla_harness.errors import HarnessError
from xla_harness.names import COMPILE_RESULTS
from xla_harness.programs.interface import program_factory
from xla_harness.programs.variants import check_variants, variant_program
from xla_harness.runtime.interrupts import Interrupted
from xla_harness.stress.fingerprint import fingerprint
from xla_harness.stress.spec import StressSpec
from xla_harness.stress.store import JAX_CONFIG_KEY, jax_settings
from xla_harness.targets.spec import Target

SCHEMA = 1


def _takes_devices(make: Callable) -> bool:
    try:
        params = inspect.signature(make).parameters
    except (TypeError, ValueError):
        return False
    return "devices" in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def target_options(options: dict, devices: list, takes_devices: bool, target: Target) -> dict:
    """The program options for a compile on ``devices``: a ``devices`` count becomes that many of the
    target's devices; a factory taking ``devices=`` and given none gets all of them on an
    ahead-of-time target (the host keeps the program's own default)."""
    out = dict(options)
    n = out.get("devices")
    if isinstance(n, bool) or (n is not None and not isinstance(n, int)):
        raise HarnessError(f"devices must be an integer count, got {n!r}")
    if n is None:
        if target.is_host or not takes_devices:
            return out
        n = len(devices)
    if not 0 < n <= len(devices):
        raise HarnessError(f"devices={n}, but {target.text} has {len(devices)} device(s)")
    if n > 1 or not target.is_host:
        if not takes_devices:
            raise HarnessError("this program's factory takes no devices=; it compiles for one device only")
        out["devices"] = list(devices[:n])
    else:
        out.pop("devices", None)  # one host device: the program's own default
    return out


@dataclass
class CompileRecord:
    label: str
    record: dict

    def line(self) -> str:
        r = self.record
        fp = r["fingerprint"]
        sc = r["scan"]
        return (f"{self.label} on {r['target']} ({r['devices']}x {r['device_kind']}{_scope(r)}): step fingerprint "
                f"{fp['id']} "
                f"({fp['instructions']} instructions, temp {fp['temp_size_in_bytes']} B, aliased "
                f"{fp['alias_size_in_bytes']} B), compiled in {r['compile_cpu_s']:.1f} s CPU; scan ({sc['backend']}): "
                f"{sc['hazard']} hazard, {sc['decisions']} scatter-fused-with-data-moving-producer, "
                f"{sc['aliased']} aliased, {sc['layout-preserving-miss']} layout-preserving-miss"
                + _compiler_alias_text(sc.get("compiler_alias") or {})
                + (f"; {sc['nondeterministic']} scatter(s) with atomics (non-deterministic)"
                   if "nondeterministic" in sc else ""))


def _scope(record: dict) -> str:
    """", 1 of the target's 8 devices" where an ahead-of-time target's step was compiled for fewer devices
    than the target has."""
    n, of = record.get("devices"), record.get("target_devices")
    if record.get("target") == "host" or not isinstance(n, int) or not isinstance(of, int) or n >= of:
        return ""  # the host runs the program's own device count, by design
    return f", {n} of the target's {of} devices"


def _compiler_alias_text(summary: dict) -> str:
    """What the compiler said it aliased, where it says so (libtpu's backend_config)."""
    if not summary.get("instructions_with_field"):
        return ""
    return (f"; compiler aliased {summary['aliased_fusions']} fusion(s), "
            f"{summary['aliased_scatter_fusions']} holding a scatter, "
            f"{summary.get('disagreements', 0)} disagreement(s) with the walk")


def _slug(label: str) -> str:
    digest = hashlib.sha256(label.encode()).hexdigest()[:8]
    return re.sub(r"[^A-Za-z0-9_.=-]+", "_", label)[:80] + "-" + digest


def host_rules(device_kind: str) -> str:
    """The alias rules of the host's compiler, from its device kind (cpu, gpu or tpu): what the compile
    record's scan and triage both judge a host compile by."""
    kind = device_kind.lower()
    return "cpu" if kind == "cpu" else "tpu" if "tpu" in kind else "gpu"


def _scan_counts(text: str, backend: str, name: str, buffer_assignment: str | None = None) -> dict:
    from xla_harness.hlo import compiler_alias
    from xla_harness.hlo.buffers import parse_buffer_assignment
    from xla_harness.hlo.nondeterminism import ASSESSED, nondeterministic_ops
    from xla_harness.hlo.parser import parse_module
    from xla_harness.hlo.scan import CLASSES, scan

    module = parse_module(text, name)
    buffers = parse_buffer_assignment(buffer_assignment, name) if buffer_assignment else None
    findings, decisions, used = scan(module, backend, buffers)
    counts = {c: sum(f.cls == c for f in findings) for c in CLASSES}
    if used in ASSESSED:  # what the target runs non-deterministically (GPU: scatters with atomics)
        counts["nondeterministic"] = len(nondeterministic_ops(module, used))
    return {"backend": used, **counts, "decisions": len(decisions),
            "compiler_alias": {**compiler_alias.summary(module),
                               "disagreements": sum(f.agreement == "disagree" for f in findings)},
            "decision_fusions": sorted({d.fusion for d in decisions}),
            "hazard_fusions": sorted({f.fusion for f in findings if f.cls == "hazard"})}


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


def _records(path: Path, data: bytes) -> tuple[list[tuple[int, dict]], bytes | None]:
    """(lineno, record) of every complete line of ``data``, and the last line when it lacks its
    newline and is not a whole record (a write in progress or one cut short); HarnessError
    ``FILE:LINE`` naming the first line that is not a compile record."""
    parts = data.split(b"\n")
    tail = parts.pop() or None
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

    return [rec for _, rec in _records(path, read_regular(path))[0]]


def _repair(path: Path, data: bytes, tail: bytes | None) -> None:
    """A last line cut short by a kill: removed (with a warning; its compile runs again); a whole last
    record lacking its newline: completed."""
    if data and tail is None and not data.endswith(b"\n"):
        with open(path, "ab") as fh:
            fh.write(b"\n")
            fh.flush()
            os.fsync(fh.fileno())
    elif tail is not None:
        with open(path, "r+b") as fh:
            fh.truncate(len(data) - len(tail))
            fh.flush()
            os.fsync(fh.fileno())
        line = data.count(b"\n") + 1
        sys.stderr.write(f"warning: {path}:{line}: removed a truncated last line (an interrupted write); its "
                         "configuration is compiled again\n")


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
    records, tail = _records(results, data)
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
    from xla_harness.stress.store import settings_difference

    if JAX_CONFIG_KEY not in rec:
        sys.stderr.write(f"warning: {results}:{n}: {rec['label']} was recorded without its jax settings (before "
                         "the harness recorded them); kept as compiled, not compiled again\n")
        return
    diff = settings_difference(rec[JAX_CONFIG_KEY], settings)
    if diff:
        raise HarnessError(f"{results}:{n}: {rec['label']} was compiled under other jax settings ({diff}); "
                           "compile into another --out")


def _plan(out: Path | None, resume: bool, target: Target, run: dict, configs: list[tuple[str, dict]]):
    """(what to compile: (label, options, stem), the file's bytes, its torn tail): a configuration whose
    record was compiled from the same options is skipped, one recorded with others refused; a module,
    buffer assignment or autotune file already where a configuration would write it is refused."""
    if out is None:
        return [(label, options, None) for label, options in configs], b"", None
    results = out / COMPILE_RESULTS
    done, data, tail = _read_done(results, resume, target, run,
                                  {label: _jsonable(options) for label, options in configs})
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


def compile_matrix(spec: StressSpec, target: Target, out: Path | None = None, resume: bool = False,
                   on_start: Callable[[str], None] | None = None) -> Iterator[CompileRecord]:
    """Compile each configuration of ``spec`` for ``target``; yield one record per configuration (and
    append it to ``out/compile.jsonl`` with the HLO, buffer assignment and values file beside it).

    With ``out``, as for stress results: one writer (a lock beside the file), every line validated, a
    torn last line repaired by ``resume``, and nothing replaced: ``resume`` skips a configuration only
    when its record was compiled from the same inputs (options, versions, the compiler's environment
    variables, protocol, autotune results) and refuses a folder whose records differ in any of them;
    a module, buffer assignment or autotune file already where a configuration would write it is
    refused. Every configuration's program is built, and all of this checked, before anything is
    created or compiled."""
    from xla_harness.stress.store import _lock, check_writable
    from xla_harness.targets.compile import compile_step, environment
    from xla_harness.targets.devices import autotune_dump_path, target_devices

    devices = target_devices(target)
    check_variants(spec.variants, target.backend if not target.is_host else devices[0].platform)
    env = environment(target, devices)
    env.update(_provenance())
    run = {"program": spec.program, "versions": env["versions"], "env": env["env"], "protocol": spec.protocol,
           "autotune_sha256": _autotune_sha256()}
    configs = [(spec.label(options), options) for options in spec.configs()]
    _plan(out, resume, target, run, configs)  # refused inputs create nothing
    programs = {}
    for label, options in configs:
        try:
            programs[label] = build_for_target(spec, options, devices, target)
        except Interrupted as exc:
            exc.where = exc.where or f"building {label} for {target.text}"
            raise
    # the jax settings once every program is built (a jax.config.update in the program's file is in force)
    run[JAX_CONFIG_KEY] = jax_settings()
    lock = None
    results = out / COMPILE_RESULTS if out is not None else None
    if out is not None and results is not None:
        if results.exists() and not results.is_file():
            raise HarnessError(f"{results} is not a regular file")
        check_writable(out)
        lock = _lock(results)
    try:
        todo, data, tail = _plan(out, resume, target, run, configs)  # again, now that the file is ours
        if results is not None and resume:
            _repair(results, data, tail)
        for label, options, stem in todo:
            if on_start:
                on_start(label)
            autotune = autotune_dump_path(devices, str(stem)) if stem is not None else None
            if autotune is not None:
                Path(autotune).parent.mkdir(parents=True, exist_ok=True)
            program = programs[label]
            try:
                compiled = compile_step(program, target, devices, program_name=spec.program, autotune_to=autotune)
            except Interrupted as exc:
                exc.where = exc.where or f"compiling {label} for {target.text}"
                raise
            record = _record(spec, label, options, program, compiled, target, env, run["autotune_sha256"])
            if out is not None and results is not None and stem is not None:
                _write(out, results, stem, compiled, record, autotune)
            yield CompileRecord(label, record)
    finally:
        if lock is not None:
            lock.close()


def _record(spec: StressSpec, label: str, options: dict, program, compiled, target: Target, env: dict,
            autotune_sha256: str | None) -> dict:
    """The compile record of one configuration."""
    fp = fingerprint(compiled.compiled)
    fp["donate_argnums"] = list(program.donate_argnums)
    # the compile's own options: the program's and its flag set's (a deterministic row ahead of time also
    # names Triton gemm fusions off), the harness's dump options left out
    compiler_options = _jsonable(dict(program.jit_kwargs.get("compiler_options") or {}))
    # the device's compiler on the host, as triage judges it (its buffer assignment the aliasing truth)
    rules = host_rules(str(env.get("device_kind", ""))) if target.is_host else target.backend
    record = {"kind": "compile", "schema": SCHEMA, "label": label, "program": spec.program,
              "options": _jsonable(options), **env, "devices": _device_count(compiled.compiled),
              "protocol": spec.protocol, "compile_cpu_s": round(compiled.cpu_seconds, 3), "fingerprint": fp,
              "scan": _scan_counts(compiled.hlo_text, rules, label, compiled.buffer_assignment)}
    record[JAX_CONFIG_KEY] = jax_settings()  # as the step was traced and compiled
    if autotune_sha256 is not None:
        record["autotune_sha256"] = autotune_sha256
    if compiler_options:
        record["compiler_options"] = compiler_options
    leaf = _target_leaf(compiled.compiled, program.target_leaf)
    if leaf is not None:
        record["target_leaf"] = leaf
    return record


def _autotune_sha256() -> str | None:
    """sha256 of the autotune results XLA_FLAGS loads into the compile (--autotune-results), or None."""
    from xla_harness.runtime.files import sha256_file
    from xla_harness.targets.devices import LOAD_AUTOTUNE_FLAG, flag_path

    path = flag_path(os.environ.get("XLA_FLAGS", ""), LOAD_AUTOTUNE_FLAG)
    if path is None:
        return None
    try:
        return sha256_file(Path(path))
    except OSError:
        return None


def _write_new(path: Path, text: str) -> None:
    """``text`` into a file that must not exist yet (a file that appeared since the check is refused)."""
    try:
        with open(path, "x", encoding="utf-8") as fh:
            fh.write(text)
    except FileExistsError:
        raise HarnessError(f"{path} appeared while compiling; refusing to replace it") from None


def _write(out: Path, results: Path, stem: Path, compiled, record: dict, autotune: str | None) -> None:
    """The HLO, buffer assignment and values file beside ``stem`` (never over a file), and the record
    appended to ``results`` (flushed and synced: a killed matrix loses at most the compile in progress)."""
    stem.parent.mkdir(parents=True, exist_ok=True)
    _write_new(Path(f"{stem}.after_optimizations.txt"), compiled.hlo_text)
    if compiled.buffer_assignment is not None:
        _write_new(Path(f"{stem}.after_optimizations-buffer-assignment.txt"), compiled.buffer_assignment)
    if compiled.buffer_values is not None:
        _write_new(Path(f"{stem}.after_optimizations-buffer-assignment-values.txt"), compiled.buffer_values)
    if compiled.live_range is not None:
        _write_new(Path(f"{stem}.after_optimizations-live-range.txt"), compiled.live_range)
    record["hlo"] = str(Path(f"{stem}.after_optimizations.txt").relative_to(out))
    if autotune is not None and Path(autotune).is_file():  # what the device's autotuner chose
        record["autotune_results"] = str(Path(autotune).relative_to(out))
    with open(results, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(record, sort_keys=True) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def _provenance() -> dict:
    """Who compiled: the harness version and commit, Python, the host's CPU count, the env vars that
    decide what XLA compiles and the jax settings that change the lowered or compiled program
    (recorded on every compile record)."""
    import platform

    from xla_harness.stress.store import ENV_VARS_RECORDED, JAX_CONFIG_KEY, harness_version, jax_settings, repo_commit

    return {"harness_version": harness_version(), "repo_commit": repo_commit(),
            "python": platform.python_version(), "host_cpus": os.cpu_count(),
            "env": {k: os.environ.get(k, "") for k in ENV_VARS_RECORDED}, JAX_CONFIG_KEY: jax_settings()}


def _target_leaf(compiled, target_leaf: str | None) -> dict | None:
    """The parameter faults are injected into (the tied matrix W of the built-in programs): its path and
    shape, from the executable's arguments (what ``triage`` reads W's scatter by)."""
    import jax

    from xla_harness.stress.leaves import is_floating

    try:
        params = compiled.args_info[0][0]
    except (AttributeError, IndexError, KeyError, TypeError):
        return None
    leaves = [(jax.tree_util.keystr(path), tuple(x.shape))
              for path, x in jax.tree_util.tree_flatten_with_path(params)[0] if is_floating(x)]
    if not leaves:
        return None
    name, shape = next(((n, s) for n, s in leaves if n == target_leaf), max(leaves, key=lambda ns: _size(ns[1])))
    out = {"name": name, "shape": list(shape)}
    try:  # the shape of one device's shard: what a sharded step's HLO holds
        flat = jax.tree_util.tree_flatten_with_path(compiled.input_shardings[0][0])[0]
        sharding = next(sh for path, sh in flat if jax.tree_util.keystr(path) == name)
        out["shard_shape"] = list(sharding.shard_shape(shape))
    except (AttributeError, IndexError, KeyError, StopIteration, TypeError, ValueError):
        pass
    return out


def _size(shape: tuple) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _device_count(compiled) -> int:
    """How many devices the executable runs on (from its input shardings)."""
    import jax

    devices: set = set()
    for sharding in jax.tree_util.tree_leaves(getattr(compiled, "input_shardings", None) or ()):
        devices |= set(getattr(sharding, "device_set", ()) or ())
    return len(devices) or 1


def _jsonable(options: dict) -> dict:
    return json.loads(json.dumps({k: v for k, v in options.items() if k != "devices"} |
                                 ({"devices": options["devices"]} if isinstance(options.get("devices"), int)
                                  else {}), default=str))


def compile_program(program: str, options: dict, target: Target):
    """One program (``--program`` and its options) compiled for ``target``: a
    :class:`~xla_harness.targets.compile.CompiledStep` (HLO text, buffer assignment and values file, CPU
    seconds)."""
    from xla_harness.targets.compile import compile_step
    from xla_harness.targets.devices import target_devices

    devices = target_devices(target)
    spec = StressSpec(program=program, program_options=tuple(sorted(options.items())))
    built = build_for_target(spec, options, devices, target)
    return compile_step(built, target, devices, program_name=program)


def build_for_target(spec: StressSpec, options: dict, devices: list, target: Target):
    """The program of one configuration of ``spec`` (its ``variant`` applied) built for ``target``'s
    ``devices`` (:func:`target_options`)."""
    make = program_factory(spec.program)
    backend = None if target.is_host else target.backend
    opts = target_options({k: v for k, v in options.items() if k != "variant"}, devices, _takes_devices(make),
                          target)
    if "variant" in options:
        program = variant_program(make, options["variant"], backend=backend, ahead_of_time=not target.is_host,
                                  **opts)
    else:
        try:
            program = make(**opts)
        except TypeError as e:  # a TrainProgram object given options
            raise HarnessError(f"--program {spec.program}: {e}") from None
    if spec.protocol == "frozen":  # as the frozen protocol runs it: the same inputs every call, nothing donated
        program = replace(program, donate_argnums=())
    return program


# ----------------------------------------------------------------------------- the table of a matrix


def load_compile_records(folders: list[Path]) -> list[dict]:
    """Every compile record of ``OUT/compile.jsonl`` in each folder (and its subfolders, one per jax
    version in a matrix), in file order; HarnessError naming a line that is not a compile record."""
    records = []
    for folder in folders:
        for path in sorted(Path(folder).rglob(COMPILE_RESULTS)):
            records.extend(read_compile_records(path))
    return records


def _versions_key(r: dict) -> str:
    return json.dumps([r.get("target"), r.get("versions", {})], sort_keys=True)


def check_compile_settings(records: list[dict]) -> None:
    """Refuse one configuration (label, target, versions) compiled under two sets of jax settings:
    two programs under one name. A record without settings (written before they were recorded)
    counts as unknown settings, different from any recorded ones."""
    from xla_harness.stress.store import JAX_CONFIG_KEY, settings_difference

    first: dict[str, dict] = {}
    for r in records:
        key = json.dumps([r.get("label"), _versions_key(r)])
        other = first.setdefault(key, r)
        diff = settings_difference(other.get(JAX_CONFIG_KEY), r.get(JAX_CONFIG_KEY))
        if diff:
            raise HarnessError(f"{r.get('label')} on {r.get('target')} was compiled under two sets of jax settings "
                               f"({diff}); report them apart, or pass --allow-mixed-specs to list both")


def _differing_settings(records: list[dict]) -> dict[str, set[str]]:
    """Per versions key: the jax settings whose values differ between records of those versions."""
    values: dict[str, dict[str, set[str]]] = {}
    for r in records:
        for k, v in (r.get("jax_config") or {}).items():
            values.setdefault(_versions_key(r), {}).setdefault(k, set()).add(json.dumps(v))
    return {vk: {k for k, vs in d.items() if len(vs) > 1} for vk, d in values.items()}


def compile_table_rows(records: list[dict]) -> list[list[str]]:
    """One row per compiled configuration: target, versions, configuration, what the compiler made
    (fingerprint, instructions, fusions libtpu aliased and those holding a scatter) and the scan.
    Where records of one jax version differ in a jax setting, the configuration names its value."""
    rows = []
    differing = _differing_settings(records)
    for r in records:
        shown = sorted(differing.get(_versions_key(r), ()))
        settings = r.get("jax_config")
        note = "" if not shown else (" {jax settings unknown}" if settings is None else
                                     " {" + ",".join(f"{k}={settings.get(k)}" for k in shown) + "}")
        versions = r.get("versions", {})
        compiler = next((f"{k} {v}" for k, v in versions.items() if k not in ("jax", "jaxlib")), "")
        alias = r["scan"].get("compiler_alias") or {}
        aliased = (f"{alias.get('aliased_fusions', 0)} ({alias.get('aliased_scatter_fusions', 0)} scatter, "
                   f"{alias.get('disagreements', 0)} disagree)" if alias.get("instructions_with_field") else "-")
        rows.append([r.get("target", "?"), f"jax {versions.get('jax', '?')}", compiler or "-",
                     str(r.get("label")) + note,
                     r["fingerprint"].get("id", "?"), str(r["fingerprint"].get("instructions", "?")), aliased,
                     str(r["scan"].get("hazard", 0)), str(r["scan"].get("decisions", 0)),
                     f"{r.get('compile_cpu_s', 0):.0f}"])
    return rows


COMPILE_TABLE_HEADER = ["target", "jax", "compiler", "configuration", "fingerprint", "instructions",
                        "compiler-aliased fusions", "hazard", "fused-producer", "compile CPU s"]
