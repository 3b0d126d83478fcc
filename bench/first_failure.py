"""What the first failure of a run costs: a 1,000-step run of the built-in model (default sizing of the
block commit) with one NaN planted in the parameters mid-run (``--inject nan``, keyed by (seed,
step); the seed is chosen so that the first planted step falls in the middle third). The failed
step's new state is not finite, so it is rolled back: the state before it is rebuilt from the device
copy taken at its block's start, by rerunning the block's earlier steps.

Printed: the failed step, the block it ended (its start and the size K the sizer had reached), the
steps rerun and from where (the target: at most 2 blocks, i.e. <= 2 K; by construction at most
K - 1), and the wall time from the previous block's verdict to the failed block's against the clean
blocks' time per step (what the rollback cost, in steps). Counts are machine independent; times are
this machine's.

    python bench/first_failure.py [--size realistic|tiny] [--steps 1000] [--json F]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import jax  # noqa: E402

from xla_harness.stress.device.inject import injected_steps  # noqa: E402
from xla_harness.stress.runner import Event, run_matrix  # noqa: E402
from xla_harness.stress.spec import StressSpec  # noqa: E402

SIZES = {
    "tiny": dict(vocab=256, d_model=64, layers=2, heads=4, seq=16, batch=8),
    "realistic": dict(vocab=32768, d_model=512, layers=2, heads=8, seq=32, batch=8),
}


def pick_seed(steps: int, rate: float) -> tuple[int, list[int]]:
    """A seed whose planted steps start in the middle third of the run."""
    for seed in range(1, 10_000):
        planted = injected_steps(seed, steps, rate).tolist()
        if planted and steps // 3 <= planted[0] < 2 * steps // 3:
            return seed, planted
    raise SystemExit("no seed plants its first NaN in the middle third")


def bench(size: str, steps: int) -> dict:
    rate = 1.0 / steps
    seed, planted = pick_seed(steps, rate)
    spec = StressSpec(modes=("full",), remats=(True,), seeds=(seed,), steps=steps, inject="nan", inject_rate=rate,
                      **SIZES[size])
    stamps: list[tuple[float, Event]] = []
    with tempfile.TemporaryDirectory(prefix="xla-harness-first-failure-") as tmp:
        t0 = time.perf_counter()
        run_matrix(spec, Path(tmp), on_event=lambda e: stamps.append((time.perf_counter(), e)))
        total = time.perf_counter() - t0
    blocks = [(t, e.block) for t, e in stamps if e.kind == "block" and e.block is not None]
    first = next(i for i, (_, b) in enumerate(blocks) if b.recompute is not None)
    t_fail, failed = blocks[first]
    t_prev, prev = blocks[first - 1]
    clean = [(blocks[i][0] - blocks[i - 1][0], blocks[i][1].end - blocks[i][1].start)
             for i in range(max(1, first - 8), first)]
    per_step = sum(t for t, _ in clean) / max(1, sum(n for _, n in clean))
    rec = failed.recompute or {}
    k = prev.end - prev.start
    return {"size": size, "steps": steps, "seed": seed, "planted": planted, "failed_step": failed.end - 1,
            "block": [failed.start, failed.end], "k_before": k, "rerun_steps": rec.get("steps"),
            "rerun_from": rec.get("from"), "rerun_tries": rec.get("tries", 1),
            "failure_seconds": t_fail - t_prev, "clean_seconds_per_step": per_step,
            "failure_in_steps": (t_fail - t_prev) / per_step if per_step else None, "run_seconds": total,
            "backend": jax.default_backend(), "device": jax.devices()[0].device_kind, "jax": jax.__version__,
            "load": os.getloadavg()[0]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", choices=sorted(SIZES), default="realistic")
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--json", type=Path, help="also write the figures as JSON")
    args = ap.parse_args()
    if args.steps < 30:
        ap.error("--steps must be at least 30")
    r = bench(args.size, args.steps)
    print(f"backend {r['backend']} ({r['device']}), jax {r['jax']}, load {r['load']:.1f}; {r['size']} model, "
          f"{r['steps']} steps, seed {r['seed']}, NaN planted at steps {r['planted']}")
    print(f"first failure: step {r['failed_step']} ended the block started at {r['block'][0]} (K had reached "
          f"{r['k_before']}); rerun {r['rerun_steps']} step(s) from step {r['rerun_from']} in {r['rerun_tries']} "
          f"try(ies): target <= 2 K = {2 * r['k_before']}")
    fis = r["failure_in_steps"]
    print(f"that block's verdict came {r['failure_seconds'] * 1e3:.1f} ms after the previous one; clean blocks "
          f"{r['clean_seconds_per_step'] * 1e3:.2f} ms a step: the failed block and its rollback cost "
          f"{fis:.1f} steps' time" if fis is not None else "no clean blocks before the failure to compare with")
    if args.json:
        args.json.write_text(json.dumps(r, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
