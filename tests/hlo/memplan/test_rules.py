"""Each grouping rule alone: a module where the rule makes two values one buffer. Value ``y`` is written
on the bytes of ``x`` while the entry's root still holds ``x`` (the same buffer, by the rule): with
the rule memcheck is clean, without it the two are a race. ``while`` and ``conditional`` are held
to a real XLA:CPU dump in tests/hlo/memplan/test_memcheck.py (test_each_grouping_rule_prevents_false_conflicts),
``output_to_operand_aliasing`` also to a real XLA:GPU dump below.

Mutants (each must fail a test): every entry of ``rules.RULE_FUNCTIONS`` replaced by a rule that joins
nothing: call, async, in-place, output_to_operand_aliasing, backend-aliasing and donation here
(test_a_rule_that_joins_nothing_fails_its_case); while and conditional in tests/hlo/memplan/test_memcheck.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from xla_harness.hlo.memplan import RULE_FUNCTIONS, RULES, beside, check_texts, read_text
from xla_harness.hlo.memplan import rules as rules_mod

ROOT = Path(__file__).resolve().parents[3]
HEAD = "HloModule m, is_scheduled=true{alias}\n\n{comps}ENTRY %e (p: f32[4]) -> (f32[4], f32[4]) {{\n" \
       "  %p = f32[4]{{0}} parameter(0)\n{body}}}\n"
ENTRY_X = "  %x = f32[4]{0} negate(%p)\n"
FUSED_NEG = "%fused_neg (q: f32[4]) -> f32[4] {\n  %q = f32[4]{0} parameter(0)\n  ROOT %n = f32[4]{0} negate(%q)\n}\n\n"
IDENTITY = "%identity (a: f32[4]) -> f32[4] {\n  ROOT %a = f32[4]{0} parameter(0)\n}\n\n"


def _ba(y: str, y_index: str = "") -> str:
    """p in its own allocation; x and y on the same bytes of allocation 1; the root's tuple table."""
    x = "" if y == "x" else " value: <2 x @0> (size=16,offset=0): f32[4]{0}\n"
    return ("BufferAssignment:\n"
            "allocation 0: size 16, parameter 0, shape |f32[4]| at ShapeIndex {}:\n"
            " value: <1 p @0> (size=16,offset=0): f32[4]{0}\n"
            "allocation 1: size 16, maybe-live-out:\n"
            f"{x} value: <3 {y}{y_index} @0> (size=16,offset=0): f32[4]{{0}}\n"
            "allocation 2: size 16, output shape is |(f32[4], f32[4])|, maybe-live-out:\n"
            " value: <4 t @0> (size=16,offset=0): (f32[4]{0}, f32[4]{0})\n")


CASES = {
    "call": (HEAD.format(alias="", comps=IDENTITY, body=ENTRY_X + "  %c = f32[4]{0} call(%x), to_apply=%identity\n"
                         "  ROOT %t = (f32[4]{0}, f32[4]{0}) tuple(%c, %x)\n"), _ba("c")),
    "async": (HEAD.format(alias="", comps=IDENTITY, body=ENTRY_X +
                          "  %s = ((f32[4]{0}), f32[4]{0}) async-start(%x), calls=%identity\n"
                          "  %d = f32[4]{0} async-done(%s)\n  ROOT %t = (f32[4]{0}, f32[4]{0}) tuple(%d, %x)\n"),
              _ba("s", "{1}")),
    "in-place": (HEAD.format(alias="", comps="", body=ENTRY_X + "  %u = f32[1]{0} slice(%p), slice={[0:1]}\n"
                             "  %i = s32[] constant(1)\n"
                             "  %y = f32[4]{0} dynamic-update-slice(%x, %u, %i)\n"
                             "  ROOT %t = (f32[4]{0}, f32[4]{0}) tuple(%y, %x)\n"), _ba("y")),
    "output_to_operand_aliasing": (HEAD.format(alias="", comps=FUSED_NEG, body=ENTRY_X +
                                               "  %y = f32[4]{0} fusion(%x), kind=kLoop, calls=%fused_neg, "
                                               "output_to_operand_aliasing={{}: (0, {})}\n"
                                               "  ROOT %t = (f32[4]{0}, f32[4]{0}) tuple(%y, %x)\n"), _ba("y")),
    "backend-aliasing": (HEAD.format(alias="", comps=FUSED_NEG, body=ENTRY_X +
                                     "  %y = f32[4]{0} fusion(%x), kind=kLoop, calls=%fused_neg, backend_config="
                                     "{\"aliasing_operands\":{\"lists\":[{\"indices\":[\"0\",\"1\"]}]}}\n"
                                     "  ROOT %t = (f32[4]{0}, f32[4]{0}) tuple(%y, %x)\n"), _ba("y")),
    "donation": (HEAD.format(alias=", input_output_alias={ {0}: (0, {}, may-alias) }", comps="",
                             body="  %x = f32[4]{0} negate(%p)\n  ROOT %t = (f32[4]{0}, f32[4]{0}) tuple(%x, %p)\n"),
                 None),
}
# donation: x written on the bytes of the donated parameter p, which the root still returns
DONATION_BA = ("BufferAssignment:\n"
               "allocation 0: size 16, parameter 0, shape |f32[4]| at ShapeIndex {}, maybe-live-out:\n"
               " value: <1 p @0> (size=16,offset=0): f32[4]{0}\n value: <2 x @0> (size=16,offset=0): f32[4]{0}\n"
               "allocation 1: size 16, output shape is |(f32[4], f32[4])|, maybe-live-out:\n"
               " value: <4 t @0> (size=16,offset=0): (f32[4]{0}, f32[4]{0})\n")


def _case(rule: str) -> tuple[str, str]:
    hlo, ba = CASES[rule]
    return hlo, ba or DONATION_BA


def test_every_rule_has_a_case_and_a_docstring():
    assert set(RULE_FUNCTIONS) == set(RULES) == set(CASES) | {"while", "conditional"}
    assert all(RULES[name] for name in RULES)  # what each makes one buffer, as findings name it


@pytest.mark.parametrize("rule", sorted(CASES))
def test_the_rule_makes_two_values_one_buffer(rule):
    hlo, ba = _case(rule)
    with_rule = check_texts(hlo, ba, None, rule, "tpu" if rule == "backend-aliasing" else "cpu")
    assert with_rule.conflicts == [] and with_rule.rules_used.get(rule), (with_rule.conflicts, with_rule.rules_used)
    without = check_texts(hlo, ba, None, rule, "tpu" if rule == "backend-aliasing" else "cpu",
                          disabled=frozenset([rule]))
    assert [c.kind for c in without.conflicts] == ["overlap"], [c.message for c in without.conflicts]


@pytest.mark.parametrize("rule", sorted(CASES))
def test_a_rule_that_joins_nothing_fails_its_case(rule, monkeypatch):
    """The mutant: the rule's function replaced by one that joins nothing; its case is then a race
    (while's and conditional's: tests/hlo/memplan/test_memcheck.py, on a real dump)."""
    monkeypatch.setitem(rules_mod.RULE_FUNCTIONS, rule, lambda plan, flow: [])
    hlo, ba = _case(rule)
    assert check_texts(hlo, ba, None, rule, "tpu" if rule == "backend-aliasing" else "cpu").conflicts


def test_output_to_operand_aliasing_on_a_real_gpu_dump():
    """XLA:GPU's all-reduce-start states its in-place pair as output_to_operand_aliasing: without the
    rule, 44 false conflicts on the #35409 step compiled for 8 H100s."""
    module = next((ROOT / "results/cuda-aot/report/jax0.12.0.1/hlo").glob("*dense_only_remat=False*-cd022fc1"
                                                                         ".after_optimizations.txt.gz"))
    hlo, ba = read_text(module), read_text(beside(module, "buffer-assignment"))
    assert check_texts(hlo, ba, None, "gpu", "gpu").conflicts == []
    off = check_texts(hlo, ba, None, "gpu", "gpu", disabled=frozenset(["output_to_operand_aliasing"]))
    assert len(off.conflicts) == 44 and {c.kind for c in off.conflicts} == {"overlap"}
