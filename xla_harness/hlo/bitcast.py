"""Does a transpose, reshape or copy move data, or is it a bitcast under its layouts?

An instruction is a bitcast when every element sits at the same byte offset under its operand's
and its result's layouts. Untiled, this is XLA's ``ShapeUtil::TransposeIsBitcast`` /
``ShapeUtil::ReshapeIsBitcast`` with dims of size 1 ignored: physical dims (size, logical stride)
compared major to minor. Tiled (``{1,0:T(8,128)(2,1)}``), each element's offset is computed with
the tiles' padding as a sum of mixed-radix digit terms, compared term by term where that decides
it and element by element up to a size limit otherwise, and the padded sizes must agree; what
is not decided counts as not a bitcast. The memory space (``S(n)``) must be the same.

Used by the ``layout-aware`` alias policy (:mod:`xla_harness.hlo.alias`) and by the scan.
The decisions about one module's instructions are kept in a :class:`BitcastDecisions` (the
module's alias analysis holds one); nothing is kept between modules.
"""

from __future__ import annotations

import itertools

from xla_harness.hlo.ir import Computation, Instruction
from xla_harness.hlo.shapes import Shape


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


class BitcastDecisions:
    """Which transposes, reshapes and copies of one module are bitcasts under their layouts, each
    decided once: by instruction (the instruction is kept with its answer, so no other object ever
    takes its answer), and by (operand shape, result shape, permutation or the opcode of a
    reshape/copy), since a model's many transposes and reshapes repeat a few shape pairs (Shape
    is immutable). Made per module by :func:`xla_harness.hlo.alias.analyze`, or on its own."""

    __slots__ = ("by_instruction", "by_shapes")
    LIMIT = 100_000  # shape pairs kept at most

    def __init__(self) -> None:
        self.by_instruction: dict[int, tuple[Instruction, bool]] = {}  # id -> (the instruction, its answer)
        self.by_shapes: dict[tuple, bool] = {}

    def is_bitcast_equivalent(self, ins: Instruction, comp: Computation) -> bool:
        """Is this transpose/reshape/copy (or bitcast) a bitcast under its layouts."""
        cached = self.by_instruction.get(id(ins))
        if cached is not None and cached[0] is ins:
            return cached[1]
        src, k = comp.operand(ins.operands[0])
        operand = src.shape.subshape(k)
        key: tuple[Shape, Shape, tuple[int, ...] | str]
        by_shapes = self.by_shapes
        if ins.opcode == "transpose":
            perm = ins.int_list("dimensions")
            key = (operand, ins.shape, perm)
            result = by_shapes.get(key)
            if result is None:
                result = self._remember(key, transpose_is_bitcast(operand, ins.shape, perm))
        elif ins.opcode in ("reshape", "copy"):
            key = (operand, ins.shape, ins.opcode)
            result = by_shapes.get(key)
            if result is None:
                is_bitcast = reshape_is_bitcast if ins.opcode == "reshape" else copy_is_bitcast
                result = self._remember(key, is_bitcast(operand, ins.shape))
        else:
            result = ins.opcode == "bitcast"
        self.by_instruction[id(ins)] = (ins, result)
        return result

    def _remember(self, key: tuple, result: bool) -> bool:
        if len(self.by_shapes) < self.LIMIT:
            self.by_shapes[key] = result
        return result
