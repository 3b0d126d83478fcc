"""The HLO reader against XLA's own parser (jaxlib): same verdict, same structure
(computations, instruction order, names, opcodes, shapes with layouts, operands, roots)."""

import os
import stat
import subprocess
import sys

import pytest

from tests.jax_hlo_programs import JAX_PROGRAMS
from xla_harness import jaxcompat
from xla_harness.cli import main
from xla_harness.hlo.parser import HloParseError, parse_file, parse_module
from xla_harness.hlo.scan import scan_module
from xla_harness.hlo.shapes import parse_shape
from xla_harness.hlo.xla_oracle import compare, compare_structures

# XLA's side of the comparison reads the parsed module's instructions and shapes: jaxlib >= 0.12.
needs_xla_instructions = pytest.mark.skipif(
    not jaxcompat.xla_hlo_reads_structure(),
    reason="not checked: this jaxlib's parsed HLO has no instruction shapes (jaxlib >= 0.12 has)")

BASE = """HloModule m

ENTRY e {
  p0 = f32[2,3]{1,0} parameter(0)
  p1 = f32[2,3]{1,0} parameter(1)
  ROOT a = f32[2,3]{1,0} add(%p0, p1)
}
"""

THREADED = """HloModule m

c {
  p = f32[] parameter(0)
  ROOT n = f32[] negate(p)
}, execution_thread="other"

ENTRY e {
  p0 = f32[] parameter(0)
  t = (f32[], f32[]) tuple(%p0, p0)
  ROOT x = f32[] get-tuple-element(t), index=1
} // e
"""

CASES = {
    "mixed_percent_and_bare_operands": BASE,
    "execution_thread_and_trailing_comment": THREADED,
    "two_roots": BASE.replace("  p1 =", "  ROOT p1 ="),
    "undefined_operand": BASE.replace("add(%p0, p1)", "add(%p0, q)"),
    "duplicate_instruction_name": BASE.replace("p1 = f32[2,3]{1,0} parameter(1)",
                                               "p0 = f32[2,3]{1,0} parameter(1)"),
    "duplicate_computation_name": THREADED.replace("ENTRY e {", "c {").replace("} // e", "}"),
    "comments_everywhere": BASE.replace("add(%p0, p1)", "add(/*lhs*/ %p0, // rhs next line\n p1)"),

"wrapped": """HloModule m

add {
  x = f32[] parameter(0)
  y = f32[] parameter(1)
  ROOT s = f32[] add(x, y)
}

fused {
  p0 = f32[4,6]{1,0} parameter(0)
  p1 = s32[2,1]{1,0} parameter(1)
  p2 = f32[2,6]{1,0} parameter(2)
  ROOT s = f32[4,6]{1,0}
      scatter(p0,
              p1, p2),
      update_window_dims={1}, inserted_window_dims={0},
      scatter_dims_to_operand_dims={0}, index_vector_dim=1,
      to_apply=add
}
""",
"buffer": """HloModule m

ENTRY e {
  p = f32[4]{0} parameter(0)
  b = b(f32[4]{0}) custom-call(p), custom_call_target="Pin", output_to_operand_aliasing={{}: (0, {})}
  ROOT u = f32[4]{0} custom-call(b), custom_call_target="Unpin"
}
""",
"multiline_backend_config_and_header": """HloModule m, is_scheduled=true,
  entry_computation_layout={(f32[8]{0})->f32[8]{0}}

ENTRY e {
  p = f32[8]{0} parameter(0)
  ROOT c = f32[8]{0} custom-call(p), custom_call_target="foo",
    backend_config={
      "a": 1,
      "b": "x{"
    }
}
""",
"headerless": """ENTRY e {
  p = (f32[2], (f32[3], s32[])) parameter(0)
  ROOT r = f32[3] negate(p#1#0)
}
""",
"one_line_computation": """HloModule m
ENTRY e { p = f32[] parameter(0) ROOT n = f32[] negate(p) }
""",
"async_sugar": """HloModule m

ENTRY e {
  p = f32[4]{0} parameter(0)
  s = ((f32[4]{0}), f32[4]{0}, u32[]) custom-call-start(p), custom_call_target="foo",
      async_execution_thread="main"
  ROOT d = f32[4]{0} custom-call-done(s)
}
""",
"shape_less_tuple": """HloModule m
ENTRY e {
  p = f32[2] parameter(0)
  q = s32[] parameter(1)
  ROOT t = tuple(p, q)
}
""",
"self_cycle": BASE.replace("add(%p0, p1)", "add(%a, p1)"),
"forward_computation": """HloModule m
ENTRY e {
  p = f32[] parameter(0)
  ROOT r = f32[] call(p), to_apply=c
}
c {
  x = f32[] parameter(0)
  ROOT n = f32[] negate(x)
}
""",
"scatter_operand_count": """HloModule m
add {
  x = f32[] parameter(0)
  y = f32[] parameter(1)
  ROOT s = f32[] add(x, y)
}
ENTRY e {
  p0 = f32[4,6]{1,0} parameter(0)
  p1 = s32[2,1]{1,0} parameter(1)
  ROOT s = f32[4,6]{1,0} scatter(p0, p1), update_window_dims={1}, inserted_window_dims={0},
    scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=add
}
""",
"malformed_aliasing": """HloModule m
ENTRY e {
  p = f32[4]{0} parameter(0)
  ROOT c = f32[4]{0} custom-call(p), custom_call_target="foo", output_to_operand_aliasing={{}: 0}
}
""",
"gte_index_out_of_range": """HloModule m
ENTRY e {
  p = (f32[2], f32[3]) parameter(0)
  ROOT r = f32[3] negate(p#2)
}
""",
"inline_computations": """HloModule m
ENTRY e {
  w = f32[4,6]{1,0} parameter(0)
  i = s32[2,1]{1,0} parameter(1)
  u = f32[2,4]{1,0} parameter(2)
  ROOT f = f32[6,4]{1,0} fusion(w, i, u), kind=kLoop, calls=
  {
    p0 = f32[4,6]{1,0} parameter(0)
    p1 = s32[2,1]{1,0} parameter(1)
    p2 = f32[2,4]{1,0} parameter(2)
    t = f32[6,4]{1,0} transpose(p0), dimensions={1,0}
    ROOT s = f32[6,4]{1,0} scatter(t, p1, p2), update_window_dims={1}, inserted_window_dims={0},
      scatter_dims_to_operand_dims={0}, index_vector_dim=1,
      to_apply={ x = f32[] parameter(0) y = f32[] parameter(1) ROOT a = f32[] add(x, y) }
  }
}
""",
"called_computations_wrapped_and_select_scatter": """HloModule m
ge {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT c = pred[] compare(a, b), direction=GE
}
add {
  x = f32[] parameter(0)
  y = f32[] parameter(1)
  ROOT s = f32[] add(x, y)
}
cond {
  p = (s32[], f32[4]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  n = s32[] constant(3)
  ROOT lt = pred[] compare(i, n), direction=LT
}
body {
  p = (s32[], f32[4]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  v = f32[4] get-tuple-element(p), index=1
  src = f32[2] slice(v), slice={[0:2]}
  z = f32[] constant(0)
  w = f32[4] select-and-scatter(v, src, z), window={size=2 stride=2}, select=ge, scatter=add
  ROOT t = (s32[], f32[4]) tuple(i, w)
}
ENTRY e {
  p0 = (s32[], f32[4]) parameter(0)
  ROOT w = (s32[], f32[4]) while(p0), condition=
    cond, body=body
}
""",
"shape_less_transpose_pad_concatenate_imag": """HloModule m:
ENTRY e {
  p = f32[3,4] parameter(0)
  q = f32 [3,4]{0,1} parameter(1)
  c = c64[3,4] parameter(2)
  t = transpose(p), dimensions={1,0}
  u = transpose(q), dimensions={1,0}
  d = pad(p, f32[] constant(0)), padding=1_2x0_1_3
  k = concatenate(p, q), dimensions={1}
  i = imag(c)
  ROOT r = tuple(t, u, d, k, i)
}
""",
"literals_with_parens": """HloModule m
ENTRY e {
  c = c64[2] constant({(1, 2), (3, 4)})
  n = f32[2] constant({nan(0x1), 1})
  ROOT r = tuple(c, n)
}
""",
"parens_in_a_real_literal": """HloModule m
ENTRY e {
  ROOT c = f32[] constant(((0)))
}
""",
"dimension_beyond_64_bits": """HloModule m
ENTRY e {
  ROOT p = f32[99999999999999999999999999] parameter(0)
}
""",
"shape_less_dot_and_reduce": """HloModule m
add {
  x = f32[] parameter(0)
  y = f32[] parameter(1)
  ROOT s = f32[] add(x, y)
}
ENTRY e {
  a = f32[5,2,3] parameter(0)
  b = bf16[5,3,4] parameter(1)
  d = dot(a, b), lhs_batch_dims={0}, lhs_contracting_dims={2}, rhs_batch_dims={0}, rhs_contracting_dims={1}
  z = f32[] constant(0)
  r = reduce(d, z), dimensions={0,2}, to_apply=add
  ROOT t = tuple(d, r)
}
""",
"send_recv_shapes_built_by_xla": """HloModule m
ENTRY e {
  d = f32[8,2]{1,0} parameter(0)
  tok = token[] after-all()
  r = (f32[8,2]{0,1}, u32[], token[]) recv(tok), channel_id=2
  s = (f32[8,2]{0,1}, u32[], token[]) send(d, tok), channel_id=1
  rd = (f32[8,2]{1,0}, token[]) recv-done(r), channel_id=2
  sd = token[] send-done(s), channel_id=1
  ROOT t = tuple(s, rd, sd)
}
""",
# Typed operand lists the one-line reader does not take by string splits: a shape not printed
# before (no layout), a tuple element, no space after a comma; then an undefined typed operand.
"typed_operands_off_the_printed_form": """HloModule m
ENTRY e {
  p0 = f32[2,3]{1,0} parameter(0)
  t = (f32[2,3]{1,0}, f32[2,3]{1,0}) tuple(f32[2,3]{1,0} %p0, f32[2,3]{1,0} %p0)
  a = f32[2,3]{1,0} add(f32[2,3] %p0, f32[2,3]{1,0} %t#1)
  ROOT b = f32[2,3]{1,0} add(f32[2,3]{1,0} %a,f32[2,3]{1,0} %p0)
}
""",
"shape_less_sort_and_conditional": """HloModule m
lt {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  c = s32[] parameter(2)
  d = s32[] parameter(3)
  ROOT r = pred[] compare(a, b), direction=LT
}
lt1 {
  a = s32[] parameter(0)
  b = s32[] parameter(1)
  ROOT r = pred[] compare(a, b), direction=LT
}
neg {
  p = f32[4]{0} parameter(0)
  ROOT n = f32[4]{0} negate(p)
}
id {
  p = f32[4]{0} parameter(0)
  ROOT c = f32[4]{0} copy(p)
}
ENTRY e {
  x = f32[4]{0} parameter(0)
  i = s32[4]{0} parameter(1)
  s = sort(x, i), dimensions={0}, to_apply=lt
  b = s32[] parameter(2)
  one = sort(i), dimensions={0}, to_apply=lt1
  c = conditional(b, x, x), branch_computations={neg, id}
  t = pred[] parameter(3)
  d = conditional(t, x, x), false_computation=id, true_computation=neg
  ROOT r = tuple(s, one, c, d)
}
""",
"typed_operand_undefined": """HloModule m
ENTRY e {
  p0 = f32[2,3]{1,0} parameter(0)
  ROOT a = f32[2,3]{1,0} add(f32[2,3]{1,0} %p0, f32[2,3]{1,0} %q)
}
""",
"sugar_of_an_op_with_async_forms_of_its_own": """HloModule m, is_scheduled=true

ENTRY e {
  p = f32[4]{0} parameter(0)
  s = (f32[4]{0}, f32[8]{0}) all-gather-start(p), replica_groups={{0,1}}, dimensions={0}
  u = (f32[4]{0}, f32[8]{0}) all-gather-update(s)
  ROOT d = f32[8]{0} all-gather-done(u)
}
""",
"send_start_sugar": """HloModule m

ENTRY e {
  p = f32[4]{0} parameter(0)
  s = ((f32[4]{0}), f32[4]{0}, u32[]) send-start(p)
  ROOT d = f32[4]{0} send-done(s)
}
""",
}

# What each case must show, stated by hand: does XLA (and so must ours) accept it?
ACCEPTED = {
    "mixed_percent_and_bare_operands": True, "execution_thread_and_trailing_comment": True,
    "two_roots": False, "undefined_operand": False, "duplicate_instruction_name": False,
    "duplicate_computation_name": False, "comments_everywhere": True, "wrapped": True, "buffer": True,
    "multiline_backend_config_and_header": True, "headerless": True, "one_line_computation": True,
    "async_sugar": True, "shape_less_tuple": True, "self_cycle": False, "forward_computation": False,
    "scatter_operand_count": False, "malformed_aliasing": False, "gte_index_out_of_range": False,
    "inline_computations": True, "send_recv_shapes_built_by_xla": True,
    "called_computations_wrapped_and_select_scatter": True, "literals_with_parens": True,
    "parens_in_a_real_literal": False, "dimension_beyond_64_bits": False,
    "shape_less_transpose_pad_concatenate_imag": True, "shape_less_dot_and_reduce": True,
    "typed_operands_off_the_printed_form": True, "typed_operand_undefined": False,
    "shape_less_sort_and_conditional": True, "sugar_of_an_op_with_async_forms_of_its_own": False,
    "send_start_sugar": False,
}


def test_every_case_is_listed():
    assert set(CASES) == set(ACCEPTED)


@needs_xla_instructions
@pytest.mark.parametrize("name", sorted(CASES))
def test_same_verdict_and_structure_as_xla(name):
    verdict = compare(CASES[name])
    assert verdict.xla_accepts == ACCEPTED[name], verdict.xla_error
    assert verdict.category == "agree", (verdict.mismatch, verdict.ours_error)
    if verdict.xla_accepts:  # XLA's own reprint reads the same
        again = compare(verdict.reprint)
        assert again.category == "agree", (again.mismatch, again.ours_error)


def _base_root(module):
    return module.entry.instructions[-1]


# One change to our reading of BASE -> the difference compare_structures must name. Each goes
# through the per-computation comparison (XLA's rows, root and the matched names passed to it).
CHANGED = {
    "opcode": (lambda m: setattr(_base_root(m), "opcode", "subtract"), "a: opcode ours subtract, XLA add"),
    "shape": (lambda m: setattr(_base_root(m), "shape", parse_shape("f32[2,3]{0,1}")[0]),
              "a: shape ours f32[2,3]{0,1}, XLA f32[2,3]{1,0}"),
    "operands": (lambda m: setattr(_base_root(m), "operands", ["p1", "p0"]),
                 "a: operands ours ['p1', 'p0'], XLA ['p0', 'p1']"),
    "instruction-count": (lambda m: m.entry.instructions.pop(1), "2 instructions, XLA 3"),
    "computation-name": (lambda m: setattr(m.entry, "name", "other"), "ours has computation other that XLA does not"),
}


@needs_xla_instructions
@pytest.mark.parametrize("change", sorted(CHANGED))
def test_a_changed_reading_is_reported_as_a_mismatch(change):
    """The oracle is not vacuous: XLA's module of BASE against ours with one thing changed."""
    xla_module = jaxcompat.xla_hlo().hlo_module_from_text(BASE)
    reprint = xla_module.to_string()
    ours = parse_module(BASE)
    assert compare_structures(ours, xla_module, reprint) == ""
    mutate, expected = CHANGED[change]
    mutate(ours)
    assert expected in compare_structures(ours, xla_module, reprint)


def test_inline_computations_are_read_and_scanned():
    mod = parse_module(CASES["inline_computations"])
    assert [c.name for c in mod.computations] == ["_", "_.1", "e"]  # as XLA names and orders them
    assert mod.entry.by_name["f"].called == ["_.1"]
    (finding,) = scan_module(mod, "cpu")  # the scatter through transpose(w) is not missed
    assert (finding.fusion, finding.parameter, finding.cls) == ("f", 0, "hazard")


def test_send_recv_shapes_follow_their_operands():
    entry = parse_module(CASES["send_recv_shapes_built_by_xla"]).entry
    assert str(entry.by_name["s"].shape) == "(f32[8,2]{1,0}, u32[], token[])"  # the operand's layout
    assert str(entry.by_name["rd"].shape) == "(f32[8,2]{0,1}, token[])"  # the recv's element 0


def test_rejections_name_the_line():
    for name, needle in (("self_cycle", ":6: a uses undefined operand 'a' (itself: a cycle)"),
                         ("two_roots", ":6: computation e has a second ROOT"),
                         ("malformed_aliasing", ":4: c: malformed output_to_operand_aliasing"),
                         ("scatter_operand_count", ":10: s: scatter takes 2N+1 operands")):
        with pytest.raises(HloParseError) as info:
            parse_module(CASES[name], "f.hlo")
        assert needle in str(info.value), str(info.value)


def test_async_sugar_and_nested_tuple_refs():
    mod = parse_module(CASES["async_sugar"])
    start, done = mod.entry.by_name["s"], mod.entry.by_name["d"]
    assert (start.opcode, start.async_wrapped, done.opcode) == ("async-start", "custom-call", "async-done")
    head = parse_module(CASES["headerless"])
    assert head.name == "module_e" and head.entry.operand("p#1#0")[1] == (1, 0)


# ----------------------------------------------------------------------------- no recursion, no hang


def test_deep_tuple_shape_and_deep_nested_fusions():
    depth = 3000
    shape, _ = parse_shape("(" * depth + "f32[2]" + ")" * depth)
    assert len(shape.leaves()) == 1 and shape.leaves()[0][0] == (0,) * depth
    # a chain of fusions each calling the previous one, 2000 deep, the innermost a scatter
    parts = ["HloModule deep\n", "add {\n  x = f32[] parameter(0)\n  y = f32[] parameter(1)\n"
             "  ROOT s = f32[] add(x, y)\n}\n",
             "f0 {\n  p = f32[8]{0} parameter(0)\n  i = s32[2,1]{1,0} parameter(1)\n  u = f32[2]{0} parameter(2)\n"
             "  ROOT s = f32[8]{0} scatter(p, i, u), update_window_dims={}, inserted_window_dims={0}, "
             "scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=add\n}\n"]
    n = 2000
    for k in range(1, n):
        parts.append(f"f{k} {{\n  p = f32[8]{{0}} parameter(0)\n  i = s32[2,1]{{1,0}} parameter(1)\n"
                     f"  u = f32[2]{{0}} parameter(2)\n  ROOT f = f32[8]{{0}} fusion(p, i, u), kind=kLoop, "
                     f"calls=f{k - 1}\n}}\n")
    parts.append(f"ENTRY e {{\n  p = f32[8]{{0}} parameter(0)\n  i = s32[2,1]{{1,0}} parameter(1)\n"
                 f"  u = f32[2]{{0}} parameter(2)\n  ROOT f = f32[8]{{0}} fusion(p, i, u), kind=kLoop, "
                 f"calls=f{n - 1}\n}}\n")
    mod = parse_module("".join(parts))
    findings = scan_module(mod)
    outer = [f for f in findings if f.computation == "e"]
    assert [(f.cls, f.path) for f in outer] == [("aliased", [])]  # the nested fusion is the output source
    assert len(findings) == n


def test_long_bitcast_chain():
    n = 20000
    body = ["p = f32[8]{0} parameter(0)", "b0 = f32[8]{0} bitcast(p)"]
    body += [f"b{k} = f32[8]{{0}} bitcast(b{k - 1})" for k in range(1, n)]
    body.append(f"ROOT n = f32[8]{{0}} negate(b{n - 1})")
    mod = parse_module("HloModule m\nENTRY e {\n" + "\n".join(body) + "\n}\n")
    assert mod.instruction_count() == n + 2


# ----------------------------------------------------------------------------- files


def test_scan_isolates_fifo_non_utf8_and_directory_files(tmp_path, capsys):
    good = tmp_path / "good.hlo"
    good.write_text(BASE)
    latin = tmp_path / "latin.hlo"
    latin.write_bytes(BASE.replace("ENTRY e", "ENTRY \xe9").encode("latin-1"))
    fifo = tmp_path / "pipe.hlo"
    os.mkfifo(fifo)
    assert stat.S_ISFIFO(fifo.stat().st_mode)
    rc = main(["scan", str(latin), str(fifo), str(good)])  # must not block on the FIFO
    err = capsys.readouterr()
    lines = err.err.strip().splitlines()
    assert rc == 2 and len(lines) == 2, lines
    assert lines[0].startswith(f"error: {latin}:3: not UTF-8 text")
    assert lines[1].startswith(f"error: {fifo}:1: cannot read: not a regular file")
    assert "scanned 1 module(s)" in err.out
    with pytest.raises(HloParseError, match="a directory"):
        parse_file(tmp_path)


# ----------------------------------------------------------------------------- property-based


def _module_strategy():
    st = pytest.importorskip("hypothesis.strategies")

    @st.composite
    def modules(draw):
        """Random straight-line modules in the forms XLA prints and accepts: operands with or
        without shapes and '%', tuples read back with name#k, wrapped lines, comments."""
        dims = draw(st.lists(st.integers(1, 4), min_size=1, max_size=3))
        shape = "f32[" + ",".join(map(str, dims)) + "]"
        layout = "{" + ",".join(map(str, reversed(range(len(dims))))) + "}"
        full = shape + (layout if draw(st.booleans()) else "")
        names = ["p0", "p1"]
        lines = [f"p0 = {full} parameter(0)", f"p1 = {full} parameter(1)"]
        tuples = []
        for k in range(draw(st.integers(1, 12))):
            kind = draw(st.sampled_from(["add", "negate", "bitcast", "tuple", "gte", "copy"]))
            name = f"i{k}.{draw(st.integers(0, 3))}"
            pick = lambda: draw(st.sampled_from(names))  # noqa: E731
            pct = "%" if draw(st.booleans()) else ""
            typed = (full + " ") if draw(st.booleans()) else ""
            sep = ",\n      " if draw(st.booleans()) else ", "
            if kind == "add":
                lines.append(f"{name} = {full} add({typed}{pct}{pick()}{sep}{pct}{pick()})")
            elif kind in ("negate", "bitcast", "copy"):
                lines.append(f"{name} = {full} {kind}(/* x */ {typed}{pct}{pick()})")
            elif kind == "tuple":
                lines.append(f"{name} = ({full}, {full}) tuple({pick()}, {pick()})")
                tuples.append(name)
                continue
            elif tuples:
                t = draw(st.sampled_from(tuples))
                lines.append(f"{name} = {full} negate({t}#{draw(st.integers(0, 1))})")
            else:
                continue
            names.append(name)
        lines.append(f"ROOT r = {full} negate({names[-1]})")
        indent = draw(st.sampled_from(["  ", "\t", "    "]))
        header = draw(st.sampled_from(["HloModule m\n\n", "HloModule m, is_scheduled=false\n", ""]))
        return header + "ENTRY e {\n" + "".join(indent + ln + "\n" for ln in lines) + "}\n"

    return modules()


def _agrees_with_xla_on(strategy, examples: int) -> None:
    """Every generated module: XLA accepts it, ours reads the same, and XLA's reprint too."""
    hypothesis = pytest.importorskip("hypothesis")

    @hypothesis.settings(max_examples=examples, deadline=None, derandomize=True)
    @hypothesis.given(strategy)
    def check(text):
        verdict = compare(text)
        assert verdict.xla_accepts, (text, verdict.xla_error)
        assert verdict.category == "agree", (text, verdict.mismatch, verdict.ours_error)
        again = compare(verdict.reprint)
        assert again.category == "agree", (verdict.reprint, again.mismatch, again.ours_error)

    check()


@pytest.mark.slow
@needs_xla_instructions
def test_property_random_modules_match_xla():
    _agrees_with_xla_on(_module_strategy(), 150)


# ----------------------------------------------------------------------------- jax programs dumped here

@needs_xla_instructions
@pytest.mark.slow
def test_jax_dumps_and_their_reprints_match_xla(tmp_path):
    dump = tmp_path / "dump"
    env = {**os.environ, "JAX_PLATFORMS": "cpu",
           "XLA_FLAGS": f"--xla_force_host_platform_device_count=8 --xla_dump_to={dump} --xla_dump_hlo_as_text"}
    subprocess.run([sys.executable, "-c", JAX_PROGRAMS], env=env, check=True, timeout=600)
    files = sorted(p for p in dump.rglob("*.txt") if p.read_text(errors="replace").startswith("HloModule"))
    assert len(files) >= 30, len(files)
    bad = []
    seen_ops = set()
    for f in files:
        text = f.read_text()
        verdict = compare(text, str(f))
        if verdict.category != "agree":
            bad.append((f.name, verdict.category, verdict.mismatch or verdict.ours_error))
            continue
        again = compare(verdict.reprint, f"reprint of {f.name}")
        if again.category != "agree":
            bad.append((f"reprint of {f.name}", again.category, again.mismatch or again.ours_error))
        mod = parse_module(text, str(f))
        seen_ops.update(i.opcode for c in mod.computations for i in c.instructions)
        scan_module(mod)  # never crashes on real output
    assert not bad, bad[:5]
    # the corpus covers what it claims: loops, collectives, custom calls, in-place ops
    assert {"while", "all-reduce", "collective-permute", "custom-call", "scatter",
            "dynamic-update-slice", "fusion"} <= seen_ops, sorted(seen_ops)


def _windowed_strategy():
    st = pytest.importorskip("hypothesis.strategies")

    def window(draw, sizes):
        fields = [f"size={'x'.join(map(str, sizes))}"]
        for key in ("stride", "lhs_dilate", "rhs_dilate"):
            if draw(st.booleans()):
                fields.append(f"{key}={'x'.join(str(draw(st.integers(1, 3))) for _ in sizes)}")
        if draw(st.booleans()):
            fields.append("pad=" + "x".join(f"{draw(st.integers(-1, 3))}_{draw(st.integers(-1, 3))}"
                                            for _ in sizes))
        return "window={" + " ".join(draw(st.permutations(fields))) + "}"

    @st.composite
    def modules(draw):
        """A shape-less reduce-window and convolution, windows of every field, any dim order."""
        rank = draw(st.integers(3, 4))
        spatial = [str(k) for k in range(rank - 2)]
        lhs = "".join(draw(st.permutations(["b", "f", *spatial])))
        rhs = "".join(draw(st.permutations(["i", "o", *spatial])))
        out = "".join(draw(st.permutations(["b", "f", *spatial])))
        groups = draw(st.sampled_from([1, 2]))
        sizes = {"b": 4 * groups, "f": 3, "i": 3, "o": 4 * groups}
        sizes.update({k: draw(st.integers(4, 7)) for k in spatial})
        kernel = {k: draw(st.integers(1, 3)) for k in spatial}
        lhs_dims = [sizes[c] for c in lhs]
        rhs_dims = [kernel.get(c, sizes[c]) for c in rhs]
        shape = lambda ds: "f32[" + ",".join(map(str, ds)) + "]"  # noqa: E731
        rw_window = window(draw, [draw(st.integers(1, 3)) for _ in lhs_dims])
        conv_window = window(draw, [kernel[k] for k in spatial])
        return ("HloModule m\n\nadd {\n  x = f32[] parameter(0)\n  y = f32[] parameter(1)\n"
                "  ROOT s = f32[] add(x, y)\n}\n\nENTRY e {\n"
                f"  a = {shape(lhs_dims)} parameter(0)\n  k = {shape(rhs_dims)} parameter(1)\n"
                "  z = f32[] constant(0)\n"
                f"  r = reduce-window(a, z), {rw_window}, to_apply=add\n"
                f"  c = convolution(a, k), {conv_window}, dim_labels={lhs}_{rhs}->{out}"
                + (f", batch_group_count={groups}" if groups > 1 else "") + "\n"
                "  ROOT t = tuple(r, c)\n}\n")

    return modules()


@needs_xla_instructions
def test_property_shape_less_windowed_ops_match_xla():
    """reduce-window and convolution written without a shape: ours infers what XLA does."""
    _agrees_with_xla_on(_windowed_strategy(), 120)
