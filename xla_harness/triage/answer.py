"""The answer of a triage: its verdicts (per target, then on the local backend) in one paragraph, and
the exit code (0 measured, nothing found; 1 a hazard, a fused data-moving producer, non-finite steps
or nondeterminism; 2 nothing measured: no compiler's verdict and no step run, every stage failed).
Built from ``triage.json`` and the stage folders it names, nothing else. The answer's record and how
it prints are :mod:`~xla_harness.triage.answer_record`'s; what to run next is
:mod:`~xla_harness.triage.next_steps`'s.
"""

from __future__ import annotations

import json
from pathlib import Path

from xla_harness.errors import HarnessError
from xla_harness.stress.report.summary import baseline_comparisons, load_table
from xla_harness.triage import whose
from xla_harness.triage.answer_record import Answer, LocalRun, bound_text
from xla_harness.triage.compiled import TargetVerdict, verdict_from_json
from xla_harness.triage.next_steps import next_steps
from xla_harness.triage.where import traces


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
    from xla_harness.runtime.files import read_regular

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


def _bisect_text(result: dict) -> str:
    minimal = result.get("minimal") or result.get("minimal_set") or result.get("disabled")
    if minimal:
        names = minimal if isinstance(minimal, list) else [str(minimal)]
        return f"disabling {', '.join(names)} removes the failure ({result.get('flag', '')})".replace(" ()", "")
    return str(result.get("detail") or result.get("verdict") or "no pass set removes the failure")
