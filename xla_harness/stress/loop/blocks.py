"""The block protocol (train, ``--commit block``, the default): the step's outputs go straight back
into it as in a plain loop, and after each step one small jitted function outside the step reads
its outputs and writes one row of the block's array on the device (:mod:`~xla_harness.stress.device.step_rows`:
the loss, the first non-finite value, whether the new state is finite). The array is fetched in one
transfer while the next block runs (:func:`dispatch_block` returns a :class:`PendingBlock`;
:meth:`PendingBlock.resolve` reads it). At each block's start the state is copied on the device
(one copy per block, kept until the block is found clean): the block's restore point.

**The first execution is the measurement.** A step's record is what its first execution from a
finite state showed, whatever a later execution shows: the failures this tool counts (a race, a
flaky device) do not replay. A step whose outputs are non-finite is recorded so; when its new
*state* is non-finite it is rolled back (the run goes on from the state before it, as ``--commit
step`` does), and the steps of the block after it, which ran from a non-finite state, are not
measurements: they run again from the rolled-back state, as the next block. A step with a
non-finite loss (or ``aux`` gradients) but a finite new state is recorded non-finite and the run
goes on from what it returned, as a plain loop would.

To roll back, the state before the failed step is rebuilt from the block's restore point by running
the block's earlier steps again (:func:`~xla_harness.stress.loop.restore.recompute`, at most one block of
steps). Those executions rebuild a state and are never counted: each is held to its record (a
non-finite new state: the recompute is tried again, from the same point, then from the older one
kept (``init``, the last checkpoint); after :data:`~xla_harness.stress.loop.rollback.TRIES` the seed is
recorded as unrecoverable and stops, never continuing from a non-finite state), and the steps whose
loss differs in any bit from its record are reported apart, on the block (``recompute``), as are
those that came out non-finite.
Where device memory cannot hold the copies, the restore point is the older one alone
(:func:`~xla_harness.stress.loop.rollback.device_copies_fit`). The restore points, the records since the
older one and the rebuild are the :class:`~xla_harness.stress.loop.rollback.Rollback`'s; the loop here
holds only what the loop decides (the block size, what is in flight, whether it stopped).

Blocks holding a ``--reference`` sample or a finite injected fault (``lost-row``/``doubled-row``) run
step by step (:func:`~xla_harness.stress.loop.steps.run_steps`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from xla_harness.errors import HarnessError
from xla_harness.programs.interface import guard_user_error
from xla_harness.stress.device.inject import step_keys
from xla_harness.stress.device.step_rows import RowLayout, last_rows, new_rows
from xla_harness.stress.loop.block_size import BlockSize, new_block_size
from xla_harness.stress.loop.checkpoint import Checkpointer
from xla_harness.stress.loop.pipeline import Pipeline, Verdict
from xla_harness.stress.loop.restore import DevicePoint
from xla_harness.stress.loop.rollback import Rollback
from xla_harness.stress.loop.steps import run_steps
from xla_harness.stress.proof.harness import BlockResult, Harnessed, RunState, abstract, follow_signature
from xla_harness.stress.results.records import Step

# (seed, step, the step's record, a function giving the state before it: (params, opt_state), or None
# where it cannot be rebuilt); called for each failing step as its block is resolved
OnFailure = Callable[[int, int, Step, Callable[[], "tuple[Any, Any] | None"]], None]

@dataclass
class PendingBlock:
    """Steps [start, end) dispatched from the state at ``start`` (``point``: a device copy of it, or
    None where copies do not fit), one row per step in ``rows`` (on its way to the host)."""

    start: int
    end: int
    rows: jax.Array
    stopped: bool  # a stop request cut the block short at ``end``
    point: DevicePoint | None
    layout: RowLayout  # the names behind its rows' codes

    def resolve(self, h: Harnessed) -> np.ndarray:
        """The block's rows on the host: its one fetch."""
        return last_rows(h.counters.fetch(self.rows), self.end - self.start)


def dispatch_block(h: Harnessed, seed: int, state: RunState, start: int, end: int, planned: set[int],
                   should_stop: Callable[[], bool], watch_until: int, copy: bool,
                   layout: RowLayout | None = None) -> PendingBlock:
    """Run steps [start, end) feeding each step's outputs to the next (NaN faults planted at
    ``planned`` steps), each followed by its row; nothing waits for the device. ``copy``: the state at
    ``start`` is copied on the device first (the block's restore point). The state's signature is
    followed (the executable for it) up to step ``watch_until``. ``layout``: the rows' layout, taken
    from the first step's outputs when not given."""
    point = None
    if copy:
        point = DevicePoint(h.copy((state.params, state.opt_state)), start)
    rows = new_rows()
    stopped = False
    # The loop a plain loop runs, plus one row per step, with no frame of the harness's own around the
    # step's or the row's call: their dispatches are counted once the block is dispatched (the host's
    # work per step is what a fast device waits on: bench/host_per_step.py).
    program_batch, call_step = h.program.batch, h.call_step
    write_row, row_dispatches = h.counters.uncounted(h.write_row)
    per_step = 1 + row_dispatches  # the step's dispatch and its row's, counted here
    run = h.direct_step()
    params, opt_state = state.params, state.opt_state
    t, counted_from = start - 1, start  # the steps before counted_from are counted
    for t in range(start, end):
        try:  # the user's batch, guarded as Harnessed.batch guards it (two calls less a step)
            batch = program_batch(step_keys(seed, t)[0], t)
        except BaseException as e:  # noqa: BLE001 - the user's code: one error line
            h.counters.made((t - counted_from) * per_step)
            raise guard_user_error(e, h.spec.program, "batch") from e
        if t <= watch_until:
            follow_signature(h, (params, opt_state, batch))
            run = h.direct_step()
        try:
            params, opt_state, aux = run(params, opt_state, batch)
        except (TypeError, ValueError):  # refused before it ran (another signature), or the step's own error
            h.counters.made((t - counted_from) * per_step)
            counted_from = t + 1
            params, opt_state, aux = call_step(params, opt_state, batch)  # counts itself; follows a signature
            h.counters.made(row_dispatches)  # this step's row, written below
            run = h.direct_step()
        except BaseException as e:  # noqa: BLE001 - the user's code: one error line (as call_step)
            h.counters.made((t - counted_from) * per_step + 1)
            raise guard_user_error(e, h.spec.program, "step") from e
        if t in planned:
            params, opt_state = h.inject(None, params, opt_state, step_keys(seed, t)[1])
        if layout is None:
            layout = RowLayout.of(params, opt_state, aux)
        rows = write_row(rows, params, opt_state, aux)
        if should_stop():
            stopped = True
            break
    h.counters.made((t + 1 - counted_from) * per_step)
    rows.copy_to_host_async()
    if layout is None:
        raise HarnessError("internal: a block dispatched without a step")
    state.move(params, opt_state, t + 1)
    return PendingBlock(start, t + 1, rows, stopped, point, layout)


def step_record(h: Harnessed, layout: RowLayout, step: int, row: list[float], planned: set[int]) -> Step:
    """A step's record from its row (:class:`~xla_harness.stress.device.step_rows.RowLayout`)."""
    loss, bad = layout.read(row)
    return Step.of_row(step, loss, bad, h.spec.inject if step in planned else None)


def _needs_steps(h: Harnessed, planned: set[int], start: int, end: int) -> bool:
    """Blocks holding a finite fault or a --reference sample run step by step."""
    spec = h.spec
    if spec.inject in ("lost-row", "doubled-row") and any(start <= t < end for t in planned):
        return True
    return bool(spec.reference) and any(t % spec.reference_every == 0 for t in range(start, end))


class _Blocks:
    """One (configuration, seed) under the block protocol: the state, the restore points and the
    records since the older one, the block being resolved."""

    def __init__(self, h: Harnessed, seed: int, state: RunState, steps: int, planned: set[int],
                 should_stop: Callable[[], bool], checkpointer: Checkpointer | None,
                 line_cost: Callable[[], float], size: BlockSize, on_failure: OnFailure | None = None) -> None:
        self.h, self.seed, self.state, self.steps, self.planned = h, seed, state, steps, planned
        self.on_failure = on_failure
        self.should_stop, self.checkpointer, self.line_cost = should_stop, checkpointer, line_cost
        self.size = size
        self.rollback = Rollback(h, seed, planned, state)
        self.first = state.next_step
        self.fed = None  # the state's signature as the step returns it (taken at the first step)
        self.last_resolved = time.perf_counter()
        self.saved_at = -1  # the step of the last checkpoint this run wrote
        self.dead = False  # the state could not be rebuilt: the seed stops
        self.stopped = False  # a stop request cut the last block short
        self.layout: RowLayout | None = None  # the names behind a row's code (from the first step's outputs)

    # -- the loop

    def run(self) -> Iterator[BlockResult]:
        """Dispatch block k+1, then resolve block k (its fetch overlaps block k+1's steps; a block
        rolled back drops k+1, which ran from a state the rollback replaced). Where the loop needs
        the state verified (a block run step by step, the first blocks that measure the block size,
        a checkpoint or host copy due, the end), the block in flight is resolved first."""
        pipe: Pipeline[PendingBlock] = Pipeline(self._resolve)
        while not self.dead:
            s = self.state.next_step  # where the block in flight, if any, ends
            kind, end = self._next(s)
            if pipe.pending is not None and (kind != "block" or self._wants_drain(s)):
                yield from pipe.flush()
                continue
            self._at_drain(s)  # nothing in flight: the state at s is verified
            if kind == "done":
                return
            if kind == "stepwise":
                yield from self._stepwise(s, end)
            elif kind == "measure":
                yield from self._measure(s)
            else:
                try:
                    block = self._dispatch(s, end)
                except HarnessError:  # the program's error (its batch, its step): the block before it ran
                    yield from pipe.flush()  # and its records stand
                    raise
                yield from pipe.push(block)

    def _next(self, s: int) -> tuple[str, int]:
        """What runs from step ``s``: ``done`` (the end, or a stop request met), a block run ``stepwise``
        (a finite fault or a --reference sample in it), one step to ``measure`` the block size, or a
        ``block`` dispatched to run ahead; and the step it ends at."""
        if s >= self.steps or self.stopped:
            return "done", s
        end = min(s + self.size.size, self.steps)
        if _needs_steps(self.h, self.planned, s, end):
            return "stepwise", end
        if not self.size.measured:
            return "measure", s + 1
        return "block", end

    def _wants_drain(self, s: int) -> bool:
        due = self.checkpointer is not None and s < self.steps and self.checkpointer.due()
        return due or self.rollback.host_copy_due(s)

    def _at_drain(self, s: int) -> None:
        """Nothing in flight, the state at ``s`` verified: a checkpoint when one is due (a stop
        request makes one due), a host copy when failures make one pay (no device copies)."""
        state = self.state
        if s >= self.steps or s == self.saved_at:
            return
        if self.checkpointer is not None and self.checkpointer.due():
            self.saved_at = s
            self.rollback.move_to(self.checkpointer.save(s, state.params, state.opt_state))
        elif self.rollback.host_copy_due(s) and not self.should_stop():
            self.rollback.take_host_copy(state, self.size.step_seconds or 0.0)

    def _stepwise(self, s: int, end: int) -> Iterator[BlockResult]:
        """A block run step by step (a finite fault or a --reference sample in it), from a verified state."""
        state, h = self.state, self.h
        for block in run_steps(h, self.seed, state, end, self.planned, self.should_stop, end - s):
            self.rollback.remember(block)
            yield block
        self.stopped = state.next_step < end
        if self.fed is None and state.next_step > s:
            self.fed = abstract((state.params, state.opt_state))

    def _dispatch(self, s: int, end: int) -> PendingBlock:
        state = self.state
        block = dispatch_block(self.h, self.seed, state, s, end, self.planned, self.should_stop, self.first + 1,
                               self.rollback.copies, self.layout)
        self.stopped, self.layout = block.stopped, block.layout
        if self.fed is None:
            self.fed = abstract((state.params, state.opt_state))
        return block

    def _measure(self, s: int) -> Iterator[BlockResult]:
        """The first blocks of a run whose block size is not known, one step each: the first (which
        also compiles the row writer) untimed, the second timed on its own and its fetch timed with
        nothing else queued: what the block size starts from."""
        h, state, size = self.h, self.state, self.size
        if self.layout is None:  # no step dispatched yet: this one compiles the row writer
            block = self._dispatch(s, s + 1)
            yield from self._verdict(block, block.resolve(h), time.perf_counter(), sized=False).deliver()
            self.stopped = self.stopped or self.should_stop()
            return
        t0 = time.perf_counter()
        block = self._dispatch(s, s + 1)
        h.counters.wait((state.params, state.opt_state))
        t1 = time.perf_counter()
        rows = block.resolve(h)
        t2 = time.perf_counter()
        size.start(t1 - t0, t2 - t1)
        yield from self._verdict(block, rows, t2, sized=False).deliver()
        self.stopped = self.stopped or self.should_stop()
        self.last_resolved = time.perf_counter()

    def _resolve(self, block: PendingBlock) -> Verdict:
        rows = block.resolve(self.h)
        return self._verdict(block, rows, time.perf_counter())

    def _verdict(self, block: PendingBlock, rows: np.ndarray, fetched: float, sized: bool = True) -> Verdict:
        """The block's steps recorded from their rows up to the first whose new state is not finite.
        That step is rolled back: the state before it is rebuilt (:meth:`_rebuild`) and becomes the
        run's state, and the verdict is not ``kept`` (the rest of the block, and the block in flight
        after it, ran from a state replaced); a state that cannot be rebuilt ends the seed. A clean
        block's host costs (its records, and what its consumer does with them) and the time since the
        last verdict size the next block."""
        h, state, size = self.h, self.state, self.size
        cycle, self.last_resolved = fetched - self.last_resolved, fetched
        records, poisoned = [], None
        if len(rows) and bool((rows[:, 1] < 0).all()):  # every value of every step finite (the common block)
            inject, planned = h.spec.inject, self.planned
            records = [Step.of_row(t, loss, None, inject if t in planned else None)
                       for t, loss in zip(range(block.start, block.end), rows[:, 0].tolist(), strict=True)]
        for i, row in enumerate([] if records else rows.tolist()):
            records.append(step_record(h, block.layout, block.start + i, row, self.planned))
            if row[2] == 0:  # the step's new state is not finite: what ran after it is no measurement
                poisoned = block.start + i
                break
        failed = sum(not r.finite for r in records)
        if poisoned is None:
            result = BlockResult(h.label, self.seed, block.start, block.end, records)
            self.rollback.remember(result)
            if failed and self.on_failure is not None:  # a loss-only failure: its new state was kept
                self._tell_failures(block, records)

            def sized_by_it() -> None:  # once the consumer has the records (progress, the results line queued)
                size.observe(len(records), failed, cycle, time.perf_counter() - fetched + self.line_cost())

            return Verdict(result, after=sized_by_it if sized else None)
        self.rollback.remember(BlockResult(h.label, self.seed, block.start, poisoned + 1, records,
                                           rolled_back={poisoned}))
        rebuilt = self.rollback.roll_back(block.point, poisoned, self.fed)
        result = BlockResult(h.label, self.seed, block.start, poisoned + 1, records, rebuilt.summary(), {poisoned})
        size.observe(len(records), failed, 0.0, 0.0)
        if rebuilt.ok:
            last = rebuilt.tries[-1]
            if self.on_failure is not None:  # the state before the failed step, before the loop donates it
                self.on_failure(self.seed, poisoned, records[-1], lambda: (last.params, last.opt_state))
            state.move(last.params, last.opt_state, poisoned + 1)
        else:
            self.dead = True  # never continue from a state that is not finite: the seed stops

        def restart_the_clock() -> None:  # the recovery's time is not the steps'
            self.last_resolved = time.perf_counter()

        return Verdict(result, kept=False, after=restart_the_clock)

    def _tell_failures(self, block: PendingBlock, records: list[Step]) -> None:
        """Each failing step of a clean block (its loss or gradients non-finite, its new state finite: not
        rolled back) to ``on_failure``, with a function that rebuilds the state before it from the block's
        restore point, as a rollback would (called only for the steps the hook keeps: never counted)."""
        assert self.on_failure is not None
        for r in records:
            if r.finite or r.injected:
                continue
            step = r.step

            def before(step: int = step):
                rebuilt = self.rollback.rebuild(block.point, step, self.fed)
                last = rebuilt.tries[-1]
                return (last.params, last.opt_state) if rebuilt.ok else None

            self.on_failure(self.seed, step, r, before)


def run_blocks(h: Harnessed, seed: int, state: RunState, steps: int, planned: set[int],
               should_stop: Callable[[], bool], checkpointer: Checkpointer | None = None,
               line_cost: Callable[[], float] = lambda: 0.0, size: BlockSize | None = None,
               on_failure: OnFailure | None = None) -> Iterator[BlockResult]:
    """Steps [state.next_step, steps) of one (configuration, seed) under the block protocol (see the
    module docstring), one BlockResult per block, in order. ``line_cost``: the CPU seconds a block's
    results line costs its consumer (part of a block's fixed cost, for the block size). ``size``: the
    block sizer (:func:`new_block_size` when not given). ``on_failure(seed, step, record, before)``:
    told each failing step as its block is resolved, with ``before()`` giving the state before it (a
    rolled-back step's, rebuilt anyway; a loss-only failure's, rebuilt from the block's restore point
    when called): ``stress --explain`` keeps a host copy of the first few."""
    size = size if size is not None else new_block_size(h.spec)
    yield from _Blocks(h, seed, state, steps, planned, should_stop, checkpointer, line_cost, size, on_failure).run()
