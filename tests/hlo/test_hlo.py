"""HLO parser, alias model and scanner: fixtures, layout oracle, real compiler output, bad input."""

import itertools
import json
import os
import random
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from xla_harness import jaxcompat
from xla_harness.cli import main
from xla_harness.errors import HarnessError
from xla_harness.hlo import alias, bitcast, buffers
from xla_harness.hlo.parser import HloParseError, parse_file, parse_module
from xla_harness.hlo.scan import detect_backend, format_findings, module_json, scan, scan_module
from xla_harness.hlo.shapes import Shape, parse_shape

HLO = Path(__file__).resolve().parent
# tests/hlo/*.hlo are also the C++ tests of the XLA patch; tests/hlo/scanner/*.hlo are the scanner's own.
FIXTURE_PATHS = {p.stem: p for p in sorted(HLO.rglob("*.hlo"))}
FIXTURES = sorted(FIXTURE_PATHS)

# What each fixture must show, stated by hand (independent of the generated JSON):
# [(class, path)] per in-place fusion output, in scan order.
INTENDED = {
    "operand_is_parameter": [("aliased", [])],
    "bitcast_chain": [("aliased", ["bitcast", "bitcast"])],
    "transpose_moves_data": [("hazard", ["transpose"])],
    "transpose_layout_preserving": [("layout-preserving-miss", ["transpose"])],
    "reshape_moves_data": [("hazard", ["reshape"])],
    "reshape_layout_preserving": [("layout-preserving-miss", ["reshape"])],
    "transpose_bitcast_reshape": [("hazard", ["transpose", "bitcast", "reshape"])],
    "multi_output_scatter_index1": [("aliased", [])],
    "dynamic_update_slice": [("aliased", ["bitcast"])],
    "nested_fusion": [("aliased", []), ("aliased", ["fusion"])],
    "output_to_operand_aliasing": [("aliased", [])],
    "untyped_operands": [("layout-preserving-miss", ["transpose"])],
    "tpu_tiled_layouts": [("hazard", ["transpose"])],
    "nested_annotation_through_bitcast": [("aliased", [])],  # the inner fusion's own annotation only
    "reverse_producer_fused": [],
    "tuple_element_source": [("hazard", ["transpose"])],
}

# Fixtures with a scatter fused with a data-moving producer of its in-place operand:
# (scatter, producer) stated by hand; every other fixture has none.
INTENDED_DECISIONS = {
    "transpose_moves_data": [("scatter", "t (transpose)")],
    "reshape_moves_data": [("scatter", "r (reshape)")],
    "transpose_bitcast_reshape": [("scatter", "t (transpose)")],
    "tpu_tiled_layouts": [("scatter", "t (transpose)")],
    "reverse_producer_fused": [("scatter", "rev (reverse)")],
    "tuple_element_source": [("scatter", "t (transpose)")],
}


def test_every_fixture_is_listed():
    assert set(FIXTURES) == set(INTENDED)


def _xla_reads_tuple_element_operands(xla_hlo) -> bool:
    """Does XLA's parser read a ``name#k`` operand (element k of a tuple)? jaxlib >= 0.11's does."""
    probe = ("HloModule m\n\nENTRY e {\n  p = (f32[2]{0}, f32[2]{0}) parameter(0)\n"
             "  ROOT a = f32[2]{0} add(p#0, p#1)\n}\n")
    try:
        xla_hlo.hlo_module_from_text(probe)
    except Exception:  # noqa: BLE001 - any rejection
        return False
    return True


@pytest.mark.parametrize("name", FIXTURES)
def test_fixture_is_valid_hlo_for_xla(name):
    xla_hlo = jaxcompat.xla_hlo()  # jaxlib's C++ HLO parser
    if xla_hlo is None:
        pytest.skip("not checked: this jaxlib exposes no HLO text parser")
    text = FIXTURE_PATHS[name].read_text()
    if re.search(r"[\w.%-]#\d", text) and not _xla_reads_tuple_element_operands(xla_hlo):
        pytest.skip("not checked: this jaxlib's HLO parser does not read name#k tuple-element operands "
                    "(jaxlib >= 0.11 does)")

    xla_hlo.hlo_module_from_text(text)


@pytest.mark.parametrize("name", FIXTURES)
def test_fixture_findings(name):
    mod = parse_file(FIXTURE_PATHS[name])
    findings, decisions, backend = scan(mod)
    assert [(f.cls, f.path) for f in findings] == INTENDED[name]
    assert [(d.scatter, d.producer) for d in decisions] == INTENDED_DECISIONS.get(name, [])
    expected = json.loads(FIXTURE_PATHS[name].with_suffix(".expected.json").read_text())
    assert module_json(mod, findings, decisions, backend) == expected


@pytest.mark.parametrize("name", FIXTURES)
def test_policies_are_nested(name):
    """stock finds a subset of layout-aware, which finds a subset of proposed."""
    mod = parse_file(FIXTURE_PATHS[name])
    analysis = alias.analyze(mod)
    for comp in mod.computations:
        for ins in comp.instructions:
            if ins.opcode != "fusion":
                continue
            got = {p: set(alias.fusion_in_place_pairs(analysis, ins, p)) for p in alias.POLICIES}
            assert got["stock"] <= got["layout-aware"] <= got["proposed"]


def test_backend_rules():
    """gpu treats every reshape as a no-op (stock GPU pairs a data-moving reshape path); cpu only
    bitcasts; tpu and unknown are reported under both, the more severe class shown."""
    mod = parse_file(HLO / "reshape_moves_data.hlo")
    by_backend = {b: scan(mod, b)[0] for b in ("cpu", "gpu", "tpu")}
    assert [(f.cls, f.classes) for f in by_backend["cpu"]] == [("hazard", {"cpu": "hazard"})]
    assert [(f.cls, f.stock, f.classes) for f in by_backend["gpu"]] == [("aliased", True, {"gpu": "aliased"})]
    assert [(f.cls, f.classes) for f in by_backend["tpu"]] == [("hazard", {"cpu": "hazard", "gpu": "aliased"})]
    # the fusion that should not exist is reported whatever the alias rule
    assert all(len(scan(mod, b)[1]) == 1 for b in ("cpu", "gpu", "tpu"))
    transpose = parse_file(HLO / "transpose_moves_data.hlo")
    assert [f.cls for f in scan(transpose, "gpu")[0]] == ["hazard"]  # gpu does not skip transposes


def test_detect_backend():
    mod = parse_file(HLO / "operand_is_parameter.hlo")
    assert detect_backend(mod, "module_0001.jit_f.cpu_after_optimizations.txt") == "cpu"
    assert detect_backend(mod, "module_0001.jit_f.sm_9.0_gpu_after_optimizations.txt") == "gpu"
    assert detect_backend(mod, "module_0001.jit_f.tpu_after_optimizations.txt") == "tpu"
    assert detect_backend(mod, "x.hlo") == "unknown"
    assert detect_backend(parse_file(HLO / "tpu_tiled_layouts.hlo"), "x.hlo") == "tpu"
    gpu = parse_module(MODULE_HEAD + """ENTRY e {
  a = f32[4,4]{1,0} parameter(0)
  ROOT g = f32[4,4]{1,0} custom-call(a, a), custom_call_target="__cublas$gemm"
}
""")
    assert detect_backend(gpu, "x.hlo") == "gpu"


MODULE_HEAD = "HloModule m\n\n"

IN_PLACE_OPS = MODULE_HEAD + """ENTRY e {
  p = f32[8]{0} parameter(0)
  q = f32[8]{0} parameter(1)
  z = s32[] constant(0)
  cp = f32[8]{0} collective-permute(p, q, z, z), source_target_pairs={{0,1}}, slice_sizes={{8}}
  sds = f32[<=8]{0} set-dimension-size(p, z), dimensions={0}
  s = ((f32[8]{0}), f32[8]{0}, u32[]) custom-call-start(p), custom_call_target="foo",
      output_to_operand_aliasing={{1}: (0, {})}
  d = f32[8]{0} custom-call-done(s)
  ROOT t = (f32[8]{0}, f32[<=8]{0}, f32[8]{0}) tuple(cp, sds, d)
}
"""


def test_in_place_ops_as_upstream():
    """The module is valid HLO for XLA; each op's pairs as upstream's GetInPlaceInputOutputPairs."""
    xla_hlo = jaxcompat.xla_hlo()  # jaxlib's C++ HLO parser
    if xla_hlo is None:
        pytest.skip("not checked: this jaxlib exposes no HLO text parser")

    xla_hlo.hlo_module_from_text(IN_PLACE_OPS)
    comp = parse_module(IN_PLACE_OPS).entry
    pairs = {n: alias.op_in_place_pairs(comp.by_name[n], comp) for n in ("cp", "sds", "s", "d")}
    assert pairs["cp"] == [(1, (), ())]  # the in-place collective-permute writes operand 1
    assert pairs["sds"] == [(0, (), ())]
    assert pairs["s"] == [(0, (), (1,))]  # async-start: annotated, output index inside {1}
    assert pairs["d"] == [(0, (0, 0), ())]  # async-done: the start's annotation, through the chain
    ragged = alias.op_in_place_pairs(parse_module(MODULE_HEAD + """ENTRY e {
  a = f32[8]{0} parameter(0)
  b = f32[8]{0} parameter(1)
  o = s32[2]{0} parameter(2)
  ROOT r = f32[8]{0} ragged-all-to-all(a, b, o, o, o, o), replica_groups={{0,1}}
}
""").entry.root)
    assert ragged == [(1, (), ())]


def test_in_place_opcodes_are_every_op_with_pairs():
    """The scan skips fusions without an op of IN_PLACE_OPCODES (and no annotation): no other
    opcode may have in-place pairs, even annotated and with operands to spare."""
    from xla_harness.hlo import inference, instructions, ir, validate

    known = (set(instructions.NO_CALL_OPCODES) | set(inference.SAME_SHAPE_OPCODES) | set(validate.OPERAND_COUNTS)
             | set(instructions.NATIVE_ASYNC) | alias.IN_PLACE_OPCODES
             | {"call", "map", "reduce", "reduce-window", "scatter", "select-and-scatter", "sort", "while",
                "conditional", "all-reduce", "all-gather", "all-to-all", "reduce-scatter", "collective-broadcast",
                "infeed", "outfeed", "rng-bit-generator", "topk", "partition-id", "replica-id", "after-all"})
    known.discard("fusion")
    head = MODULE_HEAD + "ENTRY e {\n  a = f32[8]{0} parameter(0)\n"
    comp = parse_module(head + "  ROOT t = (f32[8]{0}, f32[8]{0}) tuple(a, a)\n}\n").entry
    with_pairs = set()
    for opcode in sorted(known):
        ins = ir.Instruction("x", Shape("tuple", tuple_shapes=(Shape("f32", (8,)),) * 2), opcode,
                             ["a", "a", "a", "a", "a", "a"], ", output_to_operand_aliasing={{1}: (1, {})}")
        if alias.op_in_place_pairs(ins, comp):
            with_pairs.add(opcode)
    assert with_pairs <= alias.IN_PLACE_OPCODES, with_pairs - alias.IN_PLACE_OPCODES
    assert {"scatter", "dynamic-update-slice", "custom-call", "async-start"} <= with_pairs  # the check sees pairs


def test_multi_output_pair_and_hazard_context():
    mod = parse_file(HLO / "multi_output_scatter_index1.hlo")
    fusion = mod.entry.root
    assert alias.fusion_in_place_pairs(alias.analyze(mod), fusion, "stock") == [alias.InPlacePair(1, (), (1,), ())]
    (f,) = scan_module(parse_file(HLO / "transpose_moves_data.hlo"))
    assert f.source == "w" and f.feeds_dense and f.other_users == ["logits (dot)"]
    # state#1 feeds the hazard, state#0 the dot: another element, not the tied pattern
    (f,) = scan_module(parse_file(HLO / "scanner" / "tuple_element_source.hlo"))
    assert f.source == "state#1" and not f.feeds_dense and f.other_users == []


# ----------------------------------------------------------------------------- layout oracle


def _memory_order(logical: np.ndarray, m2m) -> list:
    """Logical element ids in the order they sit in memory under layout m2m."""
    return np.transpose(logical, tuple(reversed(m2m))).ravel().tolist()


def test_transpose_bitcast_matches_brute_force():
    """Exact, dims of size 1 included: a transpose that only moves those is a bitcast."""
    rng = random.Random(0)
    checked = degenerate_moves = 0
    for _ in range(400):
        rank = rng.randint(1, 4)
        dims = tuple(rng.choice([1, 2, 3, 4]) for _ in range(rank))
        perm = tuple(rng.sample(range(rank), rank))
        m_in = tuple(rng.sample(range(rank), rank))
        m_out = tuple(rng.sample(range(rank), rank))
        arr = np.arange(int(np.prod(dims))).reshape(dims)
        res = np.transpose(arr, perm)  # HLO transpose: result dim i is operand dim perm[i]
        truth = _memory_order(arr, m_in) == _memory_order(res, m_out)
        got = bitcast.transpose_is_bitcast(Shape("f32", dims, m_in), Shape("f32", res.shape, m_out), perm)
        assert got == truth, (dims, perm, m_in, m_out)
        checked += got
        degenerate_moves += got and 1 in dims and list(m_in) != [perm[d] for d in m_out]
    assert checked > 10  # the sample contains real bitcasts, not only data moves
    assert degenerate_moves > 0  # ... and bitcasts that only move size-1 dims


def test_reshape_bitcast_matches_brute_force():
    rng = random.Random(1)
    seen = set()
    for _ in range(300):
        n = rng.choice([6, 8, 12, 24])
        def factor(n):
            out = []
            while n > 1:
                d = rng.choice([d for d in range(1, n + 1) if n % d == 0 and d > 1])
                out.append(d)
                n //= d
            if rng.random() < 0.3:
                out.insert(rng.randint(0, len(out)), 1)
            return tuple(out) or (1,)
        din, dout = factor(n), factor(n)
        m_in = tuple(rng.sample(range(len(din)), len(din)))
        m_out = tuple(rng.sample(range(len(dout)), len(dout)))
        arr = np.arange(n).reshape(din)
        truth = _memory_order(arr, m_in) == _memory_order(arr.reshape(dout), m_out)
        got = bitcast.reshape_is_bitcast(Shape("f32", din, m_in), Shape("f32", dout, m_out))
        assert got == truth, (din, m_in, dout, m_out)
        seen.add(truth)
    assert seen == {True, False}


def test_tiled_layouts_by_their_bytes():
    a = Shape("f32", (8, 128), (1, 0), layout_extra="T(8,128)")
    flat = Shape("f32", (1024,), (0,), layout_extra="T(1024)")
    assert bitcast.reshape_is_bitcast(a, flat)  # one whole tile: the same bytes (hlo/test_bitcast_tiled_layouts.py)
    assert not bitcast.reshape_is_bitcast(Shape("f32", (4, 256), (1, 0), layout_extra="T(8,128)"), flat)
    assert bitcast.reshape_is_bitcast(Shape("f32", (8, 128), (1, 0)), Shape("f32", (1024,), (0,)))
    t_in = Shape("f32", (128, 8), (0, 1), layout_extra="T(8,128)")
    assert bitcast.transpose_is_bitcast(t_in, a, (1, 0))  # same physical dims, same tiles
    # other tiles: the same bytes while rows are one tile wide, not with two tiles a row
    assert bitcast.transpose_is_bitcast(Shape("f32", (128, 8), (0, 1), layout_extra="T(2,128)"), a, (1, 0))
    assert not bitcast.transpose_is_bitcast(Shape("f32", (256, 8), (0, 1), layout_extra="T(2,128)"),
                                          Shape("f32", (8, 256), (1, 0), layout_extra="T(8,128)"), (1, 0))


# ----------------------------------------------------------------------------- parser


def test_parse_shapes():
    s, _ = parse_shape("(f32[2,3]{1,0}, (s32[], pred[4]{0}), bf16[8,128]{1,0:T(8,128)(2,1)S(1)})")
    assert s.is_tuple and [i for i, _ in s.leaves()] == [(0,), (1, 0), (1, 1), (2,)]
    assert s.subshape((2,)).layout_extra == "T(8,128)(2,1)S(1)" and s.subshape((2,)).minor_to_major == (1, 0)
    d, _ = parse_shape("f32[<=4,8]")
    assert d.dims == (4, 8) and d.minor_to_major is None and d.layout_or_default() == (1, 0)


def test_parser_handles_escapes_and_long_lines_and_refuses_unknown_opcodes():
    meta = 'metadata={op_name="jit(f)/x{\\"a\\": [1, 2]}, \\\\ (weird)" source_file="/a b/c.py"}'
    pad = ", ".join(f"%x{i}" for i in range(2000))
    text = f"""HloModule m, input_output_alias={{ {{0}}: (0, {{}}, may-alias) }}

ENTRY %e (p: f32[4]) -> f32[4] {{
  %p = f32[4]{{0}} parameter(0), {meta}
  %u = f32[4]{{0}} negate(f32[4]{{0}} %p), custom_attr={{{{1,2}},{{3}}}}, \
backend_config="{{\\"k\\": \\"{'v' * 50000}\\"}}"
  %c = (f32[4]{{0}}, s32[]) custom-call(%u), custom_call_target="foo", api_version=API_VERSION_TYPED_FFI, \
frontend_attributes={{x="{pad}"}}
  ROOT %g = f32[4]{{0}} get-tuple-element((f32[4]{{0}}, s32[]) %c), index=0
}}
"""
    mod = parse_module(text, "inline.hlo")
    ins = mod.entry.by_name
    assert ins["u"].opcode == "negate" and ins["u"].operands == ["p"]
    assert ins["u"].attrs["custom_attr"] == "{{1,2},{3}}"
    assert len(ins["u"].attrs["backend_config"]) > 50000
    assert ins["c"].operands == ["u"] and ins["g"].attrs["index"] == "0"
    assert mod.input_output_alias.startswith("{ {0}: (0")
    # An opcode XLA does not know is refused, as XLA refuses it ("Unknown opcode"), naming it and its line.
    with pytest.raises(HloParseError, match=r"inline.hlo:5: u: unknown opcode 'my-new-opcode'"):
        parse_module(text.replace("negate(f32[4]", "my-new-opcode(f32[4]"), "inline.hlo")


OUTPUT_SIDE = """HloModule m
add {
  x = f32[] parameter(0)
  y = f32[] parameter(1)
  ROOT s = f32[] add(x, y)
}
fused {
  p0 = f32[4,6]{1,0} parameter(0)
  p1 = s32[2,1]{1,0} parameter(1)
  p2 = f32[2,6]{1,0} parameter(2)
  s = f32[4,6]{1,0} scatter(p0, p1, p2), update_window_dims={1}, inserted_window_dims={0},
      scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=add
  ROOT r = ROOT_SHAPE ROOT_OP(s)ROOT_ATTRS
}
ENTRY e {
  w = f32[4,6]{1,0} parameter(0)
  i = s32[2,1]{1,0} parameter(1)
  u = f32[2,6]{1,0} parameter(2)
  ROOT f = ROOT_SHAPE fusion(w, i, u), kind=kLoop, calls=fused
}
"""


@pytest.mark.parametrize("root, shape, attrs, cls", [
    ("bitcast", "f32[24]{0}", "", "aliased"),
    ("transpose", "f32[6,4]{1,0}", ", dimensions={1,0}", "hazard"),  # moves data on the output side
    ("transpose", "f32[6,4]{0,1}", ", dimensions={1,0}", "layout-preserving-miss"),
])
def test_output_side_no_ops_are_shown(root, shape, attrs, cls):
    text = OUTPUT_SIDE.replace("ROOT_SHAPE", shape).replace("ROOT_OP", root).replace("ROOT_ATTRS", attrs)
    (finding,) = scan_module(parse_module(text), "cpu")
    assert (finding.root_opcode, finding.output_path, finding.path, finding.cls) == ("scatter", [root], [], cls)
    assert f"{root} <- scatter" in format_findings(parse_module(text), [finding], show_aliased=True)


def test_tuple_element_operands_are_traced():
    """Newer XLA prints `%t#1` for element 1 of a tuple value instead of a get-tuple-element."""
    text = (HLO / "multi_output_scatter_index1.hlo").read_text()
    text = text.replace("ROOT %fusion = (f32[8,32]{1,0}, f32[64,32]{1,0}) fusion("
                        "f32[8,32]{1,0} %upd, f32[64,32]{1,0} %w",
                        "%t = (f32[8,32]{1,0}, f32[64,32]{1,0}) tuple(f32[8,32]{1,0} %upd, f32[64,32]{1,0} %w)\n"
                        "  ROOT %fusion = (f32[8,32]{1,0}, f32[64,32]{1,0}) fusion("
                        "f32[8,32]{1,0} %t#0, f32[64,32]{1,0} %t#1")
    fused = "  %p1 = f32[64,32]{1,0} parameter(1)\n"
    text = text.replace(fused, "  %pt = (f32[64,32]{1,0}, f32[1]{0}) parameter(1)\n")
    text = text.replace("scatter(f32[64,32]{1,0} %p1,", "scatter(f32[64,32]{1,0} %pt#0,")
    text = text.replace("(p0: f32[8,32], p1: f32[64,32], p2: s32[8,1])",
                        "(p0: f32[8,32], pt: (f32[64,32], f32[1]), p2: s32[8,1])")
    mod = parse_module(text, "hash")
    pairs = alias.fusion_in_place_pairs(alias.analyze(mod), mod.entry.by_name["fusion"], "stock")
    assert pairs == [alias.InPlacePair(1, (0,), (1,), ())]


def test_parse_real_jax_output(tmp_path):
    def f(w, idx, h):
        return w.T.at[:, idx].add(1.0), h @ w
    args = (jnp.ones((64, 32)), jnp.array([1, 2, 3]), jnp.ones((4, 64)))
    lowered = jax.jit(f).lower(*args)
    findings = []
    for text in (lowered.as_text(dialect="hlo"), lowered.compile().as_text()):
        mod = parse_module(text, "jax")
        assert mod.instruction_count() > 5
        findings.append([(f.cls, f.root_opcode) for f in scan_module(mod)])
    # Unoptimized HLO has no fusions; CPU wraps the scatter in a fusion of its own (no
    # producer fused into it), whose in-place operand is a parameter: aliased, not a hazard.
    assert findings == [[], [("aliased", "scatter")]]


@pytest.mark.slow
def test_cpu_compiled_tied_embedding_is_clean_and_its_scatters_are_aliased():
    from xla_harness.stress.runner import compile_train_step

    from ..helpers import TINY

    text = compile_train_step(dict(mode="full", remat=True, **TINY)).as_text()
    findings = scan_module(parse_module(text, "cpu"))
    assert findings, "the CPU program has in-place scatter fusions"
    assert {f.cls for f in findings} == {"aliased"}
    assert {f.root_opcode for f in findings} == {"scatter"}


# ----------------------------------------------------------------------------- buffers


BA = """BufferAssignment:
allocation 0: size 8192, parameter 0, shape |f32[32,64]| at ShapeIndex {}, maybe-live-out:
 value: <0 w @0> (size=8192,offset=0): f32[32,64]{1,0}
 value: <5 fusion @0> (size=8192,offset=0): f32[64,32]{1,0}
allocation 1: size 1024, parameter 1:
 value: <1 h @0> (size=1024,offset=0): f32[4,32]{1,0}
allocation 2: size 4:
 value: <6 t{0} (phi) @0> (size=4,offset=0): f32[]
allocation 3: size 8192:
 value: <7 t{1} @0> (size=8192,offset=0): f32[32,64]{1,0}
 value: <8 fusion.2> (size=8192,offset=0): f32[64,32]{1,0}
"""


def test_buffer_assignment_sharing():
    ba = buffers.parse_buffer_assignment(BA, "ba.txt")
    res = buffers.compare(ba, "fusion", (), "w")
    assert res.shared and res.output_allocation == 0 and "SHARE" in res.sentence()
    assert not buffers.compare(ba, "fusion", (), "h").shared
    assert buffers.compare(ba, "fusion.2", (), "t#1").shared  # a tuple element written name#k
    assert not buffers.compare(ba, "fusion.2", (), "t#0").shared
    assert buffers.compare(ba, "fusion.2", (), "t#0").source_allocation == 2  # a phi value is read too
    with pytest.raises(HarnessError, match="not a buffer-assignment"):
        buffers.parse_buffer_assignment("hello", "x.txt")


def test_scan_dump_directory_with_buffer_assignment(tmp_path, capsys):
    d = tmp_path / "dump"
    d.mkdir()
    (d / "module_0001.jit_f.cpu_after_optimizations.txt").write_text((HLO / "transpose_moves_data.hlo").read_text())
    (d / "module_0001.jit_f.cpu_after_optimizations-buffer-assignment.txt").write_text(BA)
    assert main(["scan", str(d), "--no-memcheck"]) == 1
    out = capsys.readouterr().out
    assert "hazard" in out and "they SHARE a buffer" in out
    # BA is made up (t{0} of a module whose t is no tuple): its memory plan is not checked, and said so
    assert main(["scan", str(d)]) == 2
    out, err = capsys.readouterr()
    assert "memory plan: not checked (the error line says why)" in out
    assert err.splitlines() == [f"error: memory plan not checked: {d}/module_0001.jit_f.cpu_after_optimizations-"
                                "buffer-assignment.txt:8: t has no index {0} in the module's shape f32[64,32]{1,0}: "
                                "the buffer assignment and the module are not one compile's"]


@pytest.mark.slow
def test_scan_real_xla_dump(tmp_path, capsys):
    import subprocess
    import sys

    d = tmp_path / "dump"
    code = ("import jax, jax.numpy as jnp\n"
            "f = jax.jit(lambda w, i, h: (w.T.at[:, i].add(1.0), h @ w), donate_argnums=0)\n"
            "f(jnp.ones((64, 32)), jnp.array([1, 2, 3]), jnp.ones((4, 64)))\n")
    env = {**os.environ, "XLA_FLAGS": f"--xla_dump_to={d} --xla_dump_hlo_as_text", "JAX_PLATFORMS": "cpu"}
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=300)
    assert main(["scan", str(d), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    mods = {m["module"]: m for m in data["modules"]}
    assert "jit__lambda" in mods
    assert [f["class"] for f in mods["jit__lambda"]["findings"]] == ["aliased"]


# ----------------------------------------------------------------------------- CLI


def test_json_schema_exact(capsys):
    assert main(["scan", str(HLO / "transpose_moves_data.hlo"), "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    (f,) = data["modules"][0]["findings"]
    assert set(f) == {"fusion", "computation", "root_opcode", "output_path", "output_index", "parameter",
                      "parameter_index", "path", "stock", "proposed", "layout_aware", "class", "classes"}
    assert set(data["modules"][0]) == {"module", "backend", "findings", "fusion_decisions"}
    (d,) = data["modules"][0]["fusion_decisions"]
    assert set(d) == {"fusion", "computation", "scatter", "operand", "producer", "parameter", "path", "class"}
    assert main(["scan", str(HLO / "operand_is_parameter.hlo")]) == 0


@pytest.mark.parametrize("content,needle", [
    ("", ":1: empty file"),
    ("hello world\n", ":1: expected 'HloModule <name>' first"),
    ((HLO / "operand_is_parameter.hlo").read_text()[:600], "truncated module"),
    ("HloModule m\n\nENTRY %e {\n  %a = f32[] add(%x, %y)\n}\n", ":4: a uses undefined operand 'x'"),
])
def test_bad_files_one_error_line_each(tmp_path, capsys, content, needle):
    bad = tmp_path / "bad.hlo"
    bad.write_text(content)
    assert main(["scan", str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {bad}") and needle in err[0], err


def test_one_bad_file_among_many(tmp_path, capsys):
    bad = tmp_path / "bad.hlo"
    bad.write_text("not hlo")
    rc = main(["scan", str(bad), str(HLO / "transpose_moves_data.hlo"), str(tmp_path / "missing.hlo")])
    captured = capsys.readouterr()
    assert rc == 2
    assert len(captured.err.strip().splitlines()) == 2
    assert "1 hazard(s)" in captured.out and "2 file(s) could not be read" in captured.out


def test_directory_without_hlo_and_unreadable(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("nothing here")
    assert main(["scan", str(tmp_path)]) == 2
    assert "holds no HLO text" in capsys.readouterr().err
    assert main(["scan"]) == 2
    capsys.readouterr()
    (tmp_path / "file").write_text("HloModule x")
    assert main(["scan", str(tmp_path / "file" / "under-a-file.hlo")]) == 2  # unreadable, root or not
    assert capsys.readouterr().err.count("error:") == 1


@pytest.mark.slow
def test_scan_model_cli(capsys, tmp_path):
    from ..helpers import TINY_ARGS

    rc = main(["scan", "--model", "tied-embedding", "--json", "--save-hlo", str(tmp_path / "m.hlo"),
               *TINY_ARGS])
    assert rc == 0
    data = json.loads(capsys.readouterr().out)
    assert data["modules"][0]["findings"] and (tmp_path / "m.hlo").read_text().startswith("HloModule")


def test_itertools_sanity():
    # policies are an ordered, closed set used in JSON keys
    assert list(itertools.islice(alias.POLICIES, 3)) == ["stock", "proposed", "layout-aware"]
    with pytest.raises(HarnessError):
        mod = parse_file(HLO / "operand_is_parameter.hlo")
        alias.fusion_in_place_pairs(alias.analyze(mod), mod.entry.root, "other")
    with pytest.raises(HloParseError):
        parse_module("HloModule a\nHloModule b\n", "two")
