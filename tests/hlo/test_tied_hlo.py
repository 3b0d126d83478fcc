"""xla_harness.hlo.tied on hand-written HLO: where a W-shaped scatter's in-place buffer comes from."""

from pathlib import Path

import pytest

from xla_harness import jaxcompat
from xla_harness.hlo.parser import parse_module
from xla_harness.hlo.tied import tied_summary

HLO = Path(__file__).parent

# One scatter-add per kind of in-place buffer (dense gradient, fresh zeros, barrier output); W f32[64,32].
SOURCES = (Path(__file__).parents[1] / "data" / "tied_sources.hlo").read_text()


def test_in_place_sources_are_told_apart():
    summary = tied_summary(parse_module(SOURCES), (64, 32))
    by_site = {(s.fusion or s.scatter): s.in_place_source for s in summary.scatters}
    assert by_site == {"onto_dense": "dense", "onto_zeros": "broadcast", "onto_barrier": "barrier"}
    assert summary.scatter_onto_dense == 1 and summary.scatter_via_transpose == 0
    assert summary.gathers == 1 and summary.dots == 2  # the two W-shaped gradient dots ...
    assert summary.dots_reading == 0  # ... neither reads W
    # The dims match in either order; other shapes are not W.
    assert tied_summary(parse_module(SOURCES), (32, 64)).gathers == 1
    assert not tied_summary(parse_module(SOURCES), (64, 16)).scatters


def test_fixture_is_accepted_by_xlas_parser():
    xla_hlo = jaxcompat.xla_hlo()  # jaxlib's C++ HLO parser
    if xla_hlo is None:
        pytest.skip("not checked: this jaxlib exposes no HLO text parser")

    xla_hlo.hlo_module_from_text(SOURCES)


@pytest.mark.parametrize("fixture, via_transpose, source", [
    ("transpose_moves_data", True, "parameter"),  # the reported TPU fusion: scatter(transpose(W))
    ("operand_is_parameter", False, "parameter"),
])
def test_scatter_through_transpose_of_w(fixture, via_transpose, source):
    module = parse_module((HLO / f"{fixture}.hlo").read_text())
    shape = next(i.shape.dims for c in module.computations for i in c.instructions if i.opcode == "scatter")
    summary = tied_summary(module, shape)
    (site,) = summary.scatters
    assert site.via_transpose is via_transpose and site.in_place_source == source
    assert summary.scatter_via_transpose == int(via_transpose)
    if fixture == "transpose_moves_data":  # W also feeds the logits dot
        assert summary.dots_reading == 1
