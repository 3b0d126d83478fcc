"""Where W's scatter writes (xla_harness.hlo.tied.aliased_scatter_writes, tools/aliased_writes.py):
on a hand-written module with one producer of each kind, and on libtpu's own compiles committed in
results/tpu-aot/sweep, whose README column it must reproduce."""

import importlib.util
import json
from pathlib import Path

import pytest

from xla_harness.hlo.parser import parse_module
from xla_harness.hlo.tied import aliased_scatter_writes

ROOT = Path(__file__).resolve().parents[1]
SWEEP = ROOT / "results/tpu-aot/sweep"


def _tool():
    spec = importlib.util.spec_from_file_location("aliased_writes", ROOT / "tools/aliased_writes.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_each_producer_of_an_aliased_scatter_buffer_is_named():
    module = parse_module((ROOT / "tests/data/aliased_scatter_writes.hlo").read_text(), "fixture")
    writes = aliased_scatter_writes(module, (64, 32))
    assert [(w.fusion, w.producer, w.source, w.via_tuple) for w in writes] == [
        ("onto_dense", "dense", "dense", True),
        ("onto_zeros", "zeros", "broadcast", False),
        ("onto_masked", "masked", "select-broadcast", False),
        ("onto_moved", "moved", "data-moving", False),
        ("onto_summed", "summed", "dense-via", False),
    ]
    assert [w.text for w in writes] == [
        "the dense (dot) gradient's fusion (via a get-tuple-element)", "a broadcast zero",
        "a select of a broadcast zero (kLoop)", "a transpose (moves data)",
        "the dense (dot) gradient, via a kLoop fusion (root add) after collective-permute"]
    # W's shape in the other order is W's shape; another shape is not.
    assert len(aliased_scatter_writes(module, (32, 64))) == 5
    assert aliased_scatter_writes(module, (64, 16)) == []


# The sweep README's column "where the aliased scatter writes", for three cells that between them
# hold every answer it gives.
COMMITTED = [
    ("jit=bare/jax0.12.0.1", "the dense (dot) gradient's fusion"),
    ("embed_spec=model,none/jax0.12.0.1", "a select of a broadcast zero (kLoop); a broadcast zero"),
    ("embed_spec=none,data/jax0.9.0.1",
     "the dense (dot) gradient's fusion (via a get-tuple-element); a broadcast zero"),
]


@pytest.mark.parametrize("cell, words", COMMITTED)
def test_libtpus_compiles_read_as_the_sweep_readme_says(cell, words):
    tool = _tool()
    folder = SWEEP / cell
    (record,) = [json.loads(line) for line in (folder / "compile.jsonl").read_text().splitlines()]
    assert tool.where_written(folder, record) == words
    readme = (ROOT / "results/tpu-aot/README.md").read_text()
    option, pin = cell.split("/")
    versions = "0.12.0.1 / 0.0.50.1" if pin == "jax0.12.0.1" else "0.9.0.1 / 0.0.34"
    assert any(line.startswith(f"| {versions} | {option} |") and line.endswith(f"| {words} |")
               for line in readme.splitlines())


def test_the_tool_prints_a_row_per_record_and_refuses_bad_input(tmp_path, capsys):
    tool = _tool()
    assert tool.main([str(SWEEP / "jit=bare/jax0.12.0.1"), str(SWEEP / "jit=nested/jax0.12.0.1")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("| jax / libtpu | jit | instructions |") and len(out) == 4
    assert out[2] == ("| 0.12.0.1 / 0.0.50.1 | bare | 24,644 | 10.36 GB / 1.92 GB | 157 | 0 / 0 | 97 (1) | 0 | "
                      "the dense (dot) gradient's fusion |")
    (tmp_path / "compile.jsonl").write_text('{"kind": "compile"}\n')
    for argv, says in (([], "usage"), ([str(tmp_path / "nowhere")], "is not a file"),
                       ([str(tmp_path)], "compile.jsonl:1: not a compile record"), (["--factors"], "--factors")):
        assert tool.main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error:") and says in err[0], err


UNALIASED = (ROOT / "tests/data/unaliased_scatters.hlo").read_text()


def test_where_no_scatter_fusion_is_aliased_the_tool_says_where_the_scatters_add(tmp_path, monkeypatch):
    tool = _tool()
    monkeypatch.setattr(tool, "w_shard", lambda options: (64, 32))
    (tmp_path / "m.hlo").write_text(UNALIASED)
    record = {"hlo": "m.hlo", "label": "fixture", "options": {}}
    assert tool.where_written(tmp_path, record) == (
        "no aliased scatter fusion (2 scatters of W's shape: 1 into broadcast zeros, 1 into the dense gradient)")
    # The same module with the second fusion aliased: the column names its buffer instead.
    (tmp_path / "m.hlo").write_text(UNALIASED.replace('calls=%scatter_param, backend_config={"aliasing_operands":'
                                                      '{"lists":[]}}', 'calls=%scatter_param, backend_config='
                                                      '{"aliasing_operands":{"lists":[{"indices":["0","3"]}]}}'))
    assert tool.where_written(tmp_path, record) == "a dot"
