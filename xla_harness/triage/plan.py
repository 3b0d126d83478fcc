"""What ``triage`` runs and when each stage's question is answered: pure functions, no I/O.

The stages, in order: one compile per target (and a scan of each ``--hlo`` module given), then on the
local backend the frozen protocol (nondeterminism, non-finite calls), the train protocol (the
non-finite rate) and the workaround variants against the baseline; when something failed, a pass
bisection and a repro bundle. The budget is split across the stages that run steps; each runs in
rounds and stops as soon as its question is answered (:func:`rate_answer`, :func:`variants_answer`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from xla_harness.stress.report import stats

# Of the budget left once the compiles are done: what each stage may use at most.
SHARES = {"frozen": 0.25, "train": 0.35, "variants": 0.25, "bisect": 0.15}
ROUNDS = 4  # at most this many rounds of a stage; each doubles the steps of the one before
ALPHA = 0.05  # a variant differs from the baseline when the two-sided Fisher p is below this


@dataclass(frozen=True)
class Stage:
    name: str  # "compile:<target>", "hlo:<n>", "frozen", "train", "variants", "bisect", "bundle"
    kind: str  # compile | hlo | frozen | train | variants | bisect | bundle
    target: str = ""  # compile: the target's text; hlo: the module's path

    @property
    def folder(self) -> str:
        """The stage's folder under ``OUT/stages`` (a name safe as a path)."""
        return "".join(c if c.isalnum() or c in "-_." else "_" for c in self.name.replace(":", "-"))


def plan(targets: list[str], hlo_files: list[str]) -> list[Stage]:
    """The stages of a triage, in the order they run (variants only where some apply, bisect and
    bundle only after a failure on the local backend)."""
    stages = [Stage(f"compile:{t}", "compile", t) for t in targets]
    stages += [Stage(f"hlo:{i + 1}", "hlo", f) for i, f in enumerate(hlo_files)]
    stages += [Stage("frozen", "frozen"), Stage("train", "train"), Stage("variants", "variants")]
    return stages + [Stage("bisect", "bisect"), Stage("bundle", "bundle")]


def steps_to_bound(rate_of_interest: float, confidence: float = 0.95) -> int:
    """The fewest trials with no failure whose one-sided exact upper bound is below ``rate_of_interest``."""
    if not 0 < rate_of_interest < 1:
        raise ValueError(f"the rate of interest must be in (0, 1), got {rate_of_interest}")
    n = max(1, math.ceil(math.log1p(-confidence) / math.log1p(-rate_of_interest)))
    while stats.upper_bound(0, n, confidence) >= rate_of_interest:
        n += 1
    return n


def round_steps(rate_of_interest: float, round_index: int) -> int:
    """Steps of round ``round_index`` (0-based): enough to bound the rate below the rate of interest
    with no failure, doubled each round."""
    return steps_to_bound(rate_of_interest) * 2 ** round_index


def rate_answer(k: int, n: int, rate_of_interest: float, nondet: int = 0) -> str | None:
    """The question of a frozen or train stage: ``"fails"`` once a non-finite step is seen (the rate is
    above 0), ``"nondeterministic"`` once a nondeterministic step is, ``"bounded"`` once the exact
    upper bound is below the rate of interest with none seen; None: not answered yet."""
    if k > 0:
        return "fails"
    if nondet > 0:
        return "nondeterministic"
    if n > 0 and stats.upper_bound(0, n) < rate_of_interest:
        return "bounded"
    return None


def variants_answer(rows: list[tuple[str, int, int]], rate_of_interest: float) -> str | None:
    """The question of the variants stage (rows: (variant, non-finite, steps), the baseline first):
    ``"differs"`` once some variant's rate differs from the baseline's (Fisher p < ALPHA),
    ``"bounded"`` once every row is bounded below the rate of interest with no failure (nothing
    left to compare); None: not answered yet."""
    if not rows:
        return None
    _, k0, n0 = rows[0]
    for _, k, n in rows[1:]:
        if n and n0 and stats.fisher_exact(k, n, k0, n0) < ALPHA:
            return "differs"
    if all(k == 0 and n > 0 and stats.upper_bound(0, n) < rate_of_interest for _, k, n in rows):
        return "bounded"
    return None


def budget_for(stage: str, remaining_s: float, total_s: float) -> float:
    """Seconds a stage may use: its share of the budget, never more than what is left."""
    return max(0.0, min(SHARES.get(stage, 0.1) * total_s, remaining_s))
