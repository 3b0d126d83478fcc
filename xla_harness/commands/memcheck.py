"""xla-harness memcheck: check a compiled program's memory plan for races, from the compiler's dump."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from xla_harness.errors import HarnessError

NAME = "memcheck"
HELP = "check a compiled program's memory plan (buffer assignment) for races, without the hardware"
DESCRIPTION = """\
Check each compiled module (a --xla_dump_to folder: every *after_optimizations.txt[.gz] with its
*-buffer-assignment.txt[.gz] beside it; or one such module file) for memory races: two values
whose bytes overlap while both are live and that are not one buffer (overlap); an in-place write
over a value still read later (in-place; donation for a donated parameter); an instruction that
writes bytes an async operation reads or writes, or reads bytes it writes, between its start and
done (async). Where the compiler dumped its own live range (*-live-range.txt), every
disagreement with ours is listed. Each module says how many of its values were checked and which
were left out, by class and why. The files must be one compile's, whole and well-formed (the
buffer assignment's values name the module's instructions with their shapes, its parameters are
the module's with their donation, the live range's sequence is the module's schedule): otherwise
one error line names the file and line, and nothing is concluded. See docs/memcheck.md.
Exit codes: 0 checked, nothing found; 1 a conflict or live-range disagreement; 2 bad input or nothing checked.
"""


def add_arguments(p) -> None:
    from xla_harness.commands import flags

    p.add_argument("paths", nargs="+", type=str, metavar="PATH",
                   help="a dump folder, or a module file with its buffer assignment beside it")
    flags.add_json_argument(p, "the reports")


def _targets(paths: list[str]) -> list[Path]:
    out: list[Path] = []
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            found = sorted(q for q in p.rglob("*after_optimizations.txt*")
                           if q.name.endswith(("after_optimizations.txt", "after_optimizations.txt.gz")))
            found = [q for q in found if q.is_file()]
            from xla_harness.hlo.memplan import beside
            with_ba = [q for q in found if beside(q, "buffer-assignment") is not None]
            if not with_ba:
                raise HarnessError(f"{p}: no *after_optimizations.txt with a buffer assignment beside it")
            out += with_ba
        elif p.is_file():
            out.append(p)
        elif p.exists():
            raise HarnessError(f"{p}: not a regular file or a folder (a device, a FIFO): give a dump folder or a "
                               "module file")
        else:
            raise HarnessError(f"{p}: no such file or folder")
    return out


def _checked(path: Path):
    """One module's report, or the error that refused it (a worker's answer: nothing raised across)."""
    from xla_harness.hlo.memplan import check_files

    try:
        return check_files(path)
    except HarnessError as exc:
        return exc


def _check_all(paths: list[Path]) -> list:
    """Every module's report, in order: several modules are checked side by side, one process per core
    (each module on one core); the first refusal, in order, is raised."""
    import os

    workers = min(len(paths), os.cpu_count() or 1)
    if workers <= 1:
        found = [_checked(p) for p in paths]
    else:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        # fork: the command has imported nothing a child cannot inherit (no jax, no threads of its own)
        pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork"))
        try:
            found = list(pool.map(_checked, paths))
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
    for r in found:
        if isinstance(r, HarnessError):
            raise r
    return found


def run(args) -> int:
    from xla_harness.hlo.memplan import LEFT_OUT

    reports = _check_all(_targets(args.paths))
    if not reports:
        raise HarnessError("nothing checked")
    if args.json:
        json.dump([r.as_dict() for r in reports], sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        for r in reports:
            lr = "no live-range dump" if r.live_range_compared < 0 else \
                f"live range: {r.live_range_compared} values compared, {len(r.disagreements)} disagreements"
            cov = r.coverage
            left = "; ".join(f"{n} {k}" for k, n in cov.left_out.items())
            print(f"{r.module}: {cov.checked} of {cov.listed} values "
                  f"checked{f' (left out: {left})' if left else ''}, {r.allocations} allocations, "
                  f"{r.async_windows} async windows, {len(r.conflicts)} conflicts; {lr} ({r.seconds:.2f} s)")
            for k in cov.left_out:
                print(f"  left out, {k}: {LEFT_OUT[k]}")
            for c in r.conflicts:
                print(f"  {c.message}")
            for d in r.disagreements:
                print(f"  {d}")
    return 1 if any(r.conflicts or r.disagreements for r in reports) else 0
