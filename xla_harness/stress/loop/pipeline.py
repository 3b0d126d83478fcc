"""The one dispatch/resolve pipeline of the stress loop, for every protocol: a block of steps is
dispatched (everything on the device, nothing waited for), then the block before it is resolved
(its one array of rows or flags fetched, its records made) while the device runs the new one. At
most one block is in flight.

Resolving a block gives a :class:`Verdict`: its :class:`~xla_harness.stress.proof.harness.BlockResult`
and whether the state it left is the one the next block ran from. When it is not (the block
protocol rolled a step of it back: the state was rebuilt from before that step), the block in
flight ran from a state that no longer exists and is dropped: its steps run again from the
rebuilt state.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

from xla_harness.stress.proof.harness import BlockResult

P = TypeVar("P")


@dataclass
class Verdict:
    """A resolved block: its result, whether the block in flight after it is still valid (``kept``),
    and what to do once the result's consumer has taken it (``after``: timing the consumer's work,
    say)."""

    result: BlockResult
    kept: bool = True
    after: Callable[[], None] | None = None

    def deliver(self) -> Iterator[BlockResult]:
        """Hand the result to the consumer, then run ``after``."""
        yield self.result
        if self.after is not None:
            self.after()


class Pipeline(Generic[P]):
    """Blocks dispatched one ahead of their resolution: :meth:`push` a block just dispatched (the one
    before it is resolved, and the new one dropped when that one was not kept), :meth:`flush` to
    resolve the block in flight before the loop needs the state verified (a checkpoint, a block run
    step by step, the end)."""

    def __init__(self, resolve: Callable[[P], Verdict]) -> None:
        self._resolve = resolve
        self.pending: P | None = None

    def push(self, block: P) -> Iterator[BlockResult]:
        before, self.pending = self.pending, block
        if before is not None:
            yield from self._settle(before)

    def flush(self) -> Iterator[BlockResult]:
        before, self.pending = self.pending, None
        if before is not None:
            yield from self._settle(before)

    def _settle(self, block: P) -> Iterator[BlockResult]:
        verdict = self._resolve(block)
        if not verdict.kept:
            self.pending = None  # dispatched from a state the verdict replaced
        yield from verdict.deliver()
