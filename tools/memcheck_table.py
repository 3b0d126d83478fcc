"""The memcheck figures on every committed compiler dump that has a buffer assignment beside it:
results/tpu-aot/**/hlo, results/cuda-aot/**/hlo, the H100 memory-plan dumps, the H200 compiles
(full size, 2026-11-26; 1/32 and full size with the compiler's live range, 2026-11-28) and the
ahead-of-time compiles kept with the compiler's live range (results/*-aot/live-range). Writes
results/cpu/memcheck/table.md (paths relative to the checkout; seconds are this machine's, one
process).

    python tools/memcheck_table.py [OUT] [--allow-dirty] (default: results/cpu/memcheck/table.md; refused
    from a tree with local changes unless --allow-dirty)
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

GLOBS = ("results/tpu-aot/**/hlo/*after_optimizations.txt*", "results/cuda-aot/**/hlo/*after_optimizations.txt*",
         "results/gpu/h100-2026-11-28/memory-plan/**/*after_optimizations.txt*",
         "results/tpu-aot/live-range/*after_optimizations.txt*",
         "results/cuda-aot/live-range/*after_optimizations.txt*",
         "results/cuda-aot/live-range-async-wrapped/*after_optimizations.txt*",
         "results/gpu/h200-2026-11-26/compile-only/hlo/issue-35409-full-remat.after_optimizations*.txt*",
         "results/gpu/h200-2026-11-28/memory-plan*/hlo/*after_optimizations.txt*")


def modules() -> list[Path]:
    from xla_harness.hlo.memplan import beside

    found: set[Path] = set()
    for pattern in GLOBS:
        for p in ROOT.glob(pattern):
            if p.name.endswith(("after_optimizations.txt", "after_optimizations.txt.gz")) and \
                    beside(p, "buffer-assignment") is not None:
                found.add(p)
    return sorted(found)


def _commit() -> str:
    """This checkout's commit; SystemExit when the tree has local changes (evidence is a clean commit's)."""
    from xla_harness.runtime import subproc

    head = subproc.run(["git", "-C", str(ROOT), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                       text=True, check=True, timeout=30).stdout.strip()
    dirty = subproc.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                        capture_output=True, text=True, check=True, timeout=30).stdout.strip()
    if dirty and "--allow-dirty" not in sys.argv:
        raise SystemExit("memcheck_table: the tree has local changes; commit them first (or --allow-dirty, "
                         "for a table that is not evidence)")
    return head + ("-dirty" if dirty else "")


def main() -> int:
    from xla_harness.hlo.memplan import beside, check_files, read_text
    from xla_harness.hlo.timeline import parse_live_range

    args = [a for a in sys.argv[1:] if a != "--allow-dirty"]
    out = Path(args[0]) if args else ROOT / "results/cpu/memcheck/table.md"
    commit = _commit()
    rows = []
    total = 0
    for p in modules():
        r = check_files(p)
        total += len(r.conflicts)
        lr_path = beside(p, "live-range")
        xla = len(parse_live_range(read_text(lr_path)).ranges) if lr_path else None
        lr = "no dump" if r.live_range_compared < 0 else f"{len(r.disagreements)} of {r.live_range_compared}"
        cov = r.coverage
        left = ", ".join(f"{n} {k}" for k, n in cov.left_out.items()) or "none"
        rel = p.relative_to(ROOT).as_posix().removesuffix(".gz").removesuffix(".txt").removesuffix(
            ".after_optimizations")
        rows.append(f"| {rel} | {cov.listed} | {cov.timed} | {'-' if xla is None else xla} | {cov.checked} | "
                    f"{left} | {r.allocations} | {r.async_windows} | {len(r.conflicts)} | {lr} | {r.seconds:.2f} |")
        print(rows[-1], flush=True)
    text = ("# memcheck on the committed compiler dumps\n\n"
            "Written by `python tools/memcheck_table.py` at xla-harness " + commit + ": every module under "
            "results/tpu-aot/**/hlo, results/cuda-aot/**/hlo,\nthe H100 memory-plan dumps, the H200's own compiles "
            "(results/gpu/h200-*) and the three ahead-of-time compiles kept with\nthe compiler's live range "
            "(results/tpu-aot/live-range, results/cuda-aot/live-range, results/cuda-aot/live-range-async-wrapped) "
            "with a buffer assignment beside it.\nValues: listed by the buffer assignment, timed by memcheck, timed "
            "by XLA's own live range (where dumped), checked (timed, with bytes); left out, by class "
            "(`memcheck` says why). Seconds: one process on this machine (2 shared cores).\n\n"
            f"{len(rows)} modules, {total} conflicts.\n\n"
            "| dump | values | timed | XLA timed | checked | left out | allocations | async windows | conflicts | "
            "live-range disagreements | s |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|\n" + "\n".join(rows) + "\n")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
