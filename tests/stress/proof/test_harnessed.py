"""A prepared configuration (:class:`~xla_harness.stress.proof.harness.Harnessed`) is frozen, and the proof
returns the proven one: running its seeds under every protocol changes none of its fields (the run's
state, the block sizer and the rows' layout are passed explicitly); only its counters accumulate. A
loop that writes a field of it is refused where it writes."""

from __future__ import annotations

from dataclasses import FrozenInstanceError, fields

import pytest

from xla_harness.stress.loop import blocks as blocks_module
from xla_harness.stress.loop.block_size import new_block_size
from xla_harness.stress.proof.harness import Harnessed
from xla_harness.stress.runner import check_same_program, first_batch, initial_state, prepare, run_config
from xla_harness.stress.spec import StressSpec

from ...helpers import TINY


def _prepared(**kw) -> Harnessed:
    spec = StressSpec(modes=("full",), remats=(True,), seeds=(1, 2), steps=12, inject="nan", inject_rate=0.2,
                      **TINY, **kw)
    h = prepare(spec, spec.configs()[0])
    state = initial_state(h, 1)
    h = check_same_program(h, state.params, state.opt_state, first_batch(h, 1))
    return h


def _fields(h: Harnessed) -> dict:
    return {f.name: getattr(h, f.name) for f in fields(h) if f.name != "counters"}


def _run_seeds(h: Harnessed) -> int:
    size = new_block_size(h.spec)
    return sum(b.nonfinite for seed in h.spec.seeds for b in run_config(h, seed, initial_state(h, seed),
                                                                         block_size=size))


@pytest.mark.parametrize("kw", [dict(), dict(commit="step"), dict(protocol="frozen")], ids=["block", "step", "frozen"])
def test_running_seeds_changes_no_field_of_the_prepared_configuration(kw):
    h = _prepared(**kw)
    before = _fields(h)
    dispatches = h.counters.dispatches
    failures = _run_seeds(h)
    after = _fields(h)
    assert failures > 0 and h.counters.dispatches > dispatches
    assert {k for k in before if after[k] is not before[k]} == set()


def test_a_loop_that_writes_a_field_is_caught(monkeypatch):
    h = _prepared()
    real = blocks_module.dispatch_block

    def writes(h, *args, **kwargs):  # planted: the loop keeps its state on the configuration
        h.label = h.label + "+"
        return real(h, *args, **kwargs)

    monkeypatch.setattr(blocks_module, "dispatch_block", writes)
    before = _fields(h)
    with pytest.raises(FrozenInstanceError, match="label"):  # refused where it is written
        _run_seeds(h)
    assert {k for k, v in _fields(h).items() if v is not before[k]} == set()
