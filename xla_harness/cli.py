"""Command-line entry point: parse arguments, call library functions, map errors to exit codes.

Each subcommand lives in its own module exposing ``NAME``, ``HELP``, ``add_arguments(parser)``
and ``run(args) -> int``; this file only wires them together. Exit codes:
0 success, 1 the check found a problem (non-finite updates, hazards, wrong gradients),
2 bad input or usage (and, from the last-resort handler, any error the harness did not
foresee: one ``error: internal: ...`` line, the traceback only with ``--debug``, given before
or after the subcommand),
130/143 interrupted by SIGINT/SIGTERM, 141 stdout closed by its reader (``report | head``).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import signal
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

from xla_harness import _early
from xla_harness.errors import HarnessError, one_line
from xla_harness.runtime import interrupts
from xla_harness.runtime.interrupts import Interrupted

# (subcommand module) in the order shown by --help.
SUBCOMMANDS = (
    "xla_harness.commands.stress",
    "xla_harness.commands.triage",
    "xla_harness.commands.report",
    "xla_harness.commands.compare",
    "xla_harness.commands.merge",
    "xla_harness.commands.scan",
    "xla_harness.commands.memcheck",
    "xla_harness.commands.patches_check",
    "xla_harness.commands.pr",
    "xla_harness.commands.gradcheck",
    "xla_harness.commands.bisect_passes",
    "xla_harness.commands.bundle",
)


def version_line() -> str:
    """``xla-harness X.Y.Z (jax A, jaxlib B)``. jax's versions come from the installed distributions'
    metadata, not from importing jax (that takes seconds; --version must not)."""
    from importlib import metadata

    from xla_harness import __version__

    parts = []
    for dist in ("jax", "jaxlib"):
        try:
            parts.append(f"{dist} {metadata.version(dist)}")
        except (metadata.PackageNotFoundError, ValueError):
            parts.append(f"{dist} not installed")
    return f"xla-harness {__version__} ({', '.join(parts)})"


class _VersionAction(argparse.Action):
    """--version: the line is worked out only when asked for."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        sys.stdout.write(version_line() + "\n")
        parser.exit(0)


def _add_debug(parser: argparse.ArgumentParser, top: bool) -> None:
    """--debug, accepted before or after the subcommand (one definition for both places). The
    subcommand's copy has no default, so it never resets a --debug given before the subcommand."""
    parser.add_argument("--debug", action="store_true", default=False if top else argparse.SUPPRESS,
                        help="show the full traceback of an internal error (anywhere on the command line)")


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors as one ``error:`` line and exit 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(one_line(f"error: {self.prog}: {message} (see --help)") + "\n")
        raise SystemExit(2)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="xla-harness",
        description=(
            "Reproduce and localise intermittent non-finite (NaN/Inf) updates under XLA: "
            "stress-train tied-embedding models, scan compiled HLO for in-place fusions that "
            "read through a data-moving transpose/reshape, and check gradients."
        ),
        epilog="Exit codes: 0 ok, 1 problem found, 2 bad input or an internal error, 130/143 interrupted, "
               "141 output pipe closed.",
    )
    parser.add_argument("--version", action=_VersionAction,
                        help="print the harness's version and the installed jax/jaxlib versions, and exit")
    _add_debug(parser, top=True)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for modname in SUBCOMMANDS:
        mod = importlib.import_module(modname)
        p = sub.add_parser(mod.NAME, help=mod.HELP, description=getattr(mod, "DESCRIPTION", mod.HELP),
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        mod.add_arguments(p)
        _add_debug(p, top=False)
        p.set_defaults(_run=mod.run)
    return parser


def _check_paths(args: argparse.Namespace) -> None:
    """Refuse FIFOs, sockets and devices named on the command line: reading one can block forever."""
    for value in vars(args).values():
        for p in value if isinstance(value, list | tuple) else (value,):
            if isinstance(p, Path) and p.exists() and not (p.is_file() or p.is_dir()):
                raise HarnessError(f"{p} is not a regular file or folder")


def last_resort(exc: BaseException, debug: bool) -> int:
    """One ``error:`` line (and exit 2) for an exception no part of the harness mapped."""
    if debug:
        traceback.print_exception(exc)
    if isinstance(exc, UnicodeDecodeError):
        msg = f"input is not UTF-8 text ({exc.reason} at byte {exc.start})"
    elif isinstance(exc, OSError):
        where = f"{exc.filename}: " if exc.filename else ""
        msg = f"{where}{exc.strerror or exc}"
    elif isinstance(exc, RecursionError):
        msg = "input nested too deeply to process"
    elif isinstance(exc, MemoryError):
        msg = "out of memory"
    else:
        first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
        msg = f"internal: {type(exc).__name__}" + (f": {first}" if first else "") + \
            ("" if debug else " (run with --debug for the traceback)")
    sys.stderr.write(one_line(f"error: {msg}") + "\n")
    return 2


def quiet_broken_pipe() -> int:
    """stdout closed by the reader (``report | head``): stop quietly; 141 is 128 + SIGPIPE."""
    with contextlib.suppress(OSError, ValueError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 141


def interrupted(exc: Interrupted) -> int:
    sys.stderr.write(f"{exc}\n")
    return exc.exit_code


def guarded(entry: Callable[[list[str]], int], argv: list[str] | None = None, strip_debug: bool = False) -> int:
    """Run an entry point's main under the last-resort handler (``--debug`` shows tracebacks). Once
    SIGINT/SIGTERM has arrived, whatever it broke on its way (an import it cut short, which jaxlib
    reports as an ImportError) is the interrupt's, and one that was swallowed still ends the command
    as an interrupt: exit 130/143, never a traceback, an ``error: internal:`` or exit 0."""
    argv = sys.argv[1:] if argv is None else list(argv)
    debug = "--debug" in argv
    if strip_debug:
        argv = [a for a in argv if a != "--debug"]
    try:
        code = entry(argv)
    except BrokenPipeError:
        return quiet_broken_pipe()
    except Interrupted as exc:
        return interrupted(exc)
    except Exception as exc:  # noqa: BLE001 - the last resort: never a traceback, never exit 1
        signum = interrupts.received()
        if signum is not None:
            if debug:
                traceback.print_exception(exc)
            first = (str(exc).strip().splitlines() or [""])[0][:200]
            return interrupted(Interrupted(signum, "", f"{type(exc).__name__}" + (f": {first}" if first else "")))
        return last_resort(exc, debug)
    signum = interrupts.received()
    if signum is not None and code != 128 + signum:
        return interrupted(Interrupted(signum))
    return code


def main(argv: list[str] | None = None) -> int:
    """The ``xla-harness`` command (exit codes above). SIGINT/SIGTERM end it with 130/143 from its first
    line of code on (xla_harness/__init__.py notes a signal while the CLI starts)."""
    old = interrupts.cli_handlers()
    try:
        interrupts.take_pending()  # one noted while the CLI was still being imported
        code = guarded(_main, argv)
    except Interrupted as exc:
        code = interrupted(exc)
    finally:
        interrupts.restore(old)
    if code in (128 + signal.SIGINT, 128 + signal.SIGTERM) and _early.cli_process:
        # This process is the command, ended by a signal: end it now. A thread a library started and
        # the interrupt left running (jax's 60 s backend-start warning timer) must not hold it open.
        with contextlib.suppress(OSError, ValueError):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)
    return code


def _printable_output() -> None:
    """Text that cannot be encoded (a lone surrogate in a user's label) prints escaped, never as an
    encoding error halfway through a table."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(AttributeError, ValueError, OSError):
            stream.reconfigure(errors="backslashreplace")  # type: ignore[union-attr]


def _main(argv: list[str]) -> int:
    _printable_output()
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error (2, already reported)
        return exc.code if isinstance(exc.code, int) else 0
    try:
        _check_paths(args)
        from xla_harness.programs.interface import process_exit_guarded
        from xla_harness.targets.devices import pin_cpu_without_accelerators

        pin_cpu_without_accelerators()
        with process_exit_guarded():
            code = int(args._run(args) or 0)
        sys.stdout.flush()  # a closed pipe shows here, inside the handler
        return code
    except HarnessError as exc:
        sys.stderr.write(one_line(f"error: {exc}") + "\n")
        return exc.exit_code
    except Interrupted as exc:  # where it arrived, and what it broke there (never the program's error)
        return interrupted(exc)
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        return 130
    except ValueError as exc:
        bad = jax_environment_error(exc)
        if bad is None:
            raise
        sys.stderr.write(f"error: {bad}\n")
        return 2


def jax_environment_error(exc: ValueError) -> str | None:
    """What to say when jax refused a value of its own environment variables (``JAX_ENABLE_X64=maybe``,
    ``JAX_DEFAULT_MATMUL_PRECISION=bogus``: raised while jax reads its configuration), None for any
    other ValueError (a value set from code is the code's)."""
    import re

    text = str(exc)
    m = re.search(r"for environment '(JAX_\w+)'", text) or re.search(r"for JAX flag (jax_\w+)", text)
    if m is None:
        return None
    name = m.group(1).upper()
    if name not in os.environ:
        return None
    first = (text.strip().splitlines() or [""])[0][:200]
    return f"the environment sets {name}={os.environ[name]!r}, which jax refuses ({first}); fix or unset it"


if __name__ == "__main__":
    raise SystemExit(main())
