"""Flags shared by several subcommands, each declared once here."""

from __future__ import annotations

import argparse
import ast
import os
from pathlib import Path

from xla_harness.errors import HarnessError

BUILTIN = "tied-embedding"


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
        for i, v in enumerate(values):
            if v in values[:i]:
                raise argparse.ArgumentTypeError(f"{kind} {items[i]!r} is listed twice in {text!r}")
        return values
    return parse


def onoff(t: str) -> bool:
    return {"on": True, "off": False, "true": True, "false": False, "1": True, "0": False}[t.lower()]


def positive(t: str) -> int:
    try:
        v = int(t)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {t!r}") from None
    if v <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {v}")
    return v


def rate(t: str) -> float:
    try:
        v = float(t)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {t!r}") from None
    if not 0.0 <= v <= 1.0:
        raise argparse.ArgumentTypeError(f"must be in [0, 1], got {v}")
    return v


def _option(text: str) -> tuple[str, object]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    try:
        parsed = ast.literal_eval(value)
    except (ValueError, SyntaxError):
        parsed = value
    return key.strip(), parsed


def add_json_argument(p: argparse.ArgumentParser, what: str = "the result") -> None:
    """--json: the same verdict and figures as the text output, as one JSON document on stdout
    (the exit code does not change)."""
    p.add_argument("--json", action="store_true",
                   help=f"print {what} as JSON on stdout instead of text (same verdict, same exit code)")


def add_program_arguments(p: argparse.ArgumentParser) -> None:
    """--program and --program-option: which TrainProgram a command works on."""
    g = p.add_argument_group("program (see xla_harness/programs/interface.py)")
    g.add_argument("--program", default=BUILTIN, metavar="PROGRAM",
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
    g.add_argument("--lr", type=float, default=1e-3, help="Adam learning rate (default 1e-3)")


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
    """Keyword options for the program of a single-configuration command."""
    if args.program == BUILTIN:
        if args.program_option:
            raise HarnessError("--program-option is for user programs; the built-in takes the model flags")
        opts = model_options(args, mode=args.mode, remat=args.remat == "on", dtype=args.dtype)
        if getattr(args, "devices", 1) > 1:
            opts["devices"] = args.devices
        return opts
    return dict(args.program_option)


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


def _is_results_file(path: Path) -> bool:
    """A stress results file: named stress*.jsonl, or its first line is a results header."""
    if path.name.startswith("stress") and path.name.endswith(".jsonl"):
        return True
    try:
        with open(path, "rb") as fh:
            first = fh.read(4096).split(b"\n", 1)[0]
    except OSError:
        return False
    return first.lstrip().startswith(b"{") and b'"kind"' in first and b'"header"' in first


def check_output(target: Path, flag: str, inputs: set[Path] | frozenset[Path] = frozenset(),
                 force: bool = False) -> None:
    """Refuse to write ``target`` (named by ``flag``) over one of the command's inputs (always) or
    over an existing file (unless ``force``); a stress results file is never replaced."""
    target = Path(target)
    if _resolved(target) in inputs:
        raise HarnessError(f"{flag} {target} is one of this command's inputs; refusing to overwrite it "
                           "(write the output elsewhere)")
    if not (target.exists() or target.is_symlink()):
        return
    if target.is_dir():
        raise HarnessError(f"{flag} {target} is a folder; name a file")
    if _is_results_file(target):
        raise HarnessError(f"{flag} {target} is a stress results file; refusing to overwrite it "
                           "(write the output elsewhere)")
    if not force:
        raise HarnessError(f"{flag} {target} already exists; pass --force to replace it")
