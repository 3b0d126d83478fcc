"""One command for the GPU evidence (``make gpu-evidence``): on a machine with a GPU and the jax it
has (run from source: ``PYTHONPATH=$PWD python3 tools/gpu_evidence.py``; no network is needed), in
at most ``--budget`` seconds (default 480), each step in its own process with what is left of the
budget as its limit, in this order:

0. ``bench/gpu_breakdown.py --size realistic --block 128 --steps 300 --rounds 9 --trace``: where the
   block loop's time goes (user, +row, +copy, quiet, block; the parts add up to the gap) and a
   ``jax.profiler`` trace of three block boundaries summarized (device idle gaps, main-thread CPU);
   then the same, user and block loops only, at ``--block 16`` and ``--block 1024`` (1024 steps x 9
   rounds): the K sweep;
1. ``bench/stress_overhead.py --size realistic --steps 100`` (2 rounds): the harness against a plain
   loop, wall time and counts;
2. ``bench/stress_overhead.py`` at 1000 steps (1 round);
3. ``bench/first_failure.py``: what the first failure of a 1000-step realistic run costs;
4. ``stress --program issue-35409 --compile-only`` at scale 1/32 with ``--xla_dump_to``: the compiler's
   whole dump (schedule, buffer assignment, its values, whatever live range it writes), the input of a
   memory-plan check;
5. ``bench/first_block.py``: time to the first block, the #35409 program at scale 1/32;
6. ``stress --program issue-35409 --protocol frozen`` (10 calls, ``--frozen-scale``, default full size),
   per-leaf nondeterminism, with the device's autotune results written
   (``XLA_FLAGS=--xla_gpu_dump_autotune_results_to``);
7. the frozen run again with ``XLA_FLAGS=--xla_gpu_deterministic_ops=true``, the flag ``--variants
   deterministic`` sets (one compile, without a second baseline);
8. ``stress --program issue-35409 --compile-only`` at full size: the device compiler's module, buffer
   assignment and live range (the harness keeps all three), the full-size input of a memory-plan check;
9. ``xla-harness memcheck`` over both memory-plan compiles (steps 4 and 8), on the device machine's CPU;
10. ``bench/gpu_breakdown.py --program issue-35409 --program-option scale=1 --loops user,block``: the
    full-size ratio, at what fits (20 steps x 3 rounds of a ~0.6 s step, two compiles).

``--only memory-plan,memory-plan-full,memcheck`` runs the named steps alone, in this order.

The full-size #35409 compile took 303 s wall on the H200 machine (results/gpu/h200-2026-11-26), so
in 480 s the last steps may not fit: they are listed as not run, with the budget that was left.

Everything goes under ``results/gpu/<date>-<device>/`` (``--out`` to choose), one folder per step with
its ``output.txt`` and what it wrote, and a ``README.md`` this script writes: per step the command,
its exit status and time, and the lines that carry its figures. A step that does not fit in the
budget left is listed as not run. Afterwards, on the development machine, ``make gpu-fidelity
AUTOTUNE=<out>/frozen/autotune.txt`` holds the ahead-of-time compile to the device's choices.

``--tiny`` runs every step at a size a CPU finishes in about two minutes (the test of this script);
on a CPU the deterministic step is not run (its flag is the GPU compiler's), and the README says so.
Exit 0 when every step ran (or, on a CPU, was not run for want of a GPU), 1 when one failed or did not
fit.

    python tools/gpu_evidence.py [--out DIR] [--budget 480] [--frozen-scale 1] [--only STEP,..] [--tiny]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from xla_harness.runtime import subproc  # noqa: E402


@dataclass
class Step:
    name: str
    what: str
    argv: list[str]
    cap: float  # seconds at most, when the budget leaves that much
    env: dict[str, str] = field(default_factory=dict)
    keep: str = r""  # output lines matching this are the figures quoted in the README
    gpu_only: bool = False
    measured_exits: tuple[int, ...] = (0,)  # stress exits 1 when it measured and found something


@dataclass
class Outcome:
    step: Step
    status: str  # ok | failed (exit N) | timed out | not run | needs a GPU
    seconds: float = 0.0
    figures: list[str] = field(default_factory=list)


def steps(out: Path, tiny: bool, frozen_scale: float = 1.0) -> list[Step]:
    py = sys.executable
    size = "tiny" if tiny else "realistic"
    scale = "0.015625" if tiny else f"{frozen_scale:g}"
    frozen_steps = "3" if tiny else "10"
    frozen = [py, "-m", "xla_harness.cli", "stress", "--program", "issue-35409", "--program-option",
              f"scale={scale}", "--protocol", "frozen", "--modes", "full", "--remat", "on", "--seeds", "1",
              "--steps", frozen_steps]
    bench_keep = r"^(user|block|step) |device->host|target"
    breakdown_keep = r"^==|gap block|per step"
    first_block_program = (["--program", "examples/quickstart/my_model.py:make"] if tiny else
                           ["--program", "issue-35409", "--option", "scale=0.03125"])
    autotune = str(out / "frozen" / "autotune.txt")
    xla_flags = os.environ.get("XLA_FLAGS", "")
    dump = out / "memory-plan" / "dump"
    memory_plan = [py, "-m", "xla_harness.cli", "stress", "--program", "issue-35409", "--program-option",
                   "scale=0.015625" if tiny else "scale=0.03125", "--compile-only", "--out", str(out / "memory-plan")]
    memory_plan_full = [py, "-m", "xla_harness.cli", "stress", "--program", "issue-35409", "--program-option",
                        "scale=0.015625" if tiny else "scale=1", "--compile-only",
                        "--out", str(out / "memory-plan-full")]
    memcheck = [py, "-m", "xla_harness.cli", "memcheck", str(out / "memory-plan" / "hlo"),
                str(out / "memory-plan-full" / "hlo")]
    breakdown = [py, "bench/gpu_breakdown.py", "--size", size]
    k_sweep = [Step(f"k{k}", f"the block loop against a plain loop at --block {k} ({size}, "
                    f"{'32' if tiny else '1024'} steps x {'2' if tiny else '9'} rounds)",
                    [*breakdown, "--loops", "user,block", "--block", str(k // 8 if tiny else k), "--steps",
                     "32" if tiny else "1024", "--rounds", "2" if tiny else "9",
                     "--json", str(out / f"k{k}" / "k.json")],
                    90, keep=breakdown_keep) for k in (16, 1024)]
    return [
        Step("breakdown", f"where the block loop's time goes: user, +row, +copy, quiet, block ({size}, --block "
             f"{'8' if tiny else '128'}, {'16' if tiny else '300'} steps x {'2' if tiny else '9'} rounds), and a "
             "jax.profiler trace of three block boundaries",
             [*breakdown, "--block", "8" if tiny else "128", "--steps", "16" if tiny else "300", "--rounds",
              "2" if tiny else "9", "--trace", str(out / "breakdown" / "trace"), "--json",
              str(out / "breakdown" / "breakdown.json")], 150,
             keep=breakdown_keep + r"|^  (row|copy|loop|verdict)|idle"),
        *k_sweep,
        Step("bench-100", f"the harness against a plain loop, {size}, 100 steps x 2 rounds",
             [py, "bench/stress_overhead.py", "--size", size, "--steps", "20" if tiny else "100", "--rounds",
              "1" if tiny else "2", "--json", str(out / "bench-100" / "bench.json")], 90, keep=bench_keep),
        Step("bench-1000", f"the harness against a plain loop, 1000 steps x 1 round ({size})",
             [py, "bench/stress_overhead.py", "--size", size, "--steps", "40" if tiny else "1000", "--rounds", "1",
              "--json", str(out / "bench-1000" / "bench.json")], 120, keep=bench_keep),
        Step("first-failure", f"the first failure of a {size} run: steps rerun and their time",
             [py, "bench/first_failure.py", "--size", size, "--steps", "60" if tiny else "1000", "--json",
              str(out / "first-failure" / "first_failure.json")], 90, keep=r"^first failure|^that block"),
        Step("memory-plan", "the compiler's whole dump of #35409 at scale 1/32 (its schedule, buffer assignment and "
             "whatever live range it writes): the input of a memory-plan check",
             memory_plan, 90, env={"XLA_FLAGS": f"{xla_flags} --xla_dump_to={dump} --xla_dump_hlo_as_text".strip()},
             keep=r"instructions|scan"),
        Step("first-block", "time to the first block against a plain loop's first step (#35409 at scale 1/32)",
             [py, "bench/first_block.py", *first_block_program, "--rounds", "1"], 90, keep=r"ratio|stress|plain"),
        Step("frozen", f"#35409 frozen, scale {scale}, per-leaf nondeterminism; the device's autotune results",
             frozen + ["--out", str(out / "frozen")], 240,
             env={"XLA_FLAGS": f"{xla_flags} --xla_gpu_dump_autotune_results_to={autotune}".strip()},
             keep=r"^issue-35409|nondet|^config", measured_exits=(0, 1)),
        Step("frozen-deterministic", "the frozen run again with XLA_FLAGS=--xla_gpu_deterministic_ops=true (what "
             "--variants deterministic sets)", frozen + ["--out", str(out / "frozen-deterministic")], 240,
             env={"XLA_FLAGS": f"{xla_flags} --xla_gpu_deterministic_ops=true".strip()},
             keep=r"^issue-35409|nondet|^config", gpu_only=True, measured_exits=(0, 1)),
        Step("memory-plan-full", "#35409 at full size compiled by the device's compiler: its module, buffer "
             "assignment and live range, the input of a memory-plan check", memory_plan_full, 420,
             keep=r"instructions|scan"),
        Step("memcheck", "xla-harness memcheck over both memory-plan compiles (the device compiler's live range "
             "compared)", memcheck, 120, keep=r"^(?!left out).*(conflict|live range|modules|checked)",
             measured_exits=(0, 1)),
        Step("full-size", f"#35409 at scale {'1/64' if tiny else '1'}: the block loop against a plain loop "
             f"({'8' if tiny else '20'} steps x {'2' if tiny else '3'} rounds, --block {'4' if tiny else '16'}: "
             "what fits the budget, not the 9 rounds of 300 steps a 0.01 interval needs)",
             [*breakdown, "--program", "issue-35409", "--program-option", "scale=0.015625" if tiny else "scale=1",
              "--loops", "user,block", "--block", "4" if tiny else "16", "--steps", "8" if tiny else "20",
              "--rounds", "2" if tiny else "3", "--json", str(out / "full-size" / "full.json")], 420,
             keep=breakdown_keep),
    ]


def run_step(step: Step, out: Path, left: float, gpu: bool) -> Outcome:
    folder = out / step.name
    if step.gpu_only and not gpu:
        return Outcome(step, "needs a GPU", figures=["not run: the flag changes nothing on this backend"])
    folder.mkdir(parents=True, exist_ok=True)
    limit = min(step.cap, left)
    if limit < 10:
        return Outcome(step, "not run", figures=[f"{left:.0f} s of the budget left"])
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "PYTHONUNBUFFERED": "1", **step.env}
    t0 = time.monotonic()
    print(f"gpu-evidence: {step.name} (at most {limit:.0f} s): {step.what}", flush=True)
    with open(folder / "output.txt", "w") as log:
        log.write("$ " + " ".join(step.argv) + "\n")
        log.flush()
        try:  # the step's whole process group is killed at its limit (xla_harness.runtime.subproc)
            proc = subproc.run(step.argv, timeout=limit, what=step.name, cwd=ROOT, env=env, stdout=log,
                               stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            code: int | None = proc.returncode
        except subproc.ChildTimeout:
            code = None
    seconds = time.monotonic() - t0
    text = (folder / "output.txt").read_text(errors="replace").splitlines()
    figures = [line.strip() for line in text[1:] if step.keep and re.search(step.keep, line.strip())][:12]
    if code is None:
        return Outcome(step, "timed out", seconds, figures)
    if code in step.measured_exits:  # a bench's 1 is a traceback, not a finding
        return Outcome(step, "ok", seconds, figures)
    return Outcome(step, f"failed (exit {code})", seconds, figures or text[-3:])


def device() -> tuple[str, str, bool]:
    """(the device kind as jax names it, a folder-safe slug of it, whether it is a GPU)."""
    code = "import jax; d = jax.devices()[0]; print(d.platform, d.device_kind, sep='|')"
    got = subproc.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                      env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    platform, _, kind = got.stdout.strip().rpartition("\n")[-1].partition("|")
    kind = kind or platform or "unknown"
    return kind, re.sub(r"[^a-z0-9]+", "-", kind.lower()).strip("-"), platform in ("gpu", "cuda", "rocm")


def readme(out: Path, outcomes: list[Outcome], kind: str, budget: float, spent: float, tiny: bool,
           only: str = "") -> str:
    import jax

    flags = (" --tiny" if tiny else "") + (f" --only {only}" if only else "")
    lines = [f"# GPU evidence: {kind}, {datetime.date.today().isoformat()}", "",
             f"Written by `tools/gpu_evidence.py{flags}` (`make gpu-evidence`): jax "
             f"{jax.__version__}, Python {sys.version.split()[0]}, {os.cpu_count()} host CPUs; "
             f"{spent:.0f} s of a {budget:.0f} s budget. Each folder holds the step's `output.txt` (its command "
             "first) and what it wrote.", "",
             "| step | what | status | seconds | figures |", "| --- | --- | --- | --- | --- |"]
    for o in outcomes:
        figures = "<br>".join(f.replace("|", "/") for f in o.figures) or "-"
        lines.append(f"| [{o.step.name}]({o.step.name}/output.txt) | {o.step.what} | {o.status} | "
                     f"{o.seconds:.0f} | {figures} |")
    if any(o.step.name == "frozen" and o.status == "ok" for o in outcomes):
        lines += ["", "Then, on the development machine: `make gpu-fidelity AUTOTUNE=" +
                  f"{out.name}/frozen/autotune.txt` (the ahead-of-time compile held to this device's autotuner)."]
    if tiny:
        lines += ["", "`--tiny`: every step at a size a CPU finishes quickly; these figures test the script, "
                  "they measure nothing about a GPU."]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, help="default: results/gpu/<date>-<device kind>")
    ap.add_argument("--budget", type=float, default=480.0, help="seconds for all steps together (default 480)")
    ap.add_argument("--tiny", action="store_true", help="every step at a CPU's size (tests this script)")
    ap.add_argument("--frozen-scale", type=float, default=1.0,
                    help="the #35409 frozen runs' scale (default 1, full size: about 300 s of compile on an H200)")
    ap.add_argument("--only", default="", metavar="STEP,..",
                    help="run only these steps (names as in the README's table), in the script's order")
    args = ap.parse_args()
    known = [st.name for st in steps(Path("."), True)]
    only = [name for name in args.only.split(",") if name]
    unknown = [name for name in only if name not in known]
    if unknown:
        print(f"error: --only: no step {', '.join(unknown)} (steps: {', '.join(known)})", file=sys.stderr)
        return 2
    if not 0 < args.frozen_scale <= 1:
        print("error: --frozen-scale must be in (0, 1]", file=sys.stderr)
        return 2
    if not args.budget > 0:
        print("error: --budget must be a positive number of seconds", file=sys.stderr)
        return 2
    kind, slug, gpu = device()
    out = args.out or ROOT / "results" / "gpu" / f"{datetime.date.today().isoformat()}-{slug}"
    if out.exists() and any(out.iterdir()):
        print(f"error: {out} exists and is not empty; choose another --out", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    outcomes = []
    for step in steps(out, args.tiny, args.frozen_scale):
        if only and step.name not in only:
            continue
        outcomes.append(run_step(step, out, args.budget - (time.monotonic() - t0), gpu))
        print(f"gpu-evidence: {step.name}: {outcomes[-1].status} ({outcomes[-1].seconds:.0f} s)", flush=True)
    spent = time.monotonic() - t0
    (out / "README.md").write_text(readme(out, outcomes, kind, args.budget, spent, args.tiny, args.only))
    (out / "outcomes.json").write_text(json.dumps(
        [{"step": o.step.name, "status": o.status, "seconds": round(o.seconds, 1), "figures": o.figures}
         for o in outcomes], indent=2) + "\n")
    print(f"gpu-evidence: {out}/README.md")
    bad = [o for o in outcomes if o.status not in ("ok", "needs a GPU")]
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
