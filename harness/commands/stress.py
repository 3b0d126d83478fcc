"""xla-harness stress: run the tied-embedding stress matrix and print the table."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

from harness.errors import HarnessError

NAME = "stress"
HELP = "train the tied-embedding family step after step and count non-finite updates"
DESCRIPTION = """\
Train the tied-embedding model family for every (mode, remat) configuration and seed,
decide on device whether each step's loss, gradients and update are finite, and print a
table of non-finite steps per configuration with a Wilson 95% interval.

Modes: full (lookup and output projection both differentiate the tied matrix W),
sparse_only (untied output matrix), dense_only (lookup under stop_gradient).
A non-finite step is not applied, so every step is one trial.

Results are appended to OUT/stress.jsonl (flushed and fsynced per block of --block
steps); --resume continues an interrupted run without repeating or skipping steps.
SIGINT/SIGTERM flush, print the partial table and exit 130/143.

On CPU and GPU a zero count is the expected outcome for the stock compiler: the
reported failure (jax-ml/jax#35409) was seen on TPU v6e, whose compiler is in libtpu.
"""


def _csv(kind: str, conv):
    def parse(text: str):
        items = [t.strip() for t in text.split(",") if t.strip()]
        if not items:
            raise argparse.ArgumentTypeError(f"empty {kind} list")
        try:
            return tuple(conv(t) for t in items)
        except (ValueError, KeyError):
            raise argparse.ArgumentTypeError(f"invalid {kind} list {text!r}") from None
    return parse


def _onoff(t: str) -> bool:
    return {"on": True, "off": False, "true": True, "false": False, "1": True, "0": False}[t.lower()]


def _positive(t: str) -> int:
    try:
        v = int(t)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {t!r}") from None
    if v <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {v}")
    return v


def _rate(t: str) -> float:
    try:
        v = float(t)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {t!r}") from None
    if not 0.0 <= v <= 1.0:
        raise argparse.ArgumentTypeError(f"must be in [0, 1], got {v}")
    return v


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model size")
    g.add_argument("--vocab", type=_positive, default=256, help="vocabulary size V (default 256)")
    g.add_argument("--d-model", type=_positive, default=64, help="model width D (default 64)")
    g.add_argument("--layers", type=_positive, default=2, help="decoder layers (default 2)")
    g.add_argument("--heads", type=_positive, default=4, help="attention heads (default 4)")
    g.add_argument("--seq", type=_positive, default=16, help="sequence length of batch A; batch B is 2x (default 16)")
    g.add_argument("--batch", type=_positive, default=8, help="batch size (default 8)")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--modes", type=_csv("mode", str), default=("full", "sparse_only", "dense_only"),
                   help="comma-separated modes: full,sparse_only,dense_only (default all three)")
    p.add_argument("--remat", type=_csv("remat", _onoff), default=(True, False),
                   help="comma-separated remat settings: on,off (default both)")
    p.add_argument("--seeds", type=_csv("seed", int), default=(1, 2, 3, 4),
                   help="comma-separated integer seeds (default 1,2,3,4)")
    p.add_argument("--steps", type=int, default=20, help="training steps per (config, seed) (default 20)")
    p.add_argument("--dtype", default="f32", help="parameter dtype: f32 or bf16 (default f32)")
    p.add_argument("--devices", type=_positive, default=1,
                   help="shard over N devices: batch split, W sharded on the vocab axis (on CPU the "
                        "host platform is split into N devices)")
    p.add_argument("--out", type=Path, default=Path("out/stress"),
                   help="results folder (default out/stress); refuses to overwrite existing results")
    p.add_argument("--resume", action="store_true", help="continue the results already in --out")
    p.add_argument("--inject-nan-rate", type=_rate, default=0.0, metavar="P",
                   help="corrupt one element of W's update with probability P per step, on device "
                        "(proves the detector and the statistics)")
    p.add_argument("--reference", action="store_true",
                   help="recompute every --reference-every'th step in float64 on the CPU and flag "
                        "finite-but-wrong updates (silent corruption)")
    p.add_argument("--reference-every", type=_positive, default=5, metavar="N", help="(default 5)")
    p.add_argument("--block", type=_positive, default=10, metavar="K",
                   help="steps per host sync and per results line (default 10)")
    p.add_argument("--lr", type=float, default=1e-3, help="Adam learning rate (default 1e-3)")
    add_model_arguments(p)
    p.add_argument("--json", action="store_true", help="print the table as JSON")
    p.add_argument("--plot", type=Path, metavar="PNG", help="also write a PNG plot of rates with CIs")
    p.add_argument("--fail-on-nonfinite", action="store_true",
                   help="exit 1 when any step was non-finite (default: exit 0, the table is the result)")
    p.add_argument("--quiet", action="store_true", help="no progress output on stderr")


def ensure_host_devices(n: int) -> None:
    """Split the CPU into ``n`` devices; must run before jax is imported."""
    if n <= 1:
        return
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" in flags:
        return
    if "jax" in sys.modules:
        return  # too late to change; build_program reports a clear error if devices are missing
    os.environ["XLA_FLAGS"] = (flags + f" --xla_force_host_platform_device_count={n}").strip()


class StopFlag:
    """SIGINT/SIGTERM handler: ask the loop to stop after the current step."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._old: dict[int, object] = {}

    def __call__(self) -> bool:
        return self.signum is not None

    def _handle(self, signum, frame) -> None:
        if self.signum is not None:  # second signal: stop now
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
        self.signum = signum
        sys.stderr.write(f"\n{signal.Signals(signum).name}: finishing the current step, flushing results\n")

    def install(self) -> None:
        for s in (signal.SIGINT, signal.SIGTERM):
            self._old[s] = signal.signal(s, self._handle)

    def restore(self) -> None:
        for s, h in self._old.items():
            signal.signal(s, h)


def spec_from_args(args):
    from harness.stress import StressSpec

    if args.steps <= 0:
        raise HarnessError(f"--steps must be a positive integer, got {args.steps}")
    return StressSpec(
        modes=args.modes, remats=args.remat, seeds=args.seeds, steps=args.steps, dtype=args.dtype,
        devices=args.devices, inject_nan_rate=args.inject_nan_rate, reference=args.reference,
        reference_every=args.reference_every, block=args.block, learning_rate=args.lr,
        vocab=args.vocab, d_model=args.d_model, layers=args.layers, heads=args.heads, seq=args.seq,
        batch=args.batch)


def run(args) -> int:
    ensure_host_devices(args.devices)
    from harness import report
    from harness.stress import run_matrix

    spec = spec_from_args(args)
    stop = StopFlag()
    stop.install()
    try:
        path = run_matrix(spec, args.out, resume=args.resume, should_stop=stop, progress=not args.quiet)
    finally:
        stop.restore()
    table = report.load_table([path.parent])
    print(report.dumps(table) if args.json else report.format_table(table))
    if args.plot:
        report.plot(table, args.plot)
    sys.stdout.flush()
    if stop.signum is not None:
        sys.stderr.write(f"interrupted: partial results in {path}; continue with --resume\n")
        return 128 + stop.signum
    if args.fail_on_nonfinite and table.total_nonfinite:
        return 1
    return 0
