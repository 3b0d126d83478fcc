"""A user's program that calls ``os._exit`` inside the harness's process is an error of the program
(one line, exit 2, the steps measured before it kept), never an exit 0 with a results file holding
only its header; a forked child and the harness's own exit still end as they ask."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from xla_harness.programs.interface import ProgramExited, process_exit_guarded

ROOT = Path(__file__).resolve().parents[2]
EXITS = '''
import os
import jax, jax.numpy as jnp, optax
from xla_harness.programs.interface import TrainProgram, step_from_loss
opt = optax.sgd(0.01)
def init(key):
    p = {"w": jax.random.normal(key, (4, 3))}
    return p, opt.init(p)
def batch(key, step):
    if isinstance(step, int) and step == EXIT_AT:
        os._exit(0)  # the program ends its own process
    return {"x": jax.random.normal(key, (8, 4))}
def make():
    return TrainProgram(name="exits", init=init, batch=batch,
                        step=step_from_loss(lambda p, b: jnp.mean((b["x"] @ p["w"]) ** 2), opt))
'''


@pytest.mark.slow
@pytest.mark.parametrize("exit_at", [0, 5])
def test_a_program_that_calls_os_exit_is_its_error_not_a_measured_run(tmp_path, exit_at):
    (tmp_path / "exits.py").write_text(EXITS.replace("EXIT_AT", str(exit_at)))
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "xla_harness", "stress", "--program", f"{tmp_path}/exits.py:make",
                           "--steps", "8", "--block", "2", "--out", str(out)], capture_output=True, text=True,
                          timeout=600, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 2, (done.returncode, done.stderr)
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "batch called os._exit(0)" in errors[0], done.stderr
    assert "Traceback" not in done.stderr
    records = [json.loads(line) for line in (out / "stress.jsonl").read_text().splitlines()]
    steps = sum(r["end"] - r["start"] for r in records if r.get("kind") == "block")
    assert steps == (4 if exit_at == 5 else 0)  # the blocks finished before the exit are kept


def test_the_guard_lets_a_forked_child_and_the_harness_exit_and_restores_os_exit():
    real = os._exit
    with process_exit_guarded():
        with pytest.raises(ProgramExited, match=r"os\._exit\(3\)"):
            os._exit(3)
        pid = os.fork()
        if pid == 0:
            os._exit(7)  # a forked child is not the harness's process: it ends as asked
        assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 7
    assert os._exit is real


@pytest.mark.slow
@pytest.mark.parametrize("commit", ["block", "step"])
def test_the_steps_that_ran_before_a_programs_error_are_recorded(tmp_path, commit):
    (tmp_path / "exits.py").write_text(EXITS.replace("EXIT_AT", "5").replace("os._exit(0)", "raise ValueError('no')"))
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "xla_harness", "stress", "--program", f"{tmp_path}/exits.py:make",
                           "--steps", "8", "--block", "2", "--commit", commit, "--out", str(out)],
                          capture_output=True, text=True, timeout=600, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 2 and "batch raised ValueError: no" in done.stderr, done.stderr
    records = [json.loads(line) for line in (out / "stress.jsonl").read_text().splitlines()]
    assert sum(r["end"] - r["start"] for r in records if r.get("kind") == "block") == (4 if commit == "block" else 5)
