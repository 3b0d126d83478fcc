"""The triage budget holds within seconds: the pass bisection is given what is left of the budget
(its minute's floor only where a minute is left), and not started when too little is."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FAULT = ROOT / "tests" / "origin" / "programs" / "compiled_fault.py"


@pytest.mark.slow
def test_the_bisection_never_runs_past_the_budget(tmp_path):
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "xla_harness", "triage", "--program", f"{FAULT}:make",
                           "--budget", "0.25", "--out", str(tmp_path / "t"), "--json"], capture_output=True,
                          text=True, timeout=600, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    wall = time.monotonic() - t0
    assert done.returncode == 1, done.stderr  # the compiled step fails: a finding
    bisect = json.loads((tmp_path / "t" / "triage.json").read_text())["stages"]["bisect"]
    limits = [float(c.split("--time-limit ")[1].split()[0]) for c in bisect["commands"]]
    if limits:  # started: never with more time than the budget had left
        assert max(limits) <= 15, bisect
    else:
        assert bisect["error"].startswith("the bisection was not started: "), bisect
    assert wall < 15 + 15, wall  # the budget, start-up and one bundle
