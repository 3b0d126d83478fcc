"""Overhead of the stress runner's checks against a bare training loop.

Both loops run the same jitted tied-embedding step in the same process; the stress runner
adds the on-device finiteness reductions, the apply-if-finite select, the per-step flags
and one host sync per block. Rounds alternate (bare, checked, bare, checked, ...) so that
machine noise hits both; the figure is the ratio of median steps/s. Target: >= 0.97 on CPU.

    python bench/stress_overhead.py [--steps 200] [--rounds 7] [--mode full] [--block 10]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import jax  # noqa: E402

from harness.stress.runner import RunState, StressSpec, bare_loop, build_program, run_config  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--mode", default="full")
    ap.add_argument("--block", type=int, default=10)
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=1024)
    args = ap.parse_args()
    spec = StressSpec(modes=(args.mode,), remats=(True,), seeds=(1,), steps=args.steps, block=args.block,
                      d_model=args.d_model, vocab=args.vocab, seq=32, batch=8, layers=2, heads=4)
    cfg = spec.configs()[0]
    checked = build_program(cfg, spec, checked=True)
    bare = build_program(cfg, spec, checked=False)

    def run_checked():
        p, o = checked.init(1)
        for _ in run_config(checked, 1, spec, RunState(0, p, o)):
            pass

    def run_bare():
        bare_loop(bare, 1, args.steps)

    run_checked(), run_bare()  # compile and warm up
    t_bare, t_checked = [], []
    for _ in range(args.rounds):
        for fn, acc in ((run_bare, t_bare), (run_checked, t_checked)):
            t0 = time.perf_counter()
            fn()
            acc.append(time.perf_counter() - t0)
    sps_bare = args.steps / statistics.median(t_bare)
    sps_checked = args.steps / statistics.median(t_checked)
    print(f"backend {jax.default_backend()} ({jax.devices()[0].device_kind}), model {cfg.label()} "
          f"V={cfg.vocab} D={cfg.d_model} L={cfg.layers}, {args.steps} steps x {args.rounds} rounds, "
          f"block {args.block}")
    print(f"bare loop:     {sps_bare:8.1f} steps/s (median)")
    print(f"stress runner: {sps_checked:8.1f} steps/s (median)")
    print(f"ratio stress/bare: {sps_checked / sps_bare:.3f}  (target >= 0.97)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
