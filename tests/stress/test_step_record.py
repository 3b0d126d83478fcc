"""The block loop's step record (:meth:`~xla_harness.stress.records.Step.of_row`, made once per step
without the frozen dataclass's checked assignments) is the record ``Step(...)`` makes: equal, hashed,
printed, written and read back alike, and still frozen; a record missing a field would not be."""

from __future__ import annotations

import copy
import dataclasses
import json
import pickle

import pytest

from xla_harness.stress import records
from xla_harness.stress.records import Step

CASES = [(0, 1.5, None, None), (7, None, "param:['w']", None), (3, 2.0, None, "nan-param"),
         (9, None, "loss", "nan-opt")]


@pytest.mark.parametrize("step,loss,bad,injected", CASES)
def test_of_row_is_the_record_the_constructor_makes(step, loss, bad, injected):
    fast = Step.of_row(step, loss, bad, injected)
    slow = Step(step, bad is None, bad, None, loss, injected=injected)
    assert fast == slow and hash(fast) == hash(slow) and repr(fast) == repr(slow)
    assert fast.to_json() == slow.to_json()
    assert records.parse_step(json.loads(json.dumps(fast.to_json())), "step") == slow
    assert pickle.loads(pickle.dumps(fast)) == slow and copy.deepcopy(fast) == slow
    assert dataclasses.replace(fast, finite=not fast.finite) != slow
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.loss = 3.0  # type: ignore[misc]


def test_a_field_left_unset_would_be_seen(monkeypatch):
    """The comparison can fail: a constructor that forgot ``first_bad`` makes a different record."""

    def forgetful(cls, step, loss, first_bad, injected):
        record = object.__new__(cls)
        vars(record).update(step=step, finite=first_bad is None, max_abs_update=None, loss=loss, injected=injected)
        return record

    monkeypatch.setattr(Step, "of_row", classmethod(forgetful))
    with pytest.raises(AttributeError):
        assert Step.of_row(7, None, "loss", None) == Step(7, False, "loss", None, None)
