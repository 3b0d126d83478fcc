"""Two compiles of one program held against each other, fusion by fusion: what an ahead-of-time
compile (``--target cuda:...``: no device, no autotuner) reproduces of the device's own compile.

Pure functions over two :class:`~xla_harness.hlo.ir.HloModule` (the optimized HLO of each compile):
:func:`facts` reads what one compile made, :func:`compare` sets two of them side by side and
:func:`format_fidelity` prints the table (Markdown). Compared:

* **size**: instructions (every computation), fusions;
* **fusions by content**: a fusion's content is its kind, its emitter (below), its output shape and
  the opcodes and shapes of every instruction it holds, nested fusions included; names are not
  compared (they are numbered per compile). A fusion of one compile is *matched* when the other
  holds one of the same content. Per name (the compiler names a fusion after what it computes,
  ``loop_multiply_fusion``, ``gemm_fusion_dot``, ``wrapped_transpose``; the number dropped), how many
  each compile has and how many are matched;
* **emitters**: a fusion's backend config names the emitter: ``__triton_gemm`` /
  ``__triton_nested_gemm_fusion`` (Triton gemm), ``__triton`` (Triton, no dot), any other kind as
  itself, none: XLA's native emitter;
* **dots by backend**: ``cuBLAS`` (a ``__cublas...`` custom-call), ``cuDNN`` (``__cudnn...``),
  ``Triton gemm`` (a dot in a Triton gemm fusion), ``native`` (a dot in any other fusion),
  ``unfused`` (a dot outside fusions);
* **outside fusions**: instructions of each opcode outside fusions (copies, transposes, custom-calls),
  where the counts differ;
* **Triton tiles**: of the Triton and Triton gemm fusions both compiles hold (matched by content), how
  many have the same tile configuration (``block_level_fusion_config`` or ``triton_gemm_config``);
* **scatters**: each fusion holding a scatter, with its output shape and where its in-place operand
  comes from in the calling computation (the producer's name and opcode, through bitcasts,
  get-tuple-elements and the fusion's parameter);
* **aliasing and sizes**: ``input_output_alias`` entries, argument, output and aliased bytes (from the
  entry computation's shapes);
* **the scanner's verdict**: :func:`xla_harness.hlo.scan.scan` under the GPU rules, counts per class.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field

from xla_harness.hlo.ir import Computation, HloModule, Instruction
from xla_harness.hlo.shapes import Shape

_BITS = {"pred": 8, "s2": 2, "u2": 2, "s4": 4, "u4": 4, "s8": 8, "u8": 8, "s16": 16, "u16": 16, "f16": 16,
         "bf16": 16, "s32": 32, "u32": 32, "f32": 32, "s64": 64, "u64": 64, "f64": 64, "c64": 64, "c128": 128}
_NUMBERED = re.compile(r"(\.\d+)+$")
_KIND = re.compile(r'"kind"\s*:\s*"([^"]*)"')
_TRITON_GEMM = ("__triton_gemm", "__triton_nested_gemm_fusion")
_THROUGH = ("bitcast", "get-tuple-element", "copy", "reshape", "transpose")
DOT_BACKENDS = ("cuBLAS", "cuDNN", "Triton gemm", "native", "unfused")


def array_bytes(shape: Shape) -> int:
    """Bytes of every array leaf of ``shape`` (8-bit floats and sub-byte types included)."""
    total = 0
    for _, leaf in shape.leaves():
        bits = _BITS.get(leaf.element_type) or (8 if leaf.element_type.startswith("f8") else 0)
        n = 1
        for d in leaf.dims:
            n *= d
        total += (n * bits + 7) // 8
    return total


def label(name: str) -> str:
    """A fusion's name without the compile's numbering: ``loop_multiply_fusion.12`` -> ``loop_multiply_fusion``."""
    return _NUMBERED.sub("", name.lstrip("%"))


def emitter(ins: Instruction) -> str:
    """What emits a fusion, by its backend config (module docstring)."""
    m = _KIND.search(ins.attrs.get("backend_config", ""))
    kind = m.group(1) if m else ""
    if kind in _TRITON_GEMM:
        return "Triton gemm"
    if kind == "__triton":
        return "Triton"
    return kind or "native"


def _tile_config(ins: Instruction) -> str:
    """The Triton gemm fusion's tile configuration as printed (block_level_fusion_config or
    triton_gemm_config), or ''."""
    text = ins.attrs.get("backend_config", "")
    try:
        config = json.loads(text).get("fusion_backend_config", {})
    except (ValueError, AttributeError):
        return ""
    if not isinstance(config, dict):
        return ""
    for key in ("block_level_fusion_config", "triton_gemm_config"):
        if key in config:
            return json.dumps(config[key], sort_keys=True)
    return ""


@dataclass
class ModuleFacts:
    """What one compile made (see the module docstring)."""

    instructions: int
    fusions: Counter = field(default_factory=Counter)  # label -> count
    contents: Counter = field(default_factory=Counter)  # content -> count
    labelled: Counter = field(default_factory=Counter)  # (content, label) -> count
    emitters: Counter = field(default_factory=Counter)  # emitter -> fusions
    dots: Counter = field(default_factory=Counter)  # backend -> dots
    tiles: dict = field(default_factory=dict)  # (emitter, content) -> tile configs (Triton fusions)
    unfused: Counter = field(default_factory=Counter)  # opcode -> count outside fusions
    scatters: Counter = field(default_factory=Counter)  # (label, shape, in-place operand from) -> count
    input_output_alias: tuple = ()
    argument_bytes: int = 0
    output_bytes: int = 0
    alias_bytes: int = 0
    scan: dict = field(default_factory=dict)  # class -> count


def _content(module: HloModule, ins: Instruction, depth: int = 0) -> tuple:
    """A fusion's content: kind, emitter, output shape and the sorted (opcode, shape) of everything it
    holds, nested computations included."""
    held: list[tuple] = []
    stack = list(ins.called)
    seen: set[str] = set()
    while stack:
        name = stack.pop()
        if name in seen or name not in module.by_name:
            continue
        seen.add(name)
        for inner in module.by_name[name].instructions:
            held.append((inner.opcode, str(inner.shape)))
            stack.extend(inner.called)
    return (ins.fusion_kind or "", emitter(ins), str(ins.shape), tuple(sorted(held)))


def _dots_in(module: HloModule, names: list[str]) -> int:
    count = 0
    stack, seen = list(names), set()
    while stack:
        name = stack.pop()
        if name in seen or name not in module.by_name:
            continue
        seen.add(name)
        for ins in module.by_name[name].instructions:
            count += ins.opcode == "dot"
            stack.extend(ins.called)
    return count


def _producer(comp: Computation, ref: str) -> str:
    """Where a value of ``comp`` comes from: the first instruction, through bitcasts and
    get-tuple-elements, that computes it: ``label (opcode)``, a custom-call with its target."""
    ins, _ = comp.operand(ref)
    for _ in range(64):
        if ins.opcode not in ("bitcast", "get-tuple-element") or not ins.operands:
            break
        ins, _ = comp.operand(ins.operands[0])
    what = ins.opcode
    if ins.opcode == "custom-call":
        what += " " + ins.attrs.get("custom_call_target", "").strip('"')
    elif ins.opcode == "fusion":
        what += f" {emitter(ins)}"
    elif ins.opcode == "parameter":
        return f"parameter {ins.literal}"
    return f"{label(ins.name)} ({what})"


def _scatter_operand(module: HloModule, caller: Computation, fusion: Instruction) -> list[tuple[str, str]]:
    """(scatter output shape, where its in-place operand comes from) for each scatter of ``fusion``."""
    out: list[tuple[str, str]] = []
    comp = module.by_name.get(fusion.called[0]) if fusion.called else None
    if comp is None:
        return out
    for ins in comp.instructions:
        if ins.opcode != "scatter" or not ins.operands:
            continue
        src, _ = comp.operand(ins.operands[0])
        path = []
        for _ in range(64):
            if src.opcode not in _THROUGH or not src.operands:
                break
            path.append(src.opcode)
            src, _ = comp.operand(src.operands[0])
        via = "".join(f"{p} of " for p in path)
        if src.opcode == "parameter" and src.parameter_number < len(fusion.operands):
            where = via + _producer(caller, fusion.operands[src.parameter_number])
        else:
            where = via + f"{src.opcode} in the fusion"
        out.append((str(ins.shape), where))
    return out


def _alias_entries(module: HloModule) -> tuple[tuple[tuple[int, ...], int, tuple[int, ...], str], ...]:
    """``input_output_alias`` as (output index, parameter, parameter index, kind) entries."""
    found = re.findall(r"\{([\d,\s]*)\}\s*:\s*\(\s*(\d+)\s*,\s*\{([\d,\s]*)\}\s*(?:,\s*([\w-]+))?\s*\)",
                       module.input_output_alias)

    def index(text: str) -> tuple[int, ...]:
        return tuple(int(x) for x in text.split(",") if x.strip())

    return tuple((index(a), int(b), index(c), d or "") for a, b, c, d in found)


def facts(module: HloModule, scan_counts: dict | None = None) -> ModuleFacts:
    """What one compile made. ``scan_counts``: the scanner's counts per class when already known (else
    the module is scanned here under the GPU rules)."""
    f = ModuleFacts(instructions=module.instruction_count())
    # Computations that run as such (the entry, loop bodies, branches), not inside a fusion or combiner.
    control = {module.entry.name} | {name for comp in module.computations for ins in comp.instructions
                                     if ins.opcode in ("while", "conditional", "call") for name in ins.called}
    _library_calls(module, control, f)
    _fusions(module, control, f)
    _sizes(module, f)
    if scan_counts is None:
        from xla_harness.hlo.scan import CLASSES, scan

        findings, decisions, _ = scan(module, "gpu")
        scan_counts = {c: sum(x.cls == c for x in findings) for c in CLASSES}
        scan_counts["scatter-fused-with-data-moving-producer"] = len(decisions)
    f.scan = dict(scan_counts)
    return f


def _library_calls(module: HloModule, control: set[str], f: ModuleFacts) -> None:
    """Dots handed to cuBLAS or cuDNN (custom-calls) and dots left outside fusions."""
    for comp in module.computations:
        for ins in comp.instructions:
            if ins.opcode == "custom-call":
                target = ins.attrs.get("custom_call_target", "").strip('"')
                if target.startswith("__cublas"):
                    f.dots["cuBLAS"] += 1
                elif target.startswith("__cudnn") and "conv" not in target.lower():
                    f.dots["cuDNN"] += 1
            elif ins.opcode == "dot" and comp.name in control:
                f.dots["unfused"] += 1


def _fusions(module: HloModule, control: set[str], f: ModuleFacts) -> None:
    """Every outermost fusion: name, content, emitter, dots, tiles, scatters; opcodes outside fusions."""
    fused = {ins.called[0] for comp in module.computations for ins in comp.instructions
             if ins.opcode == "fusion" and ins.called}
    for comp in module.computations:
        if comp.name in fused:  # a nested fusion is part of its outer fusion's content
            continue
        for ins in comp.instructions:
            if ins.opcode != "fusion":
                if comp.name in control:
                    f.unfused[ins.opcode] += 1
                continue
            name, content, how = label(ins.name), _content(module, ins), emitter(ins)
            f.fusions[name] += 1
            f.contents[content] += 1
            f.labelled[(content, name)] += 1
            f.emitters[how] += 1
            dots = _dots_in(module, ins.called)
            if dots:
                f.dots["Triton gemm" if how == "Triton gemm" else "native"] += dots
            if how in ("Triton", "Triton gemm"):
                f.tiles.setdefault((how, content), []).append(_tile_config(ins))
            for shape, where in _scatter_operand(module, comp, ins):
                f.scatters[(name, shape, where)] += 1


def _sizes(module: HloModule, f: ModuleFacts) -> None:
    """Argument, output and aliased bytes and the aliasing entries, from the entry computation."""
    entry = module.entry
    params = {ins.parameter_number: ins.shape for ins in entry.instructions if ins.opcode == "parameter"}
    f.argument_bytes = sum(array_bytes(s) for s in params.values())
    f.output_bytes = array_bytes(entry.root.shape)
    f.input_output_alias = _alias_entries(module)
    for out_index, _, _, _ in f.input_output_alias:
        try:
            f.alias_bytes += array_bytes(entry.root.shape.subshape(out_index))
        except IndexError:
            continue


@dataclass
class Fidelity:
    """Two compiles side by side: ``rows`` (aspect, first, second, same?) and ``fusion_rows`` (label,
    count in each, matched by content in each), plus the scatter and tile comparisons."""

    names: tuple[str, str]
    rows: list[tuple[str, str, str, bool]]
    fusion_rows: list[tuple[str, int, int, int, int]]
    scatters: list[tuple[str, int, int]]  # (scatter description, count in each)
    matched_fusions: tuple[int, int, int]  # matched, fusions of the first, of the second
    tiles: dict  # emitter -> (same tile config, fusions of that emitter held by both)


def _matched(mine: Counter, theirs: Counter) -> Counter:
    """How many of each content ``mine`` has that ``theirs`` also has."""
    return Counter({c: min(n, theirs.get(c, 0)) for c, n in mine.items()})


def _matched_by_label(mine: ModuleFacts, theirs: ModuleFacts) -> Counter:
    """How many fusions of each name ``mine`` has whose content ``theirs`` also has: each content's
    matches go first to the names ``theirs`` gives that content too, then to the others."""
    budget = _matched(mine.contents, theirs.contents)
    out: Counter = Counter()
    for same_name_first in (True, False):
        for (content, name), n in sorted(mine.labelled.items(), key=lambda kv: kv[0][1]):
            if same_name_first:
                n = min(n, theirs.labelled.get((content, name), 0))
            else:
                n -= out[(content, name)]
            take = min(n, budget[content])
            budget[content] -= take
            out[(content, name)] += take
    per_name: Counter = Counter()
    for (_, name), n in out.items():
        per_name[name] += n
    return per_name


def compare(first: HloModule | ModuleFacts, second: HloModule | ModuleFacts,
            names: tuple[str, str] = ("device", "ahead of time")) -> Fidelity:
    """``first`` and ``second`` (modules, or their :func:`facts`) held against each other."""
    a = first if isinstance(first, ModuleFacts) else facts(first)
    b = second if isinstance(second, ModuleFacts) else facts(second)
    rows: list[tuple[str, str, str, bool]] = []

    def row(aspect: str, x, y) -> None:
        rows.append((aspect, _text(x), _text(y), x == y))

    row("instructions", a.instructions, b.instructions)
    row("fusions", sum(a.fusions.values()), sum(b.fusions.values()))
    for how in sorted(set(a.emitters) | set(b.emitters)):
        row(f"fusions emitted by {how}", a.emitters[how], b.emitters[how])
    for backend in DOT_BACKENDS:
        if a.dots[backend] or b.dots[backend]:
            row(f"dots: {backend}", a.dots[backend], b.dots[backend])
    row("dots in all", sum(a.dots.values()), sum(b.dots.values()))
    row("fusions holding a scatter", sum(a.scatters.values()), sum(b.scatters.values()))
    row("scatters and their in-place operands", sorted(a.scatters.items()), sorted(b.scatters.items()))
    row("input_output_alias entries", len(a.input_output_alias), len(b.input_output_alias))
    row("input_output_alias", a.input_output_alias, b.input_output_alias)
    row("argument bytes", a.argument_bytes, b.argument_bytes)
    row("output bytes", a.output_bytes, b.output_bytes)
    row("aliased bytes", a.alias_bytes, b.alias_bytes)
    for op in sorted(set(a.unfused) | set(b.unfused)):
        if a.unfused[op] != b.unfused[op]:
            row(f"outside fusions: {op}", a.unfused[op], b.unfused[op])
    for cls in sorted(set(a.scan) | set(b.scan)):
        row(f"scan (gpu): {cls}", a.scan.get(cls, 0), b.scan.get(cls, 0))
    ma = _matched(a.contents, b.contents)
    labels = sorted(set(a.fusions) | set(b.fusions))
    per_a, per_b = _matched_by_label(a, b), _matched_by_label(b, a)
    fusion_rows = [(lab, a.fusions[lab], b.fusions[lab], per_a[lab], per_b[lab]) for lab in labels]
    tiles: dict[str, tuple[int, int]] = {}
    for (how, content), configs in a.tiles.items():
        theirs = b.tiles.get((how, content), [])
        same, held = tiles.get(how, (0, 0))
        tiles[how] = (same + sum((Counter(configs) & Counter(theirs)).values()), held + min(len(configs), len(theirs)))
    scatters = [(f"{lab}: {shape}, in-place operand from {where}", a.scatters[k], b.scatters[k])
                for k in sorted(set(a.scatters) | set(b.scatters)) for lab, shape, where in [k]]
    return Fidelity(names, rows, fusion_rows, scatters,
                    (sum(ma.values()), sum(a.contents.values()), sum(b.contents.values())), tiles)


def _text(value) -> str:
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, tuple | list):
        return f"{len(value)} entries"
    return str(value)


def format_fidelity(f: Fidelity, all_fusions: bool = False) -> str:
    """The comparison as Markdown: the aspects, the scatters, the fusion names that differ (every
    name with ``all_fusions``)."""
    one, two = f.names
    lines = [f"| aspect | {one} | {two} | same |", "| --- | --- | --- | --- |"]
    for aspect, x, y, same in f.rows:
        lines.append(f"| {aspect} | {x} | {y} | {'yes' if same else '**no**'} |")
    matched, na, nb = f.matched_fusions
    lines.append(f"| fusions of the same content in both | {matched:,} of {na:,} | {matched:,} of {nb:,} | "
                 f"{'yes' if matched == na == nb else '**no**'} |")
    for how, (same, held) in sorted(f.tiles.items()):
        lines.append(f"| {how} fusions held by both with the same tile config | {same} of {held} | | "
                     f"{'yes' if same == held else '**no**'} |")
    lines += ["", f"| fusion holding a scatter | {one} | {two} |", "| --- | --- | --- |"]
    lines += [f"| {what} | {n1} | {n2} |" for what, n1, n2 in f.scatters]
    lines += ["", f"| fusion name | {one} | {two} | {one}: same content in {two} | {two}: same content in {one} |",
              "| --- | --- | --- | --- | --- |"]
    for lab, c1, c2, mx, my in sorted(f.fusion_rows, key=lambda r: (-abs(r[1] - r[2]) - abs(r[1] - r[3]), r[0])):
        if all_fusions or not (c1 == c2 == mx == my):
            lines.append(f"| {lab} | {c1} | {c2} | {mx} | {my} |")
    return "\n".join(lines) + "\n"
