"""The public lexer of the HLO reader (:mod:`xla_harness.hlo.lexer`): each function's answer on
the forms XLA prints, and the ValueError it raises on malformed text."""

from __future__ import annotations

import pytest

from xla_harness.hlo.lexer import (
    attr_end,
    attributes_end_here,
    match_brace,
    skip_attributes,
    skip_string,
    skip_value,
    split_top,
    strip_comments,
    ws_end,
)


def test_ws_end_is_the_first_non_whitespace_index_or_the_length():
    assert ws_end("  \n\t x", 0) == 5
    assert ws_end("ab", 1) == 1
    assert ws_end("a \n ", 1) == 4


@pytest.mark.parametrize(("text", "start", "end"), [
    ("{1,0}", 0, 5),
    ("f(a, {b, [c]}) rest", 1, 14),
    ('{x="}", y={1}}, z', 0, 14),  # a closer inside a string does not close
    ('{a="\\"}"}', 0, 9),  # nor one after an escaped quote
    ("[2,4]<=[8]", 0, 5),
])
def test_match_brace_returns_the_index_after_the_closing_bracket(text, start, end):
    assert match_brace(text, start) == end


@pytest.mark.parametrize(("text", "message"), [
    ("{a]", "unbalanced ']', expected '}'"),
    ("(a, {b)", "unbalanced ')', expected '}'"),
    ("{a, (b)", "unbalanced '{': the text ends before its '}'"),
    ("abc", "expected a bracket"),
    ('{"a}', "unterminated string"),
])
def test_match_brace_says_what_is_unbalanced(text, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")
                       .replace("[", r"\[").replace("]", r"\]").replace("{", r"\{").replace("}", r"\}")):
        match_brace(text, 0)


def test_skip_string_steps_over_escapes():
    text = 'x="a\\"b\\\\", y'
    assert skip_string(text, 3) == text.index(",")
    with pytest.raises(ValueError, match="unterminated string"):
        skip_string('"abc\\"', 1)


def test_split_top_splits_only_at_top_level_commas_and_keeps_the_pieces_unstripped():
    assert split_top('a, b={1,2}, c="x,y", d=(e, [f, g])') == ["a", " b={1,2}", ' c="x,y"', " d=(e, [f, g])"]
    assert split_top("") == [""]
    assert split_top("one") == ["one"]
    assert split_top("a,,b") == ["a", "", "b"]


def test_strip_comments_keeps_strings_and_line_numbers():
    text = ('HloModule m // the module\n'
            'x = f32[] constant(1) /* two\nlines */, metadata={op_name="a//b"}\n'
            'ROOT y = f32[] add(x, x)\n')
    out = strip_comments(text)
    assert out.count("\n") == text.count("\n")
    assert "the module" not in out and "two" not in out and "lines" not in out
    assert 'op_name="a//b"' in out  # '//' inside a string is the string's
    assert strip_comments('s="x /* y */ z"') == 's="x   z"'  # a block comment goes even inside a string
    assert out.splitlines()[3] == "ROOT y = f32[] add(x, x)"
    assert strip_comments("no comments here") == "no comments here"


@pytest.mark.parametrize(("text", "start", "end"), [
    ("{1,0}, next", 0, 5),
    ('"a, b", next', 0, 6),
    ("[2,4]<=[8]T(1,0), next", 0, 16),  # a bare token with bracketed parts
    ("kLoop, calls=%f", 0, 5),
    ("%fused.1", 0, 8),
])
def test_skip_value_returns_the_index_after_one_attribute_value(text, start, end):
    assert skip_value(text, start) == end


def test_skip_value_refuses_an_empty_value():
    with pytest.raises(ValueError, match="expected an attribute value"):
        skip_value(", x", 0)


def test_skip_attributes_reads_key_value_pairs_across_lines():
    text = ', dimensions={1,0},\n  metadata={op_name="a,b"}\nnext = f32[] x()'
    assert skip_attributes(text, 0) == text.index("\nnext")
    assert skip_attributes("\nnext", 0) == 0  # no attributes: the index itself
    with pytest.raises(ValueError, match="expected 'name=value' after ','"):
        skip_attributes(", {1}", 0)


def test_attr_end_takes_the_line_or_follows_a_continuation():
    one_line = ", dimensions={1,0}\n  y = f32[] z()"
    assert attr_end(one_line, 0) == one_line.index("\n")
    continued = ", dimensions={1,0}\n  , kind=kLoop\n  y = f32[] z()"
    assert attr_end(continued, 0) == continued.index("\n  y")
    open_brace = ", metadata={op_name=\"a\"\n  source_line=3}\n  y = f32[] z()"
    assert attr_end(open_brace, 0) == open_brace.index("\n  y")
    assert attr_end("\n  y = f32[] z()", 0) == 0


@pytest.mark.parametrize(("rest", "complete"), [
    ("", True),
    ("   ", True),
    (", dimensions={1,0}", True),
    (', metadata={op_name="a"}', True),
    (", dimensions={1,0},", False),  # ends in ','
    (", kind=", False),  # ends in '='
    (", dimensions={1,0", False),  # a brace left open
    (', metadata={op_name="a}', False),  # a quote left open
    ("dimensions={1,0}", False),  # not ', ...'
])
def test_attributes_end_here(rest, complete):
    assert attributes_end_here(rest) is complete
