"""The block protocol's rollback (:class:`~xla_harness.stress.loop.rollback.Rollback`), apart from its loop:
the state before a failed step rebuilt from the older restore point equals a plain loop's state there,
bit for bit (the oracle: the user's step jitted and run in a plain loop); a recorded loss the recompute
does not give again is reported; the records before a newer restore point are dropped; a rebuild with
no usable restore point is refused; host copies start only once failures make them pay. And the
seed's :class:`~xla_harness.stress.proof.harness.RunState` is written by its own ``move`` alone."""

from __future__ import annotations

from dataclasses import FrozenInstanceError, replace

import jax
import numpy as np
import pytest

from xla_harness.errors import HarnessError
from xla_harness.stress.loop import rollback as rollback_module
from xla_harness.stress.loop.restore import DevicePoint, HostPoint, InitPoint
from xla_harness.stress.loop.rollback import Rollback
from xla_harness.stress.proof.harness import BlockResult, abstract
from xla_harness.stress.runner import initial_state, prepare, run_config
from xla_harness.stress.spec import StressSpec

from .test_block_commit import poisoned

STEPS = 8


def _prepared(program=None):
    spec = StressSpec(program="poisoned", seeds=(1,), steps=STEPS, block=4)
    return prepare(spec, {}, program or poisoned())


def _recorded(h) -> list[BlockResult]:
    return list(run_config(h, 1, initial_state(h, 1)))


def _plain_loop(h, steps: int):
    """The oracle: the user's step, jitted, run ``steps`` times from init."""
    state = initial_state(h, 1)
    params, opt_state = state.params, state.opt_state
    step = jax.jit(h.program.step)
    for t in range(steps):
        params, opt_state, _ = step(params, opt_state, h.batch(1, t))
    return params, opt_state


def _same(a, b) -> bool:
    return all(np.array_equal(np.asarray(x), np.asarray(y), equal_nan=True)
               for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b), strict=True))


def test_a_rebuild_from_init_gives_the_plain_loops_state():
    h = _prepared()
    rollback = Rollback(h, 1, set(), initial_state(h, 1))
    assert rollback.copies and isinstance(rollback.point, InitPoint)
    for block in _recorded(h):
        rollback.remember(block)
    fed = abstract(_plain_loop(h, 1))
    rebuilt = rollback.rebuild(None, 5, fed)
    assert rebuilt.ok and rebuilt.summary() == {"from": 0, "steps": 5, "nondet": []}
    last = rebuilt.tries[-1]
    assert _same((last.params, last.opt_state), _plain_loop(h, 5))
    assert not _same((last.params, last.opt_state), _plain_loop(h, 4))  # the oracle tells states apart


def test_a_recorded_loss_the_recompute_does_not_give_again_is_reported():
    h = _prepared()
    rollback = Rollback(h, 1, set(), initial_state(h, 1))
    for block in _recorded(h):
        planted = [replace(r, loss=r.loss + 1.0) if r.step == 2 else r for r in block.records]  # planted
        rollback.remember(replace(block, records=planted))
    assert rollback.rebuild(None, 5, abstract(_plain_loop(h, 1))).summary()["nondet"] == [2]


def test_a_newer_restore_point_drops_the_records_before_it():
    h = _prepared()
    rollback = Rollback(h, 1, set(), initial_state(h, 1))
    for block in _recorded(h):
        rollback.remember(replace(block, rolled_back={block.start}))
    assert sorted(rollback.history) == list(range(STEPS)) and rollback.rolled_back == {0, 4}
    rollback.move_to(DevicePoint(h.copy(_plain_loop(h, 3)), 3))
    assert sorted(rollback.history) == list(range(3, STEPS)) and rollback.rolled_back == {4}
    rebuilt = rollback.rebuild(None, 6, abstract(_plain_loop(h, 1)))
    assert rebuilt.ok and rebuilt.tries[-1].start == 3


def test_a_rebuild_without_a_usable_restore_point_is_refused():
    h = _prepared()
    rollback = Rollback(h, 1, set(), initial_state(h, 1))
    blocks = _recorded(h)
    rollback.remember(blocks[1])  # steps 4..7 only: from init, steps 0..3 are not at hand
    with pytest.raises(HarnessError, match="no restore point"):
        rollback.rebuild(None, 6, None)
    resumed = replace(initial_state(h, 1), next_step=4)  # resumed with device copies: no older point
    assert Rollback(h, 1, set(), resumed).point is None


def test_host_copies_start_only_once_failures_make_them_pay(monkeypatch):
    monkeypatch.setattr(rollback_module, "device_copies_fit", lambda tree: False)
    h = _prepared(poisoned(bad_steps=(1, 2, 5)))
    state = initial_state(h, 1)
    rollback = Rollback(h, 1, set(), state)
    assert not rollback.copies and not rollback.host_copy_due(STEPS)  # no failure seen: never due
    for block in _recorded(h):
        rollback.remember(block)
    due = [s for s in range(1, STEPS + 1) if rollback.host_copy_due(s)]
    assert due and due[0] > 1  # sqrt(2 C steps / failures) steps after the point
    state.move(*_plain_loop(h, 6), 6)
    rollback.take_host_copy(state, 0.01)
    assert isinstance(rollback.point, HostPoint) and rollback.point.step == 6
    assert sorted(rollback.history) == [6, 7] and not rollback.host_copy_due(6)
    assert _same(rollback.point.restore(), _plain_loop(h, 6))


def test_the_seeds_state_is_written_by_move_alone():
    h = _prepared()
    state = initial_state(h, 1)
    with pytest.raises(FrozenInstanceError):
        state.next_step = 3  # planted: a loop writing the seed's state from outside
    params, opt_state = _plain_loop(h, 2)
    state.move(params, opt_state, 2)
    assert state.next_step == 2 and state.params is params and state.opt_state is opt_state
