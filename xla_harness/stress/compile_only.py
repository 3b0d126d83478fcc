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
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from xla_harness.errors import HarnessError
from xla_harness.programs.interface import program_factory
from xla_harness.programs.variants import variant_program
from xla_harness.stress.fingerprint import fingerprint
from xla_harness.stress.spec import StressSpec
from xla_harness.targets.spec import Target

COMPILE_RESULTS = "compile.jsonl"
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
        return (f"{self.label} on {r['target']} ({r['devices']}x {r['device_kind']}): step fingerprint {fp['id']} "
                f"({fp['instructions']} instructions, temp {fp['temp_size_in_bytes']} B, aliased "
                f"{fp['alias_size_in_bytes']} B), compiled in {r['compile_cpu_s']:.1f} s CPU; scan ({sc['backend']}): "
                f"{sc['hazard']} hazard, {sc['decisions']} scatter-fused-with-data-moving-producer, "
                f"{sc['aliased']} aliased, {sc['layout-preserving-miss']} layout-preserving-miss"
                + _compiler_alias_text(sc.get("compiler_alias") or {}))


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


def _scan_counts(text: str, backend: str, name: str) -> dict:
    from xla_harness.hlo import compiler_alias
    from xla_harness.hlo.parser import parse_module
    from xla_harness.hlo.scan import CLASSES, scan

    module = parse_module(text, name)
    findings, decisions, used = scan(module, backend)
    counts = {c: sum(f.cls == c for f in findings) for c in CLASSES}
    return {"backend": used, **counts, "decisions": len(decisions),
            "compiler_alias": {**compiler_alias.summary(module),
                               "disagreements": sum(f.agreement == "disagree" for f in findings)},
            "decision_fusions": sorted({d.fusion for d in decisions}),
            "hazard_fusions": sorted({f.fusion for f in findings if f.cls == "hazard"})}


def read_compile_records(path: Path) -> list[dict]:
    """The records of one ``compile.jsonl``; HarnessError ``FILE:LINE`` for a line that is not one."""
    from xla_harness.files import read_regular

    records = []
    for n, line in enumerate(read_regular(path).splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            raise HarnessError(f"{path}:{n}: not a JSON line") from None
        if not isinstance(rec, dict) or rec.get("kind") != "compile" or not isinstance(rec.get("scan"), dict) \
                or not isinstance(rec.get("fingerprint"), dict):
            raise HarnessError(f"{path}:{n}: not a compile record")
        records.append(rec)
    return records


def _done_labels(path: Path, target: Target, labels: list[str], settings: dict) -> set[str]:
    """Labels already compiled for ``target`` (what --resume skips). One of ``labels`` compiled under
    other jax settings than ``settings`` is refused (its record and a new one would be two programs
    under one label); one whose record predates the settings (unknown) is kept, with a warning."""
    import sys

    from xla_harness.stress.store import JAX_CONFIG_KEY, settings_difference

    if not path.exists():
        return set()
    done = set()
    for n, rec in enumerate(read_compile_records(path), 1):
        label = str(rec.get("label"))
        if rec.get("target") != target.text:
            continue
        done.add(label)
        if label not in labels:
            continue
        if JAX_CONFIG_KEY not in rec:
            sys.stderr.write(f"warning: {path}:{n}: {label} was recorded without its jax settings (before the "
                             "harness recorded them); kept as compiled, not compiled again\n")
            continue
        diff = settings_difference(rec[JAX_CONFIG_KEY], settings)
        if diff:
            raise HarnessError(f"{path}:{n}: {label} was compiled under other jax settings ({diff}); "
                               "compile into another --out")
    return done


def compile_matrix(spec: StressSpec, target: Target, out: Path | None = None, resume: bool = False,
                   on_start: Callable[[str], None] | None = None) -> Iterator[CompileRecord]:
    """Compile each configuration of ``spec`` for ``target``; yield one record per configuration (and
    append it to ``out/compile.jsonl`` with the HLO, buffer assignment and values file beside it)."""
    from xla_harness.stress.store import jax_settings
    from xla_harness.targets.compile import compile_step, environment
    from xla_harness.targets.devices import target_devices

    devices = target_devices(target)
    results = out / COMPILE_RESULTS if out is not None else None
    if results is not None and results.exists() and not resume:
        raise HarnessError(f"{results} exists; pass --resume to add to it, or choose another --out")
    # Every configuration's program first (nothing compiles yet): a bad option is one error, before
    # any folder is made; a jax.config.update in the program's file is in force when settings are read.
    programs = [build_for_target(spec, options, devices, target) for options in spec.configs()]
    env = environment(target, devices)
    env.update(_provenance())
    labels = [spec.label(o) for o in spec.configs()]
    done = _done_labels(results, target, labels, env["jax_config"]) if results is not None and resume else set()
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
    for options, program in zip(spec.configs(), programs, strict=True):
        label = spec.label(options)
        if label in done:
            continue
        if on_start:
            on_start(label)
        compiled = compile_step(program, target, devices, program_name=spec.program)
        fp = fingerprint(compiled.compiled)
        fp["donate_argnums"] = list(program.donate_argnums)
        used = _device_count(compiled.compiled)
        rules = "auto" if target.is_host else target.backend
        record = {"kind": "compile", "schema": SCHEMA, "label": label, "program": spec.program,
                  "options": _jsonable(options), **env, "devices": used,
                  "compile_cpu_s": round(compiled.cpu_seconds, 3), "fingerprint": fp,
                  "scan": _scan_counts(compiled.hlo_text, rules, label)}
        record["jax_config"] = jax_settings()  # as the step was traced and compiled
        if out is not None and results is not None:
            stem = out / "hlo" / _slug(f"{target.text}-{label}")
            stem.parent.mkdir(parents=True, exist_ok=True)
            Path(f"{stem}.after_optimizations.txt").write_text(compiled.hlo_text)
            if compiled.buffer_assignment is not None:
                Path(f"{stem}.after_optimizations-buffer-assignment.txt").write_text(compiled.buffer_assignment)
            if compiled.buffer_values is not None:
                Path(f"{stem}.after_optimizations-buffer-assignment-values.txt").write_text(compiled.buffer_values)
            record["hlo"] = str(Path(f"{stem}.after_optimizations.txt").relative_to(out))
            with open(results, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(record, sort_keys=True) + "\n")
                fh.flush()
                os.fsync(fh.fileno())
        yield CompileRecord(label, record)


def _provenance() -> dict:
    """Who compiled: the harness version and commit, Python, the host's CPU count, the env vars that
    decide what XLA compiles and the jax settings that change the lowered or compiled program
    (recorded on every compile record)."""
    import platform

    from xla_harness.stress.store import ENV_VARS_RECORDED, JAX_CONFIG_KEY, harness_version, jax_settings, repo_commit

    return {"harness_version": harness_version(), "repo_commit": repo_commit(),
            "python": platform.python_version(), "host_cpus": os.cpu_count(),
            "env": {k: os.environ.get(k, "") for k in ENV_VARS_RECORDED}, JAX_CONFIG_KEY: jax_settings()}


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
        return variant_program(make, options["variant"], backend=backend, **opts)
    try:
        return make(**opts)
    except TypeError as e:  # a TrainProgram object given options
        raise HarnessError(f"--program {spec.program}: {e}") from None


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
