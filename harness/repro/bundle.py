"""Repro bundles: everything upstream needs to see a failure, in one tar.gz.

Contents: ``env.json`` (versions, device kinds, topology, XLA_*/LIBTPU_*/JAX_*/TPU_*
variables only), ``config.json``, ``hlo/`` (optimized HLO and buffer assignment of the
training step, from a dump), ``findings.json`` (the scanner on that HLO), ``stress/``
(the results and table), ``bisect.jsonl`` when given, ``repro.py`` (standalone, jax and
numpy and what the program imports) with ``program/`` (the program's source and the harness
files that define the TrainProgram interface; repro.py imports it), ``expected.json`` (its
output when the bundle was made), ``README.md``.
``check`` re-runs repro.py and compares with expected.json.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from harness.errors import HarnessError
from harness.repro.repro_template import REPRO

ENV_PREFIXES = ("XLA_", "LIBTPU_", "JAX_", "TPU_")


def bundle_env() -> dict:
    from harness.stress import store as results

    env = results.environment()
    import jax

    env["env"] = {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES)}
    env["devices"] = [{"id": d.id, "kind": d.device_kind, "process": d.process_index,
                       "coords": list(getattr(d, "coords", []) or [])} for d in jax.devices()]
    return env


def dump_files(dump: Path) -> tuple[Path, Path]:
    """(optimized HLO, buffer assignment) of the training step in a dump folder."""
    if not dump.is_dir():
        raise HarnessError(f"dump folder {dump} does not exist")
    hlos = sorted(p for p in dump.glob("*jit_step*after_optimizations.txt"))
    if not hlos:
        raise HarnessError(f"{dump}: missing *jit_step*after_optimizations.txt (dump with "
                           "XLA_FLAGS='--xla_dump_to=DIR --xla_dump_hlo_as_text')")
    hlo = hlos[-1]
    ba = hlo.with_name(hlo.name[:-len(".txt")] + "-buffer-assignment.txt")
    if not ba.is_file():
        raise HarnessError(f"{dump}: missing {ba.name} (the buffer assignment of {hlo.name})")
    return hlo, ba


INTERFACE_FILES = ("harness/__init__.py", "harness/errors.py", "harness/programs/__init__.py",
                   "harness/programs/interface.py")


def copy_program_source(program: str, dest: Path) -> str:
    """Copy the program's source (and the interface it builds on) into ``dest``; return the
    --program spec repro.py loads from there."""
    import importlib

    from harness.programs.interface import BUILTINS

    root = Path(__file__).resolve().parents[2]
    for rel in INTERFACE_FILES:
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(root / rel, dest / rel)
    if program in BUILTINS:
        module = BUILTINS[program].split(":")[0]
        rel = Path(*module.split(".")).with_suffix(".py")
        shutil.copy(root / rel, dest / rel)
        return program
    module_part, _, attr = program.rpartition(":")
    if module_part.endswith(".py") or "/" in module_part:
        src = Path(module_part)
    else:
        try:
            src = Path(importlib.import_module(module_part).__file__ or "")
        except Exception as e:  # noqa: BLE001 - the user's module: report, never a traceback
            raise HarnessError(f"--program {program}: cannot import {module_part}: {e}") from e
        if src.name == "__init__.py":
            raise HarnessError(f"--program {program}: {module_part} is a package; bundle a FILE.py:NAME program")
    if not src.is_file():
        raise HarnessError(f"--program {program}: no such file {src}")
    shutil.copy(src, dest / src.name)
    return f"{src.name}:{attr}"


def make_bundle(out: Path, program: str, options: dict, seeds: tuple[int, ...], steps: int,
                dump: Path | None = None, results_dir: Path | None = None, bisect_dir: Path | None = None,
                python: str = sys.executable) -> Path:
    from harness.hlo.parser import parse_file
    from harness.hlo.scan import module_json, scan_module
    from harness.stress import report
    from harness.stress.runner import StressSpec, initial_state, prepare, run_matrix, step_keys

    if not str(out).endswith(".tar.gz"):
        raise HarnessError(f"--out must end in .tar.gz, got {out}")
    with tempfile.TemporaryDirectory(prefix="xla-harness-bundle-") as tmp:
        root = Path(tmp) / "bundle"
        (root / "hlo").mkdir(parents=True)
        builtin = program == "tied-embedding"
        spec = StressSpec(program=program, seeds=seeds, steps=steps,
                          program_options=() if builtin else tuple(sorted(options.items())),
                          **({"modes": (options["mode"],), "remats": (options["remat"],), "dtype": options["dtype"],
                              "learning_rate": options["learning_rate"],
                              **{k: options[k] for k in ("vocab", "d_model", "layers", "heads", "seq", "batch")}}
                             if builtin else {}))
        if dump is None:  # compile the user's step once, as the harness runs it, with a dump
            dump = Path(tmp) / "dump"
            h = prepare(spec, spec.configs()[0])
            state = initial_state(h, seeds[0])
            h.step.lower(state.params, state.opt_state, h.program.batch(step_keys(seeds[0], 0)[0], 0)).compile(
                compiler_options={"xla_dump_to": str(dump), "xla_dump_hlo_as_text": True})
        hlo, ba = dump_files(Path(dump))
        shutil.copy(hlo, root / "hlo" / hlo.name)
        shutil.copy(ba, root / "hlo" / ba.name)
        mod = parse_file(hlo)
        (root / "findings.json").write_text(json.dumps({"modules": [module_json(mod, scan_module(mod))]}, indent=2))
        (root / "env.json").write_text(json.dumps(bundle_env(), indent=2, default=str))
        (root / "program").mkdir()
        repro_spec = copy_program_source(program, root / "program")
        (root / "config.json").write_text(json.dumps({"program": repro_spec, "options": spec.configs()[0],
                                                      "seeds": list(seeds), "steps": steps}, indent=2))
        stress_dir = root / "stress"
        if results_dir is not None:
            shutil.copytree(results_dir, stress_dir, ignore=shutil.ignore_patterns("ckpt"))
        else:
            run_matrix(spec, stress_dir)
            shutil.rmtree(stress_dir / "ckpt", ignore_errors=True)
        (stress_dir / "table.txt").write_text(report.format_table(report.load_table([stress_dir])) + "\n")
        if bisect_dir is not None:
            src = Path(bisect_dir) / "bisect.jsonl"
            if not src.is_file():
                raise HarnessError(f"{bisect_dir}: missing bisect.jsonl")
            shutil.copy(src, root / "bisect.jsonl")
        (root / "repro.py").write_text(REPRO)
        (root / "expected.json").write_text(run_repro(root, python))
        (root / "README.md").write_text(
            "# Repro bundle\n\n`python repro.py` (needs jax, numpy and what the program imports) loads the "
            "training program in `program/` with the options of `config.json`, jits its step as the user does, "
            "and counts non-finite steps; `expected.json` is what it printed when the bundle was made, "
            "`env.json` where. `hlo/` holds the optimized HLO and buffer assignment of the step, "
            "`findings.json` the scanner's view of it, `stress/` the harness's stress results, and "
            "`bisect.jsonl` (if present) the pass bisection. `xla-harness bundle --check FILE` re-runs "
            "and compares.\n")
        out.parent.mkdir(parents=True, exist_ok=True)
        partial = out.with_name(out.name + ".partial")
        with tarfile.open(partial, "w:gz") as tf:
            tf.add(root, arcname="bundle")
        partial.replace(out)
    return out


def run_repro(root: Path, python: str = sys.executable, timeout: float = 1800) -> str:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    res = subprocess.run([python, str(root / "repro.py"), "--json"], capture_output=True, text=True,
                         timeout=timeout, env=env, cwd=root)
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("{")]
    if res.returncode != 0 or not lines:
        last = (res.stderr.strip().splitlines() or ["no output"])[-1]
        raise HarnessError(f"repro.py failed: {last}")
    return lines[-1] + "\n"


def check_bundle(path: Path, python: str = sys.executable) -> tuple[bool, list[str]]:
    """Re-run repro.py from the bundle; compare with expected.json. (same, lines)."""
    if not path.is_file():
        raise HarnessError(f"{path}: no such bundle")
    with tempfile.TemporaryDirectory(prefix="xla-harness-check-") as tmp:
        try:
            with tarfile.open(path) as tf:
                tf.extractall(tmp, filter="data")
        except (tarfile.TarError, OSError) as exc:
            raise HarnessError(f"{path}: not a readable bundle ({exc})") from None
        root = Path(tmp) / "bundle"
        for need in ("repro.py", "config.json", "expected.json"):
            if not (root / need).is_file():
                raise HarnessError(f"{path}: bundle lacks {need}")
        expected = json.loads((root / "expected.json").read_text())
        got = json.loads(run_repro(root, python))
    lines, same = [], True
    for seed, want in expected["seeds"].items():
        have = got["seeds"].get(seed)
        if have is None:
            lines.append(f"seed {seed}: missing from the re-run")
            same = False
            continue
        diff = max((abs(a - b) / max(1.0, abs(b)) for a, b in zip(have["losses"], want["losses"], strict=True)
                    if a is not None and b is not None), default=0.0)
        ok = have["nonfinite"] == want["nonfinite"] and diff <= 1e-5
        same &= ok
        lines.append(f"seed {seed}: non-finite {have['nonfinite']} (bundle: {want['nonfinite']}), "
                     f"max relative loss difference {diff:.2e} -> {'same' if ok else 'DIFFERENT'}")
    lines.append(f"bundle made with jax {expected['jax']} on {expected['backend']}; re-run with jax "
                 f"{got['jax']} on {got['backend']}")
    return same, lines
