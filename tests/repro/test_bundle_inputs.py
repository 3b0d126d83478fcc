"""#34 item 13: bundle checks every input and output path before anything runs.

bundle refused --bisect EMPTYDIR after the compile and the stress run, and replaced OUT.partial.
"""

from __future__ import annotations

import pytest

from xla_harness.cli import main
from xla_harness.errors import HarnessError

from ..bad_input_cases import TINY_ARGS

# ----------------------------------------------------------------------------- item 13: bundle


@pytest.mark.parametrize("setup,extra,says", [
    ({"b/": None}, ["--bisect", "{tmp}/b"], "no bisect.jsonl"),
    ({"b/bisect.jsonl": b"my notes\n"}, ["--bisect", "{tmp}/b"], "not a bisection log"),
    ({"o.tar.gz.partial": b"an earlier attempt"}, [], "o.tar.gz.partial already exists"),
    ({"dump/": None}, ["--dump", "{tmp}/dump"], "jit_step"),
    ({}, ["--program", "issue-35409", "--program-option", "remat=off"], "option remat"),
], ids=["bisect-empty", "bisect-not-a-log", "partial-exists", "dump-empty", "bad-option"])
def test_bundle_checks_everything_before_it_compiles(setup, extra, says, tmp_path, monkeypatch, capsys):
    from xla_harness.repro import bundle

    monkeypatch.setattr(bundle, "make_bundle", lambda *a, **k: pytest.fail("the bundle was being made"))
    for rel, data in setup.items():
        if data is None:
            (tmp_path / rel).mkdir(parents=True)
        else:
            (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / rel).write_bytes(data)
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    argv = ["bundle", "--out", str(tmp_path / "o.tar.gz"), *TINY_ARGS, *extra]
    if "--program" in extra:
        argv = ["bundle", "--out", str(tmp_path / "o.tar.gz"), *extra]
    assert main([a.replace("{tmp}", str(tmp_path)) for a in argv]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and says in err, err
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before


def test_the_archive_is_never_written_over_a_file(tmp_path):
    from xla_harness.repro.bundle import _write_archive

    root = tmp_path / "bundle"
    root.mkdir()
    (root / "a.txt").write_text("a")
    out, partial = tmp_path / "o.tar.gz", tmp_path / "o.tar.gz.partial"
    partial.write_bytes(b"mine")
    with pytest.raises(HarnessError, match="partial appeared"):
        _write_archive(root, out, partial)
    assert partial.read_bytes() == b"mine" and not out.exists()
    partial.unlink()
    out.write_bytes(b"theirs")
    with pytest.raises(HarnessError, match="o.tar.gz appeared"):
        _write_archive(root, out, partial)
    assert out.read_bytes() == b"theirs" and partial.is_file()  # the bundle made is kept, named
    partial.unlink()
    out.unlink()
    _write_archive(root, out, partial)
    assert out.is_file() and not partial.exists()
