"""Checking a repro bundle (``bundle --check``) without trusting it.

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

What a bundle holds, how it is made and how its repro.py is run: :mod:`xla_harness.repro.bundle`.
"""

from __future__ import annotations

import json
import math
import sys
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from xla_harness.errors import HarnessError
from xla_harness.repro.bundle import (
    REPRO_TIMEOUT_S,
    STANDALONE,
    STANDALONE_PROGRAM,
    manifest,
    run_repro,
    sigterm_as_exit,
)
from xla_harness.runtime.files import sha256_file

MAX_MEMBERS = 10_000
MAX_BYTES = 1 << 30  # extracted bytes a bundle may hold (HLO dumps of big models run to hundreds of MB)
MAX_CHECK_STEPS = 10_000  # steps x seeds a --check re-run may take unless raised with --max-steps


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
    from xla_harness.stress.report import summary as stress_report

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
