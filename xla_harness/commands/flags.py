"""Flags shared by several subcommands, each declared once here."""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
from collections.abc import Iterator
from pathlib import Path

from xla_harness.errors import HarnessError
from xla_harness.names import BUILTIN_PROGRAM, COMPILE_RESULTS


def csv(kind: str, conv):
    """argparse type: a non-empty comma-separated list converted by ``conv``."""
    def parse(text: str):
        items = [t.strip() for t in text.split(",") if t.strip()]
        if not items:
            raise argparse.ArgumentTypeError(f"empty {kind} list")
        try:
            values = tuple(conv(t) for t in items)
        except (ValueError, KeyError):
            raise argparse.ArgumentTypeError(f"invalid {kind} list {text!r}") from None
        except argparse.ArgumentTypeError as exc:
            raise argparse.ArgumentTypeError(f"invalid {kind} list {text!r}: {kind} {exc}") from None
        for i, v in enumerate(values):
            if v in values[:i]:
                raise argparse.ArgumentTypeError(f"{kind} {items[i]!r} is listed twice in {text!r}")
        return values
    return parse


def onoff(t: str) -> bool:
    return {"on": True, "off": False, "true": True, "false": False, "1": True, "0": False}[t.lower()]


def _integer(t: str) -> int:
    try:
        return int(t)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {t!r}") from None


def positive(t: str) -> int:
    v = _integer(t)
    if v <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {v}")
    return v


def _number(t: str) -> float:
    """A finite float (nan and inf are refused: no flag of the harness means them)."""
    try:
        v = float(t)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {t!r}") from None
    if not math.isfinite(v):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {t!r}")
    return v


def rate(t: str) -> float:
    """A probability in [0, 1]."""
    v = _number(t)
    if not 0.0 <= v <= 1.0:
        raise argparse.ArgumentTypeError(f"must be in [0, 1], got {t!r}")
    return v


def open_fraction(t: str) -> float:
    """A number strictly between 0 and 1 (a significance level)."""
    v = _number(t)
    if not 0.0 < v < 1.0:
        raise argparse.ArgumentTypeError(f"must be in (0, 1), got {t!r}")
    return v


def positive_number(t: str) -> float:
    """A finite number > 0 (a learning rate, a timeout in seconds)."""
    v = _number(t)
    if v <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {t!r}")
    return v


def seconds(t: str) -> float:
    """A finite number of seconds >= 0."""
    v = _number(t)
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be a non-negative number of seconds, got {t!r}")
    return v


def non_negative(t: str) -> int:
    """An integer >= 0 (an index)."""
    v = _integer(t)
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be a non-negative integer, got {v}")
    return v


SEED_LIMIT = 2**31


def seed(t: str) -> int:
    """A seed: an integer in [0, 2**31)."""
    try:
        v = int(t)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {t!r}") from None
    if not 0 <= v < SEED_LIMIT:
        raise argparse.ArgumentTypeError(f"must be in [0, 2**31), got {v}")
    return v


def _option(text: str) -> tuple[str, object]:
    from xla_harness.programs.options import literal_option

    try:
        return literal_option(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def folder(text: str) -> Path:
    """argparse type of an output folder: a path, never the empty string (which would be the current
    directory)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path; name a folder")
    return Path(text)


@contextlib.contextmanager
def stdout_to_stderr(enabled: bool) -> Iterator[None]:
    """With ``--json``, whatever is written to stdout meanwhile (the user's program printing at import,
    ``jax.debug.print`` in its step: file descriptor 1 itself, so C code too) goes to stderr, so that
    stdout carries the JSON alone, printed after the block; restored however the block ends."""
    if not enabled:
        yield
        return
    sys.stdout.flush()
    saved, stream = os.dup(1), sys.stdout
    try:
        os.dup2(2, 1)
        sys.stdout = sys.stderr  # Python's own stream too, wherever it writes (a caller may have replaced it)
        yield
    finally:
        with contextlib.suppress(OSError, ValueError):
            sys.stdout.flush()
        sys.stdout = stream
        os.dup2(saved, 1)
        os.close(saved)


def add_json_argument(p: argparse.ArgumentParser, what: str = "the result") -> None:
    """--json: the same verdict and figures as the text output, as one JSON document on stdout
    (the exit code does not change)."""
    p.add_argument("--json", action="store_true",
                   help=f"print {what} as JSON on stdout instead of text (same verdict, same exit code)")


def add_program_arguments(p: argparse.ArgumentParser) -> None:
    """--program and --program-option: which TrainProgram a command works on."""
    g = p.add_argument_group("program (see xla_harness/programs/interface.py)")
    g.add_argument("--program", default=BUILTIN_PROGRAM, metavar="PROGRAM",
                   help="the training program: a built-in (tied-embedding, the default), FILE.py:NAME or "
                        "MODULE:NAME naming a TrainProgram or a function returning one")
    g.add_argument("--program-option", type=_option, action="append", default=[], metavar="KEY=VALUE",
                   help="keyword argument for a program factory (repeatable; VALUE is a Python literal "
                        "or a string); the built-in takes its options from the model flags instead")


def target(text: str):
    """argparse type of --target: a :class:`xla_harness.targets.Target`."""
    from xla_harness.targets import parse_target

    try:
        return parse_target(text)
    except HarnessError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix(f"--target {text}: ")) from None


def add_target_argument(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """--target: which compiler compiles the step (host, tpu:GEN:SHAPE, cuda:KIND[:TOPO])."""
    from xla_harness.targets import HOST

    p.add_argument("--target", type=target, default=HOST, metavar="TARGET",
                   help="compile for: host (this machine's backend, the default), tpu:GEN:SHAPE with libtpu "
                        "(v4, v5e, v5p, v6e; e.g. tpu:v6e:2x4) or cuda:KIND[:TOPO] with the CUDA plugin (h100, "
                        "a100; e.g. cuda:h100 = 1x1x8), ahead of time: no TPU or GPU needed, nothing runs "
                        "(pip install 'xla-harness[tpu]' / '[cuda]', or make setup-targets)")


def add_autotune_argument(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """--autotune-results FILE: XLA's GPU autotune results loaded into the compile."""
    p.add_argument("--autotune-results", type=Path, default=None, metavar="FILE",
                   help="load these GPU autotune results into the compile (XLA's "
                        "--xla_gpu_load_autotune_results_from, added to XLA_FLAGS; binary unless the name ends in "
                        ".txt or .textproto): what a device's autotuner chose (stress --compile-only --out on a GPU "
                        "writes them beside its HLO), so an ahead-of-time cuda: compile makes the same choices")


def apply_autotune_argument(args: argparse.Namespace) -> None:
    """Put --autotune-results into XLA_FLAGS (before jax starts); HarnessError for a file that cannot be
    read or a target without a GPU autotuner."""
    if getattr(args, "autotune_results", None) is None:
        return
    from xla_harness.targets.devices import load_autotune_results

    load_autotune_results(args.autotune_results, args.target)


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("built-in tied-embedding model size")
    g.add_argument("--vocab", type=positive, default=256, help="vocabulary size V (default 256)")
    g.add_argument("--d-model", type=positive, default=64, help="model width D (default 64)")
    g.add_argument("--layers", type=positive, default=2, help="decoder layers (default 2)")
    g.add_argument("--heads", type=positive, default=4, help="attention heads (default 4)")
    g.add_argument("--seq", type=positive, default=16, help="sequence length of batch A; batch B is 2x (default 16)")
    g.add_argument("--batch", type=positive, default=8, help="batch size (default 8)")
    g.add_argument("--lr", type=positive_number, default=1e-3, help="Adam learning rate (default 1e-3)")


def add_single_config_arguments(p: argparse.ArgumentParser) -> None:
    """One configuration of the built-in (commands that compile one program)."""
    p.add_argument("--mode", default="full", help="built-in model mode: full, sparse_only, dense_only (default full)")
    p.add_argument("--remat", choices=["on", "off"], default="on", help="built-in model remat (default on)")
    p.add_argument("--dtype", default="f32", help="built-in model dtype: f32 or bf16 (default f32)")


def model_options(args, **fixed) -> dict:
    """The built-in's keyword options from the model flags."""
    return {"vocab": args.vocab, "d_model": args.d_model, "layers": args.layers, "heads": args.heads,
            "seq": args.seq, "batch": args.batch, "learning_rate": args.lr, **fixed}


def program_options(args) -> dict:
    """Keyword options for the program of a single-configuration command: the built-in's from the model
    flags; any other program's from --program-option, checked against its option table where it is a
    built-in with one, and with --devices N as ``devices=N`` (:func:`with_devices`)."""
    if args.program == BUILTIN_PROGRAM:
        if args.program_option:
            raise HarnessError("--program-option is for user programs; the built-in takes the model flags")
        opts = model_options(args, mode=args.mode, remat=args.remat == "on", dtype=args.dtype)
        if (getattr(args, "devices", None) or 1) > 1:
            opts["devices"] = args.devices
        return opts
    return with_devices(checked_program_options(args), getattr(args, "devices", None))


def checked_program_options(args) -> dict:
    """--program-option as a dict: each key once, checked against the program's option table (a built-in
    with one), before jax starts."""
    from xla_harness.programs.interface import check_program_options

    opts: dict = {}
    for key, value in args.program_option:
        if key in opts and opts[key] != value:
            raise HarnessError(f"--program-option {key} is given twice ({opts[key]!r} and {value!r})")
        opts[key] = value
    check_program_options(args.program, opts)
    return opts


def with_devices(options: dict, devices: int | None) -> dict:
    """A program's options with --devices N: ``devices=N``, unless --program-option devices= says the
    same; a different count is refused (neither may silently win)."""
    if devices is None:
        return options
    if "devices" in options and options["devices"] != devices:
        raise HarnessError(f"--devices {devices} and --program-option devices={options['devices']!r} disagree; "
                           "give one")
    return {**options, "devices": devices}


def add_force_argument(p: argparse.ArgumentParser, what: str = "the output file") -> None:
    """--force: let an output replace an existing file (never one of the command's own inputs)."""
    p.add_argument("--force", action="store_true",
                   help=f"replace {what} when it already exists (an input of the command is never replaced)")


def _resolved(path: Path) -> Path:
    try:
        return Path(path).expanduser().resolve()
    except (OSError, RuntimeError):
        return Path(os.path.abspath(path))


def input_files(paths, results_in_folders: bool = True) -> set[Path]:
    """The resolved paths a command reads: each given path and, for a folder, its stress*.jsonl
    results files (and, with ``results_in_folders=False``, every file under it)."""
    out: set[Path] = set()
    for p in paths:
        if p is None:
            continue
        p = Path(p)
        out.add(_resolved(p))
        try:
            if p.is_dir():
                found = p.glob("stress*.jsonl") if results_in_folders else p.rglob("*")
                out.update(_resolved(f) for f in found if f.is_file())
        except OSError:
            continue
    return out


RESULTS_FILES = (COMPILE_RESULTS,)  # besides stress*.jsonl


def _first_line(path: Path) -> bytes:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO must not block this look
    except OSError:
        return b""
    try:
        return os.read(fd, 4096).split(b"\n", 1)[0] if os.path.isfile(path) else b""
    except OSError:
        return b""
    finally:
        os.close(fd)


def _is_results_file(path: Path) -> bool:
    """A results file: stress*.jsonl, compile.jsonl, or its first line is a stress results header or a
    compile record."""
    name = path.name
    if (name.startswith("stress") and name.endswith(".jsonl")) or name in RESULTS_FILES:
        return True
    first = _first_line(path).lstrip()
    return first.startswith(b"{") and b'"kind"' in first and (b'"header"' in first or b'"compile"' in first)


def protected(path: Path) -> str | None:
    """What ``path`` is when no output may ever replace it (None otherwise): a results file, the lock of
    one (``X.jsonl.lock``), a compiled module or buffer assignment under the ``hlo/`` of a compile-only
    folder, a checkpoint under the ``ckpt/`` of a stress folder."""
    path = Path(path)
    if path.name.endswith(".jsonl.lock"):
        return "the lock file of a results file"
    if _is_results_file(path):
        return "a results file"
    parent = _resolved(path).parent
    if parent.name == "hlo" and (parent.parent / COMPILE_RESULTS).exists():
        return "a compiled module of the stress --compile-only results in " + str(parent.parent)
    if parent.name == "ckpt" and any(parent.parent.glob("stress*.jsonl")):
        return "a checkpoint of the stress results in " + str(parent.parent)
    return None


def check_output(target: Path, flag: str, inputs: set[Path] | frozenset[Path] = frozenset(),
                 force: bool = False) -> None:
    """Refuse to write ``target`` (named by ``flag``) over one of the command's inputs (always), over a
    results file, its lock, a compiled module or checkpoint beside results (always: :func:`protected`),
    into a folder that cannot hold it, or over an existing file (unless ``force``)."""
    target = Path(target)
    if _resolved(target) in inputs:
        raise HarnessError(f"{flag} {target} is one of this command's inputs; refusing to overwrite it "
                           "(write the output elsewhere)")
    for up in target.parents:
        if up.exists() or up.is_symlink():
            if not up.is_dir():
                raise HarnessError(f"{flag} {target}: {up} is not a folder")
            break
    if not (target.exists() or target.is_symlink()):
        return
    if target.is_dir():
        raise HarnessError(f"{flag} {target} is a folder; name a file")
    what = protected(target)
    if what is not None:
        raise HarnessError(f"{flag} {target} is {what}; refusing to overwrite it (write the output elsewhere)")
    if not force:
        raise HarnessError(f"{flag} {target} already exists; pass --force to replace it")
