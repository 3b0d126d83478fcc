"""Pairwise (all-pairs) designs: a few configurations in which every pair of values of every two
factors appears together at least once.

The report of jax-ml/jax#35409 leaves several details of the program open (where jit sits,
donation, the parameters' dtype, the embedding's partition spec, the dots' precision, the weights'
specs, the mesh's axis types); compiling every combination costs thousands of full-size compiles,
one at a time each a few minutes. A pairwise design covers every interaction of two of them in a
number of cells close to the product of the two largest level counts (the lower bound: those two
factors alone need that many). It covers no interaction of three or more.

:func:`pairwise` builds the design (in-parameter-order growth: the product of the two largest
factors, then one factor at a time, each new column filled greedily to cover the most missing
pairs, new rows only for the pairs still missing, a few seeded tie-break orders tried and the
smallest design kept); :func:`missing_pairs` checks one. Pure functions: a design is a list of
``{factor: level}``; the same factors give the same design.

``python -m xla_harness.stress.report.pairs`` prints the #35409 design (:data:`ISSUE_35409_FACTORS`), one
cell a line as ``KEY=VALUE`` words, after checking every cell's options (``make tpu-pairs``).
"""

from __future__ import annotations

import itertools
import random
import sys
from collections.abc import Mapping, Sequence

from xla_harness.errors import HarnessError

Design = list[dict[str, str]]

# The report's unknowns, as options of the #35409 program (issue_35409.make), each level as the
# command line writes it (--program-option KEY=VALUE); the first level is the program's default.
# embed_spec: the default and the four specs make tpu-sweep compiled.
ISSUE_35409_FACTORS: dict[str, tuple[str, ...]] = {
    "jit": ("step", "bare", "nested"),
    "donate": ("True", "False"),
    "dtype": ("f32", "bf16"),
    "embed_spec": ("model,data", "data,model", "model,none", "none,data", "none,none"),
    "precision": ("default", "high", "highest"),
    "specs": ("report", "ours"),
    "axis_types": ("auto", "explicit"),
}


def _check_factors(factors: Mapping[str, Sequence[str]]) -> list[str]:
    names = list(factors)
    if len(names) < 2:
        raise HarnessError(f"a pairwise design needs at least two factors, got {len(names)}")
    for name in names:
        levels = list(factors[name])
        if not levels:
            raise HarnessError(f"factor {name!r} has no levels")
        if len(set(levels)) != len(levels):
            raise HarnessError(f"factor {name!r} lists a level twice")
    return names


def lower_bound(factors: Mapping[str, Sequence[str]]) -> int:
    """No pairwise design has fewer cells: the two factors with the most levels need every pair."""
    counts = sorted((len(v) for v in factors.values()), reverse=True)
    return counts[0] * counts[1] if len(counts) > 1 else (counts[0] if counts else 0)


def missing_pairs(factors: Mapping[str, Sequence[str]], design: Sequence[Mapping[str, str]]) \
        -> list[tuple[str, str, str, str]]:
    """Every ``(factor a, level, factor b, level)`` that no cell of ``design`` holds (a before b in
    the factors' order); [] for a pairwise design. A cell's factor outside its levels is an error."""
    names = _check_factors(factors)
    for i, cell in enumerate(design):
        for name in names:
            if cell.get(name) not in factors[name]:
                raise HarnessError(f"cell {i + 1} gives factor {name!r} the value {cell.get(name)!r}, not one of "
                                   f"its levels")
    seen = {(a, cell[a], b, cell[b]) for cell in design for a, b in itertools.combinations(names, 2)}
    return [(a, u, b, v) for a, b in itertools.combinations(names, 2)
            for u in factors[a] for v in factors[b] if (a, u, b, v) not in seen]


def _gain(row: list[int | None], k: int, v: int, missing: set[tuple[int, int | None, int]]) -> int:
    """How many missing pairs level ``v`` of factor ``k`` covers in ``row``."""
    return sum((j, row[j], v) in missing for j in range(k) if row[j] is not None)


def _grow(levels: list[int], rng: random.Random | None) -> list[list[int | None]]:
    """In-parameter-order growth over factors with ``levels`` counts (largest first): rows of level
    indices, None where any level will do."""
    rows: list[list[int | None]] = [[a, b] for a in range(levels[0]) for b in range(levels[1])]
    for k in range(2, len(levels)):
        missing: set[tuple[int, int | None, int]] = {
            (j, u, v) for j in range(k) for u in range(levels[j]) for v in range(levels[k])}
        # Horizontal: each row gets the level of factor k that covers the most missing pairs.
        for row in rows:
            order = list(range(levels[k]))
            if rng is not None:
                rng.shuffle(order)
            gains = [_gain(row, k, v, missing) for v in order]
            best = order[gains.index(max(gains))]
            row.append(best)
            missing -= {(j, row[j], best) for j in range(k) if row[j] is not None}
        # Vertical: the pairs still missing go into rows with free places, or into new rows.
        for j, u, v in sorted(missing):
            for row in rows:
                if row[k] in (None, v) and row[j] in (None, u) and None in (row[k], row[j]):
                    row[k], row[j] = v, u
                    break
            else:
                new: list[int | None] = [None] * (k + 1)
                new[j], new[k] = u, v
                rows.append(new)
    return rows


def _level(i: int | None) -> int:
    return 0 if i is None else i  # any level would do: the first (the factor's default)


def pairwise(factors: Mapping[str, Sequence[str]], tries: int = 64, seed: int = 0) -> Design:
    """A pairwise design over ``factors`` (name -> levels): every pair of levels of every two
    factors in some cell. The smallest of ``tries`` seeded constructions (the first deterministic);
    places any level would do take the factor's first level (its default). Cells in a stable order
    (by the factors' order and their levels' order)."""
    names = _check_factors(factors)
    by_size = sorted(names, key=lambda n: -len(factors[n]))  # stable: ties keep the given order
    counts = [len(factors[n]) for n in by_size]
    rng = random.Random(seed)
    best: list[list[int | None]] | None = None
    for t in range(max(1, tries)):
        rows = _grow(counts, None if t == 0 else rng)
        if best is None or len(rows) < len(best):
            best = rows
        if len(best) == lower_bound(factors):
            break
    assert best is not None
    index = {n: i for i, n in enumerate(by_size)}
    cells = [tuple(_level(row[index[n]]) for n in names) for row in best]
    return [{n: factors[n][i] for n, i in zip(names, cell, strict=True)} for cell in sorted(cells)]


def cell_words(cell: Mapping[str, str]) -> str:
    """A cell as ``KEY=VALUE`` words (make tpu-pairs passes each as ``--program-option``)."""
    return " ".join(f"{k}={v}" for k, v in cell.items())


def _option_value(text: str):
    import ast

    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def check_issue_35409_cells(design: Sequence[Mapping[str, str]], fixed: Mapping[str, str]) -> None:
    """Every cell's options (with the ``fixed`` ones, e.g. mode and remat) are options the #35409
    program takes, with valid values; HarnessError naming the first cell that is not."""
    from xla_harness.programs import issue_35409

    for i, cell in enumerate(design):
        options = {k: _option_value(v) for k, v in {**fixed, **cell}.items()}
        try:
            issue_35409.check_options(**options)
        except HarnessError as exc:
            raise HarnessError(f"pairs cell {i + 1} ({cell_words(cell)}): {exc}") from None


def main(argv: list[str] | None = None) -> int:
    """Print the #35409 design, one cell a line, after checking every cell (exit 2 and one
    ``error:`` line if one is not valid). ``--fixed KEY=VALUE ...`` adds options to every cell (checked
    with them); ``--summary`` prints the factors, the cell count and the lower bound instead."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m xla_harness.stress.report.pairs", description=main.__doc__)
    p.add_argument("--fixed", nargs="*", default=[], metavar="KEY=VALUE")
    p.add_argument("--summary", action="store_true")
    args = p.parse_args(argv)
    try:
        fixed = {}
        for word in args.fixed:
            key, sep, value = word.partition("=")
            if not sep or not key:
                raise HarnessError(f"--fixed takes KEY=VALUE words, got {word!r}")
            if key in ISSUE_35409_FACTORS:
                raise HarnessError(f"--fixed {key}=...: {key} is a factor of the design")
            fixed[key] = value
        design = pairwise(ISSUE_35409_FACTORS)
        if missing_pairs(ISSUE_35409_FACTORS, design):
            raise HarnessError("internal: the design misses a pair")
        check_issue_35409_cells(design, fixed)
    except HarnessError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.summary:
        for name, levels in ISSUE_35409_FACTORS.items():
            print(f"{name}: {', '.join(levels)}")
        print(f"{len(design)} cells; lower bound {lower_bound(ISSUE_35409_FACTORS)}")
        return 0
    for cell in design:
        print(cell_words(cell))
    return 0


if __name__ == "__main__":
    sys.exit(main())
