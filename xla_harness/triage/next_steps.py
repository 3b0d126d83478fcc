"""What to run next after a triage, each step a reason and the exact command: replay the first
non-finite step of each failing stage, the stage's own table, the bundle's check, a confirmation of a
variant that helped, and a longer or tighter triage (:func:`next_steps`); and the command that made a
triage, to run again with ``--resume`` (:func:`triage_command`). Built from ``triage.json``'s request
and the :class:`~xla_harness.triage.answer_record.Answer` drawn from it.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import TYPE_CHECKING

from xla_harness.stress.report.summary import baseline_comparisons, stats

if TYPE_CHECKING:
    from xla_harness.triage.answer_record import Answer


def _command(*argv: str) -> str:
    return shlex.join(["xla-harness", *argv])


def _program_args(spec: dict) -> list[str]:
    out = ["--program", str(spec["program"])]
    for option in spec.get("options") or []:
        out += ["--program-option", str(option)]
    return out


def _inject_args(spec: dict) -> list[str]:
    rate = spec.get("inject_rate") or 0.0
    return ["--inject", str(spec.get("inject") or "nan"), "--inject-rate", repr(rate)] if rate else []


def _triage_args(spec: dict, out: str, budget_s: float, rate: float) -> list[str]:
    argv = ["triage", *_program_args(spec)]
    targets = [str(t) for t in spec.get("targets") or []]
    if targets and targets != ["host"]:
        argv += ["--target", ",".join(targets)]
    for hlo in spec.get("hlo") or []:
        argv += ["--hlo", str(hlo)]
    return argv + ["--budget", f"{budget_s / 60:g}", "--rate-of-interest", f"{rate:g}", *_inject_args(spec),
                   "--out", out]


def triage_command(state: dict, out: Path) -> str:
    """The triage command that made ``state`` (its folder ``out``): what to run again, with --resume."""
    spec = state.get("spec") or {}
    if not spec.get("program"):
        return ""
    budget, rate = spec.get("budget_s"), spec.get("rate_of_interest")
    return _command(*_triage_args(spec, str(out), float(budget) if isinstance(budget, int | float) else 1200.0,
                                  float(rate) if isinstance(rate, int | float) else 0.05))


def next_steps(state: dict, out: Path, ans: Answer) -> list[tuple[str, str]]:
    """What to run next, each (why, the exact command): replay the first non-finite step of each
    failing stage, the stage's own table, the bundle's check, a confirmation of a variant that helped,
    and a longer or tighter triage when the budget answered nothing or nothing was found."""
    spec = state.get("spec") or {}
    program = bool(spec.get("program"))
    stages = state.get("stages", {})
    steps: list[tuple[str, str]] = []
    for name in ("frozen", "train"):
        run = ans.local.get(name)
        failing = [t for t in ans.where if t.stage == name and t.bad]
        if program and failing:
            t = failing[0]
            s = t.bad[0][0]
            steps.append((f"replay {name} step {s} of seed {t.seed} ({t.label}), its first non-finite one, in a "
                          f"new folder (steps 0 to {s} again)",
                          _command("stress", *_program_args(spec), "--protocol", name, "--seeds", str(t.seed),
                                   "--steps", str(s + 1), *_inject_args(spec),
                                   "--out", str(out / f"replay-{name}-seed{t.seed}-step{s}"))))
        if run is not None and run.table.rows and (failing or any(r.nondet for r in run.table.rows)):
            steps.append((f"the {name} stage's per-seed table from its records "
                          f"({', '.join(f'{r}/stress.jsonl' for r in run.rounds)})",
                          _command("report", *(str(out / r) for r in run.rounds))))
    steps += _variant_steps(spec, out, ans)
    bundle = stages.get("bundle") or {}
    if bundle.get("ok") and bundle.get("bundle"):
        from xla_harness.programs.interface import BUILTINS

        user = program and str(spec["program"]) not in BUILTINS
        steps.append(("check the repro bundle: its files, and a re-run of its repro.py giving the same "
                      "non-finite counts" + (" (--run-program: it runs the program bundled in it)" if user else ""),
                      _command("bundle", "--check", str(out / str(bundle["bundle"])),
                               *(["--run-program"] if user else []))))
    steps += _triage_steps(spec, out, ans)
    return steps


def _variant_steps(spec: dict, out: Path, ans: Answer) -> list[tuple[str, str]]:
    """A variant whose rate is significantly below its baseline's: the run that would confirm it."""
    run = ans.local.get("variants")
    if run is None or not spec.get("program"):
        return []
    comps = baseline_comparisons(run.table)
    by_label = {r.label: r for r in run.table.rows}
    steps = []
    for r in run.table.rows:
        c = comps.get(r.label)
        base = by_label.get(c["baseline"]) if c else None
        if c is None or base is None or c["p_value"] >= 0.05 or r.k * base.n >= base.k * r.n:
            continue
        variant = str(r.config.get("variant"))
        shown = stats.clean_steps_to_show_fix(base.k, base.n) if r.k == 0 else None
        n = max(r.n, shown or 0)
        seed = max((s for row in run.table.rows for s in row.per_seed), default=0) + 1
        steps.append((f"the {variant} variant lowered the rate ({r.k}/{r.n} against the baseline's {base.k}/{base.n}, "
                      f"p={c['p_value']:.2g}): confirm it on a seed not yet run, {n} steps each",
                      _command("stress", *_program_args(spec), "--variants", f"baseline,{variant}", "--seeds",
                               str(seed), "--steps", str(n), *_inject_args(spec),
                               "--out", str(out / f"confirm-{variant}"))))
    return steps


def _triage_steps(spec: dict, out: Path, ans: Answer) -> list[tuple[str, str]]:
    """A triage that answered nothing within its budget: again with twice the budget; one that found
    nothing: again with a rate of interest five times lower."""
    if not spec.get("program"):
        return []
    budget = float(spec.get("budget_s") or 20 * 60.0)
    rate = float(spec.get("rate_of_interest") or 0.05)
    unanswered = [name for name in ("frozen", "train") if name in ans.local and ans.local[name].answer is None]
    week = 7 * 24 * 3600.0
    if unanswered:
        longer = min(2 * budget, week)
        return [(f"{' and '.join(unanswered)} answered nothing within the budget: the same triage with "
                 f"{longer / 60:g} minutes, in a new folder",
                 _command(*_triage_args(spec, f"{out}-longer", longer, rate)))]
    if ans.exit_code == 0 and ans.local and rate / 5 >= 1e-6:
        return [(f"nothing found, the rate bounded below {rate:g}: bound it below {rate / 5:g} (about five times "
                 "the steps), in a new folder",
                 _command(*_triage_args(spec, f"{out}-{rate / 5:g}", min(5 * budget, week), rate / 5)))]
    return []
