"""Overhead of ``xla-harness stress`` against a plain user loop of the same step.

The user loop is what a user writes: ``step = jax.jit(program.step, donate_argnums=(0, 1))``
and ``p, o, aux = step(p, o, batch)`` with a new batch per step. The harness path is the
one the CLI runs per (config, seed): the same step (fingerprint-checked to be the same
program), the outside checker with rollback copy, flags fetched once per block, every block
appended to the JSONL store with flush + fsync, and checkpoints every --checkpoint-seconds
(the checkpoint's own cost is measured and printed separately, with what it costs at the
default period). Rounds alternate (user, harness, user, harness, ...) so machine noise
hits both; the figure is the median of the per-round throughput ratios harness/user with a
distribution-free 95% interval for that median. Target: >= 0.97 at the realistic size.

    python bench/stress_overhead.py [--size tiny|realistic|both] [--steps 40] [--rounds 7]
"""

from __future__ import annotations

import argparse
import math
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import jax  # noqa: E402

from xla_harness.stress import store as results  # noqa: E402
from xla_harness.stress.checkpoint import _checkpoint_path, save_checkpoint  # noqa: E402
from xla_harness.stress.inject import step_keys  # noqa: E402
from xla_harness.stress.runner import check_same_program, initial_state, prepare, run_seed  # noqa: E402
from xla_harness.stress.spec import StressSpec  # noqa: E402

SIZES = {
    "tiny": dict(vocab=256, d_model=64, layers=2, heads=4, seq=16, batch=8),
    "realistic": dict(vocab=32768, d_model=512, layers=2, heads=8, seq=32, batch=8),
}


def median_interval(xs: list[float], confidence: float = 0.95) -> tuple[float, float]:
    """Distribution-free interval for the median: order statistics (r, n + 1 - r) with
    P[Binomial(n, 1/2) < r] <= (1 - confidence) / 2."""
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


def bench(size: str, steps: int, rounds: int, block: int, checkpoint_seconds: float) -> float:
    spec = StressSpec(modes=("full",), remats=(True,), seeds=(1,), steps=steps, block=block,
                      checkpoint_seconds=checkpoint_seconds, **SIZES[size])
    h = prepare(spec, spec.configs()[0])
    user_step = jax.jit(h.program.step, donate_argnums=(0, 1))

    def user_loop():
        p, o = h.program.init(jax.random.key(1))
        aux = None
        for s in range(steps):
            p, o, aux = user_step(p, o, h.program.batch(step_keys(1, s)[0], s))
        jax.block_until_ready((p, o, aux))

    tmp = Path(tempfile.mkdtemp(prefix="xla-harness-bench-"))
    env = results.environment()

    runs = iter(range(10**9))

    def harness_loop():
        state = initial_state(h, 1)
        with results.open_run(tmp / f"stress{next(runs)}.jsonl", spec.to_dict(), resume=False) as store:
            for _ in run_seed(h, 1, state, store, tmp, env):
                pass

    state = initial_state(h, 1)
    fp = check_same_program(h, state.params, state.opt_state, h.program.batch(step_keys(1, 0)[0], 0))
    user_loop(), harness_loop()  # compile and warm up
    t0 = time.perf_counter()
    save_checkpoint(_checkpoint_path(tmp, h.label, 1), 0, state.params, state.opt_state)
    t_ckpt = time.perf_counter() - t0
    ckpt_mb = _checkpoint_path(tmp, h.label, 1).stat().st_size / 2**20
    ratios, t_user, t_harness = [], [], []
    for _ in range(rounds):
        t0 = time.perf_counter()
        user_loop()
        t_user.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        harness_loop()
        t_harness.append(time.perf_counter() - t0)
        ratios.append(t_user[-1] / t_harness[-1])
    # Where the time goes, per step: the user's step alone and the harness's commit alone (the
    # outside finiteness check over every new parameter and optimizer-state leaf, the rollback
    # select and the backup copy: memory-bound passes over the whole state), interleaved.
    t_step, t_commit = [], []
    p, o = state.params, state.opt_state
    bp, bo = state.backup
    for s in range(min(steps, 10)):
        t0 = time.perf_counter()
        new_p, new_o, aux = h.step(p, o, h.program.batch(step_keys(1, s)[0], s))
        jax.block_until_ready((new_p, new_o, aux))
        t1 = time.perf_counter()
        out = h.commit(bp, bo, new_p, new_o, aux)
        jax.block_until_ready(out)
        t_step.append(t1 - t0)
        t_commit.append(time.perf_counter() - t1)
        _, p, o, bp, bo = out
    state_mb = sum(x.nbytes for x in jax.tree_util.tree_leaves((p, o))) / 2**20
    med = statistics.median(ratios)
    lo, hi = median_interval(ratios)
    cfg = SIZES[size]
    step_s = statistics.median(t_harness) / steps
    print(f"== {size}: V={cfg['vocab']} D={cfg['d_model']} L={cfg['layers']} batch {cfg['batch']}x{cfg['seq']} "
          f"(+{cfg['batch']}x{2 * cfg['seq']}), {steps} steps x {rounds} rounds, block {block}; step {fp['id']}")
    print(f"user loop:      {steps / statistics.median(t_user):8.2f} steps/s (median)")
    print(f"xla-harness:    {steps / statistics.median(t_harness):8.2f} steps/s (median)")
    print(f"ratio harness/user: {med:.3f}  (95% CI of the median [{lo:.3f}, {hi:.3f}]; target >= 0.97)")
    print(f"per step: user step {statistics.median(t_step):.4f} s, harness commit (check + rollback copy of "
          f"{state_mb:.0f} MB of state) {statistics.median(t_commit):.4f} s -> step/(step + commit) "
          f"{statistics.median(t_step) / (statistics.median(t_step) + statistics.median(t_commit)):.3f}")
    per_period = checkpoint_seconds / step_s
    print(f"checkpoint: {ckpt_mb:.0f} MB in {t_ckpt:.2f} s, one per {checkpoint_seconds:g} s "
          f"(~{per_period:.0f} steps) -> {t_ckpt / (checkpoint_seconds + t_ckpt):.2%} of the run")
    shutil.rmtree(tmp, ignore_errors=True)
    return med


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", choices=["tiny", "realistic", "both"], default="both")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--block", type=int, default=10)
    ap.add_argument("--checkpoint-seconds", type=float, default=300.0)
    args = ap.parse_args()
    print(f"backend {jax.default_backend()} ({jax.devices()[0].device_kind}), jax {jax.__version__}")
    for size in (["tiny", "realistic"] if args.size == "both" else [args.size]):
        steps = args.steps if size == "tiny" else max(10, args.steps // 4)
        bench(size, steps, args.rounds, args.block, args.checkpoint_seconds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
