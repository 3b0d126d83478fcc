"""xla-harness stress: run the tied-embedding stress matrix and print the table."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from xla_harness.commands import flags
from xla_harness.errors import HarnessError
from xla_harness.names import (
    BLOCK_ROWS,
    BUILTIN_PROGRAM,
    COMMITS,
    COMPILE_RESULTS,
    DEFAULT_REPLAYS,
    EXPLAIN_MAX_STEPS,
    INJECT_KINDS,
    PROTOCOLS,
)
from xla_harness.runtime import interrupts
from xla_harness.stress.distributed import ensure_host_devices, init_distributed
from xla_harness.stress.progress import Progress
from xla_harness.stress.stopping import STOP_GRACE_S, StopFlag

DEFAULT_OUT = Path("out/stress")

NAME = "stress"
HELP = "call a training step again and again (yours with --program) and count non-finite steps"
DESCRIPTION = """\
Run a program's training step (--program FILE.py:NAME, MODULE:NAME, or the built-in
tied-embedding family for every (mode, remat) configuration) for every seed, compiled
exactly as a plain jax.jit of it (the fingerprint printed first proves it), check its
outputs in a separate jitted checker (loss, new parameters, new optimizer state, grads and
updates when exposed) and print a table of non-finite steps per configuration with the
one-sided exact 95% upper bound and the spread between seeds.

Protocols: train (a trajectory; a non-finite step is rolled back, parameters and optimizer
state, so every step is one trial) and frozen (the reporter's: identical inputs every call).
Built-in modes: full (lookup and output projection both differentiate the tied matrix W),
sparse_only (untied output matrix), dense_only (lookup under stop_gradient).

Workaround variants (--variants baseline,barrier,onehot,sumgrad,xla-no-fusion) multiply
the matrix: each variant is compiled separately in the same run and every row is
compared with the baseline row of its configuration (two-sided Fisher exact p, and the
largest relative loss difference at the same seed and step).

Results are appended to OUT/stress.jsonl (flushed and fsynced per block of --block
steps); --resume continues an interrupted run without repeating or skipping steps.
SIGINT/SIGTERM finish the current step, flush, print the partial table and exit 130/143;
a step (or a program import) still running --stop-grace seconds after the signal, or a
second signal, ends the run at once with what was written kept (exit 130/143).

On CPU and GPU a zero count is the expected outcome for the stock compiler: the
reported failure (jax-ml/jax#35409) was seen on TPU v6e, whose compiler is in libtpu.
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    flags.add_program_arguments(p)
    p.add_argument("--protocol", choices=PROTOCOLS, default="train",
                   help="train: a trajectory (new batch each step, donated state, a non-finite step is "
                        "rolled back, params and optimizer state); frozen: the same params, optimizer "
                        "state and batch on every call, no donation, each call an independent trial "
                        "(default train)")
    p.add_argument("--modes", type=flags.csv("mode", str), default=("full", "sparse_only", "dense_only"),
                   help="built-in: comma-separated modes full,sparse_only,dense_only (default all three)")
    p.add_argument("--remat", type=flags.csv("remat", flags.onoff), default=(True, False),
                   help="built-in: comma-separated remat settings on,off (default both)")
    p.add_argument("--dtype", default="f32", help="built-in: parameter dtype f32 or bf16 (default f32)")
    p.add_argument("--variants", type=flags.csv("variant", str), default=(), metavar="LIST",
                   help="workaround variants as a matrix axis, baseline first: program variants (barrier, "
                        "onehot, sumgrad; the program's factory must take variant=), compiler-flag sets "
                        "(xla-no-fusion; deterministic: XLA's GPU deterministic-ops flag) or both "
                        "(barrier+xla-no-fusion); each is compiled separately and "
                        "its row compared with the baseline's (Fisher exact test, loss trajectory)")
    p.add_argument("--seeds", type=flags.csv("seed", flags.seed), default=(1, 2, 3, 4),
                   help="comma-separated integer seeds (default 1,2,3,4)")
    p.add_argument("--steps", type=flags.positive, default=20, help="calls of the step per (config, seed) (default 20)")
    p.add_argument("--devices", type=flags.positive, default=None,
                   help="built-in: shard over N devices (batch split, W sharded on the vocab axis); the #35409 "
                        "preset, and with --compile-only any program whose factory takes devices=, gets "
                        "devices=N (a --program-option devices= that differs is refused); on CPU the host "
                        "platform is split into N devices for any program (default 1; with --target tpu:/cuda:, "
                        "all of the target's devices)")
    p.add_argument("--out", type=Path, default=None,
                   help="results folder (default out/stress; with --compile-only, none unless given); refuses to "
                        "overwrite existing results")
    p.add_argument("--resume", action="store_true", help="continue the results already in --out")
    p.add_argument("--stop-grace", type=flags.seconds, default=STOP_GRACE_S, metavar="S",
                   help="after SIGINT/SIGTERM, how long the current step may still run before the run ends "
                        "without it (results written so far are kept; --resume redoes the rest) "
                        f"(default {STOP_GRACE_S:g})")
    p.add_argument("--inject", choices=INJECT_KINDS, default="nan",
                   help="fault to inject into the step's output between calls: nan (one element of the target "
                        "parameter), nan-opt / inf-opt (Adam's second moment of it), lost-row / doubled-row "
                        "(one row of its update lost or applied twice: finite, for --reference) (default nan)")
    p.add_argument("--inject-rate", type=flags.rate, default=0.0, metavar="P",
                   help="inject with probability P per step, keyed by (seed, step); injected steps are "
                        "recorded (proves the detector and the statistics)")
    p.add_argument("--reference", action="store_true",
                   help="recompute steps in float64 on the CPU and flag finite-but-wrong updates per leaf and "
                        "per matrix row (silent corruption); without it finite errors are not looked for, "
                        "and the table says so")
    p.add_argument("--reference-every", type=flags.positive, default=1, metavar="N",
                   help="with --reference: check every N'th step only; the table says how many were checked "
                        "(default 1: every step)")
    p.add_argument("--explain", action="store_true",
                   help="after each configuration's steps, say whose each of its first failing steps' NaN is: "
                        "input (a non-finite batch or state before the step that the failure descends from), "
                        "race (a replay from the same state and batch is finite, or non-finite elsewhere), "
                        "program (op by op in float32 and float64 both non-finite: the equation and your "
                        "file:line), precision (float64 finite), compiler (op by op finite, every replay "
                        "non-finite) or unknown (why); one 'origin' line per step in the results file. Nothing "
                        "measured changes: the state before a failing step is the one its rollback rebuilds, "
                        "copied to OUT/origins/ (default off)")
    p.add_argument("--explain-max", type=flags.positive, default=EXPLAIN_MAX_STEPS, metavar="N",
                   help="with --explain: the first N failing steps of each configuration get an origin (frozen: "
                        f"one per seed); each costs --explain-replays compiled steps and about two eager steps "
                        f"(default {EXPLAIN_MAX_STEPS})")
    p.add_argument("--explain-replays", type=flags.positive, default=DEFAULT_REPLAYS, metavar="N",
                   help=f"with --explain: replays of the compiled step from the state before a failing step "
                        f"(default {DEFAULT_REPLAYS})")
    p.add_argument("--commit", choices=COMMITS, default="block",
                   help="train protocol; both count a step by its first execution from a finite state and "
                        "roll back a step whose new state is not finite. block feeds the step's outputs "
                        "straight back, writes one row per step on the device (loss, first non-finite value, "
                        "state finite) fetched once per block while the next runs, and copies the state on "
                        "the device at each block's start; a rollback reruns at most one block from that "
                        "copy (reruns are never counted; those that differ are reported apart). step checks "
                        "and commits every step against a second copy of the state (default block)")
    p.add_argument("--block", type=flags.positive, default=None, metavar="K",
                   help="steps per block: per fetch and results line (--commit block, at most 1024), per "
                        "host sync and results line otherwise (default: block chooses K from the measured "
                        "cost of a block's fetch and records and the failure rate seen so far, starting from "
                        "one timed step; 10 otherwise)")
    p.add_argument("--checkpoint-seconds", type=flags.seconds, default=300.0, metavar="S",
                   help="train protocol: save the state for --resume at most every S seconds and when the run "
                        "is stopped (SIGINT/SIGTERM) before a (config, seed) ends; a finished (config, seed) "
                        "needs none and writes none (default 300)")
    flags.add_model_arguments(p)
    flags.add_json_argument(p, "the table")
    p.add_argument("--plot", type=Path, metavar="PNG",
                   help="also write a PNG plot of rates with CIs (checked before the run: an existing file only "
                        "with --force; never a results file)")
    flags.add_force_argument(p, "the --plot file")
    p.add_argument("--fail-on-nonfinite", action="store_true",
                   help="exit 1 when any step was non-finite (default: exit 0, the table is the result)")
    shown = p.add_mutually_exclusive_group()
    shown.add_argument("--quiet", action="store_true", help="no progress output on stderr")
    shown.add_argument("--progress", action="store_true",
                       help="progress as plain lines on stderr, for logs: one per finished configuration and "
                            "about every 30 s while one runs (default: one status line rewritten in place when "
                            "stderr is a terminal, nothing otherwise)")
    g = p.add_argument_group("compile only (nothing runs: fingerprint and scan what the compiler made)")
    g.add_argument("--compile-only", action="store_true",
                   help="compile every configuration and variant for --target, print one fingerprint and scan "
                        "line each and run no step; with --out, OUT/compile.jsonl gets one record per "
                        "configuration and OUT/hlo/ the HLO and buffer assignment, and on a real GPU the "
                        "autotune results its device chose (*.autotune.txt, for --autotune-results) (--resume "
                        "skips what is recorded). Exit 1 when a scan finds a hazard")
    flags.add_target_argument(g)
    flags.add_autotune_argument(g)
    g = p.add_argument_group("multi-host (jax.distributed)")
    g.add_argument("--distributed", action="store_true",
                   help="initialise jax.distributed from the environment (TPU VM / cluster defaults)")
    g.add_argument("--coordinator", metavar="HOST:PORT", help="coordinator address (process 0's host)")
    g.add_argument("--num-processes", type=flags.positive, help="number of processes")
    g.add_argument("--process-id", type=flags.non_negative, help="this process's index")
    g.add_argument("--init-timeout", type=flags.positive, default=300, metavar="S",
                   help="seconds to wait for the coordinator (default 300)")


def format_fingerprints(fps: dict[str, dict]) -> list[str]:
    out = []
    for label, fp in fps.items():
        donate = tuple(fp["donate_argnums"])
        out.append(f"step fingerprint {label}: {fp['id']} = plain jax.jit(step, donate_argnums={donate}) "
                   f"({fp['instructions']} instructions, temp {fp['temp_size_in_bytes']} B, "
                   f"aliased {fp['alias_size_in_bytes']} B)")
    return out


def spec_from_args(args):
    from xla_harness.stress.spec import StressSpec

    if args.steps <= 0:
        raise HarnessError(f"--steps must be a positive integer, got {args.steps}")
    if args.program == BUILTIN_PROGRAM and args.program_option:
        raise HarnessError("--program-option is for user programs; the built-in takes the model flags")
    if args.protocol == "frozen" and args.commit == "step":
        raise HarnessError("--commit is for the train protocol (how a trajectory's steps are committed); the frozen "
                           "protocol checks every call against the same inputs: drop --commit step")
    if args.protocol == "train" and args.commit == "block" and args.block is not None and args.block > BLOCK_ROWS:
        raise HarnessError(f"--block must be at most {BLOCK_ROWS} with --commit block (a block's rows live in one "
                           f"array of {BLOCK_ROWS} on the device), got {args.block}")
    return StressSpec(
        modes=args.modes, remats=args.remat, seeds=args.seeds, steps=args.steps, dtype=args.dtype,
        devices=args.devices or 1, inject_rate=args.inject_rate, inject=args.inject, reference=args.reference,
        reference_every=args.reference_every, block=args.block, learning_rate=args.lr,
        vocab=args.vocab, d_model=args.d_model, layers=args.layers, heads=args.heads, seq=args.seq,
        batch=args.batch, program=args.program, program_options=tuple(sorted(dict(args.program_option).items())),
        protocol=args.protocol, checkpoint_seconds=args.checkpoint_seconds, variants=args.variants,
        commit=args.commit)


def _program_options(args) -> dict:
    """--program-option checked (a built-in's option table), with --devices N as ``devices=N`` where the
    program is compiled for a target (--compile-only) or is a built-in (its factory takes devices=); a
    user's program run here sees the host split into N devices. A --program-option devices= that
    differs from --devices is refused either way."""
    from xla_harness.programs.interface import BUILTINS

    if args.program == BUILTIN_PROGRAM:
        if args.program_option:
            raise HarnessError("--program-option is for user programs; the built-in takes the model flags")
        return {}
    opts = flags.checked_program_options(args)
    merged = flags.with_devices(opts, args.devices)  # refuses a disagreement
    return merged if args.compile_only or args.program in BUILTINS else opts


def _check_compile_only(args) -> None:
    """--target tpu:/cuda: compiles only; --compile-only takes none of the flags that run steps."""
    if not args.target.is_host and not args.compile_only:
        raise HarnessError(f"--target {args.target} compiles ahead of time for hardware this machine lacks; "
                           "add --compile-only (no step can run)")
    if not args.compile_only:
        return
    if args.resume and args.out is None:
        raise HarnessError("--resume needs --out with --compile-only (the folder whose records it continues)")
    for flag, given in (("--plot", args.plot is not None), ("--reference", args.reference),
                        ("--explain", args.explain),
                        ("--inject-rate", args.inject_rate > 0), ("--fail-on-nonfinite", args.fail_on_nonfinite),
                        ("--distributed", args.distributed or args.coordinator or args.num_processes)):
        if given:
            raise HarnessError(f"{flag} needs steps to run; --compile-only runs none")


def run_compile_only(args) -> int:
    """stress --compile-only: compile each configuration for --target, print fingerprint and scan lines."""
    import json

    from xla_harness.targets.devices import prepare_environment

    prepare_environment(args.target)
    if args.target.is_host:
        ensure_host_devices(args.devices or 1)
    from xla_harness.stress.compile_only.run import compile_matrix
    from xla_harness.targets.devices import target_devices

    if args.devices is None and not args.target.is_host and args.program == BUILTIN_PROGRAM:
        args.devices = len(target_devices(args.target))
    spec = spec_from_args(args)
    records = []
    hazards = 0

    def started(label: str) -> None:
        if not args.quiet:
            sys.stderr.write(f"compiling {label} for {args.target}...\n")

    with interrupts.raising_on_signal():  # a compile keeps nothing half done: stop at once, saying where
        for rec in compile_matrix(spec, args.target, out=args.out, resume=args.resume, on_start=started):
            records.append(rec.record)
            hazards += rec.record["scan"]["hazard"] + rec.record["scan"]["decisions"]
            if not args.json:
                print(rec.line(), flush=True)
    if args.json:
        print(json.dumps({"target": args.target.text, "configurations": records}, indent=2))
    elif not records:
        print(f"every configuration is already recorded in {args.out} for {args.target}")
    return 1 if hazards else 0


def _check_outputs(args) -> None:
    """Every output path before anything runs: --plot (an existing file only with --force, never a
    results file), and --out holding results of the other kind (stress results for --compile-only,
    compile records for a stress run): one folder, one kind, so neither run starts beside the other's
    records or --resume continues a run it did not write."""
    out = args.out if args.out is not None else (None if args.compile_only else DEFAULT_OUT)
    if args.plot is not None:
        flags.check_output(args.plot, "--plot", flags.input_files([out]), args.force)
    if out is None or not out.is_dir():
        return
    stress_results = sorted(p.name for p in out.glob("stress*.jsonl"))
    if args.compile_only and stress_results:
        raise HarnessError(f"--out {out} holds stress results ({stress_results[0]}), not compile-only records; "
                           "--compile-only writes to a folder of its own")
    if not args.compile_only and (out / COMPILE_RESULTS).exists():
        raise HarnessError(f"--out {out} holds stress --compile-only records ({COMPILE_RESULTS}), not stress "
                           "results; a stress run writes to a folder of its own")


def _print_results(args, table, fingerprints: dict, path: Path) -> None:
    """The table (--json: as JSON), after the fingerprints; with --explain, whose each explained
    failing step's NaN is."""
    from xla_harness.stress.report import as_json as report_json
    from xla_harness.stress.report import summary as report

    origins = report.load_origins([path.parent]) if args.explain else None
    if args.json:
        print(report_json.dumps(table, fingerprints=fingerprints, origins=origins))
        return
    for line in format_fingerprints(fingerprints):
        print(line)
    print(report.format_table(table))
    if origins is not None:
        print(report.format_origins(origins, table.total_nonfinite))


def run(args) -> int:
    _check_compile_only(args)
    _check_outputs(args)
    args.program_option = list(_program_options(args).items())  # before --devices takes its default
    from xla_harness.targets.envcheck import check_compiler_environment

    check_compiler_environment(args.target)  # XLA_FLAGS, LIBTPU_INIT_ARGS, JAX_PLATFORMS: before jax starts
    flags.apply_autotune_argument(args)  # into XLA_FLAGS, before jax starts
    if args.compile_only:
        return run_compile_only(args)
    args.devices = args.devices or 1
    args.out = args.out or DEFAULT_OUT
    nproc = args.num_processes or 1
    if args.explain and (nproc > 1 or args.distributed or args.coordinator):
        raise HarnessError("--explain runs in one process (its replays and op-by-op evaluation are this process's "
                           "alone); explain a multi-process run's failures by running one of its processes alone")
    if args.devices % nproc:
        raise HarnessError(f"--devices {args.devices} must be divisible by --num-processes {nproc}")
    ensure_host_devices(args.devices // nproc)
    from xla_harness.stress.explain import ExplainSpec
    from xla_harness.stress.report import plot as report_plot
    from xla_harness.stress.report import summary as report
    from xla_harness.stress.runner import run_matrix

    spec = spec_from_args(args)
    count = init_distributed(args.coordinator, args.num_processes, args.process_id, args.distributed,
                             args.init_timeout)
    import jax

    from xla_harness.programs.variants import check_variants

    check_variants(spec.variants, jax.default_backend())  # a flag set this backend lacks: refused up front

    name = f"stress.p{jax.process_index()}.jsonl" if count > 1 else "stress.jsonl"
    stop = StopFlag(args.stop_grace, results=lambda: str(Path(args.out) / name))
    stop.install()
    bar = Progress("off" if args.quiet else "lines" if args.progress else "auto")
    explain = ExplainSpec(args.explain_max, args.explain_replays) if args.explain else None

    def log(line: str) -> None:
        if not args.quiet:
            bar.close()
            sys.stderr.write(line + "\n")
            sys.stderr.flush()

    try:
        with flags.stdout_to_stderr(args.json):  # the program's own prints: stdout is the JSON's
            path = run_matrix(spec, args.out, resume=args.resume, should_stop=stop, on_event=bar,
                              results_name=name, explain=explain, log=log)
    finally:
        stop.restore()
        bar.close()
    if count > 1 and jax.process_index() != 0:
        print(f"process {jax.process_index()}: results in {path}; process 0 prints the merged table")
        return 128 + stop.signum if stop.signum is not None else 0
    table = report.load_table([path.parent])
    for w in table.warnings:
        sys.stderr.write(f"warning: {w}\n")
    _print_results(args, table, bar.fingerprints, path)
    if args.plot:
        report_plot.plot(table, args.plot)
    sys.stdout.flush()
    if stop.signum is not None:
        sys.stderr.write(f"interrupted: partial results in {path}; continue with --resume\n")
        return 128 + stop.signum
    if args.fail_on_nonfinite and table.total_nonfinite:
        return 1
    return 0
