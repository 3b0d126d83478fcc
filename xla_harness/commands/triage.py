"""xla-harness triage: every verdict the harness can draw about a step, per compiler, in one report."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from xla_harness.commands import flags
from xla_harness.errors import HarnessError
from xla_harness.names import EXPLAIN_MAX

NAME = "triage"
HELP = "every verdict about a step, per compiler, in one report (compile, scan, frozen, train, variants, bisect)"
DESCRIPTION = """\
One command for a step that turns NaN, or a fix that must be shown to work:

1. compile the step once per --target (host: this machine's backend; tpu:GEN:SHAPE with libtpu and
   cuda:KIND with the CUDA plugin compile ahead of time, after `make setup-targets`) and scan each
   with that compiler's own aliasing as the truth: the #35409 hazard, scatters fused with a
   data-moving producer, every in-place scatter fusion (the one writing the tied matrix W's
   gradient named) with its producers and source line; --hlo FILE adds a compiled module you have
   (a TPU dump, say) to the scan;
2. run the step on this machine's backend: the frozen protocol (the same inputs every call:
   non-finite calls, nondeterminism localized to leaves) and the train protocol (the non-finite
   rate with its exact bound). Each runs in rounds and stops once its question is answered (a
   failure seen, nondeterminism seen, the exact 95% upper bound below --rate-of-interest) or its
   share of --budget is spent; progress and the time left go to stderr;
3. say whose each failing step's NaN is, from the state before it and its batch (the first
   --explain-max of each stage; stress --explain): input (a non-finite batch or state the failure
   descends from), race (a replay from the same state is finite or non-finite elsewhere), program
   (op by op in float32 and float64 both non-finite: the equation and your file:line), precision
   (float64 finite), compiler (op by op finite, every replay not) or unknown (why);
4. only when the compiler is not ruled out (a failing step is a race's, the compiler's or
   undecided): every workaround variant the program takes and every compiler-flag variant for the
   backend against the baseline (until one differs significantly), pass bisection and a repro
   bundle (OUT/repro.tar.gz);
5. write OUT/report.md and a self-contained OUT/report.html (figures inline; no network), the answer
   first in one paragraph (whose the NaN is, then each compiler's verdict), which is printed with
   where each seed of the frozen and train stages failed (its non-finite steps, the first bad value
   and the origin of each, its loss along the run) and what to run next (exact commands).
   `xla-harness report OUT` prints that answer again from OUT/triage.json;
   `xla-harness report OUT --html` draws the report again.

Every stage runs as a child xla-harness process in its own folder under OUT/stages; after an
interrupt or a kill, --resume continues (finished stages are kept, the others resume where their
children stopped); nothing is overwritten. Exit 0: measured, nothing found; 1: a hazard, a fused
data-moving producer, non-finite steps or nondeterminism; 2: bad input, or nothing measured (every
stage failed: no compiler's verdict, no step run).
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--program", required=True,
                   help="the step: FILE.py:NAME, MODULE:NAME or a built-in name (issue-35409, tied-embedding)")
    p.add_argument("--program-option", action="append", default=[], metavar="KEY=VALUE",
                   help="an option of the program's factory (repeatable), as stress takes it")
    p.add_argument("--target", default="host", type=flags.csv("target", str), metavar="LIST",
                   help="comma-separated compilers to compile for: host (this machine's backend), tpu:GEN:SHAPE "
                        "(libtpu), cuda:KIND (the CUDA plugin) (default host)")
    p.add_argument("--hlo", action="append", type=Path, default=[], metavar="FILE",
                   help="also scan this compiled module (optimized HLO text, as a compiler dumped it; repeatable)")
    p.add_argument("--budget", type=float, default=20.0, metavar="MINUTES",
                   help="time for the whole triage; the compiles come first, the runs share the rest (default 20)")
    p.add_argument("--rate-of-interest", type=flags.rate, default=0.05, metavar="P",
                   help="a run with no failure stops once its exact 95%% upper bound is below P (default 0.05)")
    p.add_argument("--inject", choices=("nan", "nan-opt", "inf-opt"), default="nan",
                   help="with --inject-rate: the fault stress plants in the step's outputs (proves the detector)")
    p.add_argument("--inject-rate", type=flags.rate, default=0.0, metavar="P",
                   help="plant --inject faults with probability P per step in the local runs (default 0: none)")
    p.add_argument("--explain-max", type=flags.positive, default=EXPLAIN_MAX, metavar="N",
                   help="the first N failing steps of the frozen and of the train stage get their origin "
                        f"(each: 8 replays and about two eager steps) (default {EXPLAIN_MAX})")
    p.add_argument("--out", type=flags.folder, required=True, help="the triage folder (new, or with --resume its own)")
    p.add_argument("--resume", action="store_true", help="continue the triage in --out")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    flags.add_json_argument(p, "the answer (its paragraph, findings, per-compiler verdicts, every rate with its k "
                                "and n, where each seed failed, what next, and the stages)")


def _targets(texts: tuple[str, ...]) -> list[str]:
    from xla_harness.targets.spec import parse_target

    out = []
    for text in texts:
        target = parse_target(text)  # HarnessError for a bad one, before anything runs
        out.append("host" if target.is_host else target.text)
    if len(set(out)) != len(out):
        raise HarnessError(f"--target names a compiler twice: {','.join(texts)}")
    return out


RATE_LIMIT = 1e-6  # the smallest --rate-of-interest: its bound takes about 3 million clean steps


def check_program(program: str, option_texts: list[str]) -> None:
    """``--program`` and its ``--program-option``s checked before any stage runs, as every stage would
    meet them: each option ``KEY=VALUE`` once (a Python literal, else text), a built-in's against its
    option table, then the program built (a file that is missing or does not import, a name it
    lacks, a factory refusing an option, ``make`` raising) and its ``init`` traced (nothing
    compiled, nothing run). Refused with one error line, before the triage folder is touched."""
    import jax

    from xla_harness.programs.interface import check_program_options, guard_user_error, load_program
    from xla_harness.programs.options import literal_option

    options: dict = {}
    for text in option_texts:
        try:
            key, value = literal_option(text)
        except ValueError as exc:
            raise HarnessError(f"--program-option: {exc}") from None
        if key in options and options[key] != value:
            raise HarnessError(f"--program-option {key} is given twice ({options[key]!r} and {value!r})")
        options[key] = value
    built = load_program(program, **check_program_options(program, options))
    try:
        jax.eval_shape(built.init, jax.random.key(0))
    except BaseException as e:  # noqa: BLE001 - the user's init: one error line, never a traceback
        raise guard_user_error(e, program, "init") from e


def run(args) -> int:
    from xla_harness.hlo.parser import parse_file
    from xla_harness.triage.plan import steps_to_bound
    from xla_harness.triage.render import write_report
    from xla_harness.triage.run import Triage
    from xla_harness.triage.spec import TriageSpec, budget_seconds

    if not math.isfinite(args.budget):
        raise HarnessError(f"--budget must be a finite number of minutes, got {args.budget}")
    if not RATE_LIMIT <= args.rate_of_interest < 1:
        raise HarnessError(f"--rate-of-interest must be in [{RATE_LIMIT:g}, 1), got {args.rate_of_interest:g} "
                           f"(bounding {RATE_LIMIT:g} takes {steps_to_bound(RATE_LIMIT):,} steps without a failure)")
    budget_s = budget_seconds(args.budget)
    for path in args.hlo:  # a missing, special, binary, empty or cut file: one error line, before anything runs
        parse_file(path)
    with flags.stdout_to_stderr(args.json):  # the program's own prints: stdout is the JSON's
        check_program(args.program, args.program_option)
    spec = TriageSpec(program=args.program, options=list(args.program_option), targets=_targets(args.target),
                      hlo=[str(p) for p in args.hlo], budget_s=budget_s,
                      rate_of_interest=args.rate_of_interest, inject=args.inject if args.inject_rate else None,
                      inject_rate=args.inject_rate, explain_max=args.explain_max)

    def log(line: str) -> None:
        if not args.quiet:
            sys.stderr.write(line + "\n")
            sys.stderr.flush()

    triage = Triage(spec, args.out, resume=args.resume, log=log)
    with flags.stdout_to_stderr(args.json):
        state, _ = triage.run()
        ans = write_report(args.out, state)
    if args.json:
        print(json.dumps(ans.to_json(state, args.out), indent=1, sort_keys=True))
    else:
        print(ans.text())
        print(f"report: {args.out / 'report.md'}, {args.out / 'report.html'}")
    if ans.exit_code == 2:  # not a clean bill: nothing measured, or questions left open
        sys.stderr.write(f"error: {ans.not_clean()}\n")
    return ans.exit_code
