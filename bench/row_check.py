"""What the block protocol's per-step row costs on the device, and why: the user's step alone against
the step followed by each way of writing its row (:mod:`xla_harness.stress.device.step_rows`), interleaved
round by round, wall time (on a GPU or TPU the device does the work; on the CPU, process CPU time is
printed beside it), with the machine-independent counts that explain it (the kernels each writer's
compiled program launches, the bytes it reads).

Writers:

* **loss-only**: the row's loss alone (reads no state): the floor of one more dispatch per step;
* **per-leaf**: one ``all(isfinite(x))`` per leaf (what the harness did before: one reduction, so one
  kernel on a GPU, per leaf);
* **by-shape**: :func:`~xla_harness.stress.device.step_rows.write_row` as the harness runs it (leaves of one
  shape reduced together);
* **one-reduce**: every leaf's ``isfinite`` concatenated into one reduction (one flag for the whole
  state, no first bad leaf: the fewest kernels, for comparison only).

Each writer is also timed alone, called ``--steps`` times on one step's outputs (without the step: on a
GPU this loop is bound by the host's dispatch, so it says little). Every writer but ``loss-only`` reads
the whole state once per step; the state copy printed (``x * 1`` per leaf, one kernel per leaf, reading
and writing it) is a reference, not a floor: the bandwidth of the device's memory is.

    python bench/row_check.py [--size tiny|realistic] [--steps 200] [--rounds 3] [--json F]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from stress_overhead import SIZES, median_interval  # noqa: E402

from xla_harness.hlo.parser import parse_module  # noqa: E402
from xla_harness.stress.device import step_rows  # noqa: E402
from xla_harness.stress.device.inject import step_keys  # noqa: E402
from xla_harness.stress.device.leaves import is_floating  # noqa: E402
from xla_harness.stress.runner import prepare  # noqa: E402
from xla_harness.stress.spec import StressSpec  # noqa: E402


def _row(rows, loss, ok, state_ok):
    row = jnp.stack([jnp.asarray(loss).astype(jnp.float32), ok, state_ok.astype(jnp.float32)])[None]
    return jnp.concatenate([rows[1:], row])  # as step_rows.write_row keeps its rows


def _floating(p, o):
    return [x for x in jax.tree_util.tree_leaves((p, o)) if is_floating(x)]


def loss_only(rows, p, o, aux):
    return _row(rows, aux["loss"], jnp.float32(-1), jnp.bool_(True))


def per_leaf(rows, p, o, aux):
    parts = [jnp.all(jnp.isfinite(jnp.asarray(aux["loss"]).astype(jnp.float32)))]
    parts += [jnp.all(jnp.isfinite(x)) for x in _floating(p, o)]
    ok = jnp.stack(parts)
    code = jnp.where(jnp.all(ok), -1, jnp.argmin(ok)).astype(jnp.float32)
    return _row(rows, aux["loss"], code, jnp.all(ok[1:]))


def one_reduce(rows, p, o, aux):
    state_ok = jnp.all(jnp.concatenate([jnp.isfinite(x).ravel() for x in _floating(p, o)]))
    ok = state_ok & jnp.isfinite(jnp.asarray(aux["loss"]).astype(jnp.float32))
    return _row(rows, aux["loss"], jnp.where(ok, -1.0, 0.0).astype(jnp.float32), state_ok)


WRITERS = {"loss-only": loss_only, "per-leaf": per_leaf, "by-shape": step_rows.write_row, "one-reduce": one_reduce}
KERNEL_FREE = {"parameter", "get-tuple-element", "tuple", "bitcast", "constant", "copy-start", "copy-done"}


def launches(compiled_text: str) -> int:
    """Instructions of the entry computation that run something (fusions, reductions, custom calls)."""
    module = parse_module(compiled_text)
    entry = next(c for c in module.computations if c.is_entry)
    return sum(ins.opcode not in KERNEL_FREE for ins in entry.instructions)


class Bench:
    """The user's step, its outputs and the writers, compiled once."""

    def __init__(self, size: str, steps: int) -> None:
        spec = StressSpec(modes=("full",), remats=(True,), seeds=(1,), steps=steps, **SIZES[size])
        program = prepare(spec, spec.configs()[0]).program
        self.steps = steps
        self.step = jax.jit(program.step, donate_argnums=(0, 1))
        self.batches = [program.batch(step_keys(1, s)[0], s) for s in range(8)]
        self.writers = {name: jax.jit(f, donate_argnums=(0,)) for name, f in WRITERS.items()}
        p, o = program.init(jax.random.key(1))
        self.leaves = len(_floating(p, o))
        self.state_bytes = sum(x.nbytes for x in _floating(p, o))
        self.step_kernels = launches(self.step.lower(p, o, self.batches[0]).compile().as_text())
        self.p, self.o, self.aux = self.step(p, o, self.batches[0])
        rows = step_rows.new_rows()
        self.kernels = {name: launches(f.lower(rows, self.p, self.o, self.aux).compile().as_text())
                        for name, f in self.writers.items()}

    def copy_seconds(self) -> float:
        """One copy of the state (x * 1 per leaf): a reference for the device's memory speed."""
        copy = jax.jit(lambda t: jax.tree_util.tree_map(lambda x: x * 1, t))
        jax.block_until_ready(copy((self.p, self.o)))
        t0 = time.perf_counter()
        for _ in range(10):
            c = copy((self.p, self.o))
        jax.block_until_ready(c)
        return (time.perf_counter() - t0) / 10

    def loop(self, writer: str | None, with_step: bool) -> tuple[float, float]:
        """(CPU, wall) seconds of ``--steps`` steps (or, without the step, of the writer alone)."""
        rows = step_rows.new_rows()
        jax.block_until_ready((self.p, self.o, rows))
        c0, w0 = time.process_time(), time.perf_counter()
        for s in range(self.steps):
            if with_step:
                self.p, self.o, self.aux = self.step(self.p, self.o, self.batches[s % 8])
            if writer:
                rows = self.writers[writer](rows, self.p, self.o, self.aux)
                if (s + 1) % step_rows.ROWS == 0:
                    rows = step_rows.new_rows()
        jax.block_until_ready((self.p, self.o, self.aux, rows))
        return time.process_time() - c0, time.perf_counter() - w0


def measure(b: Bench, rounds: int) -> tuple[dict, dict]:
    """Per loop (the step alone: "None"), then per writer alone: {"cpu": [...], "wall": [...]}."""
    names = [None, *WRITERS]
    for name in names:  # warm up
        b.loop(name, True)
    with_step: dict = {str(k): {"wall": [], "cpu": []} for k in names}
    alone: dict = {k: {"wall": [], "cpu": []} for k in WRITERS}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            cpu, wall = b.loop(name, True)
            with_step[str(name)]["wall"].append(wall)
            with_step[str(name)]["cpu"].append(cpu)
        for name in WRITERS:
            cpu, wall = b.loop(name, False)
            alone[name]["wall"].append(wall)
            alone[name]["cpu"].append(cpu)
    return with_step, alone


def summary(b: Bench, args, with_step: dict, alone: dict, copy_s: float) -> dict:
    headline = "cpu" if jax.default_backend() == "cpu" else "wall"
    other = "wall" if headline == "cpu" else "cpu"
    user = with_step["None"]
    u = statistics.median(user[headline]) / b.steps
    out = {"size": args.size, **SIZES[args.size], "steps": b.steps, "rounds": args.rounds,
           "backend": jax.default_backend(), "device": jax.devices()[0].device_kind, "jax": jax.__version__,
           "headline": headline, "state_bytes": b.state_bytes, "leaves": b.leaves,
           "copy_bandwidth_GBps": 2 * b.state_bytes / copy_s / 1e9, "copy_ms": 1e3 * copy_s,
           "step_kernels": b.step_kernels, "user_ms_per_step": 1e3 * u, "writers": {}}
    for name in WRITERS:
        times = with_step[name]
        ratios = [a / x for a, x in zip(user[headline], times[headline], strict=True)]
        per = statistics.median(times[headline]) / b.steps
        out["writers"][name] = {"kernels": b.kernels[name], "ms_per_step": 1e3 * per, "added_ms": 1e3 * (per - u),
                                "ratio": statistics.median(ratios), "ratio_95": median_interval(ratios),
                                "ratio_spread": (min(ratios), max(ratios)),
                                "alone_ms": 1e3 * statistics.median(alone[name][headline]) / b.steps,
                                f"{other}_ms_per_step": 1e3 * statistics.median(times[other]) / b.steps}
    return out


def report(out: dict) -> None:
    print(f"backend {out['backend']} ({out['device']}), jax {out['jax']}; {out['size']}: state "
          f"{out['state_bytes'] / 2**20:.0f} MB in {out['leaves']} floating leaves, the step {out['step_kernels']} "
          f"kernels; {out['steps']} steps x {out['rounds']} rounds; headline {out['headline']} time")
    print(f"state copy (x * 1 per leaf) {out['copy_ms']:.3f} ms ({out['copy_bandwidth_GBps']:.0f} GB/s read and "
          "written)")
    print(f"{'user step':12s} {out['user_ms_per_step']:8.3f} ms/step")
    for name, w in out["writers"].items():
        lo, hi = w["ratio_95"]
        print(f"{name:12s} {w['ms_per_step']:8.3f} ms/step  {w['added_ms']:+8.3f} ms  user/this {w['ratio']:.3f} "
              f"[95% {lo:.3f}, {hi:.3f}; spread {w['ratio_spread'][0]:.3f}-{w['ratio_spread'][1]:.3f}]  "
              f"alone {w['alone_ms']:.3f} ms  {w['kernels']} kernels")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", choices=sorted(SIZES), default="realistic")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if args.steps < 1 or args.rounds < 1:
        print("error: --steps and --rounds must be at least 1", file=sys.stderr)
        return 2
    b = Bench(args.size, args.steps)
    copy_s = b.copy_seconds()
    with_step, alone = measure(b, args.rounds)
    out = summary(b, args, with_step, alone, copy_s)
    report(out)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
