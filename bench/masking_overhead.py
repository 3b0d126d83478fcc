"""Cost of jax_zero_cotangent_masking on a training step: flag off vs on, same process.

The tied-embedding transformer step of the stress harness (forward, backward, Adam) is
compiled twice, with the flag off and on (the flag is part of the jit key), and timed in
interleaved rounds; the figure is the ratio of median step times (target <= 1.03 on CPU,
<= 1.01 on GPU), plus the number of extra HLO instructions in the optimized program.
Needs the patched jax: run under .venv-jax-patched (re-executes itself there if found).

    python bench/masking_overhead.py [--steps 50] [--rounds 7]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    import jax

    if not hasattr(jax.lax, "masked_scale"):
        patched = ROOT / ".venv-jax-patched" / "bin" / "python"
        if patched.exists() and not os.environ.get("XLA_HARNESS_BENCH_REEXEC"):
            env = {**os.environ, "XLA_HARNESS_BENCH_REEXEC": "1", "PYTHONPATH": str(ROOT)}
            return subprocess.call([str(patched), __file__, *sys.argv[1:]], env=env)
        sys.stderr.write("error: this jax has no zero-cotangent masking; build .venv-jax-patched with "
                         "'make jax-patched-venv' first\n")
        return 2
    from harness.programs.interface import load_program
    from harness.stress.runner import step_keys

    sizes = dict(d_model=128, vocab=1024, seq=32, layers=2, heads=4)
    label = "full/remat=on/f32"

    def program(flag: bool):
        jax.config.update("jax_zero_cotangent_masking", flag)
        prog = load_program("tied-embedding", mode="full", remat=True, **sizes)
        step = jax.jit(prog.step, donate_argnums=(0, 1))
        p, o = prog.init(jax.random.key(1))
        n_ops = step.lower(p, o, prog.batch(step_keys(1, 0)[0], 0)).compile().as_text().count(" = ")
        return (prog, step), n_ops

    progs = {flag: program(flag) for flag in (False, True)}
    batches = [progs[False][0][0].batch(step_keys(1, s)[0], s) for s in range(args.steps)]

    def run(flag: bool) -> float:
        jax.config.update("jax_zero_cotangent_masking", flag)
        prog, step = progs[flag][0]
        p, o = prog.init(jax.random.key(1))
        p, o, aux = step(p, o, batches[0])  # compiled already; warm
        jax.block_until_ready(aux)
        t0 = time.perf_counter()
        for s in range(args.steps):
            p, o, aux = step(p, o, batches[s])
        jax.block_until_ready((p, aux))
        return (time.perf_counter() - t0) / args.steps

    run(False), run(True)
    off, on = [], []
    for _ in range(args.rounds):
        off.append(run(False))
        on.append(run(True))
    t_off, t_on = statistics.median(off), statistics.median(on)
    print(f"jax {jax.__version__} ({jax.default_backend()}), model {label} V={sizes['vocab']} D={sizes['d_model']}, "
          f"{args.steps} steps x {args.rounds} rounds")
    print(f"flag off: {t_off * 1e3:8.3f} ms/step   HLO instructions: {progs[False][1]}")
    print(f"flag on:  {t_on * 1e3:8.3f} ms/step   HLO instructions: {progs[True][1]} "
          f"(+{progs[True][1] - progs[False][1]})")
    print(f"ratio on/off: {t_on / t_off:.3f}  (target <= 1.03 on CPU, <= 1.01 on GPU)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
