#!/usr/bin/env python3
"""What the dots' matmul precision changes in compiled programs: a table of compile records
(results/tpu-aot/*/jaxPIN) and how each record's optimized HLO differs from the one before it.

    python tools/precision_diff.py FOLDER[@N]...

One Markdown row per record, in the order given (``@N``: only the folder's N-th record): its
precision option, instructions, temp bytes, the convolutions (the dots, as libtpu prints them) with
their ``operand_precision``, the converts (every computation), libtpu's own cycle estimate
(``estimated_cycles`` in ``backend_config`` summed once per instruction, loops not unrolled; the
value libtpu writes for "unknown", INT64_MAX, left out and counted), the lines whose text differs
from the HLO of the row above (metadata masked), and how many still differ once each dot's
``operand_precision`` and every ``backend_config`` are masked too: 0 there means the same graph
(instructions, shapes, layouts, fusions, operands, line for line), the two programs differing only
in the dots' precision and libtpu's lowering of each instruction. Records are read as
tools/aliased_writes.py reads them (and refused the same way: one error line, exit 2)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from aliased_writes import hlo_text, json_kind, read_records  # noqa: E402 - the tools folder, put on the path above

UNKNOWN_CYCLES = 2**63 - 1
_METADATA = re.compile(r", metadata=\{[^}]*\}")
_PRECISION = re.compile(r"operand_precision=\{[^}]*\}")
_CYCLES = re.compile(r'"estimated_cycles":"(\d+)"')


def _without_backend_config(line: str) -> str:
    """The line with every ``, backend_config=`` value (a JSON object or a quoted string) cut out."""
    key = ", backend_config="
    while (start := line.find(key)) >= 0:
        i = start + len(key)
        depth, in_string = 0, False
        while i < len(line):
            c = line[i]
            if in_string:
                if c == "\\":
                    i += 1
                elif c == '"':
                    in_string = False
                    if depth == 0:
                        break
            elif c == '"':
                in_string = True
            elif c == "{":
                depth += 1
            elif c == "}":
                depth -= 1
                if depth == 0:
                    break
            i += 1
        line = line[:start] + line[i + 1:]
    return line


def hlo_lines(text: str, *, mask_lowering: bool) -> list[str]:
    """The HLO's lines with metadata masked; with ``mask_lowering`` also each dot's precision and every
    backend_config."""
    lines = [_METADATA.sub("", line) for line in text.splitlines()]
    if mask_lowering:
        lines = [_without_backend_config(_PRECISION.sub("operand_precision={}", line)) for line in lines]
    return lines


def differing_lines(a: list[str], b: list[str]) -> int:
    """Lines that differ position by position, plus the difference in length."""
    return sum(x != y for x, y in zip(a, b, strict=False)) + abs(len(a) - len(b))


def hlo_counts(text: str) -> dict:
    convolutions = [line for line in text.splitlines() if " convolution(" in line]
    precisions: dict[str, int] = {}
    for line in convolutions:
        found = _PRECISION.search(line)
        key = found.group(0).split("=", 1)[1] if found else "none"
        precisions[key] = precisions.get(key, 0) + 1
    cycles = [int(v) for v in _CYCLES.findall(text)]
    return {"convolutions": len(convolutions), "precisions": precisions,
            "converts": sum(" convert(" in line for line in text.splitlines()),
            "cycles": sum(v for v in cycles if v != UNKNOWN_CYCLES),
            "unknown_cycles": sum(v == UNKNOWN_CYCLES for v in cycles)}


Record = tuple[str, Path, dict]  # where (compile.jsonl:N), folder, record


def _records(arg: str) -> list[Record]:
    folder, at, n = arg.rpartition("@") if "@" in arg else (arg, "", "")
    records = [(f"{path / 'compile.jsonl'}:{i}", path, rec) for i, (path, rec) in enumerate(read_records([folder]), 1)]
    if not at:
        return records
    if not n.isdigit() or not 1 <= int(n) <= len(records):
        raise ValueError(f"{arg}: {folder}/compile.jsonl has records 1 to {len(records)}")
    return [records[int(n) - 1]]


def _integer(where: str, fingerprint: dict, key: str) -> int:
    if key not in fingerprint:
        raise ValueError(f"{where}: no fingerprint.{key}")
    value = fingerprint[key]
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{where}: fingerprint.{key} is {json_kind(value)}, not an integer")
    return value


def _versions(where: str, rec: dict) -> dict:
    versions = rec.get("versions", {})
    if not isinstance(versions, dict):
        raise ValueError(f"{where}: versions is {json_kind(versions)}, not an object")
    return versions


def _row(record: Record, above: tuple[list[str], list[str]] | None) -> tuple[list[str], tuple[list[str], list[str]]]:
    """The record's cells, and its HLO's lines (plain, masked) for the row below; ValueError naming the
    record, or the HLO file, that does not hold what a row needs."""
    where, folder, rec = record
    instructions = _integer(where, rec["fingerprint"], "instructions")
    temp = _integer(where, rec["fingerprint"], "temp_size_in_bytes")
    versions = _versions(where, rec)
    try:
        text = hlo_text(folder, rec)
    except ValueError as exc:
        raise ValueError(f"{where}: hlo {exc}") from None
    plain, masked = hlo_lines(text, mask_lowering=False), hlo_lines(text, mask_lowering=True)
    counts = hlo_counts(text)
    precisions = ", ".join(f"{n} {p}" for p, n in sorted(counts["precisions"].items()))
    cells = [f"{versions.get('jax', '?')} / {versions.get('libtpu', '?')}",
             str(rec["options"].get("precision", "default")), f"{instructions:,}", f"{temp / 1e9:.2f} GB",
             f"{counts['convolutions']} ({precisions})", str(counts["converts"]),
             f"{counts['cycles']:,} ({counts['unknown_cycles']})",
             *(("", "") if above is None else (str(differing_lines(above[0], plain)),
                                                str(differing_lines(above[1], masked))))]
    return cells, (plain, masked)


def _table(argv: list[str]) -> list[list[str]]:
    """Every row, read before any is printed: a bad record leaves no half table."""
    rows, above = [], None
    for record in [rec for arg in argv for rec in _records(arg)]:
        cells, above = _row(record, above)
        rows.append(cells)
    return rows


def main(argv: list[str]) -> int:
    if not argv or argv[0].startswith("-"):
        print("error: usage: python tools/precision_diff.py FOLDER[@N]... (folders of compile.jsonl)", file=sys.stderr)
        return 2
    try:
        rows = _table(argv)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    header = ["jax / libtpu", "precision", "instructions", "temp", "convolutions (operand_precision)",
              "converts", "libtpu estimated cycles (unknown)", "lines differing from the row above",
              "... with precision and backend_config masked"]
    print("| " + " | ".join(header) + " |")
    print("|" + " --- |" * len(header))
    for cells in rows:
        print("| " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
