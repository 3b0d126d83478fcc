"""Bitcast predicates under tiled layouts, checked against a brute-force oracle: every
element's byte offset under XLA's tiling (dims in minor-to-major order, then each tile level
splitting the minor dims into tile counts, padded to whole tiles, and within-tile dims).
A transpose/reshape/copy is a bitcast exactly when every element keeps its offset and the
padded size is the same."""

from __future__ import annotations

import functools
import itertools
import math
import random

import numpy as np
import pytest

from xla_harness.hlo import bitcast
from xla_harness.hlo.parser import parse_module
from xla_harness.hlo.scan import scan
from xla_harness.hlo.shapes import Shape, parse_shape

BYTES = {"f32": 4, "bf16": 2, "s8": 1}


def _levels(extra: str) -> list[tuple[int, ...]]:
    tiles = extra.split("S(")[0]
    if not tiles:
        return []
    assert tiles.startswith("T(") and tiles.endswith(")"), tiles
    return [tuple(int(x) for x in group.split(",")) for group in tiles[2:-1].split(")(")]


@functools.cache
def byte_offsets(shape: Shape) -> tuple[dict[tuple[int, ...], int], int]:
    """{logical index: byte offset} and the padded size in bytes, element by element."""
    order = list(reversed(shape.layout_or_default()))  # physical dims, major to minor
    physical_dims = [shape.dims[d] for d in order]
    levels = _levels(shape.layout_extra)
    tiled_dims = list(physical_dims)
    for tile in levels:
        tiled_dims = [1] * (len(tile) - len(tiled_dims)) + tiled_dims
        head, minor = tiled_dims[:len(tiled_dims) - len(tile)], tiled_dims[len(tiled_dims) - len(tile):]
        tiled_dims = head + [math.ceil(d / t) for d, t in zip(minor, tile, strict=True)] + list(tile)
    out = {}
    for index in itertools.product(*(range(d) for d in shape.dims)):
        p = [index[d] for d in order]
        for tile in levels:
            p = [0] * (len(tile) - len(p)) + p
            head, minor = p[:len(p) - len(tile)], p[len(p) - len(tile):]
            p = head + [i // t for i, t in zip(minor, tile, strict=True)] + [i % t for i, t in zip(minor, tile,
                                                                                                 strict=True)]
        offset = 0
        for i, d in zip(p, tiled_dims, strict=True):
            offset = offset * d + i
        out[index] = offset * BYTES[shape.element_type]
    return out, math.prod(tiled_dims) * BYTES[shape.element_type]


def _space(shape: Shape) -> str:
    return shape.layout_extra.partition("S(")[2]


def same_bytes(operand: Shape, result: Shape, result_index) -> bool:
    """The oracle: each operand element at the same offset as its result element, same size,
    same memory space."""
    if operand.element_type != result.element_type or _space(operand) != _space(result):
        return False
    a, size_a = byte_offsets(operand)
    b, size_b = byte_offsets(result)
    return size_a == size_b and all(b[result_index(i)] == off for i, off in a.items())


TILES = ["", "T(2)", "T(4)", "T(1,2)", "T(2,1)", "T(2,2)", "T(2,4)", "T(4,2)", "T(2,2)(2,1)", "T(4,2)(2,1)",
         "T(4)(2)", "T(2,2,2)"]


def _shape(etype: str, dims: tuple[int, ...], m2m: tuple[int, ...], tiles: str) -> Shape:
    return Shape(etype, dims, m2m, layout_extra=tiles)


def test_oracle_on_known_layouts():
    """The oracle itself, on layouts worked out by hand."""
    offsets, size = byte_offsets(_shape("f32", (3, 3), (1, 0), "T(2,2)"))
    assert size == 4 * 16  # padded to [4,4]: tiles [2,2] of [2,2]
    assert [offsets[i] // 4 for i in [(0, 0), (0, 1), (0, 2), (1, 0), (2, 0), (2, 2)]] == [0, 1, 4, 2, 8, 12]
    offsets, size = byte_offsets(_shape("bf16", (4, 2), (1, 0), "T(4,2)(2,1)"))
    assert size == 16  # [1,1,4,2] then (2,1) on the tile: [1,1,2,2,2,1]
    assert [offsets[(r, c)] // 2 for r in range(4) for c in range(2)] == [0, 2, 1, 3, 4, 6, 5, 7]
    # a scalar-like shape under a tile wider than its rank is padded on the major side
    assert byte_offsets(_shape("f32", (3,), (0,), "T(2,2)"))[1] == 4 * 8


def test_transpose_predicate_equals_oracle_exhaustively():
    checked = {True: 0, False: 0}
    cases = []
    for dims in itertools.product([1, 2, 3, 4], repeat=2):
        for perm, m_in, m_out in itertools.product(itertools.permutations(range(2)), repeat=3):
            for t_in, t_out in itertools.product(TILES, repeat=2):
                cases.append((dims, perm, m_in, m_out, t_in, t_out))
    rng = random.Random(3)
    for _ in range(3000):  # rank 3 sampled (exhaustive is 10^6 cases)
        dims = tuple(rng.choice([1, 2, 3]) for _ in range(3))
        cases.append((dims, tuple(rng.sample(range(3), 3)), tuple(rng.sample(range(3), 3)),
                      tuple(rng.sample(range(3), 3)), rng.choice(TILES), rng.choice(TILES)))
    for dims, perm, m_in, m_out, t_in, t_out in cases:
        operand = _shape("f32", dims, m_in, t_in)
        result = _shape("f32", tuple(dims[p] for p in perm), m_out, t_out)
        truth = same_bytes(operand, result, lambda i, perm=perm: tuple(i[p] for p in perm))
        assert bitcast.transpose_is_bitcast(operand, result, perm) == truth, (operand, result, perm)
        checked[truth] += 1
    assert len(cases) > 20000 and min(checked.values()) > 500, checked


def _factorizations(n: int) -> list[tuple[int, ...]]:
    out = [(n,)]
    for d in range(2, n):
        if n % d == 0:
            out += [(d, *rest) for rest in _factorizations(n // d)]
    return out


@functools.cache
def _row_major_offsets(shape: Shape) -> tuple[tuple[int, ...], int]:
    """Byte offsets of the elements in row-major (linear index) order, and the padded size."""
    offsets, size = byte_offsets(shape)
    return tuple(offsets[i] for i in itertools.product(*(range(d) for d in shape.dims))), size


def _reshape_oracle(operand: Shape, result: Shape) -> bool:
    """A reshape keeps the row-major linear index: compare offsets in that order."""
    if operand.element_type != result.element_type or _space(operand) != _space(result):
        return False
    return _row_major_offsets(operand) == _row_major_offsets(result)


def test_reshape_oracle_is_the_element_mapping():
    """The fast reshape oracle agrees with mapping each element by np.unravel_index."""
    rng = random.Random(5)
    for _ in range(200):
        din, dout = rng.choice([((2, 3), (6,)), ((2, 2, 2), (4, 2)), ((1, 4), (2, 2)), ((3, 2), (2, 3))])
        operand = _shape("f32", din, tuple(rng.sample(range(len(din)), len(din))), rng.choice(TILES[:8]))
        result = _shape("f32", dout, tuple(rng.sample(range(len(dout)), len(dout))), rng.choice(TILES[:8]))
        assert _reshape_oracle(operand, result) == same_bytes(operand, result, lambda i, din=din, dout=dout: tuple(
            int(k) for k in np.unravel_index(np.ravel_multi_index(i, din), dout)))


def test_reshape_predicate_equals_oracle_exhaustively():
    checked = {True: 0, False: 0}
    for n in (4, 6, 8):
        shapes = set()
        for f in _factorizations(n):
            shapes.add(f)
            shapes.update(f[:k] + (1,) + f[k:] for k in range(len(f) + 1))  # with a size-1 dim
        for din, dout in itertools.product(sorted(shapes), repeat=2):
            if len(din) > 3 or len(dout) > 3 or (n > 4 and len(din) + len(dout) > 5):
                continue  # rank 3 to rank 3 for the smallest size only (time)
            for m_in in itertools.permutations(range(len(din))):
                for m_out in itertools.permutations(range(len(dout))):
                    for t_in, t_out in itertools.product(["", "T(2)", "T(4)", "T(2,2)", "T(2,4)", "T(4,2)(2,1)"],
                                                         repeat=2):
                        operand, result = _shape("f32", din, m_in, t_in), _shape("f32", dout, m_out, t_out)
                        truth = _reshape_oracle(operand, result)
                        assert bitcast.reshape_is_bitcast(operand, result) == truth, (operand, result)
                        checked[truth] += 1
    assert min(checked.values()) > 500 and sum(checked.values()) > 50000, checked


def test_copy_predicate_equals_oracle_exhaustively():
    checked = {True: 0, False: 0}
    for dims in itertools.product([1, 2, 3, 4], repeat=2):
        for m_in, m_out in itertools.product(itertools.permutations(range(2)), repeat=2):
            for t_in, t_out in itertools.product(TILES, repeat=2):
                for s_in, s_out in [("", ""), ("", "S(1)"), ("S(1)", "S(1)")]:
                    operand = _shape("bf16", dims, m_in, t_in + s_in)
                    result = _shape("bf16", dims, m_out, t_out + s_out)
                    truth = same_bytes(operand, result, lambda i: i)
                    assert bitcast.copy_is_bitcast(operand, result) == truth, (operand, result)
                    checked[truth] += 1
    assert min(checked.values()) > 500, checked


def _p(text: str) -> Shape:
    return parse_shape(text)[0]


@pytest.mark.parametrize("operand,result,perm,expected", [
    # the case: the size-1 dim moves into the tiled minor dims, the padding grows 128x
    ("f32[1,1024]{1,0}", "f32[1024,1]{1,0:T(8,128)}", (1, 0), False),
    ("f32[1,1024]{1,0:T(8,128)}", "f32[1024,1]{1,0:T(8,128)}", (1, 0), False),
    ("f32[1,1024]{1,0:T(8,128)}", "f32[1024,1]{0,1:T(8,128)}", (1, 0), True),  # the same physical array
    ("f32[8,128]{1,0:T(8,128)}", "f32[128,8]{0,1:T(8,128)}", (1, 0), True),
    ("f32[8,128]{1,0:T(8,128)}", "f32[128,8]{0,1:T(8,128)S(1)}", (1, 0), False),
    ("bf16[16,128]{1,0:T(8,128)(2,1)}", "bf16[128,16]{0,1:T(8,128)(2,1)}", (1, 0), True),
    ("bf16[16,128]{1,0:T(8,128)(2,1)}", "bf16[128,16]{0,1:T(8,128)}", (1, 0), False),
])
def test_tpu_sized_transposes(operand, result, perm, expected):
    assert bitcast.transpose_is_bitcast(_p(operand), _p(result), perm) is expected


def test_tpu_sized_reshapes_and_copies():
    assert bitcast.reshape_is_bitcast(_p("f32[8,128]{1,0:T(8,128)}"), _p("f32[1024]{0:T(1024)}"))
    assert bitcast.reshape_is_bitcast(_p("f32[16,128]{1,0:T(8,128)}"), _p("f32[2048]{0:T(1024)}"))
    assert not bitcast.reshape_is_bitcast(_p("f32[4,256]{1,0:T(8,128)}"), _p("f32[1024]{0:T(1024)}"))  # padded rows
    assert not bitcast.copy_is_bitcast(_p("f32[16,128]{1,0:T(8,128)}"), _p("f32[16,128]{1,0:T(8,128)S(1)}"))
    assert not bitcast.copy_is_bitcast(_p("f32[16,256]{1,0:T(8,128)}"), _p("f32[16,256]{1,0:T(2,128)}"))
    assert bitcast.copy_is_bitcast(_p("f32[16,128]{1,0:T(8,128)}"), _p("f32[16,128]{1,0:T(2,128)}"))  # rows of 128
    assert bitcast.copy_is_bitcast(_p("bf16[16,128]{1,0:T(8,128)(2,1)}"), _p("bf16[16,128]{1,0:T(16,128)(2,1)}"))


def test_unread_tilings_are_conservative():
    """Tilings the predicate does not model (a nested tile that does not divide the one it
    splits, '*' dims) parse and are never called bitcasts, even where the bytes agree."""
    odd = _p("f32[8,6]{1,0:T(4,6)(1,4)}")
    assert odd.layout_extra == "T(4,6)(1,4)"
    assert not bitcast.copy_is_bitcast(odd, odd)
    assert same_bytes(odd, odd, lambda i: i)  # what the oracle says: the predicate errs on the safe side
    star = _p("f32[8,6]{1,0:T(2,*)}")
    assert not bitcast.copy_is_bitcast(star, star)


TILED_TRANSPOSE = """HloModule tiled

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %sum = f32[] add(%x, %y)
}

%fused (p0: f32[1,1024], p1: s32[8,1], p2: f32[8,1]) -> f32[1024,1] {
  %p0 = f32[1,1024]{1,0:T(8,128)} parameter(0)
  %t = f32[1024,1]{RESULT_LAYOUT} transpose(%p0), dimensions={1,0}
  %p1 = s32[8,1]{1,0} parameter(1)
  %p2 = f32[8,1]{1,0} parameter(2)
  ROOT %s = f32[1024,1]{RESULT_LAYOUT} scatter(%t, %p1, %p2), update_window_dims={1}, inserted_window_dims={0},
      scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=%add
}

ENTRY %main (w: f32[1,1024], i: s32[8,1], u: f32[8,1]) -> f32[1024,1] {
  %w = f32[1,1024]{1,0:T(8,128)} parameter(0)
  %i = s32[8,1]{1,0} parameter(1)
  %u = f32[8,1]{1,0} parameter(2)
  ROOT %f = f32[1024,1]{RESULT_LAYOUT} fusion(%w, %i, %u), kind=kLoop, calls=%fused
}
"""


@pytest.mark.parametrize("layout,expected", [("1,0:T(8,128)", "hazard"), ("0,1:T(8,128)", "layout-preserving-miss")])
def test_scanner_sees_the_padding_change(layout, expected):
    """End to end: moving the size-1 dim into the tiled minor dims moves data (a hazard);
    the same transpose into the layout with the same bytes is a bitcast XLA misses."""
    findings, _, _ = scan(parse_module(TILED_TRANSPOSE.replace("RESULT_LAYOUT", layout)))
    assert [f.cls for f in findings] == [expected]
