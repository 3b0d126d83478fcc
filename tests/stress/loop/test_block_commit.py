"""The block commit (outputs fed straight back, a row per step and one fetch per block, a device copy
of the state at each block's start, a step whose new state is not finite rolled back by recomputing
from it) gives the per-step commit's records, counts and trajectory on every planted failure;
nondeterminism is counted (frozen: outputs compared bitwise with the first finite call's; train:
reruns that differ from the first execution, reported apart); a non-finite value the step removes
again within a block is seen, as per step."""

from __future__ import annotations

from dataclasses import replace

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from xla_harness.programs.interface import TrainProgram, step_from_loss
from xla_harness.stress.device.inject import injected_steps
from xla_harness.stress.runner import BlockSize, initial_state, prepare, run_config
from xla_harness.stress.spec import StressSpec

from ...helpers import TINY


def poisoned(bad_steps=(), state_nan_steps=(), vanish_steps=()) -> TrainProgram:
    """A small regression whose loss is NaN at ``bad_steps`` (the loss only: the NaN is a constant, so
    the gradients and the new state stay finite), which writes NaN into an unused parameter ``u`` at
    ``state_nan_steps`` (the loss stays finite; the NaN stays in the state) and into ``v`` at
    ``vanish_steps``, which the next step resets to 0 (a step that cleans its own state)."""
    opt = optax.adam(1e-2)
    bad, state_nan, vanish = (jnp.asarray(list(x) or [-1]) for x in (bad_steps, state_nan_steps, vanish_steps))

    def init(key):
        params = {"w": jax.random.normal(key, (4, 8)), "u": jnp.zeros((3,)), "v": jnp.zeros((2,))}
        return params, opt.init(params)

    def batch(key, step):
        return {"x": jax.random.normal(key, (16, 4)), "step": jnp.asarray(step, jnp.int32)}

    def loss(params, b):
        y = jnp.tanh(b["x"] @ params["w"])
        return jnp.mean((y - 1.0) ** 2) + jnp.where(jnp.any(bad == b["step"]), jnp.nan, 0.0)

    base = step_from_loss(loss, opt)

    def step(params, opt_state, b):
        p, o, aux = base(params, opt_state, b)
        u = jnp.where(jnp.any(state_nan == b["step"]), jnp.nan, p["u"])
        v = jnp.where(jnp.any(vanish == b["step"]), jnp.nan, jnp.zeros_like(p["v"]))
        return {**p, "u": u, "v": v}, o, aux

    return TrainProgram(name="poisoned", init=init, batch=batch, step=step)


def _run(program, commit, steps=30, seed=1, **spec):
    spec = StressSpec(program="poisoned", seeds=(seed,), steps=steps, commit=commit, **spec)
    h = prepare(spec, {}, program)
    state = initial_state(h, seed)
    blocks = list(run_config(h, seed, state))
    return blocks, state


def _key(r):
    return (r.step, r.finite, r.first_bad, r.loss, r.injected, r.nondet)


def _same_state(a, b) -> bool:
    return all(np.array_equal(np.asarray(x), np.asarray(y), equal_nan=True) for x, y in
               zip(jax.tree_util.tree_leaves((a.params, a.opt_state)),
                   jax.tree_util.tree_leaves((b.params, b.opt_state)), strict=True))


def _assert_equal_commits(program, **spec):
    (step_blocks, step_state), (block_blocks, block_state) = (_run(program, c, **spec) for c in ("step", "block"))
    step_recs = [r for b in step_blocks for r in b.records]
    block_recs = [r for b in block_blocks for r in b.records]
    assert [_key(r) for r in block_recs] == [_key(r) for r in step_recs]
    assert _same_state(block_state, step_state)
    return step_recs, block_blocks


@pytest.mark.slow
@pytest.mark.parametrize("case,kw,bad,rolled", [
    ("nan loss, finite state", dict(bad_steps=(3, 11, 12)), [3, 11, 12], []),
    ("state nan, finite loss", dict(state_nan_steps=(6, 17)), [6, 17], [6, 17]),
    ("last step of a block", dict(state_nan_steps=(4, 9, 10, 29)), [4, 9, 10, 29], [4, 9, 10, 29]),
    ("both", dict(bad_steps=(2, 14), state_nan_steps=(14, 21)), [2, 14, 21], [14, 21]),
])
def test_block_commit_equals_step_commit(case, kw, bad, rolled):
    recs, blocks = _assert_equal_commits(poisoned(**kw), block=5)
    assert [r.step for r in recs if not r.finite] == bad, case
    # contiguous blocks; a block ends at each step whose new state was rolled back, the next starts after it
    assert [b.start for b in blocks[1:]] == [b.end for b in blocks[:-1]] and blocks[-1].end == 30
    assert [b.end - 1 for b in blocks if b.rolled_back] == rolled
    assert all(b.recompute is not None and b.recompute["from"] >= b.start for b in blocks if b.rolled_back)


@pytest.mark.slow
@pytest.mark.parametrize("inject", ["nan", "nan-opt", "inf-opt"])
def test_block_commit_equals_step_commit_with_injected_faults(inject):
    recs, _ = _assert_equal_commits(poisoned(), steps=40, inject=inject, inject_rate=0.15, block=6)
    planted = injected_steps(1, 40, 0.15).tolist()
    assert len(planted) >= 3
    assert [r.step for r in recs if not r.finite] == planted


def _builtin_both_commits(spec: dict, seed: int) -> dict:
    """The built-in model under each commit: {commit: (record keys, final state)}."""
    out = {}
    for commit in ("step", "block"):
        s = StressSpec(commit=commit, **spec)
        h = prepare(s, s.configs()[0])
        state = initial_state(h, seed)
        out[commit] = ([_key(r) for b in run_config(h, seed, state) for r in b.records], state)
    return out


@pytest.mark.slow
def test_block_commit_equals_step_commit_on_the_builtin_with_a_chosen_block_size():
    spec = dict(modes=("full",), remats=(True,), seeds=(2,), steps=50, inject_rate=0.05, **TINY)
    out = _builtin_both_commits(spec, seed=2)
    assert out["block"][0] == out["step"][0]
    assert any(not k[1] for k in out["step"][0])
    assert _same_state(out["block"][1], out["step"][1])


@pytest.mark.slow
def test_a_nan_the_step_removes_within_a_block_is_seen():
    """``v`` is NaN after step 7 and reset by step 8: every step has its row, so the block commit sees
    it wherever the block ends, as the per-step commit does (a block-end check alone would not)."""
    program = poisoned(vanish_steps=(7,))
    step_recs = [r for b in _run(program, "step", steps=12, block=5)[0] for r in b.records]
    assert [r.step for r in step_recs if not r.finite] == [7]
    for block in (4, 5, 12):
        block_recs = [r for b in _run(program, "block", steps=12, block=block)[0] for r in b.records]
        assert [_key(r) for r in block_recs] == [_key(r) for r in step_recs], block


NOISY_FILE = '''
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import optax

from xla_harness.programs.interface import TrainProgram, step_from_loss


def make(every=4, nan_calls=(), into_state=True):
    opt = optax.sgd(0.1)
    calls = itertools.count()  # the program's calls, counted on the host

    def perturbation():
        i = next(calls)
        return np.float32(np.nan if i in nan_calls else (1e-3 if i % every == every - 1 else 0.0))

    def init(key):
        params = {"w": jax.random.normal(key, (4, 3))}
        return params, opt.init(params)

    def batch(key, step):
        return jax.random.normal(key, (8, 4))

    def loss(params, x):
        noise = jax.experimental.io_callback(perturbation, jax.ShapeDtypeStruct((), jnp.float32))
        # into_state: a NaN also reaches the gradient, hence the parameters (the step's new state)
        leak = jnp.where(jnp.isnan(noise), noise * jnp.sum(params["w"]), 0.0) if into_state else 0.0
        return jnp.mean(jnp.tanh(x @ params["w"]) ** 2) + noise + leak

    return TrainProgram(name="noisy", init=init, batch=batch, step=step_from_loss(loss, opt))
'''


def noisy(every=4, nan_calls=(), into_state=True) -> TrainProgram:
    """A step that is not a function of its inputs (:data:`NOISY_FILE`'s ``make``): a host callback adds
    1e-3 to the loss on every ``every``'th call of the program and makes it NaN on ``nan_calls`` (and,
    ``into_state``, the gradient and so the new parameters)."""
    namespace: dict = {}
    exec(compile(NOISY_FILE, "noisy.py", "exec"), namespace)
    return namespace["make"](every=every, nan_calls=tuple(nan_calls), into_state=into_state)


@pytest.mark.slow
def test_frozen_counts_finite_nondeterminism():
    blocks, _ = _run(noisy(every=4), "block", steps=40, protocol="frozen")
    recs = [r for b in blocks for r in b.records]
    assert all(r.finite for r in recs)
    assert [r.step for r in recs if r.nondet] == list(range(3, 40, 4))  # 25% of the calls


@pytest.mark.slow
def test_frozen_deterministic_step_has_no_nondeterminism_and_a_nan_first_call_is_not_the_reference():
    blocks, _ = _run(noisy(every=10**9, nan_calls=(0,)), "block", steps=12, protocol="frozen")
    recs = [r for b in blocks for r in b.records]
    assert [r.step for r in recs if not r.finite] == [0]
    assert not any(r.nondet for r in recs)


@pytest.mark.slow
def test_a_nan_the_rerun_does_not_reproduce_is_counted_at_its_step():
    """Call 7 (step 7's first execution) is NaN; the step run again is finite: the first execution is
    the measurement, so both commits record step 7 non-finite and nothing nondet."""
    for commit in ("block", "step"):
        blocks, _ = _run(noisy(every=10**9, nan_calls=(7,)), commit, steps=10, block=5)
        recs = [r for b in blocks for r in b.records]
        assert [r.step for r in recs if not r.finite] == [7], commit
        assert not any(r.nondet for r in recs), commit


def test_block_size_grows_with_cost_and_shrinks_with_failures():
    size = BlockSize()
    assert size.size == 1 and not size.measured
    size.update(10, 0, step_seconds=0.1, cost_seconds=0.5)  # a block costs 5 steps: K 1000, capped 8x
    assert size.size == 8
    size.update(8, 0, step_seconds=0.1, cost_seconds=0.5)
    assert size.size == 64
    size.update(64, 0, step_seconds=0.1, cost_seconds=0.5)
    assert size.size == 512  # ceil(5 / 0.005) = 1000 -> 1024 (a power of two), capped at 8 x 64
    size.update(118, 8, step_seconds=0.1, cost_seconds=0.5)  # r = 8/200: K = sqrt(5 * 200 / 8) = 11.2 -> 16
    assert size.size == 16
    fixed = BlockSize(fixed=7)
    fixed.update(7, 3, 1.0, 100.0)
    assert fixed.size == 7


@pytest.mark.slow
def test_frozen_table_gives_per_seed_verdicts_nondeterminism_and_what_was_not_looked_for(tmp_path, capsys):
    import json

    from xla_harness.cli import main

    (tmp_path / "noisy.py").write_text(NOISY_FILE)
    args = ["stress", "--program", f"{tmp_path}/noisy.py:make", "--protocol", "frozen", "--seeds", "1,2",
            "--steps", "20", "--quiet", "--out", str(tmp_path / "r")]
    assert main(args) == 0
    text = capsys.readouterr().out
    head = next(line for line in text.splitlines() if line.startswith("config"))
    assert "nondet" in head.split()
    row = next(line for line in text.splitlines() if "noisy.py:make" in line and "0/20" in line)
    # seeds unpooled: each its own bound (0/20 -> 0.139); no pooled rate; 5 of 20 calls perturbed per seed
    assert row.split().count("<=0.139") == 2 and "per seed" in row and row.split()[-1] == "10"
    assert "finite errors: not looked for" in text
    assert main(["report", str(tmp_path / "r"), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    (cfg,) = data["configs"]
    assert cfg["nondet"] == 10 and cfg["protocol"] == "frozen" and set(cfg["per_seed_upper"]) == {"1", "2"}
    assert data["finite_errors"] == {"referenced_steps": 0, "steps": 40, "silent": 0}


@pytest.mark.slow
def test_block_commit_restores_a_state_sharded_over_eight_devices():
    """A failing block of a state sharded over 8 host devices is restored shard by shard: same records,
    trajectory and shardings as the per-step commit."""
    assert jax.device_count() >= 8, "conftest sets --xla_force_host_platform_device_count=8"
    spec = dict(modes=("full",), remats=(True,), seeds=(3,), steps=24, block=6, devices=8, inject_rate=0.1, **TINY)
    out = _builtin_both_commits(spec, seed=3)
    assert out["block"][0] == out["step"][0]
    assert [k[0] for k in out["step"][0] if not k[1]] == injected_steps(3, 24, 0.1).tolist() != []
    assert _same_state(out["block"][1], out["step"][1])
    embed = out["block"][1].params["embed"]
    assert embed.sharding == out["step"][1].params["embed"].sharding and len(embed.sharding.device_set) == 8


@pytest.mark.slow
def test_a_rerun_whose_losses_differ_from_the_records_is_reported_apart(tmp_path):
    """Calls 0-4 are steps 0-4, calls 5-9 steps 5-9 (blocks of 5; call 9 is NaN, so step 9 is rolled
    back) and calls 10-14 block 10-14, dropped (it ran from step 9's NaN state). The state before step
    9 is rebuilt from the device copy at step 5: steps 5-8 run again as calls 15-18. The step perturbs
    its loss on every 4th call (3, 7, 11, 15, ...): step 5 (call 15) and step 7 (first run call 7) differ
    from their records. They are reported on the block and in the table's rerun column, never as
    measured steps or nondet ones."""
    from xla_harness.stress.report import summary as report
    from xla_harness.stress.runner import run_matrix

    (tmp_path / "noisy.py").write_text(NOISY_FILE)
    blocks, _ = _run(noisy(every=4, nan_calls=(9,)), "block", steps=15, block=5)
    (failed,) = [b for b in blocks if b.recompute is not None]
    assert (failed.start, failed.end) == (5, 10)
    assert failed.recompute == {"from": 5, "steps": 4, "nondet": [5, 7]}
    assert not any(r.nondet for b in blocks for r in b.records)
    spec = StressSpec(program=f"{tmp_path}/noisy.py:make", seeds=(1,), steps=15, block=5,
                      program_options=(("every", 4), ("nan_calls", (9,))))
    path = run_matrix(spec, tmp_path / "r")
    (row,) = report.load_table([path.parent]).rows
    assert row.nondet == 0 and row.rerun_differ == {(1, 5), (1, 7)} and row.rerun_steps == 4
    assert (row.k, row.n) == (1, 15)
    text = report.format_table(report.load_table([path.parent]))
    assert "rerun diff" in text and "2/4" in text

@pytest.mark.slow
def test_frequent_failures_move_the_restore_point_and_keep_the_per_step_trajectory():
    """A failure every 7 steps: once failures are seen the state is copied to the host at Young's
    interval, so a failed block is recomputed from a recent copy, not from init every time; the
    records and the trajectory stay the per-step commit's."""
    bad = tuple(range(6, 160, 7))
    recs, blocks = _assert_equal_commits(poisoned(state_nan_steps=bad), steps=160, block=4)
    assert [r.step for r in recs if not r.finite] == list(bad)
    recomputed = [b.recompute for b in blocks if b.recompute is not None]
    assert len(recomputed) == len(bad)
    assert max(r["from"] for r in recomputed) > 100  # the restore point moved along
    assert sum(r["steps"] for r in recomputed) < 2 * 160  # not a recompute from init per failure (~2000 steps)


@pytest.mark.slow
def test_a_checkpoint_is_a_restore_point_and_a_stop_writes_one(tmp_path):
    """With a checkpoint due at every block, a failed block is recomputed from the newest checkpoint
    (nothing to run again), and the records stay the per-step commit's; a stop writes the
    checkpoint --resume starts from."""
    from xla_harness.stress.loop.checkpoint import checkpoint_path, load_checkpoint
    from xla_harness.stress.runner import run_seed

    class Lines(list):  # a BlockStore that keeps the lines in memory
        def drain(self) -> None:
            pass

        def line_cpu_seconds(self) -> float:
            return 0.0

    program = poisoned(state_nan_steps=(27,))
    spec = StressSpec(program="poisoned", seeds=(1,), steps=30, block=5, checkpoint_seconds=0.0)
    h = prepare(spec, {}, program)
    blocks = list(run_seed(h, 1, initial_state(h, 1), Lines(), tmp_path, {}))
    (failed,) = [b for b in blocks if b.recompute is not None]
    assert (failed.start, failed.end, failed.recompute) == (25, 28, {"from": 25, "steps": 2, "nondet": []})
    step_recs, _ = _run(program, "step", steps=30, block=5)
    assert [_key(r) for b in blocks for r in b.records] == [_key(r) for b in step_recs for r in b.records]
    # a stop after step 12: the checkpoint holds the state at the last recorded step
    stops = iter(range(1000))
    h = prepare(replace(spec, checkpoint_seconds=1e9), {}, program)
    state = initial_state(h, 1)
    got = list(run_seed(h, 1, state, Lines(), tmp_path / "stop", {}, should_stop=lambda: next(stops) >= 12))
    end = got[-1].end
    assert end < 30 and state.next_step == end
    ck = load_checkpoint(checkpoint_path(tmp_path / "stop", h.label, 1), (state.params, state.opt_state))
    assert ck is not None and ck[0] == end
