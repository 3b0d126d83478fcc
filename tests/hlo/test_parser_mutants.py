"""Generated mutants of real HLO text, read by our reader and by XLA's parser (in a child
process): no mutant XLA rejects may be accepted by ours with a different scan answer.

The mutations are the edits that went unnoticed before: a deleted line (a ROOT line among
them), a name defined twice, two operands swapped, a parameter renumbered. The sample is
drawn with a fixed seed, so every run checks the same mutants.
"""

from __future__ import annotations

import random
import re
from collections import Counter
from pathlib import Path

import pytest

from xla_harness import jaxcompat
from xla_harness.hlo.lexer import split_top
from xla_harness.hlo.parser import HloParseError, parse_module
from xla_harness.hlo.scan import scan
from xla_harness.hlo.xla_oracle import IsolatedXlaParser

ROOT = Path(__file__).resolve().parents[2]
# Real compiler output and the hand-written fixtures (which are the XLA patch's tests too).
SOURCES = sorted((ROOT / "tests/hlo").rglob("*.hlo")) + [ROOT / "tests/data/tied_sources.hlo",
                                                          ROOT / "results/cpu/scan/tied_embedding_full_remat_on.hlo"]
PER_KIND = {"delete-line": 4, "duplicate-name": 2, "swap-operands": 2, "renumber-parameter": 2}
BIG = 2000  # lines; a module this long gets one mutant of each kind (its reading costs the most)

_DEF = re.compile(r"^(\s*(?:ROOT\s+)?%?)([A-Za-z_][\w.\-]*)(\s*=\s*)")
_PARAM = re.compile(r"parameter\((\d+)\)")


def _definitions(lines: list[str]) -> list[tuple[int, int]]:
    """(line index, computation number) of each instruction definition."""
    out, comp = [], -1
    for k, line in enumerate(lines):
        if line.rstrip().endswith("{") and not line.startswith(" "):
            comp += 1
        elif _DEF.match(line) and line.startswith(" "):
            out.append((k, comp))
    return out


def _operand_span(line: str) -> tuple[int, int] | None:
    """Start and end of the operand list of a one-line instruction, None when it has none."""
    m = re.search(r"\s([a-z][a-z0-9\-]*)\(", line[line.find("=") + 1:])
    if m is None:
        return None
    start = line.find("=") + 1 + m.end()
    depth = 1
    for k in range(start, len(line)):
        depth += {"(": 1, ")": -1}.get(line[k], 0)
        if depth == 0:
            return start, k
    return None


def mutants(text: str, rng: random.Random, per_kind: dict[str, int],
            out_of_range: bool = True) -> list[tuple[str, str]]:
    """(kind, mutated text) pairs, drawn with ``rng``; a renumbered parameter takes another's
    number, or (``out_of_range``) one past the last."""
    lines = text.split("\n")
    defs = _definitions(lines)
    out: list[tuple[str, str]] = []

    def emit(kind: str, k: int, new: str | None) -> None:
        edited = lines[:k] + ([] if new is None else [new]) + lines[k + 1:]
        out.append((kind, "\n".join(edited)))

    content = [k for k, line in enumerate(lines) if line.strip() and not line.startswith("HloModule")]
    roots = [k for k, _ in defs if lines[k].lstrip().startswith("ROOT")]
    picks = rng.sample(roots, min(len(roots), per_kind["delete-line"] // 2))
    picks += rng.sample(content, per_kind["delete-line"] - len(picks))
    for k in picks:
        emit("delete-line", k, None)
    same_comp = [(a, b) for (a, ca), (b, cb) in zip(defs, defs[1:], strict=False) if ca == cb]
    for a, b in rng.sample(same_comp, min(len(same_comp), per_kind["duplicate-name"])):
        name = _DEF.match(lines[a]).group(2)
        emit("duplicate-name", b, _DEF.sub(lambda m, name=name: m.group(1) + name + m.group(3), lines[b], count=1))
    swappable = []
    for k, _ in defs:
        span = _operand_span(lines[k])
        if span and len(split_top(lines[k][span[0]:span[1]])) >= 2:
            swappable.append((k, span))
    for k, (s, e) in rng.sample(swappable, min(len(swappable), per_kind["swap-operands"])):
        parts = split_top(lines[k][s:e])
        i, j = rng.sample(range(len(parts)), 2)
        parts[i], parts[j] = parts[j], parts[i]
        parts = [p.strip() for p in parts]
        emit("swap-operands", k, lines[k][:s] + ", ".join(parts) + lines[k][e:])
    params = [(k, c, int(_PARAM.search(lines[k]).group(1))) for k, c in defs if _PARAM.search(lines[k])]
    for n_made, (k, comp, n) in enumerate(rng.sample(params, min(len(params), per_kind["renumber-parameter"]))):
        taken = sorted(m for _, c, m in params if c == comp and m != n)
        if n_made == 0 and taken:  # a number taken by another parameter
            new = rng.choice(taken)
        elif out_of_range:  # one past the last (XLA's parser aborts the process on this one)
            new = len(taken) + 1
        else:
            continue
        emit("renumber-parameter", k, _PARAM.sub(f"parameter({new})", lines[k], count=1))
    return out


def _answer(text: str, name: str) -> tuple | None:
    """The scan's answer on a text our reader accepts, None when it rejects it."""
    try:
        module = parse_module(text, name)
    except HloParseError:
        return None
    findings, decisions, backend = scan(module)
    return backend, [f.to_json() for f in findings], [d.to_json() for d in decisions]


def test_mutant_generator_makes_each_kind_of_edit():
    text = (ROOT / "tests/hlo/transpose_moves_data.hlo").read_text()
    made = mutants(text, random.Random(1), {"delete-line": 2, "duplicate-name": 1, "swap-operands": 1,
                                            "renumber-parameter": 1})
    kinds = Counter(kind for kind, _ in made)
    assert kinds == {"delete-line": 2, "duplicate-name": 1, "swap-operands": 1, "renumber-parameter": 1}
    for kind, mutant in made:
        assert mutant != text, kind
        diff = [(a, b) for a, b in zip(text.split("\n"), mutant.split("\n"), strict=False) if a != b]
        if kind != "delete-line":
            assert len(diff) == 1 and len(mutant.split("\n")) == len(text.split("\n")), kind
    dup = next(m for kind, m in made if kind == "duplicate-name")
    with pytest.raises(HloParseError, match="used twice"):
        parse_module(dup)


@pytest.mark.slow
@pytest.mark.skipif(not jaxcompat.xla_hlo_reads_structure(),
                    reason="not checked: this jaxlib does not expose XLA's parsed HLO (jaxlib >= 0.12 does)")
def test_no_mutant_xla_rejects_is_accepted_with_a_different_answer():
    rng = random.Random(24)
    cases = []
    for n, path in enumerate(SOURCES):
        text = path.read_text()
        per_kind = PER_KIND if text.count("\n") < BIG else dict.fromkeys(PER_KIND, 1)
        # each number out of range costs a fresh child (XLA's parser aborts it): a few of them
        made = mutants(text, rng, per_kind, out_of_range=n % 6 == 0)
        cases += [(path, kind, mutant) for kind, mutant in made]
    assert len(cases) >= 150
    table: Counter = Counter()
    changed = []
    with IsolatedXlaParser(timeout=120) as xla:
        for path, kind, mutant in cases:
            xla_verdict = xla.parse(mutant, structure=False)
            answer = _answer(mutant, path.name)
            ours = answer is not None
            table[kind, "xla-crashed" if xla_verdict.crashed else "xla-accepts" if xla_verdict.accepts
                  else "xla-rejects", "ours-accepts" if ours else "ours-rejects"] += 1
            if ours and not xla_verdict.accepts and answer != _answer(path.read_text(), path.name):
                changed.append((path.name, kind, xla_verdict.crashed or xla_verdict.error))
    agree = sum(n for (_, x, o), n in table.items() if (x == "xla-accepts") == (o == "ours-accepts"))
    summary = "\n".join(f"  {k}: {n}" for k, n in sorted(table.items()))
    print(f"\n{len(cases)} mutants of {len(SOURCES)} modules, {agree} verdicts agree with XLA's:\n{summary}")
    assert not changed, f"accepted although XLA rejects, with a different answer: {changed}\n{summary}"
    # ours may refuse what XLA's parser (which does not verify shapes) takes; never the other way
    # round where the answer changes (above), and the verdicts mostly agree
    assert agree >= 0.8 * len(cases), summary
