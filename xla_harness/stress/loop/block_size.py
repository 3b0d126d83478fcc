"""How many steps the block protocol runs between two checks (:class:`BlockSize`): fixed by
``--block`` or chosen from what the run measures, carried from seed to seed of a configuration
(:func:`new_block_size`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import jax

from xla_harness.names import BLOCK_ROWS as ROWS
from xla_harness.stress.device.step_rows import bucket
from xla_harness.stress.loop.steps import DEFAULT_SYNC


@dataclass
class BlockSize:
    """How many steps the block protocol runs between two checks: ``fixed`` (``--block K``) or chosen
    from what the run measures. A block's fixed cost is ``c`` steps' worth of time: its check on the
    device and its fetch (measured once, on an idle device: :meth:`start`) and the host's work for it
    (the records, the results line, progress: measured every block); a block holding a failure costs
    its rollback, up to K more steps. Per step that is c/K + r*K at failure rate r: K = c / TARGET
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
    LIMIT = ROWS  # a block's rows on the device
    GROWTH = 8

    def __post_init__(self) -> None:
        if self.fixed:
            self.fixed = self.size = min(self.fixed, self.LIMIT)

    @property
    def measured(self) -> bool:
        return self.fixed is not None or self.check_seconds is not None

    def start(self, step_seconds: float, check_seconds: float) -> None:
        """The first measurement: one step and one block's check, each timed alone."""
        self.step_seconds, self.check_seconds = step_seconds, check_seconds
        self.update(0, 0, step_seconds, check_seconds)

    def observe(self, ran: int, failed: int, wall_seconds: float, host_seconds: float) -> None:
        """A block of ``ran`` steps resolved ``wall_seconds`` after the one before it (0: a rollback, not
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


def new_block_size(spec) -> BlockSize:
    """The block sizer of a configuration (carried from seed to seed): ``--block`` fixed, else measured;
    with several processes, every process must check (a collective) after the same steps, so K is
    never measured there (``--block`` or :data:`~xla_harness.stress.loop.steps.DEFAULT_SYNC`)."""
    if jax.process_count() > 1:
        return BlockSize(spec.block or DEFAULT_SYNC)
    return BlockSize(spec.block)
