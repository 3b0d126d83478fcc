"""xla-harness report: print the table of one or more stress results folders."""

from __future__ import annotations

import sys
from pathlib import Path

NAME = "report"
HELP = "print the non-finite table of stress results folders"
DESCRIPTION = """\
Read OUT/stress*.jsonl from each folder and print the per-configuration table (per-seed
k/n, total, rate, one-sided exact 95% upper bound, seed spread). Several folders are combined;
configurations or seeds with missing steps are listed as gaps. A step counts once per
(spec fingerprint, label, seed, step); one label recorded by runs with different options
is refused unless --allow-mixed-specs; a step recorded twice with different outcomes is
reported as a warning.
"""


def add_arguments(p) -> None:
    from xla_harness.commands import flags

    p.add_argument("folders", nargs="+", type=Path, metavar="DIR", help="results folder(s)")
    flags.add_json_argument(p, "the table")
    p.add_argument("--plot", type=Path, metavar="PNG",
                   help="also write a PNG plot (an existing file only with --force; never a results file)")
    flags.add_force_argument(p, "the --plot file")
    p.add_argument("--allow-mixed-specs", action="store_true",
                   help="pool steps of one configuration label recorded by runs with different options "
                        "(refused by default: their steps are different trials)")


def show(args):
    """Print (and plot) the table of args.folders; returns it."""
    from xla_harness.commands import flags
    from xla_harness.stress import report

    if args.plot:  # before reading: a refused target costs nothing
        flags.check_output(args.plot, "--plot", flags.input_files(args.folders), args.force)
    table = report.load_table(args.folders, allow_mixed_specs=args.allow_mixed_specs)
    for w in table.warnings:
        sys.stderr.write(f"warning: {w}\n")
    print(report.dumps(table) if args.json else report.format_table(table))
    if args.plot:
        report.plot(table, args.plot)
    return table


def run(args) -> int:
    show(args)
    return 0
