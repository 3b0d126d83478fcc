"""The report's figures stay readable: a scatter fusion with 27 operands is drawn with at most 8 nodes
a column, the in-place path always among them and the rest counted by opcode; a leaf's
nondeterminism is given as |diff| first, its ULPs after."""

from __future__ import annotations

from xla_harness.triage.compiled import Neighbourhood, Node
from xla_harness.triage.figures import MAX_COLUMN, collapsed, neighbourhood_figure, nondet_size


def wide(n: int = 27, in_place: int = 20) -> Neighbourhood:
    nodes = [Node("scatter_fusion", "scatter_fusion\nfusion (kLoop; root scatter)\nf32[64,32]", "fusion")]
    edges = []
    for i in range(n):
        op = "parameter" if i % 3 else "fusion"
        nodes.append(Node(f"op{i}", f"op{i}\n{op}\nf32[64,32]", "operand"))
        edges.append((f"op{i}", "scatter_fusion", "in place" if i == in_place else f"operand {i}"))
    nodes.append(Node("transpose.1", "transpose.1\ntranspose\nf32[32,64]", "producer"))
    edges.append(("transpose.1", f"op{in_place}", ""))
    nodes.append(Node("user.1", "user.1\nadd\nf32[64,32]", "user"))
    edges.append(("scatter_fusion", "user.1", ""))
    return Neighbourhood("scatter_fusion", nodes, edges)


def test_a_wide_column_is_cut_keeping_the_in_place_path():
    g = collapsed(wide())
    operands = [n for n in g.nodes if n.role == "operand"]
    assert len(operands) == MAX_COLUMN
    names = {n.name for n in g.nodes}
    assert {"op20", "transpose.1", "scatter_fusion", "user.1"} <= names
    more = next(n for n in operands if n.name.startswith("+"))
    assert more.label.startswith("+20 more") and "parameter" in more.label and "fusion" in more.label
    assert ("op20", "scatter_fusion", "in place") in g.edges and ("transpose.1", "op20", "") in g.edges
    assert all(src in names and dst in names for src, dst, _ in g.edges)


def test_without_the_cut_the_column_would_hold_every_operand():
    assert sum(n.role == "operand" for n in collapsed(wide(), limit=100).nodes) == 27


def test_a_small_neighbourhood_is_unchanged_and_a_wide_one_draws():
    small = wide(n=4, in_place=1)
    assert collapsed(small) == small
    png = neighbourhood_figure(wide())
    assert png[:8] == b"\x89PNG\r\n\x1a\n"


def test_nondeterminism_is_given_as_diff_first():
    assert nondet_size({"max_elements": 3, "max_abs": 6.99e-06, "max_ulp": 3428800}) == \
        "3 el., |diff| <= 6.99e-06 (3428800 ULP)"
    assert nondet_size({"max_elements": 1, "max_abs": None, "max_ulp": 2}) == "1 el., <= 2 ULP"
    assert nondet_size({"max_elements": 1, "max_abs": None, "max_ulp": None}) == "1 el."
