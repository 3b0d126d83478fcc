"""Where the block protocol gets a state back from when a step's new state was not finite: a restore
point (a step and a way to rebuild the state there) and the recorded steps since it, recomputed.

* :class:`DevicePoint`: a copy of the state on the device, taken at each block's start while two
  copies fit in device memory (the default: a rollback recomputes at most one block);
* :class:`InitPoint`: step 0, ``init(seed)`` again (nothing kept anywhere);
* :class:`~xla_harness.stress.loop.checkpoint.CheckpointPoint`: the ``--resume`` checkpoint last written
  (read back from disk);
* :class:`HostPoint`: a copy of the state in host memory (:class:`~xla_harness.stress.loop.snapshot.HostSnapshot`),
  taken, where device copies do not fit, only once failures are seen, at the interval that
  minimises the expected cost (:class:`SnapshotPolicy`).

:func:`recompute` rebuilds the restore point's state and runs the recorded steps in between again
(a step that was rolled back is skipped; a finite fault planted there is planted again). Those
executions rebuild a state and are never measurements: each is checked (a non-finite new state
makes the result unusable, and the caller tries again), and a loss that differs in any bit from its
record is reported as nondeterminism found by a recompute.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Protocol

import jax
import numpy as np

from xla_harness.errors import HarnessError
from xla_harness.names import BLOCK_ROWS as ROWS
from xla_harness.stress.device.copies import copy_tree
from xla_harness.stress.device.inject import step_keys
from xla_harness.stress.device.step_rows import last_rows, new_rows
from xla_harness.stress.loop.snapshot import HostSnapshot
from xla_harness.stress.proof.harness import Harnessed, call_user, check_fed_back, follow_signature
from xla_harness.stress.results.records import Step


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
class DevicePoint:
    """A copy of the state in device memory, taken at a block's start (the block protocol's restore
    point while copies fit)."""

    copy: tuple
    step: int

    def restore(self) -> tuple:
        return tuple(copy_tree(self.copy))


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
    enabled: bool = True  # False: never due (the block's device copies bound the recompute)

    def observe(self, ran: int, failed: int) -> None:
        self.steps += ran
        self.failures += failed

    def due(self, since_point: int) -> bool:
        if not self.enabled or not self.failures or since_point <= 0:
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
    nondet: list[int] = field(default_factory=list)  # steps whose loss differs in any bit from the recorded one
    nonfinite: list[int] = field(default_factory=list)  # steps whose new state came out non-finite this time
    restored_ok: bool = True  # the restore point's state was finite (checked, not assumed)
    seconds: float = 0.0

    checked: bool = False  # :func:`recompute_checked`: a step that came out non-finite was run again
    gave_up: bool = False  # checked: a step came out non-finite ``tries`` times in a row

    @property
    def clean(self) -> bool:
        """The state it rebuilt is one every recomputed step left finite."""
        if self.checked:
            return self.restored_ok and not self.gave_up
        return self.restored_ok and not self.nonfinite


def recompute(h: Harnessed, seed: int, point: RestorePoint, target: int, history: dict[int, Step],
              rolled_back: set[int], planned: set[int], fed_signature) -> Recomputed:
    """The state before step ``target``: ``point``'s (checked finite), then every recorded step in
    between run again as the run ran it (``history``: step -> its record; the steps in
    ``rolled_back`` were rolled back and are skipped; finite faults planted again), each followed by
    its row (:mod:`~xla_harness.stress.device.step_rows`), fetched once: a step whose new state comes out
    non-finite is in ``nonfinite`` (the result is not :attr:`~Recomputed.clean`), a loss that differs
    in any bit from its record in ``nondet``. These executions rebuild a state: none is a
    measurement. ``fed_signature``: the state's signature as the step returned it (the restored state
    is held to it)."""
    t0 = time.perf_counter()
    params, opt_state = _restored(h, point, fed_signature)
    finite_fault = h.spec.inject in ("lost-row", "doubled-row")
    ran: list[int] = []
    chunks: list[tuple[list[int], jax.Array]] = []
    rows = new_rows()
    for t in _kept_steps(history, rolled_back, point.step, target):
        batch = h.batch(seed, t)
        if len(ran) < 2:
            follow_signature(h, (params, opt_state, batch))
        new_p, new_o, aux = _run_again(h, seed, t, params, opt_state, batch, finite_fault and t in planned)
        rows = h.write_row(rows, new_p, new_o, aux)
        params, opt_state = new_p, new_o
        ran.append(t)
        if len(ran) % ROWS == 0:
            chunks.append((ran[-ROWS:], rows))
            rows = new_rows()
    if len(ran) % ROWS:
        chunks.append((ran[-(len(ran) % ROWS):], rows))
    out = Recomputed(params, opt_state, point.step, len(ran))
    if not ran:
        out.restored_ok = bool(h.counters.fetch(h.state_check(params, opt_state)))
    for steps, chunk in chunks:
        _read_rows(last_rows(h.counters.fetch(chunk), len(steps)), steps, history, out)
    out.seconds = time.perf_counter() - t0
    return out


def _kept_steps(history: dict[int, Step], rolled_back: set[int], start: int, target: int):
    """The recorded steps in [start, target) whose new state was kept (not rolled back), in order."""
    for t in range(start, target):
        if t not in history:
            raise HarnessError(f"internal: step {t} has no record to recompute from (restore point {start})")
        if t not in rolled_back:
            yield t


def _run_again(h: Harnessed, seed: int, t: int, params, opt_state, batch, finite_fault: bool) -> tuple:
    """Step ``t`` run again as the run ran it: a finite fault planted at it is planted again."""
    old = h.copy(params) if finite_fault else None
    new_p, new_o, aux = h.call_step(params, opt_state, batch)
    if old is not None:
        new_p, new_o = h.inject(old, new_p, new_o, step_keys(seed, t)[1])
    return new_p, new_o, aux


def _restored(h: Harnessed, point: RestorePoint, fed_signature) -> tuple:
    """The restore point's state in buffers of its own, held to the signature the step returned."""
    params, opt_state = h.counters.dispatch(point.restore)
    if fed_signature is not None and point.step > 0:
        check_fed_back(h, (params, opt_state), fed_signature)
    return params, opt_state


def _read_rows(host: np.ndarray, steps: list[int], history: dict[int, Step], out: Recomputed) -> None:
    for t, row in zip(steps, host, strict=False):
        if row[2] == 0:
            out.nonfinite.append(t)
        if not same_loss(history[t].loss, float(row[0])):
            out.nondet.append(t)


def recompute_checked(h: Harnessed, seed: int, point: RestorePoint, target: int, history: dict[int, Step],
                      rolled_back: set[int], planned: set[int], fed_signature, tries: int) -> Recomputed:
    """:func:`recompute`, each step committed as ``--commit step`` commits it (a backup copy of the
    state before it on the device; a new state that is not finite rolled back) and its flags fetched
    before the next: a step whose new state comes out non-finite is run again from the state before
    it, up to ``tries`` times (then the result is not clean). One host sync per step: for when the
    one-fetch recompute met a non-finite state, so that a high failure rate still rebuilds."""
    t0 = time.perf_counter()
    params, opt_state = _restored(h, point, fed_signature)
    out = Recomputed(params, opt_state, point.step, 0, checked=True)
    out.restored_ok = bool(h.counters.fetch(h.state_check(params, opt_state)))
    if not out.restored_ok:
        return out
    finite_fault = h.spec.inject in ("lost-row", "doubled-row")
    backup = h.copy((params, opt_state))
    for t in _kept_steps(history, rolled_back, point.step, target):
        rec = history[t]
        batch = h.batch(seed, t)
        for attempt in range(tries):
            if out.steps < 2:
                follow_signature(h, (params, opt_state, batch))
            new_p, new_o, aux = _run_again(h, seed, t, params, opt_state, batch, finite_fault and t in planned)
            flags, params, opt_state, bp, bo = h.commit(backup[0], backup[1], new_p, new_o, aux)
            backup = (bp, bo)
            out.steps += 1
            state_ok, loss = (float(x) for x in h.counters.fetch(
                jax.numpy.stack([flags["state_ok"].astype(jax.numpy.float32), flags["loss"]])))
            if attempt == 0 and not same_loss(rec.loss, loss):
                out.nondet.append(t)
            if state_ok:
                break
            out.nonfinite.append(t)  # rolled back on the device: the state before t, run again
        else:
            out.gave_up = True
            break
    out.params, out.opt_state = params, opt_state
    out.seconds = time.perf_counter() - t0
    return out


def same_loss(recorded: float | None, value: float) -> bool:
    """A loss recorded as ``recorded`` (None: non-finite) and computed again as ``value`` (float32)
    are the same float32, bit for bit (0.0 and -0.0 differ)."""
    if recorded is None:
        return not math.isfinite(value)
    return math.isfinite(value) and np.float32(value).tobytes() == np.float32(recorded).tobytes()
