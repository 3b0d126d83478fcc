"""memcheck held to the compiler's own live range: on each committed dump that carries XLA's
``*-live-range.txt``, values are moved onto other values' bytes (a fixed seed) and XLA's live range,
not memcheck, says which moves are races (tests/hlo/memplan/mutants.py). Prints, per dump, the races
caught of those planted and the harmless moves memcheck left clean; lists every miss; exit 1 if any.

    .venv/bin/python tools/memcheck_mutants.py [--seed 0] [--races 20] [--harmless 20] [MODULE ...]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "hlo" / "memplan")]

from mutants import moves  # noqa: E402

from xla_harness.hlo.buffers import parse_buffer_assignment  # noqa: E402
from xla_harness.hlo.memplan import backend_of, beside, check_module, read_text  # noqa: E402
from xla_harness.hlo.parser import parse_module  # noqa: E402
from xla_harness.hlo.timeline import parse_live_range  # noqa: E402


def committed() -> list[Path]:
    """Every committed module with the compiler's live range beside it."""
    return sorted(p for p in (ROOT / "results").rglob("*after_optimizations.txt*")
                  if p.name.endswith((".txt", ".txt.gz")) and "-buffer-assignment" not in p.name
                  and "-live-range" not in p.name and beside(p, "live-range") and beside(p, "buffer-assignment"))


def run(module_path: Path, seed: int, races: int, harmless: int) -> tuple[int, int, int, int, list[str]]:
    """(races caught, races planted, harmless clean, harmless moved, misses) on one dump."""
    module = parse_module(read_text(module_path), str(module_path))
    ba_text = read_text(beside(module_path, "buffer-assignment"))
    lr_text = read_text(beside(module_path, "live-range"))
    dump = parse_live_range(lr_text)
    backend = backend_of(module, str(module_path))
    caught = planted = clean = moved = 0
    misses = []
    for m in moves(ba_text, dump, seed, races, harmless):
        report = check_module(module, parse_buffer_assignment(m.text), lr_text, str(module_path), backend)
        hit = any(m.victim in (c.data["a"]["value"], c.data["b"]["value"]) or
                  m.victim.removesuffix("{}") in (c.data["a"]["value"], c.data["b"]["value"]) for c in report.conflicts)
        if m.race:
            planted += 1
            caught += hit
            if not hit:
                misses.append(f"race missed: {m.victim} onto {m.onto} (allocation {m.allocation}, live at once "
                              f"with {', '.join(m.met)})")
        else:
            moved += 1
            clean += not report.conflicts
            if report.conflicts:
                misses.append(f"false race: {m.victim} onto {m.onto}: {report.conflicts[0].message[:300]}")
    return caught, planted, clean, moved, misses


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("modules", nargs="*", type=Path, help="modules (default: every committed one with a live range)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--races", type=int, default=20, help="races planted per dump")
    ap.add_argument("--harmless", type=int, default=20, help="harmless moves per dump")
    args = ap.parse_args(argv)
    total = [0, 0, 0, 0]
    bad = False
    for path in args.modules or committed():
        t0 = time.perf_counter()
        caught, planted, clean, moved, misses = run(path, args.seed, args.races, args.harmless)
        for i, n in enumerate((caught, planted, clean, moved)):
            total[i] += n
        rel = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
        print(f"{rel.parent}: races caught {caught}/{planted}, harmless moves clean {clean}/{moved} "
              f"({time.perf_counter() - t0:.0f} s)")
        for line in misses:
            print(f"  {line}")
        bad = bad or bool(misses)
    print(f"all: races caught {total[0]}/{total[1]}, harmless moves clean {total[2]}/{total[3]}")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
