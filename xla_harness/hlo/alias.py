"""A model of XLA's in-place input/output pairing for fusion instructions.

Modelled on ``AliasInfo::GetFusionInstructionInPlaceInputOutputPairs`` and
``AliasInfo::GetInPlaceInputOutputPairs`` in openxla/xla ``xla/hlo/analysis/alias_info.cc``
(read at 183fa00cb5, 2026-08-22). For every leaf output of a fusion: start at the fused
root, follow tuple/get-tuple-element indirections and then no-op indirections back to the
"output source"; take that instruction's in-place pairs (for a nested fusion only the pairs
discovered in its body, not its ``output_to_operand_aliasing`` annotation); follow the
in-place operand back the same way, peepholing through a nested fusion's pairs; if a fusion
parameter is reached, that parameter and the output are an in-place pair.
``output_to_operand_aliasing`` pairs of the fusion itself are added as annotated.

In-place ops (upstream's list): scatter, dynamic-update-slice, all-reduce-start,
collective-permute(-start) with 4 operands (operand 1), ragged-all-to-all (operand 1),
set-dimension-size, custom-call / async-start / async-update by annotation, async-done
through its chain's async-start annotation.

Which instructions count as no-op indirections depends on the backend (upstream's virtual
``AliasInfo::IsNoOpForAliasAnalysis``): ``cpu`` bitcast only (the base class); ``gpu``
bitcast and every reshape (``GpuAliasInfo``). On top of that, the policy:

``stock``         the backend's rule as upstream has it;
``proposed``      also every transpose and reshape, whatever their layouts (openxla/xla#38607);
``layout-aware``  also transposes/reshapes that are bitcasts under their operand and result
                  layouts (XLA's default descending layout when none is printed).
"""

from __future__ import annotations

import itertools
from typing import NamedTuple

from xla_harness.errors import HarnessError
from xla_harness.hlo.ir import Computation, HloModule, Instruction
from xla_harness.hlo.shapes import Shape

POLICIES = ("stock", "proposed", "layout-aware")
BACKEND_RULES = ("cpu", "gpu")  # whose IsNoOpForAliasAnalysis: bitcast / bitcast + reshape


class InPlacePair(NamedTuple):
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
    j = k + 1
    while j < len(extra) and extra[j] == "(":  # one '(...)' group per tile level
        close = extra.find(")", j)
        if close < 0:
            return extra[k:]
        j = close + 1
    return extra[k:j]


def _memory_space(shape: Shape) -> str:
    """``S(n)`` of a layout as printed, '' for the default memory space."""
    extra = shape.layout_extra
    k = extra.find("S(")
    return extra[k:extra.find(")", k) + 1] if k >= 0 else ""


def _tile_levels(tiles: str) -> list[tuple[int, ...]] | None:
    """'T(8,128)(2,1)' -> [(8, 128), (2, 1)]; None for what is not read here ('*' dims ...)."""
    body = tiles[1:]
    levels = []
    for group in body.split(")")[:-1]:
        if not group.startswith("("):
            return None
        parts = group[1:].split(",")
        if not all(p.strip().isdigit() and int(p) > 0 for p in parts):
            return None
        levels.append(tuple(int(p) for p in parts))
    return levels or None


# One physical axis of a tiled array: the logical dim whose index it is a digit of (None for
# the size-1 dims a tile wider than the shape adds), that digit as (index % modulus) // divisor
# (modulus None: no bound), and the axis's size with padding.
_Axis = tuple[int | None, int | None, int, int]


def _tiled_axes(shape: Shape) -> list[_Axis] | None:
    """The physical axes of an array under its layout and tiles, major to minor, as XLA lays
    them out: dims in minor-to-major order, then each tile level splits the minor dims of
    the shape so far into (tile count, padded to whole tiles) and (within-tile) dims. None
    when the tiling is not one read here (the caller is then conservative)."""
    axes: list[_Axis] = [(d, None, 1, shape.dims[d]) for d in reversed(shape.layout_or_default())]
    tiles = _tiles(shape)
    levels = _tile_levels(tiles) if tiles else []
    if levels is None:
        return None
    for tile in levels:
        while len(axes) < len(tile):
            axes.insert(0, (None, None, 1, 1))
        head, minor = axes[:len(axes) - len(tile)], axes[len(axes) - len(tile):]
        outer: list[_Axis] = []
        inner: list[_Axis] = []
        for (dim, modulus, divisor, size), t in zip(minor, tile, strict=True):
            if modulus is not None and modulus % (divisor * t):
                return None  # a within-tile dim split by a tile that does not divide it
            outer.append((dim, modulus, divisor * t, -(-size // t)))
            inner.append((dim, divisor * t, divisor, t))
        axes = head + outer + inner
    return axes


def _offset_terms(axes: list[_Axis], var_of: list[tuple[int, int, int]], ranges: dict[int, int]
                  ) -> list[tuple] | None:
    """The element offset of an array laid out on these axes as a sum of terms (variable,
    modulus, divisor, coefficient): coefficient * ((value % modulus) // divisor). ``var_of[d]``
    says what logical dim d's index is: (variable, scale, size): (variable % (scale * size)) // scale;
    ``ranges`` each variable's number of values. None when a digit is not one of a variable."""
    stride = 1
    terms = []
    for dim, modulus, divisor, size in reversed(axes):
        if dim is not None and size > 1:
            var, scale, extent = var_of[dim]
            bound = extent if modulus is None or modulus >= extent else modulus
            if extent % bound and scale * extent < ranges[var]:
                return None  # a digit of this dim is not one of the variable's
            terms.append((var, scale * bound, scale * divisor, stride))
        stride *= size
    return terms


def _simplified(terms: list[tuple], ranges: dict[int, int]) -> dict[int, list[tuple[int | None, int, int]]]:
    """Per variable, its terms with neighbours that read one contiguous digit merged
    ((v % M) // D * c + (v % D) // E * c * D / E ... -> (v % M) // E * c'), digits that are
    always 0 dropped, and moduli at or past the variable's range too."""
    out: dict[int, list[tuple[int | None, int, int]]] = {}
    for var in ranges:
        n = ranges[var]
        mine = sorted((((m if m < n else None), d, c) for v, m, d, c in terms if v == var and m > d and d < n),
                      key=lambda t: t[1])  # digits that are not always 0, by divisor (minor digits first)
        merged: list[tuple[int | None, int, int]] = []
        for modulus, divisor, coef in mine:
            if merged:
                low_mod, low_div, low_coef = merged[-1]
                if low_mod == divisor and coef * low_div == low_coef * divisor:
                    merged[-1] = (modulus, low_div, low_coef)
                    continue
            merged.append((modulus, divisor, coef))
        out[var] = merged
    return out


def _digit_sum(terms: list[tuple[int | None, int, int]], v: int) -> int:
    return sum(c * ((v % m if m is not None else v) // d) for m, d, c in terms)


_BRUTE_FORCE_LIMIT = 1 << 14


def _same_function(a: list[tuple[int | None, int, int]], b: list[tuple[int | None, int, int]], n: int) -> bool | None:
    """Do two sums of digit terms agree on every value in range(n)? None when undecided."""
    if sorted(a, key=str) == sorted(b, key=str):
        return True
    cuts = sorted({x for m, d, _ in a + b for x in (m, d) if x is not None} | {1})
    if all(hi % lo == 0 for lo, hi in zip(cuts, cuts[1:], strict=False)):
        # mixed-radix digits at these cuts: both sums are linear in them, and the value at a
        # cut is that digit's coefficient
        return all(_digit_sum(a, cut) == _digit_sum(b, cut) for cut in cuts if cut < n)
    if n <= _BRUTE_FORCE_LIMIT:
        return all(_digit_sum(a, v) == _digit_sum(b, v) for v in range(n))
    return None


def _same_bytes(operand: Shape, result: Shape, operand_vars: list[tuple[int, int, int]],
                result_vars: list[tuple[int, int, int]], ranges: dict[int, int]) -> bool:
    """Every element at the same offset under both layouts (tiles and padding included), and
    the same padded size; conservative (False) where that is not decided."""
    axes_a, axes_b = _tiled_axes(operand), _tiled_axes(result)
    if axes_a is None or axes_b is None or _padded_size(axes_a) != _padded_size(axes_b):
        return False
    if any(n == 0 for n in ranges.values()):
        return True  # no elements
    a, b = _offset_terms(axes_a, operand_vars, ranges), _offset_terms(axes_b, result_vars, ranges)
    if a is not None and b is not None:
        sa, sb = _simplified(a, ranges), _simplified(b, ranges)
        same = [_same_function(sa[v], sb[v], ranges[v]) for v in ranges]
        if False in same or None not in same:
            return False not in same
    count = 1
    for n in ranges.values():
        count *= n
    if count > _BRUTE_FORCE_LIMIT:
        return False  # not decided: conservative
    for values in itertools.product(*(range(n) for n in ranges.values())):
        at = dict(zip(ranges, values, strict=True))
        if _offset_at(axes_a, operand_vars, at) != _offset_at(axes_b, result_vars, at):
            return False
    return True


def _padded_size(axes: list[_Axis]) -> int:
    size = 1
    for axis in axes:
        size *= axis[3]
    return size


def _offset_at(axes: list[_Axis], var_of: list[tuple[int, int, int]], at: dict[int, int]) -> int:
    """The element offset of one element, the variables at these values."""
    offset = 0
    for dim, modulus, divisor, size in axes:
        digit = 0
        if dim is not None:
            var, scale, extent = var_of[dim]
            index = (at[var] % (scale * extent)) // scale
            digit = (index % modulus if modulus is not None else index) // divisor
        offset = offset * size + digit
    return offset


def _layout_extra_rest(shape: Shape) -> str:
    """The layout's extras other than tiles (memory space, element size ...), as printed."""
    tiles = _tiles(shape)
    return shape.layout_extra.replace(tiles, "", 1) if tiles else shape.layout_extra


def _tiled_case(operand: Shape, result: Shape) -> bool:
    return bool(_tiles(operand) or _tiles(result))


def transpose_is_bitcast(operand: Shape, result: Shape, permutation: tuple[int, ...]) -> bool:
    """True when the transpose moves no data: every element sits at the same byte offset
    under the operand's and the result's layouts. Untiled, dims of size 1 are ignored (a
    transpose that only moves them is a bitcast), otherwise this is XLA's
    ``ShapeUtil::TransposeIsBitcast``; the memory space must be the same. Tiled, the offsets
    are computed with the tiles' padding (a size-1 dim moved into or out of the tiled minor
    dims changes it) and the padded sizes must be equal too."""
    if operand.is_tuple or result.is_tuple or operand.element_type != result.element_type:
        return False
    if sorted(permutation) != list(range(len(operand.dims))) or len(result.dims) != len(operand.dims):
        return False
    if any(result.dims[i] != operand.dims[permutation[i]] for i in range(len(permutation))):
        return False
    if _memory_space(operand) != _memory_space(result):
        return False
    if _tiled_case(operand, result):
        if _layout_extra_rest(operand) != _layout_extra_rest(result) or any(d < 0 for d in operand.dims):
            return False
        dims = operand.dims
        return _same_bytes(operand, result, [(d, 1, dims[d]) for d in range(len(dims))],
                           [(permutation[i], 1, dims[permutation[i]]) for i in range(len(dims))],
                           {d: dims[d] for d in range(len(dims))})
    strides = _row_major_strides(operand.dims)
    result_strides = [strides[permutation[i]] for i in range(len(permutation))]
    return _physical(operand, strides) == _physical(result, result_strides)


def reshape_is_bitcast(operand: Shape, result: Shape) -> bool:
    """True when the reshape moves no data: every element (a reshape keeps the row-major
    linear index) sits at the same offset under the operand's and the result's layouts.
    Untiled, degenerate dims ignored, as XLA's ``ShapeUtil::ReshapeIsBitcast``; tiled, with
    the tiles' padding and equal padded sizes (``T(8,128)`` over one tile of [8,128] is the
    same bytes as ``T(1024)`` over [1024])."""
    if operand.is_tuple or result.is_tuple or operand.element_type != result.element_type:
        return False
    if any(d < 0 for d in operand.dims + result.dims):
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
    if _tiled_case(operand, result):
        if _layout_extra_rest(operand) != _layout_extra_rest(result):
            return False
        return _same_bytes(operand, result, _linear_vars(operand.dims), _linear_vars(result.dims), {0: n_in})
    return (_physical(operand, _row_major_strides(operand.dims))
            == _physical(result, _row_major_strides(result.dims)))


def _linear_vars(dims: tuple[int, ...]) -> list[tuple[int, int, int]]:
    """Each dim's index as a digit of the row-major linear index (variable 0)."""
    return [(0, stride, dims[d]) for d, stride in enumerate(_row_major_strides(dims))]


def copy_is_bitcast(operand: Shape, result: Shape) -> bool:
    """True when the copy moves no data: same element type and dims, every element at the
    same offset and the same padded size under both layouts (tiles included), same memory
    space (a copy into ``S(1)`` moves the data to another memory)."""
    if operand.is_tuple or result.is_tuple or operand.dims != result.dims:
        return False
    return transpose_is_bitcast(operand, result, tuple(range(len(operand.dims))))


def is_bitcast_equivalent(ins: Instruction, comp: Computation) -> bool:
    """Is this transpose/reshape/copy (or bitcast) a bitcast under its layouts (cached on it)."""
    cached = ins.__dict__.get("_bitcast_equivalent")
    if cached is not None:
        return cached
    src, k = comp.operand(ins.operands[0])
    operand = src.shape.subshape(k)
    key: tuple[Shape, Shape, tuple[int, ...] | str]
    if ins.opcode == "transpose":
        perm = ins.int_list("dimensions")
        key = (operand, ins.shape, perm)
        result = _BITCAST_BY_SHAPES.get(key)
        if result is None:
            result = _remember(key, transpose_is_bitcast(operand, ins.shape, perm))
    elif ins.opcode in ("reshape", "copy"):
        key = (operand, ins.shape, ins.opcode)
        result = _BITCAST_BY_SHAPES.get(key)
        if result is None:
            is_bitcast = reshape_is_bitcast if ins.opcode == "reshape" else copy_is_bitcast
            result = _remember(key, is_bitcast(operand, ins.shape))
    else:
        result = ins.opcode == "bitcast"
    ins.__dict__["_bitcast_equivalent"] = result
    return result


# (operand shape, result shape, permutation or the opcode of a reshape/copy) -> is a bitcast: a
# model's many transposes and reshapes repeat a few shape pairs (Shape is immutable).
_BITCAST_BY_SHAPES: dict[tuple, bool] = {}


def clear_caches() -> None:
    """Forget the bitcast decisions and effective tables made so far (per-module results
    live on the module and go with it)."""
    _BITCAST_BY_SHAPES.clear()
    _TABLES.clear()


def _remember(key: tuple, result: bool) -> bool:
    if len(_BITCAST_BY_SHAPES) < 100_000:
        _BITCAST_BY_SHAPES[key] = result
    return result


def is_noop(ins: Instruction, comp: Computation, policy: str, backend: str = "cpu") -> bool:
    if ins.opcode == "bitcast":
        return True
    if ins.opcode == "reshape" and backend == "gpu" and ins.operands:
        return True
    if ins.opcode in ("transpose", "reshape") and ins.operands:
        if policy == "proposed":
            return True
        if policy == "layout-aware":
            return is_bitcast_equivalent(ins, comp)
    return False


# ----------------------------------------------------------------------------- tracing


class Model(NamedTuple):
    """One alias model: a policy on top of a backend's no-op rule."""

    policy: str = "stock"
    backend: str = "cpu"


def _follow(comp: Computation, ins: Instruction, index: tuple[int, ...], model: Model,
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
    while not index and is_noop(ins, comp, model.policy, model.backend):
        path.append(ins.opcode)
        ins, index = comp.operand(ins.operands[0])
    return ins, index


Pair = tuple[int, tuple[int, ...], tuple[int, ...]]  # (operand number, operand index, output index)


def _default_pairs(n: int) -> list[Pair]:
    return [(0, (), ())] if n == 1 else [(i, (), (i,)) for i in range(n)]


def _annotated(ins: Instruction) -> list[Pair]:
    if "output_to_operand_aliasing" not in ins.attr_text:
        return []
    return [(op, op_idx, out) for out, op, op_idx in ins.output_to_operand_aliasing() if op >= 0]


def _collective_permute_pairs(ins: Instruction, comp: Computation | None, start: bool) -> list[Pair]:
    """In-place collective-permute (4 operands: input, output buffer, offsets): operand 1."""
    if len(ins.operands) != 4:
        return []
    out = (1,) if start else ()
    pairs: list[Pair] = [(1, (), out)]
    if comp is not None:
        src, k = comp.operand(ins.operands[1])
        shape = src.shape.subshape(k)
        if shape.tuple_shapes is not None:
            pairs += [(1, (i,), out + (i,)) for i in range(len(shape.tuple_shapes))]
    return pairs


def _async_pairs(ins: Instruction, comp: Computation | None) -> list[Pair]:
    if ins.opcode == "async-start":
        if not ins.operands:
            return []
        return [(op, op_idx, out) for op, op_idx, out in _annotated(ins)
                if out and op < len(ins.operands) and _index_valid(ins.shape, out)]
    if ins.opcode == "async-update":
        return _annotated(ins)
    # async-done: result-to-parameter aliasing of the chain's async-start
    start = ins
    seen = 0
    while comp is not None and start.opcode in ("async-done", "async-update") and start.operands and seen < 10_000:
        start = comp.operand(start.operands[0])[0]
        seen += 1
    if start.opcode != "async-start":
        return []
    pairs = []
    for out, op, op_idx in start.output_to_operand_aliasing():
        if out and out[0] == 1 and _index_valid(ins.shape, out[1:]):
            pairs.append((0, (0, op) + op_idx, out[1:]))
    return pairs


def _index_valid(shape: Shape, index: tuple[int, ...]) -> bool:
    try:
        shape.subshape(index)
    except IndexError:
        return False
    return True


def op_in_place_pairs(ins: Instruction, comp: Computation | None = None) -> list[Pair]:
    """In-place pairs of a non-fusion instruction (upstream's GetInPlaceInputOutputPairs)."""
    op = ins.opcode
    if op == "scatter":
        return _default_pairs((len(ins.operands) - 1) // 2)
    if op == "dynamic-update-slice":
        return [(0, (), ())]
    if op == "all-reduce-start":
        return _default_pairs(len(ins.operands))
    if op in ("collective-permute", "collective-permute-start"):
        return _collective_permute_pairs(ins, comp, op.endswith("-start"))
    if op == "custom-call":
        return _annotated(ins)
    if op in ("async-start", "async-update", "async-done"):
        return _async_pairs(ins, comp)
    if op == "set-dimension-size":
        return [(0, (), ())]
    if op == "ragged-all-to-all":
        return [(1, (), ())]
    return []


def _cache(module: HloModule) -> dict:
    cache = module.__dict__.get("_alias_cache")
    if cache is None:
        cache = module.__dict__["_alias_cache"] = {}
    return cache


_MODELS = {(p, b): Model(p, b) for p in POLICIES for b in BACKEND_RULES}  # made once: NamedTuple() is slow
_ALL_MODELS = tuple(_MODELS.values())


# Opcodes that have in-place pairs of their own (op_in_place_pairs); a fusion whose body holds
# none of them, nested fusions included, and which has no annotation has no in-place pair.
IN_PLACE_OPCODES = frozenset(("scatter", "dynamic-update-slice", "all-reduce-start", "collective-permute",
                              "collective-permute-start", "custom-call", "async-start", "async-update",
                              "async-done", "set-dimension-size", "ragged-all-to-all"))


def opcodes(module: HloModule, comp_name: str) -> frozenset[str]:
    """The opcodes of a computation and of the fusions nested in it (computed for every
    computation of the module on first use, callees first)."""
    cache = _cache(module)
    ops = cache.get(("ops", comp_name))
    if ops is None:
        for comp in module.computations:
            own = {i.opcode for i in comp.instructions}
            for i in comp.instructions:
                if i.opcode == "fusion" and i.called:
                    own |= cache.get(("ops", i.called[0]), set())
            cache[("ops", comp.name)] = frozenset(own)
        ops = cache.get(("ops", comp_name), frozenset())
    return ops


def _effective_table(module: HloModule, comp_name: str) -> dict[Model, Model]:
    """Every model -> the simplest one with the same pairs here, computed once per computation."""
    ops = opcodes(module, comp_name)
    # layout-aware is proposed when every transpose/reshape here is a bitcast, stock when none is
    layout_aware_as = "layout-aware"
    if "fusion" not in ops and ("transpose" in ops or "reshape" in ops):
        comp = module.computation(comp_name)
        bitcasts = {is_bitcast_equivalent(i, comp) for i in comp.instructions
                    if (i.opcode == "transpose" or i.opcode == "reshape") and i.operands}
        if len(bitcasts) == 1:
            layout_aware_as = "proposed" if True in bitcasts else "stock"
    key = ("reshape" in ops, "transpose" in ops, layout_aware_as)
    table = _TABLES.get(key)
    if table is None:
        table = _TABLES[key] = {}
        for model in _ALL_MODELS:
            policy, backend = model
            if "reshape" not in ops:
                backend = "cpu"
                if "transpose" not in ops:
                    policy = "stock"
            if policy == "layout-aware":
                policy = layout_aware_as
            table[model] = _MODELS[policy, backend]
    return table


_TABLES: dict[tuple, dict[Model, Model]] = {}  # effective tables by what they depend on (a few)


def effective_table(module: HloModule, comp_name: str) -> dict[Model, Model]:
    """Every model -> the simplest one giving this computation the same pairs (cached): without
    reshapes (nested fusions included) the backend rules agree; without transposes and
    reshapes the policies do; layout-aware is proposed or stock when every transpose and
    reshape here is, or none is, a bitcast."""
    cache = _cache(module)
    table = cache.get(("effective", comp_name))
    if table is None:
        table = cache[("effective", comp_name)] = _effective_table(module, comp_name)
    return table


def model(policy: str, backend: str) -> Model:
    return _MODELS[policy, backend]


def discovered_pairs(module: HloModule, fusion: Instruction, model: Model) -> list[InPlacePair]:
    """The pairs a fusion's body shows under ``model`` (an effective model, as
    ``effective_table`` gives), without the fusion's own annotation; cached, do not modify."""
    cache = _cache(module)
    key = (fusion.called[0], model)
    found = cache.get(key)
    if found is None:
        ops = cache.get(("ops", key[0]))
        if ops is not None and "fusion" not in ops:  # nothing nested: trace this one directly
            found = cache[key] = _discover(module, module.computation(key[0]), fusion, model)
        else:
            _ensure_nested(module, fusion, model)
            found = cache[key]
    return found


def _ensure_nested(module: HloModule, fusion: Instruction, model: Model) -> None:
    """Compute the pairs of every fusion nested under ``fusion`` first, innermost first,
    with an explicit stack (no recursion, whatever the nesting depth)."""
    cache = _cache(module)
    if (fusion.called[0], model) in cache:
        return
    stack = [fusion]
    while stack:
        top = stack[-1]
        comp = module.computation(top.called[0])
        pending = [i for i in comp.instructions if i.opcode == "fusion" and i.called
                   and (i.called[0], model) not in cache]
        if pending and (top.called[0], model, "visiting") not in cache:
            cache[(top.called[0], model, "visiting")] = True
            stack.extend(pending)
            continue
        stack.pop()
        if (top.called[0], model) not in cache:
            cache[(top.called[0], model)] = _discover(module, comp, top, model)


def _output_source_pairs(module: HloModule, ins: Instruction, model: Model, comp: Computation) -> list[Pair]:
    """Pairs of an output source: a nested fusion contributes only what its body shows."""
    if ins.opcode == "fusion":
        return [(p.operand_index, p.operand_shape_index, p.output_index)
                for p in _cache(module)[(ins.called[0], model)]]
    return op_in_place_pairs(ins, comp)


def _nested_pairs(module: HloModule, ins: Instruction, model: Model) -> list[Pair]:
    """A nested fusion's public pairs: discovered plus annotated."""
    found = [(p.operand_index, p.operand_shape_index, p.output_index)
             for p in _cache(module)[(ins.called[0], model)]]
    return found + _annotated(ins)


def _discover(module: HloModule, comp: Computation, fusion: Instruction, model: Model) -> list[InPlacePair]:
    out: list[InPlacePair] = []
    for index, _ in fusion.shape.leaves():
        src, src_index = _follow(comp, comp.root, index, model, [])
        found: tuple[Instruction, tuple[int, ...], list[str]] | None = None
        for op_num, op_index, out_index in _output_source_pairs(module, src, model, comp):
            if out_index != src_index or op_num >= len(src.operands):
                continue
            path: list[str] = []
            first, k = comp.operand(src.operands[op_num])
            inp, inp_index = _follow(comp, first, k + op_index, model, path)
            if inp.opcode == "fusion" and inp.called:  # peephole through a nested fusion's pairs
                for n_op, n_op_index, n_out in _nested_pairs(module, inp, model):
                    if n_out == inp_index and n_op < len(inp.operands):
                        path.append("fusion")
                        nxt, k = comp.operand(inp.operands[n_op])
                        inp, inp_index = _follow(comp, nxt, k + n_op_index, model, path)
                        break
            found = (inp, inp_index, path)
        if found is not None and found[0].opcode == "parameter":
            inp, inp_index, path = found
            out.append(InPlacePair(inp.parameter_number, inp_index, index, tuple(path)))
    return out


def fusion_in_place_pairs(module: HloModule, fusion: Instruction, policy: str, backend: str = "cpu"
                          ) -> list[InPlacePair]:
    """In-place (operand, operand index) -> output index pairs of a fusion under ``policy`` and
    ``backend``'s no-op rule, discovered pairs first, then the annotated ones."""
    if policy not in POLICIES:
        raise HarnessError(f"unknown policy {policy!r}; expected one of {', '.join(POLICIES)}")
    if backend not in BACKEND_RULES:
        raise HarnessError(f"unknown backend rule {backend!r}; expected one of {', '.join(BACKEND_RULES)}")
    if fusion.opcode != "fusion" or not fusion.called:
        raise HarnessError(f"{fusion.name} is not a fusion instruction")
    model = effective_table(module, fusion.called[0])[_MODELS[policy, backend]]
    _ensure_nested(module, fusion, model)
    out = list(_cache(module)[(fusion.called[0], model)])
    if "output_to_operand_aliasing" in fusion.attr_text:
        for out_index, op, op_index in fusion.output_to_operand_aliasing():
            out.append(InPlacePair(op, op_index, out_index, ()))
    return out


def output_source_path(module: HloModule, fusion: Instruction, index: tuple[int, ...], policy: str,
                       backend: str = "cpu") -> tuple[Instruction, list[str]]:
    """The output source and the opcodes walked to it from the fused root (tuple,
    get-tuple-element, no-ops), root first."""
    comp = module.computation(fusion.called[0])
    path: list[str] = []
    return _follow(comp, comp.root, index, _MODELS[policy, backend], path)[0], path
