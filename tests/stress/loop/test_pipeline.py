"""The stress loop's one dispatch/resolve pipeline (:mod:`xla_harness.stress.loop.pipeline`): a block is
resolved only after the next is dispatched, a resolved block that was rolled back drops the block
dispatched after it, ``after`` runs once the consumer has the result, and flush resolves what is
in flight."""

from __future__ import annotations

from xla_harness.stress.loop.pipeline import Pipeline, Verdict
from xla_harness.stress.proof.harness import BlockResult


def _pipe(rolled_back: set[int], log: list):
    def resolve(start: int) -> Verdict:
        log.append(("resolve", start))
        return Verdict(BlockResult("x", 1, start, start + 1), kept=start not in rolled_back,
                       after=lambda: log.append(("after", start)))
    return Pipeline(resolve)


def test_each_block_is_resolved_after_the_next_is_dispatched():
    log: list = []
    pipe = _pipe(set(), log)
    got = []
    for start in range(3):
        log.append(("dispatch", start))
        for r in pipe.push(start):
            log.append(("consumed", r.start))
            got.append(r.start)
    got += [r.start for r in pipe.flush()]
    assert got == [0, 1, 2]
    assert log[:6] == [("dispatch", 0), ("dispatch", 1), ("resolve", 0), ("consumed", 0), ("after", 0),
                       ("dispatch", 2)]
    assert pipe.pending is None and list(pipe.flush()) == []


def test_a_rolled_back_block_drops_the_one_in_flight_after_it():
    log: list = []
    pipe = _pipe({1}, log)
    got = [r.start for start in range(3) for r in pipe.push(start)]
    # 1 was rolled back when 2 was in flight: 2 ran from a replaced state and is never resolved
    assert got == [0, 1] and pipe.pending is None
    assert ("resolve", 2) not in log


def test_a_planted_pipeline_that_keeps_the_block_after_a_rollback_is_caught():
    class Keeps(Pipeline):
        def _settle(self, block):
            verdict = self._resolve(block)
            yield from verdict.deliver()  # planted: ``kept`` ignored

    log: list = []
    pipe = Keeps(_pipe({1}, log)._resolve)
    got = [r.start for start in range(3) for r in pipe.push(start)] + [r.start for r in pipe.flush()]
    assert got == [0, 1, 2]  # what the real pipeline refuses (the test above)
