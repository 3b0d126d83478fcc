"""tools/hlo_corpus.py, the by-hand measurement of the reader against XLA's parser, on a
corpus of three modules written here: the table's counts and the hang path."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "tools" / "hlo_corpus.py"

GOOD = "HloModule m\nENTRY e {\n  p = f32[4]{0} parameter(0)\n  ROOT n = f32[4]{0} negate(p)\n}\n"
XLA_REJECTS = GOOD.replace("negate(p)", "negate(q)")  # undefined operand: both reject
# XLA's lexer takes a stray shape followed by a comma in an operand list; ours refuses it
OURS_REJECTS = ("HloModule m\nENTRY e {\n  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n"
                "  ROOT r = f32[] add(f32[] %a, f32[], %b)\n}\n")


def _corpus(tmp_path: Path) -> Path:
    written = tmp_path / "corpus" / "rev" / "written"
    written.mkdir(parents=True)
    for name, text in (("good.hlo", GOOD), ("both_reject.hlo", XLA_REJECTS),
                       ("stray_operand_shape.hlo", OURS_REJECTS)):
        (written / name).write_text(text)
    return tmp_path / "corpus"


@pytest.mark.slow
def test_measure_counts_and_results_file(tmp_path):
    results = tmp_path / "r.json"
    proc = subprocess.run([sys.executable, str(TOOL), "measure", "--out", str(_corpus(tmp_path)),
                           "--results", str(results)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads(results.read_text())
    written = data["summary"]["upstream as written"]
    assert (written["modules"], written["xla-accepts"], written["ours-rejects"], written["agree"]) == (3, 2, 1, 2)
    assert data["summary"]["XLA's own reprint"]["agree"] == 2
    assert {r["name"]: r["written"] for r in data["not_agreeing"]} == {"stray_operand_shape.hlo": "ours-rejects"}
    assert "| upstream as written | 3 | 2 | 1 (50.00%) | 1 | 0 | 0 | 0 / 0 | 0 |" in proc.stdout


@pytest.mark.slow
def test_a_file_without_an_answer_counts_as_a_hang_and_the_rest_go_on(tmp_path):
    spec = importlib.util.spec_from_file_location("hlo_corpus", TOOL)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    files = sorted((_corpus(tmp_path) / "rev" / "written").iterdir())
    rows = tool._run_workers(files, timeout=0.01)  # no child answers that fast: every file is a hang
    assert [(r["name"], r["written"]["cat"]) for r in rows] == [(f.name, "hang") for f in files]
