#!/usr/bin/env python3
"""How close an ahead-of-time compile comes to a GPU's own: compile the #35409 program for a cuda:
target and hold its HLO against the device's committed compile, fusion by fusion (``make gpu-fidelity``).

    python tools/gpu_fidelity.py --device results/gpu/h200-2026-11-26/compile-only \\
        --out results/gpu/h200-2026-11-26/fidelity [--target cuda:h200:1x1x1] [--autotune-results FILE] [--force]

Run it in the venv of the jax the device ran (the make target builds ``.venv-jax0.11.2`` with the CUDA 13
plugin). ``--device`` is a ``stress --compile-only`` folder from the device (compile.jsonl, the optimized
HLO under hlo/, gzipped or not). The ahead-of-time compile is ``xla-harness stress --program
issue-35409 --compile-only --target T`` (the same program and options as the device's record; T a
``cuda:`` target) into a fresh folder inside OUT, its dump gzipped with tools/publish_hlo.py, and only
then moved to OUT/aot/; OUT/table.md is the comparison (:mod:`xla_harness.hlo.fidelity`) with both
compiles' versions and figures, OUT/fidelity.json the same as data. ``--aot DIR`` compares an existing
compile-only folder instead of compiling (and takes neither --target nor --autotune-results).

Every input and output is checked before the first compile or write. Nothing is replaced without
``--force``: not an existing table.md or fidelity.json, and not an existing OUT/aot, which even with
--force is replaced only when it is an earlier compile of this tool (compile.jsonl of issue-35409 for a
cuda: target, its lock, and hlo/ holding only the compile's dumps), never when it is or holds an input.
A failed compile leaves OUT as it was. Exit 0 when the table was written, 2 on bad input (one
``error:`` line).
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import os
import shutil
import sys
import tempfile
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMPILE_TIMEOUT_S = 1800  # one full-size ahead-of-time GPU compile takes minutes on 2 cores
PUBLISH_TIMEOUT_S = 600
DEFAULT_TARGET = "cuda:h200:1x1x1"
PROGRAM = "issue-35409"
# What a compile of this tool leaves in OUT/aot: the records, their lock, and hlo/ with the dumps.
OWN_FILES = ("compile.jsonl", "compile.jsonl.lock")
OWN_DUMPS = (".after_optimizations.txt", ".after_optimizations-buffer-assignment.txt",
             ".after_optimizations-buffer-assignment-values.txt", ".autotune.txt")
sys.path.insert(0, str(ROOT))

from xla_harness.commands import flags  # noqa: E402
from xla_harness.errors import HarnessError  # noqa: E402
from xla_harness.hlo import fidelity  # noqa: E402
from xla_harness.hlo.ir import HloModule  # noqa: E402
from xla_harness.hlo.parser import parse_module  # noqa: E402
from xla_harness.runtime import subproc  # noqa: E402
from xla_harness.runtime.files import read_regular  # noqa: E402
from xla_harness.stress.compile_only.records import read_compile_records  # noqa: E402
from xla_harness.targets import Target, parse_target  # noqa: E402


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors as one ``error:`` line and exit 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"error: {self.prog}: {message} (see --help)\n")
        raise SystemExit(2)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="gpu_fidelity.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--device", type=flags.folder, required=True, help="the device's stress --compile-only folder")
    p.add_argument("--out", type=flags.folder, required=True, help="where the table (and aot/) go")
    p.add_argument("--target", default=None, metavar="cuda:KIND[:TOPO]",
                   help=f"the ahead-of-time target, a cuda: target (default {DEFAULT_TARGET})")
    flags.add_autotune_argument(p)
    p.add_argument("--aot", type=flags.folder, default=None,
                   help="compare this compile-only folder; compile nothing")
    flags.add_force_argument(p, "OUT/table.md, OUT/fidelity.json and an earlier compile of this tool in OUT/aot")
    return p


def _target(text: str | None, aot: Path | None) -> Target | None:
    """The cuda: target to compile for; None with --aot (which compiles nothing)."""
    if aot is not None:
        if text is not None:
            raise HarnessError("--target: --aot compares an existing compile and compiles nothing; leave --target out")
        return None
    target = parse_target(text or DEFAULT_TARGET)
    if target.platform != "cuda":
        raise HarnessError(f"--target {text}: this tool compiles for a GPU; give a cuda: target "
                           f"(e.g. {DEFAULT_TARGET})")
    return target


def _check_autotune(path: Path | None, target: Target | None) -> None:
    """--autotune-results checked as the compile will check it (the compile itself loads the file)."""
    if path is None:
        return
    if target is None:
        raise HarnessError("--autotune-results: --aot compares an existing compile and compiles nothing; leave "
                           "--autotune-results out")
    from xla_harness.targets.devices import load_autotune_results

    saved = os.environ.get("XLA_FLAGS")
    try:
        load_autotune_results(path, target)
    finally:
        if saved is None:
            os.environ.pop("XLA_FLAGS", None)
        else:
            os.environ["XLA_FLAGS"] = saved


def _hlo_text(path: Path) -> str:
    """The text of an optimized HLO dump, gunzipped when its name ends in .gz."""
    raw = read_regular(path)
    if path.suffix == ".gz":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as exc:
            raise HarnessError(f"{path}: not a readable gzip file ({exc})") from None
    try:
        return raw.decode()
    except UnicodeDecodeError as exc:
        raise HarnessError(f"{path}: not UTF-8 text (byte {exc.start}); an optimized HLO dump is text") from None


def _read_compile(folder: Path, flag: str) -> tuple[dict, HloModule]:
    """The one compile record of a compile-only ``folder`` and its optimized HLO, parsed."""
    path = folder / "compile.jsonl"
    if not path.is_file():
        raise HarnessError(f"{flag} {folder}: no compile.jsonl (a stress --compile-only --out folder)")
    records = read_compile_records(path)
    if len(records) != 1:
        raise HarnessError(f"{path}: {len(records)} compile records; expected the one of {PROGRAM}")
    found = sorted((folder / "hlo").glob("*after_optimizations.txt.gz")) or \
        sorted((folder / "hlo").glob("*after_optimizations.txt"))
    if len(found) != 1:
        raise HarnessError(f"{folder}/hlo: {len(found)} optimized HLO files; expected one")
    return records[0], parse_module(_hlo_text(found[0]), found[0].name)


def _real(path: Path) -> Path:
    return Path(os.path.realpath(path))


def _check_out(out: Path, inputs: dict[str, Path]) -> None:
    """--out: a folder, or one that can be made, and not inside an input folder."""
    if out.exists() or out.is_symlink():
        if not out.is_dir():
            what = flags.protected(out)
            raise HarnessError(f"--out {out} is not a folder" + (f" ({what})" if what else "") +
                               "; name the folder the table goes to")
    else:
        up = next((up for up in out.parents if up.exists() or up.is_symlink()), None)
        if up is not None and not up.is_dir():
            raise HarnessError(f"--out {out}: {up} is not a folder")
    where = _real(out)
    for flag in ("--device", "--aot"):
        folder = inputs.get(flag)
        if folder is not None and (where == _real(folder) or _real(folder) in where.parents):
            raise HarnessError(f"--out {out} is inside {flag} {folder}; write the table elsewhere (an input "
                               "folder stays as it is)")


def _own_dump(path: Path) -> bool:
    name = path.name.removesuffix(".gz")
    return path.is_file() and not path.is_symlink() and name.endswith(OWN_DUMPS)


def _not_own(aot: Path) -> str | None:
    """What in an existing OUT/aot no compile of this tool made (None: all of it is an earlier compile's)."""
    if aot.is_symlink() or not aot.is_dir():
        return f"{aot} is not a folder"
    for entry in sorted(aot.iterdir()):
        if entry.name in OWN_FILES and entry.is_file() and not entry.is_symlink():
            continue
        if entry.name == "hlo" and entry.is_dir() and not entry.is_symlink():
            other = next((f for f in sorted(entry.iterdir()) if not _own_dump(f)), None)
            if other is None:
                continue
            entry = other
        return f"{aot} holds {entry.name if entry.parent == aot else entry.relative_to(aot)}"
    if (aot / "compile.jsonl").exists():
        try:
            records = read_compile_records(aot / "compile.jsonl")
        except HarnessError as exc:
            return str(exc)
        for rec in records:
            if rec.get("program", rec["label"]) != PROGRAM or not rec["target"].startswith("cuda:"):
                return f"{aot}/compile.jsonl holds a compile of {rec['label']} for {rec['target']}"
    return None


def _check_aot(aot: Path, inputs: dict[str, Path], force: bool) -> None:
    """OUT/aot may be replaced: it is no input and holds none; it is absent, or (with --force) an earlier
    compile of this tool."""
    where = _real(aot)
    for flag, path in inputs.items():
        given = _real(path)
        if given == where or where in given.parents:
            raise HarnessError(f"--out: {aot} is or holds {flag} {path}; refusing to replace it (write the output "
                               "elsewhere)")
    if not (aot.exists() or aot.is_symlink()):
        return
    if not force:
        raise HarnessError(f"--out: {aot} already exists; pass --force to replace an earlier compile of this tool")
    problem = _not_own(aot)
    if problem is not None:
        raise HarnessError(f"--out: {problem}, which no compile of this tool made; refusing to replace it (move it "
                           "away, or choose another --out)")


def _check_outputs(args: argparse.Namespace) -> None:
    """Every output, before anything is compiled or written."""
    named = {"--device": args.device, "--aot": args.aot, "--autotune-results": args.autotune_results}
    named = {flag: path for flag, path in named.items() if path is not None}
    _check_out(args.out, named)
    inputs = flags.input_files(named.values(), results_in_folders=False)
    for name in ("table.md", "fidelity.json"):
        flags.check_output(args.out / name, "--out", inputs, args.force)
    if args.aot is None:
        _check_aot(args.out / "aot", named, args.force)


def _make_folder(out: Path) -> list[Path]:
    """Make ``out`` and its missing parents; the folders made, outermost first."""
    missing = [p for p in (out, *out.parents) if not (p.exists() or p.is_symlink())][::-1]
    for p in missing:
        p.mkdir()
    return missing


def _unmake(made: list[Path]) -> None:
    """Remove the folders :func:`_make_folder` made, where they are still empty."""
    for p in reversed(made):
        with contextlib.suppress(OSError):
            p.rmdir()


def _check_compiler(target: Target | None) -> None:
    """The compile's CUDA plugin is installed here (the compile runs in this interpreter)."""
    from xla_harness.targets.devices import missing

    problem = missing(target) if target is not None else None
    if problem is not None:
        raise HarnessError(problem)


def _run_compile(dest: Path, target: Target, options: dict, autotune: Path | None) -> None:
    """The ahead-of-time compile into the new folder ``dest``, its dump made publishable (the child runs in
    the repository root: every path it is given is absolute)."""
    argv = [sys.executable, "-m", "xla_harness", "stress", "--program", PROGRAM, "--compile-only",
            "--target", target.text, "--out", os.path.abspath(dest)]
    for key, value in sorted(options.items()):
        argv += ["--program-option", f"{key}={value}"]
    if autotune is not None:
        argv += ["--autotune-results", os.path.abspath(autotune)]
    print("$ " + " ".join(argv[1:]), flush=True)
    done = subproc.run(argv, cwd=ROOT, timeout=COMPILE_TIMEOUT_S, what="the ahead-of-time compile")
    if done.returncode not in (0, 1):  # 1: the scan found a hazard, a result like any other
        raise HarnessError(f"the ahead-of-time compile failed (exit {done.returncode})")
    done = subproc.run([sys.executable, str(ROOT / "tools" / "publish_hlo.py"), os.path.abspath(dest / "hlo")],
                       timeout=PUBLISH_TIMEOUT_S, what="publish_hlo.py")
    if done.returncode != 0:
        raise HarnessError(f"publish_hlo.py {dest / 'hlo'} failed (exit {done.returncode})")


def _compile(out: Path, target: Target, options: dict,
             autotune: Path | None) -> tuple[Path, tuple[dict, HloModule]]:
    """The compile into ``aot`` of a fresh folder inside ``out`` (removed again if anything fails): that
    folder, and the compile's record and HLO."""
    staging = Path(tempfile.mkdtemp(prefix=".gpu_fidelity-", dir=out))
    try:
        _run_compile(staging / "aot", target, options, autotune)
        return staging, _read_compile(staging / "aot", "the ahead-of-time compile")
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _install(staging: Path, aot: Path) -> None:
    """The new compile in ``staging`` becomes ``aot``; an earlier one (checked by :func:`_check_aot`) moves
    into ``staging``, to go with it, and back should the move of the new one fail."""
    earlier = staging / "earlier"
    if aot.exists():
        aot.rename(earlier)
    try:
        (staging / "aot").rename(aot)
    except OSError:
        if earlier.exists():
            earlier.rename(aot)
        raise


def _figures(rec: dict) -> dict:
    fp = rec["fingerprint"]
    return {"versions": rec.get("versions", {}), "target": rec.get("target"), "device_kind": rec.get("device_kind"),
            "XLA_FLAGS": rec.get("XLA_FLAGS", ""), "fingerprint": fp.get("id"),
            "temp_size_in_bytes": fp.get("temp_size_in_bytes"), "compile_cpu_s": rec.get("compile_cpu_s")}


def _count(value: object) -> str:
    return f"{value:,}" if isinstance(value, int) else str(value)


def _comparison(device: tuple[dict, HloModule], aot: tuple[dict, HloModule]) -> tuple[str, str]:
    """table.md and fidelity.json of the two compiles."""
    (device_rec, device_mod), (aot_rec, aot_mod) = device, aot
    names = (f"device ({device_rec.get('device_kind')})", f"ahead of time ({aot_rec.get('target')})")
    result = fidelity.compare(device_mod, aot_mod, names)
    dev, ahead = _figures(device_rec), _figures(aot_rec)
    rows = [("compiler", f"jax {dev['versions'].get('jax')}, on the device", ", ".join(
        f"{k} {v}" for k, v in ahead["versions"].items())),
        ("XLA_FLAGS", dev["XLA_FLAGS"] or "(none)", ahead["XLA_FLAGS"] or "(none)"),
        ("step fingerprint", dev["fingerprint"], ahead["fingerprint"]),
        ("temp bytes (buffer assignment)", _count(dev["temp_size_in_bytes"]), _count(ahead["temp_size_in_bytes"])),
        ("compile CPU s", str(dev["compile_cpu_s"]), str(ahead["compile_cpu_s"]))]
    head = "\n".join(f"| {a} | {b} | {c} |" for a, b, c in rows)
    table = (f"| compile | {names[0]} | {names[1]} |\n| --- | --- | --- |\n{head}\n\n"
             + fidelity.format_fidelity(result))
    data = json.dumps({
        "device": dev, "ahead_of_time": ahead,
        "rows": [{"aspect": a, "device": x, "ahead_of_time": y, "same": s} for a, x, y, s in result.rows],
        "scatters": [{"scatter": w, "device": x, "ahead_of_time": y} for w, x, y in result.scatters],
        "fusions": [{"name": n, "device": x, "ahead_of_time": y, "device_matched": mx, "ahead_of_time_matched": my}
                    for n, x, y, mx, my in result.fusion_rows],
        "matched_fusions": list(result.matched_fusions),
        "tiles": {k: list(v) for k, v in result.tiles.items()}}, indent=1, sort_keys=True) + "\n"
    return table, data


def _fidelity(args: argparse.Namespace, made: list[Path]) -> None:
    """Check every input and output, compile (unless --aot), then write the table and its data."""
    target = _target(args.target, args.aot)
    _check_autotune(args.autotune_results, target)
    device = _read_compile(args.device, "--device")
    given = _read_compile(args.aot, "--aot") if args.aot is not None else None
    _check_outputs(args)
    _check_compiler(target)
    made += _make_folder(args.out)
    if given is not None:
        table, data = _comparison(device, given)
    else:
        assert target is not None  # _target gives one whenever --aot is absent
        staging, compiled = _compile(args.out, target, device[0].get("options", {}), args.autotune_results)
        try:
            table, data = _comparison(device, compiled)
            _install(staging, args.out / "aot")
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    (args.out / "table.md").write_text(table)
    (args.out / "fidelity.json").write_text(data)
    print(table)
    print(f"wrote {args.out / 'table.md'} and {args.out / 'fidelity.json'}")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    made: list[Path] = []
    try:
        _fidelity(args, made)
    except HarnessError as exc:
        problem = str(exc)
    except OSError as exc:
        problem = f"{exc.filename}: {exc.strerror}" if exc.filename and exc.strerror else str(exc)
    else:
        return 0
    _unmake(made)
    sys.stderr.write(f"error: {problem}\n")
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
