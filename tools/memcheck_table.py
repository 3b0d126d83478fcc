"""The memcheck figures on every committed compiler dump that has a buffer assignment beside it:
results/tpu-aot/**/hlo, results/cuda-aot/**/hlo, the H100 memory-plan dumps, the H200 compiles
(full size, 2026-11-26; 1/32 and full size with the compiler's live range, 2026-11-28) and the
ahead-of-time compiles kept with the compiler's live range (results/*-aot/live-range). Writes
results/cpu/memcheck/table.md (paths relative to the checkout; seconds are this machine's, one
process).

    python tools/memcheck_table.py [OUT] (default: results/cpu/memcheck/table.md)
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
    from xla_harness.hlo.memcheck import beside

    found: set[Path] = set()
    for pattern in GLOBS:
        for p in ROOT.glob(pattern):
            if p.name.endswith(("after_optimizations.txt", "after_optimizations.txt.gz")) and \
                    beside(p, "buffer-assignment") is not None:
                found.add(p)
    return sorted(found)


def main() -> int:
    from xla_harness.hlo.memcheck import check_files

    out = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "results/cpu/memcheck/table.md"
    rows = []
    total = 0
    for p in modules():
        r = check_files(p)
        total += len(r.conflicts)
        lr = "no dump" if r.live_range_compared < 0 else f"{len(r.disagreements)} of {r.live_range_compared}"
        rel = p.relative_to(ROOT).as_posix().removesuffix(".gz").removesuffix(".txt").removesuffix(
            ".after_optimizations")
        rows.append(f"| {rel} | {r.values} ({r.timed}) | {r.allocations} | {r.async_windows} | "
                    f"{len(r.conflicts)} | {lr} | {r.seconds:.2f} |")
        print(rows[-1], flush=True)
    text = ("# memcheck on the committed compiler dumps\n\n"
            "Written by `python tools/memcheck_table.py`: every module under results/tpu-aot/**/hlo, "
            "results/cuda-aot/**/hlo,\nthe H100 memory-plan dumps, the H200's own compiles (results/gpu/h200-*) "
            "and the three ahead-of-time compiles kept with\nthe compiler's live range (results/tpu-aot/live-range, "
            "results/cuda-aot/live-range, results/cuda-aot/live-range-async-wrapped) "
            "with a buffer assignment beside it.\nSeconds: one process on this machine (2 shared cores).\n\n"
            f"{len(rows)} modules, {total} conflicts.\n\n"
            "| dump | values (timed) | allocations | async windows | conflicts | live-range disagreements | s |\n"
            "|---|---|---|---|---|---|---|\n" + "\n".join(rows) + "\n")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
