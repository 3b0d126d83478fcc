"""Command-line entry point: parse arguments, call library functions, map errors to exit codes.

Each subcommand lives in its own module exposing ``NAME``, ``HELP``, ``add_arguments(parser)``
and ``run(args) -> int``; this file only wires them together. Exit codes:
0 success, 1 the check found a problem (non-finite updates, hazards, wrong gradients),
2 bad input or usage, 130/143 interrupted by SIGINT/SIGTERM.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from harness.errors import HarnessError

# (subcommand module) in the order shown by --help.
SUBCOMMANDS = (
    "harness.commands.stress",
    "harness.commands.report",
    "harness.commands.compare",
    "harness.commands.merge",
    "harness.commands.scan",
    "harness.commands.patches_check",
    "harness.commands.pr",
    "harness.commands.gradcheck",
    "harness.commands.bisect_passes",
    "harness.commands.bundle",
)


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors as one ``error:`` line and exit 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"error: {self.prog}: {message} (see --help)\n")
        raise SystemExit(2)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="xla-harness",
        description=(
            "Reproduce and localise intermittent non-finite (NaN/Inf) updates under XLA: "
            "stress-train tied-embedding models, scan compiled HLO for in-place fusions that "
            "read through a data-moving transpose/reshape, and check gradients."
        ),
        epilog="Exit codes: 0 ok, 1 problem found, 2 bad input, 130/143 interrupted.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for modname in SUBCOMMANDS:
        mod = importlib.import_module(modname)
        p = sub.add_parser(mod.NAME, help=mod.HELP, description=getattr(mod, "DESCRIPTION", mod.HELP),
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error (2, already reported)
        return exc.code if isinstance(exc.code, int) else 0
    try:
        return int(args._run(args) or 0)
    except HarnessError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return exc.exit_code
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
