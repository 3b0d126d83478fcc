"""What ``xla-harness stress`` costs on top of the user's step, in process CPU time.

Three loops of the same step, interleaved round by round (the order rotates, so machine noise
hits all three):

* **user**: what a user writes, ``step = jax.jit(program.step, donate_argnums=(0, 1))`` and
  ``p, o, aux = step(p, o, batch)`` with a new batch per step;
* **block**: the harness as ``stress`` runs it by default (train protocol, ``--commit block``):
  the same step, fed its own outputs, the losses fetched and the state checked once per block,
  one host snapshot per block, every block appended to the results file with flush + fsync;
* **step**: the harness with ``--commit step`` (every step checked, a select and a rollback copy of
  the whole state per step: the protocol before the block commit).

Each loop runs ``--steps`` steps of a fresh seed per round. The figure is the per-round ratio of
process CPU time (every thread of the process: XLA's CPU thread pool included), user / harness,
as its median with a distribution-free 95% interval and the lowest-highest spread over rounds;
wall time is printed beside it, never alone. Device memory: the bytes of jax Arrays alive when
each step returns (the user's state and outputs, plus what the harness keeps on device: the
rollback copy in ``step``, nothing in ``block``, whose snapshot is in host memory), the largest
over one untimed run of each loop. Target: user/block >= 0.97 at the realistic size.

    python bench/stress_overhead.py [--size tiny|realistic|both] [--steps N] [--rounds 5] [--json F]
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import jax  # noqa: E402

from xla_harness.stress import store as results  # noqa: E402
from xla_harness.stress.inject import step_keys  # noqa: E402
from xla_harness.stress.runner import check_same_program, first_batch, initial_state, prepare, run_seed  # noqa: E402
from xla_harness.stress.spec import StressSpec  # noqa: E402

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
        h = self.h["block"]
        self.program = h.program
        self.user_step = jax.jit(h.program.step, donate_argnums=(0, 1))
        state = initial_state(h, 1)
        self.fingerprint = check_same_program(h, state.params, state.opt_state, first_batch(h, 1))
        for c in ("step",):
            self.h[c].fingerprint = self.fingerprint
        self.state_bytes = sum(x.nbytes for x in jax.tree_util.tree_leaves((state.params, state.opt_state)))
        del state
        self.tmp = Path(tempfile.mkdtemp(prefix="xla-harness-bench-"))
        self.env = results.environment()
        self.runs = 0
        self.peak = dict.fromkeys(LOOPS, 0)

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
        spec = h.spec.to_dict()
        self.runs += 1
        path = self.tmp / f"stress{self.runs}.jsonl"
        with results.open_run(path, spec, resume=False) as store:
            store.write_header(spec, self.env)
            for _ in run_seed(h, seed, initial_state(h, seed), store, self.tmp, self.env):
                pass
        path.unlink()

    def close(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)


def bench(size: str, steps: int, rounds: int) -> dict:
    loops = Loops(size, steps)
    for loop in LOOPS:  # compile, warm up, and the device-memory reading (untimed)
        loops.run(loop, 1000, watch=True)
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
    out = {"size": size, **SIZES[size], "steps": steps, "rounds": rounds, "step_id": loops.fingerprint["id"],
           "state_mb": loops.state_bytes / 2**20, "backend": jax.default_backend(), "jax": jax.__version__,
           "device_mb": {k: v / 2**20 for k, v in loops.peak.items()}, "loops": {}}
    for loop in LOOPS:
        ratios = [u / x for u, x in zip(cpu["user"], cpu[loop], strict=True)]
        wall_ratios = [u / x for u, x in zip(wall["user"], wall[loop], strict=True)]
        out["loops"][loop] = {
            "cpu_s_per_step": statistics.median(cpu[loop]) / steps,
            "wall_s_per_step": statistics.median(wall[loop]) / steps,
            "cpu_ratio": statistics.median(ratios), "cpu_ratio_95": median_interval(ratios),
            "cpu_ratio_spread": (min(ratios), max(ratios)),
            "wall_ratio": statistics.median(wall_ratios),
        }
    return out


def report(r: dict) -> None:
    print(f"== {r['size']}: V={r['vocab']} D={r['d_model']} L={r['layers']} batch {r['batch']}x{r['seq']}, state "
          f"{r['state_mb']:.0f} MB, {r['steps']} steps x {r['rounds']} rounds, step {r['step_id']} "
          f"({r['backend']}, jax {r['jax']})")
    user = r["loops"]["user"]
    for loop in LOOPS:
        x = r["loops"][loop]
        added = x["cpu_s_per_step"] - user["cpu_s_per_step"]
        line = (f"{loop:6s} CPU {x['cpu_s_per_step'] * 1e3:8.2f} ms/step (wall {x['wall_s_per_step'] * 1e3:8.2f})"
                f"  device {r['device_mb'][loop]:7.0f} MB")
        if loop != "user":
            lo, hi = x["cpu_ratio_95"]
            line += (f"  user/{loop} CPU {x['cpu_ratio']:.3f} [95% {lo:.3f}, {hi:.3f}; spread "
                     f"{x['cpu_ratio_spread'][0]:.3f}-{x['cpu_ratio_spread'][1]:.3f}] (wall {x['wall_ratio']:.3f}); "
                     f"harness adds {added * 1e3:+.2f} ms/step")
        print(line)
    more = {k: r["device_mb"][k] - r["device_mb"]["user"] for k in ("block", "step")}
    print(f"target: user/block >= 0.97 at the realistic size; on device over the user loop: block {more['block']:+.0f} "
          f"MB, step {more['step']:+.0f} MB")


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
    print(f"backend {jax.default_backend()} ({jax.devices()[0].device_kind}), jax {jax.__version__}")
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
