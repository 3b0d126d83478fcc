"""What the block loop asks of the host per step, counted where it happens (no timing, so a GPU's
figures can be argued from a CPU run): per step the user's step and its row, per block one restore
copy and one fetch of the block's rows (12 KiB whatever the state); and the order that lets the
device run ahead: block b's rows are fetched only once block b+1's steps are all enqueued (the last
block aside). Each count is shown failing on a planted change: a harness dispatch added per step, a
fetch per step, a loop that waits for each block's verdict before it dispatches the next."""

from __future__ import annotations

import math
from dataclasses import replace

import jax
import jax.numpy as jnp
import optax

from xla_harness.names import BLOCK_ROWS as ROWS
from xla_harness.programs.interface import TrainProgram, step_from_loss
from xla_harness.stress.loop import blocks as blocks_module
from xla_harness.stress.proof.harness import Counters
from xla_harness.stress.runner import check_same_program, first_batch, initial_state, prepare, run_config
from xla_harness.stress.spec import StressSpec

STEPS, K = 64, 8


def _program() -> TrainProgram:
    opt = optax.adam(1e-2)

    def init(key):
        params = {"w": jax.random.normal(key, (4, 8)), "b": jnp.zeros((8,))}
        return params, opt.init(params)

    def batch(key, step):
        return jax.random.normal(key, (16, 4))

    def loss(params, x):
        return jnp.mean((jnp.tanh(x @ params["w"] + params["b"]) - 1.0) ** 2)

    return TrainProgram(name="regression", init=init, batch=batch, step=step_from_loss(loss, opt))


class Logged(Counters):
    """The harness's counters, also logging each fetch in order among the user's steps."""

    def __init__(self) -> None:
        super().__init__()
        self.log: list[str] = []

    def fetch(self, x):
        self.log.append("fetch")
        return super().fetch(x)


def _run(plant=None):
    spec = StressSpec(program="regression", seeds=(1,), steps=STEPS, block=K)
    h = prepare(spec, {}, _program())
    state = initial_state(h, 1)
    h = check_same_program(h, state.params, state.opt_state, first_batch(h, 1))
    counters = Logged()
    h = replace(h, counters=counters)
    real_step = h.step

    def logged_step(*args):
        counters.log.append("step")
        return real_step(*args)

    h = replace(h, step=logged_step)
    if plant is not None:
        h = plant(h)
    before = (counters.dispatches, counters.host_syncs, counters.d2h_bytes)
    blocks = list(run_config(h, 1, state))
    assert sum(b.end - b.start for b in blocks) == STEPS and all(r.finite for b in blocks for r in b.records)
    dispatches, syncs, d2h = (a - b for a, b in zip((counters.dispatches, counters.host_syncs, counters.d2h_bytes),
                                                    before, strict=True))
    return blocks, dispatches, syncs, d2h, counters.log


def counts_per_step(blocks, dispatches, syncs, d2h) -> dict:
    """What the block protocol should cost, against what it did: per step one dispatch of the user's step
    and one of its row; per block one restore copy, one host sync and one block of rows."""
    n = len(blocks)
    return {"dispatches": (dispatches, 2 * STEPS + n), "host syncs": (syncs, n),
            "bytes to the host": (d2h, n * ROWS * 12)}


def fetched_before_the_next_block(log: list[str]) -> list[int]:
    """The fetches (by block) made before the next block's steps were all enqueued: with K steps a block,
    fetch i must come after step (i + 2) * K (the last block's fetch aside)."""
    late = []
    fetches = [i for i, e in enumerate(log) if e == "fetch"]
    for b, at in enumerate(fetches[:-1]):
        steps = log[:at].count("step")
        if steps < min((b + 2) * K, STEPS):
            late.append(b)
    return late


def test_per_step_one_row_per_block_one_copy_one_sync_and_12_kib():
    blocks, dispatches, syncs, d2h, log = _run()
    assert len(blocks) == math.ceil(STEPS / K)
    got = counts_per_step(blocks, dispatches, syncs, d2h)
    assert {k: a for k, (a, _) in got.items()} == {k: b for k, (_, b) in got.items()}
    assert dispatches / STEPS == 2 + 1 / K  # the plain loop's 1, the row's 1, a copy per block
    assert log.count("step") == STEPS and log.count("fetch") == len(blocks)


def test_each_blocks_rows_are_fetched_after_the_next_block_is_enqueued():
    _, _, _, _, log = _run()
    assert fetched_before_the_next_block(log) == []
    assert log[-2:] == ["fetch", "fetch"]  # the last two blocks: the one before the last, then the last


def test_a_planted_dispatch_per_step_is_counted():
    def extra(h):
        real = h.write_row

        def write_twice(rows, *state):
            h.copy(state[0])  # a second harness function per step (counted: it is one of the harness's)
            return real(rows, *state)

        return replace(h, write_row=write_twice)

    got = counts_per_step(*_run(extra)[:4])
    assert got["dispatches"][0] >= got["dispatches"][1] + STEPS


def test_a_planted_fetch_per_step_is_counted():
    def reads_each_step(h):
        real = h.write_row

        def write_and_read(rows, *state):
            out = real(rows, *state)
            h.counters.fetch(out)
            return out

        return replace(h, write_row=write_and_read)

    got = counts_per_step(*_run(reads_each_step)[:4])
    assert got["host syncs"][0] == got["host syncs"][1] + STEPS
    assert got["bytes to the host"][0] > got["bytes to the host"][1]


def test_a_loop_that_waits_for_each_verdict_is_caught(monkeypatch):
    monkeypatch.setattr(blocks_module._Blocks, "_wants_drain", lambda self, s: True)
    _, _, _, _, log = _run()
    assert fetched_before_the_next_block(log) != []
