"""Repro bundles: everything upstream needs to see a failure, in one tar.gz.

Contents: ``env.json`` (versions, device kinds, topology, XLA_*/LIBTPU_*/JAX_*/TPU_*
variables only), ``config.json``, ``hlo/`` (optimized HLO and buffer assignment of the
training step, from a dump), ``findings.json`` (the scanner on that HLO), ``stress/``
(the results and table), ``bisect.jsonl`` when given, ``repro.py`` (standalone, jax and
numpy only; the harness's module xla_harness/repro/standalone.py, copied verbatim) for the built-in
program, or, for a user's program, ``repro.py`` from xla_harness/repro/standalone_program.py with
``program/`` (the program's file, every module it imported from its folder or below it, in their
layout there (:func:`local_modules`; never the folder itself, capped at MAX_PROGRAM_FILES files and
MAX_PROGRAM_BYTES bytes), and the harness files that define the TrainProgram interface);
``expected.json`` (its output when the bundle was made, run from the bundle's folder with nothing
else on its path), ``README.md``, and ``manifest.json`` (sha256 of every other file).

This module makes a bundle (:func:`make_bundle`) and runs a repro.py (:func:`run_repro`: in its own
process group, killed whole on timeout, on SIGTERM or an interrupt of the harness, and (Linux) by the
kernel when the harness itself is killed). Checking one, ``bundle --check``, is
:mod:`xla_harness.repro.bundle_check`'s.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

from xla_harness.errors import HarnessError
from xla_harness.runtime import subproc
from xla_harness.runtime.files import sha256_file

ENV_PREFIXES = ("XLA_", "LIBTPU_", "JAX_", "TPU_")
STANDALONE = Path(__file__).with_name("standalone.py")  # the built-in's repro.py, copied verbatim
STANDALONE_PROGRAM = Path(__file__).with_name("standalone_program.py")  # a user program's repro.py
REPRO_TIMEOUT_S = 1800.0
PR_SET_PDEATHSIG = 1  # linux/prctl.h
MAX_PROGRAM_FILES = 500  # local modules of a user's program a bundle carries (program/)
MAX_PROGRAM_BYTES = 16 << 20  # and their bytes in all


def bundle_env() -> dict:
    from xla_harness.stress.results import provenance

    env = provenance.environment()
    import jax

    env["env"] = {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES)}
    env["devices"] = [{"id": d.id, "kind": d.device_kind, "process": d.process_index,
                       "coords": list(getattr(d, "coords", []) or [])} for d in jax.devices()]
    return env


def partial_path(out: Path) -> Path:
    """Where a bundle is written before it is complete (``OUT.partial``; renamed to ``OUT`` at the end)."""
    return Path(out).with_name(Path(out).name + ".partial")


def check_bisect_log(folder: Path) -> Path:
    """``folder``'s bisect.jsonl (a ``bisect-passes --out`` folder): a regular file whose first line names
    the bisection's task; HarnessError otherwise."""
    from xla_harness.runtime.files import read_regular

    src = Path(folder) / "bisect.jsonl"
    if not (src.exists() or src.is_symlink()):
        raise HarnessError(f"--bisect {folder}: no bisect.jsonl (a bisect-passes --out folder)")
    first = read_regular(src).split(b"\n", 1)[0]
    try:
        rec = json.loads(first)
    except (ValueError, RecursionError):
        rec = None
    if not (isinstance(rec, dict) and rec.get("kind") == "task"):
        raise HarnessError(f"{src}:1: not a bisection log (no task line)")
    return src


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


INTERFACE_FILES = ("xla_harness/__init__.py", "xla_harness/_early.py", "xla_harness/errors.py",
                   "xla_harness/names.py", "xla_harness/runtime/__init__.py",
                   "xla_harness/runtime/interrupts.py",
                   "xla_harness/programs/__init__.py", "xla_harness/programs/interface.py")


def copy_program_source(program: str, dest: Path) -> str:
    """Copy the program's source (and the interface it builds on) into ``dest``; return the
    --program spec repro.py loads from there."""
    import importlib

    from xla_harness.programs.interface import BUILTINS
    from xla_harness.runtime.resources import import_root

    root = import_root()  # the folder holding xla_harness/: the checkout or site-packages
    for rel in INTERFACE_FILES:
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(root / rel, dest / rel)
    if program in BUILTINS:  # a built-in may use any module of xla_harness/programs (the preset uses variants)
        for src in sorted((root / "xla_harness" / "programs").glob("*.py")):
            shutil.copy(src, dest / "xla_harness" / "programs" / src.name)
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
    for rel, path in local_modules(src, program).items():
        if rel != src.name:
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(path, dest / rel)
    return f"{src.name}:{attr}"


def _outside_the_program(path: str) -> tuple[str, ...]:
    """Folders whose modules are never the program's own, even under its folder: the harness, the
    standard library and installed packages (a venv or ~/.local under a program in a home folder)."""
    import sysconfig

    from xla_harness.runtime.resources import import_root

    roots = {os.path.abspath(import_root() / "xla_harness")}
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        with contextlib.suppress(KeyError):
            roots.add(os.path.abspath(sysconfig.get_paths()[key]))
    return tuple(r for r in roots if r.startswith(path))


def local_modules(program_file: Path, program: str = "") -> dict[str, Path]:
    """The program's local imports: the file of every module loaded (``sys.modules``) from the program
    file's folder or below it, keyed by its path relative to that folder (a package keeps its layout),
    the program file included. Not the folder itself, which may be a home folder: only what was
    imported, and never the harness, the standard library or installed packages (``site-packages``,
    ``dist-packages``). The program must have been loaded in this process (it is, when the bundle's
    step compiled or its stress rows ran here); modules it imports only later, when a step runs,
    come along once they have. More than MAX_PROGRAM_FILES files or MAX_PROGRAM_BYTES bytes in all
    is refused (HarnessError naming the largest)."""
    folder = os.path.abspath(Path(program_file).resolve().parent)
    excluded = _outside_the_program(folder)
    found: dict[str, Path] = {}
    for name, module in list(sys.modules.items()):
        file = getattr(module, "__file__", None)
        if not isinstance(file, str) or name.partition(".")[0] == "xla_harness":
            continue
        path = os.path.abspath(file)
        if not path.startswith(folder + os.sep) or path.startswith(excluded):
            continue
        rel = Path(os.path.relpath(path, folder))
        if {"site-packages", "dist-packages", "__pycache__"} & set(rel.parts) or not os.path.isfile(path):
            continue
        found[rel.as_posix()] = Path(path)
    rel_program = Path(program_file).resolve().name
    found.setdefault(rel_program, Path(program_file).resolve())
    sizes = {rel: path.stat().st_size for rel, path in found.items()}
    if len(found) > MAX_PROGRAM_FILES or sum(sizes.values()) > MAX_PROGRAM_BYTES:
        largest = ", ".join(f"{rel} ({size} bytes)" for rel, size in sorted(sizes.items(), key=lambda kv: -kv[1])[:3])
        raise HarnessError(f"--program {program}: its local modules under {folder} are {len(found)} files of "
                           f"{sum(sizes.values())} bytes, more than a bundle carries ({MAX_PROGRAM_FILES} files, "
                           f"{MAX_PROGRAM_BYTES} bytes); largest: {largest}")
    return dict(sorted(found.items()))


def make_bundle(out: Path, program: str, options: dict, seeds: tuple[int, ...], steps: int,
                dump: Path | None = None, results_dir: Path | None = None, bisect_dir: Path | None = None,
                python: str = sys.executable, target=None) -> Path:
    from xla_harness.hlo.parser import parse_file
    from xla_harness.hlo.scan import module_json, scan_module
    from xla_harness.stress.device.inject import step_keys
    from xla_harness.stress.proof.harness import call_user
    from xla_harness.stress.report import summary as report
    from xla_harness.stress.runner import initial_state, prepare, run_matrix
    from xla_harness.stress.spec import StressSpec, build

    if not str(out).endswith(".tar.gz"):
        raise HarnessError(f"--out must end in .tar.gz, got {out}")
    partial = partial_path(out)
    for path in (out, partial):
        if path.exists() or path.is_symlink():
            raise HarnessError(f"{path} already exists; a bundle never replaces a file")
    if bisect_dir is not None:
        check_bisect_log(bisect_dir)
    with sigterm_as_exit(), tempfile.TemporaryDirectory(prefix="xla-harness-bundle-") as tmp:
        root = Path(tmp) / "bundle"
        (root / "hlo").mkdir(parents=True)
        builtin = program == "tied-embedding"
        spec = StressSpec(program=program, seeds=seeds, steps=steps,
                          program_options=() if builtin else tuple(sorted(options.items())),
                          **({"modes": (options["mode"],), "remats": (options["remat"],), "dtype": options["dtype"],
                              "learning_rate": options["learning_rate"],
                              **{k: options[k] for k in ("vocab", "d_model", "layers", "heads", "seq", "batch")}}
                             if builtin else {}))
        compiled_here = None
        if dump is None:  # compile the user's step once, as the harness runs it, with a dump
            dump = Path(tmp) / "dump"
            h = compiled_here = prepare(spec, spec.configs()[0])
            state = initial_state(h, seeds[0])
            batch = call_user(spec, "batch", h.program.batch, step_keys(seeds[0], 0)[0], 0)
            # tracing runs the user's step: what it raises is the program's error, as in stress
            lowered = call_user(spec, "step", h.jitted.lower, state.params, state.opt_state, batch)
            lowered.compile(compiler_options={"xla_dump_to": str(dump), "xla_dump_hlo_as_text": True})
        hlo, ba = dump_files(Path(dump))
        shutil.copy(hlo, root / "hlo" / hlo.name)
        shutil.copy(ba, root / "hlo" / ba.name)
        mod = parse_file(hlo)
        modules = [module_json(mod, scan_module(mod))]
        if target is not None and not target.is_host:
            modules.append(_target_hlo(program, options, target, root / "hlo"))
        (root / "findings.json").write_text(json.dumps({"modules": modules}, indent=2))
        (root / "env.json").write_text(json.dumps(bundle_env(), indent=2, default=str))
        if builtin:
            model = {k: options[k] for k in ("mode", "remat", "dtype", "vocab", "d_model", "layers", "heads",
                                             "seq", "batch")}
            config = {"program": program, "model": model, "seeds": list(seeds), "steps": steps,
                      "learning_rate": options["learning_rate"]}
            repro = STANDALONE
        stress_dir = root / "stress"
        if results_dir is not None:
            # not the checkpoints, nor the states --explain kept (weights: a bundle is for sharing)
            shutil.copytree(results_dir, stress_dir, ignore=shutil.ignore_patterns("ckpt", "origins"))
        else:
            run_matrix(spec, stress_dir)
            shutil.rmtree(stress_dir / "ckpt", ignore_errors=True)
        if not builtin:  # after the program ran here: what it imported from its folder is known
            if compiled_here is None and results_dir is not None:
                build(spec, spec.configs()[0])  # neither compiled nor run here: loaded, to see its imports
            (root / "program").mkdir()
            config = {"program": copy_program_source(program, root / "program"), "options": spec.configs()[0],
                      "seeds": list(seeds), "steps": steps}
            repro = STANDALONE_PROGRAM
        (root / "config.json").write_text(json.dumps(config, indent=2))
        (stress_dir / "table.txt").write_text(report.format_table(report.load_table([stress_dir])) + "\n")
        if bisect_dir is not None:
            shutil.copy(check_bisect_log(bisect_dir), root / "bisect.jsonl")
        shutil.copy(repro, root / "repro.py")
        (root / "expected.json").write_text(run_repro(root / "repro.py", root / "config.json", python))
        (root / "README.md").write_text(
            "# Repro bundle\n\n`python repro.py` (needs jax, numpy and, for a user's program, what it imports) "
            "builds the training program of `config.json` (the built-in model, or the program in `program/`: its "
            "file and the modules it imported from its own folder, in their layout there), "
            "jits its step as a user does, and counts non-finite steps; `expected.json` is what it printed when "
            "the bundle was made, "
            "`env.json` where. `hlo/` holds the optimized HLO and buffer assignment of the step (and, in "
            "`hlo/tpu_.../` or `hlo/cuda_.../`, of the step compiled for that target), "
            "`findings.json` the scanner's view of it, `stress/` the harness's stress results, and "
            "`bisect.jsonl` (if present) the pass bisection. `xla-harness bundle --check FILE` re-runs "
            "and compares.\n")
        (root / "manifest.json").write_text(json.dumps({"sha256": manifest(root)}, indent=2, sort_keys=True))
        _write_archive(root, out, partial)
    return out


def _write_archive(root: Path, out: Path, partial: Path) -> None:
    """``root`` as ``out`` (gzipped tar), written to ``partial`` first and never over a file: either
    may appear while the bundle is made, and then it is refused, not replaced."""
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        fh = open(partial, "xb")  # noqa: SIM115 - closed by the with below
    except FileExistsError:
        raise HarnessError(f"{partial} appeared while the bundle was made; refusing to replace it") from None
    try:
        with fh, tarfile.open(fileobj=fh, mode="w:gz") as tf:
            tf.add(root, arcname="bundle")
        try:
            os.link(partial, out)  # fails rather than replace a file that appeared meanwhile
        except FileExistsError:
            raise HarnessError(f"{out} appeared while the bundle was made; refusing to replace it "
                               f"(the bundle is in {partial})") from None
    except BaseException:
        if not out.exists():
            partial.unlink(missing_ok=True)
        raise
    partial.unlink()



def _target_hlo(program: str, options: dict, target, hlo_dir: Path) -> dict:
    """The step compiled ahead of time for ``target`` (libtpu / the CUDA plugin): its optimized HLO and
    buffer assignment (and its values file) under ``hlo/<target>/``, and the scanner's view of it (returned)."""
    from xla_harness.hlo.parser import parse_module
    from xla_harness.hlo.scan import module_json, scan
    from xla_harness.stress.compile_only.run import compile_program

    opts = dict(options)
    if program == "tied-embedding":
        opts.setdefault("devices", 1)  # as many devices as the bundle's own run, not the whole topology
    compiled = compile_program(program, opts, target)
    where = hlo_dir / target.text.replace(":", "_")
    where.mkdir(parents=True, exist_ok=True)
    (where / "jit_step.after_optimizations.txt").write_text(compiled.hlo_text)
    if compiled.buffer_assignment is not None:
        (where / "jit_step.after_optimizations-buffer-assignment.txt").write_text(compiled.buffer_assignment)
    if compiled.buffer_values is not None:
        (where / "jit_step.after_optimizations-buffer-assignment-values.txt").write_text(compiled.buffer_values)
    mod = parse_module(compiled.hlo_text, f"<{target.text}>")
    findings, decisions, backend = scan(mod, target.backend)
    return {**module_json(mod, findings, decisions, backend), "target": target.text,
            "device_kind": compiled.device_kind}


def manifest(root: Path) -> dict[str, str]:
    """sha256 of every file under root but manifest.json, keyed by its path relative to root."""
    return {p.relative_to(root).as_posix(): sha256_file(p) for p in sorted(root.rglob("*"))
            if p.is_file() and p.relative_to(root).as_posix() != "manifest.json"}


# Starts a repro script in a child that the kernel SIGKILLs when the harness dies (Linux
# PR_SET_PDEATHSIG through ctypes; elsewhere the request is skipped), and with nothing prepended to
# sys.path: the script's own folder is xla_harness/repro, whose bisect.py would shadow the standard
# library's, and the working folder is the extracted bundle. argv: PARENT_PID SCRIPT ARGS...
LAUNCHER = """
import ctypes, os, runpy, sys
del sys.path[0]
try:
    ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, 9, 0, 0, 0)
except (OSError, AttributeError):
    pass
if os.getppid() != int(sys.argv[1]):
    raise SystemExit("repro.py: the harness that started it has already gone")
sys.argv = sys.argv[2:]
runpy.run_path(sys.argv[0], run_name="__main__")
""".replace("PR_SET_PDEATHSIG", str(PR_SET_PDEATHSIG))


def repro_command(python: str, script: Path, config: Path) -> list[str]:
    """The child's command line: repro.py --json --config CONFIG under LAUNCHER."""
    return [python, "-c", LAUNCHER, str(os.getpid()), str(script), "--json", "--config", str(config)]


@contextlib.contextmanager
def sigterm_as_exit() -> Iterator[None]:
    """SIGTERM raises SystemExit(143) while the block runs, so every ``finally`` and context manager
    in it (temporary folders, child process groups) cleans up; the previous handler comes back after.
    Signal handlers belong to the main thread: elsewhere the block runs unchanged."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handle(signum, frame):
        sys.stderr.write("terminated (SIGTERM)\n")
        raise SystemExit(128 + signum)

    old = signal.signal(signal.SIGTERM, handle)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def run_repro(script: Path, config: Path, python: str = sys.executable,
              timeout: float = REPRO_TIMEOUT_S) -> str:
    """Run repro.py on a config in its own process group; the whole group is killed on timeout and on
    any exception here (SIGTERM through sigterm_as_exit, an interrupt), and the child dies with us."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subproc.start(repro_command(python, script, config), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=env, cwd=config.parent)
    stdout, stderr = subproc.wait(proc, timeout, what="repro.py")
    lines = [ln for ln in stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        last = (stderr.strip().splitlines() or ["no output"])[-1]
        raise HarnessError(f"repro.py failed: {last}")
    return lines[-1] + "\n"
