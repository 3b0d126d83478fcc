"""The :class:`~xla_harness.hlo.shapes.ShapeTable` a parse reads its shapes through: what it keeps,
its limit, and that each parse has one of its own (no shape read by one parse is in another's)."""

from __future__ import annotations

import pytest

from xla_harness.hlo import parser
from xla_harness.hlo.instructions import line_shape
from xla_harness.hlo.parser import parse_module
from xla_harness.hlo.shapes import Shape, ShapeTable, array_shape, parse_shape

MODULE_A = """HloModule a
ENTRY e (p: f32[2]) -> (f32[2]{0}, f32[3]{0}) {
  p = f32[2]{0} parameter(0)
  c = f32[3]{0} constant({1, 2, 3})
  ROOT t = (f32[2]{0}, f32[3]{0}) tuple(p, c)
}
"""
MODULE_B = """HloModule b
ENTRY e (q: s32[4]) -> (s32[4]{0}, s32[]) {
  q = s32[4]{0} parameter(0)
  k = s32[] constant(7)
  ROOT u = (s32[4]{0}, s32[]) tuple(q, k)
}
"""


def test_a_table_gives_back_the_shape_read_before_from_the_same_text():
    table = ShapeTable()
    first, end = parse_shape("f32[2,3]{1,0} rest", 0, table)
    assert end == len("f32[2,3]{1,0}") and table.arrays == {"f32[2,3]{1,0}": first}
    again, _ = parse_shape("x f32[2,3]{1,0}", 2, table)
    assert again is first
    assert table.get("f32[2,3]{1,0}") is first and table.get("f32[2,3]") is None
    assert table.tuples == {}  # parse_shape keeps array shapes only


def test_without_a_table_nothing_is_kept():
    a, _ = parse_shape("f32[2,3]{1,0}")
    b, _ = array_shape("f32[2,3]{1,0}", 0)
    assert a == b and a is not b


def test_tuple_shapes_are_kept_by_their_text_and_found_by_get():
    table = ShapeTable()
    shape = line_shape("(f32[2]{0}, s32[])", table)
    assert shape == Shape("tuple", tuple_shapes=(Shape("f32", (2,), (0,)), Shape("s32", (), None)))
    assert table.tuples == {"(f32[2]{0}, s32[])": shape} and table.get("(f32[2]{0}, s32[])") is shape
    assert set(table.arrays) == {"f32[2]{0}", "s32[]"}  # its elements were read through the table too
    assert line_shape("(f32[2]{0}, s32[]) junk", table) is None  # not one whole shape: not kept
    assert len(table.tuples) == 1


def test_a_table_keeps_at_most_its_limit(monkeypatch):
    monkeypatch.setattr(ShapeTable, "LIMIT", 2)
    table = ShapeTable()
    for n in range(4):
        parse_shape(f"f32[{n}]", 0, table)
        table.remember_tuple(f"(f32[{n}])", Shape("tuple", tuple_shapes=()))
    assert list(table.arrays) == ["f32[0]", "f32[1]"] and list(table.tuples) == ["(f32[0])", "(f32[1])"]


def test_each_parse_reads_through_a_table_of_its_own(monkeypatch):
    made: list[ShapeTable] = []

    class Recorded(ShapeTable):
        __slots__ = ()

        def __init__(self) -> None:
            super().__init__()
            made.append(self)

    monkeypatch.setattr(parser, "ShapeTable", Recorded)
    a = parse_module(MODULE_A)
    b = parse_module(MODULE_B)
    assert len(made) == 2 and made[0] is not made[1]
    table_a, table_b = made
    # each table holds its own module's tuple shapes, none of the other's
    assert set(table_a.tuples) == {"(f32[2]{0}, f32[3]{0})"}
    assert set(table_b.tuples) == {"(s32[4]{0}, s32[])"}
    assert table_a.tuples["(f32[2]{0}, f32[3]{0})"] is a.entry.root.shape
    assert table_b.tuples["(s32[4]{0}, s32[])"] is b.entry.root.shape
    assert not set(table_a.arrays) & set(table_b.arrays)


def test_two_parses_of_one_text_share_no_shape_object():
    first, second = parse_module(MODULE_A), parse_module(MODULE_A)
    for one, two in zip(first.entry.instructions, second.entry.instructions, strict=True):
        assert one.shape == two.shape and one.shape is not two.shape


@pytest.mark.parametrize("text", ["(f32[2]{0}, s32[])", "f32[2,3]{1,0}"])
def test_a_parse_reads_a_shape_it_met_before_as_the_same_object(text):
    """Within one parse the table does its job: a shape text met twice is one Shape."""
    module = parse_module(f"HloModule m\nENTRY e {{\n  a = {text} parameter(0)\n  ROOT b = {text} copy(a)\n}}\n")
    a, b = module.entry.instructions
    assert a.shape is b.shape
