"""Committed evidence names no path of the machine it was made on: results/ text files (gzipped
compiler dumps included) hold repository-relative paths and ``~`` for the home folder, never a
checkout's or a home's absolute path; tools/publish_hlo.py makes a dump's file table so."""

from __future__ import annotations

import gzip
import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TEXT = {".log", ".md", ".txt", ".json", ".jsonl", ".toml"}
MACHINE_PATH = re.compile(r"(?<![\w.~])/(?:root|home/[^/\s]+|work)/")


def machine_paths(root: Path) -> list[str]:
    """``file:line`` of every results text line naming an absolute home or checkout path."""
    found = []
    for path in sorted((root / "results").rglob("*")):
        if not path.is_file():
            continue
        if path.suffix in TEXT:
            text = path.read_text(encoding="utf-8", errors="replace")
        elif path.suffixes[-2:] and path.suffixes[-2:][0] in TEXT and path.suffix == ".gz":
            text = gzip.decompress(path.read_bytes()).decode("utf-8", errors="replace")
        else:
            continue
        if not MACHINE_PATH.search(text):  # one search per file; line numbers only for the guilty
            continue
        for n, line in enumerate(text.splitlines(), 1):
            if MACHINE_PATH.search(line):
                found.append(f"{path.relative_to(root)}:{n}")
    return found


def test_results_name_no_path_of_this_machine():
    assert machine_paths(ROOT) == []


def test_a_planted_machine_path_is_found(tmp_path):
    (tmp_path / "results" / "x").mkdir(parents=True)
    (tmp_path / "results" / "x" / "a.log").write_text("ok ~/.cache/xla-harness\nPYTHONPATH=/home/alice/src pytest\n")
    (tmp_path / "results" / "x" / "b.md").write_text("see /home/alice/.cache/x and results/x/a.log\n")
    (tmp_path / "results" / "x" / "c.gz").write_bytes(b"/home/alice/ in a binary file is not read")
    (tmp_path / "results" / "x" / "d.txt.gz").write_bytes(gzip.compress(b"HloModule m\n1 \"/home/alice/src/x.py\"\n"))
    assert machine_paths(tmp_path) == ["results/x/a.log:2", "results/x/b.md:1", "results/x/d.txt.gz:2"]


def _publish_tool():
    spec = importlib.util.spec_from_file_location("publish_hlo", ROOT / "tools" / "publish_hlo.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_publish_hlo_scrubs_the_file_table_only(tmp_path):
    tool = _publish_tool()
    body = ("HloModule m\nENTRY e {\n"
            "  ROOT p = f32[4]{0} parameter(0), metadata={source_file=\"/home/alice/x.py\"}\n}\n\n"
            "FileNames\n1 \"/home/alice/src/.venv/lib/python3.13/site-packages/optax/_src/base.py\"\n"
            "2 \"/home/alice/clone/xla_harness/cli.py\"\n3 \"/home/alice/.venv/bin/xla-harness\"\n"
            "4 \"/opt/other.py\"\n\n"
            "FunctionNames\n1 \"_layer\"\n")
    dump = tmp_path / "results" / "x" / "m.after_optimizations.txt"
    (tmp_path / "results" / "x").mkdir(parents=True)
    (tmp_path / "results" / "x" / "compile-error.txt").write_text("not a dump\n")
    dump.write_text(body)
    assert machine_paths(tmp_path) != []
    assert tool.main([str(dump.parent)]) == 0
    gz = dump.with_name(dump.name + ".gz")
    assert not dump.exists() and gz.is_file()
    assert (tmp_path / "results" / "x" / "compile-error.txt").is_file()  # not a dump: left alone
    text = gzip.decompress(gz.read_bytes()).decode()
    assert text.splitlines()[6:10] == ['1 "<site-packages>/optax/_src/base.py"', '2 "xla_harness/cli.py"',
                                       '3 "<venv>/bin/xla-harness"', '4 "<path>/other.py"']
    # the module itself is untouched (metadata strings are not the file table), and the tool is idempotent
    assert text.replace(text[text.index("FileNames"):], "") == body.replace(body[body.index("FileNames"):], "")
    assert machine_paths(tmp_path) == ["results/x/m.after_optimizations.txt.gz:3"]
    before = gz.read_bytes()
    assert tool.main([str(gz)]) == 0 and gz.read_bytes() == before
    assert tool.main([str(tmp_path / "missing")]) == 2
