"""#27 item 3: SIGTERM during a stuck step or a stuck import ends the run after --stop-grace with the
results written so far kept, and --resume completes them as if nothing had happened.

Planted: a program whose step blocks forever in a host callback at its N-th call (the main thread
waits in compiled code, where a Python signal handler never runs), and a program file whose import
never returns. The checks: the exit status is 143, stderr names the results file and the grace, the
process ends (it is not left running), and a resumed run has every step once with the losses of an
uninterrupted run.
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

from xla_harness.stress.results import store as results

ROOT = Path(__file__).resolve().parents[2]

PROGRAM = textwrap.dedent('''
    """A tiny model whose step blocks forever at call XLA_HARNESS_TEST_STUCK_AT (0: never)."""
    import itertools
    import os
    import time
    from pathlib import Path

    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax

    from xla_harness.programs.interface import TrainProgram, step_from_loss

    def make():
        stuck_at = int(os.environ.get("XLA_HARNESS_TEST_STUCK_AT", "0"))
        marker = os.environ.get("XLA_HARNESS_TEST_STUCK_MARKER", "")
        calls = itertools.count(1)

        def gate(x):
            if next(calls) == stuck_at:
                Path(marker).write_text("stuck")
                time.sleep(10 ** 6)  # stuck inside the step's compiled code
            return np.zeros((), np.float32)

        opt = optax.sgd(0.1)
        inner = step_from_loss(lambda p, b: jnp.mean((b @ p["w"]) ** 2), opt)

        def step(params, opt_state, batch):
            params, opt_state, aux = inner(params, opt_state, batch)
            zero = jax.pure_callback(gate, jax.ShapeDtypeStruct((), jnp.float32), aux["loss"])
            return params, opt_state, {"loss": aux["loss"] + zero}

        def init(key):
            params = {"w": jax.random.normal(key, (4, 4))}
            return params, opt.init(params)

        return TrainProgram(name="stuck", init=init, step=step, donate_argnums=(0, 1),
                            batch=lambda key, step: jax.random.normal(key, (8, 4)))
''')

STUCK_IMPORT = textwrap.dedent('''
    import os
    import time
    from pathlib import Path

    Path(os.environ["XLA_HARNESS_TEST_STUCK_MARKER"]).write_text("stuck")
    time.sleep(10 ** 6)  # an import that never returns

    def make():
        raise AssertionError("never reached")
''')


def _argv(tmp_path: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "xla_harness.cli", "stress", "--program", f"{tmp_path}/stuck.py:make",
            "--seeds", "1,2", "--steps", "12", "--commit", "step", "--quiet", "--out", str(out), *extra]


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1", **extra}


def _steps(out: Path) -> list[tuple]:
    return [(b.label, b.seed, s.step, s.finite, s.loss)
            for b in results.read_results(out / "stress.jsonl").blocks for s in b.steps]


def _wait_for(path: Path, proc: subprocess.Popen, limit: float = 300.0) -> None:
    deadline = time.monotonic() + limit
    while not path.exists():
        if proc.poll() is not None:
            raise AssertionError(f"the run ended before it got stuck: {proc.communicate()[1]}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError("the planted program never got stuck")
        time.sleep(0.05)  # polling a file, not timing anything


def _ended(proc: subprocess.Popen, limit: float) -> tuple[int, str]:
    try:
        _, err = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise AssertionError(f"the run was still going {limit:g} s after SIGTERM") from None
    return proc.returncode, err


@pytest.mark.slow
def test_sigterm_during_a_stuck_step_ends_after_the_grace_and_resume_completes(tmp_path):
    (tmp_path / "stuck.py").write_text(PROGRAM)
    reference = tmp_path / "ref"
    subprocess.run(_argv(tmp_path, reference), env=_env(), check=True, capture_output=True, timeout=600)

    out, marker = tmp_path / "o", tmp_path / "stuck.marker"
    # The 17th call: seed 1's 12 steps are written, seed 2 is stuck at its 5th step.
    env = _env(XLA_HARNESS_TEST_STUCK_AT="17", XLA_HARNESS_TEST_STUCK_MARKER=str(marker))
    proc = subprocess.Popen(_argv(tmp_path, out, "--stop-grace", "2"), env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    _wait_for(marker, proc)
    proc.send_signal(signal.SIGTERM)
    code, err = _ended(proc, 60)
    assert code == 143, err
    assert "did not finish within 2 s" in err and str(out / "stress.jsonl") in err, err
    written = _steps(out)
    assert {(seed, step) for _, seed, step, *_ in written} >= {(1, s) for s in range(12)}
    assert len(written) < 24

    resumed = subprocess.run(_argv(tmp_path, out, "--resume"), env=_env(), capture_output=True, text=True,
                             timeout=600)
    assert resumed.returncode == 0, resumed.stderr
    got = _steps(out)
    keys = [(seed, step) for _, seed, step, *_ in got]
    assert len(keys) == len(set(keys)) == 24
    assert sorted(got) == sorted(_steps(reference))


@pytest.mark.slow
def test_a_second_signal_stops_a_stuck_step_at_once(tmp_path):
    (tmp_path / "stuck.py").write_text(PROGRAM)
    out, marker = tmp_path / "o", tmp_path / "stuck.marker"
    env = _env(XLA_HARNESS_TEST_STUCK_AT="3", XLA_HARNESS_TEST_STUCK_MARKER=str(marker))
    proc = subprocess.Popen(_argv(tmp_path, out, "--stop-grace", "3600"), env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    _wait_for(marker, proc)
    proc.send_signal(signal.SIGTERM)
    assert proc.stderr is not None
    first = ""
    while "finishing the current step" not in first and (line := proc.stderr.readline()):
        first += line  # what the first signal does, said by the watchdog while the step is stuck
    assert "finishing the current step (at most 3600 s more" in first, first
    proc.send_signal(signal.SIGTERM)
    code, err = _ended(proc, 60)
    assert code == 143 and "stopped at once (a second signal)" in err, err


@pytest.mark.slow
def test_sigterm_during_a_stuck_import_ends_after_the_grace(tmp_path):
    (tmp_path / "stuck.py").write_text(STUCK_IMPORT)
    out, marker = tmp_path / "o", tmp_path / "stuck.marker"
    proc = subprocess.Popen(_argv(tmp_path, out, "--stop-grace", "1"), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=_env(XLA_HARNESS_TEST_STUCK_MARKER=str(marker)))
    _wait_for(marker, proc)
    proc.send_signal(signal.SIGTERM)
    code, err = _ended(proc, 60)
    assert code == 143 and "did not finish within 1 s" in err, err
    assert "Traceback" not in err


@pytest.mark.parametrize("bad", ["-1", "nan", "inf"])
def test_stop_grace_is_checked(tmp_path, capsys, bad):
    from xla_harness.cli import main

    assert main(["stress", "--out", str(tmp_path / "o"), "--steps", "1", "--stop-grace", bad]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: xla-harness stress: argument --stop-grace: must be"), lines
    assert not (tmp_path / "o").exists()
