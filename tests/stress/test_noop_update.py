"""A run whose every finite step changed no parameter (max |update| exactly 0: a learning rate of 0,
as a warmup gives at step 0) is flagged: the step it measured is a no-op update, not the training
step. A run with one real update, or with no update recorded (the block commit), is not flagged."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from xla_harness.stress.report import as_json as report_json
from xla_harness.stress.report import summary as report
from xla_harness.stress.results import records
from xla_harness.stress.results.store import Results

ROOT = Path(__file__).resolve().parents[2]


def _results(updates: list[float | None], finite: list[bool] | None = None) -> Results:
    finite = finite or [True] * len(updates)
    steps = tuple(records.Step(step=i, finite=f, first_bad=None if f else "loss", max_abs_update=u,
                               loss=1.0 if f else None) for i, (u, f) in enumerate(zip(updates, finite, strict=True)))
    block = records.Block(label="prog", seed=1, start=0, end=len(steps), nonfinite=sum(not f for f in finite),
                          silent=0, steps=steps, config={}, env={}, time="", protocol="frozen")
    header = records.Header(spec={"program": "p.py:make"}, fingerprint="f", env={}, time="")
    return Results(Path("stress.jsonl"), header, [block])


def noop_warnings(table: report.Table) -> list[str]:
    return [w for w in table.warnings if "no-op update" in w]


def test_every_zero_update_is_flagged():
    table = report.summarize([_results([0.0, 0.0, 0.0])])
    assert len(noop_warnings(table)) == 1 and "all 3" in noop_warnings(table)[0]
    assert json.loads(report_json.dumps(table))["warnings"] == table.warnings


@pytest.mark.parametrize("updates, finite", [([0.0, 1e-7, 0.0], None), ([None, None], None),
                                             ([0.0, None], [True, False])])
def test_a_real_update_or_none_recorded_is_not_flagged(updates, finite):
    # a non-finite step's update is not an update of the trained state; only finite steps count
    table = report.summarize([_results(updates, finite)])
    if finite == [True, False]:
        assert len(noop_warnings(table)) == 1 and "all 1" in noop_warnings(table)[0]
    else:
        assert noop_warnings(table) == []


PROGRAM = '''
import jax.numpy as jnp
from xla_harness.programs.interface import TrainProgram

def make(lr=0.0):
    def init(key):
        return {"w": jnp.ones((3,))}, {"m": jnp.zeros((3,))}
    def batch(key, step):
        return jnp.ones((3,))
    def step(p, o, x):
        return {"w": p["w"] - lr * x}, {"m": o["m"] + x}, {"loss": jnp.sum(p["w"] * x)}
    return TrainProgram(name="warm", init=init, batch=batch, step=step)
'''


@pytest.mark.slow
def test_stress_frozen_says_so_on_stderr(tmp_path):
    (tmp_path / "warm.py").write_text(PROGRAM)
    for lr, flagged in (("0.0", True), ("0.1", False)):
        done = subprocess.run([sys.executable, "-m", "xla_harness.cli", "stress", "--program",
                               f"{tmp_path}/warm.py:make", "--program-option", f"lr={lr}", "--protocol", "frozen",
                               "--steps", "3", "--seeds", "1", "--out", str(tmp_path / f"out{lr}")],
                              capture_output=True, text=True, timeout=600, cwd=ROOT)
        assert done.returncode == 0, done.stderr
        assert ("no-op update" in done.stderr) == flagged, done.stderr
