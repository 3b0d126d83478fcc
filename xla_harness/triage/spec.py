"""What a triage was asked: :class:`TriageSpec` (the program, its options, the targets, the budget and
the rate of interest), the ``--budget`` check (:func:`budget_seconds`) and the request read back from
the ``triage-spec.json`` a triage writes first (:func:`read_spec`, what ``--resume`` compares).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from xla_harness.errors import HarnessError
from xla_harness.names import EXPLAIN_MAX


@dataclass
class TriageSpec:
    """What the user asked: the program, its options, the targets, the budget and the rate of interest."""

    program: str
    options: list[str]  # KEY=VALUE, as given to --program-option
    targets: list[str]  # target texts, "host" for the local backend's own compile
    hlo: list[str] = field(default_factory=list)  # extra compiled modules to scan
    budget_s: float = 20 * 60.0
    rate_of_interest: float = 0.05
    inject: str | None = None
    inject_rate: float = 0.0
    explain_max: int = EXPLAIN_MAX  # failing steps of each local stage whose origin is decided

    def to_json(self) -> dict:
        return {"program": self.program, "options": self.options, "targets": self.targets, "hlo": self.hlo,
                "budget_s": self.budget_s, "rate_of_interest": self.rate_of_interest, "inject": self.inject,
                "inject_rate": self.inject_rate,
                # a triage begun before the field, or with the default, resumes with the default
                **({"explain_max": self.explain_max} if self.explain_max != EXPLAIN_MAX else {})}


def read_spec(path: Path) -> dict:
    """``triage-spec.json`` as a triage wrote it: {"spec": {...}, "spent_s": seconds}; anything else is
    refused naming the file (never continued, never overwritten)."""
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError:
        raise HarnessError(f"{path}: not UTF-8 text; not a triage's record (choose another --out)") from None
    except (OSError, ValueError, RecursionError) as exc:
        raise HarnessError(f"{path}: not a triage's record ({type(exc).__name__}); choose another --out") from None
    spent = data.get("spent_s", 0.0) if isinstance(data, dict) else None
    if not isinstance(data, dict) or not isinstance(data.get("spec"), dict) or isinstance(spent, bool) or \
            not isinstance(spent, int | float) or not math.isfinite(spent) or spent < 0:
        raise HarnessError(f"{path}: not a triage's record (expected {{\"spec\": {{...}}, \"spent_s\": seconds}}); "
                           "choose another --out")
    return {"spec": data["spec"], "spent_s": float(spent)}


BUDGET_LIMIT_MINUTES = 7 * 24 * 60  # a week


def budget_seconds(minutes: float) -> float:
    if not math.isfinite(minutes) or minutes <= 0:
        raise HarnessError(f"--budget must be a positive number of minutes, got {minutes:g}")
    if minutes > BUDGET_LIMIT_MINUTES:
        raise HarnessError(f"--budget must be at most {BUDGET_LIMIT_MINUTES} minutes (a week), got {minutes:g}")
    return minutes * 60.0
