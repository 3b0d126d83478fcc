"""Where the block protocol gets a state back from when a block failed: a restore point (a step and
a way to rebuild the state there) and the recorded steps since it, recomputed.

* :class:`InitPoint`: step 0, ``init(seed)`` again (nothing kept anywhere);
* :class:`CheckpointPoint`: the ``--resume`` checkpoint last written (read back from disk);
* :class:`HostPoint`: a copy of the state in host memory (:class:`~xla_harness.stress.snapshot.HostSnapshot`),
  taken only once failures are seen, at the interval that minimises the expected cost
  (:class:`SnapshotPolicy`).

A clean block costs the device nothing: no copy of the state is made while nothing fails. To get
back to a failed block's start, :func:`recompute` rebuilds the restore point's state and replays
the recorded steps in between (a step recorded non-finite was rolled back: skipped; a finite fault
planted there is planted again), comparing each recomputed loss bit for bit with the recorded one:
a difference is nondeterminism and is reported as such (the state then carries on from what the
step computed this time).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import jax
import numpy as np

from xla_harness.errors import HarnessError
from xla_harness.stress.checker import _copy, pad
from xla_harness.stress.checkpoint import load_checkpoint, save_checkpoint
from xla_harness.stress.harness import Harnessed, call_user, check_fed_back, follow_signature
from xla_harness.stress.inject import step_keys
from xla_harness.stress.proof import abstract_like
from xla_harness.stress.snapshot import HostSnapshot


class RestorePoint(Protocol):
    step: int

    def restore(self) -> tuple:
        """(params, opt_state) at ``step``, in buffers of their own."""
        ...


@dataclass
class InitPoint:
    h: Harnessed
    seed: int
    step: int = 0

    def restore(self) -> tuple:
        params, opt_state = call_user(self.h.spec, "init", self.h.program.init, jax.random.key(self.seed))
        return params, opt_state


@dataclass
class CheckpointPoint:
    path: Path
    step: int
    like: tuple  # the state's leaves as the step returns them (ShapeDtypeStructs)

    def restore(self) -> tuple:
        got = load_checkpoint(self.path, self.like)
        if got is None or got[0] != self.step:
            raise HarnessError(f"the checkpoint {self.path} written at step {self.step} could not be read back")
        return tuple(got[1])


@dataclass
class HostPoint:
    snapshot: HostSnapshot
    step: int

    def restore(self) -> tuple:
        return tuple(self.snapshot.restore())


@dataclass
class SnapshotPolicy:
    """When to copy the state to the host: never while no step has failed; once failures are seen, at
    the interval T = sqrt(2 C / r) steps (Young's), C the cost of a copy in steps, r the failure rate
    per step, which minimises C / T (copies) + r T / 2 (recompute). ``fixed_cost``: C in steps taken
    as given (several processes must decide alike, so nothing measured enters), else measured."""

    fixed_cost: float | None = None
    cost_steps: float | None = None
    steps: int = 0
    failures: int = 0

    def observe(self, ran: int, failed: int) -> None:
        self.steps += ran
        self.failures += failed

    def due(self, since_point: int) -> bool:
        if not self.failures or since_point <= 0:
            return False
        cost = self.fixed_cost if self.fixed_cost is not None else (self.cost_steps or 1.0)
        return since_point >= math.sqrt(2 * cost * max(self.steps, 1) / self.failures)

    def measured(self, seconds: float, step_seconds: float) -> None:
        if self.fixed_cost is None and step_seconds > 0:
            self.cost_steps = seconds / step_seconds


def take_host_point(tree, step: int, snapshot: HostSnapshot | None = None) -> HostPoint:
    snap = snapshot or HostSnapshot()
    snap.take(tree)
    return HostPoint(snap, step)


@dataclass
class Recomputed:
    params: object
    opt_state: object
    start: int
    steps: int  # steps run again
    nondet: list[int] = field(default_factory=list)  # steps whose loss differs from the recorded one
    seconds: float = 0.0

    def summary(self) -> dict:
        return {"from": self.start, "steps": self.steps, "nondet": list(self.nondet)}


def recompute(h: Harnessed, seed: int, point: RestorePoint, target: int, history: dict[int, dict],
              planned: set[int], fed_signature) -> Recomputed:
    """The state at ``target``: ``point``'s, then every recorded step in between run again as the run
    ran it (``history``: step -> its record; non-finite steps were rolled back and are skipped;
    finite faults planted again). The recomputed losses are fetched once and compared bit for bit
    with the records. ``fed_signature``: the state's signature as the step returned it (the
    restored state is held to it)."""
    t0 = time.perf_counter()
    params, opt_state = point.restore()
    h.counters.dispatches += 1
    if fed_signature is not None and point.step > 0:
        check_fed_back(h, (params, opt_state), fed_signature)
    losses: list = []
    ran: list[int] = []
    finite_fault = h.spec.inject in ("lost-row", "doubled-row")
    for t in range(point.step, target):
        rec = history.get(t)
        if rec is None:
            raise HarnessError(f"internal: step {t} has no record to recompute from (restore point {point.step})")
        if not rec["finite"]:
            continue
        batch = h.batch(seed, t)
        if len(ran) < 2:
            follow_signature(h, (params, opt_state, batch))
        old = _copy(params) if finite_fault and t in planned else None
        new_p, new_o, aux = h.call_step(params, opt_state, batch)
        if old is not None:
            new_p, new_o = h.injector()(old, new_p, new_o, step_keys(seed, t)[1])
            h.counters.dispatches += 2
        params, opt_state = new_p, new_o
        losses.append(aux["loss"])
        ran.append(t)
    out = Recomputed(params, opt_state, point.step, len(ran))
    if losses:
        host = h.counters.fetch(_stack(losses))[:len(losses)]
        out.nondet = [t for t, x in zip(ran, host, strict=True) if not same_loss(history[t]["loss"], float(x))]
    out.seconds = time.perf_counter() - t0
    return out


def same_loss(recorded: float | None, value: float) -> bool:
    """A loss recorded as ``recorded`` (None: non-finite) and computed again as ``value`` (float32)
    are the same float32."""
    if recorded is None:
        return not math.isfinite(value)
    return math.isfinite(value) and np.float32(value) == np.float32(recorded)


_STACK = jax.jit(lambda xs: jax.numpy.stack([jax.numpy.asarray(x).astype(jax.numpy.float32) for x in xs]))


def _stack(losses: list) -> jax.Array:
    return _STACK(pad(losses))


@dataclass
class Checkpointer:
    """The train protocol's ``--resume`` checkpoints of one (configuration, seed): due every
    ``every_seconds`` and when a stop is requested; written only after the results sink has put every
    line before it on disk (``before_save``), so a checkpoint is never ahead of the records. What it
    writes is also the block protocol's newest restore point."""

    h: Harnessed
    path: Path
    every_seconds: float
    should_stop: Callable[[], bool]
    before_save: Callable[[], None] = lambda: None
    last: float = field(default_factory=time.monotonic)

    def due(self) -> bool:
        return self.should_stop() or time.monotonic() - self.last >= self.every_seconds

    def save(self, step: int, params, opt_state) -> CheckpointPoint:
        self.before_save()
        save_checkpoint(self.path, step, params, opt_state)
        self.h.counters.host_syncs += 1
        self.h.counters.d2h_bytes += sum(x.nbytes for x in jax.tree_util.tree_leaves((params, opt_state)))
        self.last = time.monotonic()
        return CheckpointPoint(self.path, step, abstract_like((params, opt_state)))
