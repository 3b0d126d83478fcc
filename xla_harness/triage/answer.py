"""The answer of a triage: its verdicts (per target, then on the local backend) in one paragraph, and
the exit code (0 measured, nothing found; 1 a hazard, a fused data-moving producer, non-finite steps
or nondeterminism; 2 nothing measured: no compiler's verdict and no step run, every stage failed).
Built from ``triage.json`` and the stage folders it names, nothing else.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from xla_harness.errors import HarnessError
from xla_harness.stress import stats
from xla_harness.stress.report import Table, baseline_comparisons, load_table
from xla_harness.triage import whose
from xla_harness.triage.compiled import TargetVerdict, verdict_from_json
from xla_harness.triage.where import SeedTrace, traces

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


def _compiler(v: TargetVerdict) -> str:
    names = [f"{k} {val}" for k, val in v.versions.items() if k not in ("jax", "jaxlib")]
    jax = v.versions.get("jax")
    return ", ".join(names + ([f"jax {jax}"] if jax else []))


def memory_plan_clause(v: TargetVerdict) -> str:
    """"; memory plan: ..." for a verdict memcheck drew (docs/memcheck.md), "" when it did not run."""
    plan = v.memory_plan
    if not plan:  # a module given with --hlo and no buffer assignment beside it: nothing to check
        return "; memory plan: not checked (no buffer assignment beside the module)" if v.target.startswith("hlo:") \
            else ""
    if plan.get("error"):
        return f"; memory plan: not checked ({plan['error']})"
    compared = plan.get("live_range_compared", -1)
    against = f", its live range as the compiler's on {compared} values" if compared and compared > 0 else ""
    if plan.get("conflicts"):
        kinds = ", ".join(f"{n} {k}" for k, n in sorted(plan.get("kinds", {}).items()))
        return f"; memory plan: {plan['conflicts']} conflict(s) ({kinds}; first: {plan.get('first', '')})"
    differ = plan.get("disagreements", 0)
    if differ:
        against = (f", its live range differing from the compiler's on {differ} of {compared} values (our model's "
                   "error or the compiler's, not a race: xla-harness memcheck lists them)")
    return (f"; memory plan: no two live values share bytes ({plan.get('values', 0)} values, "
            f"{plan.get('async_windows', 0)} async windows{against})")


def target_sentence(v: TargetVerdict) -> str:
    """One sentence for one compiler's verdict."""
    name = f"{v.target} {v.backend}" if v.target == "host" else v.target
    said = [part for part in (_compiler(v), v.scope()) if part]
    where = f"on {name}" + (f" ({'; '.join(said)})" if said else "")
    truth = "by the compiler's own aliasing" if v.compiler_states_aliasing else "by the scanner's walk"
    if v.hazard:
        return (f"{where} {v.hazard} in-place fusion(s) write through a data-moving producer "
                f"({', '.join(v.hazard_fusions[:3])}): the #35409 hazard is present" + memory_plan_clause(v))
    if v.fused_producer:
        return (f"{where} {v.fused_producer} scatter fusion(s) fuse a data-moving producer into their in-place "
                f"operand ({', '.join(v.decision_fusions[:3])}): a fusion that should not exist"
                + memory_plan_clause(v))
    w = v.w_scatter()
    if w is not None:
        into = {"dense": "onto the dense (dot) gradient", "broadcast": "into a fresh zero buffer",
                "barrier": "into an optimization barrier's output", "parameter": "into a parameter",
                "other": "into a buffer the scanner does not trace to a dot or a zero"}.get(
            w.writes_w, f"into a value from {w.writes_w}")
        how = "in place" if w.compiler in ("aliased", "") else "not in place"
        via = " through a transpose" if "transpose" in w.path else " with no data-moving producer"
        text = f"{where} the scatter into W ({w.fusion}) is fused {how} {into}{via}"
    elif v.scatters:
        text = f"{where} {len(v.scatters)} in-place scatter fusion(s), none with a data-moving producer"
    else:
        text = f"{where} no scatter is fused in place"
    text += f" ({truth}): the #35409 hazard is absent"
    text += memory_plan_clause(v)
    if v.nondeterministic:
        text += f"; {len(v.nondeterministic)} instruction(s) run non-deterministically (scatters with atomics)"
    return text


def _rate_sentence(stage: str, run: LocalRun) -> str:
    rows = run.table.rows
    if not rows:
        return f"{stage}: no steps ran"
    r = rows[0]
    unit = "calls" if stage == "frozen" else "steps"
    text = f"{stage} {r.k}/{r.n} non-finite {unit} (at most {bound_text(r.k, r.n)} at 95%)"
    if stage == "frozen" or r.nondet:
        if r.nondet:
            leaves = sorted(r.nondet_leaves.items(), key=lambda kv: -kv[1]["steps"])
            where = f", in {', '.join(name for name, _ in leaves[:3])}" if leaves else ""
            text += f", nondeterministic: {r.nondet} {unit} differ{where}"
        else:
            text += ", deterministic"
    return text


def _variants_sentence(run: LocalRun) -> str:
    table = run.table
    comps = baseline_comparisons(table)
    if not comps:
        return ""
    differing: list[tuple] = []
    same: list[tuple] = []
    for r in table.rows:
        c = comps.get(r.label)
        if c is None:
            continue
        name = r.config.get("variant", r.label)
        (differing if c["p_value"] < 0.05 else same).append((name, r, c))
    parts = []
    if differing:
        parts.append("; ".join(f"the {n} variant changes the rate ({r.k}/{r.n}, p={c['p_value']:.2g})"
                               for n, r, c in differing))
    if same:
        names = ", ".join(n for n, _, _ in same)
        parts.append(f"the {names} variant{'s' if len(same) > 1 else ''} change{'' if len(same) > 1 else 's'} "
                     "nothing measurable")
    measured = {r.config.get("variant") for r in table.rows if r.n}
    missing = [v for v in run.variants if v not in measured]
    if missing:
        parts.append(f"{', '.join(missing)}: not run within the budget")
    return "; ".join(parts)


def _targets(stages: dict) -> tuple[list[TargetVerdict], list[str]]:
    targets, errors = [], []
    for name, s in stages.items():
        if name.startswith(("compile:", "hlo:")):
            if s.get("ok"):
                targets.append(verdict_from_json(s["verdict"]))
                plan = targets[-1].memory_plan or {}
                if plan.get("error"):  # a memory plan that is there but could not be checked: asked, not answered
                    errors.append(f"{targets[-1].target}: memory plan not checked ({plan['error']})")
            else:
                errors.append(s.get("error", f"{name} failed"))
    return targets, errors


def _local(stages: dict, out: Path) -> tuple[dict[str, LocalRun], list[str]]:
    local: dict[str, LocalRun] = {}
    errors = []
    for name in ("frozen", "train", "variants"):
        s = stages.get(name) or {}
        if s.get("ok") and s.get("rounds"):
            local[name] = LocalRun(name, load_table([out / f for f in s["rounds"]]), s.get("answer"),
                                   list(s["rounds"]), list(s.get("variants", [])))
        elif s and not s.get("ok"):
            errors.append(s.get("error", f"{name} failed"))
        elif s and not s.get("skipped"):  # an older record: a stage that ran no round is no verdict
            errors.append(f"{name}: no round ran")
    return local, errors


def _here(backend: str, local: dict[str, LocalRun]) -> str:
    device = next((str((run.table.env or {}).get("device_kind") or "") for run in local.values()), "")
    return f"on this {backend or 'local backend'}" + (f" ({device})" if device and device != backend else "")


def _after(stages: dict) -> list[str]:
    """The sentences of the bisection and the bundle, and of a variants stage skipped for a reason."""
    variants = stages.get("variants") or {}
    bisect = stages.get("bisect") or {}
    notes = [f"{name}: {n}" for name in ("frozen", "train") for n in (stages.get(name) or {}).get("notes", [])]
    if variants.get("skipped") and variants.get("skipped") == bisect.get("skipped"):  # one reason, said once
        out = notes + [f"workaround variants and pass bisection: {variants['skipped']}"]
    else:
        out = notes + ([f"workaround variants: {variants['skipped']}"] if variants.get("skipped") else [])
        if bisect.get("skipped"):
            out.append(f"pass bisection: {bisect['skipped']}")
    if bisect.get("skipped"):
        pass
    elif bisect.get("ok"):
        out.append(f"pass bisection: {_bisect_text(bisect.get('result') or {})}")
    elif bisect.get("error"):
        out.append(f"pass bisection: not concluded ({bisect['error']})")
    bundle = stages.get("bundle") or {}
    if bundle.get("ok") and bundle.get("bundle"):
        out.append(f"repro bundle: {bundle['bundle']}")
    elif bundle.get("error"):
        out.append(f"repro bundle: not written ({bundle['error']})")
    return out


def check_state(state) -> None:
    """``triage.json``'s shape as a triage writes it (its ``spec`` an object, each stage an object, a
    compiler's verdict a :class:`~xla_harness.triage.compiled.TargetVerdict`, rounds and commands lists
    of text, a round a folder inside the triage's); ValueError naming the first field that is not."""
    if not isinstance(state, dict) or state.get("kind") != "triage":
        raise ValueError("not an object whose kind is 'triage'")
    for key in ("spec", "stages"):
        if not isinstance(state.get(key, {}), dict):
            raise ValueError(f"{key} is {type(state[key]).__name__}, not an object")
    for name, s in state.get("stages", {}).items():
        _check_stage(name, s)


def _check_stage(name: str, s) -> None:
    if not isinstance(s, dict):
        raise ValueError(f"stages.{name} is {type(s).__name__}, not an object")
    if name.startswith(("compile:", "hlo:")) and s.get("ok"):
        verdict_from_json(s.get("verdict"))
    for key in ("rounds", "variants", "commands", "notes"):
        items = s.get(key, [])
        if not isinstance(items, list) or not all(isinstance(x, str) for x in items):
            raise ValueError(f"stages.{name}.{key} is not a list of text")
    for r in s.get("rounds", []):
        if Path(r).is_absolute() or ".." in Path(r).parts:
            raise ValueError(f"stages.{name}.rounds names {r!r}, not a folder inside the triage's")
    for key in ("error", "answer", "skipped", "bundle"):
        if s.get(key) is not None and not isinstance(s[key], str):
            raise ValueError(f"stages.{name}.{key} is {type(s[key]).__name__}, not text")


def answer(state: dict, out: Path) -> Answer:
    """The answer of the triage whose ``triage.json`` is ``state``, its stage folders under ``out``."""
    stages = state.get("stages", {})
    targets, errors = _targets(stages)
    local, local_errors = _local(stages, out)
    errors += local_errors
    sentences = [target_sentence(v) for v in targets]
    findings = [target_sentence(v) for v in targets if v.found]
    here = _here(str(state.get("backend") or ""), local)
    where = [t for name in ("frozen", "train") if name in local for t in traces(name, local[name].rounds, out)]
    lead = whose.lead(where)  # whose NaN it is first: the question a user asks
    sentences = [f"{here}: {s}" for s in lead] + sentences
    parts = []
    for name in ("frozen", "train"):
        run = local.get(name)
        if run is None:
            continue
        parts.append(_rate_sentence(name, run))
        if run.table.rows and (run.table.rows[0].k or run.table.rows[0].nondet):
            findings.append(f"{here}: {_rate_sentence(name, run)}")
    if "variants" in local and _variants_sentence(local["variants"]):
        parts.append(_variants_sentence(local["variants"]))
    if parts:
        sentences.append(f"{here}: " + "; ".join(parts))
    sentences += _after(stages)
    paragraph = ". ".join(s[0].upper() + s[1:] for s in sentences) + "." if sentences else "Nothing was measured."
    if errors:
        paragraph += " Not answered: " + "; ".join(errors) + "."
    measured = bool(targets) or any(run.table.rows for run in local.values())
    open_questions = errors + [f"{name}: not within the budget" for name in ("frozen", "train")
                               if name in local and local[name].answer is None]
    # 0 only when every question asked was answered and nothing was found; a partial answer is not a
    # clean bill (exit 2, naming what remains), a finding is a finding however much remains (exit 1)
    code = 1 if findings else 0 if measured and not open_questions else 2
    ans = Answer(paragraph, code, findings, targets, local, errors, where)
    ans.open_questions = open_questions
    ans.next_steps = next_steps(state, out, ans)
    return ans


def read_state(folder: Path) -> dict:
    """``FOLDER/triage.json``, checked (:func:`check_state`); HarnessError (one line) naming what it is
    when it is not a triage's record."""
    from xla_harness.files import read_regular

    path = Path(folder) / "triage.json"
    if not path.exists() and not path.is_symlink():
        raise HarnessError(f"{folder} is not a triage folder (no triage.json)")
    if not path.is_file():
        what = "a dangling link" if not path.exists() else "a folder" if path.is_dir() else \
            "a link to a device or FIFO" if path.is_symlink() else "a device or FIFO"
        raise HarnessError(f"{path} is {what}, not a triage's record")
    try:
        state = json.loads(read_regular(path).decode("utf-8"))
    except UnicodeDecodeError:
        raise HarnessError(f"{path}: not a triage record (not UTF-8 text)") from None
    except (ValueError, RecursionError):
        raise HarnessError(f"{path}: not a triage record (not JSON)") from None
    try:
        check_state(state)
    except ValueError as exc:
        raise HarnessError(f"{path}: not a triage record ({exc})") from None
    return state


# ----------------------------------------------------------------------------- what next


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


def _bisect_text(result: dict) -> str:
    minimal = result.get("minimal") or result.get("minimal_set") or result.get("disabled")
    if minimal:
        names = minimal if isinstance(minimal, list) else [str(minimal)]
        return f"disabling {', '.join(names)} removes the failure ({result.get('flag', '')})".replace(" ()", "")
    return str(result.get("detail") or result.get("verdict") or "no pass set removes the failure")
