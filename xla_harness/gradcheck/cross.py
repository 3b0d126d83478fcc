"""One registry, many frameworks: run each case in every mode of every requested framework,
judge each cell against the same references (the analytic answer, float64 central finite
differences from jax), and flag cases whose modes disagree within a framework (the TF report
is eager != XLA).

Cells: OK, NaN, WRONG, n/a (the framework lacks an op), - (mode not defined for the case,
e.g. reverse mode through an unbounded while loop), or "not installed" for a framework that
does not import.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

import numpy as np

from xla_harness.errors import HarnessError
from xla_harness.gradcheck import check
from xla_harness.gradcheck.cases import Case
from xla_harness.gradcheck.frameworks import FRAMEWORKS, Unsupported, adapter
from xla_harness.table import format_rows

FORWARD_MODES = {"jvp"}  # the only modes defined for forward-only cases
NOT_INSTALLED = "not installed"
CHECKED = ("OK", "NaN", "WRONG")  # cells that compared a gradient (not n/a, -, not installed)
AGREE_RTOL, AGREE_ATOL = 1e-5, 1e-7


@dataclass
class Cell:
    case: str
    framework: str
    mode: str
    status: str  # OK | NaN | WRONG | n/a | - | not installed
    got: list = field(default_factory=list)
    detail: str = ""


@dataclass
class Reference:
    want: np.ndarray
    mask: np.ndarray
    fd: np.ndarray
    smooth: np.ndarray
    analytic: bool


def reference(case: Case) -> Reference:
    x = np.asarray(case.points, np.float64)
    fd = check.finite_differences(case, x)
    smooth = np.asarray(case.smooth if case.smooth else (True,) * len(x))
    if case.expected is not None:
        return Reference(np.asarray(case.expected, np.float64), np.ones(len(x), bool), fd, smooth, True)
    return Reference(fd, smooth, fd, smooth, False)


def judge(got: np.ndarray, ref: Reference) -> tuple[str, str]:
    """OK / NaN / WRONG against the analytic answer and, where smooth, finite differences."""
    status, detail = check.compare(got, ref.want, ref.mask)
    if status == "OK" and ref.analytic and np.any(ref.smooth):
        fd_status, _ = check.compare(got, ref.fd, ref.smooth)
        if fd_status != "OK":
            return fd_status, "differs from finite differences"
    return status, detail


def _cell(case: Case, fw, mode: str, ref: Reference) -> Cell:
    if not case.reverse and mode not in FORWARD_MODES:
        return Cell(case.name, fw.NAME, mode, "-", detail="reverse mode not defined")
    try:
        got = np.asarray(fw.gradient(case, mode, np.asarray(case.points, np.float64)), np.float64)
    except Unsupported as exc:
        return Cell(case.name, fw.NAME, mode, "n/a", detail=str(exc))
    except Exception as exc:  # a failing transformation is a finding, not a crash
        return Cell(case.name, fw.NAME, mode, "WRONG", detail=f"raised {type(exc).__name__}: {exc}"[:200])
    status, detail = judge(got, ref)
    return Cell(case.name, fw.NAME, mode, status, got.tolist(), detail)


def disagreements(cells: list[Cell]) -> list[str]:
    """'fw: a!=b,c' for each framework whose modes b, c give other gradients than its first mode a."""
    out = []
    by_fw: dict[str, list[Cell]] = {}
    for c in cells:
        if c.got:
            by_fw.setdefault(c.framework, []).append(c)
    for fw, cs in by_fw.items():
        first = np.asarray(cs[0].got)
        differ = [c.mode for c in cs[1:]
                  if not np.allclose(first, np.asarray(c.got), rtol=AGREE_RTOL, atol=AGREE_ATOL, equal_nan=True)]
        if differ:
            out.append(f"{fw}: {cs[0].mode}!={','.join(differ)}")
    return out


def parse_frameworks(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise HarnessError("--framework needs at least one of " + ", ".join(FRAMEWORKS))
    for n in names:
        if n not in FRAMEWORKS:
            raise HarnessError(f"unknown framework {n!r}; expected one of {', '.join(FRAMEWORKS)}")
    return names


@dataclass
class Result:
    frameworks: list[str]
    columns: list[tuple[str, str]]  # (framework, mode); mode "" for a framework not installed
    cells: list[Cell]
    versions: dict[str, str]
    cases: list[str]


def run(cases: list[Case], frameworks: list[str]) -> Result:
    fws, columns, versions = [], [], {}
    for name in frameworks:
        fw = adapter(name)
        why = fw.available()
        if why:
            versions[name] = f"{NOT_INSTALLED}: {why}"
            columns.append((name, ""))
            continue
        versions[name] = fw.version()
        fws.append(fw)
        columns.extend((name, m) for m in fw.modes())
    if not fws:  # every column 'not installed': a table that checks nothing is not a pass
        raise HarnessError("nothing checked: none of the frameworks named is installed ("
                           + "; ".join(f"{k} {v}" for k, v in versions.items()) + ")")
    cells = []
    for case in cases:
        ref = reference(case)
        for name in frameworks:
            if versions[name].startswith(NOT_INSTALLED):
                cells.append(Cell(case.name, name, "", NOT_INSTALLED))
        for fw in fws:
            cells.extend(_cell(case, fw, mode, ref) for mode in fw.modes())
    if not any(c.status in CHECKED for c in cells):
        raise HarnessError(f"nothing checked: every cell of the cases selected ({', '.join(c.name for c in cases)}) "
                           "is n/a, not installed or not defined in the frameworks' modes")
    return Result(frameworks, columns, cells, versions, [c.name for c in cases])


def failing(result: Result) -> list[Cell]:
    return [c for c in result.cells if c.status in ("NaN", "WRONG")]


def table(result: Result) -> str:
    grid: dict[str, dict[tuple[str, str], Cell]] = {}
    for c in result.cells:
        grid.setdefault(c.case, {})[(c.framework, c.mode)] = c
    head = ["case", *(f"{fw}:{m}" if m else fw for fw, m in result.columns), "modes disagree"]
    rows = []
    n_disagree = 0
    for name in result.cases:
        row = grid[name]
        dis = disagreements(list(row.values()))
        n_disagree += bool(dis)
        rows.append([name, *(row[col].status if col in row else "" for col in result.columns),
                     "; ".join(dis) or "-"])
    lines = format_rows(rows, header=head)
    lines.append(f"{len(result.cases)} cases, {len(failing(result))} failing cells, "
                 f"{n_disagree} cases whose modes disagree")
    lines.append("versions: " + ", ".join(f"{k} {v}" for k, v in result.versions.items()))
    return "\n".join(lines)


def to_json(result: Result) -> str:
    return json.dumps({"versions": result.versions, "columns": [list(c) for c in result.columns],
                       "cells": [asdict(c) for c in result.cells]}, indent=2)
