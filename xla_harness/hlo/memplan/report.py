"""What memcheck says of one module: its conflicts, the comparison with the compiler's live range,
and what it covered."""

from __future__ import annotations

from dataclasses import dataclass, field

from xla_harness.hlo.memplan.liveness import Coverage


@dataclass(frozen=True)
class Finding:
    kind: str  # overlap, in-place, donation or async
    message: str
    data: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Report:
    module: str
    coverage: Coverage
    allocations: int
    async_windows: int
    pairs_checked: int  # byte-overlapping pairs of live values looked at
    conflicts: list[Finding]
    disagreements: list[str]
    live_range_compared: int  # -1: no live-range dump
    unprinted_ends: list[str]
    rules_used: dict[str, int]
    aliasing_not_taken: int  # libtpu's declared aliasing the buffer assignment placed on other bytes
    seconds: float

    @property
    def values(self) -> int:
        return self.coverage.listed

    @property
    def timed(self) -> int:
        return self.coverage.timed

    def as_dict(self) -> dict:
        return {"module": self.module, "values": self.values, "values_timed": self.timed,
                "coverage": self.coverage.as_dict(), "allocations": self.allocations,
                "async_windows": self.async_windows, "byte_overlapping_pairs": self.pairs_checked,
                "conflicts": [{"kind": f.kind, "message": f.message, **f.data} for f in self.conflicts],
                "live_range_compared": self.live_range_compared,
                "live_range_disagreements": self.disagreements,
                "live_range_ends_at_unprinted_get_tuple_element": self.unprinted_ends, "rules_used": self.rules_used,
                "aliasing_not_taken": self.aliasing_not_taken, "seconds": round(self.seconds, 3)}
