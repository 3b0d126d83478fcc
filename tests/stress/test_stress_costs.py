"""What the stress loop asks of the device, counted by jax itself (``bench/counting.py``: every host read
of a jax Array with its bytes, every wait, every compile by name), for 100-step runs at the
benchmark's realistic size with nothing failing: no byte of the state goes to the host (only each
block's rows: a loss, a code and a flag per step), at most blocks + 2 host syncs, the user's step
compiled once and nothing at all compiled after the first block. A planted per-block copy of the
state to the host is caught by the same counts."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import jax
import pytest

from xla_harness.names import BLOCK_ROWS as ROWS
from xla_harness.programs.interface import load_program
from xla_harness.stress.device.step_rows import bucket
from xla_harness.stress.loop import blocks as blocks_module
from xla_harness.stress.loop.snapshot import HostSnapshot
from xla_harness.stress.proof.harness import Harnessed
from xla_harness.stress.runner import run_matrix
from xla_harness.stress.spec import StressSpec

from ..helpers import TINY

_spec = importlib.util.spec_from_file_location("counting", Path(__file__).resolve().parents[2] / "bench/counting.py")
counting = importlib.util.module_from_spec(_spec)
sys.modules["counting"] = counting
_spec.loader.exec_module(counting)

REALISTIC = dict(vocab=32768, d_model=512, layers=2, heads=8, seq=32, batch=8)  # bench/stress_overhead.py's
COMPILES = counting.CompileCounts()


AT_FIRST_BLOCK: list[int] = []  # COMPILES.total when the last _run's first block was recorded
AT_CALL: list[int] = []  # COMPILES.total as each call of the user's step began, in the last _run


def _run(tmp_path: Path, protocol: str, size: dict, steps: int = 100):
    spec = StressSpec(modes=("full",), remats=(True,), seeds=(1,), steps=steps, protocol=protocol, **size)
    events = []
    before = COMPILES.of("step")
    AT_FIRST_BLOCK.clear()

    def on_event(e):
        if e.kind == "block" and not AT_FIRST_BLOCK:
            AT_FIRST_BLOCK.append(COMPILES.total)
        events.append(e)

    AT_CALL.clear()
    real_call, real_direct = Harnessed.call_step, Harnessed.direct_step

    def call_step(self, *args):
        AT_CALL.append(COMPILES.total)
        return real_call(self, *args)

    def direct_step(self):  # what the block loop calls for the step
        run = real_direct(self)

        def call(*args):
            AT_CALL.append(COMPILES.total)
            return run(*args)

        return call

    Harnessed.call_step = call_step  # type: ignore[method-assign]
    Harnessed.direct_step = direct_step  # type: ignore[method-assign]
    try:
        with counting.DeviceCounts() as counts:
            run_matrix(spec, tmp_path / protocol, on_event=on_event)
    finally:
        Harnessed.call_step = real_call  # type: ignore[method-assign]
        Harnessed.direct_step = real_direct  # type: ignore[method-assign]
    done = [e.block for e in events if e.kind == "block"]
    assert sum(b.end - b.start for b in done) == steps and all(r.finite for b in done for r in b.records)
    return counts, done, COMPILES.of("step") - before


def _state(size: dict) -> tuple[int, int]:
    """(bytes, leaves) of the built-in program's state at ``size``."""
    program = load_program("tied-embedding", mode="full", remat=True, **size)
    leaves = jax.tree_util.tree_leaves(jax.eval_shape(program.init, jax.random.key(0)))
    return sum(x.size * x.dtype.itemsize for x in leaves), len(leaves)


@pytest.mark.slow
def test_a_clean_train_run_copies_no_state_to_the_host_and_compiles_the_step_once(tmp_path):
    counts, done, compiles = _run(tmp_path, "train", REALISTIC)
    # Per block one float32 array of ROWS rows (loss, first bad value, state flag): one shape, one compile.
    # 12 KiB a block whatever the state's size (277 MB here): none of the state's bytes.
    assert counts.read_bytes == len(done) * ROWS * 3 * 4
    assert counts.read_bytes < 1e-3 * _state(REALISTIC)[0]
    assert counts.reads == len(done)
    assert counts.syncs <= len(done) + 2
    assert compiles == 1
    assert len(done) < 20  # blocks grow from one measured step


@pytest.mark.slow
def test_a_clean_frozen_run_copies_no_state_to_the_host_and_compiles_the_step_once(tmp_path):
    counts, done, compiles = _run(tmp_path, "frozen", REALISTIC)
    assert counts.reads == len(done) and counts.syncs <= len(done) + 2
    # Per block one float32 array of 16 rows (10 steps per sync, a power of two): a finiteness flag per
    # leaf and a few scalars per row.
    leaves = _state(REALISTIC)[1]
    per_step = {counts.read_bytes // (len(done) * 4 * bucket(10))}
    assert per_step <= set(range(leaves + 8)) and counts.read_bytes < 2e-4 * _state(REALISTIC)[0]
    assert compiles == 1


HARNESS_FUNCTIONS = ("write_row", "copy_tree", "_write_flags", "repeat", "state_finite")


def _harness_compiles() -> dict:
    """Compiles of the harness's own functions: the block protocol's row writer and restore-point copy,
    the per-step protocols' flag rows, the frozen protocol's repeat check, the state's check."""
    return {name: COMPILES.of(name) for name in HARNESS_FUNCTIONS}


@pytest.mark.parametrize("protocol", ["train", "frozen"])
def test_nothing_compiles_after_step_0_of_a_clean_run(tmp_path, protocol):
    """A configuration of 100 steps (train: blocks that grow from one step): the user's step compiles
    once and the harness's functions once each, all of it while the first blocks run; no block length
    compiles anything (a gather with an argument per step compiled for seconds at K = 1024)."""
    before = _harness_compiles()
    _, done, compiles = _run(tmp_path, protocol, TINY, steps=100)
    new = {k: v - before[k] for k, v in _harness_compiles().items()}
    assert compiles == 1
    assert COMPILES.total == AT_FIRST_BLOCK[0] == AT_CALL[1], "something compiled after step 0"
    # Once each at most (an earlier test in this process may have compiled them for this signature).
    assert all(n <= 1 for n in new.values()) and new["state_finite"] == 0, new
    if protocol == "train":
        assert len({b.end - b.start for b in done}) > 2  # the block sizes did change


def test_the_compile_count_sees_a_planted_array_shaped_per_block(tmp_path, monkeypatch):
    """The count can fail: a block array whose shape changes from block to block (what the gather of a
    block's losses, one argument per loss, used to do) makes the row writer compile more than once."""
    import jax.numpy as jnp

    grown = iter(range(10**6))

    def rows_per_block():
        return jnp.zeros((ROWS + next(grown), 3), jnp.float32)

    monkeypatch.setattr(blocks_module, "new_rows", rows_per_block)
    before = _harness_compiles()
    _run(tmp_path, "train", TINY, steps=60)
    assert COMPILES.of("write_row") - before["write_row"] > 1
    assert COMPILES.total > AT_CALL[1]  # the after-step-0 check sees them


@pytest.mark.slow
def test_the_counts_see_a_planted_copy_of_the_state_per_block(tmp_path, monkeypatch):
    """The check can fail: a per-block host snapshot (what the block protocol used to take) planted
    into the loop shows up as the state's bytes in every block and a sync per block more."""
    real = blocks_module.dispatch_block

    def with_snapshot(h, seed, state, *args, **kwargs):
        HostSnapshot().take((state.params, state.opt_state))
        return real(h, seed, state, *args, **kwargs)

    monkeypatch.setattr(blocks_module, "dispatch_block", with_snapshot)
    counts, done, _ = _run(tmp_path, "train", TINY, steps=40)
    state, leaves = _state(TINY)
    assert counts.read_bytes >= len(done) * state
    assert counts.syncs > len(done) + 2 and counts.reads >= len(done) * (1 + leaves)
