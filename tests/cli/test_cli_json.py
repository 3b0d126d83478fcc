"""--json on the commands that gained it (bisect-passes, bundle and bundle --check, patches-check,
pr): the output parses, carries the verdict and figures the text shows, and the exit code is
the text mode's."""

from __future__ import annotations

import json

import pytest

from xla_harness.cli import main

from ..helpers import TINY_ARGS


def _json(capsys) -> dict:
    return json.loads(capsys.readouterr().out)


# ----------------------------------------------------------------------------- patches-check


def test_patches_check_without_any_tree_is_refused_not_passed(capsys):
    """Nothing to check is not a pass: exit 2, one error line naming the flags, in text and --json."""
    for extra in ([], ["--json"]):
        assert main(["patches-check", *extra]) == 2
        captured = capsys.readouterr()
        assert captured.out == ""
        err = captured.err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: patches-check: no source tree given")
        assert "--xla-src" in err[0]


def test_patches_check_lists_upstreams_without_a_tree_as_not_checked(tmp_path, capsys):
    """With one tree given, every other upstream is listed "not checked" and never counts as applying;
    a tree against which nothing applies is itself refused (exit 2)."""
    (tmp_path / "empty").mkdir()
    assert main(["patches-check", "--json", "--tf-src", str(tmp_path / "empty")]) == 2
    doc = _json(capsys)
    xla = next(r for r in doc["results"] if r["upstream"] == "xla")
    assert xla == {"upstream": "xla", "status": "not checked", "detail": "no source tree given"}
    assert doc["applies"] == 0 and doc["error"] is not None


@pytest.mark.slow  # git apply
def test_patches_check_json_applies_and_fails(tmp_path, capsys):
    from ..upstream.test_patches import P0, P1, P2, _tree_for

    tree = _tree_for(tmp_path / "ok", P0, P1, P2)
    assert main(["patches-check", "--json", "--xla-src", str(tree), "--series", "experimental"]) == 0
    doc = _json(capsys)
    assert doc["applies"] == 3 and doc["error"] is None
    assert [r["detail"].split()[0] for r in doc["results"] if r["upstream"] == "xla"] == \
        ["xla/0001-instruction-fusion-no-data-moving-producer-into-in-place-scatter.patch",
         "xla/0002-experimental-alias-info-trace-bitcast-equivalent-transpose-reshape.patch",
         "xla/0003-experimental-trace-all-transpose-reshape.patch"]
    bad = _tree_for(tmp_path / "bad", P0)
    cc = bad / "xla/service/instruction_fusion.cc"
    cc.write_text(cc.read_text().replace("non-elementwise ops, bailing", "non-elementwise ops, renamed"))
    assert main(["patches-check", "--json", "--xla-src", str(bad)]) == 2  # the text mode's exit code
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and err[0] == f"error: {doc['error']}" and "hunk #" in doc["error"]


# ----------------------------------------------------------------------------- pr


def test_pr_json(tmp_path, capsys):
    out = tmp_path / "pr"
    assert main(["pr", "--target", "xla", "--out", str(out), "--json"]) == 0
    doc = _json(capsys)
    assert doc["target"] == "xla" and doc["folder"] == str(out)
    assert [p.rsplit("/", 1)[1] for p in doc["files"]] == ["series.mbox", "PR.md", "APPENDIX.md", "CHECKLIST.md"]
    assert all((out / p.rsplit("/", 1)[1]).is_file() for p in doc["files"])


# ----------------------------------------------------------------------------- bundle


@pytest.mark.slow  # --check re-runs repro.py in a subprocess
def test_bundle_and_check_json(tmp_path, capsys):
    out = tmp_path / "repro.tar.gz"
    assert main(["bundle", "--out", str(out), "--steps", "2", "--seeds", "1", "--json", *TINY_ARGS]) == 0
    assert _json(capsys) == {"bundle": str(out)}
    assert main(["bundle", "--check", str(out), "--json"]) == 0
    doc = _json(capsys)
    assert doc["bundle"] == str(out) and doc["same"] is True
    assert any(line.startswith("repro.py: same as") for line in doc["lines"])
    assert not any("DIFFERENT" in line for line in doc["lines"])


# ----------------------------------------------------------------------------- bisect-passes


@pytest.mark.slow  # every probe compiles in a fresh process
def test_bisect_passes_json(tmp_path, capsys):
    argv = ["bisect-passes", "--oracle", "hlo", "--property", "multi-op-fusion", "--program", "small",
            "--out", str(tmp_path / "b"), "--quiet", "--json"]
    assert main(argv) == 0
    doc = _json(capsys)
    assert doc["minimal"] and set(doc["minimal"]) <= set(doc["candidates"])
    assert doc["flag"] == "--xla_disable_hlo_passes=" + ",".join(doc["minimal"])
    assert doc["new_probes"] > 0 and doc["oracle"] == "hlo" and doc["property"] == "multi-op-fusion"
    assert doc["baseline"] is None and doc["steps_per_probe"] is None  # hlo oracle: deterministic
    assert doc["log"].endswith("bisect.jsonl")
    # resumed: the same answer, every probe from the log; the text says the same
    assert main([*argv, "--resume"]) == 0
    again = _json(capsys)
    assert again["minimal"] == doc["minimal"] and again["new_probes"] == 0
    assert main([a for a in argv if a != "--json"] + ["--resume"]) == 0
    text = capsys.readouterr().out
    assert f"removes the failure: {', '.join(doc['minimal'])}\n" in text and "0 new probe(s)" in text
