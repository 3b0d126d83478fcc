"""``stress --explain`` on real runs: each failing step's origin is written beside its block, from the
state the rollback rebuilt (held to an independent plain loop's state before the step), within
--explain-max, never for a planted step, and finished by --resume after an interrupt; the measured
counts are the same with and without it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import optax
import pytest

from xla_harness.programs.interface import load_program
from xla_harness.stress import explain as explain_mod
from xla_harness.stress.explain import ExplainSpec, load_state, state_path
from xla_harness.stress.report.summary import load_table
from xla_harness.stress.results.store import read_results
from xla_harness.stress.runner import run_matrix
from xla_harness.stress.spec import StressSpec

ROOT = Path(__file__).resolve().parents[2]
PROGRAMS = ROOT / "tests" / "origin" / "programs"
WHOSE = f"{PROGRAMS / 'whose.py'}:make"


def _spec(kind: str, steps: int = 13, seeds=(1,), **kw) -> StressSpec:
    return StressSpec(program=WHOSE, program_options=(("kind", kind),), seeds=seeds, steps=steps, **kw)


def _origins(out: Path) -> dict[tuple[int, int], dict]:
    res = read_results(out / "stress.jsonl")
    return {(o.seed, o.step): o.origin.to_json() for o in res.origins}


def _planted_line(file: str, kind: str) -> int:
    lines = (PROGRAMS / file).read_text().splitlines()
    return next(i for i, text in enumerate(lines, 1) if text.rstrip().endswith(f"# plant: {kind}"))


@pytest.mark.parametrize("kind,cls", [("batch-nan", "input"), ("zero-over-zero", "program"),
                                      ("overflow", "precision")])
def test_each_failing_step_gets_its_origin_beside_its_block(tmp_path, kind, cls):
    run_matrix(_spec(kind), tmp_path, explain=ExplainSpec())
    got = _origins(tmp_path)
    assert sorted(got) == [(1, 3), (1, 11)]
    assert {o["class"] for o in got.values()} == {cls}
    if cls != "input":  # the line is the user's, in the module beside the program's file
        assert {(o["where"]["file"], o["where"]["line"]) for o in got.values()} == \
            {(str(PROGRAMS / "whose_losses.py"), _planted_line("whose_losses.py", kind))}


def test_a_loss_only_failure_is_explained_from_the_state_rebuilt_before_it(tmp_path):
    """Its new state is finite, so nothing is rolled back: the state before it is rebuilt from the block's
    restore point when it is kept (never counted), and the NaN constant the loss adds is the program's."""
    run_matrix(_spec("loss-nan-constant"), tmp_path, explain=ExplainSpec())
    got = _origins(tmp_path)
    assert sorted(got) == [(1, 3), (1, 11)] and {o["class"] for o in got.values()} == {"program"}
    assert {o["evidence"]["known_class"] for o in got.values()} == {"non-finite-constant"}
    assert {o["where"]["line"] for o in got.values()} == {_planted_line("whose_losses.py", "loss-nan-constant")}
    steps = [s for b in read_results(tmp_path / "stress.jsonl").blocks for s in b.steps]
    assert [s.step for s in steps] == list(range(13))  # each step recorded once: the rebuild is not a step


def test_the_measured_counts_do_not_change(tmp_path):
    run_matrix(_spec("zero-over-zero"), tmp_path / "plain")
    run_matrix(_spec("zero-over-zero"), tmp_path / "explained", explain=ExplainSpec())
    plain, explained = (load_table([tmp_path / d]).rows[0] for d in ("plain", "explained"))
    assert (plain.k, plain.n) == (explained.k, explained.n) == (2, 13)
    a = [s for b in read_results(tmp_path / "plain" / "stress.jsonl").blocks for s in b.steps]
    b = [s for b in read_results(tmp_path / "explained" / "stress.jsonl").blocks for s in b.steps]
    assert [(s.step, s.finite, s.loss) for s in a] == [(s.step, s.finite, s.loss) for s in b]


def test_the_kept_state_is_a_plain_loops_state_before_the_step(tmp_path):
    """The oracle: a plain jax.jit loop of the same program that keeps a step's new state only when it
    is finite (what a rollback does), run apart from the harness."""
    run_matrix(_spec("zero-over-zero"), tmp_path, explain=ExplainSpec())
    program = load_program(WHOSE, kind="zero-over-zero")
    from xla_harness.stress.device.inject import step_keys

    step = jax.jit(program.step)
    params, opt_state = program.init(jax.random.key(1))
    before = {}
    for s in range(12):
        before[s] = (params, opt_state)
        p, o, aux = step(params, opt_state, program.batch(step_keys(1, s)[0], s))
        if all(np.isfinite(np.asarray(x)).all() for x in jax.tree_util.tree_leaves((p, o, aux["loss"]))):
            params, opt_state = p, o
    label = _spec("zero-over-zero").label(_spec("zero-over-zero").configs()[0])
    for s in (3, 11):
        kept = load_state(state_path(tmp_path, label, 1, s), before[s]).arrays()
        for a, b in zip(jax.tree_util.tree_leaves(kept), jax.tree_util.tree_leaves(before[s]), strict=True):
            np.testing.assert_array_equal(a, np.asarray(b))


def test_explain_max_bounds_the_explained_steps_and_frozen_explains_one_per_seed(tmp_path):
    run_matrix(_spec("adam-eps0", steps=6), tmp_path / "train", explain=ExplainSpec(max_steps=2))
    assert sorted(_origins(tmp_path / "train")) == [(1, 0), (1, 1)]  # 6 failing steps, the first 2
    run_matrix(_spec("init-nan", steps=4, seeds=(1, 2), protocol="frozen"), tmp_path / "frozen",
               explain=ExplainSpec())
    got = _origins(tmp_path / "frozen")
    assert sorted(got) == [(1, 0), (2, 0)] and {o["class"] for o in got.values()} == {"input"}


def test_the_steps_explained_are_those_whose_state_was_kept_in_the_order_the_seeds_ran(tmp_path):
    run_matrix(_spec("zero-over-zero", seeds=(3, 1)), tmp_path, explain=ExplainSpec(max_steps=1))
    assert sorted(_origins(tmp_path)) == [(3, 3)]  # seed 3 ran first: its step 3 is the one kept
    assert {o["class"] for o in _origins(tmp_path).values()} == {"program"}


def test_planted_steps_are_not_classified(tmp_path):
    run_matrix(_spec("clean", steps=20, inject_rate=0.3), tmp_path, explain=ExplainSpec())
    assert load_table([tmp_path]).rows[0].k > 0
    assert _origins(tmp_path) == {}


def test_a_fault_in_the_compiled_program_is_the_compilers(tmp_path):
    spec = StressSpec(program=f"{PROGRAMS / 'compiled_fault.py'}:make", seeds=(1,), steps=3)
    run_matrix(spec, tmp_path, explain=ExplainSpec(replays=3))
    got = _origins(tmp_path)
    assert sorted(got) == [(1, 0), (1, 1), (1, 2)] and {o["class"] for o in got.values()} == {"compiler"}
    assert {o["evidence"]["replays"] for o in got.values()} == {3}


def test_a_nan_drawn_per_execution_is_a_race(tmp_path):
    """The execution oracle, with a typed PRNG key in its state (kept, saved and replayed as a key)."""
    spec = StressSpec(program=f"{ROOT / 'tests' / 'oracle_program.py'}:make", seeds=(1,), steps=8,
                      program_options=(("key_in_state", True), ("nan_execs", (5,))))
    run_matrix(spec, tmp_path, explain=ExplainSpec())
    got = _origins(tmp_path)
    assert len(got) == 1 and next(iter(got.values()))["class"] == "race"


def test_commit_step_says_why_it_cannot_explain(tmp_path):
    run_matrix(_spec("zero-over-zero", commit="step"), tmp_path, explain=ExplainSpec())
    got = _origins(tmp_path)
    assert {o["class"] for o in got.values()} == {"unknown"}
    assert all(o["evidence"]["reason"] == "no-state" and "--commit step" in o["summary"] for o in got.values())


def test_an_interrupt_while_explaining_keeps_the_records_and_resume_finishes(tmp_path):
    results = tmp_path / "stress.jsonl"

    def one_origin_written() -> bool:  # a stop request arriving once the first origin is on disk
        return results.is_file() and b'"kind": "origin"' in results.read_bytes()

    run_matrix(_spec("log-zero"), tmp_path, should_stop=one_origin_written, explain=ExplainSpec())
    first = read_results(results)
    assert len(first.origins) == 1 and sum(len(b.steps) for b in first.blocks) == 13
    run_matrix(_spec("log-zero"), tmp_path, resume=True, explain=ExplainSpec())
    again = read_results(results)
    assert sorted((o.seed, o.step) for o in again.origins) == [(1, 3), (1, 11)]
    assert [b.to_json()["steps"] for b in again.blocks] == [b.to_json()["steps"] for b in first.blocks]


def test_a_saved_state_round_trips_bfloat16_and_scalars(tmp_path):
    import jax.numpy as jnp

    params = {"w": jnp.arange(6, dtype=jnp.bfloat16).reshape(2, 3), "c": jnp.asarray(3, jnp.int32),
              "k": jax.random.key(5), "weak": jnp.asarray(2.0)}
    opt = optax.adam(1e-3).init({k: v for k, v in params.items() if k != "k"})
    explain_mod.save_state(tmp_path / "s.npz", params, opt)
    p2, o2 = load_state(tmp_path / "s.npz", (params, opt)).arrays()
    assert jax.random.key_impl(p2["k"]) == jax.random.key_impl(params["k"])
    assert p2["weak"].weak_type and not p2["w"].weak_type  # a weak scalar stays weak
    np.testing.assert_array_equal(jax.random.key_data(p2["k"]), jax.random.key_data(params["k"]))
    for a, b in zip(jax.tree_util.tree_leaves((p2, o2)), jax.tree_util.tree_leaves((params, opt)), strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape
        if a.dtype != p2["k"].dtype:
            np.testing.assert_array_equal(np.asarray(a, np.float64), np.asarray(b, np.float64))


def test_a_corrupt_kept_state_is_unknown_not_a_crash(tmp_path):
    run_matrix(_spec("log-zero"), tmp_path, should_stop=lambda: (tmp_path / "origins").is_dir() and any(
        (tmp_path / "origins").rglob("seed1-step11.npz")), explain=ExplainSpec())
    for kept in (tmp_path / "origins").rglob("*.npz"):
        kept.write_bytes(b"not an npz")
    run_matrix(_spec("log-zero"), tmp_path, resume=True, explain=ExplainSpec())
    got = _origins(tmp_path)
    assert {o["class"] for o in got.values()} <= {"unknown", "program"}
    assert any(o["class"] == "unknown" and "not a saved state" in o["summary"] for o in got.values())


@pytest.mark.slow
def test_the_command_prints_whose_nan_and_json_holds_the_origins(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, "-m", "xla_harness", "stress", "--program", WHOSE, "--program-option", "kind=batch-nan",
            "--seeds", "1", "--steps", "13", "--explain", "--quiet"]
    done = subprocess.run([*argv, "--out", str(tmp_path / "a")], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "whose NaN: 2 of 2 non-finite steps explained: 2 input" in done.stdout
    assert "step 3: input: non-finite input in your batch: batch['x'][2, 1] is NaN" in done.stdout
    done = subprocess.run([*argv, "--json", "--out", str(tmp_path / "b")], capture_output=True, text=True, env=env,
                          timeout=300)
    got = json.loads(done.stdout)
    assert [(o["step"], o["class"]) for o in got["origins"]] == [(3, "input"), (11, "input")]
    done = subprocess.run([*argv[:-2], "--compile-only", "--explain"], capture_output=True, text=True, env=env,
                          timeout=300)
    assert done.returncode == 2 and done.stderr.startswith("error: --explain needs steps to run")
