"""xla-harness merge: one table from the results of several hosts, processes or runs."""

from __future__ import annotations

from pathlib import Path

NAME = "merge"
HELP = "merge stress results folders (hosts, processes, runs) into one table and report gaps"
DESCRIPTION = """\
Read every stress*.jsonl (one per process: stress.p<i>.jsonl) in the given folders and
print one table; a step recorded by several processes of the same SPMD run counts once.
Gaps (a configuration or seed that a file's own spec asked for but whose steps it lacks,
e.g. a process that died) are listed under the table. Exit 1 when there are gaps.
"""


def add_arguments(p) -> None:
    p.add_argument("folders", nargs="+", type=Path, metavar="DIR")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--plot", type=Path, metavar="PNG", help="also write a PNG plot")


def run(args) -> int:
    from harness import report

    table = report.load_table(args.folders)
    print(report.dumps(table) if args.json else report.format_table(table))
    if args.plot:
        report.plot(table, args.plot)
    return 1 if table.gaps else 0
