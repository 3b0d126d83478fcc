"""Where a local stage of a triage failed: per configuration and seed, the non-finite steps (with the
first bad value each record names and, where ``stress --explain`` decided it, whose NaN it is: its
origin), and a compact loss trajectory; read from the stage's rounds' ``stress*.jsonl`` (each round
runs one seed), nothing else.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path

from xla_harness.stress.results import store

SHOWN_STEPS = 8  # non-finite steps listed in full up to this many; beyond it, the first ones and the count
TRAJECTORY_POINTS = 5  # losses shown along a seed's trajectory


@dataclass
class SeedTrace:
    """One (configuration, seed) of a frozen or train stage, as its round recorded it."""

    stage: str
    label: str
    seed: int
    round: str  # the round's folder, relative to the triage's
    steps: int = 0
    bad: list[tuple[int, str | None, bool]] = field(default_factory=list)  # (step, first_bad, planted)
    losses: list[tuple[int, float]] = field(default_factory=list)  # (step, loss) of every step with a finite loss
    # step -> its origin (Origin.to_json() and the "step" it was decided at)
    origins: dict[int, dict] = field(default_factory=dict)

    def origin_of(self, step: int, planted: bool = False) -> dict | None:
        """The origin of a non-finite ``step``: its own; under the frozen protocol (every call the same
        inputs) the seed's explained call's; ``planted`` for a step --inject corrupted; None when it
        was not explained (past --explain-max)."""
        if planted:
            return {"class": "planted", "summary": "planted by --inject", "where": None, "evidence": {}}
        if step in self.origins:
            return self.origins[step]
        if self.stage == "frozen" and self.origins:
            return next(iter(self.origins.values()))
        return None

    def origin_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for s, _, planted in self.bad:
            o = self.origin_of(s, planted)
            key = o["class"] if o else "unexplained"
            counts[key] = counts.get(key, 0) + 1
        return counts

    @property
    def first_bad_step(self) -> int | None:
        return self.bad[0][0] if self.bad else None

    def bad_text(self, shown: int = SHOWN_STEPS) -> str:
        """``3 (loss), 10 (loss), ...``: each non-finite step with its first bad value; the first
        ``shown`` of them and the count when there are more."""
        if not self.bad:
            return "none"
        parts = []
        for s, first, planted in self.bad[:shown]:
            o = self.origin_of(s, planted)
            whose = f"; {o['class']}" if o and not planted else ""
            parts.append(f"{s} ({first or 'not named'}{', planted' if planted else ''}{whose})")
        more = f", ... ({len(self.bad)} in all)" if len(self.bad) > shown else ""
        return ", ".join(parts) + more

    def loss_text(self) -> str:
        """The loss at a few steps along the trajectory (the first and the last finite one among
        them), its lowest, median and highest, and the last finite loss."""
        if not self.losses:
            return "no finite loss recorded"
        n = len(self.losses)
        picks = sorted({round(i * (n - 1) / (TRAJECTORY_POINTS - 1)) for i in range(TRAJECTORY_POINTS)}) \
            if n > 1 else [0]
        values = [v for _, v in self.losses]
        along = " -> ".join(f"{_g(self.losses[i][1])} @{self.losses[i][0]}" for i in picks)
        last_step, last = self.losses[-1]
        return (f"{along}; min {_g(min(values))}, median {_g(statistics.median(values))}, max {_g(max(values))}; "
                f"last finite {_g(last)} at step {last_step}")

    def to_json(self) -> dict:
        values = [v for _, v in self.losses]
        return {"stage": self.stage, "config": self.label, "seed": self.seed, "round": self.round,
                "steps": self.steps, "nonfinite": len(self.bad),
                "nonfinite_steps": [{"step": s, "first_bad": first, "planted": planted,
                                     "origin": self.origin_of(s, planted)}
                                    for s, first, planted in self.bad],
                "loss": {"first": _point(self.losses[0]) if self.losses else None,
                         "last_finite": _point(self.losses[-1]) if self.losses else None,
                         "min": min(values, default=None), "max": max(values, default=None),
                         "median": statistics.median(values) if values else None}}


def _g(x: float) -> str:
    return f"{x:.4g}"


def _point(p: tuple[int, float]) -> dict:
    return {"step": p[0], "loss": p[1]}


def traces(stage: str, rounds: list[str], out: Path) -> list[SeedTrace]:
    """Every (configuration, seed) of ``stage``'s rounds (folders relative to ``out``), in the order
    recorded; a step recorded twice (a resumed round) counts once, as first read."""
    found: dict[tuple[str, int], SeedTrace] = {}
    seen: set[tuple[str, int, int]] = set()
    for folder in rounds:
        for path in store.results_files(out / folder):
            res = store.read_results(path)
            for o in res.origins:
                trace = found.setdefault((o.label, o.seed), SeedTrace(stage, o.label, o.seed, folder))
                trace.origins.setdefault(o.step, {**o.origin.to_json(), "step": o.step})
            for block in res.blocks:
                trace = found.setdefault((block.label, block.seed), SeedTrace(stage, block.label, block.seed, folder))
                for s in block.steps:
                    if (block.label, block.seed, s.step) in seen:
                        continue
                    seen.add((block.label, block.seed, s.step))
                    trace.steps += 1
                    if not s.finite:
                        trace.bad.append((s.step, s.first_bad, s.injected is not None))
                    if s.loss is not None:
                        trace.losses.append((s.step, s.loss))
    for trace in found.values():
        trace.bad.sort()
        trace.losses.sort()
    return list(found.values())
