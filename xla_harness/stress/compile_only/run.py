"""``stress --compile-only``: compile every configuration (and variant) of a stress matrix for a
target, fingerprint and scan each, run nothing.

Each configuration's program is built for the target's devices (:func:`target_options`), its step
compiled from abstract state (:func:`xla_harness.targets.compile.compile_step`), and one record
written per configuration to ``OUT/compile.jsonl`` (each line appended whole and fsynced by
:mod:`~xla_harness.stress.results.jsonl`; ``--resume`` skips the configurations already recorded), with the
optimized HLO and the compiler's buffer assignment and its values file beside it. A full-size TPU
compile takes minutes: a killed matrix loses at most the compile in progress. The records are read
and validated by :mod:`~xla_harness.stress.compile_only.records`, held to an earlier run's by
:mod:`~xla_harness.stress.compile_only.resume`, and tabled by :mod:`~xla_harness.stress.compile_only.table`.
"""

from __future__ import annotations

import inspect
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from xla_harness.errors import HarnessError
from xla_harness.programs.interface import program_factory
from xla_harness.programs.variants import check_variants, variant_program
from xla_harness.runtime.interrupts import Interrupted
from xla_harness.stress.compile_only.records import COMPILE_RESULTS, jsonable_options, repair_tail
from xla_harness.stress.compile_only.resume import plan_compiles
from xla_harness.stress.proof.fingerprint import fingerprint
from xla_harness.stress.results.jsonl import append_line, take_lock
from xla_harness.stress.results.provenance import JAX_CONFIG_KEY, compile_provenance, jax_settings
from xla_harness.stress.spec import StressSpec
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
    from xla_harness.stress.results.store import check_writable
    from xla_harness.targets.compile import compile_step, environment
    from xla_harness.targets.devices import autotune_dump_path, target_devices

    devices = target_devices(target)
    check_variants(spec.variants, target.backend if not target.is_host else devices[0].platform)
    env = environment(target, devices)
    env.update(compile_provenance())
    run = {"program": spec.program, "versions": env["versions"], "env": env["env"], "protocol": spec.protocol,
           "autotune_sha256": _autotune_sha256()}
    configs = [(spec.label(options), options) for options in spec.configs()]
    plan_compiles(out, resume, target, run, configs)  # refused inputs create nothing
    programs = {}
    for label, options in configs:
        try:
            programs[label] = build_for_target(spec, options, devices, target)
        except Interrupted as exc:
            exc.arrived_while(f"building {label} for {target.text}")
            raise
    # the jax settings once every program is built (a jax.config.update in the program's file is in force)
    run[JAX_CONFIG_KEY] = jax_settings()
    lock = None
    results = out / COMPILE_RESULTS if out is not None else None
    if out is not None and results is not None:
        if results.exists() and not results.is_file():
            raise HarnessError(f"{results} is not a regular file")
        check_writable(out)
        lock = take_lock(results)
    try:
        todo, data, tail = plan_compiles(out, resume, target, run, configs)  # again, now that the file is ours
        if results is not None and resume:
            repair_tail(results, data, tail)
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
                exc.arrived_while(f"compiling {label} for {target.text}")
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
    compiler_options = jsonable_options(dict(program.jit_kwargs.get("compiler_options") or {}))
    # the device's compiler on the host, as triage judges it (its buffer assignment the aliasing truth)
    rules = host_rules(str(env.get("device_kind", ""))) if target.is_host else target.backend
    record = {"kind": "compile", "schema": SCHEMA, "label": label, "program": spec.program,
              "options": jsonable_options(options), **env, "devices": _device_count(compiled.compiled),
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
    append_line(results, json.dumps(record, sort_keys=True).encode())


def _target_leaf(compiled, target_leaf: str | None) -> dict | None:
    """The parameter faults are injected into (the tied matrix W of the built-in programs): its path and
    shape, from the executable's arguments (what ``triage`` reads W's scatter by)."""
    import jax

    from xla_harness.stress.device.leaves import is_floating

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
