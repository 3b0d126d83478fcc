"""The block protocol's rollback, apart from its loop: the restore points a rolled-back step's state
is rebuilt from, the records since the older one, and the rebuild itself.

Two restore points are held. The block's own, a copy of the state on the device at its start
(:class:`~xla_harness.stress.loop.restore.DevicePoint`, carried by the block), while two copies fit in
device memory (:func:`device_copies_fit`); and the older one kept here (:attr:`Rollback.point`):
``init``, the last ``--resume`` checkpoint, or, where device copies do not fit, a host copy taken once
failures make one pay (:class:`~xla_harness.stress.loop.restore.SnapshotPolicy`). The loop tells a
:class:`Rollback` what each block recorded (:meth:`Rollback.remember`) and where it wrote a
checkpoint (:meth:`Rollback.move_to`); it asks it for the state before a failed step
(:meth:`Rollback.rebuild`). Nothing else writes its fields.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import jax
import numpy as np

from xla_harness.errors import HarnessError
from xla_harness.stress.loop.restore import (
    DevicePoint,
    InitPoint,
    Recomputed,
    RestorePoint,
    SnapshotPolicy,
    recompute,
    recompute_checked,
    take_host_point,
)
from xla_harness.stress.proof.harness import BlockResult, Harnessed, RunState
from xla_harness.stress.results.records import Step

TRIES = 3  # recomputes from the block's restore point before the older one is tried


def device_copies_fit(tree) -> bool:
    """Whether two more copies of ``tree`` fit in half of what its devices have free (a device that
    reports no memory statistics, the CPU, is taken to have room)."""
    leaves = jax.tree_util.tree_leaves(tree)
    per_device: dict = {}
    for x in leaves:
        for sh in getattr(x, "addressable_shards", ()):
            d = sh.device
            per_device[d] = per_device.get(d, 0) + sh.data.size * sh.data.dtype.itemsize
    for d, need in per_device.items():
        stats = d.memory_stats() if hasattr(d, "memory_stats") else None
        if not stats or "bytes_limit" not in stats:
            continue
        free = stats["bytes_limit"] - stats.get("bytes_in_use", 0)
        if 2 * need > free / 2:
            return False
    return True


@dataclass
class Rebuilt:
    """How the state before a failed step was rebuilt: the recomputes tried, in order."""

    tries: list[Recomputed] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return bool(self.tries) and self.tries[-1].clean

    def summary(self) -> dict:
        """The block's ``recompute`` record: the last try's origin, the steps run again in all tries,
        the steps whose loss differed from their record in any try, those that came out non-finite,
        the tries, and whether the state could be rebuilt at all."""
        last = self.tries[-1]
        out: dict[str, object] = {"from": last.start, "steps": sum(r.steps for r in self.tries),
                                  "nondet": sorted({t for r in self.tries for t in r.nondet})}
        nonfinite = sorted({t for r in self.tries for t in r.nonfinite})
        if nonfinite:
            out["nonfinite"] = nonfinite
        if len(self.tries) > 1:
            out["tries"] = len(self.tries)
        if not self.ok:
            out["unrecoverable"] = True
        return out


def _copies_everywhere(state: RunState) -> bool:
    """Device copies of the state fit, on every process (a copy is a computation every process must
    run: all take them, or none does)."""
    fits = device_copies_fit((state.params, state.opt_state))
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        fits = bool(np.all(multihost_utils.process_allgather(np.asarray(fits))))
    return fits


class Rollback:
    """One (configuration, seed)'s rollback under the block protocol, from ``state`` on: whether
    blocks carry device copies (:attr:`copies`), the older restore point, the records since it (the
    steps a rebuild runs again) and the steps rolled back among them (skipped)."""

    def __init__(self, h: Harnessed, seed: int, planned: set[int], state: RunState) -> None:
        self.h, self.seed, self.planned = h, seed, planned
        self.copies = _copies_everywhere(state)
        # Host copies of the state only where device copies do not fit (then they bound the recompute);
        # several processes must decide alike, so nothing measured enters their cost.
        self.policy = SnapshotPolicy(fixed_cost=1.0 if jax.process_count() > 1 else None, enabled=not self.copies)
        self.point: RestorePoint | None = InitPoint(h, seed)
        if state.next_step:  # resumed: the records before it are not at hand
            self.point = None if self.copies else self._host_point(state)
        self.history: dict[int, Step] = {}
        self.rolled_back: set[int] = set()  # recorded steps whose new state was not finite

    def remember(self, block: BlockResult) -> None:
        """What ``block`` recorded (its steps and failures count towards the host copies' interval)."""
        for r in block.records:
            self.history[r.step] = r
        self.rolled_back |= block.rolled_back
        self.policy.observe(len(block.records), block.nonfinite)

    def move_to(self, point: RestorePoint) -> None:
        """``point`` is the older restore point now (a checkpoint written, a host copy taken): the
        records before it are not needed again."""
        self.point = point
        self.history = {t: r for t, r in self.history.items() if t >= point.step}
        self.rolled_back = {t for t in self.rolled_back if t >= point.step}

    def host_copy_due(self, s: int) -> bool:
        """Whether a host copy of the state at ``s`` pays now (no device copies, failures seen)."""
        return self.point is not None and self.policy.due(s - self.point.step)

    def take_host_copy(self, state: RunState, step_seconds: float) -> None:
        """A host copy of ``state`` becomes the older restore point (its cost measured, in steps)."""
        t0 = time.perf_counter()
        point = self._host_point(state)
        self.policy.measured(time.perf_counter() - t0, step_seconds)
        self.move_to(point)

    def _host_point(self, state: RunState) -> RestorePoint:
        s = state.next_step
        return self.h.counters.to_host(lambda tree: take_host_point(tree, s), (state.params, state.opt_state))

    def roll_back(self, point: DevicePoint | None, target: int, fed: object) -> Rebuilt:
        """:meth:`rebuild` for a step rolled back (the steps run again count towards the host copies'
        interval)."""
        out = self.rebuild(point, target, fed)
        self.policy.observe(out.tries[-1].steps, 0)
        return out

    def rebuild(self, point: DevicePoint | None, target: int, fed: object) -> Rebuilt:
        """The state before step ``target`` (rolled back), by recompute from the block's device copy
        ``point`` (else the older restore point): once with one fetch, and where a recomputed state
        came out non-finite, again step by step, each step run again from the state before it up to
        :data:`TRIES` times; then from the older point step by step. Stops at the first clean one.
        ``fed``: the state's signature as the step returns it."""
        older = self.point
        usable_older = older is not None and (point is None or older.step < point.step) and \
            all(t in self.history for t in range(older.step, target))
        first = point if point is not None else (older if usable_older else None)
        if first is None:
            raise HarnessError(f"internal: step {target}: no restore point to rebuild the state from")
        h, seed, history, rolled, planned = self.h, self.seed, self.history, self.rolled_back, self.planned
        out = Rebuilt([recompute(h, seed, first, target, history, rolled, planned, fed)])
        if not out.ok:
            out.tries.append(recompute_checked(h, seed, first, target, history, rolled, planned, fed, TRIES))
        if not out.ok and point is not None and usable_older and older is not None:
            out.tries.append(recompute_checked(h, seed, older, target, history, rolled, planned, fed, TRIES))
        return out
