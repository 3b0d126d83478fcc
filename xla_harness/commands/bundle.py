"""xla-harness bundle: a repro bundle for upstream, and --check to re-run one."""

from __future__ import annotations

import json
from pathlib import Path

from xla_harness.names import BUILTIN_PROGRAM

NAME = "bundle"
HELP = "write a repro bundle (env, config, HLO + buffer assignment, findings, stress, repro.py) or --check one"
DESCRIPTION = """\
Write FILE.tar.gz with: env.json (versions, device kinds, topology, XLA_*/LIBTPU_*/JAX_*/TPU_*
variables only), config.json, the optimized HLO and buffer assignment of the training step
(from --dump DIR, else compiled here with a dump), the scanner's findings on it, the stress
results (--results DIR, else a run of --seeds x --steps here), bisect.jsonl (--bisect DIR),
and a standalone repro.py (jax + numpy only for the built-in; a user's --program is bundled
as source under program/ and repro.py loads it) with the output it gave when bundled.
program/ holds the program file and every module it imported from its own folder or below it
(a sibling model.py, a package beside it, in their layout there), not the whole folder and never
installed packages; more than 500 files or 16 MiB of them is refused with one error line. The
output recorded in the bundle comes from its repro.py run in the bundle's own folder, so a
bundle missing a module the program needs is refused when it is made.

--check FILE never runs code from the archive (a user's program only with --run-program,
and then only the source bundled in program/: a config.json naming any other module is refused).
It proves: the files are those the manifest names (sha256 of each); repro.py is this
harness's own copy (or says it is not); findings.json equals a fresh scan of the bundled HLO
and stress/table.txt the table of the bundled rows; config.json is valid; and this harness's
repro.py, run on that config here (killed with its process group after --timeout seconds),
gives the bundled non-finite counts and losses. It does not prove env.json (where the bundle
was made) beyond its sha256 in the manifest, which whoever made the bundle could rewrite.
The re-run is bounded by the bundle's recorded work (steps x seeds; --max-steps, default 10000);
on SIGTERM, or when the harness is killed, the re-run is killed too and the temporary folder goes.
An expected.json with no seeds, other seeds or another number of losses than the re-run differs.
Exit 0: all same; 1: something differs; 2: unreadable.
"""


def add_arguments(p) -> None:
    from xla_harness.commands import flags

    p.add_argument("--out", type=Path, help="bundle to write (FILE.tar.gz)")
    p.add_argument("--check", type=Path, metavar="FILE", help="verify a bundle and re-run the harness's repro.py on it")
    p.add_argument("--timeout", type=flags.positive_number, default=1800.0, metavar="S",
                   help="--check: seconds the re-run may take before it is killed (default 1800)")
    p.add_argument("--max-steps", type=flags.positive, default=10_000, metavar="N",
                   help="--check: refuse to re-run a bundle of more than N steps in all (steps x seeds; "
                        "default 10000)")
    p.add_argument("--run-program", action="store_true",
                   help="--check of a user program's bundle: also run the program in its program/ folder "
                        "(code from the archive: read it first)")
    flags.add_json_argument(p, "the --check verdict and its lines (or the path of the written bundle)")
    flags.add_program_arguments(p)
    flags.add_single_config_arguments(p)
    p.add_argument("--seeds", type=flags.csv("seed", flags.seed), default=(1,))
    p.add_argument("--steps", type=flags.positive, default=20)
    p.add_argument("--dump", type=Path, help="XLA dump folder with the step's optimized HLO and buffer assignment")
    p.add_argument("--results", type=Path, help="stress results folder to include")
    p.add_argument("--bisect", type=Path, help="bisect-passes output folder to include")
    flags.add_target_argument(p)  # with tpu:/cuda:, the bundle also carries the step compiled for it
    flags.add_model_arguments(p)


def _check_inputs(args) -> None:
    """Every input and output before anything compiles or runs: the bundle and its ``.partial`` file
    must not exist (neither is ever replaced), each folder given must hold what the bundle takes from
    it (--results: valid results; --bisect: a bisection log; --dump: the step's HLO and buffer
    assignment), and the program's options must be its own."""
    from xla_harness.commands import flags
    from xla_harness.errors import HarnessError
    from xla_harness.repro.bundle import check_bisect_log, dump_files, partial_path

    if not str(args.out).endswith(".tar.gz"):
        raise HarnessError(f"--out must end in .tar.gz, got {args.out}")
    for path in (args.out, partial_path(args.out)):
        if path.exists() or path.is_symlink():
            raise HarnessError(f"{path} already exists; choose another --out (a bundle never replaces a file)")
    flags.check_output(args.out, "--out")  # its folder: not under a file
    for flag, folder in (("--dump", args.dump), ("--results", args.results), ("--bisect", args.bisect)):
        if folder is not None and not folder.is_dir():
            raise HarnessError(f"{flag} {folder} is not a folder")
    if args.results is not None:
        from xla_harness.stress.report import summary as report

        report.load_table([args.results])  # validates every results line
        _check_results_are_the_programs(args)
    if args.bisect is not None:
        check_bisect_log(args.bisect)
    if args.dump is not None:
        dump_files(args.dump)
    flags.program_options(args)  # a built-in's option table, before the compile


def _same_program(theirs: str, ours: str) -> bool:
    """Whether two --program texts name the same program: equal, or FILE.py:NAME with the same name and
    the same file (resolved from here; a file that is not here by that path: the same file name)."""
    if theirs == ours:
        return True
    if ":" not in theirs or ":" not in ours:
        return False
    (tf, tn), (of, on) = theirs.rsplit(":", 1), ours.rsplit(":", 1)
    if tn != on or not (tf.endswith(".py") and of.endswith(".py")):
        return False
    t, o = Path(tf), Path(of)
    return t.resolve() == o.resolve() if t.exists() else t.name == o.name


def _check_results_are_the_programs(args) -> None:
    """--results must be results of --program with its --program-option: a bundle whose results came
    from another program would replay one program against another's counts."""
    from xla_harness.commands import flags
    from xla_harness.errors import HarnessError
    from xla_harness.stress.results import store

    ours = json.loads(json.dumps(flags.program_options(args), default=str))
    for path in store.results_files(args.results):
        spec = store.read_results(path).header.spec
        theirs = str(spec.get("program", BUILTIN_PROGRAM))
        if not _same_program(theirs, args.program):
            raise HarnessError(f"--results {args.results} holds results of --program {theirs} ({path.name}), not of "
                               f"--program {args.program}: a bundle carries the program its results came from")
        options = spec.get("program_options") or {}
        if theirs != BUILTIN_PROGRAM and options != ours:
            raise HarnessError(f"--results {args.results} holds results of {theirs} with --program-option "
                               f"{options}, not {ours} ({path.name})")


def run(args) -> int:
    from xla_harness.errors import HarnessError
    from xla_harness.repro import bundle, bundle_check

    if args.check:
        if not args.timeout > 0:
            raise HarnessError(f"--timeout must be a positive number of seconds, got {args.timeout}")
        if args.max_steps <= 0:
            raise HarnessError(f"--max-steps must be a positive integer, got {args.max_steps}")
        same, lines = bundle_check.check_bundle(args.check, timeout=args.timeout, run_program=args.run_program,
                                                max_steps=args.max_steps)
        if args.json:
            print(json.dumps({"bundle": str(args.check), "same": same, "lines": lines}, indent=2))
        else:
            print("\n".join(lines))
        return 0 if same else 1
    if not args.out:
        raise HarnessError("give --out FILE.tar.gz to write a bundle, or --check FILE")
    _check_inputs(args)
    from xla_harness.commands import flags
    from xla_harness.targets.devices import prepare_environment
    from xla_harness.targets.envcheck import check_compiler_environment

    check_compiler_environment(args.target)
    prepare_environment(args.target)
    out = bundle.make_bundle(args.out, args.program, flags.program_options(args), tuple(args.seeds), args.steps,
                             dump=args.dump, results_dir=args.results, bisect_dir=args.bisect,
                             target=args.target)
    print(json.dumps({"bundle": str(out)}, indent=2) if args.json else out)
    return 0
