"""#34: the census (tools/bad_input_census.py) is the measure of these surfaces, so each class it counts
must be able to fire: a planted acceptance of bad input is ``silent``, a planted vague refusal
``vague``, a planted file created by a refusal ``changed-files``, a refusal after work ``late``, a
signal not acted on ``silent``, a traceback inside the interpreter's own start-up ``python-startup``
(not the harness's), and an ordinary refusal stays ``clear``. The forked children run what is planted
here (monkeypatch), as in tests/project/test_census.py.
"""

from __future__ import annotations

import importlib.util
import signal
from pathlib import Path

import pytest

from ..bad_input_cases import GOOD, Case, _files, all_cases, verdict

ROOT = Path(__file__).resolve().parents[2]
MEM = 64 << 30


def _census():
    spec = importlib.util.spec_from_file_location("bad_input_census", ROOT / "tools" / "bad_input_census.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


REPORT = Case("planted-report", ["report", "{tmp}/a"], _files(a__stress__jsonl=GOOD), needle="planted", tags={"round4"})


def _v(case: Case, code, err: str = "", out: str = "", before=None, after=None, seconds=0.1, signum=None):
    return verdict(case, code, out, err, before or {}, after or {}, seconds, Path("/nonexistent"), signum)


def test_each_class_fires_on_its_outcome():
    refusal = Case("r", ["report"], needle="cause", tags={"round4"})
    assert _v(refusal, 2, "error: the cause\n") == ("clear", "error: the cause")
    assert _v(refusal, 0)[0] == "silent"
    assert _v(refusal, 1, "error: the cause\n")[0] == "wrong-exit"
    assert _v(refusal, 2, "error: a symptom\n")[0] == "vague"
    assert _v(refusal, 2, "error: internal: KeyError: x\n")[0] == "internal"
    assert _v(refusal, 2, "error: m.hlo:1: could not be scanned (IndexError: x)\n")[0] == "internal"
    assert _v(refusal, 2, "error: the cause\nerror: again\n")[0] == "error-lines"
    assert _v(refusal, 2, "Traceback (most recent call last):\n  File \"x.py\", line 1\nKeyError\n")[0] == "traceback"
    assert _v(refusal, 2, "error: the cause\n", before={"a": "1"}, after={"a": "1", "b": "2"}) == \
        ("changed-files", "b (created)")
    assert _v(refusal, 2, "error: the cause\n", before={"r/stress.jsonl": "1"},
              after={"r/stress.jsonl": "1", "r/stress.jsonl.lock": "0"})[0] == "clear"  # a run's lock, by design
    assert _v(refusal, None)[0] == "hang" and _v(refusal, None, signum=9)[0] == "killed"
    assert _v(Case("l", [], late=1.0), 2, "error: x\n", seconds=5.0)[0] == "late"
    works = Case("w", [], expect=0, check=lambda tmp, out: None if out == "right" else "wrong result")
    assert _v(works, 0, out="right")[0] == "clear" and _v(works, 0, out="no") == ("silent", "wrong result")
    interrupted = Case("i", [], entry="process", expect=130, signal=(signal.SIGINT, 0.1))
    assert _v(interrupted, 130, "interrupted by SIGINT\n")[0] == "clear"
    assert _v(interrupted, 0)[0] == "silent" and _v(interrupted, 2, "error: internal: ImportError\n")[0] == "wrong-exit"
    assert _v(interrupted, 130, "error: internal: x\n")[0] == "internal"
    site = ('Traceback (most recent call last):\n  File "<frozen site>", line 658, in main\n'
            '  File "<frozen importlib._bootstrap>", line 1360, in _find_and_load\nKeyboardInterrupt\n')
    assert _v(interrupted, 1, site)[0] == "python-startup"
    assert _v(interrupted, 1, site + '  File "/x/xla_harness/cli.py", line 3\n')[0] == "traceback"
    assert _v(Case("s", ["scan", "-"], entry="process"), 1,
              "Fatal Python error: init_sys_streams: <stdin> is a directory, cannot continue\n")[0] == "python-startup"


@pytest.mark.slow
def test_a_planted_acceptance_is_silent(monkeypatch):
    from xla_harness.commands import report

    monkeypatch.setattr(report, "run", lambda args: 0)
    kind, detail = _census().classify(REPORT, 120, MEM)
    assert kind == "silent", (kind, detail)


@pytest.mark.slow
def test_a_planted_vague_refusal_is_vague(monkeypatch):
    from xla_harness.commands import report
    from xla_harness.errors import HarnessError

    def vague(args):
        raise HarnessError("something failed")

    monkeypatch.setattr(report, "run", vague)
    assert _census().classify(REPORT, 120, MEM)[0] == "vague"


@pytest.mark.slow
def test_a_planted_file_created_by_a_refusal_is_counted(monkeypatch):
    from xla_harness.commands import report
    from xla_harness.errors import HarnessError

    def creates(args):
        (Path(args.folders[0]) / "made.png").write_bytes(b"x")
        raise HarnessError("planted")

    monkeypatch.setattr(report, "run", creates)
    kind, detail = _census().classify(REPORT, 120, MEM)
    assert kind == "changed-files" and "a/made.png (created)" in detail, (kind, detail)


def test_the_round4_cases_cover_every_class_of_the_issue():
    tags = {t for c in all_cases() if "round4" in c.tags for t in c.tags if t.startswith("r4-")}
    assert tags == {"r4-options", "r4-resume", "r4-protect", "r4-flags", "r4-plot", "r4-signals", "r4-compiler-env",
                    "r4-numbers", "r4-bisect", "r4-scan", "r4-publish", "r4-sweep", "r4-bundle", "r4-fifo"}


def test_a_census_by_tag_of_no_case_is_refused(monkeypatch, capsys):
    import sys

    monkeypatch.setattr(sys, "argv", ["bad_input_census.py", "--tag", "no-such-tag"])
    assert _census().main() == 2
    assert capsys.readouterr().err == "error: no case matches -k/--ids/--tag\n"
