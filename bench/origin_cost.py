"""What deciding a failing step's origin costs (``stress --explain``), against what it is measured by:
one eager step (the user's step run op by op under ``jax.disable_jit()``, what ``jax_debug_nans``
reruns) and one compiled step, on the quickstart model (examples/quickstart/my_model.py) on this
machine's backend.

Interleaved rounds (the order rotates), process CPU time on the CPU (wall time on a GPU or TPU):

* **compiled**: one call of ``jax.jit(step)`` (compiled before the rounds);
* **eager**: one call of the step under ``jax.disable_jit()``;
* **float32**: :func:`xla_harness.origin.classify.eager_float32`: the step traced and its jaxpr
  evaluated equation by equation, each output checked;
* **float64**: :func:`xla_harness.origin.classify.eager_float64`: the same traced again in float64
  and evaluated on the CPU.

Printed: each figure's median and spread, and (float32 + float64) / eager per round, median and
spread (the classification's op-by-op part; its replays cost N compiled steps on top). Target
(docs/triage.md): at most 10.

    python bench/origin_cost.py [--rounds 9] [--json F]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import jax  # noqa: E402

from xla_harness.origin.classify import eager_float32, eager_float64  # noqa: E402
from xla_harness.programs.interface import load_program  # noqa: E402

TARGET = 10.0
PROGRAM = str(Path(__file__).resolve().parent.parent / "examples" / "quickstart" / "my_model.py") + ":make"


def _clock(on_accelerator: bool):
    return time.perf_counter if on_accelerator else time.process_time


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    program = load_program(PROGRAM)
    params, opt_state = program.init(jax.random.key(1))
    batch = program.batch(jax.random.key(2), 0)
    state = (params, opt_state, batch)
    compiled = jax.jit(program.step)
    jax.block_until_ready(compiled(*state))
    clock = _clock(jax.default_backend() != "cpu")

    def run_compiled():
        jax.block_until_ready(compiled(*state))

    def run_eager():
        with jax.disable_jit():
            jax.block_until_ready(program.step(*state))

    def run_f32():
        assert eager_float32(program.step, state).finite

    def run_f64():
        assert eager_float64(program.step, state).finite

    jobs = {"compiled": run_compiled, "eager": run_eager, "float32": run_f32, "float64": run_f64}
    for job in jobs.values():  # warm: every primitive compiled once
        job()
    times: dict[str, list[float]] = {k: [] for k in jobs}
    names = list(jobs)
    for r in range(args.rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            t = clock()
            jobs[name]()
            times[name].append(clock() - t)
    ratio = [(a + b) / e for a, b, e in zip(times["float32"], times["float64"], times["eager"], strict=True)]
    out = {"backend": jax.default_backend(), "clock": "wall" if clock is time.perf_counter else "process CPU",
           "rounds": args.rounds,
           "seconds": {k: {"median": statistics.median(v), "min": min(v), "max": max(v)} for k, v in times.items()},
           "op_by_op_over_eager": {"median": statistics.median(ratio), "min": min(ratio), "max": max(ratio)},
           "target": TARGET}
    for k, v in out["seconds"].items():
        print(f"{k:9s} {v['median'] * 1e3:9.2f} ms  ({v['min'] * 1e3:.2f}-{v['max'] * 1e3:.2f})")
    r = out["op_by_op_over_eager"]
    print(f"(float32 + float64) / eager step: {r['median']:.2f} ({r['min']:.2f}-{r['max']:.2f}), target <= {TARGET:g}; "
          f"{args.rounds} rounds, {out['clock']} time, backend {out['backend']}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
