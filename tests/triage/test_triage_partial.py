"""Exit 0 only when every question asked was answered and nothing was found: a stage whose budget ran
out before its question was answered leaves the triage partial (exit 2, the open question named); a
finding is exit 1 however much remains; everything answered and clean is exit 0."""

from __future__ import annotations

import json

from tests.triage.test_triage_where import _triage_folder
from xla_harness.triage.answer import answer


def _state(tmp_path, train_answer, train_bad=None):
    out = tmp_path / "t"
    state = _triage_folder(out, train_bad={} if train_bad is None else train_bad, bundle=False)
    state["stages"]["train"]["answer"] = train_answer
    (out / "triage.json").write_text(json.dumps(state))
    return state, out


def test_every_question_answered_and_clean_is_exit_0(tmp_path):
    state, out = _state(tmp_path, "bounded")
    ans = answer(state, out)
    assert ans.exit_code == 0 and ans.open_questions == []


def test_a_question_left_open_by_the_budget_is_not_a_clean_bill(tmp_path):
    state, out = _state(tmp_path, None)
    ans = answer(state, out)
    assert ans.exit_code == 2 and ans.open_questions == ["train: not within the budget"]


def test_a_finding_is_exit_1_whatever_remains_open(tmp_path):
    state, out = _state(tmp_path, None, train_bad={3: "loss"})
    ans = answer(state, out)
    assert ans.exit_code == 1 and ans.open_questions == ["train: not within the budget"]


def test_a_stage_that_failed_leaves_its_question_open(tmp_path):
    state, out = _state(tmp_path, "bounded")
    state["stages"]["compile:tpu:v6e:2x4"] = {"ok": False, "error": "compile:tpu:v6e:2x4: libtpu is not installed"}
    ans = answer(state, out)
    assert ans.exit_code == 2 and ans.open_questions == ["compile:tpu:v6e:2x4: libtpu is not installed"]


def test_the_report_and_the_error_line_say_partial_not_nothing_measured(tmp_path):
    from xla_harness.triage.render import write_report

    state, out = _state(tmp_path, None)
    ans = write_report(out, state)
    assert "Exit 2: partial: open: train: not within the budget." in (out / "report.md").read_text()
    assert ans.not_clean().startswith("not every question was answered (train: not within the budget)")
