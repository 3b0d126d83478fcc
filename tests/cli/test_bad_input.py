"""Bad input never crashes: every generated case (tests/bad_input_cases.py) ends as it promises
(a refusal: exit 2, exactly one ``error:`` line on stderr naming the cause, no traceback, no
file that existed before changed and none created; a case that must work: exit 0 and a right
result; a signal: 130/143), within a time limit (a hang fails the case). ``verdict`` says
which class an outcome falls in; every case must be ``clear``.

The cases run in-process (xla_harness.cli.main / the build entry's main / tools/publish_hlo.py's
main) so several hundred take seconds; those about a process itself (signals, standard input,
make tpu-sweep) run as real subprocesses, marked slow, and so do a few others to check the
entry points themselves: the console script, ``python -m xla_harness.cli`` and
build/build_jaxlib.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ..bad_input_cases import ODD_VALID_HLO, Case, all_cases, held_lock, run_process, tree_hashes, verdict

ROOT = Path(__file__).resolve().parents[2]
# "census-only": a case as long as a budget (a step that hangs: a minute), counted by the census and
# tested once elsewhere (tests/triage/test_whose.py::test_a_step_that_hangs_is_said_and_the_budget_holds).
CASES = [c for c in all_cases() if "census-only" not in c.tags]
CASE_LIMIT_S = 120  # generous: the first case that imports jax pays for it


class CaseHung(BaseException):
    """Raised by the alarm; a BaseException so no handler under test can swallow it."""


def _on_alarm(signum, frame):
    raise CaseHung(f"case still running after {CASE_LIMIT_S} s")


def _cli_main():
    from xla_harness.cli import main

    return main


def _build_entry():
    """build/build_jaxlib.py loaded as a module (it is a script, not part of the package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("build_jaxlib_entry", ROOT / "build" / "build_jaxlib.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _publish_main():
    """tools/publish_hlo.py's main (a script, not part of the package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("publish_hlo", ROOT / "tools" / "publish_hlo.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.main


def _run_in_process(case: Case, tmp: Path) -> int:
    entry = {"build": lambda: _build_entry().entry, "publish": _publish_main}.get(case.entry, _cli_main)()
    old = signal.signal(signal.SIGALRM, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, max(CASE_LIMIT_S, case.timeout or 0))
    try:
        return entry(case.args(tmp))
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _check(code: int, err: str, before: dict, after: dict) -> None:
    assert "Traceback" not in err, err
    errors = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert code == 2, f"exit {code}: {err}"
    assert len(errors) == 1, err
    assert not errors[0].startswith("error: internal:"), f"a user's mistake reported as the harness's own bug: {err}"
    changed = sorted(k for k, v in before.items() if after.get(k) != v)
    assert not changed, f"changed: {changed}"


def test_enough_cases_over_every_entry_point():
    commands = {c.argv[0] for c in CASES if c.entry == "cli" and c.argv}
    assert len(CASES) >= 300
    assert commands >= {"stress", "report", "merge", "compare", "scan", "gradcheck", "bisect-passes", "bundle",
                        "patches-check", "pr"}
    assert sum(c.entry == "build" for c in CASES) >= 20


# Cases whose command starts a subprocess (bisect's probes, the build's git and tool checks):
# slow, so `make test-fast` stays fast (tests/subprocess_guard.py fails any case missing here).
# So are the cases run as a process of their own, and those tagged as compiling a program or
# starting a child.
SPAWNING_CASES = {
    "bisect-program-unknown", "bisect-mode-unknown", "bisect-dtype-f64", "bisect-seed-negative",
    "bisect-seed-huge", "bisect-heads-indivisible", "build-from-after-to", "build-stamp-non-utf8",
    "build-stamp-not-json", "build-stamp-array", "build-stamp-no-outputs", "build-stamp-outputs-list",
    "build-stamp-deep", "build-stamp-fifo",
}
SLOW_TAGS = {"spawns", "compiles", "tpu"}


def _slow(c: Case) -> bool:
    return c.id in SPAWNING_CASES or c.entry in ("process", "sweep") or bool(SLOW_TAGS & c.tags)


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id, marks=(pytest.mark.slow,) if _slow(c) else ())
                                  for c in CASES])
def test_bad_input(case: Case, tmp_path, monkeypatch, capsys):
    if "tpu" in case.tags:
        from xla_harness.targets import parse_target
        from xla_harness.targets.devices import missing

        why = missing(parse_target("tpu:v6e:2x4"))
        if why:
            pytest.skip(why)
    work = tmp_path / "case"
    work.mkdir()
    case.setup(work)
    before = tree_hashes(work)
    with held_lock(case, work):
        if case.entry in ("process", "sweep"):
            code, signum, out, err, seconds = run_process(case, work, ROOT, max(CASE_LIMIT_S, case.timeout or 0))
        else:
            monkeypatch.chdir(work)
            for key, value in case.environ(work).items():
                monkeypatch.setenv(key, value)
            t0 = time.monotonic()
            code, signum = _run_in_process(case, work), None
            seconds = time.monotonic() - t0
            out, err = capsys.readouterr()
    kind, detail = verdict(case, code, out, err, before, tree_hashes(work), seconds, work, signum)
    if "python-refuses" in case.tags:  # CPython refuses before any harness code: what it does is Python's
        assert kind == "python-startup", (kind, detail, err)
        return
    assert kind == "clear", f"{kind}: {detail}\n{err}"


SUBPROCESS_CASES = ["results-non-utf8-report", "results-deep-nesting-merge", "stress-modes-dup",
                    "scan-file-fifo", "build-stamp-not-json", "stress-resume-other-options-torn-tail"]


@pytest.mark.slow
@pytest.mark.parametrize("case_id", SUBPROCESS_CASES)
def test_bad_input_as_subprocess(case_id, tmp_path):
    case = next(c for c in CASES if c.id == case_id)
    work = tmp_path / "case"
    work.mkdir()
    case.setup(work)
    before = tree_hashes(work)
    entry = [str(ROOT / "build" / "build_jaxlib.py")] if case.entry == "build" else ["-m", "xla_harness.cli"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, *entry, *case.args(work)], cwd=work, env=env, capture_output=True,
                          text=True, timeout=CASE_LIMIT_S, stdin=subprocess.DEVNULL)
    _check(done.returncode, done.stderr, before, tree_hashes(work))


def test_internal_error_is_one_line_and_exit_2(monkeypatch, capsys):
    """The last-resort handler: an unforeseen exception is one `error: internal:` line, exit 2;
    --debug adds the traceback."""
    from xla_harness import cli
    from xla_harness.commands import report

    def boom(args):
        raise ZeroDivisionError("planted")

    monkeypatch.setattr(report, "run", boom)
    assert cli.main(["report", "x"]) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == ["error: internal: ZeroDivisionError: planted (run with --debug for the traceback)"]
    assert cli.main(["--debug", "report", "x"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and err.splitlines()[-1] == "error: internal: ZeroDivisionError: planted"


def test_an_error_line_is_one_printable_line_whatever_it_quotes(monkeypatch, capsys):
    """A user's text in an error (a --target with a control character, a name with a newline) is
    written escaped: one line, nothing the terminal would act on. Planted: the raw text is caught."""
    from xla_harness import cli
    from xla_harness.commands import report
    from xla_harness.errors import HarnessError

    def refuses(args):
        raise HarnessError("--target host\x01: bad\nsecond\x1b[2J line")

    monkeypatch.setattr(report, "run", refuses)
    assert cli.main(["report", "x"]) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == ["error: --target host\\x01: bad\\nsecond\\x1b[2J line"]
    assert not any(c in err[:-1] for c in "\x01\x1b\n")


@pytest.mark.parametrize("exc,needle", [
    (OSError(28, "No space left on device", "out/stress.jsonl"), "error: out/stress.jsonl: No space left on device"),
    (OSError(30, "Read-only file system", "o"), "error: o: Read-only file system"),
    (RecursionError("maximum recursion depth exceeded"), "error: input nested too deeply to process"),
    (UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte"),
     "error: input is not UTF-8 text (invalid start byte at byte 0)"),
])
def test_unmapped_os_and_decode_errors_are_one_line(monkeypatch, capsys, exc, needle):
    from xla_harness import cli
    from xla_harness.commands import report

    def raise_it(args):
        raise exc

    monkeypatch.setattr(report, "run", raise_it)
    assert cli.main(["report", "x"]) == 2
    assert capsys.readouterr().err.splitlines() == [needle]


@pytest.mark.slow
def test_report_into_closed_pipe_exits_quietly(tmp_path):
    """`report | head -1`: the reader closes the pipe; no traceback, no error line."""
    from ..bad_input_cases import GOOD

    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "stress.jsonl").write_bytes(GOOD)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r, w = os.pipe()
    os.close(r)  # nobody reads: the first write fails with EPIPE
    done = subprocess.run([sys.executable, "-m", "xla_harness.cli", "report", str(tmp_path / "r")], stdout=w,
                          stderr=subprocess.PIPE, text=True, env=env, timeout=120)
    os.close(w)
    assert done.stderr == "" and done.returncode == 141


@pytest.mark.parametrize("name", sorted(ODD_VALID_HLO))
def test_odd_but_valid_hlo_is_scanned(name, tmp_path, capsys):
    f = tmp_path / "m.hlo"
    f.write_bytes(ODD_VALID_HLO[name])
    code = _run_in_process(Case(name, ["scan", str(f)]), tmp_path)
    err = capsys.readouterr().err
    assert code == 0 and "error:" not in err and "Traceback" not in err, err
