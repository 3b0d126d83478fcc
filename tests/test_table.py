"""xla_harness.table.format_rows: the one plain-text table formatter."""

import pytest

from xla_harness.table import format_rows


def test_columns_padded_to_their_widest_cell_and_trailing_blanks_stripped():
    assert format_rows([["a", "bbb", "c"], ["dddd", "e", ""]]) == [
        "a     bbb  c",
        "dddd  e",
    ]


def test_header_gets_a_rule_of_dashes_as_wide_as_each_column():
    assert format_rows([["eager-sqrt", "OK"]], header=["case", "jit"]) == [
        "case        jit",
        "----------  ---",
        "eager-sqrt  OK",
    ]


def test_header_without_rule_and_indent():
    assert format_rows([["hazard", "f.1"]], header=["class", "fusion"], indent="  ", rule=False) == [
        "  class   fusion",
        "  hazard  f.1",
    ]


def test_rule_is_indented_too_and_header_alone_is_a_table():
    assert format_rows([], header=["ab", "c"], indent="> ") == ["> ab  c", "> --  -"]


def test_nothing_to_format():
    assert format_rows([]) == []


def test_ragged_rows_are_refused():
    with pytest.raises(ValueError, match="cells"):
        format_rows([["a", "b"], ["c"]])
    with pytest.raises(ValueError, match="cells"):
        format_rows([["a", "b", "c"]], header=["x", "y"])


def test_same_lines_as_the_hand_drawn_tables_it_replaced():
    rows = [["config", "seed 1", "rate"], ["full/remat=on/f32", "0/20", "0.000"], ["x", "", "1.000"]]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    want = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    want.insert(1, "  ".join("-" * w for w in widths))
    assert format_rows(rows[1:], header=rows[0]) == want
    assert format_rows(rows[1:], header=rows[0], indent="  ", rule=False) == ["  " + w for w in want[:1] + want[2:]]
