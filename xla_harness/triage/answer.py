"""The answer of a triage: its verdicts (per target, then on the local backend) in one paragraph, and
the exit code (0 measured, nothing found; 1 a hazard, a fused data-moving producer, non-finite steps
or nondeterminism; 2 nothing measured: no compiler's verdict and no step run, every stage failed).
Built from ``triage.json`` and the stage folders it names, nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from xla_harness.stress import stats
from xla_harness.stress.report import Table, baseline_comparisons, load_table
from xla_harness.triage.compiled import TargetVerdict, verdict_from_json


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


def _compiler(v: TargetVerdict) -> str:
    names = [f"{k} {val}" for k, val in v.versions.items() if k not in ("jax", "jaxlib")]
    jax = v.versions.get("jax")
    return ", ".join(names + ([f"jax {jax}"] if jax else []))


def target_sentence(v: TargetVerdict) -> str:
    """One sentence for one compiler's verdict."""
    name = f"{v.target} {v.backend}" if v.target == "host" else v.target
    said = [part for part in (_compiler(v), v.scope()) if part]
    where = f"on {name}" + (f" ({'; '.join(said)})" if said else "")
    truth = "by the compiler's own aliasing" if v.compiler_states_aliasing else "by the scanner's walk"
    if v.hazard:
        return (f"{where} {v.hazard} in-place fusion(s) write through a data-moving producer "
                f"({', '.join(v.hazard_fusions[:3])}): the #35409 hazard is present")
    if v.fused_producer:
        return (f"{where} {v.fused_producer} scatter fusion(s) fuse a data-moving producer into their in-place "
                f"operand ({', '.join(v.decision_fusions[:3])}): a fusion that should not exist")
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
    if v.nondeterministic:
        text += f"; {len(v.nondeterministic)} instruction(s) run non-deterministically (scatters with atomics)"
    return text


def _rate_sentence(stage: str, run: LocalRun) -> str:
    rows = run.table.rows
    if not rows:
        return f"{stage}: no steps ran"
    r = rows[0]
    unit = "calls" if stage == "frozen" else "steps"
    bound = stats.upper_bound(r.k, r.n)
    text = f"{stage} {r.k}/{r.n} non-finite {unit} (at most {bound:.2%} at 95%)"
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
    out = [f"workaround variants: {variants['skipped']}"] if variants.get("skipped") else []
    bisect = stages.get("bisect") or {}
    if bisect.get("ok"):
        out.append(f"pass bisection: {_bisect_text(bisect.get('result') or {})}")
    elif bisect.get("error"):
        out.append(f"pass bisection: not concluded ({bisect['error']})")
    bundle = stages.get("bundle") or {}
    if bundle.get("ok"):
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
    for key in ("rounds", "variants", "commands"):
        items = s.get(key, [])
        if not isinstance(items, list) or not all(isinstance(x, str) for x in items):
            raise ValueError(f"stages.{name}.{key} is not a list of text")
    for r in s.get("rounds", []):
        if Path(r).is_absolute() or ".." in Path(r).parts:
            raise ValueError(f"stages.{name}.rounds names {r!r}, not a folder inside the triage's")
    for key in ("error", "answer", "skipped"):
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
    return Answer(paragraph, 1 if findings else 0 if measured else 2, findings, targets, local, errors)


def _bisect_text(result: dict) -> str:
    minimal = result.get("minimal") or result.get("minimal_set") or result.get("disabled")
    if minimal:
        names = minimal if isinstance(minimal, list) else [str(minimal)]
        return f"disabling {', '.join(names)} removes the failure ({result.get('flag', '')})".replace(" ()", "")
    return str(result.get("detail") or result.get("verdict") or "no pass set removes the failure")
