"""What the compiler itself says it aliases: libtpu writes, in every instruction's
``backend_config``, ``"aliasing_operands":{"lists":[{"indices":["0","4"]}]}``: each list is a group
of indices over the instruction's operands (0..n-1) followed by its outputs (n.. for output 0, 1,
... of a tuple-shaped instruction), so ``["0","4"]`` on a 4-operand fusion is "operand 0 shares its
buffer with the output". ``{"lists":[]}`` says nothing is aliased. This is the ground truth the
structural walk of :mod:`xla_harness.hlo.scan` can be checked against on TPU modules.

The GPU (and CPU) compiler writes no such field: its decision is in the buffer assignment. An
in-place fusion writes into an operand's buffer exactly when the compiler gave that operand's value
and the fusion's output the same buffer slice (:mod:`xla_harness.hlo.buffers`);
:func:`buffer_pairs` reads the pairs so, and each pair says where it came from (``source``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from xla_harness.hlo.alias import IN_PLACE_OPCODES, AliasAnalysis, analyze, opcodes
from xla_harness.hlo.buffers import BufferAssignment
from xla_harness.hlo.ir import Computation, HloModule, Instruction, split_ref

KEY = "aliasing_operands"
NONE_DECLARED = '"aliasing_operands":{"lists":[]}'
FROM_BACKEND_CONFIG = "backend_config"
FROM_BUFFER_ASSIGNMENT = "buffer assignment"


@dataclass(frozen=True)
class CompilerAlias:
    """One (operand, output) pair the compiler aliased in ``instruction`` of ``computation``."""

    computation: str
    instruction: str
    opcode: str
    operand: int
    output_index: tuple[int, ...]
    source: str = FROM_BACKEND_CONFIG  # where the compiler said it: backend_config or buffer assignment


def find_key(value, key: str):
    """The value of ``key`` anywhere in a parsed JSON value (dicts and lists searched depth-first); None if absent."""
    if isinstance(value, dict):
        if key in value:
            return value[key]
        for v in value.values():
            found = find_key(v, key)
            if found is not None:
                return found
    elif isinstance(value, list):
        for v in value:
            found = find_key(v, key)
            if found is not None:
                return found
    return None


def instruction_pairs(ins: Instruction) -> list[tuple[int, tuple[int, ...]]] | None:
    """``[(operand, output index), ...]`` the compiler aliased in ``ins``; None when its backend_config
    says nothing about aliasing (not a libtpu module, or no such key), [] when it says "none"."""
    if KEY not in ins.attr_text:
        return None
    if NONE_DECLARED in ins.attr_text:  # libtpu's "nothing aliased", printed on most instructions: no JSON to read
        return []
    raw = ins.attrs.get("backend_config", "")
    try:
        config = json.loads(raw)
    except ValueError:
        return None
    field = find_key(config, KEY)
    groups = field.get("lists", []) if isinstance(field, dict) else []
    n = len(ins.operands)
    pairs: list[tuple[int, tuple[int, ...]]] = []
    for group in groups:
        try:
            idx = [int(i) for i in group.get("indices", [])]
        except (TypeError, ValueError, AttributeError):
            continue
        operands = [i for i in idx if 0 <= i < n]
        outputs = [i - n for i in idx if i >= n]
        for out in outputs:
            where = (out,) if ins.shape.is_tuple else ()
            pairs.extend((op, where) for op in operands)
    return pairs


def module_pairs(module: HloModule) -> list[CompilerAlias]:
    """Every aliased (operand, output) pair the compiler wrote into the module's backend configs."""
    out = []
    for comp in module.computations:
        for ins in comp.instructions:
            for operand, index in instruction_pairs(ins) or ():
                out.append(CompilerAlias(comp.name, ins.name, ins.opcode, operand, index))
    return out


def summary(module: HloModule) -> dict:
    """Counts for a compile record: instructions carrying the compiler's aliasing field, fusions it
    aliased, and of those the ones holding a scatter (nested fusions included)."""
    carrying = aliased = scatter = 0
    analysis = analyze(module)
    for comp in module.computations:
        for ins in comp.instructions:
            pairs = instruction_pairs(ins)
            if pairs is None:
                continue
            carrying += 1
            if pairs and ins.opcode == "fusion":
                aliased += 1
                if any("scatter" in opcodes(analysis, c) for c in ins.called):
                    scatter += 1
    return {"instructions_with_field": carrying, "aliased_fusions": aliased, "aliased_scatter_fusions": scatter}


# ----------------------------------------------------------------------------- from the buffer assignment


def in_place_fusion(analysis: AliasAnalysis, ins: Instruction) -> bool:
    """A fusion the scanner classifies: one holding an in-place op (nested fusions included) or
    annotated with ``output_to_operand_aliasing`` (``analysis``: its module's)."""
    return ins.opcode == "fusion" and bool(ins.called) and (
        not IN_PLACE_OPCODES.isdisjoint(opcodes(analysis, ins.called[0]))
        or "output_to_operand_aliasing" in ins.attr_text)


def _operand_slice(ba: BufferAssignment, caller: Computation, ins: Instruction, operand: int,
                   index: tuple[int, ...]) -> tuple[int, int, int] | None:
    """The slice of the value operand ``operand`` (at ``index``) of ``ins`` reads: from the values
    file's uses when it was read; otherwise the value of that name, looked for through bitcasts and
    get-tuple-elements (the ops that define no value of their own); None when not found."""
    if ba.uses is not None:
        value = ba.uses.get((ins.name, operand, index))
        return ba.slice_of_id(value) if value is not None else None
    base, idx = split_ref(ins.operands[operand])
    idx += index
    for _ in range(10_000):
        found = ba.slice_of(base, idx)
        src = caller.by_name.get(base)
        if found is not None or src is None or not src.operands:
            return found
        if src.opcode == "bitcast" and not idx:
            base, idx = split_ref(src.operands[0])
        elif src.opcode == "get-tuple-element":
            base, first = split_ref(src.operands[0])
            idx = (*first, int(src.attrs.get("index", "0")), *idx)
        else:
            return None
    return None


Slice = tuple[int, int, int]  # (allocation, offset, size)


def fusion_buffer_slices(ba: BufferAssignment, caller: Computation, ins: Instruction
                         ) -> tuple[dict[tuple[int, ...], Slice | None],
                                    dict[tuple[int, tuple[int, ...]], Slice | None]] | None:
    """The buffer slice of each output of the fusion (by output index) and of the value each operand
    reads (by operand number and shape index), None where the buffer assignment does not say; None
    altogether when it lists no output of the fusion."""
    out_slices = {index: ba.slice_of(ins.name, index) for index, _ in ins.shape.leaves()}
    if all(s is None for s in out_slices.values()):
        return None
    if ba.uses is not None:
        reads = sorted((k, idx) for (user, k, idx) in ba.uses if user == ins.name and k < len(ins.operands))
    else:
        reads = [(k, ()) for k in range(len(ins.operands))]
    return out_slices, {(k, idx): _operand_slice(ba, caller, ins, k, idx) for k, idx in reads}


def fusion_buffer_pairs(ba: BufferAssignment, caller: Computation, ins: Instruction
                        ) -> list[tuple[int, tuple[int, ...], tuple[int, ...]]] | None:
    """``[(operand, operand shape index, output index), ...]``: the fusion's operands whose value the
    compiler put in the same buffer slice as an output of the fusion. None when the buffer assignment
    lists no output of the fusion (the compiler does not say)."""
    slices = fusion_buffer_slices(ba, caller, ins)
    if slices is None:
        return None
    out_slices, operand_slices = slices
    return [(k, idx, o) for (k, idx), src in operand_slices.items() if src is not None
            for o, s in out_slices.items() if s == src]


def buffer_verdict(ba: BufferAssignment, caller: Computation, ins: Instruction, operand: int,
                   output_index: tuple[int, ...]) -> str:
    """"aliased" when the compiler gave operand ``operand`` and output ``output_index`` of the fusion
    the same buffer slice, "not-aliased" when it gave them different ones, "" when the buffer
    assignment does not list both."""
    slices = fusion_buffer_slices(ba, caller, ins)
    if slices is None:
        return ""
    out = slices[0].get(output_index)
    src = slices[1].get((operand, ()))
    if out is None or src is None:
        return ""
    return "aliased" if out == src else "not-aliased"


def buffer_pairs(module: HloModule, ba: BufferAssignment) -> list[CompilerAlias]:
    """Every (operand, output) pair of an in-place fusion (:func:`in_place_fusion`) that the compiler
    gave one buffer slice, read from its buffer assignment."""
    out = []
    analysis = analyze(module)
    for comp in module.computations:
        for ins in comp.instructions:
            if in_place_fusion(analysis, ins):
                for operand, _, index in fusion_buffer_pairs(ba, comp, ins) or ():
                    out.append(CompilerAlias(comp.name, ins.name, ins.opcode, operand, index, FROM_BUFFER_ASSIGNMENT))
    return out
