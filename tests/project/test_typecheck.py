"""The type check of pyproject.toml's [tool.mypy] (what `make lint` runs after lint-imports).

As subprocesses (slow): ``mypy`` passes on the package, and fails on a copy of the package with
a type error planted in one module (the class of bug it is there for: a ``re.Match | None`` used
as a match), so the check can fail.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

pytest.importorskip("mypy", reason="not checked: mypy is not installed (the dev extra; make setup installs it)")

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "xla_harness"


def mypy(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    """``mypy`` as `make lint` runs it (no arguments: files and options from ``cwd/pyproject.toml``)."""
    env = {**os.environ, "NO_COLOR": "1", "MYPY_FORCE_COLOR": "0"}
    return subprocess.run([sys.executable, "-m", "mypy", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def test_config_checks_the_package_as_the_oldest_supported_python():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    mypy_config = config["tool"]["mypy"]
    assert mypy_config["files"] == [PACKAGE] and mypy_config["warn_unused_ignores"] is True
    floor = config["project"]["requires-python"].removeprefix(">=")
    assert mypy_config["python_version"] == floor


@pytest.mark.slow
def test_mypy_passes():
    res = mypy(ROOT)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "Success: no issues found" in res.stdout, res.stdout


@pytest.mark.slow
def test_mypy_fails_on_a_copy_with_a_planted_type_error(tmp_path):
    shutil.copytree(ROOT / PACKAGE, tmp_path / PACKAGE, ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.o"))
    shutil.copyfile(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    # Seed the copy's cache with this tree's (jax, numpy and the standard library unchanged): only
    # the package is checked again, in seconds instead of a cold run's half minute.
    version = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["mypy"]["python_version"]
    cached = ROOT / ".mypy_cache" / version
    if cached.is_dir():
        shutil.copytree(cached, tmp_path / ".mypy_cache" / version)
    errors = tmp_path / PACKAGE / "errors.py"
    errors.write_text(errors.read_text(encoding="utf-8") + "\n\ndef _planted(text: str) -> int:\n"
                      "    import re\n\n"
                      "    return re.match(r\"\\d+\", text).end()  # None when text does not start with a digit\n",
                      encoding="utf-8")
    res = mypy(tmp_path)
    out = res.stdout + res.stderr
    assert res.returncode == 1, out
    assert f"{PACKAGE}/errors.py:" in out and "[union-attr]" in out, out
    assert "Found 1 error in 1 file" in out, out
