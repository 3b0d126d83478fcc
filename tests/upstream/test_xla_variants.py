"""The XLA series for the XLA a jax release pins: the variant for jax 0.9.0.1's pin (bb760b047b),
how `make xla-test` picks a variant for a tree, the build's choice, and the recorded bases."""

import re
import subprocess
from pathlib import Path

import pytest

from xla_harness.errors import HarnessError
from xla_harness.upstream import jaxlib_build as bj
from xla_harness.upstream import jaxlib_stages as stages
from xla_harness.upstream import xlatest, xlatest_build, xlatest_guards
from xla_harness.upstream.jaxlib_context import Ctx
from xla_harness.upstream.patchfile import preimage_tree
from xla_harness.upstream.series import declared_base, load_series

ROOT = Path(__file__).resolve().parents[2]
NAME = "0001-instruction-fusion-no-data-moving-producer-into-in-place-scatter.patch"
OWN = f"xla/{NAME}"
V0901 = f"xla/jax-v0.9.0.1/{NAME}"
BB760 = "bb760b047bdbfeff962f0366ad5cc782c98657e0"
XLA = load_series().upstream("xla")


def test_the_variant_for_jax_0_9_0_1_is_declared_for_its_xla_commit():
    v = XLA.variant("jax-v0.9.0.1")
    assert v is not None and v.commit == BB760
    assert [p.file for p in XLA.select("default", "jax-v0.9.0.1")] == [V0901]
    assert declared_base((ROOT / "patches" / V0901).read_text()) == "jax-v0.9.0.1"
    with pytest.raises(HarnessError, match="experimental series of xla is not available for jax-v0.9.0.1"):
        XLA.select("experimental", "jax-v0.9.0.1")
    # the jax 0.10.2 and 0.11.0 pins take the series' own file (it applies there unchanged)
    assert [p.file for p in XLA.select("default", "jax-v0.11.0")] == [OWN]
    assert [p.file for p in XLA.select("default", "jax-v0.10.2")] == [OWN]
    text = (ROOT / "patches" / V0901).read_text()
    added = "".join(ln[1:] + "\n" for ln in text.splitlines() if ln.startswith("+") and not ln.startswith("+++"))
    # no AliasInfo hook or parameter at that base: the change follows bitcasts, as AliasInfo does there
    assert "IsNoOpForAliasAnalysis" not in added and "alias_info" not in added
    assert "diff --git a/xla/hlo/analysis/alias_info.h" not in text
    assert "source->opcode() == HloOpcode::kBitcast" in added and "IsForbidden" not in added


def test_base_ref_for_picks_the_variant_recorded_for_the_trees_commit():
    assert xlatest_build.base_ref_for(XLA, BB760) == "jax-v0.9.0.1"
    assert xlatest_build.base_ref_for(XLA, "131bf41acb4650e4391a640c3f1859c1c86ad74b") == "jax-v0.11.0"
    assert xlatest_build.base_ref_for(XLA, "5a9e73cbd92530cac2ac36f4736a774b2412afe2") == "jax-v0.10.2"
    assert xlatest_build.base_ref_for(XLA, "183fa00cb5d82384463a1a7aed1ab06bc9026974") is None  # the series' own
    assert xlatest_build.base_ref_for(XLA, "unknown") is None
    assert xlatest_build.base_ref_for(XLA, "unknown", "jax-v0.9.0.1") == "jax-v0.9.0.1"
    assert xlatest_build.base_ref_for(XLA, "0" * 40, XLA.base_ref) is None
    with pytest.raises(HarnessError, match="made for XLA bb760b047bdb, but the tree is at 000000000000"):
        xlatest_build.base_ref_for(XLA, "0" * 40, "jax-v0.9.0.1")
    with pytest.raises(HarnessError, match="no xla series for jax-v0.9.2"):
        xlatest_build.base_ref_for(XLA, BB760, "jax-v0.9.2")


def test_xla_test_files_for_the_variant(capsys):
    assert xlatest.main(["files", "--base-ref", "jax-v0.9.0.1"]) == 0
    files = capsys.readouterr().out.split()
    assert "xla/service/instruction_fusion.cc" in files and "xla/hlo/analysis/alias_info.h" not in files
    assert xlatest.main(["files", "--base-ref", "jax-v0.9.2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: series.toml has no xla series for jax-v0.9.2")


def test_the_variants_guards_are_the_series_guards_spelled_as_at_its_base():
    guards, absent = xlatest_guards.guards_for_base(xlatest_guards.load_guards(), XLA, "jax-v0.9.0.1")
    assert xlatest_guards.check_guards_cover(guards, [V0901]) == [] and {g.patch for g in guards} == {V0901}
    assert len(guards) == 21
    # the guards of a backend's no-op hook (its exemption and its order) are listed as absent there, with why
    assert sorted(g.name.split(":")[0] for g, _ in absent) == ["exemption", "hook order", "hook order"]
    assert all("no backend no-op hook at this base" in why for _, why in absent)
    # four guards are spelled otherwise there (no alias_info); the rest are the series' own text
    own = {g.name: g for g in xlatest_guards.load_guards()}
    respelled = sorted(g.name for g in guards if g.find != own[g.name].find)
    assert len(respelled) == 4 and all("alias_info" not in g.find + g.replace for g in guards)
    # the variants that use the series' own file take its guards as written
    for ref in ("jax-v0.10.2", "jax-v0.11.0"):
        same, none = xlatest_guards.guards_for_base(xlatest_guards.load_guards(), XLA, ref)
        assert none == [] and [(g.patch, g.name, g.find, g.replace) for g in same] == [
            (g.patch, g.name, g.find, g.replace) for g in xlatest_guards.load_guards()]


@pytest.mark.slow
def test_every_guard_of_the_variant_is_in_its_patched_file_once(tmp_path):
    guards, _ = xlatest_guards.guards_for_base(xlatest_guards.load_guards(), XLA, "jax-v0.9.0.1")
    text = (ROOT / "patches" / V0901).read_text()
    tree = tmp_path / "tree"
    preimage_tree(text, tree)
    subprocess.run(["git", "init", "-q"], cwd=tree, check=True)
    subprocess.run(["git", "apply", str(ROOT / "patches" / V0901)], cwd=tree, check=True, capture_output=True)
    added = "".join(ln[1:] + "\n" for ln in text.splitlines() if ln.startswith("+") and not ln.startswith("+++"))
    for g in guards:
        patched = (tree / g.file).read_text()
        assert xlatest_guards.mutate(patched, g) != patched, g.name
        assert re.sub(r"\s+", " ", g.find).strip() in re.sub(r"\s+", " ", added), g.name


@pytest.mark.slow
def test_dry_run_for_jax_0_9_0_1_applies_the_xla_variant(tmp_path, capsys):
    work = tmp_path / "work"
    assert bj.main(["--dry-run", "--jax-version", "0.9.0.1", "--work-dir", str(work)]) == 0
    out = capsys.readouterr().out
    assert f"xla series default, variant for jax-v0.9.0.1: {V0901}\n" in out
    prepare = next(ln for ln in out.splitlines() if "[prepare] copy <xla source>" in ln)
    assert prepare.endswith(f"git apply patches/{V0901}")
    assert f"git apply patches/{OWN}" not in out  # the main-line file is not applied to jax 0.9.0.1's XLA
    assert not work.exists()
    # the default pin keeps the series' own file
    assert bj.main(["--dry-run", "--work-dir", str(work)]) == 0
    assert f"git apply patches/{OWN}" in capsys.readouterr().out


def test_prepare_refuses_the_xla_variant_on_another_xla_commit(tmp_path):
    ctx = Ctx(work=tmp_path, jax_version="0.9.0.1")
    stages.check_base_commit(ctx, "xla", BB760)
    with pytest.raises(HarnessError, match="the xla variant for jax-v0.9.0.1 was made for xla bb760b047bdb"):
        stages.check_base_commit(ctx, "xla", "3cc8846c10052cc1c32c4db87866eac4e4cdbccd")


def _verdict(log: str) -> tuple[int, int] | None:
    m = re.search(r"^== instruction_fusion_test: \w+: (\d+) tests, (\d+) failed", log, re.M)
    return (int(m.group(1)), int(m.group(2))) if m else None


def test_every_recorded_default_base_agrees_with_its_logs():
    """[[upstream.xla.bases]] of the default series: the flags say what the committed logs say, a
    variant's run applied the variant's file, and the logs name the base's commit."""
    for b in (b for b in XLA.bases if b.series == "default"):
        log = (ROOT / b.evidence).read_text()
        assert f"at XLA commit {b.commit}" in log, b.evidence
        files = [p.file for p in XLA.select("default", b.variant or None)]
        assert f"series default: {', '.join(files)}\n" in log, b.evidence
        verdict = _verdict(log)
        assert b.compiles == (verdict is not None), b.evidence
        assert b.tests_pass == (verdict is not None and verdict[1] == 0 and log.rstrip().endswith("exit 0"))
        folder = (ROOT / b.evidence).parent
        stock = _verdict((folder / "xla-test-stock.log").read_text())
        assert stock is not None and stock[1] > 0  # the new tests need the change
        mutants = re.search(r"^xla-mutants: (\d+) mutants, (\d+) killed, 0 survived", (folder / "xla-mutants.log")
                            .read_text(), re.M)
        assert mutants and mutants.group(1) == mutants.group(2), folder
