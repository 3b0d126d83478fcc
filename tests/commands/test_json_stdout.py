"""--json: stdout is the JSON alone, whatever the user's program prints (at import, in its factory, or
``jax.debug.print`` in its step); what it printed goes to stderr, where it is still seen."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PRINTER = '''
import jax, jax.numpy as jnp, optax
from xla_harness.programs.interface import TrainProgram, step_from_loss
print("printed at import")
opt = optax.sgd(0.01)
def init(key):
    p = {"w": jax.random.normal(key, (4, 3))}
    return p, opt.init(p)
def batch(key, step):
    return {"x": jax.random.normal(key, (8, 4))}
def loss(p, b):
    jax.debug.print("printed in the step {}", jnp.mean(b["x"]))
    return jnp.mean((b["x"] @ p["w"]) ** 2)
def make():
    print("printed by make")
    return TrainProgram(name="printer", init=init, batch=batch, step=step_from_loss(loss, opt))
'''


def _run(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess:
    (tmp_path / "printer.py").write_text(PRINTER)
    return subprocess.run([sys.executable, "-m", "xla_harness", *argv, "--program", f"{tmp_path}/printer.py:make",
                           "--json", "--out", str(tmp_path / "out")], capture_output=True, text=True, timeout=600,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})


@pytest.mark.slow
def test_stress_json_is_the_json_alone(tmp_path):
    done = _run(tmp_path, "stress", "--seeds", "1", "--steps", "3", "--quiet")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["configs"][0]["per_seed"]["1"]["steps"] == 3
    assert "printed at import" in done.stderr and "printed in the step" in done.stderr


@pytest.mark.slow
def test_triage_json_is_the_json_alone(tmp_path):
    done = _run(tmp_path, "triage", "--budget", "1", "--quiet")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["exit_code"] == 0
    assert "printed at import" in done.stderr
