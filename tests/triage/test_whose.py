"""triage says whose the NaN is before it blames a compiler: the answer, --json and the report lead
with each failing step's origin, and variants and pass bisection run only for a compiler's or a race's
failure (on programs planted with each cause: tests/origin/programs)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from xla_harness.triage import whose
from xla_harness.triage.where import SeedTrace

ROOT = Path(__file__).resolve().parents[2]
PROGRAMS = ROOT / "tests" / "origin" / "programs"
WHOSE = f"{PROGRAMS / 'whose.py'}:make"


def _trace(stage: str, steps: int, bad: dict[int, dict | None], planted=()) -> SeedTrace:
    t = SeedTrace(stage, "cfg", 1, "round-1", steps=steps)
    t.bad = [(s, "loss", s in planted) for s in sorted(bad)]
    t.origins = {s: o for s, o in bad.items() if o is not None}
    return t


def _input(leaf: str) -> dict:
    return {"class": "input", "summary": f"non-finite input in your batch: {leaf}[2, 5] is NaN", "where": None,
            "evidence": {"leaves": [{"leaf": leaf}]}}


def test_the_lead_says_how_many_failed_and_whose_they_are():
    t = _trace("train", 59, {3: _input("batch['weights']"), 11: _input("batch['weights']")})
    assert whose.lead([t]) == ["2 of 59 train steps non-finite, both from your batch (batch['weights'][2, 5] is "
                               "NaN) at steps 3 and 11"]
    assert not whose.compiler_suspected([t]) and whose.compiler_cleared([t])


def test_an_undecided_step_keeps_the_compiler_a_suspect():
    unknown = {"class": "unknown", "summary": "the step could not be evaluated op by op", "where": None,
               "evidence": {}}
    t = _trace("train", 59, {3: _input("batch['x']"), 11: unknown})
    assert not whose.compiler_cleared([t]) and whose.compiler_suspected([t])
    planted_only = _trace("train", 59, {3: None}, planted=(3,))
    assert not whose.compiler_cleared([planted_only]) and whose.compiler_suspected([planted_only])
    assert not whose.compiler_suspected([_trace("train", 59, {})])


def test_mixed_origins_are_counted_and_a_compiler_failure_makes_it_a_suspect():
    compiler = {"class": "compiler", "summary": "the compiler's", "where": None, "evidence": {}}
    t = _trace("train", 100, {1: _input("batch['x']"), 5: compiler, 9: None, 12: None}, planted=(12,))
    assert whose.counts([t]) == {"input": 1, "compiler": 1, "planted": 1, "unexplained": 1}
    assert whose.compiler_suspected([t])
    lead = whose.lead([t])[0]
    assert lead.startswith("4 of 100 train steps non-finite, 1 from your batch")
    assert "1 from the compiler" in lead and "1 planted by --inject" in lead and "1 not explained" in lead


def test_a_frozen_seed_shares_its_explained_calls_origin():
    t = _trace("frozen", 10, {0: _input("batch['x']"), 1: None, 2: None})
    assert whose.counts([t]) == {"input": 3}


def _triage(tmp_path: Path, *args: str) -> tuple[int, dict]:
    done = subprocess.run([sys.executable, "-m", "xla_harness", "triage", *args, "--budget", "3", "--json",
                           "--out", str(tmp_path / "t")], capture_output=True, text=True, timeout=600, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode in (0, 1), done.stderr
    return done.returncode, json.loads(done.stdout)


def _steps(got: dict) -> list[tuple[str, int, str]]:
    return [(w["stage"], s["step"], (s["origin"] or {}).get("class")) for w in got["where"]
            for s in w["nonfinite_steps"]]


@pytest.mark.slow
def test_a_nan_in_the_batch_is_named_first_and_no_compiler_is_bisected(tmp_path):
    code, got = _triage(tmp_path, "--program", WHOSE, "--program-option", "kind=batch-nan")
    assert code == 1
    assert ("train", 3, "input") in _steps(got) and ("train", 11, "input") in _steps(got)
    assert got["answer"].startswith("On this cpu: 2 of 59 train steps non-finite, both from your batch "
                                    "(batch['x'][2, 1] is NaN) at steps 3 and 11")
    stages = got["triage"]["stages"]
    assert stages["bisect"]["skipped"].startswith("not run: every explained failing step is your input's, your "
                                                  "program's or float32's (2 input)")
    assert stages["variants"]["skipped"] == stages["bisect"]["skipped"]
    assert not (tmp_path / "t" / "stages" / "bisect" / "bisect").exists()
    assert not (tmp_path / "t" / "repro.tar.gz").exists()
    assert got["origins"]["counts"] == {"input": 2} and got["origins"]["compiler_suspected"] is False
    report = (tmp_path / "t" / "report.md").read_text()
    assert report.index("## Whose NaN") < report.index("## Where")
    assert "| train | 1 | 3 | input | - | non-finite input in your batch: batch['x'][2, 1] is NaN |" in report


@pytest.mark.slow
@pytest.mark.parametrize("kind,cls,primitive", [("zero-over-zero", "program", "div"),
                                                ("overflow", "precision", "exp")])
def test_a_program_or_precision_nan_names_the_line_in_the_sibling_module(tmp_path, kind, cls, primitive):
    code, got = _triage(tmp_path, "--program", WHOSE, "--program-option", f"kind={kind}")
    assert code == 1
    origins = [s["origin"] for w in got["where"] for s in w["nonfinite_steps"]]
    assert {o["class"] for o in origins} == {cls}
    lines = (PROGRAMS / "whose_losses.py").read_text().splitlines()
    line = next(i for i, t in enumerate(lines, 1) if t.endswith(f"# plant: {kind}"))
    assert {(o["where"]["file"], o["where"]["line"], o["where"]["primitive"]) for o in origins} == \
        {(str(PROGRAMS / "whose_losses.py"), line, primitive)}
    assert "skipped" in got["triage"]["stages"]["bisect"]


@pytest.mark.slow
def test_a_compiler_fault_is_bisected(tmp_path):
    code, got = _triage(tmp_path, "--program", f"{PROGRAMS / 'compiled_fault.py'}:make", "--explain-max", "1")
    assert code == 1
    classes = {s["origin"]["class"] for w in got["where"] for s in w["nonfinite_steps"] if s["origin"]}
    assert classes == {"compiler"} and got["origins"]["compiler_suspected"] is True
    stages = got["triage"]["stages"]
    assert "skipped" not in stages["bisect"] and "Pass bisection: " in got["answer"]
    assert got["triage"]["spec"]["explain_max"] == 1


# The head every small program below shares: the imports, the optimizer, init.
PROGRAM_HEAD = '''
import os
import time
import jax, jax.numpy as jnp, numpy as np, optax
from xla_harness.programs.interface import TrainProgram, step_from_loss
opt = optax.sgd(0.01)
def init(key):
    p = {"w": jax.random.normal(key, (4, 3))}
    return p, opt.init(p)
'''
EXITS = PROGRAM_HEAD + '''
def batch(key, step):
    if isinstance(step, int) and step == 0:
        os._exit(0)  # the program ends its own process before its first step
    return {"x": jax.random.normal(key, (8, 4))}
def make():
    return TrainProgram(name="exits", init=init, batch=batch,
                        step=step_from_loss(lambda p, b: jnp.mean((b["x"] @ p["w"]) ** 2), opt))
'''


@pytest.mark.slow
@pytest.mark.parametrize("ends,said", [
    ("os._exit(0)", "frozen failed: error: --program {program}: batch called os._exit(0), which would have ended "
                    "the harness's process"),
    ("os.kill(os.getpid(), 9)", "frozen failed: its process was killed by SIGKILL (signal 9) before it said "
                                "anything")])
def test_a_round_that_records_no_step_is_said_not_a_crash(tmp_path, ends, said):
    (tmp_path / "exits.py").write_text(EXITS.replace("os._exit(0)", ends))
    program = f"{tmp_path}/exits.py:make"
    done = subprocess.run([sys.executable, "-m", "xla_harness", "triage", "--program", program,
                           "--budget", "1", "--out", str(tmp_path / "t")], capture_output=True, text=True,
                          timeout=600, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 2, done.stderr  # measured: the compile only; the local questions unanswered
    assert "internal" not in done.stderr and "Traceback" not in done.stderr
    assert said.format(program=program) in done.stdout, done.stdout
    assert (tmp_path / "t" / "report.html").is_file()
    state = json.loads((tmp_path / "t" / "triage.json").read_text())
    assert state["stages"]["variants"]["skipped"].startswith("not run: no local stage recorded a step")


HANGS = PROGRAM_HEAD + '''
def batch(key, step):
    return {"x": jax.random.normal(key, (8, 4)), "step": jnp.asarray(step, jnp.int32)}
def wait(step):
    if int(step) == 3:  # the train protocol's step 3 (the frozen protocol calls step 0's batch)
        time.sleep(3600)  # a collective that never completes
    return np.float32(0.0)
def loss(p, b):
    z = jax.experimental.io_callback(wait, jax.ShapeDtypeStruct((), jnp.float32), b["step"])
    return jnp.mean((b["x"] @ p["w"]) ** 2) + z
def make():
    return TrainProgram(name="hangs", init=init, batch=batch, step=step_from_loss(loss, opt))
'''


@pytest.mark.slow
def test_a_step_that_hangs_is_said_and_the_budget_holds(tmp_path):
    (tmp_path / "hangs.py").write_text(HANGS)
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "xla_harness", "triage", "--program", f"{tmp_path}/hangs.py:make",
                           "--budget", "1", "--out", str(tmp_path / "t")], capture_output=True, text=True,
                          timeout=600, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert time.monotonic() - t0 < 60 + 15  # the budget, within the stop grace and start-up
    assert done.returncode == 2, done.stderr  # what was measured stands; the train question stays open
    assert "Train: round 1 was stopped at its time limit" in done.stdout and "steps recorded" in done.stdout
    state = json.loads((tmp_path / "t" / "triage.json").read_text())
    assert state["stages"]["frozen"]["answer"] == "bounded"  # what ran before the hang is kept
    assert (tmp_path / "t" / "report.html").is_file()
