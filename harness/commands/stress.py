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
            values = tuple(conv(t) for t in items)
        except (ValueError, KeyError):
            raise argparse.ArgumentTypeError(f"invalid {kind} list {text!r}") from None
        for i, v in enumerate(values):
            if v in values[:i]:
                raise argparse.ArgumentTypeError(f"{kind} {items[i]!r} is listed twice in {text!r}")
        return values
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
    g = p.add_argument_group("multi-host (jax.distributed)")
    g.add_argument("--distributed", action="store_true",
                   help="initialise jax.distributed from the environment (TPU VM / cluster defaults)")
    g.add_argument("--coordinator", metavar="HOST:PORT", help="coordinator address (process 0's host)")
    g.add_argument("--num-processes", type=_positive, help="number of processes")
    g.add_argument("--process-id", type=int, help="this process's index")
    g.add_argument("--init-timeout", type=_positive, default=300, metavar="S",
                   help="seconds to wait for the coordinator (default 300)")


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
    from harness.stress.runner import StressSpec

    if args.steps <= 0:
        raise HarnessError(f"--steps must be a positive integer, got {args.steps}")
    return StressSpec(
        modes=args.modes, remats=args.remat, seeds=args.seeds, steps=args.steps, dtype=args.dtype,
        devices=args.devices, inject_nan_rate=args.inject_nan_rate, reference=args.reference,
        reference_every=args.reference_every, block=args.block, learning_rate=args.lr,
        vocab=args.vocab, d_model=args.d_model, layers=args.layers, heads=args.heads, seq=args.seq,
        batch=args.batch)


def wait_for_coordinator(address: str, timeout: float) -> None:
    """Poll HOST:PORT until it accepts a TCP connection. jax's client aborts the whole process
    when the coordinator is unreachable, so non-zero processes check first and fail cleanly."""
    import socket
    import time

    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise HarnessError(f"--coordinator must be HOST:PORT, got {address!r}")
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=2):
                return
        except OSError:
            if time.monotonic() >= deadline:
                raise HarnessError(f"coordinator {address} did not come up within {timeout:g} s; start "
                                   "process 0 first, or check the address") from None
            time.sleep(0.5)  # polling a socket, not timing anything


def init_distributed(args) -> int:
    """jax.distributed.initialize from flags or the environment; returns the process count."""
    explicit = args.coordinator or args.num_processes or args.process_id is not None
    if not (explicit or args.distributed):
        return 1
    if explicit and not (args.coordinator and args.num_processes and args.process_id is not None):
        raise HarnessError("--coordinator, --num-processes and --process-id go together")
    if explicit and not 0 <= args.process_id < args.num_processes:
        raise HarnessError(f"--process-id must be in [0, {args.num_processes})")
    import jax

    try:  # CPU collectives across processes (no effect on TPU/GPU)
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    except (AttributeError, ValueError):
        pass
    kwargs = {"initialization_timeout": args.init_timeout}
    if explicit and args.process_id != 0:
        wait_for_coordinator(args.coordinator, args.init_timeout)
    if explicit:
        kwargs.update(coordinator_address=args.coordinator, num_processes=args.num_processes,
                      process_id=args.process_id)
    try:
        jax.distributed.initialize(**kwargs)
    except Exception as exc:  # jax raises several types here; all mean "not connected"
        where = args.coordinator or "the coordinator from the environment"
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise HarnessError(f"jax.distributed could not connect to {where} within {args.init_timeout} s "
                           f"({first[:160]})") from None
    return jax.process_count()


def run(args) -> int:
    nproc = args.num_processes or 1
    if args.devices % nproc:
        raise HarnessError(f"--devices {args.devices} must be divisible by --num-processes {nproc}")
    ensure_host_devices(args.devices // nproc)
    from harness.stress import report
    from harness.stress.runner import run_matrix

    spec = spec_from_args(args)
    count = init_distributed(args)
    import jax

    name = f"stress.p{jax.process_index()}.jsonl" if count > 1 else "stress.jsonl"
    stop = StopFlag()
    stop.install()
    try:
        path = run_matrix(spec, args.out, resume=args.resume, should_stop=stop,
                          progress=not args.quiet, results_name=name)
    finally:
        stop.restore()
    if count > 1 and jax.process_index() != 0:
        print(f"process {jax.process_index()}: results in {path}; process 0 prints the merged table")
        return 128 + stop.signum if stop.signum is not None else 0
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
