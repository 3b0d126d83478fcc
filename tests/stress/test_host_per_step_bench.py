"""bench/host_per_step.py at tiny size on the CPU: its three loops run interleaved and it reports what
the harness adds, what one more dispatch a step costs (the floor of the block protocol's contract) and
the harness above that floor, each with its spread; bad input is one error line and exit 2."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_bench_reports_the_floor_and_what_is_above_it(tmp_path):
    out = tmp_path / "host.json"
    done = subprocess.run([sys.executable, str(ROOT / "bench/host_per_step.py"), "--steps", "40", "--rounds", "3",
                           "--json", str(out)], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    got = json.loads(out.read_text())
    assert got["rounds"] == 3 and got["steps"] == 40
    rounds = got["rounds_cpu_us"]
    assert sorted(rounds) == ["floor", "harness", "plain"] and all(len(v) == 3 for v in rounds.values())
    per_round = {"added_cpu_us": [h - p for h, p in zip(rounds["harness"], rounds["plain"], strict=True)],
                 "dispatch_cpu_us": [f - p for f, p in zip(rounds["floor"], rounds["plain"], strict=True)],
                 "above_floor_cpu_us": [h - f for h, f in zip(rounds["harness"], rounds["floor"], strict=True)]}
    for key, values in per_round.items():  # each figure is the median of its own loops' per-round gaps
        assert got[key] == pytest.approx(sorted(values)[1], abs=1e-6)
        assert got[f"{key}_spread"] == pytest.approx([min(values), max(values)], abs=1e-6)
    assert "harness above that floor" in done.stdout and "one more dispatch a step costs" in done.stdout


def test_bad_input_is_one_error_line(monkeypatch, capsys):
    spec = importlib.util.spec_from_file_location("host_per_step", ROOT / "bench" / "host_per_step.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(sys, "argv", ["host_per_step.py", "--steps", "0"])
    assert module.main() == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and len(err.splitlines()) == 1
