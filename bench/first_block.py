"""Time to the first block: ``xla-harness stress`` of one step against a plain loop of one step, each
a whole fresh process (imports, building the program, ``init``, compiling the step, one step),
interleaved round by round.

* **plain**: ``load_program(P, **options)``, ``init``, ``jax.jit(step, donate_argnums=...)``, one
  step, its loss printed: what a user's first step costs;
* **stress**: ``python -m xla_harness.cli stress --program P --program-option ... --seeds 1 --steps 1
  --quiet`` (the same-program proof, the one compile, the first block recorded, the table).

The figure is the per-round ratio stress / plain of process CPU time (the child's user + system
time: every thread, XLA's compile threads included; the headline on a CPU) and of wall time, as the
median over rounds with the lowest-highest spread. ``--checkout DIR`` times another checkout's
harness in the same rounds (a before/after figure in one run). Target: stress / plain <= 1.1 for
the #35409 program at scale 1/32.

    python bench/first_block.py [--program issue-35409] [--option scale=0.03125 ...] [--rounds 3]
                                [--checkout DIR ...]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

PLAIN = """
import sys
import jax
from xla_harness.programs.interface import load_program
from xla_harness.stress.device.inject import step_keys
options = dict(a.split("=", 1) for a in sys.argv[2:])
options = {k: (float(v) if k == "scale" else v) for k, v in options.items()}
program = load_program(sys.argv[1], **options)
params, opt = program.init(jax.random.key(1))
step = jax.jit(program.step, donate_argnums=program.donate_argnums, **program.jit_kwargs)
params, opt, aux = step(params, opt, program.batch(step_keys(1, 0)[0], 0))
print(float(aux["loss"]))
"""


def _timed(argv: list[str], env: dict, cwd: Path) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of one child process run to its end in ``cwd``; it must succeed.
    ``python -m`` puts its working directory first on sys.path, ahead of PYTHONPATH: the child runs in
    the checkout it times, or it would import this one's harness."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=1800, check=False)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise SystemExit(f"error: {' '.join(argv[:4])} ... exited {done.returncode}: {' | '.join(tail)}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, wall


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--program", default="issue-35409")
    ap.add_argument("--option", action="append", default=None, metavar="K=V",
                    help="program option (default scale=0.03125 for issue-35409)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--checkout", action="append", type=Path, default=[],
                    help="also time the harness of this checkout (its xla_harness/ on PYTHONPATH)")
    args = ap.parse_args()
    if args.rounds < 1:
        ap.error("--rounds must be positive")
    options = args.option if args.option is not None else (["scale=0.03125"] if args.program == "issue-35409" else [])
    env = {**os.environ, "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "cpu")}
    runs = {"plain": (ROOT, [sys.executable, "-c", PLAIN, args.program, *options])}

    def stress(checkout: Path) -> tuple[Path, list[str]]:
        argv = [sys.executable, "-m", "xla_harness.cli", "stress", "--program", args.program, "--seeds", "1",
                "--steps", "1", "--quiet"]
        for o in options:
            argv += ["--program-option", o]
        return checkout, [*argv, "--out", "(a fresh folder each round)"]

    runs["stress"] = stress(ROOT)
    for checkout in args.checkout:
        runs[f"stress@{checkout.name}"] = stress(checkout.resolve())
    names = list(runs)
    print(f"{args.program} {' '.join(options)}: {args.rounds} rounds, {os.cpu_count()} CPUs, load "
          f"{os.getloadavg()[0]:.1f}")
    times: dict[str, list[tuple[float, float]]] = {n: [] for n in names}
    for r in range(args.rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            checkout, argv = runs[name]
            if name.startswith("stress"):  # a fresh results folder each round
                argv = [*argv[:-1], str(Path(tempfile.mkdtemp(prefix="xla-harness-first-block-")) / "r")]
            times[name].append(_timed(argv, {**env, "PYTHONPATH": str(checkout)}, checkout))
        print(f"round {r + 1}: " + ", ".join(f"{n} {times[n][-1][0]:.1f} s CPU / {times[n][-1][1]:.1f} s wall"
                                            for n in names), flush=True)
    for name in names:
        if name == "plain":
            continue
        for i, kind in ((0, "CPU"), (1, "wall")):
            ratios = [x[i] / p[i] for x, p in zip(times[name], times["plain"], strict=True)]
            print(f"{name} / plain, {kind} time: median {statistics.median(ratios):.3f} (spread "
                  f"{min(ratios):.3f}-{max(ratios):.3f}); medians {statistics.median(x[i] for x in times[name]):.1f} s "
                  f"vs {statistics.median(x[i] for x in times['plain']):.1f} s")
    print("target: stress / plain <= 1.1 (CPU time on the CPU)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
