"""The blast radius of the default series (make xla-blast-radius): the fusion decisions the
probe (xlatest_tools/fusion_decisions.cc) prints for stock and patched sources, compared."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from xla_harness.errors import HarnessError

PROBE_SOURCE = Path(__file__).resolve().parent / "xlatest_tools" / "fusion_decisions.cc"


@dataclass(frozen=True)
class BlastRadius:
    modules: int  # module files read
    modules_with_pairs: int  # modules with at least one in-place candidate pair
    pairs: int  # (producer, in-place consumer) pairs evaluated
    changed: tuple[tuple[str, str, str, str, str], ...]  # (module, consumer, producer, stock, patched)


def parse_decisions(output: str) -> dict[tuple[str, str, str], str]:
    """Lines "file<TAB>consumer<TAB>producer<TAB>allow|forbid" from the probe."""
    out: dict[tuple[str, str, str], str] = {}
    for line in output.splitlines():
        parts = line.split("\t")
        if len(parts) == 4 and parts[3] in ("allow", "forbid"):
            out[(parts[0], parts[1], parts[2])] = parts[3]
    return out


def refused_modules(stderr: str) -> list[tuple[str, str]]:
    """(file, why) of each module the probe could not read or parse (its stderr lines
    "unreadable|unparsable<TAB>file[<TAB>parser message]")."""
    out = []
    for line in stderr.splitlines():
        parts = line.split("\t")
        if len(parts) >= 2 and parts[0] in ("unreadable", "unparsable"):
            out.append((parts[1], parts[2] if len(parts) > 2 else parts[0]))
    return out


def compare_decisions(stock_output: str, patched_output: str, modules: int) -> BlastRadius:
    stock, patched = parse_decisions(stock_output), parse_decisions(patched_output)
    if set(stock) != set(patched):
        raise HarnessError("the stock and patched probes evaluated different pairs; the runs are not comparable")
    changed = tuple(sorted((Path(f).name, c, p, stock[(f, c, p)], patched[(f, c, p)])
                           for (f, c, p) in stock if stock[(f, c, p)] != patched[(f, c, p)]))
    return BlastRadius(modules, len({f for f, _, _ in stock}), len(stock), changed)
