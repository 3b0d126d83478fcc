"""Triage draws memcheck's verdict per compiler: a module with its buffer assignment beside it gets a
memory plan in its verdict (clean on a real dump; a planted conflict is a finding, exit 1, named in
the answer and the report's table); a buffer assignment memcheck cannot read is "not checked", never
a clean bill."""

from __future__ import annotations

import gzip

from tests.commands.test_memcheck_cli import _planted, clean  # noqa: F401  (the fixture)
from xla_harness.triage.answer import memory_plan_clause, target_sentence
from xla_harness.triage.compiled import TargetVerdict, memory_plan
from xla_harness.triage.render import _target_rows


def _verdict(plan: dict | None) -> TargetVerdict:
    return TargetVerdict(target="cuda:h100", backend="gpu", versions={}, instructions=3, hazard=0, fused_producer=0,
                         hazard_fusions=[], decision_fusions=[], scatters=[], compiler_states_aliasing=True,
                         disagreements=0, nondeterministic=None, w_dims=None, memory_plan=plan)


def test_a_real_dump_is_clean_and_says_what_was_checked(clean):  # noqa: F811
    plan = memory_plan(clean)
    assert plan["conflicts"] == 0 and plan["disagreements"] == 0 and plan["values"] > 0
    assert plan["live_range_compared"] > 0
    v = _verdict(plan)
    assert not v.found and "memory plan: no two live values share bytes" in target_sentence(v)
    assert _target_rows([v])[1][-2].startswith("clean (")


def test_a_planted_conflict_is_a_finding(clean):  # noqa: F811
    plan = memory_plan(_planted(clean))
    assert plan["conflicts"] >= 1 and plan["kinds"].get("overlap", 0) >= 1 and "copy.1" in plan["first"]
    v = _verdict(plan)
    assert v.found and "memory plan: " in target_sentence(v) and "conflict(s) (" in target_sentence(v)
    assert "conflict(s)" in _target_rows([v])[1][-2]


def test_an_unreadable_buffer_assignment_is_not_checked_never_clean(clean):  # noqa: F811
    ba = clean.with_name(clean.name.replace(".txt.gz", "-buffer-assignment.txt.gz"))
    ba.write_bytes(gzip.compress(b"this is not a buffer assignment\n"))
    plan = memory_plan(clean)
    assert set(plan) == {"error"}
    v = _verdict(plan)
    assert not v.found and "memory plan: not checked (" in memory_plan_clause(v)
    assert _target_rows([v])[1][-2] == "not checked"


def test_no_memory_plan_adds_nothing():
    assert memory_plan_clause(_verdict(None)) == "" and _target_rows([_verdict(None)])[1][-2] == "-"


def test_live_ranges_that_differ_from_the_compilers_are_said_never_a_finding():
    plan = {"values": 4224, "async_windows": 100, "conflicts": 0, "kinds": {}, "first": "",
            "live_range_compared": 2640, "disagreements": 130}
    v = _verdict(plan)
    assert not v.found
    clause = memory_plan_clause(v)
    assert "no two live values share bytes" in clause and "differing from the compiler's on 130 of 2640" in clause
    assert _target_rows([v])[1][-2] == "clean (4224 values; live range differs on 130)"


def _answer(plan: dict | None, tmp_path):
    from xla_harness.triage.answer import answer

    return answer({"stages": {"compile:cuda:h100": {"ok": True, "verdict": _verdict(plan).to_json()}}}, tmp_path)


def test_a_memory_plan_that_could_not_be_checked_is_an_open_question(tmp_path):
    """Exit 0 says every question was answered: a plan that is there but could not be read is asked and
    not answered (exit 2, named), while a clean plan answers it (exit 0) and a conflict is a finding."""
    clean_plan = {"values": 10, "async_windows": 0, "conflicts": 0, "kinds": {}, "first": "",
                  "live_range_compared": 10, "disagreements": 0}
    assert _answer(clean_plan, tmp_path).exit_code == 0
    ans = _answer({"error": "x-buffer-assignment.txt:3: expected 'allocation N'"}, tmp_path)
    assert ans.exit_code == 2 and ans.open_questions == [
        "cuda:h100: memory plan not checked (x-buffer-assignment.txt:3: expected 'allocation N')"]
    assert "Not answered: cuda:h100: memory plan not checked" in ans.paragraph
    found = {**clean_plan, "conflicts": 1, "kinds": {"overlap": 1}, "first": "overlap: a b"}
    assert _answer(found, tmp_path).exit_code == 1


def test_a_module_given_without_a_buffer_assignment_says_its_plan_was_not_checked():
    v = _verdict(None)
    v.target = "hlo:dump/m.after_optimizations.txt"
    assert memory_plan_clause(v) == "; memory plan: not checked (no buffer assignment beside the module)"
