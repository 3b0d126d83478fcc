"""The harness's cost counters (:class:`~xla_harness.stress.proof.harness.Counters`) are counted where the
work happens, never by hand: every function of the harness's own is wrapped once (each call one
dispatch), every device read goes through the counters' fetch/wait/to_host, and the block loop, which
calls the step and the row unwrapped, tells ``Counters.made`` what it called (held to a log of the
calls in tests/stress/proof/test_new_signature.py). A scan of the stress package finds no increment
of a counter outside :class:`Counters` (a planted one is caught), and the wrapping counts each call
once, also for a configuration copied with ``dataclasses.replace``."""

from __future__ import annotations

import ast
from dataclasses import replace
from pathlib import Path

import jax.numpy as jnp

from xla_harness.stress.proof.harness import Counted, Counters, prepare
from xla_harness.stress.spec import StressSpec

from ..helpers import TINY

STRESS = Path(__file__).resolve().parents[2] / "xla_harness" / "stress"
FIELDS = {"host_syncs", "d2h_bytes", "dispatches"}


def hand_counts(source: str) -> list[int]:
    """Lines that change a counter (``x.dispatches += 1``, ``x.host_syncs = ...``) outside the counting
    mechanism itself (the classes Counters and Counted, and Harnessed.call_step, the one call of the
    user's step)."""
    found: list[int] = []

    def visit(node: ast.AST, inside: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                visit(child, inside or child.name in ("Counters", "Counted"))
                continue
            if isinstance(child, ast.FunctionDef) and child.name == "call_step":
                visit(child, True)
                continue
            targets = child.targets if isinstance(child, ast.Assign) else \
                [child.target] if isinstance(child, ast.AugAssign | ast.AnnAssign) else []
            if not inside and any(isinstance(t, ast.Attribute) and t.attr in FIELDS for t in targets):
                found.append(child.lineno)
            visit(child, inside)

    visit(ast.parse(source), False)
    return found


def test_no_counter_is_incremented_by_hand_in_the_stress_package():
    files = sorted(STRESS.rglob("*.py"))
    assert len(files) > 20
    assert {str(p.relative_to(STRESS)): hand_counts(p.read_text()) for p in files if hand_counts(p.read_text())} == {}


def test_a_planted_hand_count_is_caught():
    planted = "def run(h):\n    h.call_step()\n    h.counters.dispatches += 1\n"
    assert hand_counts(planted) == [3]
    assert hand_counts("class Counters:\n    def f(self):\n        self.dispatches += 1\n") == []


def test_each_call_of_a_harness_function_is_one_dispatch_and_replace_does_not_count_twice():
    spec = StressSpec(modes=("full",), remats=(True,), seeds=(1,), steps=2, **TINY)
    h = prepare(spec, {"mode": "full", "remat": True})
    assert all(isinstance(f, Counted) for f in (h.checker, h.commit, h.state_check, h.write_row, h.copy))
    before = h.counters.dispatches
    h.copy((jnp.ones(3),))
    h.state_check((jnp.ones(3),), ())
    assert h.counters.dispatches == before + 2
    again = replace(h, label="again")
    assert again.counters is h.counters
    assert not any(isinstance(f.fn, Counted) for f in (again.checker, again.commit, again.copy, again.write_row))
    again.copy((jnp.ones(3),))
    assert h.counters.dispatches == before + 3
    counters = Counters()
    assert counters.counted(h.copy) is not h.copy  # another run's counters: counted there too
