"""Multi-process stress on CPU: 2 processes on 127.0.0.1 (jax.distributed, gloo collectives),
2 host devices each, one SPMD run over 4 devices; merge and gap reporting."""

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from xla_harness.cli import main
from xla_harness.stress.results import store as results

from ..helpers import TINY_ARGS

ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_two_processes(out: Path, extra=()):
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env.update(PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")
    base = [sys.executable, "-m", "xla_harness.cli", "stress", "--out", str(out), "--modes", "full",
            "--remat", "on", "--seeds", "1", "--steps", "4", "--block", "2", "--devices", "4", "--quiet",
            "--coordinator", f"127.0.0.1:{port}", "--num-processes", "2", "--init-timeout", "120",
            *TINY_ARGS, *extra]
    procs = [subprocess.Popen([*base, "--process-id", str(i)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for i in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    return procs, outs


@pytest.mark.slow
def test_two_processes_write_their_own_results_and_merge(tmp_path, capsys):
    out = tmp_path / "run"
    procs, outs = _run_two_processes(out)
    assert [p.returncode for p in procs] == [0, 0], [o[1][-2000:] for o in outs]
    files = sorted(p.name for p in out.glob("stress*.jsonl"))
    assert files == ["stress.p0.jsonl", "stress.p1.jsonl"]
    for i, name in enumerate(files):
        loaded = results.read_results(out / name)
        env = loaded.header.env
        assert (env["process_index"], env["process_count"], env["device_count"]) == (i, 2, 4)
        assert sum(len(b.steps) for b in loaded.blocks) == 4
    assert "full/remat=on/f32" in outs[0][0] and "0/4" in outs[0][0]  # process 0 prints the table
    assert "process 0 prints the merged table" in outs[1][0]
    # One SPMD run: the same global steps from two processes count once.
    assert main(["merge", str(out), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["configs"][0]["steps"] == 4 and data["gaps"] == []

    # A process that died mid-run: its file ends early; the merge reports the gap.
    died = tmp_path / "died"
    shutil.copytree(out, died)
    lines = (died / "stress.p1.jsonl").read_text().splitlines()
    (died / "stress.p1.jsonl").write_text("\n".join(lines[:2]) + "\n")  # header + first block
    assert main(["merge", str(died)]) == 1
    text = capsys.readouterr().out
    assert "gap: stress.p1.jsonl: full/remat=on/f32 seed 1: 2/4 steps (missing from step 2)" in text
    assert "0/4" in text  # process 0's complete record still gives the whole table


@pytest.mark.slow
def test_merge_runs_from_several_hosts(tmp_path, capsys):
    a, b = tmp_path / "host-a", tmp_path / "host-b"
    common = ["--modes", "full", "--remat", "off", "--steps", "3", "--quiet", *TINY_ARGS]
    assert main(["stress", "--out", str(a), "--seeds", "1", *common]) == 0
    assert main(["stress", "--out", str(b), "--seeds", "2", *common]) == 0
    capsys.readouterr()
    assert main(["merge", str(a), str(b)]) == 0
    text = capsys.readouterr().out
    assert "seed 1" in text and "seed 2" in text and "0/6" in text


@pytest.mark.slow
def test_coordinator_that_never_comes_up(tmp_path):
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    res = subprocess.run([sys.executable, "-m", "xla_harness.cli", "stress", "--out", str(tmp_path / "o"),
                          "--coordinator", f"127.0.0.1:{port}", "--num-processes", "2", "--process-id", "1",
                          "--init-timeout", "2", "--devices", "2", "--steps", "1", *TINY_ARGS],
                         env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 2
    assert res.stderr.strip().splitlines()[-1].startswith(f"error: coordinator 127.0.0.1:{port} did not come up")
