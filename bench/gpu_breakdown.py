"""Where the block commit's time goes on top of the user's loop, each part measured in one interleaved
run (the order rotates round by round, so machine noise hits every loop): wall time on a GPU or TPU
(the device does the work there), process CPU time on the CPU. Five loops of the same step, each
``--steps`` steps of a fresh seed per round:

* **user**: ``step = jax.jit(program.step, donate_argnums=(0, 1))``, ``p, o, aux = step(p, o, batch)``;
* **+row**: the user's loop and the harness's row writer after each step (its dispatch, and its read
  of the step's outputs on the device);
* **+copy**: that, and the restore copy of the state every K steps (``--block``), as a block's start
  takes it;
* **quiet**: the block loop as ``stress --block K`` runs it, with two switches of this benchmark's
  own: the records go nowhere (no results file, no writer thread) and each block's verdict is not
  fetched (its rows are taken as clean on the host, with no wait for the device);
* **block**: the block loop as ``stress --block K`` runs it: results sink, writer thread, one fetch
  of each block's rows while the next block runs.

Parts, per step: row = +row - user; copy = +copy - +row; loop = quiet - +copy (the host's
bookkeeping: the same-program step's call, the records, the block sizer); verdict and writer = block
- quiet. Per round they add up to block - user exactly; the medians are printed beside the median
gap, and the check is that they agree within 0.02 ms a step (``adds_up``). The counts beside them
(dispatches, host syncs, bytes to the host per step) come from the harness's own counters, which the
suite holds to the protocol (tests/stress/loop/test_dispatch_order.py).

``--program NAME --program-option k=v`` measures another program (#35409: ``--program issue-35409
--program-option scale=1``) in place of the built-in model at ``--size``; ``--loops user,block`` runs
those loops alone (user and block always run: their ratio is the headline, user/block).

``--trace DIR`` also records a ``jax.profiler`` trace (Perfetto JSON) of the block loop over three
block boundaries and summarizes it (:func:`summarize_trace`): per device timeline, the idle gaps
longer than 20 us between the first and last event, and the main thread's CPU time against the
wall time of the traced run.

    python bench/gpu_breakdown.py [--size tiny|realistic] [--steps 300] [--rounds 9] [--block 128]
        [--loops user,+row,+copy,quiet,block] [--program NAME [--program-option K=V ..]] [--json F] [--trace DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import jax  # noqa: E402
import numpy as np  # noqa: E402
from as_stress import stress_seed  # noqa: E402
from stress_overhead import SIZES, median_interval  # noqa: E402

from xla_harness.names import BLOCK_ROWS as ROWS  # noqa: E402
from xla_harness.programs.options import literal_option  # noqa: E402
from xla_harness.stress.device.inject import step_keys  # noqa: E402
from xla_harness.stress.device.step_rows import new_rows  # noqa: E402
from xla_harness.stress.loop import blocks as blocks_module  # noqa: E402
from xla_harness.stress.loop.block_size import new_block_size  # noqa: E402
from xla_harness.stress.results import provenance  # noqa: E402
from xla_harness.stress.runner import check_same_program, first_batch, initial_state, prepare, run_seed  # noqa: E402
from xla_harness.stress.spec import StressSpec  # noqa: E402

LOOPS = ("user", "+row", "+copy", "quiet", "block")
PARTS = (("row", "+row", "user"), ("copy", "+copy", "+row"), ("loop", "quiet", "+copy"),
         ("verdict and writer", "block", "quiet"))
ADDS_UP_S = 20e-6  # the parts' medians against the gap's median, per step
GAP_S = 20e-6  # a device idle gap worth listing


class NullStore:
    """Where the quiet loop's records go: nowhere (no file, no thread)."""

    def append(self, record) -> None:
        pass

    def drain(self) -> None:
        pass

    def line_cpu_seconds(self) -> float:
        return 0.0


CLEAN_ROWS = np.zeros((ROWS, 3), np.float32)
CLEAN_ROWS[:, 1], CLEAN_ROWS[:, 2] = -1.0, 1.0  # every value finite, the new state finite


@contextlib.contextmanager
def verdicts_not_fetched():
    """The benchmark's switch: each block's rows read as clean on the host, with no fetch (no wait)."""
    real = blocks_module.PendingBlock.resolve
    blocks_module.PendingBlock.resolve = lambda self, h: CLEAN_ROWS[ROWS - (self.end - self.start):]
    try:
        yield
    finally:
        blocks_module.PendingBlock.resolve = real


class Loops:
    def __init__(self, size: str, steps: int, block: int, program: str | None = None,
                 options: tuple[tuple[str, object], ...] = ()) -> None:
        self.steps, self.block = steps, block
        if program is None:
            spec = StressSpec(modes=("full",), remats=(True,), seeds=(1,), steps=steps, block=block, **SIZES[size])
        else:
            spec = StressSpec(program=program, program_options=options, seeds=(1,), steps=steps, block=block)
        self.h = prepare(spec, spec.configs()[0])
        state = initial_state(self.h, 1)
        self.h = check_same_program(self.h, state.params, state.opt_state, first_batch(self.h, 1))
        self.fingerprint = self.h.fingerprint
        self.state_bytes = sum(x.nbytes for x in jax.tree_util.tree_leaves((state.params, state.opt_state)))
        del state
        self.program = self.h.program
        self.user_step = jax.jit(self.program.step, donate_argnums=(0, 1))
        self.tmp = Path(tempfile.mkdtemp(prefix="xla-harness-breakdown-"))
        self.env = provenance.environment()
        self.runs = 0

    def _user(self, seed: int, row: bool, copy: bool) -> None:
        h, steps, k = self.h, self.steps, self.block
        p, o = self.program.init(jax.random.key(seed))
        rows, aux, kept = new_rows(), None, None
        write_row, _ = h.counters.uncounted(h.write_row)  # as the block loop calls it: no counting frame
        for s in range(steps):
            if copy and s % k == 0:
                kept = h.copy((p, o))  # noqa: F841 - held as a block's restore point is, until the next
            p, o, aux = self.user_step(p, o, self.program.batch(step_keys(seed, s)[0], s))
            if row:
                rows = write_row(rows, p, o, aux)
                if (s + 1) % k == 0:
                    rows = new_rows()
        jax.block_until_ready((p, o, aux, rows))

    def _block(self, seed: int, quiet: bool) -> None:
        h = self.h
        size = new_block_size(h.spec)
        if quiet:
            with verdicts_not_fetched():
                for _ in run_seed(h, seed, initial_state(h, seed), NullStore(), self.tmp, self.env, block_size=size):
                    pass
            return
        self.runs += 1
        stress_seed(h, seed, self.tmp / f"stress{self.runs}.jsonl", self.env, size)

    def run(self, loop: str, seed: int) -> None:
        if loop in ("user", "+row", "+copy"):
            self._user(seed, row=loop != "user", copy=loop == "+copy")
        else:
            self._block(seed, quiet=loop == "quiet")

    def counts(self, seed: int) -> dict:
        """The block loop's dispatches, host syncs and bytes to the host per step (one untimed run)."""
        c = self.h.counters
        before = (c.dispatches, c.host_syncs, c.d2h_bytes)
        self.run("block", seed)
        after = (c.dispatches, c.host_syncs, c.d2h_bytes)
        d, s, b = ((x - y) / self.steps for x, y in zip(after, before, strict=True))
        return {"dispatches": d, "host_syncs": s, "d2h_bytes": b}

    def close(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)


def breakdown(times: dict[str, list[float]], steps: int) -> dict:
    """Per step: each loop's median, each part's median (per-round differences) with its interval, the
    gap block - user, the parts' sum, and whether they add up within :data:`ADDS_UP_S` (with every
    loop run; else the parts that were measured)."""
    per = {k: [t / steps for t in v] for k, v in times.items()}
    out: dict = {"loops_s": {k: statistics.median(v) for k, v in per.items()}, "parts_s": {}}
    for name, a, b in PARTS:
        if a not in per or b not in per:
            continue
        d = [x - y for x, y in zip(per[a], per[b], strict=True)]
        out["parts_s"][name] = {"median": statistics.median(d), "95": median_interval(d)}
    gap = [x - y for x, y in zip(per["block"], per["user"], strict=True)]
    ratio = [u / x for u, x in zip(per["user"], per["block"], strict=True)]
    out["gap_s"] = statistics.median(gap)
    out["parts_sum_s"] = sum(p["median"] for p in out["parts_s"].values())
    out["adds_up"] = abs(out["parts_sum_s"] - out["gap_s"]) <= ADDS_UP_S if len(out["parts_s"]) == len(PARTS) \
        else None
    out["user_over_block"] = {"median": statistics.median(ratio), "95": median_interval(ratio)}
    return out


def summarize_trace(trace: dict, wall_s: float | None = None, main_cpu_s: float | None = None) -> dict:
    """A Perfetto JSON trace (``jax.profiler.trace(..., create_perfetto_trace=True)``) summarized: per
    device timeline (a process named ``/device:...``; on the CPU, the host's XLA executor threads), its
    busy time (events merged) and its idle gaps longer than :data:`GAP_S` between its first and last
    event; the Python main thread's busy time; with the traced run's wall and main-thread CPU time."""
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    procs = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"}
    threads = {(e["pid"], e.get("tid")): e["args"]["name"] for e in events
               if e.get("ph") == "M" and e.get("name") == "thread_name"}
    timelines: dict[str, list[tuple[float, float]]] = {}
    for e in events:
        if e.get("ph") != "X" or "dur" not in e:
            continue
        proc, thread = procs.get(e["pid"], ""), threads.get((e["pid"], e.get("tid")), "")
        if proc.startswith("/device:"):
            key = proc
        elif thread.startswith("tf_XLA"):
            key = f"{proc} XLA executor threads"
        elif thread == "python":
            key = "python main thread"
        else:
            continue
        timelines.setdefault(key, []).append((float(e["ts"]), float(e["ts"]) + float(e["dur"])))
    out: dict = {"timelines": {}}
    for key, spans in sorted(timelines.items()):
        merged: list[list[float]] = []
        for a, b in sorted(spans):
            if merged and a <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], b)
            else:
                merged.append([a, b])
        gaps = [(merged[i + 1][0] - merged[i][1]) * 1e-6 for i in range(len(merged) - 1)]
        long = [g for g in gaps if g > GAP_S]
        out["timelines"][key] = {"span_s": (merged[-1][1] - merged[0][0]) * 1e-6,
                                 "busy_s": sum(b - a for a, b in merged) * 1e-6,
                                 "gaps_over_20us": len(long), "gaps_over_20us_s": sum(long),
                                 "largest_gap_s": max(gaps, default=0.0)}
    if wall_s is not None:
        out["wall_s"] = wall_s
    if main_cpu_s is not None:
        out["main_thread_cpu_s"] = main_cpu_s
    return out


def traced(loops: Loops, seed: int, folder: Path) -> dict:
    """The block loop over three block boundaries under ``jax.profiler``, summarized; the trace kept."""
    steps = loops.steps
    loops.steps = min(steps, 3 * loops.block + 1)
    try:
        with jax.profiler.trace(str(folder), create_perfetto_trace=True):
            w0, c0 = time.perf_counter(), time.thread_time()
            loops.run("block", seed)
            wall, cpu = time.perf_counter() - w0, time.thread_time() - c0
    finally:
        loops.steps = steps
    found = sorted(folder.rglob("perfetto_trace.json.gz"))
    if not found:
        return {"error": f"jax.profiler wrote no perfetto_trace.json.gz under {folder}"}
    with gzip.open(found[-1]) as f:
        summary = summarize_trace(json.load(f), wall, cpu)
    summary["file"] = str(found[-1])
    summary["steps"] = min(steps, 3 * loops.block + 1)
    return summary


def bench(size: str, steps: int, rounds: int, block: int, trace: Path | None = None,
          loops_run: tuple[str, ...] = LOOPS, program: str | None = None,
          options: tuple[tuple[str, object], ...] = ()) -> dict:
    loops = Loops(size, steps, block, program, options)
    names = tuple(k for k in LOOPS if k in loops_run or k in ("user", "block"))
    for loop in names:  # compile and warm up (untimed)
        loops.run(loop, 1000)
    counts = loops.counts(2000)
    cpu: dict[str, list[float]] = {k: [] for k in names}
    wall: dict[str, list[float]] = {k: [] for k in names}
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for loop in order:
            c0, w0 = time.process_time(), time.perf_counter()
            loops.run(loop, 1 + r)
            cpu[loop].append(time.process_time() - c0)
            wall[loop].append(time.perf_counter() - w0)
    trace_summary = traced(loops, 3000, trace) if trace is not None else None
    loops.close()
    headline = "cpu" if jax.default_backend() == "cpu" else "wall"
    what = {"program": program, "program_options": dict(options)} if program else {"size": size, **SIZES[size]}
    return {**what, "loops": list(names), "steps": steps, "rounds": rounds, "block": block,
            "state_mb": loops.state_bytes / 2**20, "step_id": loops.fingerprint["id"],
            "backend": jax.default_backend(), "device": jax.devices()[0].device_kind, "jax": jax.__version__,
            "cpus": os.cpu_count(), "load": os.getloadavg()[0], "headline": headline, "counts": counts,
            "cpu": breakdown(cpu, steps), "wall": breakdown(wall, steps), "trace": trace_summary}


def report(r: dict) -> None:
    head = r["headline"]
    b = r[head]
    name = "CPU" if head == "cpu" else "wall"
    what = r.get("program") or r["size"]
    if r.get("program_options"):
        what += " " + " ".join(f"{k}={v}" for k, v in r["program_options"].items())
    print(f"== {what}: state {r['state_mb']:.0f} MB, {r['steps']} steps x {r['rounds']} rounds, --block "
          f"{r['block']}, step {r['step_id']} ({r['backend']}: {r['device']}, jax {r['jax']}, {r['cpus']} CPUs, "
          f"load {r['load']:.1f}); {name} time")
    for loop in r["loops"]:
        print(f"  {loop:6s} {b['loops_s'][loop] * 1e3:9.4f} ms/step")
    for part, p in b["parts_s"].items():
        lo, hi = p["95"]
        print(f"  {part:19s} {p['median'] * 1e3:+9.4f} ms/step [95% {lo * 1e3:+.4f}, {hi * 1e3:+.4f}]")
    ratio = b["user_over_block"]
    said = {True: "adds up", False: "does NOT add up", None: "not every part measured"}[b["adds_up"]]
    print(f"  gap block - user {b['gap_s'] * 1e3:+.4f} ms/step; parts sum {b['parts_sum_s'] * 1e3:+.4f}: "
          f"{said} (within {ADDS_UP_S * 1e3:.2f} ms); user/block "
          f"{ratio['median']:.3f} [95% {ratio['95'][0]:.3f}, {ratio['95'][1]:.3f}]")
    c = r["counts"]
    print(f"  per step: dispatches {c['dispatches']:.3f}, host syncs {c['host_syncs']:.4f}, bytes to the host "
          f"{c['d2h_bytes']:.1f}")
    t = r.get("trace")
    if t and "timelines" in t:
        print(f"  trace ({t['steps']} steps, {t['file']}): wall {t['wall_s'] * 1e3:.1f} ms, main thread CPU "
              f"{t['main_thread_cpu_s'] * 1e3:.1f} ms")
        for key, tl in t["timelines"].items():
            print(f"    {key}: busy {tl['busy_s'] * 1e3:.2f} of {tl['span_s'] * 1e3:.2f} ms; idle gaps > 20 us: "
                  f"{tl['gaps_over_20us']} ({tl['gaps_over_20us_s'] * 1e3:.2f} ms), largest "
                  f"{tl['largest_gap_s'] * 1e6:.0f} us")
    elif t:
        print(f"  trace: {t['error']}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", choices=sorted(SIZES), default="tiny")
    ap.add_argument("--steps", type=int, default=300, help="steps per loop and round (default 300)")
    ap.add_argument("--rounds", type=int, default=9, help="interleaved rounds (default 9)")
    ap.add_argument("--block", type=int, default=128, help="K, steps per block (default 128)")
    ap.add_argument("--loops", default=",".join(LOOPS),
                    help=f"loops to run, of {','.join(LOOPS)} (user and block always run)")
    ap.add_argument("--program", help="a program (as stress --program) in place of the built-in model at --size")
    ap.add_argument("--program-option", action="append", default=[], metavar="K=V",
                    help="an option of --program (repeatable; values as stress reads them)")
    ap.add_argument("--json", type=Path, help="also write the figures as JSON")
    ap.add_argument("--trace", type=Path, help="also trace three block boundaries with jax.profiler into this folder")
    args = ap.parse_args()
    if args.rounds < 1 or args.steps < 1 or not 1 <= args.block <= ROWS:
        ap.error(f"--rounds and --steps must be positive, --block between 1 and {ROWS}")
    loops_run = tuple(x for x in args.loops.split(",") if x)
    unknown = [x for x in loops_run if x not in LOOPS]
    if unknown:
        ap.error(f"--loops: no loop {', '.join(unknown)} (loops: {', '.join(LOOPS)})")
    if args.program_option and not args.program:
        ap.error("--program-option needs --program")
    try:
        options = tuple(sorted(dict(literal_option(o) for o in args.program_option).items()))
    except ValueError as e:
        ap.error(f"--program-option: {e}")
    r = bench(args.size, args.steps, args.rounds, args.block, args.trace, loops_run, args.program, options)
    report(r)
    if args.json:
        args.json.write_text(json.dumps(r, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
