"""The first execution is the measurement: counted against an execution oracle
(:mod:`tests.oracle_program`: a step that draws its NaN per execution through a host callback and
logs every execution, the step and whether the state it started from was finite). For every commit,
failure rate and place of the NaN, the records' non-finite steps are exactly the steps whose first
execution from a finite state drew a NaN, and every step has such an execution; a check that could
not fail would not see the planted differences below."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from dataclasses import replace
from pathlib import Path

import jax
import numpy as np
import pytest
from scipy import stats as scipy_stats

from xla_harness.stress.runner import initial_state, prepare, run_config
from xla_harness.stress.spec import StressSpec

ORACLE_PATH = Path(__file__).resolve().parents[1] / "oracle_program.py"
_spec = importlib.util.spec_from_file_location("oracle_program", ORACLE_PATH)
oracle = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("oracle_program", oracle)
_spec.loader.exec_module(oracle)


def _run(program, commit: str, steps: int, block: int | None = None, seed: int = 1):
    spec = StressSpec(program="oracle", seeds=(seed,), steps=steps, commit=commit, block=block)
    h = prepare(spec, {}, program)
    state = initial_state(h, seed)
    blocks = list(run_config(h, seed, state))
    return blocks, state


def _check_against_oracle(program, blocks, steps: int) -> list[int]:
    recs = [r for b in blocks for r in b.records]
    assert [r.step for r in recs] == list(range(steps)), "every step recorded once, in order"
    want, never = oracle.expected(oracle.entries_of(program), range(steps))
    assert never == [], f"steps with no execution from a finite state: {never}"
    got = [r.step for r in recs if not r.finite]
    assert got == want
    return got


CASES = [  # (per-execution NaN probability, where it goes, the program's random seed)
    (0.001, "both", 5), (0.02, "both", 1), (0.05, "state", 2), (0.05, "loss", 3), (0.1, "mixed", 4),
    (0.2, "mixed", 6), (0.2, "state", 7),
]


@pytest.mark.parametrize("commit,block", [("block", None), ("block", 16), ("step", None)])
@pytest.mark.parametrize("p,where,seed", CASES)
def test_counts_equal_the_oracle(commit, block, p, where, seed):
    program = oracle.make(p=p, where=where, seed=seed)
    blocks, state = _run(program, commit, steps=300 if p < 0.01 else 120, block=block)
    got = _check_against_oracle(program, blocks, len([r for b in blocks for r in b.records]))
    assert p < 0.01 or got, "the case draws NaNs"
    # The run goes on from a finite state whatever it met.
    assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree_util.tree_leaves((state.params, state.opt_state)))


@pytest.mark.parametrize("commit", ["block", "step"])
def test_the_issue_table_nan_on_executions_9_and_17(commit):
    """The program of the report (NaN into the loss and through the gradient into the parameters on
    executions 9 and 17, 20 steps, blocks of 5): before, the block commit recorded steps 5-19
    non-finite (15/20). Execution 9 is step 9's first; execution 17 is whichever step the run
    executes 17th from a finite state, or a rerun that rebuilds a state (never counted)."""
    program = oracle.make(where="both", nan_execs=(9, 17))
    blocks, _ = _run(program, commit, steps=20, block=5)
    got = _check_against_oracle(program, blocks, 20)
    assert 9 in got and len(got) <= 2


def test_nan_on_rerun_executions_is_never_counted_and_never_restored():
    """Every rerun that rebuilds a state draws a NaN on its first try (executions chosen from the log of
    a first run): the counts still equal the oracle, the run never continues from a NaN state, and the
    block says the reruns came out non-finite."""
    probe = oracle.make(where="state", nan_execs=(12,))
    _run(probe, "block", steps=30, block=8)
    log = oracle.entries_of(probe)
    first_seen: set[int] = set()
    reruns = []
    for i, step, finite, *_ in log:
        if finite and step in first_seen:
            reruns.append(i)
        if finite:
            first_seen.add(step)
    assert reruns, "the failure at step 12 makes the run rebuild the state before it"
    program = oracle.make(where="state", nan_execs=(12, reruns[0]))
    blocks, state = _run(program, "block", steps=30, block=8)
    _check_against_oracle(program, blocks, 30)
    failed = [b for b in blocks if b.recompute]
    assert failed and any(b.recompute.get("nonfinite") for b in failed)
    assert not any(b.recompute.get("unrecoverable") for b in failed)
    assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree_util.tree_leaves(state.params))


def test_a_rerun_that_differs_is_reported_apart_and_not_counted():
    """A finite perturbation on some executions: reruns whose loss differs from the first execution's are
    listed on the block (nondeterminism), none is a measured step, the counts equal the oracle."""
    program = oracle.make(p=0.05, where="both", seed=11, perturb=1e-3)
    blocks, _ = _run(program, "block", steps=120, block=16)
    _check_against_oracle(program, blocks, 120)
    differ = [t for b in blocks if b.recompute for t in b.recompute["nondet"]]
    assert differ, "with half the executions perturbed some rerun differs"
    assert not any(r.nondet for b in blocks for r in b.records)


def test_a_planted_wrong_count_is_caught():
    """The comparison can fail: a record flipped to finite, or a step dropped, is not the oracle's."""
    program = oracle.make(p=0.1, where="both", seed=2)
    blocks, _ = _run(program, "block", steps=60, block=8)
    block, i = next((b, i) for b in blocks for i, r in enumerate(b.records) if not r.finite)
    bad = block.records[i]
    block.records[i] = replace(bad, finite=True)
    with pytest.raises(AssertionError):
        _check_against_oracle(program, blocks, 60)
    block.records[i] = bad
    blocks[0].records.pop()
    with pytest.raises(AssertionError):
        _check_against_oracle(program, blocks, 60)


def test_typed_prng_keys_in_the_state_train_and_roll_back():
    """A state holding a typed PRNG key (as Flax NNX keeps its rngs): clean blocks, a rollback that
    copies the key, and the key's bits as a plain loop would have them."""
    program = oracle.make(where="both", nan_execs=(5,), key_in_state=True)
    blocks, state = _run(program, "block", steps=20, block=4)
    _check_against_oracle(program, blocks, 20)
    key = state.params["rng"]
    assert jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key)
    plain = jax.random.key(7)
    for _ in range(19):  # 20 steps, one rolled back
        plain = jax.random.split(plain)[0]
    assert np.array_equal(jax.random.key_data(key), jax.random.key_data(plain))


@pytest.mark.slow
def test_the_rate_of_a_one_percent_intermittent_nan_is_unbiased():
    """p = 1% per execution over 5,000 steps (block commit, the default sizing): the exact two-sided 95%
    interval of the reported rate contains 1%, and the count equals the oracle's."""
    steps = 5000
    program = oracle.make(p=0.01, where="mixed", seed=2026)
    blocks, _ = _run(program, "block", steps=steps)
    got = _check_against_oracle(program, blocks, steps)
    ci = scipy_stats.binomtest(len(got), steps).proportion_ci(0.95, method="exact")
    assert ci.low <= 0.01 <= ci.high, (len(got), ci)


ORACLE_CLI_PROGRAM = '''
import importlib.util
import sys

_spec = importlib.util.spec_from_file_location("oracle_program", {path!r})
oracle = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(oracle)


def make(p=0.0, where="both", seed=0, nan_execs=(), log=""):
    return oracle.make(p=p, where=where, seed=seed, nan_execs=tuple(nan_execs), log=log)
'''


@pytest.mark.slow
@pytest.mark.parametrize("commit", ["block", "step"])
def test_the_cli_records_what_the_execution_log_says(tmp_path, commit, capsys):
    """Through ``stress`` as a user runs it, the program logging each execution to a file: the results
    file's non-finite steps are the log's (2% per execution, 200 steps), and the table counts them."""
    from xla_harness.cli import main

    (tmp_path / "prog.py").write_text(ORACLE_CLI_PROGRAM.format(path=str(ORACLE_PATH)))
    log = tmp_path / "exec.jsonl"
    args = ["stress", "--program", f"{tmp_path}/prog.py:make", "--seeds", "1", "--steps", "200", "--commit", commit,
            "--program-option", "p=0.02", "--program-option", "seed=9", "--program-option", f"log={log}",
            "--quiet", "--out", str(tmp_path / "r")]
    assert main(args) == 0
    entries = [json.loads(line) for line in log.read_text().splitlines()]
    want, never = oracle.expected(entries, range(200))
    assert never == [] and want
    steps = [s for line in (tmp_path / "r" / "stress.jsonl").read_text().splitlines()[1:]
             for s in json.loads(line)["steps"]]
    assert sorted(s["step"] for s in steps) == list(range(200))
    assert sorted(s["step"] for s in steps if not s["finite"]) == want
    text = capsys.readouterr().out
    assert f"{len(want)}/200" in text
    assert not math.isnan(len(want))


NNX_PROGRAM = Path(__file__).resolve().parents[1] / "data" / "nnx_rngs_program.py"


@pytest.mark.slow
def test_a_flax_nnx_model_with_rngs_in_its_state_trains_freezes_checkpoints_and_resumes(tmp_path):
    """Flax NNX keeps its rngs (a typed key) in the state: the block commit rolls back a planted NaN,
    a stop writes a checkpoint holding the key, ``--resume`` continues from it to the same records
    as an uninterrupted run, and the frozen protocol compares the key's bits."""
    pytest.importorskip("flax.nnx")
    from xla_harness.stress.report.summary import load_table
    from xla_harness.stress.runner import run_matrix

    def spec(**kw):
        return StressSpec(program=f"{NNX_PROGRAM}:make", seeds=(1,), steps=24, block=4,
                          program_options=(("nan_steps", [5, 17]),), **kw)

    def steps_of(folder):
        lines = (folder / "stress.jsonl").read_text().splitlines()[1:]
        return sorted(((s["step"], s["finite"], s["loss"]) for line in lines for s in json.loads(line)["steps"]),
                      key=lambda x: x[0])

    whole = run_matrix(spec(), tmp_path / "whole").parent
    assert [t for t, finite, _ in steps_of(whole) if not finite] == [5, 17]
    seen: list = []  # a stop requested once three blocks are recorded
    run_matrix(spec(checkpoint_seconds=0.0), tmp_path / "cut", should_stop=lambda: len(seen) >= 3,
               on_event=lambda e: seen.append(e) if e.kind == "block" else None)
    assert len(steps_of(tmp_path / "cut")) < 24
    assert list((tmp_path / "cut" / "ckpt").glob("*.npz"))
    run_matrix(spec(checkpoint_seconds=0.0), tmp_path / "cut", resume=True)
    assert steps_of(tmp_path / "cut") == steps_of(whole)
    (row,) = load_table([tmp_path / "cut"]).rows
    assert (row.k, row.n) == (2, 24)
    frozen = run_matrix(spec(protocol="frozen"), tmp_path / "frozen").parent
    (row,) = load_table([frozen]).rows
    assert row.n == 24 and row.nondet == 0


def _recorded_prefix(path: Path) -> int:
    """Steps 0..n-1 recorded in a results file a kill may have cut (its last line possibly torn)."""
    steps = set()
    for line in path.read_text().splitlines()[1:] if path.exists() else []:
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            break
        steps |= {s["step"] for s in obj["steps"]}
    n = 0
    while n in steps:
        n += 1
    return n


@pytest.mark.slow
@pytest.mark.parametrize("commit", ["block", "step"])
def test_kill_9_and_resume_at_random_points_count_what_the_oracle_says(tmp_path, commit):
    """SIGKILL at random points of a run (either commit, checkpoints every block), each followed by
    ``--resume``: every step is recorded once, and each step's record is what the first execution
    from a finite state drew in the process that recorded it (an execution a kill cut off was never
    recorded, and the resumed process measures the step again)."""
    import os
    import random
    import signal
    import subprocess
    import time

    root = Path(__file__).resolve().parents[2]
    (tmp_path / "prog.py").write_text(ORACLE_CLI_PROGRAM.format(path=str(ORACLE_PATH)))
    log, out = tmp_path / "exec.jsonl", tmp_path / "r"
    path = out / "stress.jsonl"
    steps = 600
    argv = [sys.executable, "-m", "xla_harness.cli", "stress", "--program", f"{tmp_path}/prog.py:make",
            "--seeds", "1", "--steps", str(steps), "--checkpoint-seconds", "0", "--program-option", "p=0.03",
            "--program-option", "where=mixed", "--program-option", f"log={log}", "--commit", commit, "--quiet",
            "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": str(root), "PYTHONUNBUFFERED": "1"}
    rng = random.Random(43)
    prefixes = [0]
    for _ in range(4):
        before, more = _recorded_prefix(path), rng.randrange(5, 60)
        proc = subprocess.Popen(argv + (["--resume"] if path.exists() else []), env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 300
        while proc.poll() is None and _recorded_prefix(path) <= before + more:
            assert time.monotonic() < deadline, "the run recorded nothing in 300 s"
            time.sleep(0.05)  # polling a file, not timing anything
        proc.send_signal(signal.SIGKILL)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode in (0, -signal.SIGKILL), err
        prefixes.append(_recorded_prefix(path))
        if proc.returncode == 0:
            break
    done = subprocess.run(argv + ["--resume"], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    prefixes.append(steps)
    entries = [json.loads(line) for line in log.read_text().splitlines() if line.endswith("]")]
    pids = list(dict.fromkeys(e[5] for e in entries))
    assert len(pids) == len(prefixes) - 1 >= 3
    want: list[int] = []
    for pid, lo, hi in zip(pids, prefixes[:-1], prefixes[1:], strict=True):
        got, never = oracle.expected([e for e in entries if e[5] == pid], range(lo, hi))
        assert never == []
        want += got
    recs = [s for line in path.read_text().splitlines()[1:] for s in json.loads(line)["steps"]]
    assert sorted(s["step"] for s in recs) == list(range(steps))
    assert sorted(s["step"] for s in recs if not s["finite"]) == want and want
