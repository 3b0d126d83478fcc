"""HLO the real TPU and GPU compilers printed (tests/hlo/aot/: the built-in tied model, TINY sizes,
full mode, remat on and off, on 2 devices, compiled ahead of time by libtpu 0.0.50.1 for v6e and by
the CUDA 12 plugin of jax 0.12.0.1 for an H100; regenerate with
``xla-harness scan --model --target tpu:v6e:2x4 --devices 2 --remat on ... --save-hlo F``). On TPU
fixtures the scanner's in-place pairs must equal libtpu's own aliasing decision."""

import gzip
import json
from pathlib import Path

import pytest

from xla_harness.hlo import alias
from xla_harness.hlo.compiler_alias import module_pairs
from xla_harness.hlo.parser import parse_module
from xla_harness.hlo.scan import module_json, scan

AOT = Path(__file__).parent / "hlo" / "aot"
FIXTURES = sorted(AOT.glob("*.hlo.gz"))


def _load(path: Path):
    return parse_module(gzip.decompress(path.read_bytes()).decode(), path.name)


def test_fixtures_exist():
    names = {p.name.split("_tied")[0] for p in FIXTURES}
    assert names == {"tpu_v6e", "cuda_h100"} and len(FIXTURES) == 4


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.name)
def test_scan_of_compiler_output_is_as_recorded(path):
    backend = "tpu" if path.name.startswith("tpu") else "gpu"
    mod = _load(path)
    findings, decisions, used = scan(mod, backend)
    expected = json.loads(path.with_name(path.name.replace(".hlo.gz", ".expected.json")).read_text())
    assert module_json(mod, findings, decisions, used) == expected


@pytest.mark.parametrize("path", [p for p in FIXTURES if p.name.startswith("tpu")], ids=lambda p: p.name)
def test_scanner_pairs_equal_libtpus_own(path):
    """Every in-place fusion output the walk pairs with a parameter is one libtpu aliased, and every
    pair libtpu states on a fusion holding an in-place op is one the walk finds."""
    mod = _load(path)
    findings, _, _ = scan(mod, "tpu")
    walk = {(f.fusion, tuple(f.output_index), f.parameter) for f in findings if f.compiler and f.cls == "aliased"}
    in_place = {i.name for c in mod.computations for i in c.instructions
                if i.opcode == "fusion" and i.called and not alias.IN_PLACE_OPCODES.isdisjoint(
                    alias.opcodes(mod, i.called[0]))}
    compiler = {(p.instruction, p.output_index, p.operand) for p in module_pairs(mod) if p.instruction in in_place}
    assert walk and walk == compiler
    assert all(f.agreement == "agree" for f in findings if f.compiler)


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.name)
def test_fixture_is_what_its_compiler_prints(path):
    text = gzip.decompress(path.read_bytes()).decode()
    if path.name.startswith("tpu"):
        assert ":T(8,128)" in text and '"aliasing_operands"' in text
    else:
        assert '"operation_queue_id"' in text and ":T(" not in text
