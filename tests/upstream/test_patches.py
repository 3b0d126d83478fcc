"""Patch series: schema, application checks, model/patch consistency, PR bundle."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from xla_harness.cli import main
from xla_harness.errors import HarnessError
from xla_harness.hlo import alias
from xla_harness.hlo.parser import parse_module
from xla_harness.upstream.patchfile import parse_patch, preimage_tree
from xla_harness.upstream.series import load_series

from ..helpers import git_am

ROOT = Path(__file__).resolve().parents[2]
PATCHES = ROOT / "patches"
P0 = PATCHES / "xla" / "0001-instruction-fusion-no-data-moving-producer-into-in-place-scatter.patch"
P1 = PATCHES / "xla" / "0002-experimental-alias-info-trace-bitcast-equivalent-transpose-reshape.patch"
P2 = PATCHES / "xla" / "0003-experimental-trace-all-transpose-reshape.patch"


# ----------------------------------------------------------------------------- schema


def test_series_toml_is_valid():
    s = load_series()
    xla = s.upstream("xla")
    assert [p.series for p in xla.patches] == ["default", "experimental", "experimental"]
    assert [p.file for p in xla.select("default")] == [P0.relative_to(PATCHES).as_posix()]
    assert [p.file for p in xla.select("experimental")] == [p.relative_to(PATCHES).as_posix() for p in (P0, P1, P2)]
    assert xla.patches[0].bazel_targets == ("//xla/service:instruction_fusion_test",)
    assert all(p.bazel_targets == ("//xla/hlo/analysis:alias_info_test",) for p in xla.patches[1:])
    assert re.search(r"@ [0-9a-f]{40}", xla.checked_against)
    # every base named in checked_against has its recorded run, default series included
    recorded = {b.commit for b in xla.bases if b.series == "default"}
    assert recorded and recorded == set(re.findall(r"@ ([0-9a-f]{40})", xla.checked_against))
    for b in xla.bases:
        assert b.command.startswith("make xla-test") and b.commit[:10] in b.command
        if b.series == "default":
            assert b.applies and b.compiles and b.tests_pass
        assert (ROOT / b.evidence).is_file(), b.evidence  # every recorded run has its log
    assert re.fullmatch(r"[0-9a-f]{64}", s.upstream("jax").base_sha256)
    assert s.fingerprint("xla", "default") != s.fingerprint("xla", "experimental")


GOOD = """schema = 1
[upstream.xla]
clone_url = "https://example.invalid/xla.git"
base = "b"
base_ref = "r"
[[upstream.xla.patches]]
file = "xla/0001-x.patch"
purpose = "p"
series = "default"
status = "s"
"""


@pytest.mark.parametrize("mutate,needle", [
    (lambda t: t.replace("schema = 1", "schema = 2"), "'schema = 1' is required"),
    (lambda t: t.replace('series = "default"', 'series = "stable"'), "series must be one of"),
    (lambda t: t.replace('purpose = "p"\n', ""), "'purpose' must be a non-empty string"),
    (lambda t: t.replace("[upstream.xla]", "[upstream.llvm]").replace("upstream.xla.patches", "upstream.llvm.patches"),
     "unknown upstream"),
    (lambda t: t + "\n[oops\n", "malformed TOML"),
    (lambda t: t.replace("0001-x.patch", "0009-missing.patch"), "patch file xla/0009-missing.patch is missing"),
    (lambda t: t.replace('base_ref = "r"\n', 'base_ref = "r"\nbases = [1]\n'), "'bases' must be an array of tables"),
    (lambda t: t.replace('base_ref = "r"\n', 'base_ref = "r"\nvariants = "v"\n'),
     "'variants' must be an array of tables"),
])
def test_series_schema_errors(tmp_path, mutate, needle):
    (tmp_path / "xla").mkdir()
    (tmp_path / "xla" / "0001-x.patch").write_text("")
    f = tmp_path / "series.toml"
    f.write_text(GOOD)
    load_series(f)  # the unmutated file is valid
    f.write_text(mutate(GOOD))
    with pytest.raises(HarnessError, match=re.escape(needle)):
        load_series(f)


BASE = """
[[upstream.xla.bases]]
commit = "131bf41acb4650e4391a640c3f1859c1c86ad74b"
what = "w"
series = "default"
applies = true
compiles = true
tests_pass = false
command = "make xla-test XLA_SRC=x"
"""


@pytest.mark.parametrize("mutate,needle", [
    (lambda t: t.replace("tests_pass = false", 'tests_pass = "no"'), "'tests_pass' must be true or false"),
    (lambda t: t.replace("131bf41acb4650e4391a640c3f1859c1c86ad74b", "131bf41a"), "40 lowercase hex digits"),
    (lambda t: t.replace('series = "default"\napplies', 'series = "nightly"\napplies'), "series must be one of"),
    (lambda t: t.replace('command = "make xla-test XLA_SRC=x"', ""), "'command' must be a non-empty string"),
])
def test_series_bases_schema(tmp_path, mutate, needle):
    (tmp_path / "xla").mkdir()
    (tmp_path / "xla" / "0001-x.patch").write_text("")
    f = tmp_path / "series.toml"
    f.write_text(GOOD + BASE)
    (base,) = load_series(f).upstream("xla").bases
    assert (base.applies, base.compiles, base.tests_pass, base.evidence) == (True, True, False, "")
    f.write_text(mutate(GOOD + BASE))
    with pytest.raises(HarnessError, match=re.escape(needle)):
        load_series(f)


# ----------------------------------------------------------------------------- variants per base

JAX_VARIANTS = ("jax-v0.9.0.1", "jax-v0.10.2", "jax-v0.11.0")


def test_jax_series_has_a_variant_for_each_release_users_run():
    s = load_series()
    jax = s.upstream("jax")
    assert jax.base_refs() == ("jax-v0.12.0.1", *JAX_VARIANTS)
    own = [p.file for p in jax.select("default")]
    assert [p.file for p in jax.select("default", "jax-v0.12.0.1")] == own
    fps = {s.fingerprint("jax", "default", r) for r in jax.base_refs()}
    assert len(fps) == 4  # each base applies its own files
    for ref in JAX_VARIANTS:
        files = [p.file for p in jax.select("default", ref)]
        version = ref.removeprefix("jax-")
        assert files[0] == f"jax/{version}/0001-zero-cotangent-masking.patch"
        assert files[1:] == own[1:]  # 0002 and 0003 apply unchanged there
        assert f"X-Base-Ref: {ref}\n" in (PATCHES / files[0]).read_text()
        v = jax.variant(ref)
        assert v is not None and re.fullmatch(r"[0-9a-f]{64}", v.base_sha256) and len(v.commit) == 40
    with pytest.raises(HarnessError, match=r"no jax series for jax-v0\.9\.2: it exists for jax-v0\.12\.0\.1, "):
        jax.select("default", "jax-v0.9.2")


def test_every_jax_variant_has_its_recorded_runs():
    """series.toml's [[upstream.jax.bases]] say what ran on each variant's base; the committed logs agree."""
    jax = load_series().upstream("jax")
    for v in jax.variants:
        version = v.base_ref.removeprefix("jax-v")
        (b,) = [b for b in jax.bases if b.variant == v.base_ref]
        assert b.commit == v.commit and b.series == "default"
        assert b.command == f"make patches-jax-check JAX_PIN={version}"
        apply_log = (ROOT / f"results/jax/{version}/apply-check.log").read_text()
        check_log = (ROOT / b.evidence).read_text()
        assert b.evidence == f"results/jax/{version}/patches-jax-check.log"
        assert f"jax-v{version} = {v.commit}" in apply_log
        applies = apply_log.split("\n\n")[1].rstrip().endswith("exit 0")  # the variant's git apply --check
        assert b.applies == applies
        built = (f"built .venv-jax{version}-patched: stock jaxlib {version} + jax {version} with "
                 f"jax/v{version}/0001-zero-cotangent-masking.patch\n")  # the variant's file, not 0.12.0.1's
        assert b.compiles == (built in check_log)
        assert b.tests_pass == check_log.rstrip().endswith("exit 0")
        assert b.applies and b.compiles and b.tests_pass, v.base_ref


VARIANT_SERIES = """schema = 1
[upstream.jax]
clone_url = "https://example.invalid/jax.git"
base = "b"
base_ref = "jax-v2"
[[upstream.jax.patches]]
file = "jax/0001-a.patch"
purpose = "p"
series = "default"
status = "s"
[[upstream.jax.patches]]
file = "jax/0002-b.patch"
purpose = "p"
series = "experimental"
status = "s"
[[upstream.jax.variants]]
base_ref = "jax-v1"
adapted = "0001 context"
files = ["jax/v1/0001-a.patch"]
"""
VARIANT_PATCH = "From 0 Mon Sep 17 00:00:00 2001\nSubject: [PATCH] a\nX-Base-Ref: jax-v1\n\nbody\n---\n"


def _variant_tree(tmp_path, text=VARIANT_SERIES, patch=VARIANT_PATCH):
    (tmp_path / "jax/v1").mkdir(parents=True)
    for f in ("jax/0001-a.patch", "jax/0002-b.patch"):
        (tmp_path / f).write_text("Subject: [PATCH] own\n\n---\n")
    (tmp_path / "jax/v1/0001-a.patch").write_text(patch)
    (tmp_path / "series.toml").write_text(text)
    return tmp_path / "series.toml"


def test_variant_selection(tmp_path):
    s = load_series(_variant_tree(tmp_path))
    jax = s.upstream("jax")
    assert [p.file for p in jax.select("default", "jax-v1")] == ["jax/v1/0001-a.patch"]
    assert [p.file for p in jax.select("experimental", "jax-v2")] == ["jax/0001-a.patch", "jax/0002-b.patch"]
    assert jax.select("default", "jax-v1")[0].purpose == "p"  # the series' entry, with the variant's file
    # an experimental patch with no version for the base: that series is not available there
    with pytest.raises(HarnessError, match="experimental series of jax is not available for jax-v1: "
                                           "its variant has no version of jax/0002-b.patch"):
        jax.select("experimental", "jax-v1")
    with pytest.raises(HarnessError, match=re.escape("series.toml has no jax series for jax-v3: it exists for "
                                                     "jax-v2, jax-v1")):
        jax.select("default", "jax-v3")
    assert s.fingerprint("jax", "default", "jax-v1") != s.fingerprint("jax", "default", "jax-v2")


@pytest.mark.parametrize("mutate,patch,needle", [
    # a variant file made for another base is refused, and so is one that names no base
    (None, VARIANT_PATCH.replace("jax-v1", "jax-v0"), "jax/v1/0001-a.patch says X-Base-Ref: jax-v0, but is "
                                                      "declared for jax-v1"),
    (None, VARIANT_PATCH.replace("X-Base-Ref: jax-v1\n", ""), "jax/v1/0001-a.patch (variant for jax-v1) has no "
                                                              "'X-Base-Ref: jax-v1' in its header"),
    # the header counts only in the mail header, not in the message or the diff
    (None, VARIANT_PATCH.replace("X-Base-Ref: jax-v1\n\nbody", "\nX-Base-Ref: jax-v1\nbody"), "has no"),
    (lambda t: t.replace('files = ["jax/v1/0001-a.patch"]', 'files = ["jax/v1/0002-a.patch"]'),
     None, "no file for jax/0001-a.patch"),
    (lambda t: t.replace('files = ["jax/v1/0001-a.patch"]', 'files = ["jax/v1/0001-a.patch", "jax/v1/0003-c.patch"]'),
     None, "jax/v1/0003-c.patch is not a patch of the series"),
    (lambda t: t.replace('files = ["jax/v1/0001-a.patch"]', 'files = ["jax/v1/0002-b.patch", "jax/v1/0001-a.patch"]'),
     None, "no file for jax/0001-a.patch"),  # out of order
    (lambda t: t.replace('base_ref = "jax-v1"', 'base_ref = "jax-v2"'), None, "is already the series' own base"),
    (lambda t: t + t[t.index("[[upstream.jax.variants]]"):], None, "is already another variant's"),
    (lambda t: t.replace('adapted = "0001 context"\n', ""), None, "'adapted' must be a non-empty string"),
    (lambda t: t.replace('adapted =', 'base_sha256 = "abc"\nadapted ='), None, "64 lowercase hex digits"),
    (lambda t: t.replace('adapted =', 'commit = "abc"\nadapted ='), None, "40 lowercase hex digits"),
    (lambda t: t.replace("jax/v1/0001-a.patch", "jax/v9/0001-a.patch"), None,
     "variant jax-v1: patch file jax/v9/0001-a.patch is missing"),
    (lambda t: t + BASE.replace("xla", "jax") + 'variant = "jax-v9"\n', None,
     "variant 'jax-v9' is not a variant of the series"),
])
def test_variant_schema_errors(tmp_path, mutate, patch, needle):
    good = _variant_tree(tmp_path / "good")
    load_series(good)
    bad = _variant_tree(tmp_path / "bad", mutate(VARIANT_SERIES) if mutate else VARIANT_SERIES,
                        patch if patch is not None else VARIANT_PATCH)
    with pytest.raises(HarnessError, match=re.escape(needle)):
        load_series(bad)


def test_a_file_of_the_series_naming_another_base_is_refused(tmp_path):
    f = _variant_tree(tmp_path)
    (tmp_path / "jax/0001-a.patch").write_text("Subject: [PATCH] own\nX-Base-Ref: jax-v1\n\n---\n")
    with pytest.raises(HarnessError, match="jax/0001-a.patch says X-Base-Ref: jax-v1, but is declared for jax-v2"):
        load_series(f)
    # a variant may reuse the series' own file where it applies unchanged: no header needed
    (tmp_path / "jax/0001-a.patch").write_text("Subject: [PATCH] own\n\n---\n")
    f.write_text(VARIANT_SERIES.replace('"jax/v1/0001-a.patch"', '"jax/0001-a.patch"'))
    assert [p.file for p in load_series(f).upstream("jax").select("default", "jax-v1")] == ["jax/0001-a.patch"]


# ----------------------------------------------------------------------------- applying


def _tree_for(tmp_path, *patches):
    """A tree the patches apply to in order: per file, the pre-images of every patch touching
    it, one after the other (a later patch's pre-image holds the earlier patches' output)."""
    tree = tmp_path / "tree"
    for i, p in enumerate(patches):
        part = tmp_path / f"pre{i}"
        preimage_tree(p.read_text(), part)
        for f in part.rglob("*"):
            if f.is_file():
                dst = tree / f.relative_to(part)
                dst.parent.mkdir(parents=True, exist_ok=True)
                with dst.open("a") as out:
                    out.write(f.read_text())
    return tree


@pytest.mark.slow
def test_patches_check_applies_in_order(tmp_path, capsys):
    tree = _tree_for(tmp_path, P0, P1, P2)
    assert main(["patches-check", "--xla-src", str(tree), "--series", "experimental"]) == 0
    out = capsys.readouterr().out
    assert "xla: applies: xla/0001" in out and "xla: applies: xla/0002" in out and "xla: applies: xla/0003" in out
    assert "jax: not checked" in out


def test_patches_check_without_tree_is_not_a_pass(capsys):
    assert main(["patches-check"]) == 2
    captured = capsys.readouterr()
    assert "applies" not in captured.out
    assert captured.err.startswith("error: patches-check: no source tree given")


@pytest.mark.slow
def test_patch_that_does_not_apply_names_patch_and_hunk(tmp_path, capsys):
    tree = _tree_for(tmp_path, P0)
    cc = tree / "xla/service/instruction_fusion.cc"
    cc.write_text(cc.read_text().replace("non-elementwise ops, bailing", "non-elementwise ops, renamed"))
    assert main(["patches-check", "--xla-src", str(tree)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith("error: xla/0001-instruction-fusion") and "hunk #" in err[0]
    assert "instruction_fusion.cc" in err[0]
    # the given tree itself is never modified
    assert "renamed" in cc.read_text()


def test_patches_check_bad_tree(tmp_path, capsys):
    assert main(["patches-check", "--xla-src", str(tmp_path / "nope")]) == 2
    assert "is not a directory" in capsys.readouterr().err


def test_parse_patch_hunks():
    assert {h.file for h in parse_patch(P0.read_text())} == {
        "xla/hlo/analysis/alias_info.h", "xla/service/BUILD", "xla/service/instruction_fusion.cc",
        "xla/service/instruction_fusion_test.cc"}
    hunks = parse_patch(P1.read_text())
    files = {h.file for h in hunks}
    assert files == {"xla/hlo/analysis/alias_info.h", "xla/hlo/analysis/alias_info.cc",
                     "xla/hlo/analysis/alias_info_test.cc"}
    assert all(h.number >= 1 and h.preimage for h in hunks)


# ----------------------------------------------------------------------------- consistency

_TEST_RE = re.compile(
    r'TEST_F\(GetInPlaceInputOutputPairsTest, (LayoutAware\w+)\) \{\n'
    r'  const char\* const kHlo = R"\(\n(.*?)\n\)";\n(.*?)\n\}\n', re.S)
_PAIR_RE = re.compile(r"expected_pairs\.push_back\(\{HloOperandIndex\{(\d+), \{([\d, ]*)\}\}, \{([\d, ]*)\}\}\);")


def _ints(text):
    return tuple(int(x) for x in text.split(",") if x.strip())


def _cpp_cases(test_source: str):
    cases = {}
    for name, hlo, body in _TEST_RE.findall(test_source):
        pairs = [(int(a), _ints(b), _ints(c)) for a, b, c in _PAIR_RE.findall(body)]
        cases[name] = (hlo, pairs)
    return cases


def _patched_test_file(tmp_path, patches):
    tree = tmp_path / "tree"
    preimage_tree(patches[0].read_text(), tree)  # the later patches apply on top of the first
    subprocess.run(["git", "init", "-q"], cwd=tree, check=True)
    for p in patches:
        subprocess.run(["git", "apply", str(p)], cwd=tree, check=True, capture_output=True)
    return (tree / "xla/hlo/analysis/alias_info_test.cc").read_text()


@pytest.mark.slow
@pytest.mark.parametrize("patches,policy", [((P1,), "layout-aware"), ((P1, P2), "proposed")])
def test_cpp_tests_match_python_model(tmp_path, patches, policy):
    cases = _cpp_cases(_patched_test_file(tmp_path, patches))
    fixtures = sorted((ROOT / "tests" / "hlo").glob("*.hlo"))
    assert len(cases) == 13  # 0002's tests cover the 13 fixtures that existed when it was made
    for name, (hlo, expected) in cases.items():
        mod = parse_module(hlo, name)
        fusion = mod.entry.by_name["fusion"]
        got = [(p.operand_index, p.operand_shape_index, p.output_index)
               for p in alias.fusion_in_place_pairs(alias.analyze(mod), fusion, policy)]
        assert got == expected, name
    # The C++ modules are the fixtures, byte for byte.
    texts = {hlo for hlo, _ in cases.values()}
    assert texts <= {f.read_text().rstrip("\n") for f in fixtures}


@pytest.mark.slow
def test_experimental_patch_changes_exactly_the_hazard_fixtures(tmp_path):
    base = _cpp_cases(_patched_test_file(tmp_path / "a", (P1,)))
    exp = _cpp_cases(_patched_test_file(tmp_path / "b", (P1, P2)))
    changed = sorted(n for n in base if base[n][1] != exp[n][1])
    assert changed == ["LayoutAwareReshapeMovesData", "LayoutAwareTpuTiledLayouts",
                       "LayoutAwareTransposeBitcastReshape", "LayoutAwareTransposeMovesData"]


# ----------------------------------------------------------------------------- PR bundle


@pytest.mark.slow
def test_pr_bundle_for_xla(tmp_path, capsys):
    out = tmp_path / "pr"
    assert main(["pr", "--target", "xla", "--out", str(out)]) == 0
    mbox = (out / "series.mbox").read_text()
    assert mbox.startswith("From ") and "\nSubject: [PATCH] [XLA] Do not fuse a data-moving producer" in mbox
    assert "\nDate: " in mbox and "diff --git a/xla/service/instruction_fusion.cc" in mbox
    assert "EXPERIMENTAL" not in mbox  # experimental patches are not sent
    assert "## What this refuses, and why" in (out / "PR.md").read_text()  # tests/upstream/test_pr_xla.py has the rest
    desc = (out / "APPENDIX.md").read_text()  # the evidence, in the long form
    for heading in ("## Problem", "## Root cause", "## Why this fix and not the reported one",
                    "## Tests added", "## Evidence", "## Risk", "## How to reproduce"):
        assert heading in desc
    assert "//xla/service:instruction_fusion_test" in desc
    assert "https://github.com/openxla/xla/pull/38607" in desc.split("## Root cause")[0]  # the review, up front
    assert "## What was run where" in desc and "not run" in desc.lower()
    # the committed xla-test logs are cited with their verdicts, per base (tests/upstream/test_pr_xla.py has the rest)
    for b in load_series().upstream("xla").bases:
        assert b.commit[:12] in desc
    assert re.search(r"^\| \w{10} \| .* \| \d+/\d+ pass \| \d+ of \d+ fail \| \d+/\d+ killed \|", desc, re.M)
    assert "Stress tables" not in desc  # CPU stress runs say nothing about a fusion decision
    assert "- [ ]" in (out / "CHECKLIST.md").read_text()
    # The mbox is what git am takes.
    am = git_am(P0.read_text(), out / "series.mbox", tmp_path / "am")
    assert am.returncode == 0, am.stderr


def test_pr_without_patches_and_without_evidence(tmp_path, capsys):
    series = tmp_path / "series.toml"
    series.write_text((PATCHES / "series.toml").read_text().split("[upstream.tensorflow]")[0])
    (tmp_path / "xla").symlink_to(PATCHES / "xla")
    (tmp_path / "jax").symlink_to(PATCHES / "jax")
    assert main(["pr", "--target", "tensorflow", "--out", str(tmp_path / "o"), "--series-file", str(series)]) == 2
    assert capsys.readouterr().err.startswith("error: series.toml has no upstream 'tensorflow'")
    empty = tmp_path / "results"
    empty.mkdir()
    assert main(["pr", "--target", "xla", "--out", str(tmp_path / "p"), "--results", str(empty)]) == 0
    desc = (tmp_path / "p" / "APPENDIX.md").read_text()
    assert "Not recorded (these runs are missing" in desc and "results/xla/183fa00cb5/xla-test.log" in desc
    assert "- not recorded" in (tmp_path / "p" / "PR.md").read_text()  # no blast radius: said so


@pytest.mark.slow
def test_make_pr_from_a_fresh_copy(tmp_path):
    """`make pr TARGET=xla` works from the checkout (setup already done by the test run)."""
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    res = subprocess.run(["make", "-s", "pr", "TARGET=xla", f"OUT={tmp_path}"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "pr" / "xla" / "PR.md").is_file()
