"""A model of XLA's in-place input/output pairing for fusion instructions.

Modelled on ``AliasInfo::GetFusionInstructionInPlaceInputOutputPairs`` and
``AliasInfo::GetInPlaceInputOutputPairs`` in openxla/xla ``xla/hlo/analysis/alias_info.cc``
(read at commit 1a8d4807c09477e2b12b7ac276a3d757173348a1, where the no-op skip is the
virtual ``AliasInfo::IsNoOpForAliasAnalysis``, bitcast only by default). For every leaf
output of a fusion: start at the fused root, follow tuple/get-tuple-element indirections
and then no-op indirections back to the "output source"; take that instruction's in-place
pairs (scatter operands, dynamic-update-slice operand 0, a nested fusion's pairs); follow
the in-place operand back the same way, peepholing once through a nested fusion; if a
fusion parameter is reached, that parameter and the output are an in-place pair.
``output_to_operand_aliasing`` pairs are added as annotated.

Which instructions count as no-op indirections is the policy:

``stock``         bitcast only (upstream today);
``proposed``      bitcast, transpose and reshape, whatever their layouts (openxla/xla#38607);
``layout-aware``  bitcast, plus transpose/reshape that are bitcasts under their operand and
                  result layouts (XLA's default descending layout when none is printed).
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.errors import HarnessError
from harness.hlo.parser import Computation, HloModule, Instruction, Shape

POLICIES = ("stock", "proposed", "layout-aware")


@dataclass(frozen=True)
class InPlacePair:
    operand_index: int  # fusion operand (= fused parameter) number
    operand_shape_index: tuple[int, ...]
    output_index: tuple[int, ...]
    path: tuple[str, ...] = ()  # opcodes walked from the in-place operand back to the parameter


# ----------------------------------------------------------------------------- layouts


def _row_major_strides(dims: tuple[int, ...]) -> list[int]:
    strides = [1] * len(dims)
    acc = 1
    for i in range(len(dims) - 1, -1, -1):
        strides[i] = acc
        acc *= max(dims[i], 1)
    return strides


def _canonical(dims_strides: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Physical dims (size, logical stride) major to minor, degenerate dims dropped and
    adjacent dims that are contiguous in the logical order merged."""
    out: list[tuple[int, int]] = []
    for size, stride in dims_strides:
        if size == 1:
            continue
        if out and out[-1][1] == stride * size:
            outer_size, _ = out.pop()
            out.append((outer_size * size, stride))
        else:
            out.append((size, stride))
    return out


def _physical(shape: Shape, logical_strides: list[int]) -> list[tuple[int, int]]:
    m2m = shape.layout_or_default()
    return _canonical([(shape.dims[d], logical_strides[d]) for d in reversed(m2m)])


def _tiles(shape: Shape) -> str:
    """The tiling part of a layout as printed (``T(8,128)(2,1)``), '' when untiled."""
    extra = shape.layout_extra
    k = extra.find("T(")
    if k < 0:
        return ""
    j = k
    while j < len(extra) and extra[j] in "T(),0123456789":
        j += 1
    return extra[k:j]


def _memory_space(shape: Shape) -> str:
    """``S(n)`` of a layout as printed, '' for the default memory space."""
    extra = shape.layout_extra
    k = extra.find("S(")
    return extra[k:extra.find(")", k) + 1] if k >= 0 else ""


def transpose_is_bitcast(operand: Shape, result: Shape, permutation: tuple[int, ...]) -> bool:
    """XLA's ``ShapeUtil::TransposeIsBitcast`` (operand minor-to-major equals the permutation
    composed with the result's minor-to-major, same element type), plus equal tiles, as in
    our XLA patch: the same physical dims in the same order with the same tiling."""
    if operand.is_tuple or result.is_tuple or operand.element_type != result.element_type:
        return False
    if sorted(permutation) != list(range(len(operand.dims))) or len(result.dims) != len(operand.dims):
        return False
    if _tiles(operand) != _tiles(result) or _memory_space(operand) != _memory_space(result):
        return False
    in_m2m, out_m2m = operand.layout_or_default(), result.layout_or_default()
    return list(in_m2m) == [permutation[d] for d in out_m2m]


def reshape_is_bitcast(operand: Shape, result: Shape) -> bool:
    """True when the reshape moves no data: the element order in memory is the same under
    the operand's and the result's layouts (a reshape keeps the row-major linear index),
    degenerate dims ignored, as XLA's ``ShapeUtil::ReshapeIsBitcast``. Tiled layouts are
    never treated as bitcasts here or in our XLA patch (tiles pad and reorder the minor dims)."""
    if operand.is_tuple or result.is_tuple or operand.element_type != result.element_type:
        return False
    if any(d < 0 for d in operand.dims + result.dims) or _tiles(operand) or _tiles(result):
        return False
    if _memory_space(operand) != _memory_space(result):
        return False
    n_in = 1
    for d in operand.dims:
        n_in *= d
    n_out = 1
    for d in result.dims:
        n_out *= d
    if n_in != n_out:
        return False
    return (_physical(operand, _row_major_strides(operand.dims))
            == _physical(result, _row_major_strides(result.dims)))


def is_bitcast_equivalent(ins: Instruction, comp: Computation) -> bool:
    src, k = comp.operand(ins.operands[0])
    operand = src.shape.subshape(k)
    if ins.opcode == "transpose":
        return transpose_is_bitcast(operand, ins.shape, ins.int_list("dimensions"))
    if ins.opcode == "reshape":
        return reshape_is_bitcast(operand, ins.shape)
    return ins.opcode == "bitcast"


def is_noop(ins: Instruction, comp: Computation, policy: str) -> bool:
    if ins.opcode == "bitcast":
        return True
    if ins.opcode in ("transpose", "reshape") and ins.operands:
        if policy == "proposed":
            return True
        if policy == "layout-aware":
            return is_bitcast_equivalent(ins, comp)
    return False


# ----------------------------------------------------------------------------- tracing


def _follow(comp: Computation, ins: Instruction, index: tuple[int, ...], policy: str,
            path: list[str]) -> tuple[Instruction, tuple[int, ...]]:
    """Tuple indirections, then no-op indirections (as upstream's follow_indirections)."""
    while ins.opcode == "tuple" and index:
        (ins, k), index = comp.operand(ins.operands[index[0]]), index[1:]
        index = k + index
        path.append("tuple")
    while ins.opcode == "get-tuple-element":
        index = (int(ins.attrs.get("index", "0")),) + index
        path.append("get-tuple-element")
        ins, k = comp.operand(ins.operands[0])
        index = k + index
    while not index and is_noop(ins, comp, policy):
        path.append(ins.opcode)
        ins, index = comp.operand(ins.operands[0])
    return ins, index


def in_place_pairs(module: HloModule, ins: Instruction, policy: str
                   ) -> list[tuple[int, tuple[int, ...], tuple[int, ...]]]:
    """(operand number, operand shape index, output index) pairs of one instruction."""
    if ins.opcode == "scatter":
        n = (len(ins.operands) - 1) // 2
        if n == 1:
            return [(0, (), ())]
        return [(i, (), (i,)) for i in range(n)]
    if ins.opcode == "dynamic-update-slice":
        return [(0, (), ())]
    if ins.opcode == "all-reduce-start":
        n = len(ins.operands)
        return [(0, (), ())] if n == 1 else [(i, (), (i,)) for i in range(n)]
    if ins.opcode == "fusion":
        return [(p.operand_index, p.operand_shape_index, p.output_index)
                for p in fusion_in_place_pairs(module, ins, policy)]
    if ins.opcode in ("custom-call", "async-start"):
        return [(op, op_idx, out) for out, op, op_idx in ins.output_to_operand_aliasing()]
    return []


def fusion_in_place_pairs(module: HloModule, fusion: Instruction, policy: str) -> list[InPlacePair]:
    """In-place (operand, operand index) -> output index pairs of a fusion under ``policy``,
    discovered pairs first, then the annotated ``output_to_operand_aliasing`` ones."""
    if policy not in POLICIES:
        raise HarnessError(f"unknown policy {policy!r}; expected one of {', '.join(POLICIES)}")
    if fusion.opcode != "fusion" or not fusion.called:
        raise HarnessError(f"{fusion.name} is not a fusion instruction")
    comp = module.computation(fusion.called[0])
    out: list[InPlacePair] = []
    for index, _ in fusion.shape.leaves():
        src, src_index = _follow(comp, comp.root, index, policy, [])
        found: tuple[Instruction, tuple[int, ...], list[str]] | None = None
        for op_num, op_index, out_index in in_place_pairs(module, src, policy):
            if out_index != src_index:
                continue
            path: list[str] = []
            first, k = comp.operand(src.operands[op_num])
            inp, inp_index = _follow(comp, first, k + op_index, policy, path)
            if inp.opcode == "fusion":  # peephole through a nested fusion's own aliasing
                for n_op, n_op_index, n_out in in_place_pairs(module, inp, policy):
                    if n_out == inp_index:
                        path.append("fusion")
                        nxt, k = comp.operand(inp.operands[n_op])
                        inp, inp_index = _follow(comp, nxt, k + n_op_index, policy, path)
                        break
            found = (inp, inp_index, path)
        if found is not None and found[0].opcode == "parameter":
            inp, inp_index, path = found
            out.append(InPlacePair(inp.parameter_number, inp_index, index, tuple(path)))
    for out_index, op, op_index in fusion.output_to_operand_aliasing():
        out.append(InPlacePair(op, op_index, out_index, ()))
    return out


def output_source(module: HloModule, fusion: Instruction, index: tuple[int, ...], policy: str
                  ) -> Instruction:
    """The instruction a fusion output comes from, after following indirections."""
    comp = module.computation(fusion.called[0])
    return _follow(comp, comp.root, index, policy, [])[0]
