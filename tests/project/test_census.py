"""#27 item 8: tools/bad_input_census.py is the measure of the bad-input suite, so its classes must be
able to fail: a planted unforeseen exception is counted as ``internal`` (a user's mistake reported
as the harness's own bug), a planted overwrite as ``changed-files``, a planted traceback as
``traceback``; an ordinary refusal stays ``clear``. The children are forked from this process, so
what is planted here (monkeypatch) is what they run.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from ..bad_input_cases import GOOD, Case, _files

ROOT = Path(__file__).resolve().parents[2]
MEM = 64 << 30  # the census caps a child's address space; this process has jax loaded


def _census():
    spec = importlib.util.spec_from_file_location("bad_input_census", ROOT / "tools" / "bad_input_census.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


REPORT = Case("planted-report", ["report", "{tmp}/a"], _files(a__stress__jsonl=GOOD))


@pytest.mark.slow
def test_an_ordinary_refusal_is_clear():
    kind, detail = _census().classify(Case("missing", ["report", "{tmp}/nothere"]), 120, MEM)
    assert kind == "clear" and detail.startswith("error:"), (kind, detail)


@pytest.mark.slow
def test_a_planted_unforeseen_exception_is_internal(monkeypatch):
    from xla_harness.commands import report

    def planted(args):
        raise ValueError("planted")

    monkeypatch.setattr(report, "run", planted)
    kind, detail = _census().classify(REPORT, 120, MEM)
    assert kind == "internal" and "ValueError: planted" in detail, (kind, detail)


@pytest.mark.slow
def test_a_planted_overwrite_is_changed_files(monkeypatch):
    from xla_harness.commands import report

    def planted(args):
        (Path(args.folders[0]) / "stress.jsonl").write_text("gone")
        raise SystemExit(2)

    monkeypatch.setattr(report, "run", planted)
    kind, detail = _census().classify(REPORT, 120, MEM)
    assert kind == "changed-files" and "stress.jsonl" in detail, (kind, detail)


@pytest.mark.slow
def test_a_planted_traceback_is_counted(monkeypatch):
    from xla_harness import cli

    def planted(argv=None):
        raise KeyError("planted")  # escapes main: the child prints the traceback

    monkeypatch.setattr(cli, "main", planted)
    kind, _ = _census().classify(REPORT, 120, MEM)
    assert kind == "traceback"
    assert sys.modules["xla_harness.cli"].main is planted


def test_a_census_of_no_case_is_refused(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["bad_input_census.py", "--ids", "no-such-case"])
    assert _census().main() == 2
    assert capsys.readouterr().err == "error: no case matches -k/--ids/--tag\n"
