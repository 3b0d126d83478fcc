"""The instructions a compiled module runs non-deterministically on its target, with their source lines.

**GPU: scatters lowered with atomics.** XLA's GPU scatter emitter
(``xla/backends/gpu/codegen/emitters/scatter.cc``, ``EmitScatterComputation``) writes a scatter whose
``unique_indices`` is false with an atomic read-modify-write per update element (``AtomicRMWOp``); only
``unique_indices=true`` gets plain stores. Where two updates hit the same element their order is the
order the threads happen to run in, so the result differs from run to run unless the combiner is
order-independent. XLA's own test of that (``IsScatterDeterministic`` in
``xla/service/scatter_utils.cc``, used by ``ScatterExpander::kEliminateIndeterministicScatters`` under
``--xla_gpu_deterministic_ops``) calls a scatter deterministic when its indices are unique, when it has
a single index, or when its combiner is a lone ``minimum``/``maximum``, or an integer ``add``,
``multiply``, ``or`` or ``xor``; every other scatter is listed here. A float scatter-add whose indices
never collide in practice (each row of ``take_along_axis``'s gradient hits one element) is listed too:
the compiler cannot know, and lowers it with atomics all the same.

Not covered: cuBLAS/cuDNN algorithms that are non-deterministic (split-K reductions; the autotuner
chooses them on the device), collectives, and every backend but GPU: XLA's CPU compiler emits a
scatter as a sequential loop, and libtpu is closed (:func:`nondeterministic_ops` returns nothing there
and says so through :data:`ASSESSED`).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

from xla_harness.hlo.ir import Computation, HloModule, Instruction

ASSESSED = ("gpu",)  # backends whose non-deterministic instructions are listed
_ASSOCIATIVE_ANY = ("minimum", "maximum")
_ASSOCIATIVE_INT = ("add", "multiply", "or", "xor")
_FIELD = re.compile(r"(\w+)=(\d+)")
_SECTIONS = ("FileNames", "FunctionNames", "FileLocations", "StackFrames")


@dataclass(frozen=True)
class NondeterministicOp:
    """One instruction the target runs non-deterministically."""

    instruction: str
    computation: str
    fusion: str  # the fusion that runs it ("" when it runs on its own)
    opcode: str
    shape: str
    reason: str
    source: str  # innermost source frames, "file:line (function) <- ...", or "" when the dump has none

    def to_json(self) -> dict:
        return asdict(self)


def _integer(element_type: str) -> bool:
    return element_type == "pred" or element_type[:1] in ("s", "u")


def _combiner(module: HloModule, ins: Instruction) -> tuple[str, str]:
    """(root opcode, element type) of a scatter's combiner when it is a lone binary op of its two
    parameters (what XLA's associativity test looks at), else ('', '')."""
    name = ins.attrs.get("to_apply", "").lstrip("%") or (ins.called[0] if ins.called else "")
    comp = module.by_name.get(name)
    if comp is None or len(comp.instructions) != 3:
        return "", ""
    root = comp.root
    return root.opcode, root.shape.element_type


def _index_count(comp: Computation, ins: Instruction) -> int | None:
    """How many indices a (single-operand) scatter applies: the indices' elements outside
    ``index_vector_dim``; None when the shapes are not known."""
    if len(ins.operands) != 3:
        return None
    try:
        indices, _ = comp.operand(ins.operands[1])
    except KeyError:
        return None
    dims = indices.shape.dims
    ivd = ins.int_list("index_vector_dim")
    vector_dim = ivd[0] if len(ivd) == 1 else len(dims)
    n = 1
    for i, d in enumerate(dims):
        if i != vector_dim:
            n *= d
    return n


def scatter_reason(module: HloModule, comp: Computation, ins: Instruction) -> str:
    """Why the GPU runs this scatter non-deterministically, or '' when XLA calls it deterministic."""
    if ins.attrs.get("unique_indices", "").strip() == "true":
        return ""
    op, element = _combiner(module, ins)
    if op in _ASSOCIATIVE_ANY or (op in _ASSOCIATIVE_INT and _integer(element)):
        return ""
    if _index_count(comp, ins) == 1:
        return ""
    combine = f"a {element} {op}" if op else "its combiner"
    return (f"indices not marked unique: the GPU scatter emitter applies each update with an atomic "
            f"read-modify-write, and {combine} depends on the order of the updates where indices collide")


def _frames(tables: str) -> dict[str, dict[int, str]]:
    sections: dict[str, dict[int, str]] = {}
    current: dict[int, str] | None = None
    for line in tables.splitlines():
        s = line.strip()
        if s in _SECTIONS:
            current = sections.setdefault(s, {})
            continue
        key, _, value = s.partition(" ")
        if current is not None and key.isdigit():
            current[int(key)] = value
    return sections


class SourceLines:
    """``stack_frame_id`` -> source frames, from a dump's FileNames/FunctionNames/FileLocations/StackFrames
    tables (XLA prints frame ids from 1 and each parent as its id plus one: 1 means none)."""

    def __init__(self, tables: str) -> None:
        self.sections = _frames(tables)

    def _location(self, loc_id: int) -> str:
        fields = dict(_FIELD.findall(self.sections.get("FileLocations", {}).get(loc_id, "")))
        if "file_name_id" not in fields:
            return ""
        file = self.sections.get("FileNames", {}).get(int(fields["file_name_id"]), "?").strip('"')
        func = self.sections.get("FunctionNames", {}).get(int(fields.get("function_name_id", 0)), "").strip('"')
        return f"{file}:{fields.get('line', '?')}" + (f" ({func})" if func else "")

    def frames(self, frame_id: int, depth: int = 3) -> list[str]:
        """The innermost ``depth`` frames of ``frame_id``, innermost first."""
        out: list[str] = []
        frames = self.sections.get("StackFrames", {})
        while frame_id in frames and len(out) < depth:
            fields = dict(_FIELD.findall(frames[frame_id]))
            where = self._location(int(fields.get("file_location_id", 0)))
            if where:
                out.append(where)
            parent = int(fields.get("parent_frame_id", 0)) - 1
            if not 0 < parent < frame_id:
                break
            frame_id = parent
        return out


def source_of(ins: Instruction, lines: SourceLines) -> str:
    """Where ``ins`` came from in the program: its metadata's stack frames (newer XLA), or
    ``source_file:source_line`` (older), or ''."""
    meta = ins.attrs.get("metadata", "")
    m = re.search(r"stack_frame_id=(\d+)", meta)
    if m:
        found = lines.frames(int(m.group(1)))
        if found:
            return " <- ".join(found)
    f = re.search(r'source_file="([^"]*)"', meta)
    n = re.search(r"source_line=(\d+)", meta)
    if f:
        return f"{f.group(1)}:{n.group(1) if n else '?'}"
    return ""


def nondeterministic_ops(module: HloModule, backend: str) -> list[NondeterministicOp]:
    """Every instruction ``module`` runs non-deterministically on ``backend`` (see the module docstring;
    nothing for a backend outside :data:`ASSESSED`)."""
    if backend not in ASSESSED:
        return []
    fused_by = {ins.called[0]: ins.name for comp in module.computations for ins in comp.instructions
                if ins.opcode == "fusion" and ins.called}
    lines = SourceLines(module.source_tables)
    out = []
    for comp in module.computations:
        for ins in comp.instructions:
            if ins.opcode != "scatter":
                continue
            reason = scatter_reason(module, comp, ins)
            if reason:
                out.append(NondeterministicOp(ins.name, comp.name, fused_by.get(comp.name, ""), ins.opcode,
                                              str(ins.shape), reason, source_of(ins, lines)))
    return out


def format_ops(ops: list[NondeterministicOp], backend: str) -> list[str]:
    """Lines for the scan report: a count, then one line per instruction with its source."""
    if backend not in ASSESSED:
        return []
    lines = [f"  {len(ops)} instruction(s) run non-deterministically on {backend}"
             + (":" if ops else " (no scatter without unique indices and an order-dependent combiner)")]
    for op in ops:
        where = f"{op.fusion} ({op.instruction})" if op.fusion else op.instruction
        lines.append(f"    nondeterministic  {where}  {op.shape}: {op.reason}")
        if op.source:
            lines.append(f"      from {op.source}")
    return lines
