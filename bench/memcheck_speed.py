"""memcheck's speed on the largest committed TPU dump (or any module with its buffer assignment beside
it), against jaxlib's C++ HLO parser reading the same module: rounds interleaved, process CPU time,
jaxlib's parse in a child process (its CHECK failures abort a process; libtpu's scheduled dumps are
read unscheduled, as bench/scan_speed.py does). memcheck's figure is everything it does: reading the
module and the buffer assignment, the timeline, the buffers and every check.
Target (#55): the largest TPU dump in at most 3 s on one core, with the input checks (#44: 10 s).

    python bench/memcheck_speed.py [--module FILE] [--repeat 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from scan_speed import unscheduled  # noqa: E402

from xla_harness.errors import HarnessError  # noqa: E402
from xla_harness.hlo.memplan import check_files, read_text  # noqa: E402
from xla_harness.hlo.xla_oracle import IsolatedXlaParser  # noqa: E402

TARGET_S = 3.0


def largest_tpu_dump() -> Path | None:
    found = sorted(ROOT.glob("results/tpu-aot/**/hlo/*.after_optimizations.txt.gz"), key=lambda p: p.stat().st_size)
    return found[-1] if found else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--module", type=Path, help="default: the largest committed TPU dump")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    module = args.module or largest_tpu_dump()
    if module is None or args.repeat < 1:
        print("error: no module (give --module) or --repeat < 1", file=sys.stderr)
        return 2
    try:
        text = read_text(module)
        report = check_files(module)
    except HarnessError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    ours, theirs = [], []
    with IsolatedXlaParser() as xla:
        first = xla.parse(text, structure=False)
        if not first.accepts:
            first = xla.parse(unscheduled(text), structure=False)
        if not first.accepts:
            print(f"error: XLA's parser does not read {module}: {first.crashed or first.error}", file=sys.stderr)
            return 2
        for _ in range(args.repeat):
            c0 = time.process_time()
            check_files(module)
            ours.append(time.process_time() - c0)
            again = xla.parse(None, structure=False)
            theirs.append(again.cpu_s)
    print(f"{module.relative_to(ROOT) if module.is_relative_to(ROOT) else module}: {report.values} values, "
          f"{report.allocations} allocations, {report.async_windows} async windows, {len(report.conflicts)} conflicts")
    print(f"memcheck: {min(ours):.2f} s CPU (best of {args.repeat}; target <= {TARGET_S:.0f} s)")
    print(f"jaxlib C++ parse of the module alone: {min(theirs):.2f} s CPU")
    ratios = sorted(a / b for a, b in zip(ours, theirs, strict=True))
    print(f"memcheck / C++ parse, each round: median {statistics.median(ratios):.2f}, range "
          f"{ratios[0]:.2f}-{ratios[-1]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
