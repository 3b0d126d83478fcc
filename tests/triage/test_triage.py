"""xla-harness triage: the stopping rules, the answer and its exit code, and the report, on real runs of
small programs: a clean step (exit 0, a self-contained HTML report whose every image is an inline PNG
that decodes), planted NaNs and a planted nondeterministic leaf (each changes the answer and the exit
code), a hazard in a compiled module fed to the scan, and a kill -9 in each stage followed by
--resume (the same answer and verdicts as an uninterrupted triage)."""

from __future__ import annotations

import base64
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from html.parser import HTMLParser
from pathlib import Path

import pytest

from xla_harness.hlo.parser import parse_file
from xla_harness.stress.report import stats
from xla_harness.triage import plan
from xla_harness.triage.answer import answer
from xla_harness.triage.compiled import target_verdict

from ..stress.test_nondet_detail import PERTURBED

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = "examples/quickstart/my_model.py:make"
HAZARD_HLO = ROOT / "tests/hlo/transpose_moves_data.hlo"


# ----------------------------------------------------------------------------- pure


def test_steps_to_bound_is_the_fewest_clean_trials_below_the_rate():
    for rate in (0.05, 0.01, 0.2):
        n = plan.steps_to_bound(rate)
        assert stats.upper_bound(0, n) < rate <= stats.upper_bound(0, n - 1)
    assert plan.steps_to_bound(0.05) == 59
    assert plan.round_steps(0.05, 2) == 4 * 59
    with pytest.raises(ValueError):
        plan.steps_to_bound(0.0)


def test_a_stage_stops_as_soon_as_its_question_is_answered():
    assert plan.rate_answer(0, 58, 0.05) is None  # not yet bounded
    assert plan.rate_answer(0, 59, 0.05) == "bounded"
    assert plan.rate_answer(1, 3, 0.05) == "fails"
    assert plan.rate_answer(0, 3, 0.05, nondet=1) == "nondeterministic"
    rows = [("baseline", 0, 59), ("barrier", 0, 59)]
    assert plan.variants_answer(rows, 0.05) == "bounded"
    assert plan.variants_answer([("baseline", 20, 59), ("barrier", 0, 59)], 0.05) == "differs"
    assert plan.variants_answer([("baseline", 2, 59), ("barrier", 1, 59)], 0.05) is None  # keep measuring


def test_a_hazard_in_a_module_fed_to_the_scan_is_the_answer():
    verdict = target_verdict(parse_file(HAZARD_HLO), f"hlo:{HAZARD_HLO.name}")
    state = {"kind": "triage", "stages": {"hlo:1": {"ok": True, "verdict": verdict.to_json()}}}
    ans = answer(state, ROOT)
    assert ans.exit_code == 1 and "the #35409 hazard is present" in ans.paragraph
    clean = target_verdict(parse_file(ROOT / "tests/hlo/transpose_layout_preserving.hlo"), "hlo:clean")
    state = {"kind": "triage", "stages": {"hlo:1": {"ok": True, "verdict": clean.to_json()}}}
    ans = answer(state, ROOT)
    assert ans.exit_code == 0 and "hazard is absent" in ans.paragraph

    # Nothing measured (every stage failed) is not a clean bill: exit 2, the failures said.
    failed = {"kind": "triage", "stages": {"compile:host": {"ok": False, "error": "ModuleNotFoundError: tiedlm"},
                                            "train": {"ok": False, "error": "ModuleNotFoundError: tiedlm"}}}
    ans = answer(failed, ROOT)
    assert ans.exit_code == 2 and ans.paragraph.startswith("Nothing was measured")
    assert plan.steps_to_bound(1e-17) > 10**16  # no ZeroDivisionError where 1 - rate rounds to 1


BAD_TRIAGE = [
    (["--program", "/nonexistent.py:make"], "no such file"),
    (["--program", ""], "not a built-in"),
    (["--program", "bogus"], "not a built-in"),
    (["--program", f"{QUICKSTART}x"], "no attribute"),
    (["--program", QUICKSTART, "--program-option", "bogus=1"], "bogus"),
    (["--program", QUICKSTART, "--program-option", "=1"], "expected KEY=VALUE"),
    (["--program", QUICKSTART, "--program-option", "width=8", "--program-option", "width=9"], "given twice"),
    (["--program", "issue-35409", "--program-option", "precision=low"], "precision"),
    (["--program", "tests/data/raises_in.py:make", "--program-option", "where='make'"], "raised"),
    (["--program", "tests/data/raises_in.py:make", "--program-option", "where='init'"], "init raised"),
    (["--program", "{tmp}/syntax.py:make"], "SyntaxError"),
    (["--program", QUICKSTART, "--rate-of-interest", "1e-300"], "--rate-of-interest"),
    (["--program", QUICKSTART, "--rate-of-interest", "1e-17"], "--rate-of-interest"),
    (["--program", QUICKSTART, "--budget", "1e308"], "--budget"),
    (["--program", QUICKSTART, "--out", ""], "--out"),
    (["--program", QUICKSTART, "--hlo", "{tmp}/garbage.txt"], "garbage.txt"),
    (["--program", QUICKSTART, "--hlo", "{tmp}/empty.txt"], "empty.txt"),
    (["--program", QUICKSTART, "--hlo", "{tmp}/binary.txt"], "not UTF-8"),
    (["--program", QUICKSTART, "--hlo", "{tmp}/cut.txt"], "cut.txt"),
    (["--program", QUICKSTART, "--hlo", "{tmp}/dump.txt.gz"], "gunzip"),
    (["--program", QUICKSTART, "--hlo", "{tmp}/stress.jsonl"], "stress.jsonl"),
    (["--program", QUICKSTART, "--hlo", "{tmp}"], "directory"),
]


@pytest.mark.parametrize("argv,says", BAD_TRIAGE, ids=[" ".join(a) for a, _ in BAD_TRIAGE])
def test_bad_input_is_refused_before_anything_runs(tmp_path, monkeypatch, capsys, argv, says):
    """A program or option every stage would fail on: one error line, exit 2, no folder written."""
    from xla_harness.cli import main
    from xla_harness.triage import run as triage_run

    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(triage_run.Triage, "run", lambda self: pytest.fail("a stage ran"))
    import gzip

    (tmp_path / "syntax.py").write_text("def make(:\n")
    hlo = HAZARD_HLO.read_text()
    (tmp_path / "garbage.txt").write_text("this is not HLO\n")
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "binary.txt").write_bytes(b"HloModule m\n\xff\xfe\x00")
    (tmp_path / "cut.txt").write_text(hlo[:len(hlo) // 2])
    (tmp_path / "dump.txt.gz").write_bytes(gzip.compress(hlo.encode()))
    (tmp_path / "stress.jsonl").write_text('{"kind": "header"}\n')
    out = tmp_path / "t"
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    args = ["triage", *argv] + ([] if "--out" in argv else ["--out", str(out)])
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and says in err[0], err
    assert not out.exists()


# ----------------------------------------------------------------------------- real runs


class _Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict]] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))


def _triage(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "xla_harness", "triage", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})


def _answer_line(stdout: str) -> str:
    return stdout.strip().splitlines()[0]


@pytest.mark.slow
def test_a_clean_step_answers_exit_0_with_a_self_contained_report(tmp_path):
    out = tmp_path / "t"
    done = _triage("--program", QUICKSTART, "--out", str(out), "--budget", "10")
    assert done.returncode == 0, done.stderr
    paragraph = _answer_line(done.stdout)
    assert paragraph.startswith("On host cpu") and "the #35409 hazard is absent" in paragraph
    assert "memory plan: no two live values share bytes" in paragraph and "its live range as the compiler's" \
        in paragraph  # memcheck of the host compile, against XLA's own live range
    assert "train 0/59 non-finite steps" in paragraph and "deterministic" in paragraph
    assert "triage [" in done.stderr and "left]" in done.stderr  # progress, with the time left
    page = _Page()
    text = (out / "report.html").read_text(encoding="utf-8")
    page.feed(text)
    images = [a for t, a in page.tags if t == "img"]
    assert len(images) >= 2  # the scatters' neighbourhoods (a one-row rate table gets no figure)
    assert not any(a["alt"].endswith("non-finite rates") for a in images)
    for a in images:
        assert a["src"].startswith("data:image/png;base64,") and a.get("alt")
        assert base64.b64decode(a["src"].split(",", 1)[1]).startswith(b"\x89PNG\r\n\x1a\n")
    assert not [a for t, a in page.tags if t in ("link", "script") or (t == "a" and "href" in a)]
    assert "http://" not in text and "https://" not in text
    assert paragraph in text.replace("&#x27;", "'")
    # report DIR --html draws the same report again from the folder
    md = (out / "report.md").read_text()
    (out / "report.md").unlink()
    from xla_harness.cli import main

    assert main(["report", str(out), "--html"]) == 0
    assert (out / "report.md").read_text() == md


@pytest.mark.slow
def test_planted_nans_change_the_answer_and_the_exit_code(tmp_path):
    done = _triage("--program", QUICKSTART, "--out", str(tmp_path / "t"), "--budget", "10", "--inject-rate", "0.1")
    assert done.returncode == 1, done.stderr
    paragraph = _answer_line(done.stdout)
    assert "train 0/" not in paragraph and "non-finite steps (at most" in paragraph
    state = json.loads((tmp_path / "t" / "triage.json").read_text())
    assert state["stages"]["train"]["answer"] == "fails"
    # something failed here: the passes were bisected (the planted faults do not come from a pass, so the
    # bisection cannot conclude) and a bundle was written
    assert "bisect" in state["stages"] and "Pass bisection: " in paragraph
    assert state["stages"]["bundle"]["ok"] and (tmp_path / "t" / "repro.tar.gz").is_file()
    # where: the planted steps, named as planted, and the replay of the first one, a command this CLI takes
    assert "Where (" in done.stdout and ", planted)" in done.stdout and "What next:" in done.stdout
    replay = next(line.strip() for line in done.stdout.splitlines() if line.strip().startswith("xla-harness stress "))
    from xla_harness.cli import build_parser

    args = build_parser().parse_args(shlex.split(replay)[1:])
    assert args.inject_rate == 0.1 and args.protocol in ("frozen", "train") and len(args.seeds) == 1
    assert f"bundle --check {tmp_path / 't' / 'repro.tar.gz'}" in done.stdout


@pytest.mark.slow
def test_a_planted_nondeterministic_leaf_changes_the_answer_and_the_exit_code(tmp_path):
    (tmp_path / "perturbed.py").write_text(PERTURBED)
    done = _triage("--program", f"{tmp_path}/perturbed.py:make", "--out", str(tmp_path / "t"), "--budget", "10",
                   "--json")
    assert done.returncode == 1, done.stderr
    got = json.loads(done.stdout)  # --json: the whole stdout is one document, the same verdict
    paragraph = got["answer"]
    assert "nondeterministic:" in paragraph and "params['b']" in paragraph
    assert got["exit_code"] == 1 and got["findings"] and got["triage"]["stages"]["frozen"]["answer"]
    assert got["report"]["html"].endswith("report.html")


@pytest.mark.slow
def test_a_hazard_fed_to_the_scan_shows_in_the_answer(tmp_path):
    done = _triage("--program", QUICKSTART, "--hlo", str(HAZARD_HLO), "--out", str(tmp_path / "t"), "--budget", "10")
    assert done.returncode == 1, done.stderr
    assert f"On hlo:{HAZARD_HLO}" in _answer_line(done.stdout) and "hazard is present" in _answer_line(done.stdout)


def _comparable(out: Path) -> dict:
    """triage.json without what differs between two runs of the same triage: timings and commands."""
    state = json.loads((out / "triage.json").read_text())

    def strip(x):
        if isinstance(x, dict):
            return {k: strip(v) for k, v in x.items()
                    if k not in ("seconds", "elapsed_s", "commands", "compile_cpu_s", "record", "per_step_s")}
        if isinstance(x, list):
            return [strip(v) for v in x]
        return x

    return strip(state)


@pytest.mark.slow
def test_kill_9_in_each_stage_then_resume_gives_the_same_answer(tmp_path):
    whole = tmp_path / "whole"
    ref = _triage("--program", QUICKSTART, "--out", str(whole), "--budget", "30")
    assert ref.returncode == 0, ref.stderr
    out = tmp_path / "cut"
    # (no variants round: a triage whose frozen and train saw no failure skips the variants stage)
    assert "workaround variants: not run: frozen and train saw no non-finite step" in _answer_line(ref.stdout).lower()
    for stage in ("compile-host/compile", "frozen/round-1", "train/round-1"):
        argv = [sys.executable, "-m", "xla_harness", "triage", "--program", QUICKSTART, "--out", str(out),
                "--budget", "30", *(["--resume"] if out.exists() else [])]
        proc = subprocess.Popen(argv, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 600
        while not (out / "stages" / stage).exists():
            assert proc.poll() is None, f"the triage ended before {stage} began"
            assert time.monotonic() < deadline
            time.sleep(0.05)  # polling a folder, not timing anything
        time.sleep(1.0)  # into the stage's child: a compile or a round under way
        os.kill(proc.pid, signal.SIGKILL)  # the triage only: its children die with it (PR_SET_PDEATHSIG)
        proc.wait()
    done = _triage("--program", QUICKSTART, "--out", str(out), "--budget", "30", "--resume")
    assert done.returncode == 0, done.stderr
    assert _answer_line(done.stdout) == _answer_line(ref.stdout)
    assert _comparable(out) == _comparable(whole)


def test_report_html_of_a_triage_that_measured_nothing_exits_2(tmp_path, capsys):
    from xla_harness.cli import main

    (tmp_path / "triage.json").write_text(json.dumps({"kind": "triage", "stages": {
        "train": {"ok": False, "error": "ModuleNotFoundError: No module named 'tiedlm'"}}}))
    assert main(["report", str(tmp_path), "--html"]) == 2
    captured = capsys.readouterr()
    assert captured.out.startswith("Nothing was measured") and "tiedlm" in captured.err
    assert "Exit 2: nothing measured." in (tmp_path / "report.md").read_text()


def test_a_stage_that_ran_no_round_is_not_an_answer(tmp_path, monkeypatch):
    """A budget spent before a local stage: the stage is an error naming the budget, never "ok"; with
    nothing else measured the triage exits 2."""
    from xla_harness.triage.run import Triage
    from xla_harness.triage.spec import TriageSpec

    spec = TriageSpec(program=QUICKSTART, options=[], targets=[], hlo=[], budget_s=1.0, rate_of_interest=0.05)
    triage = Triage(spec, tmp_path / "t")
    triage._open()
    monkeypatch.setattr(triage, "_child", lambda *a, **k: pytest.fail("a round ran past the budget"))
    stage = next(s for s in triage.stages if s.kind == "train")
    got = triage.rate_stage(stage, budget=0.0)
    assert got["ok"] is False and "no round ran within the budget" in got["error"]
    state = {"kind": "triage", "stages": {"train": got}}
    ans = answer(state, tmp_path)
    assert ans.exit_code == 2 and "no round ran" in ans.paragraph
    old = {"kind": "triage", "stages": {"train": {"ok": True, "rounds": [], "answer": None}}}
    assert answer(old, tmp_path).exit_code == 2


def _bisect_child(tmp_path, monkeypatch, stdout: str, rc: int):
    """A triage whose bisect-passes child printed ``stdout`` and exited ``rc``; its argv is kept."""
    from xla_harness.runtime import subproc
    from xla_harness.triage.run import Triage
    from xla_harness.triage.spec import TriageSpec

    spec = TriageSpec(program=QUICKSTART, options=[], targets=[], hlo=[], budget_s=600.0, rate_of_interest=0.05)
    triage = Triage(spec, tmp_path / "t")
    triage._open()
    stage = next(s for s in triage.stages if s.kind == "bisect")
    seen = {}

    def child(stage_, name, argv, timeout, grace=5.0):
        seen.update(argv=argv, timeout=timeout)
        (triage.stage_dir(stage_) / f"{name}.stdout.txt").parent.mkdir(parents=True, exist_ok=True)
        (triage.stage_dir(stage_) / f"{name}.stdout.txt").write_text(stdout)
        (triage.stage_dir(stage_) / f"{name}.stderr.txt").write_text("")
        return subproc.subprocess.CompletedProcess(argv, rc, b"", b"")

    monkeypatch.setattr(triage, "_child", child)
    return triage.bisect_stage(stage, budget=90.0), seen


def test_a_bisection_out_of_time_says_what_it_narrowed(tmp_path, monkeypatch):
    """bisect-passes gets the stage's budget as --time-limit (and a grace to end its probe in flight);
    stopped there, what it had narrowed is the stage's answer, not only "did not finish"."""
    partial = {"probes": 7, "candidates": 40, "narrowed": ["algsimp", "cse", "fusion"]}
    from xla_harness.repro.bisect import partial_text

    stdout = json.dumps({"finished": False, "partial": partial, "summary": partial_text(partial)})
    got, seen = _bisect_child(tmp_path, monkeypatch, stdout, 1)
    assert seen["argv"][seen["argv"].index("--time-limit") + 1] == "90" and seen["timeout"] > 90
    assert got["ok"] is False and got["partial"] == partial
    assert "stopped at its 90 s after 7 probe(s)" in got["error"] and "algsimp, cse, fusion" in got["error"]
    ans = answer({"kind": "triage", "stages": {"bisect": got}}, tmp_path)
    assert "Pass bisection: not concluded (the bisection stopped at its 90 s after 7 probe(s)" in ans.paragraph
    # Killed past its grace: said so, with where its probes are.
    got, _ = _bisect_child(tmp_path / "k", monkeypatch, "", 124)
    assert "did not finish within its 90 s" in got["error"] and "bisect.jsonl" in got["error"]


@pytest.mark.parametrize("text", ["{", "[]", '"x"', '{"spec": []}', '{"spec": {}, "spent_s": "1"}',
                                  '{"spec": {}, "spent_s": -1}', b"\xff\xfe"], ids=repr)
def test_resume_refuses_a_triage_spec_that_is_not_a_triage_s_record(tmp_path, capsys, text):
    from xla_harness.cli import main

    out = tmp_path / "t"
    (out / "stages").mkdir(parents=True)
    path = out / "triage-spec.json"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    before = path.read_bytes()
    assert main(["triage", "--program", f"{ROOT}/{QUICKSTART}", "--out", str(out), "--resume"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and "triage-spec.json" in err[0]
    assert path.read_bytes() == before


def test_time_spent_is_kept_as_the_triage_goes_and_a_resume_continues_the_clock(tmp_path):
    from xla_harness.triage.run import Triage
    from xla_harness.triage.spec import TriageSpec

    spec = TriageSpec(program=QUICKSTART, options=[], targets=[], hlo=[], budget_s=600.0, rate_of_interest=0.05)
    first = Triage(spec, tmp_path / "t")
    first._open()
    first.spent_before = 250.0  # as if it had run for 250 s, then was killed after a progress line
    first._progress("a stage")
    resumed = Triage(spec, tmp_path / "t", resume=True)
    resumed._open()
    assert resumed.spent_before >= 250.0 and resumed.left() <= 350.0


def test_a_killed_stage_s_time_stays_in_its_table_after_a_resume(tmp_path, monkeypatch):
    """A stage killed after 90 s of work and finished in 30 s on --resume is 120 s in the stage table."""
    from xla_harness.triage import run as run_mod
    from xla_harness.triage.run import Triage
    from xla_harness.triage.spec import TriageSpec

    clock = [1000.0]
    monkeypatch.setattr(run_mod.time, "monotonic", lambda: clock[0])
    spec = TriageSpec(program=QUICKSTART, options=[], targets=[], hlo=[], budget_s=600.0, rate_of_interest=0.05)
    first = Triage(spec, tmp_path / "t")
    first._open()
    stage = next(s for s in first.stages if s.kind == "train")
    first.running = (stage, clock[0], first._stage_spent_before(stage))
    clock[0] += 90.0
    first._progress("a round of train")  # then killed: no stage.json
    assert not (first.stage_dir(stage) / "stage.json").exists()
    resumed = Triage(spec, tmp_path / "t", resume=True)
    resumed._open()
    assert resumed._stage_spent_before(stage) == 90.0
    start = clock[0]
    resumed.running = (stage, start, resumed._stage_spent_before(stage))
    clock[0] += 30.0
    summary = resumed._finish(stage, {"ok": True}, clock[0] - start)
    assert summary["seconds"] == 120.0
    assert not (resumed.stage_dir(stage) / run_mod.STAGE_SPENT).exists()  # kept only while it runs
    (resumed.stage_dir(stage) / run_mod.STAGE_SPENT).write_text('{"spent_s": "x"}')
    assert resumed._stage_spent_before(stage) == 0.0  # an unreadable record counts nothing, never crashes


def test_resume_never_runs_into_a_folder_that_is_not_a_triage_s(tmp_path, capsys):
    from xla_harness.cli import main

    out = tmp_path / "t"
    (out / "stages").mkdir(parents=True)
    (out / "mine.txt").write_text("the user's\n")
    assert main(["triage", "--program", f"{ROOT}/{QUICKSTART}", "--out", str(out), "--resume"]) == 2
    err = capsys.readouterr().err
    assert "not a triage folder" in err and sorted(p.name for p in out.iterdir()) == ["mine.txt", "stages"]


def test_an_interrupt_swallowed_while_a_stage_ran_ends_the_triage(tmp_path, monkeypatch):
    """SIGINT arriving while a stage's child is forked can be raised inside fork's callbacks, where
    CPython only prints it: the signal is still recorded, and the triage ends at the child's end with
    exit 130 instead of running its other stages."""
    import signal as signals

    from xla_harness.runtime import interrupts, subproc
    from xla_harness.triage.run import Triage
    from xla_harness.triage.spec import TriageSpec

    spec = TriageSpec(program=QUICKSTART, options=[], targets=[], hlo=[], budget_s=600.0, rate_of_interest=0.05)
    triage = Triage(spec, tmp_path / "t")
    triage._open()

    def swallowed(argv, **kw):
        interrupts.record(signals.SIGINT)  # what the handler did before its exception was swallowed
        return subproc.subprocess.CompletedProcess(argv, 130, b"", b"")

    monkeypatch.setattr(subproc, "run", swallowed)
    stage = next(s for s in triage.stages if s.kind == "train")
    try:
        with pytest.raises(interrupts.Interrupted) as got:
            triage._child(stage, "round-1", ["stress"], timeout=60)
        assert got.value.exit_code == 130 and "train" in str(got.value)
    finally:
        interrupts.forget()


def _good_verdict() -> dict:
    v = target_verdict(parse_file(ROOT / "tests/hlo/transpose_layout_preserving.hlo"), "hlo:clean").to_json()
    return json.loads(json.dumps(v))


BAD_RECORDS = {
    "stages a list": {"kind": "triage", "stages": []},
    "stages a string": {"kind": "triage", "stages": "x"},
    "a stage a string": {"kind": "triage", "stages": {"train": "x"}},
    "verdict {}": {"kind": "triage", "stages": {"hlo:1": {"ok": True, "verdict": {}}}},
    "verdict a string": {"kind": "triage", "stages": {"hlo:1": {"ok": True, "verdict": "x"}}},
    "a verdict field of another type": "hazard",
    "rounds [5]": {"kind": "triage", "stages": {"train": {"ok": True, "rounds": [5]}}},
    "a round outside the folder": {"kind": "triage", "stages": {"train": {"ok": True, "rounds": ["../../etc"]}}},
    "spec []": {"kind": "triage", "spec": []},
    "kind missing": {"stages": {}},
}


@pytest.mark.parametrize("name", list(BAD_RECORDS))
def test_report_html_refuses_a_triage_json_of_another_shape(tmp_path, capsys, name):
    from xla_harness.cli import main

    record = BAD_RECORDS[name]
    if record == "hazard":
        record = {"kind": "triage", "stages": {"hlo:1": {"ok": True, "verdict": {**_good_verdict(), "hazard": "1"}}}}
    (tmp_path / "triage.json").write_text(json.dumps(record))
    assert main(["report", str(tmp_path), "--html"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and "not a triage record" in err[0], err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["triage.json"]


def test_report_html_reads_back_what_a_triage_writes(tmp_path):
    from xla_harness.triage.answer import check_state

    state = {"kind": "triage", "spec": {}, "stages": {"hlo:1": {"ok": True, "verdict": _good_verdict(),
                                                                "commands": ["xla-harness scan x"]}}}
    check_state(json.loads(json.dumps(state)))


def test_the_report_is_never_written_through_a_link_or_onto_a_folder(tmp_path, capsys):
    from xla_harness.cli import main

    (tmp_path / "triage.json").write_text(json.dumps({"kind": "triage", "stages": {}}))
    victim = tmp_path / "victim.txt"
    victim.write_text("mine\n")
    (tmp_path / "report.html.tmp").symlink_to(victim)  # a leftover name a writer might follow
    main(["report", str(tmp_path), "--html"])
    assert victim.read_text() == "mine\n" and (tmp_path / "report.html").is_file()
    (tmp_path / "report.md").unlink()
    (tmp_path / "report.md").mkdir()
    assert main(["report", str(tmp_path), "--html"]) == 2
    assert "report.md exists and is not a regular file" in capsys.readouterr().err
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".report")]  # no temporary file left


@pytest.mark.parametrize("kind", ["fifo", "device link", "dangling link"])
def test_report_html_names_what_triage_json_is_when_it_is_not_a_file(tmp_path, capsys, kind):
    import os

    from xla_harness.cli import main

    record = tmp_path / "triage.json"
    if kind == "fifo":
        os.mkfifo(record)
    elif kind == "device link":
        record.symlink_to("/dev/zero")
    else:
        record.symlink_to(tmp_path / "gone")
    assert main(["report", str(tmp_path), "--html"]) == 2
    err = capsys.readouterr().err
    assert "triage.json is a" in err and "no triage.json" not in err


@pytest.mark.parametrize("fails", [False, True])
def test_variants_run_only_when_frozen_or_train_failed(tmp_path, monkeypatch, fails):
    """0 failures on both sides compare nothing: the stage is skipped with its reason (and says so in the
    answer), taking no time; a failing baseline gets its variants run."""
    from xla_harness.triage import run as run_mod
    from xla_harness.triage.run import Triage
    from xla_harness.triage.spec import TriageSpec

    spec = TriageSpec(program=QUICKSTART, options=[], targets=[], hlo=[], budget_s=60.0, rate_of_interest=0.05)
    triage = Triage(spec, tmp_path / "t")
    ran = []

    def stage(st, summaries, backend="", failing=None):
        ran.append(st.kind)
        if st.kind in ("frozen", "train"):
            return {"ok": True, "rounds": [f"stages/{st.kind}/round-1"], "answer": "fails" if fails else "bounded"}
        return {"ok": True}

    monkeypatch.setattr(triage, "_stage", stage)
    monkeypatch.setattr(run_mod, "_local_backend", lambda out, summaries: "cpu")
    monkeypatch.setattr(triage, "_state", lambda summaries, backend: {"kind": "triage", "stages": summaries})
    monkeypatch.setattr(run_mod, "answer", lambda state, out: state)
    state, _ = triage.run()
    assert ("variants" in ran) == fails
    variants = state["stages"]["variants"]
    if not fails:
        assert variants["skipped"].startswith("not run: frozen and train saw no non-finite step")
        from xla_harness.triage.answer import _after

        assert _after(state["stages"])[0].startswith("workaround variants: not run")
