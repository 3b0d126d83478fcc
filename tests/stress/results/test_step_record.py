"""The block loop's step record (:meth:`~xla_harness.stress.results.records.Step.of_row`, made once per step
without the frozen dataclass's checked assignments) is the record ``Step(...)`` makes: equal, hashed,
printed, written and read back alike, and still frozen; a record missing a field would not be."""

from __future__ import annotations

import copy
import dataclasses
import json
import pickle

import pytest

from xla_harness.stress.results import record_text, records
from xla_harness.stress.results.records import Step

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


def _block(steps: tuple[Step, ...], **more) -> records.Block:
    return records.Block(label="full remat", seed=1, start=steps[0].step, end=steps[-1].step + 1,
                         nonfinite=sum(not s.finite for s in steps), silent=0, steps=steps,
                         config={"mode": "full", "steps": []}, env={"jax": "0.12.0.1", "note": '"steps": []'},
                         time="2026-12-07T19:00:00", **more)


def _reference_text(block: records.Block) -> str:
    return json.dumps(block.to_json(), sort_keys=True, allow_nan=False)


ODD_NAMES = [None, "loss", "param:['w']", 'grad:["q\\"uote"]', "opt:[0]['µ']", "param:['\\u2028']", "\x00"]
ODD_NUMBERS = [None, 0.0, -0.0, 1.5, 1e-310, 1.7976931348623157e308, -2.5e-8, 3.0000000000000004]


def test_a_block_line_is_json_dumps_of_its_record_character_for_character():
    """The common steps' own writer against json.dumps itself: every odd name (quotes, non-ASCII, a
    NUL), every odd number (negative zero, subnormal, the largest float), mixed with records it does
    not take (injected, nondet, reference), and block keys that hold the text it writes around."""
    steps = []
    for i in range(len(ODD_NAMES) * len(ODD_NUMBERS)):
        bad = ODD_NAMES[i % len(ODD_NAMES)]
        steps.append(Step(100 + i, bad is None, bad, ODD_NUMBERS[(i + 3) % len(ODD_NUMBERS)],
                          ODD_NUMBERS[i % len(ODD_NUMBERS)]))
    steps += [Step(200, False, "loss", None, None, injected="nan-param"), Step(201, True, None, None, 1.0, nondet=True),
              Step(202, True, None, None, 2.0, reference={"ok": True, "max_rel": 0.5})]
    steps = [dataclasses.replace(s, step=100 + i) for i, s in enumerate(steps)]
    for block in (_block(tuple(steps)), _block(tuple(steps[:1]), recompute={"from": 3, "steps": 2, "nondet": []},
                                                built_with={"width": 8}, commit="block")):
        text = record_text.dumps(block)
        assert text == _reference_text(block)
        assert records.parse_line(text.encode()) == block


def test_a_number_the_writer_would_get_wrong_goes_to_json_dumps():
    """Values of another type (an int loss, a float subclass) or not finite are left to json.dumps, which
    writes them as it always did (or refuses NaN); a writer that took them would not match."""

    class Loss(float):
        def __repr__(self) -> str:
            return "Loss(1.0)"

    for loss in (1, Loss(1.0)):
        block = _block((Step(0, True, None, None, loss),))
        assert record_text.dumps(block) == _reference_text(block)
    with pytest.raises(ValueError):
        record_text.dumps(_block((Step(0, True, None, None, float("nan")),)))
