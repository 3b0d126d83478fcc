"""#34 item 6: the start of a command.

Ctrl-C during start-up: in the first ~0.05 s a KeyboardInterrupt traceback; at ~0.12-0.15 s
``error: internal: ImportError`` (jaxlib's extension turns an interrupt during its import into an
ImportError); once in ~20 the interrupt was swallowed and the run finished with exit 0. Any
SIGINT/SIGTERM from the harness's first instruction on now ends the command with 130/143: the
package's first line notes it when started as the CLI (xla_harness/_early.py), the CLI raises it
where that is safe, and outside imports only (raised inside one it breaks the module).
(Item 7, the compiler's settings: tests/targets/test_envcheck.py.)
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from xla_harness.runtime import interrupts

from ..bad_input_cases import Case, as_from_a_terminal, run_process

ROOT = Path(__file__).resolve().parents[2]


STRESS = ["stress", "--quiet", "--out", "{tmp}/o", "--modes", "full", "--remat", "on", "--seeds", "1", "--steps", "2",
          "--vocab", "64", "--d-model", "32", "--layers", "1", "--heads", "2", "--seq", "8", "--batch", "8"]


def _run(tmp_path: Path, argv: list[str], sig: int, at: float, **env: str):
    work = tmp_path / f"w{at}"
    work.mkdir()
    case = Case("start-up", argv, entry="process", expect=128 + sig, signal=(sig, at), env=env)
    return run_process(case, work, ROOT, 300)


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("argv", [["report", "{tmp}/nothere"], ["--version"], STRESS],
                         ids=["report", "version", "stress"])
def test_a_signal_that_arrives_before_the_first_instruction_ends_the_command(argv, sig, tmp_path):
    """The signal is pending from before the interpreter starts (blocked across exec): the harness's first
    line takes it. Before, it was never taken (the run finished, exit 0) or the default handler's
    traceback was printed."""
    code, signum, _, err, _ = _run(tmp_path, argv, sig, -1)
    name = signal.Signals(sig).name
    assert (code, signum) == (128 + sig, None), err
    assert err.strip().splitlines() == [f"interrupted by {name} while starting"]


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_anywhere_in_start_up_is_an_interrupt(sig, tmp_path):
    """Across the start-up (imports of the harness and jax, the backend, the compile, the first steps):
    exit 130/143, no traceback, no error line, never exit 0."""
    seen = []
    for at in (0.06, 0.12, 0.2, 0.3, 0.45, 0.7):
        code, signum, _, err, seconds = _run(tmp_path, STRESS, sig, at)
        if "<frozen site>" in err and "xla_harness" not in err:
            continue  # the interpreter's own start-up, before any harness code (a loaded machine)
        seen.append(at)
        assert (code, signum) == (128 + sig, None), (at, err)
        assert "Traceback" not in err and "error:" not in err, (at, err)
        assert seconds < 60, (at, seconds)  # a thread a library left running does not hold the exit
    assert seen


def test_an_error_an_interrupt_provoked_is_the_interrupts(capsys):
    """jaxlib reports an interrupt during its import as ImportError: once a signal has arrived, what it
    broke is the interrupt's (130/143), never ``error: internal:``."""
    from xla_harness.cli import guarded

    def entry(argv):
        interrupts.record(signal.SIGINT)
        raise ImportError("Encountered an error while initializing the extension.")

    try:
        assert guarded(entry, []) == 130
    finally:
        interrupts.forget()
    err = capsys.readouterr().err.splitlines()
    assert err == ["interrupted by SIGINT (what it then raised, ImportError: Encountered an error while "
                   "initializing the extension., is the signal's doing, not an error of the program)"]


def test_a_swallowed_signal_still_ends_the_command(monkeypatch, capsys):
    """A signal whose exception was swallowed on its way (raised in a finalizer, only printed) and a run
    that then finished: the command still ends as interrupted, not with exit 0."""
    from xla_harness.cli import main
    from xla_harness.commands import report

    def swallowed(args):
        interrupts.record(signal.SIGTERM)  # what the CLI's handler does before raising
        return 0

    monkeypatch.setattr(report, "run", swallowed)
    assert main(["report", "x"]) == 143
    assert capsys.readouterr().err.splitlines() == ["interrupted by SIGTERM"]
    assert interrupts.received() is None  # the command's record ends with it


def test_a_run_takes_a_signal_recorded_while_its_command_started(monkeypatch):
    """Under the CLI, a signal recorded before the stop flag was installed stops the run there (it was
    cleared and so lost); outside the CLI (several runs in one process) it stays an earlier run's."""
    from xla_harness.stress.stopping import StopFlag

    old = interrupts.cli_handlers()
    try:
        interrupts.record(signal.SIGINT)
        with pytest.raises(interrupts.Interrupted) as got:
            StopFlag().install()
        assert got.value.exit_code == 130 and "before the first step" in str(got.value)
        interrupts.record(signal.SIGTERM)
        with pytest.raises(interrupts.Interrupted), interrupts.raising_on_signal():
            pytest.fail("ran")
    finally:
        interrupts.restore(old)
    assert interrupts.received() is None


def test_the_first_instruction_is_the_package_s_first_line():
    """Started as the CLI (and only then) the package's first code notes SIGINT/SIGTERM."""
    from xla_harness._early import started_as_cli

    assert started_as_cli(["/v/bin/python", "/v/bin/xla-harness", "stress"])
    assert started_as_cli(["python", "-m", "xla_harness", "scan"])
    assert started_as_cli(["python", "-X", "importtime", "-m", "xla_harness.cli", "report"])
    assert not started_as_cli(["python", "-m", "pytest", "tests"])
    assert not started_as_cli(["python", "my_script.py"])
    assert not started_as_cli(["python", "-c", "import xla_harness"])
    first = (ROOT / "xla_harness" / "__init__.py").read_text().split('"""', 2)[2]
    code = [ln for ln in first.splitlines() if ln.strip() and not ln.startswith("#")]  # isort keeps it first
    assert code[:2] == ["from __future__ import annotations",
                        "import xla_harness._early  # noqa: F401 - first: started as the CLI, signals are noted "
                        "from here on"]


@pytest.mark.slow
def test_an_interrupt_inside_an_import_waits_for_the_import(tmp_path):
    """A signal during a slow import of the user's program: the import finishes whole, then the command
    ends as interrupted (raised inside the import it could leave a half-built module, or abort a C
    extension's init)."""
    prog = tmp_path / "slow_import.py"
    prog.write_text(textwrap.dedent("""
        import os, time
        open(os.environ["MARKER"], "w").close()
        t0 = time.monotonic()
        while time.monotonic() - t0 < 3:  # busy: Python code runs, so a raising handler would raise here
            pass
        FINISHED = True
        def make():
            raise SystemExit("never reached")
    """))
    marker = tmp_path / "marker"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MARKER": str(marker)}
    proc = subprocess.Popen([sys.executable, "-m", "xla_harness", "scan", "--model", f"{prog}:make"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=lambda: as_from_a_terminal(set()))
    deadline = time.monotonic() + 120
    while not marker.exists():
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)  # polling a file, not timing anything
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "error:" not in err
