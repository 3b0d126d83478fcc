"""#27 item 8: twenty SIGKILLs at random points of one run, each followed by ``--resume``, lose and
repeat nothing: the finished results hold every step once, with the losses of an uninterrupted run
bit for bit. The kill points are drawn from a seeded generator: some land while jax imports or the
step compiles, most while steps run and blocks are written (a kill mid-write leaves a cut last line
that the next ``--resume`` repairs).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from xla_harness.stress.results import store as results

from ..helpers import TINY_ARGS

ROOT = Path(__file__).resolve().parents[2]
KILLS = 20
# 4 configurations x 150 blocks: a run writes its blocks in bursts (up to a dozen lines between the
# first new line the test sees and the kill, on an idle machine), so the matrix must hold well over
# 20 such bursts for the twentieth kill to land before it finishes (60 steps finished after 18).
MATRIX = ["--modes", "full,dense_only", "--remat", "on", "--seeds", "1,2", "--steps", "300", "--block", "2",
          "--quiet", *TINY_ARGS]


def _argv(out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "xla_harness.cli", "stress", "--out", str(out), *MATRIX, *extra]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}


def _steps(out: Path) -> list[tuple]:
    return [(b.label, b.seed, s.step, s.finite, s.loss)
            for b in results.read_results(out / "stress.jsonl").blocks for s in b.steps]


def _lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


@pytest.mark.slow
def test_twenty_sigkills_then_resume_lose_and_repeat_nothing(tmp_path):
    reference = tmp_path / "ref"
    subprocess.run(_argv(reference), env=_env(), check=True, capture_output=True, timeout=600)
    expected = _steps(reference)
    assert len(expected) == 2 * 2 * 300

    out = tmp_path / "o"
    path = out / "stress.jsonl"
    rng = random.Random(27)
    killed = finished = 0
    for i in range(KILLS):
        before = _lines(path)
        extra = ["--resume"] if path.exists() else []
        proc = subprocess.Popen(_argv(out, *extra), env=_env(), stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)
        early = rng.random() < 0.2  # while importing or compiling: before this run writes anything
        deadline = time.monotonic() + 300
        while proc.poll() is None and not early and _lines(path) <= before:
            assert time.monotonic() < deadline, "the run wrote nothing in 300 s"
            time.sleep(0.02)  # polling a file, not timing anything
        if proc.poll() is None:
            time.sleep(rng.uniform(0.0, 0.05))  # a random point after that: mid-step, mid-write, mid-compile
            proc.send_signal(signal.SIGKILL)
            killed += 1
        _, err = proc.communicate(timeout=60)
        if proc.returncode not in (0, -signal.SIGKILL):
            raise AssertionError(f"run {i} failed (exit {proc.returncode}): {err}")
        finished += proc.returncode == 0
        if finished:
            break
        # Whatever was written is valid up to a possibly cut last line: the steps so far are unique.
        keys = [(lab, seed, step) for lab, seed, step, *_ in _steps(out)] if path.exists() else []
        assert len(keys) == len(set(keys)), f"a step was written twice after kill {i}"
    assert killed >= KILLS - 1, f"only {killed} of the {KILLS} runs were killed before the matrix finished"

    done = subprocess.run(_argv(out, "--resume"), env=_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    got = _steps(out)
    keys = [(lab, seed, step) for lab, seed, step, *_ in got]
    assert len(keys) == len(set(keys)) == len(expected)
    assert sorted(got) == sorted(expected)
