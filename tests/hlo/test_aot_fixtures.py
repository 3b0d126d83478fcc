"""HLO the real TPU and GPU compilers printed (tests/hlo/aot/: the built-in tied model, TINY sizes,
full mode, remat on and off, on 2 devices, compiled ahead of time by libtpu 0.0.50.1 for v6e and by
the CUDA 12 plugin of jax 0.12.0.1 for an H100; regenerate with
``xla-harness scan --model --target tpu:v6e:2x4 --devices 2 --remat on ... --save-hlo F``; the CUDA
ones keep the compiler's buffer assignment and its values file beside them, ``X-buffer-assignment.txt.gz``
and ``X-buffer-assignment-values.txt.gz``, from the same compile dumped with ``--xla_dump_to``). On every
fixture the scanner's in-place pairs must equal the compiler's own decision: libtpu's
``aliasing_operands`` on TPU, the buffer slices the GPU compiler gave on CUDA."""

import gzip
import json
import re
from pathlib import Path

import pytest

from xla_harness.cli import main
from xla_harness.hlo import alias, buffers
from xla_harness.hlo.compiler_alias import (
    FROM_BACKEND_CONFIG,
    FROM_BUFFER_ASSIGNMENT,
    buffer_pairs,
    in_place_fusion,
    module_pairs,
)
from xla_harness.hlo.parser import parse_module
from xla_harness.hlo.scan import format_findings, module_json, scan

AOT = Path(__file__).parent / "aot"
FIXTURES = sorted(AOT.glob("*.hlo.gz"))
CUDA = [p for p in FIXTURES if p.name.startswith("cuda")]


def _load(path: Path):
    return parse_module(gzip.decompress(path.read_bytes()).decode(), path.name)


def _stem(path: Path) -> str:
    return path.name[:-len(".hlo.gz")]


def _ba_texts(path: Path) -> tuple[str, str] | None:
    ba = path.with_name(_stem(path) + "-buffer-assignment.txt.gz")
    values = path.with_name(_stem(path) + "-buffer-assignment-values.txt.gz")
    if not ba.exists():
        return None
    return gzip.decompress(ba.read_bytes()).decode(), gzip.decompress(values.read_bytes()).decode()


def _ba(path: Path, ba_text: str | None = None, values_text: str | None = None):
    texts = _ba_texts(path)
    if texts is None:
        return None
    ba = buffers.parse_buffer_assignment(ba_text or texts[0], path.name)
    ba.uses = buffers.parse_value_uses(values_text or texts[1], path.name)
    return ba


def _walk_pairs(findings) -> set:
    return {(f.fusion, tuple(f.output_index), f.parameter) for f in findings if f.compiler and f.cls == "aliased"}


def _compiler_pairs(mod, ba) -> set:
    """The compiler's own pairs on the fusions the scanner classifies: libtpu's backend_config, or the
    buffer assignment where the module has none."""
    analysis = alias.analyze(mod)
    in_place = {i.name for c in mod.computations for i in c.instructions if in_place_fusion(analysis, i)}
    pairs = module_pairs(mod) if ba is None else buffer_pairs(mod, ba)
    return {(p.instruction, p.output_index, p.operand) for p in pairs if p.instruction in in_place}


def test_fixtures_exist():
    names = {p.name.split("_tied")[0] for p in FIXTURES}
    assert names == {"tpu_v6e", "cuda_h100"} and len(FIXTURES) == 4


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.name)
def test_scan_of_compiler_output_is_as_recorded(path):
    backend = "tpu" if path.name.startswith("tpu") else "gpu"
    mod = _load(path)
    findings, decisions, used = scan(mod, backend, _ba(path))
    expected = json.loads(path.with_name(path.name.replace(".hlo.gz", ".expected.json")).read_text())
    assert module_json(mod, findings, decisions, used) == expected


def test_every_cuda_fixture_has_its_buffer_assignment():
    assert len(CUDA) == 2 and all(_ba_texts(p) is not None for p in CUDA)


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.name)
def test_scanner_pairs_equal_the_compilers_own(path):
    """Every in-place fusion output the walk pairs with a parameter is one the compiler aliased, and
    every pair the compiler made on a fusion holding an in-place op is one the walk finds: libtpu's
    backend_config on TPU, one buffer slice for operand and output in the GPU compiler's buffer
    assignment on CUDA."""
    mod = _load(path)
    ba = _ba(path)
    findings, _, _ = scan(mod, "tpu" if path.name.startswith("tpu") else "gpu", ba)
    compiler = _compiler_pairs(mod, ba)
    assert findings and all(f.compiler for f in findings)  # the compiler said something on every output
    assert _walk_pairs(findings) and _walk_pairs(findings) == compiler
    assert all(f.agreement == "agree" for f in findings)
    want = FROM_BACKEND_CONFIG if ba is None else FROM_BUFFER_ASSIGNMENT
    assert {f.compiler_from for f in findings} == {want}


def _move_output(ba_text: str, fusion: str, to_offset: int) -> str:
    """The buffer assignment with ``fusion``'s output value moved to another offset of its allocation."""
    pattern = re.compile(r"(value: <\d+ " + re.escape(fusion) + r" @\d+> \(size=\d+,offset=)(\d+)\)")
    assert len(pattern.findall(ba_text)) == 1
    return pattern.sub(lambda m: f"{m.group(1)}{to_offset})", ba_text)


@pytest.mark.parametrize("path", CUDA, ids=lambda p: p.name)
def test_a_planted_slice_difference_is_a_disagreement(path):
    """Edit the buffer assignment so that one scatter fusion's output no longer shares its operand's
    slice: the compiler's pairs lose that fusion, the walk still pairs it, the finding says disagree."""
    mod = _load(path)
    ba_text, values_text = _ba_texts(path)
    planted = _ba(path, _move_output(ba_text, "input_scatter_fusion.2", 1 << 40))
    findings, _, _ = scan(mod, "gpu", planted)
    (bad,) = [f for f in findings if f.agreement == "disagree"]
    assert (bad.fusion, bad.compiler, bad.cls) == ("input_scatter_fusion.2", "not-aliased", "aliased")
    assert _walk_pairs(findings) != _compiler_pairs(mod, planted)
    assert "input_scatter_fusion.2" not in {p[0] for p in _compiler_pairs(mod, planted)}
    text = format_findings(mod, findings, decisions=[], backend="gpu")
    assert "the compiler's own aliasing (buffer assignment) agrees with the walk on 3 of 4" in text
    assert "disagreement: input_scatter_fusion.2 output () <- parameter 0: walk says aliased, the compiler " \
           "not-aliased" in text


@pytest.mark.parametrize("path", CUDA, ids=lambda p: p.name)
def test_a_value_the_assignment_does_not_list_is_not_a_verdict(path):
    """Without the values file the value an operand reads is looked for by name: the async
    reduce-scatter feeding ``input_scatter_fusion`` is printed as ``reduce-scatter-done.2`` but named
    after the collective inside it in the assignment, so that output gets no verdict (not a false
    "not-aliased"); the other three still agree."""
    mod = _load(path)
    ba = buffers.parse_buffer_assignment(_ba_texts(path)[0], path.name)
    findings, _, _ = scan(mod, "gpu", ba)
    said = {f.fusion: f.agreement for f in findings}
    assert said.pop("input_scatter_fusion") == ""
    assert set(said.values()) == {"agree"} and len(said) == 3


def test_scan_of_a_cuda_dump_directory_reports_the_buffer_assignment(tmp_path, capsys):
    """The dump XLA writes (HLO, buffer assignment, values) scanned as a directory: the compiler's own
    decision is read and set against the walk; the planted difference exits as before (walk: aliased),
    but the line says 3 of 4 and names the disagreement."""
    path = CUDA[0]
    stem = tmp_path / "module_0001.jit_step.sm_9.0a_gpu_after_optimizations"
    ba_text, values_text = _ba_texts(path)
    Path(f"{stem}.txt").write_text(gzip.decompress(path.read_bytes()).decode())
    Path(f"{stem}-buffer-assignment.txt").write_text(ba_text)
    Path(f"{stem}-buffer-assignment-values.txt").write_text(values_text)
    assert main(["scan", str(tmp_path)]) == 0
    assert "the compiler's own aliasing (buffer assignment) agrees with the walk on 4 of 4" in capsys.readouterr().out
    Path(f"{stem}-buffer-assignment.txt").write_text(_move_output(ba_text, "input_scatter_fusion.3", 1 << 40))
    # (its memory plan is refused: the moved value's bytes run past its allocation; the aliasing is read still)
    assert main(["scan", str(tmp_path), "--json", "--no-memcheck"]) == 0
    (m,) = json.loads(capsys.readouterr().out)["modules"]
    assert [(f["fusion"], f["agreement"]) for f in m["findings"] if f["agreement"] != "agree"] == \
        [("input_scatter_fusion.3", "disagree")]
    assert {f["compiler_from"] for f in m["findings"]} == {"buffer assignment"}


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.name)
def test_fixture_is_what_its_compiler_prints(path):
    text = gzip.decompress(path.read_bytes()).decode()
    if path.name.startswith("tpu"):
        assert ":T(8,128)" in text and '"aliasing_operands"' in text
    else:
        assert '"operation_queue_id"' in text and ":T(" not in text
