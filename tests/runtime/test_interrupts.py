"""An interrupt during the program's init, tracing or compile ends the run as an interrupt (130/143,
saying where it arrived), never as the program's error.

What happened on a GPU (results/gpu/README.md): `timeout` sent SIGTERM to the process group while
jax compiled the program's init, the signal killed `ptxas`, XLA raised "ptxas exited with non-zero
error code 15", and the harness reported `error: --program issue-35409: init raised
JaxRuntimeError ...`. Planted here the same way: an init (or a step being traced) that waits on a
child process, and the signal sent to the whole group, so the child dies of it and the user's code
raises because of it. The control: the same program failing with no signal is the program's error.
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

from xla_harness.errors import HarnessError
from xla_harness.programs.interface import guard_user_error
from xla_harness.runtime import interrupts

ROOT = Path(__file__).resolve().parents[2]

PROGRAM = textwrap.dedent('''
    """init (or the step, when traced) runs a child that waits, as XLA waits on ptxas; the child's
    death raises CalledProcessError in the user's code."""
    import itertools
    import os
    import subprocess

    import jax
    import jax.numpy as jnp
    import optax

    from xla_harness.programs.interface import TrainProgram, step_from_loss

    def make(devices=None, where="init"):
        opt = optax.sgd(0.1)
        calls = itertools.count()
        inner = step_from_loss(lambda p, b: jnp.mean((b @ p["w"]) ** 2), opt)

        def wait_on_child():  # the child writes the marker itself: a signal sent after it reaches the child
            subprocess.run(["sh", "-c", 'echo waiting > "$XLA_HARNESS_TEST_MARKER" && exec sleep "$1"', "sh",
                            os.environ.get("XLA_HARNESS_TEST_CHILD_S", "600")], check=True)

        def init(key):
            if where == "init" and next(calls) == 1:  # the real call (the first is jax.eval_shape's)
                wait_on_child()
            params = {"w": jax.random.normal(key, (4, 4))}
            return params, opt.init(params)

        def step(params, opt_state, batch):
            if where == "step":  # runs while the step is traced
                wait_on_child()
            return inner(params, opt_state, batch)

        return TrainProgram(name="waits", init=init, step=step, donate_argnums=(0, 1),
                            batch=lambda key, step: jax.random.normal(key, (8, 4)))
''')


def _run(tmp_path: Path, argv: list[str], signum: int | None, **env: str) -> tuple[int, str]:
    """Run the CLI in its own process group; once the planted child is waiting, send ``signum`` to the
    group (as `timeout` and a terminal's Ctrl-C do). None: no signal (the child's own exit decides)."""
    marker = tmp_path / "marker"
    marker.unlink(missing_ok=True)
    proc = subprocess.Popen([sys.executable, "-m", "xla_harness", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT), "XLA_HARNESS_TEST_MARKER": str(marker),
                                 **env})
    try:
        if signum is not None:
            deadline = time.monotonic() + 300
            while not marker.exists():
                assert proc.poll() is None, f"ended before the planted wait: {proc.communicate()[1]}"
                assert time.monotonic() < deadline, "the planted program never started waiting"
                time.sleep(0.05)  # polling a file, not timing anything
            os.killpg(proc.pid, signum)
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    return proc.returncode, err


@pytest.mark.slow
@pytest.mark.parametrize("signum,code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_an_interrupt_during_init_is_an_interrupt_not_the_programs_error(tmp_path, signum, code):
    (tmp_path / "waits.py").write_text(PROGRAM)
    argv = ["stress", "--program", f"{tmp_path}/waits.py:make", "--seeds", "1", "--steps", "2", "--quiet",
            "--out", str(tmp_path / "out")]
    rc, err = _run(tmp_path, argv, signum)
    assert rc == code, err
    name = signal.Signals(signum).name
    assert f"interrupted by {name} while --program {tmp_path}/waits.py:make was in init" in err
    assert "CalledProcessError" in err and "not an error of the program" in err  # what it broke, named
    assert "error:" not in err and "Traceback" not in err
    # The control: the same child failing on its own (no signal) is the program's error.
    argv[-1] = str(tmp_path / "control")
    rc, err = _run(tmp_path, argv, None, XLA_HARNESS_TEST_CHILD_S="not-a-number")
    assert rc == 2 and err.count("error:") == 1
    assert f"error: --program {tmp_path}/waits.py:make: init raised CalledProcessError" in err


@pytest.mark.slow
def test_an_interrupt_while_compile_only_traces_the_step_says_where(tmp_path):
    (tmp_path / "waits.py").write_text(PROGRAM)
    argv = ["stress", "--program", f"{tmp_path}/waits.py:make", "--program-option", "where=step",
            "--compile-only", "--quiet"]
    rc, err = _run(tmp_path, argv, signal.SIGTERM)
    assert rc == 143, err
    assert f"interrupted by SIGTERM while --program {tmp_path}/waits.py:make was in tracing step" in err
    assert "error:" not in err and "Traceback" not in err


def test_guard_user_error_blames_the_program_until_an_interrupt_arrives():
    interrupts.forget()
    try:
        err = guard_user_error(RuntimeError("INTERNAL: ptxas exited with non-zero error code 15"), "p.py:make",
                               "init")
        assert isinstance(err, HarnessError) and "init raised RuntimeError" in str(err)
        interrupts.record(signal.SIGTERM)
        with pytest.raises(interrupts.Interrupted) as got:
            guard_user_error(RuntimeError("INTERNAL: ptxas exited with non-zero error code 15"), "p.py:make", "init")
        assert got.value.exit_code == 143
        assert str(got.value) == ("interrupted by SIGTERM while --program p.py:make was in init (what it then "
                                  "raised, RuntimeError: INTERNAL: ptxas exited with non-zero error code 15, is "
                                  "the signal's doing, not an error of the program)")
        # An Interrupted raised inside the call (compile-only's handler) keeps its signal and learns where.
        with pytest.raises(interrupts.Interrupted) as got:
            guard_user_error(interrupts.Interrupted(signal.SIGINT), "p.py:make", "tracing step")
        assert got.value.exit_code == 130 and "while --program p.py:make was in tracing step" in str(got.value)
    finally:
        interrupts.forget()


def test_a_run_starts_and_ends_with_a_clean_record():
    """A signal recorded by one run (the pytest plugin runs several in a process) does not turn a later
    run's program error into an interrupt."""
    from xla_harness.stress.stopping import StopFlag

    interrupts.record(signal.SIGTERM)
    stop = StopFlag()
    stop.install()
    try:
        assert interrupts.received() is None
        interrupts.record(signal.SIGINT)
    finally:
        stop.restore()
    assert interrupts.received() is None
    interrupts.record(signal.SIGTERM)
    with interrupts.raising_on_signal():
        assert interrupts.received() is None
    assert interrupts.received() is None
