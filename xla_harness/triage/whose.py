"""Whose NaN it is, per triage: the origins ``stress --explain`` decided for the local stages' failing
steps (:mod:`xla_harness.origin`), grouped into the sentence a triage's answer opens with, and the
rule that decides whether the compiler is a suspect at all (variants and pass bisection run only then).
"""

from __future__ import annotations

from xla_harness.origin.classify import SUSPECTS
from xla_harness.origin.known import KNOWN
from xla_harness.triage.where import SeedTrace

# What each class says of a failing step, as the answer's first sentence puts it.
PHRASES = {
    "input": "from non-finite input",
    "program": "from your program's own math",
    "precision": "from float32's range",
    "race": "from a race (it did not replay)",
    "compiler": "from the compiler (your step evaluated op by op is finite)",
    "unknown": "of undecided origin",
    "planted": "planted by --inject",
    "unexplained": "not explained (past --explain-max)",
}
ORDER = ("input", "program", "precision", "race", "compiler", "unknown", "planted", "unexplained")
SHOWN_STEPS = 5


def _steps_text(steps: list[int]) -> str:
    shown = [str(s) for s in steps[:SHOWN_STEPS]]
    more = f" and {len(steps) - SHOWN_STEPS} more" if len(steps) > SHOWN_STEPS else ""
    if len(shown) == 1:
        return f"step {shown[0]}"
    return f"steps {', '.join(shown[:-1])}{'' if more else ' and ' + shown[-1]}" + \
        (f", {shown[-1]}{more}" if more else "")


def groups(traces: list[SeedTrace]) -> dict[str, list[tuple[SeedTrace, int, dict | None]]]:
    """The failing steps of ``traces`` by origin class ("unexplained" for a step without one)."""
    out: dict[str, list[tuple[SeedTrace, int, dict | None]]] = {}
    for t in traces:
        for s, _, planted in t.bad:
            o = t.origin_of(s, planted)
            out.setdefault(o["class"] if o else "unexplained", []).append((t, s, o))
    return {k: out[k] for k in ORDER if k in out}


def counts(traces: list[SeedTrace]) -> dict[str, int]:
    return {k: len(v) for k, v in groups(traces).items()}


CLEARED = frozenset({"input", "program", "precision"})  # origins that rule the compiler out


def compiler_cleared(traces: list[SeedTrace]) -> bool:
    """True when some failing step was explained and every explained one is ``input``, ``program`` or
    ``precision``: no ``race``, no ``compiler``, no ``unknown`` (what could not be decided does not rule
    the compiler out). Steps planted by --inject or past --explain-max do not count either way."""
    explained = set(groups(traces)) - {"unexplained", "planted"}
    return bool(explained) and explained <= CLEARED


def compiler_suspected(traces: list[SeedTrace]) -> bool:
    """True when a step failed and the compiler is not ruled out (:func:`compiler_cleared`): only then
    do variants and pass bisection run. Always when a step is ``race`` or ``compiler``."""
    failed = bool(groups(traces))
    return failed and (not compiler_cleared(traces) or any(k in SUSPECTS for k in groups(traces)))


def _detail(cls: str, o: dict | None) -> str:
    if not o:
        return ""
    summary = str(o.get("summary", ""))
    if cls == "input":  # "non-finite input in your batch: batch['x'][2, 1] is NaN" -> the part after the colon
        return summary.split(": ", 1)[-1]
    where = o.get("where") or {}
    if cls in ("program", "precision") and where.get("file"):
        first = (o.get("evidence") or {}).get("first") or {}
        kind = {"nan": "NaN", "inf": "inf", "-inf": "-inf"}.get(str(first.get("kind")), "a non-finite value")
        made = f"{first.get('primitive', where.get('primitive'))} made {kind}"
        known = (o.get("evidence") or {}).get("known_class")
        return f"{made} at {where['file']}:{where['line']}" + (f": {KNOWN.get(known, known)}" if known else "")
    if cls == "race":
        ev = o.get("evidence") or {}
        return f"{ev.get('nonfinite', '?')}/{ev.get('replays', '?')} replays non-finite"
    if cls == "unknown":
        return summary
    return ""


def stage_sentence(stage: str, traces: list[SeedTrace]) -> str | None:
    """``2 of 59 train steps non-finite, both from non-finite input (batch['x'][2, 1] is NaN) at steps
    3 and 11``; None when the stage had no failing step."""
    mine = [t for t in traces if t.stage == stage]
    k = sum(len(t.bad) for t in mine)
    if not k:
        return None
    n = sum(t.steps for t in mine)
    unit = "calls" if stage == "frozen" else "steps"
    parts = []
    by_class = groups(mine)
    for cls, items in by_class.items():
        phrase = PHRASES[cls]
        if cls == "input":
            leaves = [leaf["leaf"] for _, _, o in items for leaf in ((o or {}).get("evidence") or {}).get("leaves", [])]
            phrase = "from your batch" if leaves and all(x.startswith("batch") for x in leaves) else \
                "from the state before the step (init or a checkpoint)" if leaves and not any(
                    x.startswith("batch") for x in leaves) else phrase
        details = list(dict.fromkeys(_detail(cls, o) for _, _, o in items if _detail(cls, o)))
        how_many = ("both" if len(items) == 2 else f"all {len(items)}") if len(by_class) == 1 and k > 1 else \
            ("it" if k == 1 else str(len(items)))
        seeds = {t.seed for t, _, _ in items}
        steps = sorted({s for _, s, _ in items})
        at = _steps_text(steps) + (f" (seeds {', '.join(str(x) for x in sorted(seeds))})" if len(seeds) > 1 else "")
        detail = f" ({'; '.join(details[:2])})" if details else ""
        parts.append(f"{how_many} {phrase}{detail} at {at}")
    return f"{k} of {n} {stage} {unit} non-finite, " + "; ".join(parts)


def lead(traces: list[SeedTrace]) -> list[str]:
    """The answer's opening sentences: per failing local stage, how many steps failed and whose they are."""
    return [s for s in (stage_sentence(stage, traces) for stage in ("frozen", "train")) if s]
