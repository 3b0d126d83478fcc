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

``check`` never executes code from the archive unless told to. It extracts with caps on
members and bytes (regular files and folders under ``bundle/`` only), verifies the manifest,
compares the bundled repro.py with the harness's own copy by sha256, recomputes the findings
from the bundled HLO and the table from the bundled stress rows, validates config.json, and
runs the harness's own repro.py on that config (in its own process group, killed whole on
timeout), comparing with expected.json. A user's program is code from the archive: it is
re-run only with ``run_program=True`` (``--run-program``), and only the bundled source in
``program/`` (config.json may name a built-in or FILE.py:NAME inside program/, nothing else). A
re-run is bounded by the bundle's own recorded work (steps x seeds of its one config) against
``max_steps``; its child is killed with its process group on timeout, on SIGTERM or an interrupt
of the harness, and (Linux) by the kernel when the harness itself is killed.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from xla_harness import subproc
from xla_harness.errors import HarnessError
from xla_harness.files import sha256_file

ENV_PREFIXES = ("XLA_", "LIBTPU_", "JAX_", "TPU_")
STANDALONE = Path(__file__).with_name("standalone.py")  # the built-in's repro.py, copied verbatim
STANDALONE_PROGRAM = Path(__file__).with_name("standalone_program.py")  # a user program's repro.py
MAX_MEMBERS = 10_000
MAX_BYTES = 1 << 30  # extracted bytes a bundle may hold (HLO dumps of big models run to hundreds of MB)
REPRO_TIMEOUT_S = 1800.0
MAX_CHECK_STEPS = 10_000  # steps x seeds a --check re-run may take unless raised with --max-steps
PR_SET_PDEATHSIG = 1  # linux/prctl.h
MAX_PROGRAM_FILES = 500  # local modules of a user's program a bundle carries (program/)
MAX_PROGRAM_BYTES = 16 << 20  # and their bytes in all


def bundle_env() -> dict:
    from xla_harness.stress import store as results

    env = results.environment()
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
    from xla_harness.files import read_regular

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
                   "xla_harness/interrupts.py",
                   "xla_harness/programs/__init__.py", "xla_harness/programs/interface.py")


def copy_program_source(program: str, dest: Path) -> str:
    """Copy the program's source (and the interface it builds on) into ``dest``; return the
    --program spec repro.py loads from there."""
    import importlib

    from xla_harness.programs.interface import BUILTINS
    from xla_harness.resources import import_root

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

    from xla_harness.resources import import_root

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
    from xla_harness.stress import report
    from xla_harness.stress.harness import call_user
    from xla_harness.stress.inject import step_keys
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
    from xla_harness.stress.compile_only import compile_program

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


def safe_extract(path: Path, dest: Path, max_members: int = MAX_MEMBERS, max_bytes: int = MAX_BYTES) -> Path:
    """Extract a bundle: only regular files and folders under bundle/, capped in count and bytes."""
    total = 0
    try:
        with tarfile.open(path, "r:gz") as tf:
            for count, member in enumerate(tf, start=1):
                if count > max_members:
                    raise HarnessError(f"{path}: more than {max_members} members; not a bundle of ours")
                name = member.name
                parts = Path(name).parts
                if not parts or parts[0] != "bundle" or ".." in parts or Path(name).is_absolute():
                    raise HarnessError(f"{path}: member {name!r} lies outside bundle/")
                if not (member.isfile() or member.isdir()):
                    raise HarnessError(f"{path}: member {name!r} is not a regular file or folder")
                total += member.size
                if total > max_bytes:
                    raise HarnessError(f"{path}: more than {max_bytes} bytes when extracted; refusing")
                tf.extract(member, dest, filter="data")
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise HarnessError(f"{path}: not a readable bundle ({exc})") from None
    root = dest / "bundle"
    if not root.is_dir():
        raise HarnessError(f"{path}: no bundle/ folder")
    return root


@dataclass
class CheckReport:
    same: bool = True
    lines: list[str] = field(default_factory=list)

    def add(self, ok: bool, line: str) -> None:
        self.same &= ok
        self.lines.append(line)


def _read_json(root: Path, name: str, path: Path):
    try:
        return json.loads((root / name).read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise HarnessError(f"{path}: {name} is not JSON ({exc})") from None


def check_manifest(root: Path, path: Path, report: CheckReport) -> None:
    listed = _read_json(root, "manifest.json", path).get("sha256")
    if not isinstance(listed, dict):
        raise HarnessError(f"{path}: manifest.json has no sha256 table")
    have = manifest(root)
    changed = sorted(n for n in listed.keys() & have.keys() if listed[n] != have[n])
    missing, extra = sorted(listed.keys() - have.keys()), sorted(have.keys() - listed.keys())
    for label, names in (("changed", changed), ("missing", missing), ("not in the manifest", extra)):
        for n in names:
            report.add(False, f"manifest: {n} {label}")
    if not (changed or missing or extra):
        report.add(True, f"manifest: {len(have)} files, sha256 all match")


def _validate_run_shape(cfg: dict, path: Path) -> None:
    seeds, steps = cfg.get("seeds"), cfg.get("steps")
    if (not isinstance(seeds, list) or not seeds or len(seeds) > 1000
            or not all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x < 2**32 for x in seeds)):
        raise HarnessError(f"{path}: config.json seeds must be 1..1000 integers in [0, 2**32)")
    if not isinstance(steps, int) or isinstance(steps, bool) or not 0 < steps <= 1_000_000:
        raise HarnessError(f"{path}: config.json steps must be an integer in 1..1000000")


def check_work(cfg: dict, path: Path, max_steps: int) -> None:
    """A re-run is bounded by the bundle's own recorded cost: steps x seeds of its one config."""
    work = cfg["steps"] * len(cfg["seeds"])
    if work > max_steps:
        raise HarnessError(f"{path}: re-running this bundle takes {work} steps ({cfg['steps']} steps x "
                           f"{len(cfg['seeds'])} seeds x 1 config), more than --max-steps {max_steps}; "
                           "pass a larger --max-steps to run it")


def bundled_program_file(prog: str, path: Path) -> str:
    """The file under program/ that a program bundle's config.json names: a built-in's module (bundled
    under program/xla_harness/programs) or FILE.py of FILE.py:NAME. Anything else (a module to import
    from the machine, a path) is refused: a bundle runs only its own source."""
    from xla_harness.programs.interface import BUILTINS

    if prog in BUILTINS:
        return BUILTINS[prog].partition(":")[0].replace(".", "/") + ".py"
    file, sep, attr = prog.partition(":")
    if sep and file.endswith(".py") and len(file) > 3 and file == Path(file).name and "\\" not in file \
            and attr.isidentifier():
        return file
    raise HarnessError(f"{path}: config.json program {prog!r} is not the bundled program (a built-in, or "
                       "FILE.py:NAME with FILE.py in program/); a bundle runs nothing else")


def is_program_bundle(cfg) -> bool:
    """A bundle of a user's program (config.json names it and its options) rather than the built-in."""
    return isinstance(cfg, dict) and "options" in cfg and cfg.get("program") != "tied-embedding"


def validate_config(cfg, path: Path, root: Path | None = None):
    """config.json as the harness writes it; the built-in model through ModelConfig's own checks. A
    program bundle's program must be the one bundled (under ``root``/program when root is given)."""
    from xla_harness.programs.tied_embedding import ModelConfig

    if is_program_bundle(cfg):
        prog = cfg.get("program")
        if (not isinstance(prog, str) or not isinstance(cfg.get("options"), dict)
                or not all(isinstance(k, str) for k in cfg["options"])):
            raise HarnessError(f"{path}: config.json needs a program name and an options table")
        rel = bundled_program_file(prog, path)
        if root is not None and not (root / "program" / rel).is_file():
            raise HarnessError(f"{path}: config.json program {prog!r} needs program/{rel}, which the bundle lacks")
        _validate_run_shape(cfg, path)
        return
    if not isinstance(cfg, dict) or not isinstance(cfg.get("model"), dict):
        raise HarnessError(f"{path}: config.json lacks a model table")
    model = cfg["model"]
    ints = ("vocab", "d_model", "layers", "heads", "seq", "batch")
    if (not all(isinstance(model.get(k), int) and not isinstance(model.get(k), bool) for k in ints)
            or not isinstance(model.get("remat"), bool)):
        raise HarnessError(f"{path}: config.json model needs integer sizes and a boolean remat")
    try:
        ModelConfig(**model)
    except (TypeError, ValueError, HarnessError) as exc:
        raise HarnessError(f"{path}: config.json model is not valid ({exc})") from None
    _validate_run_shape(cfg, path)
    lr = cfg.get("learning_rate")
    if not isinstance(lr, (int, float)) or isinstance(lr, bool) or not math.isfinite(lr) or lr <= 0:
        raise HarnessError(f"{path}: config.json learning_rate must be a positive finite number")


def check_derived(root: Path, path: Path, report: CheckReport) -> None:
    """findings.json and stress/table.txt recomputed from the bundled HLO and stress rows."""
    from xla_harness.hlo.parser import parse_file
    from xla_harness.hlo.scan import module_json, scan_module
    from xla_harness.stress import report as stress_report

    hlos = sorted((root / "hlo").glob("*after_optimizations.txt"))
    if len(hlos) != 1:
        raise HarnessError(f"{path}: expected one optimized HLO under hlo/, found {len(hlos)}")
    mod = parse_file(hlos[0])
    modules = [module_json(mod, scan_module(mod))]
    bundled = _read_json(root, "findings.json", path)
    for entry in (bundled.get("modules", [])[1:] if isinstance(bundled, dict) else []):
        modules.append(_rescan_target(root, entry))  # the step compiled for a target (hlo/<target>/)
    findings = {"modules": modules}
    ok = findings == bundled
    report.add(ok, f"findings.json: {'same as' if ok else 'DIFFERENT from'} a scan of the bundled HLO")
    try:
        table = stress_report.format_table(stress_report.load_table([root / "stress"])) + "\n"
    except HarnessError as exc:  # tampered or corrupt rows: a difference to report, with the manifest's lines
        report.add(False, f"stress/: the bundled rows do not read ({exc})")
        return
    ok = (root / "stress" / "table.txt").is_file() and table == (root / "stress" / "table.txt").read_text()
    report.add(ok, f"stress/table.txt: {'same as' if ok else 'DIFFERENT from'} the table of the bundled rows")


def _rescan_target(root: Path, entry) -> dict:
    """The scan of a target's bundled HLO, shaped as make_bundle wrote it (None when it is missing:
    then the findings differ)."""
    from xla_harness.hlo.parser import parse_file
    from xla_harness.hlo.scan import module_json, scan
    from xla_harness.targets import parse_target

    try:
        target = parse_target(str(entry.get("target")))
    except (HarnessError, AttributeError):
        return {}
    hlo = root / "hlo" / target.text.replace(":", "_") / "jit_step.after_optimizations.txt"
    if target.is_host or not hlo.is_file():
        return {}
    mod = parse_file(hlo)
    findings, decisions, backend = scan(mod, target.backend)
    return {**module_json(mod, findings, decisions, backend), "target": target.text,
            "device_kind": entry.get("device_kind")}


def _is_run(entry) -> bool:
    """One seed's record as repro.py prints it: an integer non-finite count and a list of losses."""
    return (isinstance(entry, dict) and isinstance(entry.get("nonfinite"), int)
            and not isinstance(entry["nonfinite"], bool) and isinstance(entry.get("losses"), list)
            and all(x is None or (isinstance(x, int | float) and not isinstance(x, bool)) for x in entry["losses"]))


def compare_runs(expected: dict, got: dict, report: CheckReport) -> None:
    """Seed by seed, the re-run against expected.json. A record that does not match the re-run's
    shape (another seed set, another number of losses, no seeds or no losses at all) is a difference:
    nothing compared is never "same"."""
    if not expected["seeds"]:
        report.add(False, "expected.json: no seeds to compare with the re-run")
    for seed in sorted(got["seeds"].keys() - expected["seeds"].keys()):
        report.add(False, f"seed {seed}: in the re-run but missing from expected.json")
    for seed, want in expected["seeds"].items():
        have = got["seeds"].get(seed)
        if have is None:
            report.add(False, f"seed {seed}: missing from the re-run")
            continue
        if not _is_run(want):
            report.add(False, f"seed {seed}: expected.json has no non-finite count and losses for it")
            continue
        if len(have["losses"]) != len(want["losses"]) or not want["losses"]:
            report.add(False, f"seed {seed}: {len(have['losses'])} losses in the re-run, {len(want['losses'])} "
                              "in the bundle -> DIFFERENT")
            continue
        pairs = zip(have["losses"], want["losses"], strict=True)
        diff = max((abs(a - b) / max(1.0, abs(b)) for a, b in pairs
                    if a is not None and b is not None and math.isfinite(a) and math.isfinite(b)), default=0.0)
        ok = have["nonfinite"] == want["nonfinite"] and diff <= 1e-5
        report.add(ok, f"seed {seed}: non-finite {have['nonfinite']} (bundle: {want['nonfinite']}), "
                       f"max relative loss difference {diff:.2e} -> {'same' if ok else 'DIFFERENT'}")
    report.lines.append(f"bundle made with jax {expected.get('jax')} on {expected.get('backend')}; re-run with "
                        f"jax {got['jax']} on {got['backend']}")


def check_bundle(path: Path, python: str = sys.executable, timeout: float = REPRO_TIMEOUT_S,
                 max_bytes: int = MAX_BYTES, run_program: bool = False,
                 max_steps: int = MAX_CHECK_STEPS) -> tuple[bool, list[str]]:
    """Verify a bundle without running its code; re-run the harness's repro.py. (same, lines).

    A user's program in program/ is code from the archive: it runs only with ``run_program``.
    The temporary folder goes on every way out, SIGTERM included."""
    if not path.is_file():
        what = ("a folder, not a bundle (a .tar.gz that `bundle --out` wrote)" if path.is_dir() else
                "no such file" if not path.exists() else "not a regular file, not a bundle")
        raise HarnessError(f"{path}: {what}")
    report = CheckReport()
    with sigterm_as_exit(), tempfile.TemporaryDirectory(prefix="xla-harness-check-") as tmp:
        root = safe_extract(path, Path(tmp), max_bytes=max_bytes)
        for need in ("manifest.json", "repro.py", "config.json", "expected.json", "findings.json"):
            if not (root / need).is_file():
                raise HarnessError(f"{path}: bundle lacks {need}")
        check_manifest(root, path, report)
        cfg = _read_json(root, "config.json", path)
        validate_config(cfg, path, root)
        user_program = is_program_bundle(cfg)
        script = STANDALONE_PROGRAM if user_program else STANDALONE
        ours = sha256_file(script)
        ok = sha256_file(root / "repro.py") == ours
        report.add(ok, f"repro.py: {'same as' if ok else 'DIFFERENT from'} this harness's copy (sha256 {ours[:12]}); "
                       "the harness's copy is the one run")
        check_derived(root, path, report)
        expected = _read_json(root, "expected.json", path)
        if not isinstance(expected, dict) or not isinstance(expected.get("seeds"), dict):
            raise HarnessError(f"{path}: expected.json has no seeds table")
        if user_program and not run_program:
            report.lines.append("not re-run: the program in program/ is code from the archive; read it, then "
                                "pass --run-program to run it")
            return report.same, report.lines
        check_work(cfg, path, max_steps)
        if user_program:
            clean_config = root / "config.json"  # beside the program/ it loads
        else:
            clean_config = Path(tmp) / "config.json"  # the validated config, outside the extracted tree
            clean_config.write_text(json.dumps(cfg))
        got = json.loads(run_repro(script, clean_config, python, timeout))
        compare_runs(expected, got, report)
    return report.same, report.lines
