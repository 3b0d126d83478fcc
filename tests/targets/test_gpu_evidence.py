"""``make gpu-evidence`` (tools/gpu_evidence.py) at a CPU's size (``--tiny``): every step runs in its own
process and lands in the README table it writes, the GPU-only step is said not to run here, and a
budget too small for any step is a failure (exit 1), not an empty success."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "tools" / "gpu_evidence.py"


def _run(*args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, str(TOOL), *args], capture_output=True, text=True, env=env,
                          timeout=timeout, cwd=ROOT)


@pytest.mark.slow
def test_the_tiny_evidence_runs_every_step_and_writes_its_table(tmp_path):
    out = tmp_path / "ev"
    done = _run("--tiny", "--out", str(out), "--budget", "900", timeout=1200)
    assert done.returncode == 0, done.stdout + done.stderr
    outcomes = {o["step"]: o for o in json.loads((out / "outcomes.json").read_text())}
    assert list(outcomes) == ["breakdown", "k16", "k1024", "bench-100", "bench-1000", "first-failure", "memory-plan",
                              "first-block", "frozen", "frozen-deterministic", "memory-plan-full", "memcheck",
                              "full-size"]
    for name in ("breakdown", "k16", "k1024", "bench-100", "bench-1000", "first-failure", "memory-plan",
                 "first-block", "frozen", "memory-plan-full", "memcheck", "full-size"):
        assert outcomes[name]["status"] == "ok", outcomes[name]
        assert outcomes[name]["figures"], name
        assert (out / name / "output.txt").read_text().startswith("$ ")
    assert outcomes["frozen-deterministic"]["status"] == "needs a GPU"
    assert any(f.startswith("first failure: step") for f in outcomes["first-failure"]["figures"])
    assert (out / "frozen" / "stress.jsonl").exists() and (out / "bench-100" / "bench.json").exists()
    breakdown = json.loads((out / "breakdown" / "breakdown.json").read_text())
    parts = breakdown[breakdown["headline"]]["parts_s"]
    assert list(parts) == ["row", "copy", "loop", "verdict and writer"]
    assert isinstance(breakdown[breakdown["headline"]]["adds_up"], bool)
    assert breakdown["trace"]["timelines"] and Path(breakdown["trace"]["file"]).is_file()
    assert json.loads((out / "full-size" / "full.json").read_text())["program"] == "issue-35409"
    dump = sorted(p.name for p in (out / "memory-plan" / "dump").iterdir())
    assert any(n.endswith("buffer-assignment.txt") for n in dump), dump  # the compiler's memory plan
    assert any(n.endswith("after_optimizations.txt") for n in dump), dump
    readme = (out / "README.md").read_text()
    assert "| [frozen](frozen/output.txt) |" in readme and "they measure nothing about a GPU" in readme


@pytest.mark.slow
def test_a_budget_that_fits_no_step_fails_and_a_used_folder_is_refused(tmp_path):
    out = tmp_path / "ev"
    done = _run("--tiny", "--out", str(out), "--budget", "5", timeout=300)
    assert done.returncode == 1, done.stdout + done.stderr
    statuses = {o["status"] for o in json.loads((out / "outcomes.json").read_text())}
    assert statuses <= {"not run", "needs a GPU"} and "not run" in statuses
    again = _run("--tiny", "--out", str(out), timeout=300)
    assert again.returncode == 2 and again.stderr.startswith("error: ") and "not empty" in again.stderr


@pytest.mark.slow
def test_a_bench_that_crashes_is_a_failure_and_a_finding_of_stress_is_a_measurement(tmp_path):
    """Exit 1 is a traceback for a bench script (nothing measured) and a finding for stress."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_evidence", TOOL)
    tool = importlib.util.module_from_spec(spec)
    sys.modules["gpu_evidence"] = tool  # dataclasses look their module up
    spec.loader.exec_module(tool)
    crash = [sys.executable, "-c", "raise SystemExit(1)"]
    bench = tool.Step("bench", "a bench that crashes", crash, 60)
    found = tool.Step("stress", "stress that found something", crash, 60, measured_exits=(0, 1))
    assert tool.run_step(bench, tmp_path, 60, gpu=False).status == "failed (exit 1)"
    assert tool.run_step(found, tmp_path, 60, gpu=False).status == "ok"


@pytest.mark.slow
def test_only_runs_the_named_steps_and_memcheck_reads_both_memory_plans(tmp_path):
    out = tmp_path / "ev"
    done = _run("--tiny", "--out", str(out), "--only", "memory-plan,memory-plan-full,memcheck", timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    outcomes = {o["step"]: o for o in json.loads((out / "outcomes.json").read_text())}
    assert list(outcomes) == ["memory-plan", "memory-plan-full", "memcheck"]
    for name in ("memory-plan", "memory-plan-full"):  # the harness keeps the compiler's live range
        assert any(p.name.endswith("-live-range.txt") for p in (out / name / "hlo").iterdir()), name
    checked = outcomes["memcheck"]["figures"]
    assert len(checked) == 2 and all("0 conflicts" in f and "values compared" in f for f in checked), checked


@pytest.mark.slow
def test_only_names_a_step_that_does_not_exist(tmp_path):
    done = _run("--tiny", "--out", str(tmp_path / "ev"), "--only", "memory-plan,nosuch", timeout=120)
    assert done.returncode == 2 and done.stderr.startswith("error: --only: no step nosuch"), done.stderr
    assert not (tmp_path / "ev").exists()
