"""``xla-harness memcheck`` in-process: exit 0 on a clean dump, 1 on a planted conflict, 2 with one
``error:`` line (no traceback) on bad input; ``--json`` is strict JSON with the counts of the text."""

from __future__ import annotations

import gzip
import json
import re
import shutil
from pathlib import Path

import pytest

from xla_harness.cli import main

ROOT = Path(__file__).resolve().parents[2]
DUMP = ROOT / "results/gpu/h100-2026-11-28/memory-plan/dump"
STEM = "module_0000.jit_stage.sm_9.0a_gpu_after_optimizations"


@pytest.fixture
def clean(tmp_path) -> Path:
    """A copy of a small real XLA:GPU dump (module, buffer assignment, live range)."""
    for suffix in ("", "-buffer-assignment", "-live-range"):
        shutil.copy(DUMP / f"{STEM}{suffix}.txt.gz", tmp_path)
    return tmp_path / f"{STEM}.txt.gz"


def _planted(module: Path) -> Path:
    """The dump with copy.1's value moved onto the parameter's bytes (live, not donated): an overlap."""
    ba = module.with_name(f"{STEM}-buffer-assignment.txt.gz")
    text = gzip.decompress(ba.read_bytes()).decode()
    line = re.search(r"^ value: <\d+ copy\.1 @0>.*\n", text, re.M)
    assert line
    text = text[:line.start()] + text[line.end():]
    text = re.sub(r"(^allocation 1: .*\n)", lambda m: m.group(1) + line.group(0), text, count=1, flags=re.M)
    ba.write_bytes(gzip.compress(text.encode()))
    return module


def _run(capsys, *args: str) -> tuple[int, str, str]:
    rc = main(["memcheck", *args])
    out = capsys.readouterr()
    return rc, out.out, out.err


def _strict(text: str):
    def no(c: str):
        raise ValueError(c)
    return json.loads(text, parse_constant=no)


def test_a_clean_dump_exits_0(clean, capsys):
    rc, out, err = _run(capsys, str(clean))
    assert rc == 0, (out, err)
    assert "0 conflicts" in out and "0 disagreements" in out


def test_a_folder_is_checked_module_by_module(clean, capsys):
    rc, out, _ = _run(capsys, str(clean.parent))
    assert rc == 0 and out.count("0 conflicts") == 1


def test_a_planted_conflict_exits_1(clean, capsys):
    rc, out, _ = _run(capsys, str(_planted(clean)))
    assert rc == 1
    assert re.search(r"\b1 conflicts\b", out) and "overlap: allocation 1" in out and "copy.1" in out


@pytest.mark.parametrize("planted", [False, True])
def test_json_is_strict_with_the_counts_of_the_text(clean, capsys, planted):
    module = _planted(clean) if planted else clean
    rc_text, out, _ = _run(capsys, str(module))
    rc, js, _ = _run(capsys, str(module), "--json")
    assert rc == rc_text == (1 if planted else 0)
    [report] = _strict(js)
    n = int(re.search(r"(\d+) conflicts", out).group(1))
    assert len(report["conflicts"]) == n == (1 if planted else 0)
    assert report["values"] == 2 and report["allocations"] == 2
    assert report["live_range_compared"] == 2 and report["live_range_disagreements"] == []
    if planted:
        c = report["conflicts"][0]
        assert c["kind"] == "overlap" and c["allocation"] == 1 and c["bytes"] == [0, 4]


def _bad(tmp_path: Path, case: str) -> Path:
    mod = tmp_path / "m.after_optimizations.txt"
    ba = tmp_path / "m.after_optimizations-buffer-assignment.txt"
    real = gzip.decompress((DUMP / f"{STEM}.txt.gz").read_bytes())
    real_ba = gzip.decompress((DUMP / f"{STEM}-buffer-assignment.txt.gz").read_bytes())
    if case == "missing":
        return tmp_path / "nowhere"
    if case == "empty folder":
        (tmp_path / "d").mkdir()
        (tmp_path / "d" / "notes.txt").write_text("no module here\n")
        return tmp_path / "d"
    if case == "no buffer assignment":
        mod.write_bytes(real)
        return mod
    if case == "garbage module":
        mod.write_bytes(b"this is not HLO {{{ \x00\x01\n")
        ba.write_bytes(real_ba)
        return mod
    if case == "garbage buffer assignment":
        mod.write_bytes(real)
        ba.write_text("allocation what: ???\n")
        return mod
    if case == "empty module":
        mod.write_bytes(b"")
        ba.write_bytes(real_ba)
        return mod
    if case == "empty buffer assignment":
        mod.write_bytes(real)
        ba.write_bytes(b"")
        return mod
    if case == "corrupt gz":
        gz = tmp_path / "m.after_optimizations.txt.gz"
        gz.write_bytes(gzip.compress(real)[:40])
        (tmp_path / "m.after_optimizations-buffer-assignment.txt.gz").write_bytes(gzip.compress(real_ba))
        return gz
    if case == "not utf-8":
        mod.write_bytes(b"HloModule m\n\xff\xfe\n")
        ba.write_bytes(real_ba)
        return mod
    raise AssertionError(case)


@pytest.mark.parametrize("case", ["missing", "empty folder", "no buffer assignment", "garbage module",
                                  "garbage buffer assignment", "empty module", "empty buffer assignment",
                                  "corrupt gz", "not utf-8"])
def test_bad_input_is_one_error_line_and_exit_2(tmp_path, capsys, case):
    rc, out, err = _run(capsys, str(_bad(tmp_path, case)))
    assert rc == 2, (case, out, err)
    assert "Traceback" not in err + out
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), err


def test_bad_input_with_json_prints_no_partial_json(tmp_path, capsys):
    rc, out, err = _run(capsys, str(_bad(tmp_path, "corrupt gz")), "--json")
    assert rc == 2 and out == "" and err.startswith("error:")


@pytest.mark.slow
def test_the_speed_bench_runs_on_a_real_dump():
    import subprocess
    import sys

    module = DUMP / f"{STEM}.txt.gz"
    done = subprocess.run([sys.executable, str(ROOT / "bench/memcheck_speed.py"), "--module", str(module),
                           "--repeat", "1"], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert "memcheck: " in done.stdout and "jaxlib C++ parse of the module alone" in done.stdout


def _unzipped(module: Path) -> Path:
    """The dump's files as scan reads them (*.txt, not gzipped)."""
    for f in list(module.parent.glob("*.txt.gz")):
        f.with_suffix("").write_bytes(gzip.decompress(f.read_bytes()))
        f.unlink()
    return module.parent


def test_scan_checks_the_memory_plan_beside_each_module(clean, capsys):
    folder = _unzipped(clean)
    rc = main(["scan", str(folder)])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "  memory plan: 0 conflict(s) in 2 values, 2 allocations, 0 async windows; its live range as the " \
           "compiler's on 2 values" in out
    assert out.rstrip().endswith("0 memory-plan conflict(s) in 1 memory plan(s) checked")
    assert main(["scan", "--json", str(folder)]) == 0
    plan = _strict(capsys.readouterr().out)["modules"][0]["memory_plan"]
    assert plan["conflicts"] == [] and plan["live_range_compared"] == 2


def test_scan_counts_a_memory_plan_conflict_as_a_finding(clean, capsys):
    folder = _unzipped(_planted(clean))
    rc = main(["scan", str(folder)])
    out = capsys.readouterr().out
    assert rc == 1, out
    assert "  memory plan conflict: overlap: " in out and "1 memory-plan conflict(s) in 1 memory plan(s)" in out
    rc = main(["scan", "--no-memcheck", str(folder)])
    out = capsys.readouterr().out
    assert rc == 0 and "memory plan" not in out, out
