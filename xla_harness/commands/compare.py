"""xla-harness compare: is the non-finite rate of run A different from run B?"""

from __future__ import annotations

import json
from pathlib import Path

from xla_harness.errors import HarnessError

NAME = "compare"
HELP = "compare non-finite rates of two results folders (e.g. stock vs patched) per configuration"
DESCRIPTION = """\
For every configuration present in both folders, compare the non-finite step counts of A
and B with a two-sided Fisher exact test and say whether they differ at --alpha.
Typical use: the same matrix before and after a patch, flag or libtpu version (A the
baseline). For every configuration that fails in A it also says after how many clean steps
a fix is shown relative to A's measured rate (two-sided Fisher p < --alpha against 0
failures; e.g. 34/80 -> 7 clean steps) and how far B is from that.
Exit 0 always when the inputs are valid; the verdicts are the result.
"""


def add_arguments(p) -> None:
    from xla_harness.commands import flags

    p.add_argument("a", type=Path, metavar="DIR_A", help="results folder A (e.g. stock)")
    p.add_argument("b", type=Path, metavar="DIR_B", help="results folder B (e.g. patched)")
    p.add_argument("--alpha", type=flags.open_fraction, default=0.05, help="significance level (default 0.05)")
    flags.add_json_argument(p, "the comparisons")


def _fix_sentence(ra, rb, needed: int | None, alpha: float) -> str:
    """After how many clean steps B shows a fix of A's measured rate, and where B stands."""
    if needed is None:
        return "" if ra.k == 0 else f"A's rate {ra.k}/{ra.n} is too low to show a fix within 10^7 clean steps"
    head = f"a fix of A's {ra.k}/{ra.n} is shown after {needed} clean steps (Fisher p < {alpha})"
    if rb.k == 0:
        return head + (f"; B has {rb.n}: shown" if rb.n >= needed else f"; B has {rb.n}: {needed - rb.n} more")
    return head + f"; B has {rb.k} non-finite step(s), so it is not clean"


def run(args) -> int:
    from xla_harness.stress.report import stats
    from xla_harness.stress.report import summary as report

    if not 0 < args.alpha < 1:
        raise HarnessError(f"--alpha must be in (0, 1), got {args.alpha}")
    ta, tb = report.load_table([args.a]), report.load_table([args.b])
    rows_b = {r.label: r for r in tb.rows}
    common = [r for r in ta.rows if r.label in rows_b]
    if not common:
        raise HarnessError(f"{args.a} and {args.b} share no configuration")
    out = []
    for ra in common:
        rb = rows_b[ra.label]
        c = stats.compare(ra.k, ra.n, rb.k, rb.n, alpha=args.alpha)
        needed = stats.clean_steps_to_show_fix(ra.k, ra.n, args.alpha)
        out.append({"config": ra.label, "a": c.a.to_dict(), "b": c.b.to_dict(), "p_value": c.p_value,
                    "significant": c.significant, "verdict": c.sentence(),
                    "clean_steps_to_show_fix": needed, "fix": _fix_sentence(ra, rb, needed, args.alpha)})
    if args.json:
        print(json.dumps({"comparisons": out, "alpha": args.alpha}, indent=2))
    else:
        for row in out:
            print(f"{row['config']:<28} {row['verdict']}")
            if row["fix"]:
                print(f"{'':<28} {row['fix']}")
    return 0
