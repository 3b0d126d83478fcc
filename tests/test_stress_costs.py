"""What the stress loop asks of the device, counted by jax itself (``bench/counting.py``: every host read
of a jax Array with its bytes, every wait, every compile by name), for 100-step runs at the
benchmark's realistic size with nothing failing: no byte of the state goes to the host (only each
block's losses and one flag), at most blocks + 2 host syncs, and the user's step compiled once. A
planted per-block copy of the state to the host is caught by the same counts."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import jax
import pytest

from xla_harness.programs.interface import load_program
from xla_harness.stress import blocks as blocks_module
from xla_harness.stress.checker import bucket, pad_size
from xla_harness.stress.runner import run_matrix
from xla_harness.stress.snapshot import HostSnapshot
from xla_harness.stress.spec import StressSpec

from .helpers import TINY

_spec = importlib.util.spec_from_file_location("counting", Path(__file__).resolve().parent.parent / "bench/counting.py")
counting = importlib.util.module_from_spec(_spec)
sys.modules["counting"] = counting
_spec.loader.exec_module(counting)

REALISTIC = dict(vocab=32768, d_model=512, layers=2, heads=8, seq=32, batch=8)  # bench/stress_overhead.py's
COMPILES = counting.CompileCounts()


def _run(tmp_path: Path, protocol: str, size: dict, steps: int = 100):
    spec = StressSpec(modes=("full",), remats=(True,), seeds=(1,), steps=steps, protocol=protocol, **size)
    events = []
    before = COMPILES.of("step")
    with counting.DeviceCounts() as counts:
        run_matrix(spec, tmp_path / protocol, on_event=events.append)
    done = [e.block for e in events if e.kind == "block"]
    assert sum(b.end - b.start for b in done) == steps and all(r["finite"] for b in done for r in b.records)
    return counts, done, COMPILES.of("step") - before


def _state(size: dict) -> tuple[int, int]:
    """(bytes, leaves) of the built-in program's state at ``size``."""
    program = load_program("tied-embedding", mode="full", remat=True, **size)
    leaves = jax.tree_util.tree_leaves(jax.eval_shape(program.init, jax.random.key(0)))
    return sum(x.size * x.dtype.itemsize for x in leaves), len(leaves)


@pytest.mark.slow
def test_a_clean_train_run_copies_no_state_to_the_host_and_compiles_the_step_once(tmp_path):
    counts, done, compiles = _run(tmp_path, "train", REALISTIC)
    # Per block one float32 array: its state flag and its losses, padded to a power of 8.
    assert counts.read_bytes == sum(4 * (1 + pad_size(b.end - b.start)) for b in done)
    assert counts.read_bytes < 1e-4 * _state(REALISTIC)[0]
    assert counts.reads == len(done)
    assert counts.syncs <= len(done) + 2
    assert compiles == 1
    assert len(done) < 20  # blocks grow from one measured step


@pytest.mark.slow
def test_a_clean_frozen_run_copies_no_state_to_the_host_and_compiles_the_step_once(tmp_path):
    counts, done, compiles = _run(tmp_path, "frozen", REALISTIC)
    assert counts.reads == len(done) and counts.syncs <= len(done) + 2
    # Per block one float32 array of its steps' flags: a finiteness flag per leaf and a few scalars.
    leaves = _state(REALISTIC)[1]
    per_step = {counts.read_bytes // sum(4 * bucket(b.end - b.start) for b in done)}
    assert per_step <= set(range(leaves + 8)) and counts.read_bytes < 2e-4 * _state(REALISTIC)[0]
    assert compiles == 1


HARNESS_FUNCTIONS = ("state_finite", "summarize_block", "_pack_flags", "repeat")


def _harness_compiles() -> dict:
    """Compiles of the harness's own block-level functions: the state's check, the gather of a block's
    losses or flags, the frozen protocol's repeat check."""
    return {name: COMPILES.of(name) for name in HARNESS_FUNCTIONS}


@pytest.mark.parametrize("protocol", ["train", "frozen"])
def test_the_functions_gathering_a_block_compile_for_a_handful_of_sizes(tmp_path, protocol):
    """The check and the gather of a block's losses or flags compile once per padded size (powers of
    8), not per block length: a configuration of 100 steps, whose blocks grow from one step, compiles
    them at most three times and its own step once (a compile costs more than a short run's blocks
    do). The train protocol's block lengths vary more than their padded sizes: padded to its own
    length, each length would compile once more."""
    before = _harness_compiles()
    _, done, compiles = _run(tmp_path, protocol, TINY, steps=100)
    new = {k: v - before[k] for k, v in _harness_compiles().items()}
    gather, padded = ("summarize_block", pad_size) if protocol == "train" else ("_pack_flags", bucket)
    sizes = {padded(b.end - b.start) for b in done}
    assert compiles == 1 and new[gather] == len(sizes) <= 3, (new, [b.end - b.start for b in done])
    if protocol == "train":
        assert len({b.end - b.start for b in done}) > len(sizes)


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
