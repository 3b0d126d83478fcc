"""Nothing in xla_harness/stress is assigned to an object after construction from another module:
every attribute written outside ``self`` is one of an object whose class the writing module defines
(a record it is building, its own small state), listed here with that class; a new write elsewhere
(the loop writing the seed's state, a protocol writing the rollback's records) fails this test, and
a planted one shows it does."""

from __future__ import annotations

import ast
from pathlib import Path

STRESS = Path(__file__).resolve().parents[2] / "xla_harness" / "stress"

# module -> {the written object: the class, defined in that module, it is an instance of}
OWN_OBJECTS = {
    "loop/restore.py": {"out": "Recomputed"},  # a recompute's result, filled in as it runs
    "loop/steps.py": {"own": "_Checked"},  # the per-step run's backup copy and first call
    "proof/harness.py": {"self.counters": "Counters"},  # Counted counts a dispatch a call
    "report/summary.py": {"row": "Row", "table": "Table"},  # the table being summed up
}


def foreign_writes(source: str) -> dict[str, set[int]]:
    """The objects other than ``self``/``cls`` that ``source`` assigns attributes of, with the lines."""
    out: dict[str, set[int]] = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        else:
            continue
        flat = [e for t in targets for e in (t.elts if isinstance(t, ast.Tuple) else [t])]
        for t in flat:
            if isinstance(t, ast.Attribute) and not (isinstance(t.value, ast.Name) and t.value.id in ("self", "cls")):
                out.setdefault(ast.unparse(t.value), set()).add(node.lineno)
    return out


def _classes(source: str) -> set[str]:
    return {n.name for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ClassDef)}


def test_attributes_are_written_only_on_objects_of_the_writing_modules_own_classes():
    files = sorted(STRESS.rglob("*.py"))
    assert len(files) > 30
    found = {str(p.relative_to(STRESS)): w for p in files if (w := foreign_writes(p.read_text()))}
    assert {m: sorted(w) for m, w in found.items()} == {m: sorted(o) for m, o in OWN_OBJECTS.items()}
    for module, objects in OWN_OBJECTS.items():
        assert set(objects.values()) <= _classes((STRESS / module).read_text()), module


def test_a_planted_write_from_another_module_is_caught():
    planted = "def advance(state, params):\n    state.params = params\n    state.next_step += 1\n"
    assert foreign_writes(planted) == {"state": {2, 3}}
    assert foreign_writes("class A:\n    def f(self):\n        self.x = 1\n") == {}
    blocks = (STRESS / "loop" / "blocks.py").read_text()
    assert "state" not in foreign_writes(blocks)
    assert foreign_writes(blocks + "\n\ndef planted(state):\n    state.next_step = 0\n") == {"state": {
        len(blocks.splitlines()) + 4}}
