"""The README's recipes run as written: examples/quickstart/my_model.py under the CLI, and
examples/quickstart/test_my_model.py under pytest with the plugin's opt-in fixture."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_pytest_recipe_passes_and_its_planted_test_fails():
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--xla-harness-stress",
                          "--xla-harness-steps", "10", "examples/quickstart/test_my_model.py"],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:]
    assert "1 passed, 1 xfailed" in run.stdout
    skipped = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                              "examples/quickstart/test_my_model.py"], cwd=ROOT, capture_output=True, text=True,
                             timeout=600)
    assert skipped.returncode == 0 and "2 skipped" in skipped.stdout, skipped.stdout[-3000:]


@pytest.mark.slow
def test_stress_recipe_counts_planted_nans_and_exits_1(tmp_path):
    run = subprocess.run([sys.executable, "-m", "xla_harness.cli", "stress", "--program",
                          "examples/quickstart/my_model.py:make", "--seeds", "1", "--steps", "20", "--inject", "nan",
                          "--inject-rate", "0.2", "--fail-on-nonfinite", "--out", str(tmp_path / "r")],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 1, run.stderr[-3000:]
    assert "= plain jax.jit(step" in run.stdout and "examples/quickstart/my_model.py:make" in run.stdout
