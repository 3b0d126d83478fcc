"""xla-harness merge: one table from the results of several hosts, processes or runs."""

from __future__ import annotations

from xla_harness.commands.report import add_arguments, show  # noqa: F401  (same arguments as report)

NAME = "merge"
HELP = "merge stress results folders (hosts, processes, runs) into one table and report gaps"
DESCRIPTION = """\
Read every stress*.jsonl (one per process: stress.p<i>.jsonl) in the given folders and
print one table; a step recorded by several processes of the same SPMD run counts once.
Gaps (a configuration or seed that a file's own spec asked for but whose steps it lacks,
e.g. a process that died) are listed under the table. Exit 1 when there are gaps.
"""


def run(args) -> int:
    return 1 if show(args).gaps else 0
