"""xla-harness bundle: a repro bundle for upstream, and --check to re-run one."""

from __future__ import annotations

from pathlib import Path

NAME = "bundle"
HELP = "write a repro bundle (env, config, HLO + buffer assignment, findings, stress, repro.py) or --check one"
DESCRIPTION = """\
Write FILE.tar.gz with: env.json (versions, device kinds, topology, XLA_*/LIBTPU_*/JAX_*/TPU_*
variables only), config.json, the optimized HLO and buffer assignment of the training step
(from --dump DIR, else compiled here with a dump), the scanner's findings on it, the stress
results (--results DIR, else a run of --seeds x --steps here), bisect.jsonl (--bisect DIR),
and a standalone repro.py (jax + numpy only) with the output it gave when bundled.

--check FILE re-runs repro.py and compares non-finite counts and losses: exit 0 same, 1 different.
"""


def add_arguments(p) -> None:
    from harness.commands import flags

    p.add_argument("--out", type=Path, help="bundle to write (FILE.tar.gz)")
    p.add_argument("--check", type=Path, metavar="FILE", help="re-run a bundle and compare")
    flags.add_program_arguments(p)
    flags.add_single_config_arguments(p)
    p.add_argument("--seeds", type=flags.csv("seed", int), default=(1,))
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--dump", type=Path, help="XLA dump folder with the step's optimized HLO and buffer assignment")
    p.add_argument("--results", type=Path, help="stress results folder to include")
    p.add_argument("--bisect", type=Path, help="bisect-passes output folder to include")
    flags.add_model_arguments(p)


def run(args) -> int:
    from harness.errors import HarnessError
    from harness.repro import bundle

    if args.check:
        same, lines = bundle.check_bundle(args.check)
        print("\n".join(lines))
        return 0 if same else 1
    if not args.out:
        raise HarnessError("give --out FILE.tar.gz to write a bundle, or --check FILE")
    if args.steps <= 0:
        raise HarnessError(f"--steps must be a positive integer, got {args.steps}")
    from harness.commands import flags

    out = bundle.make_bundle(args.out, args.program, flags.program_options(args), tuple(args.seeds), args.steps,
                             dump=args.dump, results_dir=args.results, bisect_dir=args.bisect)
    print(out)
    return 0
