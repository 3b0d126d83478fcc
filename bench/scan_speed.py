"""Parse + scan speed on a generated 100k-instruction module, against jaxlib's C++ HLO parser.

The module has many small fusions of the kinds the scanner looks at (scatter through a
transpose, dynamic-update-slice, elementwise), metadata on every line like real dumps,
and one entry computation. Both parsers read the same text, rounds interleaved, best of
each; jaxlib's in a child process (its CHECK failures, e.g. on some scheduled dumps, abort
the process: that is reported as an error, not the end of the bench), timed there by the
child's own process CPU time around the parse alone. Each of our rounds starts as a fresh
``xla-harness scan`` would: every parse reads through a shape table of its own and every scan
builds its module's alias analysis anew (nothing is kept between them).
A module jaxlib's parser aborts on as scheduled (libtpu's dumps: an async wrapper's operand
after it) is read by both parsers without ``is_scheduled=true``. Each round's ratio (our
parse+scan, then XLA's parse right after, process CPU time) is printed as a median and range:
on a shared machine the pair of one round sees the same load.
Target: parse+scan <= 1.2x the C++ parse, on the generated module and on a full-size TPU dump.

    python bench/scan_speed.py [--instructions 100000] [--repeat 5]
    python bench/scan_speed.py --hlo FILE     # the same measurement on any HLO text file
    python bench/scan_speed.py --jax-layers 1500
        # on the CPU-compiled HLO of a real jax training step: an unrolled residual MLP of
        # that many layers with a tied embedding (1500 layers: about 160k instructions)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from xla_harness.hlo.parser import HloParseError, parse_module  # noqa: E402
from xla_harness.hlo.scan import scan_module  # noqa: E402
from xla_harness.hlo.xla_oracle import IsolatedXlaParser  # noqa: E402

TARGET = 1.2  # parse+scan over jaxlib's parse, process CPU time
META = ('metadata={{op_name="jit(train_step)/jvp(model)/layer_{i}/dot_general" source_file="/src/model.py" '
        'source_line={i}}}')


def generate(n_instructions: int) -> str:
    parts = ["HloModule bench, is_scheduled=true\n",
             "%add (x: f32[], y: f32[]) -> f32[] {\n  %x = f32[] parameter(0)\n  %y = f32[] parameter(1)\n"
             "  ROOT %s = f32[] add(f32[] %x, f32[] %y)\n}\n"]
    entry = ["ENTRY %main (w: f32[32,64], idx: s32[8,1], upd: f32[8,32]) -> f32[32,64] {",
             "  %w = f32[32,64]{1,0} parameter(0)", "  %idx = s32[8,1]{1,0} parameter(1)",
             "  %upd = f32[8,32]{1,0} parameter(2)"]
    count, i, prev = 5, 0, "w"
    while count < n_instructions:
        meta = META.format(i=i)
        parts.append(
            f"%fused_{i} (p0: f32[32,64], p1: s32[8,1], p2: f32[8,32]) -> f32[64,32] {{\n"
            f"  %p0.{i} = f32[32,64]{{1,0}} parameter(0)\n"
            f"  %n.{i} = f32[32,64]{{1,0}} negate(f32[32,64]{{1,0}} %p0.{i}), {meta}\n"
            f"  %t.{i} = f32[64,32]{{{'0,1' if i % 2 else '1,0'}}} transpose(f32[32,64]{{1,0}} %p0.{i}), "
            f"dimensions={{1,0}}, {meta}\n"
            f"  %p1.{i} = s32[8,1]{{1,0}} parameter(1)\n"
            f"  %p2.{i} = f32[8,32]{{1,0}} parameter(2)\n"
            f"  ROOT %sc.{i} = f32[64,32]{{1,0}} scatter(f32[64,32]{{1,0}} %t.{i}, s32[8,1]{{1,0}} %p1.{i}, "
            f"f32[8,32]{{1,0}} %p2.{i}), update_window_dims={{1}}, inserted_window_dims={{0}}, "
            f"scatter_dims_to_operand_dims={{0}}, index_vector_dim=1, to_apply=%add, {meta}\n}}\n")
        entry.append(f"  %f.{i} = f32[64,32]{{1,0}} fusion(f32[32,64]{{1,0}} %{prev}, s32[8,1]{{1,0}} %idx, "
                     f"f32[8,32]{{1,0}} %upd), kind=kLoop, calls=%fused_{i}, {meta}")
        entry.append(f"  %r.{i} = f32[32,64]{{1,0}} reshape(f32[64,32]{{1,0}} %f.{i}), {meta}")
        prev = f"r.{i}"
        count += 8
        i += 1
    entry.append(f"  ROOT %out = f32[32,64]{{1,0}} copy(f32[32,64]{{1,0}} %{prev})")
    entry.append("}")
    return "".join(parts) + "\n".join(entry) + "\n"


def jax_training_step_hlo(layers: int) -> str:
    """The optimized HLO text jax compiles on CPU for one SGD step of an unrolled residual
    MLP with a tied embedding (gather in, transposed matmul out; donated parameters)."""
    import jax
    import jax.numpy as jnp

    def loss(params, idx):
        h = params["emb"][idx]
        for i in range(layers):
            h = jnp.tanh(h @ params["w"][i]) + h
            h = h / (1e-6 + jnp.sqrt(jnp.mean(h * h, axis=-1, keepdims=True)))
        return jnp.mean(jax.nn.log_softmax(h @ params["emb"].T)[..., 0])

    def step(params, idx):
        grads = jax.grad(loss)(params, idx)
        return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads)

    params = {"emb": jnp.ones((64, 32)), "w": jnp.ones((layers, 32, 32))}
    with jax.default_device(jax.devices("cpu")[0]):
        return jax.jit(step, donate_argnums=0).lower(params, jnp.zeros((8,), jnp.int32)).compile().as_text()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--instructions", type=int, default=100_000, help="size of the generated module")
    ap.add_argument("--repeat", type=int, default=5, help="rounds of each parser (best of each, and the median "
                    "and range of the rounds' ratios, are reported)")
    source = ap.add_mutually_exclusive_group()
    source.add_argument("--hlo", type=Path, help="measure this HLO text file instead of the generated module")
    source.add_argument("--jax-layers", type=int, metavar="N",
                        help="measure the CPU-compiled training step of an N-layer jax model instead")
    ap.add_argument("--as-written", action="store_true",
                    help="time the text exactly as written: no unscheduled copy when XLA's parser crashes on it")
    args = ap.parse_args()
    if args.instructions < 8 or args.repeat < 1 or (args.jax_layers is not None and args.jax_layers < 1):
        ap.error("--instructions must be >= 8, --repeat and --jax-layers >= 1")
    if args.jax_layers is not None:
        text = jax_training_step_hlo(args.jax_layers)
    elif args.hlo is not None:
        try:
            text = args.hlo.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            print(f"error: cannot read {args.hlo}: {exc}", file=sys.stderr)
            return 2
    else:
        text = generate(args.instructions)
    try:  # both parsers must read it before anything is timed
        parse_module(text, str(args.hlo or "bench"))
    except HloParseError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    with IsolatedXlaParser() as xla:
        return _measure(args, text, xla)


def unscheduled(text: str) -> str:
    """The module with ``is_scheduled=true`` dropped from its header line: jaxlib's parser rebuilds a
    scheduled module's schedule from the instruction order and aborts the process when an async
    wrapper's operand comes later (libtpu's dumps); unscheduled it reads the same instructions."""
    end = text.find("\n")
    head = text[:end] if end >= 0 else text
    return head.replace(", is_scheduled=true", "", 1).replace("is_scheduled=true, ", "", 1) + text[len(head):]


def _measure(args: argparse.Namespace, text: str, xla: IsolatedXlaParser) -> int:
    first = xla.parse(text, structure=False)
    if not first.accepts and first.crashed and not args.as_written and unscheduled(text) != text:
        print(f"XLA's parser crashed on the scheduled module ({first.crashed[:120]}); both parsers read the "
              "unscheduled copy (header without is_scheduled=true)")
        text = unscheduled(text)
        first = xla.parse(text, structure=False)
    if not first.accepts:
        why = (f"XLA's parser crashed ({first.crashed})" if first.crashed
               else f"XLA's parser refuses the module: {first.error}")
        print(f"error: {why}", file=sys.stderr)
        return 2
    t_py, t_cc, cpu_py, cpu_cc, cpu_parse = [], [], [], [], []
    for _ in range(args.repeat):  # interleaved rounds, best of each
        t0, c0 = time.perf_counter(), time.process_time()
        mod = parse_module(text, str(args.hlo or "bench"))
        c1 = time.process_time()
        findings = scan_module(mod)
        t_py.append(time.perf_counter() - t0)
        cpu_py.append(time.process_time() - c0)
        cpu_parse.append(c1 - c0)
        again = xla.parse(None, structure=False)  # the same text, already in the child
        if not again.accepts:
            print(f"error: XLA's parser failed on a repeat ({again.crashed or again.error})", file=sys.stderr)
            return 2
        t_cc.append(again.wall_s)
        cpu_cc.append(again.cpu_s)
    py, cc = min(t_py), min(t_cc)
    print(f"module: {mod.instruction_count()} instructions, {len(text) / 1e6:.1f} MB of text, "
          f"{len(findings)} in-place fusion outputs ({sum(f.cls == 'hazard' for f in findings)} hazards)")
    print(f"xla-harness parse+scan: {py:.3f} s wall, {min(cpu_py):.3f} s CPU (best of {args.repeat})")
    print(f"jaxlib C++ parse:       {cc:.3f} s wall, {min(cpu_cc):.3f} s CPU")
    print(f"ratio python/c++: {py / cc:.2f} wall clock, {min(cpu_py) / min(cpu_cc):.2f} process CPU time "
          f"(best over best; target <= {TARGET}; CPU time is the steadier figure on a shared machine)")
    paired = sorted(a / b for a, b in zip(cpu_py, cpu_cc, strict=True))
    print(f"process CPU time ratio of each round (ours, then XLA's right after): median "
          f"{statistics.median(paired):.2f}, range {paired[0]:.2f}-{paired[-1]:.2f} over {len(paired)} rounds")
    cc_cpu = min(cpu_cc)
    print(f"of which reading {min(cpu_parse) / cc_cpu:.2f}, scanning {(min(cpu_py) - min(cpu_parse)) / cc_cpu:.2f}"
          " (process CPU time over the C++ parse)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
