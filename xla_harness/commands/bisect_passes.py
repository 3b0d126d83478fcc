"""xla-harness bisect-passes: which compiler passes must be disabled for the failure to go?"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from xla_harness.errors import HarnessError
from xla_harness.names import BUILTIN_PROGRAM

NAME = "bisect-passes"
HELP = "delta-debug over --xla_disable_hlo_passes to a minimal set whose disabling removes the failure"
DESCRIPTION = """\
List the passes the compiler runs on the program (a real pass dump), then shrink the set
of disabled passes (delta debugging) to a 1-minimal one that removes the failure.

Oracles:
  --oracle stress  the configuration produces non-finite updates (rate > 0). A baseline
                   run measures the rate p; each probe then runs runs_needed(p, 0.95) steps
                   (if the failure were still there, zero failures in that many steps has
                   probability <= 5%) and stops at the first non-finite step.
  --oracle hlo     a property of the compiled HLO (--property multi-op-fusion,
                   scatter-root-fusion or regex:<pattern>): deterministic, one compile per probe.

Each probe runs in a fresh process with the disabled set as a compile option (the result
prints the equivalent XLA_FLAGS flag; libtpu reads XLA_FLAGS too and refuses it in
LIBTPU_INIT_ARGS); a compiler crash under a set (disabling a pass the compiler cannot do
without) counts as "failure not removed". With --target tpu:GEN:SHAPE or cuda:KIND the
probes compile for that target ahead of time (--oracle hlo only: nothing runs).
Probes are logged to OUT/bisect.jsonl; --resume reuses them.
The log's first line names the task; --resume refuses a log of another task. Before any
search a baseline probe with nothing disabled must show the failure (--oracle hlo; for
--oracle stress the baseline run does). Exit 0 with the minimal set; 2 if the configuration
does not fail or the input is bad; 1 when --time-limit S ran out first: no probe starts after it,
and what was narrowed so far is printed (the smallest set whose disabling removed the failure,
not yet shown minimal, or that none has yet). A program file imports modules from its own
folder (``from mymodel import ...``), in this process and in every probe's.
"""


def add_arguments(p) -> None:
    from xla_harness.commands import flags

    p.add_argument("--oracle", choices=["stress", "hlo"], default="stress")
    p.add_argument("--property", default="scatter-root-fusion", help="HLO property for --oracle hlo")
    flags.add_program_arguments(p)  # plus "small": a tiny elementwise+dot function, for checks
    flags.add_single_config_arguments(p)
    flags.add_target_argument(p)
    p.add_argument("--seed", type=flags.seed, default=1)
    p.add_argument("--baseline-steps", type=flags.positive, default=200, help="steps of the baseline run (stress)")
    p.add_argument("--inject-pass", metavar="PASS", help="plant faults while PASS is enabled (test oracle)")
    p.add_argument("--inject-rate", type=flags.rate, default=0.3, help="rate of --inject-pass faults")
    p.add_argument("--passes", help="comma-separated candidate passes (default: all from the pass dump)")
    p.add_argument("--out", type=Path, default=Path("out/bisect"), help="folder for bisect.jsonl")
    p.add_argument("--resume", action="store_true", help="reuse the probes already in OUT/bisect.jsonl")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    p.add_argument("--time-limit", type=flags.positive_number, metavar="S",
                   help="start no probe after S seconds; print what was narrowed so far and exit 1")
    flags.add_json_argument(p, "the minimal set, its flag, the probe count and the baseline")
    flags.add_model_arguments(p)


def _check_args(args) -> None:
    """Flag values that would otherwise fail only after minutes of probing."""
    if not 0.0 <= args.inject_rate <= 1.0:
        raise HarnessError(f"--inject-rate must be in [0, 1], got {args.inject_rate}")
    if args.baseline_steps <= 0:
        raise HarnessError(f"--baseline-steps must be a positive integer, got {args.baseline_steps}")
    if args.passes is not None and not [q for q in args.passes.split(",") if q.strip()]:
        raise HarnessError("--passes lists no pass")
    if not args.target.is_host and args.oracle == "stress":
        raise HarnessError(f"--target {args.target} compiles without the hardware, so no step can run: use "
                           "--oracle hlo (a property of the compiled HLO)")
    if args.time_limit is not None and not args.time_limit > 0:
        raise HarnessError(f"--time-limit must be a positive number of seconds, got {args.time_limit}")
    if args.out.exists() and not args.out.is_dir():
        raise HarnessError(f"--out {args.out} is not a folder")
    module_part = args.program.rsplit(":", 1)[0] if ":" in args.program else ""
    if (module_part.endswith(".py") or "/" in module_part) and not Path(module_part).is_file():
        raise HarnessError(f"--program {args.program}: no such file {module_part}")


def _task(args) -> dict:
    """What every probe is asked (the log's first line; --resume refuses a log of another task)."""
    from xla_harness.commands import flags

    options = {} if args.program == "small" else flags.program_options(args)
    if args.program not in ("small", BUILTIN_PROGRAM) and ":" in args.program:
        path, _, attr = args.program.rpartition(":")
        if path.endswith(".py"):  # the probe runs in a fresh process, possibly elsewhere: absolute path
            args.program = f"{Path(path).resolve()}:{attr}"
    task = {"program": args.program, "options": options, "oracle": args.oracle, "property": args.property,
            "seed": args.seed}
    if not args.target.is_host:  # a host task keeps its old form, so earlier logs still --resume
        task["target"] = args.target.text
    return task


def run(args) -> int:
    import time

    from xla_harness.repro import bisect

    started = time.monotonic()
    _check_args(args)
    task = _task(args)  # the program's options checked (a built-in's table) before the compiler is looked for
    from xla_harness.targets.devices import missing

    why = missing(args.target)  # before a probe dies of it
    if why:
        raise HarnessError(why)
    from xla_harness.targets.envcheck import check_compiler_environment

    check_compiler_environment(args.target)  # each probe would die of a bad XLA_FLAGS: say so once, first
    if args.oracle == "hlo":
        bisect.count_property("HloModule m\n\nENTRY e {\n  ROOT c = f32[] constant(0)\n}\n", args.property)
    if args.inject_pass:
        if args.oracle != "stress":
            raise HarnessError("--inject-pass goes with --oracle stress")
        task["inject"] = [args.inject_pass, args.inject_rate]
    log = bisect.ProbeLog(args.out / "bisect.jsonl", args.resume, task=dict(task))

    def say(line: str) -> None:
        if not args.quiet:
            sys.stderr.write(line + "\n")

    oracle = bisect.SubprocessOracle(task)
    say(f"listing passes (pass dump of the program compiled for {args.target})...")
    passes = oracle.passes()
    if args.passes:
        wanted = [q.strip() for q in args.passes.split(",") if q.strip()]
        unknown = [q for q in wanted if q not in passes]
        if unknown:
            raise HarnessError(f"pass {unknown[0]!r} does not change this program (not in its pass dump)")
        passes = wanted
    say(f"{len(passes)} candidate passes")
    baseline, per_probe, counts = "", None, None
    if args.oracle == "stress":
        k, n = oracle.baseline(args.baseline_steps)
        per_probe = bisect.steps_for_rate(k, n)  # raises when the configuration does not fail
        baseline = f"{k}/{n} non-finite steps with all passes enabled"
        counts = {"nonfinite": k, "steps": n}
        say(f"baseline: {baseline}; each probe runs up to {per_probe} steps (95% confidence)")
        oracle.task["steps"] = per_probe
        log.record("baseline", nonfinite=k, steps=n, steps_per_probe=per_probe)
    deadline = None if args.time_limit is None else started + args.time_limit
    try:
        result = bisect.bisect(passes, oracle, log, progress=say, baseline=baseline, steps_per_probe=per_probe,
                               deadline=deadline)
    except bisect.OutOfTime as stop:
        return _stopped(args, stop.partial, counts)
    if args.json:
        # "flag" goes in XLA_FLAGS (libtpu reads it there too; it refuses it in LIBTPU_INIT_ARGS).
        print(json.dumps({"minimal": result.minimal, "flag": result.flag(), "new_probes": result.probes,
                          "steps_per_probe": per_probe, "baseline": counts, "candidates": list(result.passes),
                          "oracle": args.oracle,
                          "property": args.property if args.oracle == "hlo" else None,
                          "log": str(args.out / "bisect.jsonl")}, indent=2))
        return 0
    print(f"minimal set of passes whose disabling removes the failure: {', '.join(result.minimal)}")
    print(f"reproduce with XLA_FLAGS={result.flag()}  (on TPU too: libtpu reads XLA_FLAGS and refuses "
          "these flags in LIBTPU_INIT_ARGS)")
    print(f"{result.probes} new probe(s)" + (f", up to {per_probe} steps each; {baseline}" if per_probe else ""))
    return 0


def _stopped(args, partial: dict, counts: dict | None) -> int:
    """What a bisection that ran out of --time-limit had narrowed (exit 1)."""
    from xla_harness.repro.bisect import partial_text

    if args.json:
        print(json.dumps({"finished": False, "time_limit_s": args.time_limit, "partial": partial,
                          "summary": partial_text(partial),
                          "baseline": counts, "oracle": args.oracle, "log": str(args.out / "bisect.jsonl")}, indent=2))
        return 1
    print(f"bisection stopped at --time-limit {args.time_limit:g} s {partial_text(partial)}")
    print(f"its probes are in {args.out / 'bisect.jsonl'}; --resume goes on from them")
    return 1
