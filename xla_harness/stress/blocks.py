"""The block protocol (train, ``--commit block``, the default): the step's outputs go straight back
into it as in a plain loop, and per block of K steps the harness dispatches one check that every
floating leaf of the state is finite and packs it with the block's losses into one small array,
fetched in one transfer while the next block runs (:func:`dispatch_block` returns a
:class:`PendingBlock`; :meth:`PendingBlock.resolve` is the block's verdict). A clean block costs
the device nothing else: no copy of the state is made anywhere.

A block whose losses or state are non-finite is brought back to its start from a restore point
(:mod:`~xla_harness.stress.restore`: ``init`` again, the last checkpoint, or a host copy taken once
failures are frequent enough to pay for it), the recorded steps in between recomputed and their
losses compared bit for bit with the records; then it is replayed step by step
(:func:`~xla_harness.stress.steps.run_steps`, check and rollback per step), so its records, counts
and the trajectory that continues are the per-step protocol's (the batches are a function of
(seed, step)). The replayed losses are compared with the block run's up to the replay's first
failure; a difference marks the step ``nondet`` (the step is not a function of its inputs), as
does a failure the replay does not reproduce.

The block's check sees what is in the state at its end: a step that writes a non-finite value which
a later step of the same block removes again (a step that cleans its own state), or a non-finite
``aux["grads"]`` the step does not apply, is counted only with ``commit="step"``. Blocks holding a
``--reference`` sample or a finite injected fault (``lost-row``/``doubled-row``) run step by step.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import jax
import numpy as np

from xla_harness.stress.checker import _copy, bucket, pad
from xla_harness.stress.harness import BlockResult, Harnessed, RunState, abstract, follow_signature
from xla_harness.stress.inject import step_keys
from xla_harness.stress.restore import (
    Checkpointer,
    InitPoint,
    RestorePoint,
    SnapshotPolicy,
    recompute,
    same_loss,
    take_host_point,
)
from xla_harness.stress.steps import DEFAULT_SYNC, run_steps


@dataclass
class BlockSize:
    """How many steps the block protocol runs between two checks: ``fixed`` (``--block K``) or chosen
    from what the run measures. A block's fixed cost is ``c`` steps' worth of time: its check on the
    device and its fetch (measured once, on an idle device: :meth:`start`) and the host's work for it
    (the records, the results line, progress: measured every block); a block holding a failure costs
    its replay, about K more steps. Per step that is c/K + r*K at failure rate r: K = c / TARGET
    keeps the fixed costs under TARGET of the step's time, and once failures are seen K is held at
    sqrt(c / r), the minimum of the sum. The step's time is the clean blocks' wall time over their
    steps (on an accelerator, the device's pace: the host runs a block ahead). K is a power of two
    (the block-level functions compile once per size), starts from one measured step and grows at
    most GROWTH-fold from one block to the next."""

    fixed: int | None = None
    size: int = 1
    steps: int = 0
    failures: int = 0
    check_seconds: float | None = None  # the device's check of one block and its fetch, measured idle
    step_seconds: float | None = None
    host_seconds: float = 0.0  # the host's work per block (running mean)
    clean_steps: int = 0
    clean_seconds: float = 0.0

    TARGET = 0.005  # half the 1% the harness may cost: what is not measured (dispatch of the check) fits
    LIMIT = 1024
    GROWTH = 8

    def __post_init__(self) -> None:
        if self.fixed:
            self.size = self.fixed

    @property
    def measured(self) -> bool:
        return self.fixed is not None or self.check_seconds is not None

    def start(self, step_seconds: float, check_seconds: float) -> None:
        """The first measurement: one step and one block's check, each timed alone."""
        self.step_seconds, self.check_seconds = step_seconds, check_seconds
        self.update(0, 0, step_seconds, check_seconds)

    def observe(self, ran: int, failed: int, wall_seconds: float, host_seconds: float) -> None:
        """A block of ``ran`` steps resolved ``wall_seconds`` after the one before it (0: a replay, not
        timed), its host work ``host_seconds``; ``failed`` failures in it."""
        if wall_seconds > 0:
            self.clean_steps += ran
            self.clean_seconds += wall_seconds
            self.host_seconds += (host_seconds - self.host_seconds) / min(self.clean_steps, 8)
        step = self.clean_seconds / self.clean_steps if self.clean_steps else (self.step_seconds or 0.0)
        self.update(ran, failed, step, (self.check_seconds or 0.0) + self.host_seconds)

    def update(self, ran: int, failed: int, step_seconds: float, cost_seconds: float) -> None:
        self.steps += ran
        self.failures += failed
        if self.fixed or step_seconds <= 0:
            return
        self.step_seconds = step_seconds
        cost = cost_seconds / step_seconds  # one block's fixed costs, in steps
        k = math.ceil(cost / self.TARGET)
        if self.failures:
            k = min(k, math.ceil(math.sqrt(cost * max(self.steps, 1) / self.failures)))
        self.size = max(1, min(bucket(max(k, 1)), self.GROWTH * self.size, self.LIMIT))


@dataclass
class PendingBlock:
    """Steps [start, end) dispatched, their losses and the state's flag packed into ``summary`` (on its
    way to the host)."""

    start: int
    end: int
    summary: jax.Array
    stopped: bool  # a stop request cut the block short at ``end``

    def resolve(self, h: Harnessed) -> tuple[list[float], bool]:
        """The block's losses (float32 as floats) and whether the state at its end is finite: the
        block's one fetch."""
        host = h.counters.fetch(self.summary)
        return [float(x) for x in host[1:1 + self.end - self.start]], bool(host[0] != 0)


def dispatch_block(h: Harnessed, seed: int, state: RunState, start: int, end: int, planned: set[int],
                   should_stop: Callable[[], bool], watch_until: int) -> PendingBlock:
    """Run steps [start, end) feeding each step's outputs to the next (NaN faults planted at
    ``planned`` steps), then dispatch the block's check; nothing waits for the device. The state's
    signature is followed (the executable for it) up to step ``watch_until``."""
    losses, stopped = [], False
    for t in range(start, end):
        batch = h.batch(seed, t)
        if t <= watch_until:
            follow_signature(h, (state.params, state.opt_state, batch))
        new_p, new_o, aux = h.call_step(state.params, state.opt_state, batch)
        if t in planned:
            new_p, new_o = h.injector()(None, new_p, new_o, step_keys(seed, t)[1])
            h.counters.dispatches += 1
        state.params, state.opt_state = new_p, new_o
        losses.append(aux["loss"])
        state.next_step = t + 1
        if should_stop():
            stopped = True
            break
    ok = h.state_check(state.params, state.opt_state)
    summary = h.summarize(pad(losses), ok)
    h.counters.dispatches += 2
    summary.copy_to_host_async()
    return PendingBlock(start, state.next_step, summary, stopped)


def _loss_record(step: int, loss: float, planned: set[int], h: Harnessed) -> dict:
    rec: dict[str, object] = {"step": step, "finite": True, "first_bad": None, "max_abs_update": None, "loss": loss}
    if step in planned:
        rec["injected"] = h.spec.inject
    return rec


def mark_nondeterminism(replayed: list[dict], first_run: list[float]) -> None:
    """Mark ``nondet`` the first replayed step whose loss differs from the block run's, looking up to
    the replay's first failure (from there on the block run went on from a non-finite state and the
    replay from the rollback); a block whose failure the replay does not reproduce marks its last
    step when no loss differs."""
    for rec, first in zip(replayed, first_run, strict=True):
        if not same_loss(rec["loss"], first):
            rec["nondet"] = True
            rec["nondet_detail"] = [loss_difference(first, rec["loss"])]
            return
        if not rec["finite"]:
            return
    replayed[-1]["nondet"] = True


def loss_difference(first: float, again: float | None) -> dict:
    """The nondeterminism detail of a train step: only its loss is compared (the block run's state is
    not kept), as the ``aux['loss']`` leaf; None where one of the two is not finite."""
    gap = ulp = None
    if again is not None and math.isfinite(first):
        a, b = np.float32(first), np.float32(again)
        gap = float(abs(a - b))
        if (a >= 0) == (b >= 0):  # sign and magnitude: within one sign the bits count ULPs
            ulp = float(abs(int(a.view(np.int32)) - int(b.view(np.int32))))
    return {"leaf": "aux['loss']", "elements": 1, "max_abs": gap, "max_ulp": ulp}


def _needs_steps(h: Harnessed, planned: set[int], start: int, end: int) -> bool:
    """Blocks holding a finite fault or a --reference sample run step by step."""
    spec = h.spec
    if spec.inject in ("lost-row", "doubled-row") and any(start <= t < end for t in planned):
        return True
    return bool(spec.reference) and any(t % spec.reference_every == 0 for t in range(start, end))


class _Blocks:
    """One (configuration, seed) under the block protocol: the state, the restore point and the
    records since it, the block being resolved."""

    def __init__(self, h: Harnessed, seed: int, state: RunState, steps: int, planned: set[int],
                 should_stop: Callable[[], bool], checkpointer: Checkpointer | None) -> None:
        self.h, self.seed, self.state, self.steps, self.planned = h, seed, state, steps, planned
        self.should_stop, self.checkpointer = should_stop, checkpointer
        multi = jax.process_count() > 1
        # Every process must check (a collective) after the same steps: K is measured only in one process.
        if h.block_size is None:
            h.block_size = BlockSize(h.spec.block if not multi else h.spec.block or DEFAULT_SYNC)
        self.size: BlockSize = h.block_size  # type: ignore[assignment]
        self.policy = SnapshotPolicy(fixed_cost=1.0 if multi else None)
        self.first = state.next_step
        self.point: RestorePoint = InitPoint(h, seed)
        if state.next_step:  # resumed: the records before it are not at hand, so a copy of the state is
            self.point = self._host_point(state.next_step)
        self.history: dict[int, dict] = {}
        self.fed = None  # the state's signature as the step returns it (taken at the first step)
        self.last_resolved = time.perf_counter()
        self.warmed = 0
        self.saved_at = -1  # the step of the last checkpoint this run wrote

    # -- records

    def _remember(self, block: BlockResult) -> None:
        for r in block.records:
            self.history[r["step"]] = r

    def _move_point(self, point: RestorePoint) -> None:
        self.point = point
        self.history = {t: r for t, r in self.history.items() if t >= point.step}

    # -- the loop

    def run(self) -> Iterator[BlockResult]:
        state, h = self.state, self.h
        state.backup = None  # no second copy of the state in device memory
        pending: PendingBlock | None = None
        s, stopped = state.next_step, False
        while True:
            can = s < self.steps and not stopped
            end = min(s + self.size.size, self.steps)
            stepwise = can and _needs_steps(h, self.planned, s, end)
            if pending is not None and (not can or stepwise or self._wants_drain(s)):
                clean = yield from self._resolve(pending)
                pending = None
                s = state.next_step
                if clean:
                    self._at_drain(s)
                continue
            if not can:
                if stopped:  # a stop with nothing in flight: the checkpoint --resume starts from
                    self._at_drain(s)
                return
            if self._wants_drain(s):  # nothing in flight: the state at s is verified
                self._at_drain(s)
            if stepwise:
                yield from self._stepwise(s, end)
                stopped = state.next_step < end
                s = state.next_step
                continue
            if not self.size.measured:
                yield from self._measure(s)
                stopped = self.should_stop()
                s = state.next_step
                continue
            new = self._dispatch(s, end)
            stopped = new.stopped
            if pending is not None:
                clean = yield from self._resolve(pending)
                if not clean:  # the block in flight ran on a state that was not finite: dropped
                    pending = None
                    s = state.next_step
                    continue
            pending, s = new, new.end

    def _wants_drain(self, s: int) -> bool:
        due = self.checkpointer is not None and s < self.steps and self.checkpointer.due()
        return due or self.policy.due(s - self.point.step)

    def _at_drain(self, s: int) -> None:
        """Nothing in flight, the state at ``s`` verified: a checkpoint when one is due (a stop
        request makes one due), a host copy when failures make one pay."""
        state = self.state
        if s >= self.steps or s == self.saved_at:
            return
        if self.checkpointer is not None and self.checkpointer.due():
            self.saved_at = s
            self._move_point(self.checkpointer.save(s, state.params, state.opt_state))
        elif self.policy.due(s - self.point.step) and not self.should_stop():
            t0 = time.perf_counter()
            point = self._host_point(s)
            self.policy.measured(time.perf_counter() - t0, self.size.step_seconds or 0.0)
            self._move_point(point)

    def _host_point(self, s: int) -> RestorePoint:
        point = take_host_point((self.state.params, self.state.opt_state), s)
        self.h.counters.host_syncs += 1
        self.h.counters.d2h_bytes += point.snapshot.nbytes
        return point

    def _stepwise(self, s: int, end: int) -> Iterator[BlockResult]:
        """A block run step by step (a finite fault or a --reference sample in it), from a verified state."""
        state, h = self.state, self.h
        state.backup = _copy((state.params, state.opt_state))
        h.counters.dispatches += 1
        for block in run_steps(h, self.seed, state, end, self.planned, self.should_stop, end - s):
            self._remember(block)
            self.policy.observe(block.end - block.start, block.nonfinite)
            yield block
        state.backup = None
        if self.fed is None and state.next_step > s:
            self.fed = abstract((state.params, state.opt_state))

    def _dispatch(self, s: int, end: int) -> PendingBlock:
        state = self.state
        block = dispatch_block(self.h, self.seed, state, s, end, self.planned, self.should_stop, self.first + 1)
        if self.fed is None:
            self.fed = abstract((state.params, state.opt_state))
        return block

    def _measure(self, s: int) -> Iterator[BlockResult]:
        """The first blocks of a run whose block size is not known: one step (which also compiles the
        block's check), then one step timed on its own and its check timed with nothing else queued:
        what the block size starts from."""
        h, state, size = self.h, self.state, self.size
        if self.warmed < 1:
            block = self._dispatch(s, s + 1)
            losses, ok = block.resolve(h)
            self.warmed += 1
            yield from self._verdict(block, losses, ok, time.perf_counter(), sized=False)
            return
        t0 = time.perf_counter()
        block = self._dispatch(s, s + 1)
        jax.block_until_ready((state.params, state.opt_state))
        h.counters.host_syncs += 1
        t1 = time.perf_counter()
        losses, ok = block.resolve(h)
        t2 = time.perf_counter()
        size.start(t1 - t0, t2 - t1)
        yield from self._verdict(block, losses, ok, t2, sized=False)
        self.last_resolved = time.perf_counter()

    def _resolve(self, block: PendingBlock):
        losses, ok = block.resolve(self.h)
        return (yield from self._verdict(block, losses, ok, time.perf_counter()))

    def _verdict(self, block: PendingBlock, losses: list[float], ok: bool, fetched: float, sized: bool = True):
        """Record a clean block, or recover and replay a failed one; True when it was clean. The block's
        host costs (this, the records' consumers) and the time since the last verdict size the next."""
        h, state, size = self.h, self.state, self.size
        cycle, self.last_resolved = fetched - self.last_resolved, fetched
        ran = block.end - block.start
        if ok and all(math.isfinite(x) for x in losses):
            result = BlockResult(h.label, self.seed, block.start, block.end,
                                 [_loss_record(block.start + i, x, self.planned, h) for i, x in enumerate(losses)])
            self._remember(result)
            self.policy.observe(ran, 0)
            yield result
            if sized:  # the records and their consumers (progress, the results line queued) and writing it
                host = time.perf_counter() - fetched + h.counters.line_cpu_s
                size.observe(ran, 0, cycle, host)
            return True
        # Failed (whatever was dispatched after it ran on a non-finite state and is dropped): the state
        # at its start from the restore point, then the block step by step.
        rec = recompute(h, self.seed, self.point, block.start, self.history, self.planned, self.fed)
        state.params, state.opt_state, state.next_step = rec.params, rec.opt_state, block.start
        state.backup = _copy((state.params, state.opt_state))
        h.counters.dispatches += 1
        replay = next(run_steps(h, self.seed, state, block.end, self.planned, lambda: False, ran))
        state.backup = None
        mark_nondeterminism(replay.records, losses)
        replay.recompute = rec.summary()
        self._remember(replay)
        self.policy.observe(ran + rec.steps, replay.nonfinite or 1)
        size.observe(ran, replay.nonfinite or 1, 0.0, 0.0)
        yield replay
        self._at_drain(state.next_step)
        self.last_resolved = time.perf_counter()  # the recovery's time is not the steps'
        return False


def run_blocks(h: Harnessed, seed: int, state: RunState, steps: int, planned: set[int],
               should_stop: Callable[[], bool], checkpointer: Checkpointer | None = None) -> Iterator[BlockResult]:
    """Steps [state.next_step, steps) of one (configuration, seed) under the block protocol (see the
    module docstring), one BlockResult per block, in order."""
    yield from _Blocks(h, seed, state, steps, planned, should_stop, checkpointer).run()
