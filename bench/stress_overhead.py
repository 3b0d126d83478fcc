"""What ``xla-harness stress`` costs on top of the user's step: wall time on a GPU or TPU (the device
does the work there), process CPU time on the CPU, and the machine-independent counts that explain
them.

Three loops of the same step, interleaved round by round (the order rotates, so machine noise
hits all three):

* **user**: what a user writes, ``step = jax.jit(program.step, donate_argnums=(0, 1))`` and
  ``p, o, aux = step(p, o, batch)`` with a new batch per step;
* **block**: the harness as ``stress`` runs it by default (train protocol, ``--commit block``):
  the same step (the one executable the same-program proof compiled), fed its own outputs, per
  block one state check and one fetch of its losses and flag, read while the next block runs,
  every block appended to the results file (flush + fsync) by the results sink's writer thread;
* **step**: the harness with ``--commit step`` (every step checked, a select and a rollback copy of
  the whole state per step: the protocol before the block commit).

Each loop runs ``--steps`` steps of a fresh seed per round. The figure is the per-round ratio
user / harness, as its median with a distribution-free 95% interval and the lowest-highest spread
over rounds, of wall time on a GPU or TPU and of process CPU time (every thread of the process:
XLA's CPU thread pool included) on the CPU; the other is printed beside it. Per step, counted by
jax itself over one untimed run of each loop (``bench/counting.py``): bytes copied to the host,
host syncs (reads of device arrays and waits), jitted dispatches (the harness's own count),
results lines written and fsyncs. Device memory: the bytes of jax Arrays alive when each step
returns (the user's state and outputs, plus what the harness keeps on device: the rollback copy in
``step``, nothing in ``block``), the largest over that run. Targets: user/block >= 0.99 (CPU time
on the CPU at both sizes; wall time on a GPU at the realistic size, 0.97 at the tiny one).

    python bench/stress_overhead.py [--size tiny|realistic|both] [--steps N] [--rounds 5] [--json F]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import jax  # noqa: E402
from as_stress import stress_seed  # noqa: E402
from counting import CompileCounts, DeviceCounts  # noqa: E402

from xla_harness.stress.device.inject import step_keys  # noqa: E402
from xla_harness.stress.loop.block_size import new_block_size  # noqa: E402
from xla_harness.stress.results import provenance  # noqa: E402
from xla_harness.stress.runner import check_same_program, first_batch, initial_state, prepare  # noqa: E402
from xla_harness.stress.spec import StressSpec  # noqa: E402

COMPILES = CompileCounts()

SIZES = {
    "tiny": dict(vocab=256, d_model=64, layers=2, heads=4, seq=16, batch=8),
    "realistic": dict(vocab=32768, d_model=512, layers=2, heads=8, seq=32, batch=8),
}
LOOPS = ("user", "block", "step")


def median_interval(xs: list[float], confidence: float = 0.95) -> tuple[float, float]:
    """Distribution-free interval for the median: order statistics (r, n + 1 - r) with
    P[Binomial(n, 1/2) < r] <= (1 - confidence) / 2 (the whole range when n is too small)."""
    xs = sorted(xs)
    n = len(xs)
    cdf, r = 0.0, 0
    while r < n:
        nxt = cdf + math.comb(n, r) / 2**n
        if nxt > (1 - confidence) / 2:
            break
        cdf, r = nxt, r + 1
    r = max(r, 1)
    return xs[r - 1], xs[n - r]


def _live_bytes() -> int:
    return sum(x.nbytes for x in jax.live_arrays() if not x.is_deleted())


class Loops:
    """The three loops of one size, each run on a fresh seed."""

    def __init__(self, size: str, steps: int):
        self.steps = steps
        base = dict(modes=("full",), remats=(True,), seeds=(1,), steps=steps, **SIZES[size])
        self.h = {c: prepare(s, s.configs()[0]) for c in ("block", "step")
                  for s in [StressSpec(commit=c, **base)]}
        for c, h in list(self.h.items()):  # each proven and compiled once, as stress does
            state = initial_state(h, 1)
            h = self.h[c] = check_same_program(h, state.params, state.opt_state, first_batch(h, 1))
            fp = h.fingerprint
            if c == "block":
                self.fingerprint = fp
                self.state_bytes = sum(x.nbytes for x in jax.tree_util.tree_leaves((state.params, state.opt_state)))
            del state
        self.program = self.h["block"].program
        self.sizes = {c: new_block_size(h.spec) for c, h in self.h.items()}  # carried from seed to seed, as stress does
        self.user_step = jax.jit(self.program.step, donate_argnums=(0, 1))
        self.tmp = Path(tempfile.mkdtemp(prefix="xla-harness-bench-"))
        self.env = provenance.environment()
        self.runs = 0
        self.peak = dict.fromkeys(LOOPS, 0)
        self.counts: dict[str, dict] = {}

    def run(self, loop: str, seed: int, watch: bool = False) -> None:
        if loop == "user":
            p, o = self.program.init(jax.random.key(seed))
            aux = None
            for s in range(self.steps):
                p, o, aux = self.user_step(p, o, self.program.batch(step_keys(seed, s)[0], s))
                if watch:
                    jax.block_until_ready(aux)
                    self.peak[loop] = max(self.peak[loop], _live_bytes())
            jax.block_until_ready((p, o, aux))
            return
        h = self.h[loop]
        if watch:
            real = h.step

            def watched(*args):
                out = real(*args)
                jax.block_until_ready(out)
                self.peak[loop] = max(self.peak[loop], _live_bytes())
                return out

            h = replace(h, step=watched)
        self.runs += 1
        self.lines, self.fsyncs = stress_seed(h, seed, self.tmp / f"stress{self.runs}.jsonl", self.env,
                                              self.sizes[h.spec.commit])

    def count(self, loop: str, seed: int) -> None:
        """One untimed run of ``loop`` with jax's own counts (and the harness's dispatches)."""
        h = self.h.get(loop)
        dispatched = h.counters.dispatches if h else 0
        compiled = COMPILES.total
        with DeviceCounts() as counts:
            self.run(loop, seed)
        self.counts[loop] = {
            "d2h_bytes": counts.read_bytes / self.steps, "host_syncs": counts.syncs / self.steps,
            "dispatches": (h.counters.dispatches - dispatched) / self.steps if h else 1.0,
            "lines": self.lines / self.steps if h else 0.0, "fsyncs": self.fsyncs / self.steps if h else 0.0,
            "compiles": COMPILES.total - compiled}

    def close(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)


def bench(size: str, steps: int, rounds: int) -> dict:
    loops = Loops(size, steps)
    for loop in LOOPS:  # compile, warm up, and the device-memory reading (untimed)
        loops.run(loop, 1000, watch=True)
    for loop in LOOPS:  # the counts (untimed)
        loops.count(loop, 2000)
    cpu: dict[str, list[float]] = {k: [] for k in LOOPS}
    wall: dict[str, list[float]] = {k: [] for k in LOOPS}
    for r in range(rounds):
        order = LOOPS[r % 3:] + LOOPS[:r % 3]
        for loop in order:
            c0, w0 = time.process_time(), time.perf_counter()
            loops.run(loop, 1 + r)
            cpu[loop].append(time.process_time() - c0)
            wall[loop].append(time.perf_counter() - w0)
    loops.close()
    headline = "cpu" if jax.default_backend() == "cpu" else "wall"
    out = {"size": size, **SIZES[size], "steps": steps, "rounds": rounds, "step_id": loops.fingerprint["id"],
           "state_mb": loops.state_bytes / 2**20, "backend": jax.default_backend(), "jax": jax.__version__,
           "device": jax.devices()[0].device_kind, "headline": headline,
           "device_mb": {k: v / 2**20 for k, v in loops.peak.items()}, "counts": loops.counts, "loops": {}}
    for loop in LOOPS:
        figures = {}
        for kind, times in (("cpu", cpu), ("wall", wall)):
            ratios = [u / x for u, x in zip(times["user"], times[loop], strict=True)]
            figures.update({f"{kind}_s_per_step": statistics.median(times[loop]) / steps,
                            f"{kind}_ratio": statistics.median(ratios), f"{kind}_ratio_95": median_interval(ratios),
                            f"{kind}_ratio_spread": (min(ratios), max(ratios))})
        out["loops"][loop] = figures
    return out


def report(r: dict) -> None:
    head = r["headline"]
    other = "wall" if head == "cpu" else "cpu"
    names = {"cpu": "CPU", "wall": "wall"}
    print(f"== {r['size']}: V={r['vocab']} D={r['d_model']} L={r['layers']} batch {r['batch']}x{r['seq']}, state "
          f"{r['state_mb']:.0f} MB, {r['steps']} steps x {r['rounds']} rounds, step {r['step_id']} "
          f"({r['backend']}: {r['device']}, jax {r['jax']}); headline: {names[head]} time")
    user = r["loops"]["user"]
    for loop in LOOPS:
        x = r["loops"][loop]
        added = x[f"{head}_s_per_step"] - user[f"{head}_s_per_step"]
        line = (f"{loop:6s} {names[head]} {x[f'{head}_s_per_step'] * 1e3:8.2f} ms/step ({names[other]} "
                f"{x[f'{other}_s_per_step'] * 1e3:8.2f})  device {r['device_mb'][loop]:7.0f} MB")
        if loop != "user":
            lo, hi = x[f"{head}_ratio_95"]
            a, b = x[f"{head}_ratio_spread"]
            line += (f"  user/{loop} {names[head]} {x[f'{head}_ratio']:.3f} [95% {lo:.3f}, {hi:.3f}; spread "
                     f"{a:.3f}-{b:.3f}] ({names[other]} {x[f'{other}_ratio']:.3f}); harness adds "
                     f"{added * 1e3:+.2f} ms/step")
        print(line)
    print("per step (one untimed run each, counted by jax):")
    for loop in LOOPS:
        c = r["counts"][loop]
        print(f"  {loop:6s} device->host {c['d2h_bytes']:10.1f} B  host syncs {c['host_syncs']:6.3f}  dispatches "
              f"{c['dispatches']:6.3f}  results lines {c['lines']:6.3f}  fsyncs {c['fsyncs']:6.3f}  "
              f"compiles in the run {c['compiles']}")
    more = {k: r["device_mb"][k] - r["device_mb"]["user"] for k in ("block", "step")}
    print(f"target: user/block >= 0.99 ({'CPU time on the CPU' if head == 'cpu' else 'wall time on the device'}); "
          f"on device over the user loop: block {more['block']:+.0f} MB, step {more['step']:+.0f} MB")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", choices=["tiny", "realistic", "both"], default="both")
    ap.add_argument("--steps", type=int, default=None,
                    help="steps per loop and round (default 200 tiny, 60 realistic)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", type=Path, help="also write the figures as JSON")
    args = ap.parse_args()
    if args.rounds < 1 or (args.steps is not None and args.steps < 1):
        ap.error("--rounds and --steps must be positive")
    print(f"backend {jax.default_backend()} ({jax.devices()[0].device_kind}), jax {jax.__version__}, "
          f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")
    figures = []
    for size in (["tiny", "realistic"] if args.size == "both" else [args.size]):
        steps = args.steps or (200 if size == "tiny" else 60)
        figures.append(bench(size, steps, args.rounds))
        report(figures[-1])
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
