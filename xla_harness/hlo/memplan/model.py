"""The plan every stage reads: the module, its buffer assignment and flattened schedule, and the
lookups derived from them once (which value each defining position has, each async start's done,
the values a fusion carries through unwritten). Frozen: a stage takes it as an argument and never
writes it."""

from __future__ import annotations

import re
from dataclasses import dataclass

from xla_harness.hlo.alias import AliasAnalysis, analyze
from xla_harness.hlo.buffers import BufferAssignment, BufferValue
from xla_harness.hlo.ir import Computation, HloModule, Instruction, split_ref
from xla_harness.hlo.memplan.hidden import HiddenTies, tie_hidden_async_roots
from xla_harness.hlo.memplan.values import Index, Pos
from xla_harness.hlo.shapes import Shape
from xla_harness.hlo.timeline import Timeline, flatten

_SOURCE = re.compile(r'source_file="([^"]*)"\s+source_line=(\d+)')
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_IO_ALIAS = re.compile(r"\{([\d,\s]*)\}\s*:\s*\(\s*(\d+)\s*,\s*\{([\d,\s]*)\}")
BACKENDS = ("cpu", "gpu", "tpu")


@dataclass(frozen=True)
class Plan:
    """A compiled module's memory plan as dumped, with its derived lookups (:func:`plan_of`)."""

    module: HloModule
    ba: BufferAssignment
    backend: str  # cpu, gpu or tpu: which compiler's aliasing rules apply
    tl: Timeline  # the flattened schedule
    values: dict[int, BufferValue]  # value id -> the buffer assignment's value
    allocation_of: dict[int, int]  # value id -> its allocation's number
    by_pos: dict[Pos, int]  # a defining position -> its value id (hidden async roots tied to their starts)
    printed: frozenset[str]  # every instruction the module's text prints
    hidden: HiddenTies
    deferred: dict[str, Instruction]  # async start -> the async-update that gives it its operands
    dones: dict[str, str]  # async start -> its done (through async-updates)
    params: frozenset[str]  # the parameters in the schedule
    carried: frozenset[int]  # fusion outputs aliased to an operand they pass through unwritten
    branch_spans: tuple[tuple[str, tuple[int, int]], ...]  # each conditional branch's span in time
    sources: dict[str, str]  # scheduled instruction -> where it came from in the program (file:line, op_name)
    aliases: AliasAnalysis  # the module's alias analysis (the in-place pairs its fusions' bodies show)


def plan_of(module: HloModule, ba: BufferAssignment, backend: str = "cpu") -> Plan:
    """The :class:`Plan` of ``module`` and its buffer assignment ``ba``."""
    tl = flatten(module)
    values: dict[int, BufferValue] = {}
    allocation_of: dict[int, int] = {}
    by_pos: dict[Pos, int] = {}
    for a in ba.allocations:
        for bv in a.values:
            values[bv.id] = bv
            allocation_of[bv.id] = a.number
            by_pos.setdefault((bv.name, bv.index), bv.id)
    printed = frozenset(ins.name for comp in module.computations for ins in comp.instructions)
    hidden = tie_hidden_async_roots(module, ba, set(printed))
    for pos, vid in hidden.positions.items():
        by_pos.setdefault(pos, vid)
    return Plan(module, ba, backend if backend in BACKENDS else "cpu", tl, values, allocation_of, by_pos, printed,
                hidden, _deferred(tl), _dones(tl), frozenset(i.name for _, i in tl.order if i.opcode == "parameter"),
                _carried(module, tl, by_pos), tuple((c, tl.span[c]) for c, (caller, _) in tl.caller.items()
                                                    if caller.opcode == "conditional" and c in tl.span),
                {ins.name: source_of(ins) for _, ins in tl.order}, analyze(module))


def chain_start(comp: Computation, ins: Instruction) -> Instruction:
    """The async start an async-update or async-done chain begins at."""
    seen = 0
    while ins.opcode in ("async-update", "async-done") and ins.operands and seen < 10_000:
        ins = comp.operand(ins.operands[0])[0]
        seen += 1
    return ins


def _deferred(tl: Timeline) -> dict[str, Instruction]:
    """async start -> the async-update that gives it its operands (libtpu's call-start())."""
    out: dict[str, Instruction] = {}
    for comp, ins in tl.order:
        if ins.opcode == "async-update" and len(ins.operands) > 1:
            out.setdefault(chain_start(comp, ins).name, ins)
    return out


def _dones(tl: Timeline) -> dict[str, str]:
    """async start -> its done (through async-updates)."""
    out: dict[str, str] = {}
    for comp, ins in tl.order:
        if ins.opcode.endswith("-done") and ins.operands:
            src = comp.operand(ins.operands[0])[0]
            seen = 0
            while src.opcode == "async-update" and src.operands and seen < 10_000:
                src = comp.operand(src.operands[0])[0]
                seen += 1
            out[src.name] = ins.name
    return out


def _carried(module: HloModule, tl: Timeline, by_pos: dict[Pos, int]) -> frozenset[int]:
    """Values at fusion outputs declared aliased to an operand (output_to_operand_aliasing) that the
    fusion passes through unwritten: the fused root holds the operand's own parameter at that index,
    or the root is libtpu's ``AsyncCollectiveStart`` marker and the parameter is only an all-gather's
    source (a collective reads its source). The buffer assignment gives them values of their own in
    the operand's buffer, but no byte of them is written."""
    out: set[int] = set()
    for _, ins in tl.order:
        if ins.opcode == "fusion" and ins.called and "output_to_operand_aliasing" in ins.attr_text:
            fused = module.by_name.get(ins.called[0])
            if fused is None:
                continue
            for idx, k, oi in ins.output_to_operand_aliasing():
                if not oi and passes_through(fused, idx, k) and (vid := by_pos.get((ins.name, idx))):
                    out.add(vid)
    return frozenset(out)


def passes_through(fused: Computation, idx: Index, k: int) -> bool:
    """Whether fused computation ``fused`` returns its parameter ``k`` unwritten at output ``idx``."""
    params = [p for p in fused.instructions if p.opcode == "parameter" and p.parameter_number == k]
    if not params:
        return False
    node: Instruction | None = fused.root
    for i in idx:
        if node is None or node.opcode != "tuple" or i >= len(node.operands):
            break
        base, sub = split_ref(node.operands[i])
        node = fused.by_name.get(base) if not sub else None
    else:
        if node is not None and node.name == params[0].name:
            return True
    root = fused.root
    if root.opcode == "custom-call" and root.attrs.get("custom_call_target", "").strip('"') == "AsyncCollectiveStart" \
            and idx == (0,):
        readers = [u for u in fused.instructions if any(split_ref(o)[0] == params[0].name for o in u.operands)]
        return bool(readers) and all(u.opcode == "all-gather" for u in readers)
    return False


def fused_root_target(module: HloModule, ins: Instruction) -> str:
    """The custom-call target at the root of fusion ``ins``'s computation ("" for anything else)."""
    if ins.opcode != "fusion" or not ins.called:
        return ""
    fused = module.by_name.get(ins.called[0])
    if fused is None or fused.root is None or fused.root.opcode != "custom-call":
        return ""
    return fused.root.attrs.get("custom_call_target", "").strip('"')


def root(module: HloModule, comp: str) -> Instruction | None:
    c = module.by_name.get(comp)
    return c.root if c is not None else None


def operand(ref: str, index: Index) -> Pos:
    """The position of ``ref`` (``x`` or a printed ``x#k``) at ``index``."""
    base, k = split_ref(ref)
    return base, k + index


def shape_of(comp: Computation, ref: str) -> Shape:
    base, k = split_ref(ref)
    try:
        return comp.by_name[base].shape.subshape(k)
    except (KeyError, IndexError):
        return Shape("token")


def name_attr(ins: Instruction, key: str) -> str:
    return ins.attrs.get(key, "").strip().lstrip("%")


def io_alias(text: str) -> list[tuple[Index, tuple[int, Index]]]:
    """The module's ``input_output_alias``: (output index, (parameter number, parameter index))."""
    def idx(s: str) -> Index:
        return tuple(int(x) for x in s.split(",") if x.strip())
    return [(idx(o), (int(p), idx(pi))) for o, p, pi in _IO_ALIAS.findall(text or "")]


def source_of(ins: Instruction) -> str:
    """Where ``ins`` came from in the user's program (``file:line``, else its op_name)."""
    m = _SOURCE.search(ins.attr_text)
    if m:
        return f"{m.group(1)}:{m.group(2)}"
    o = _OP_NAME.search(ins.attr_text)
    return o.group(1) if o else ""
