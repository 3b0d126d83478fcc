"""The answer of a triage as a record: :class:`Answer` (its paragraph, exit code, findings, per-target
verdicts, local runs, where each seed failed, what next, open questions) and how it prints (the text
``triage`` and ``report DIR`` show, ``--json``), with :class:`LocalRun` (one local stage's table) and
the one interval every rate is given with (:data:`CONFIDENCE`, :func:`bound_text`, :func:`rate_json`).
:mod:`~xla_harness.triage.answer` decides it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from xla_harness.stress.report.summary import Table, baseline_comparisons, stats
from xla_harness.triage import whose
from xla_harness.triage.compiled import TargetVerdict
from xla_harness.triage.where import SeedTrace

# The one interval every rate of a triage is given with (the answer, the report's tables and figures,
# --json): the one-sided exact (Clopper-Pearson) 95% upper bound, the bound the stages stop on.
CONFIDENCE = 0.95
BOUND_NOTE = ("every 95% figure is the one-sided exact (Clopper-Pearson) upper bound on the non-finite rate: "
              "with 95% confidence the rate is at most that (the bound each stage stops on)")


def bound_text(k: int, n: int) -> str:
    """A rate's one-sided exact 95% upper bound as the answer and the report show it (``4.95%``)."""
    return f"{stats.upper_bound(k, n, CONFIDENCE):.2%}"


def rate_json(k: int, n: int) -> dict:
    """A rate with its counts and its bound, as --json gives every rate."""
    return {"k": k, "n": n, "rate": k / n if n else None, "upper": stats.upper_bound(k, n, CONFIDENCE),
            "confidence": CONFIDENCE, "bound": "one-sided exact (Clopper-Pearson) upper"}


@dataclass
class LocalRun:
    """One local stage's table (frozen, train or variants), read from its rounds."""

    stage: str
    table: Table
    answer: str | None
    rounds: list[str]
    variants: list[str] = field(default_factory=list)  # the variants stage: every variant it asked for


@dataclass
class Answer:
    paragraph: str
    exit_code: int
    findings: list[str] = field(default_factory=list)  # one line per problem found
    targets: list[TargetVerdict] = field(default_factory=list)
    local: dict[str, LocalRun] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)  # stages that could not give their verdict
    where: list[SeedTrace] = field(default_factory=list)  # per (stage, configuration, seed) of frozen and train
    next_steps: list[tuple[str, str]] = field(default_factory=list)  # (why, command): what to run next
    open_questions: list[str] = field(default_factory=list)  # what no stage answered (errors, budgets spent)

    @property
    def measured(self) -> bool:
        return bool(self.targets) or any(run.table.rows for run in self.local.values())

    def not_clean(self) -> str:
        """Why exit 2, as the ``error:`` line says it: nothing measured, or the questions left open."""
        if not self.measured:
            return f"nothing was measured ({'; '.join(self.errors) or 'no stage gave a verdict'})"
        return (f"not every question was answered ({'; '.join(self.open_questions)}); what was measured is in the "
                "report, and What next gives the triage with a larger budget")

    def text(self) -> str:
        """What triage prints (and ``report DIR`` again): the paragraph, where each seed failed, what next."""
        lines = [self.paragraph]
        if self.where:
            lines += ["", "Where (per stage, configuration and seed: the non-finite steps, each with the first bad "
                          "value its record names; the loss along the run):"]
            lines += [f"  {where_line(t)}" for t in self.where]
        if self.next_steps:
            lines += ["", "What next:"]
            for why, command in self.next_steps:
                lines += [f"  {why}:", f"    {command}"]
        return "\n".join(lines)

    def to_json(self, state: dict, out: Path) -> dict:
        """The answer as ``--json`` prints it: what the text says, every rate with its k and n, each
        compiler's verdict and the stages' record (``triage.json``) beside it."""
        return {"answer": self.paragraph, "exit_code": self.exit_code, "findings": list(self.findings),
                "errors": list(self.errors), "targets": [v.to_json() for v in self.targets],
                "local": {name: _local_json(run) for name, run in self.local.items()},
                "interval": BOUND_NOTE,
                "where": [t.to_json() for t in self.where],
                "origins": {"counts": whose.counts(self.where), "lead": whose.lead(self.where),
                            "compiler_suspected": whose.compiler_suspected(self.where)},
                "next": [{"why": why, "command": command} for why, command in self.next_steps],
                "report": {"markdown": str(out / "report.md"), "html": str(out / "report.html")},
                "triage": state}


def where_line(t: SeedTrace) -> str:
    """One (stage, configuration, seed): its non-finite steps and its loss trajectory."""
    bad = f"{len(t.bad)} non-finite: {t.bad_text()}" if t.bad else "no non-finite step"
    return f"{t.stage} {t.label} seed {t.seed} ({t.steps} steps, {t.round}): {bad}; loss {t.loss_text()}"


def _local_json(run: LocalRun) -> dict:
    comps = baseline_comparisons(run.table)
    rows = []
    for r in run.table.rows:
        row = {"config": r.label, **rate_json(r.k, r.n), "nondet": r.nondet, "first_bad": dict(r.first_bad),
               "per_seed": {str(seed): rate_json(k, n) for seed, (k, n) in sorted(r.per_seed.items())}}
        if "variant" in r.config:
            row["variant"] = r.config["variant"]
        if r.label in comps:
            row["vs_baseline"] = {"baseline": comps[r.label]["baseline"], "p_value": comps[r.label]["p_value"]}
        rows.append(row)
    return {"answer": run.answer, "rounds": list(run.rounds), "variants": list(run.variants), "rows": rows}
