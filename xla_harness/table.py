"""Plain-text tables: left-aligned columns two spaces apart, trailing blanks stripped.

The one table formatter of the package (scan findings, gradcheck verdicts and cross-framework
grids, stress rate tables); a leaf module, importing nothing of the package.
"""

from __future__ import annotations

from collections.abc import Sequence

SEP = "  "


def printable(text: str) -> str:
    """``text`` with what no UTF-8 stream can carry (a lone surrogate such as ``\\udc80``, from a JSON
    escape in an input file) written as a backslash escape, so a table of such a label prints."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def format_rows(rows: Sequence[Sequence[str]], header: Sequence[str] | None = None, indent: str = "",
                rule: bool = True) -> list[str]:
    """The lines of a table: ``header`` (when given) and then ``rows``, each cell padded to its
    column's widest cell, each line prefixed by ``indent`` and stripped of trailing blanks; every cell
    through :func:`printable`.

    With a header and ``rule``, a line of dashes as wide as each column follows the header.
    Every row has as many cells as the header (ValueError otherwise)."""
    lines = [[printable(c) for c in r] for r in ([header] if header is not None else []) + list(rows)]
    if not lines:
        return []
    ncols = len(lines[0])
    if any(len(r) != ncols for r in lines):
        raise ValueError(f"table rows have {sorted({len(r) for r in lines})} cells; expected {ncols} in every row")
    widths = [max(len(r[i]) for r in lines) for i in range(ncols)]
    out = [indent + SEP.join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in lines]
    if header is not None and rule:
        out.insert(1, indent + SEP.join("-" * w for w in widths))
    return out
