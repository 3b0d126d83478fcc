"""make xla-test on one machine twice: each run has its own work tree (never shared, never
deleted by the other), objects are still shared by content, and a partial XLA_SRC can be made
from the file list the tool prints (the list the docs show)."""

import os
import subprocess
from pathlib import Path

import pytest

from xla_harness.errors import HarnessError
from xla_harness.upstream import xlatest, xlatest_build, xlatest_plan
from xla_harness.upstream.patchfile import preimage_tree
from xla_harness.upstream.series import load_series

ROOT = Path(__file__).resolve().parents[2]
SERIES = load_series()


def _dead_pid() -> int:
    """A pid no process has: one above the kernel's largest."""
    pid_max = Path("/proc/sys/kernel/pid_max")
    return (int(pid_max.read_text()) if pid_max.is_file() else 4194304) + 1


def test_each_run_gets_its_own_folder_and_shares_the_object_cache(tmp_path):
    work = tmp_path / "xla-test"
    a, b = xlatest_build.new_run_dir(work), xlatest_build.new_run_dir(work)
    assert a != b and a.parent == b.parent == work / "runs"
    assert a.name.startswith(f"{os.getpid()}-")
    for run in (a, b):
        assert (run / "obj").resolve() == (work / "obj").resolve()
    (a / "tree").mkdir()
    (a / "tree" / "f.cc").write_text("a")
    xlatest_build.new_run_dir(work)  # a third run leaves the two live ones alone
    assert (a / "tree" / "f.cc").read_text() == "a" and b.is_dir()


def test_a_folder_left_by_a_dead_run_is_removed(tmp_path):
    work = tmp_path / "xla-test"
    stale = work / "runs" / f"{_dead_pid()}-left"
    (stale / "tree").mkdir(parents=True)
    unnamed = work / "runs" / "not-a-run"
    unnamed.mkdir()
    xlatest_build.new_run_dir(work)
    assert not stale.exists()
    assert unnamed.is_dir()  # only folders named by a pid are judged


def _fake_compiler(monkeypatch) -> list[list[str]]:
    calls: list[list[str]] = []

    def run(argv, **kw):
        calls.append(argv)
        Path(argv[argv.index("-o") + 1]).write_bytes(b"obj")
        return subprocess.CompletedProcess(argv, 0, "", "")

    monkeypatch.setattr(xlatest_build.subproc, "run", run)
    return calls


def _toolchain(run: Path) -> xlatest_plan.Toolchain:
    (run / "tree" / "xla").mkdir(parents=True, exist_ok=True)
    (run / "tree" / "xla" / "a.h").write_text("// header\n")
    (run / "tree" / "xla" / "a.cc").write_text('#include "xla/a.h"\n')
    return xlatest_plan.Toolchain("g++", run / "tree", run / "whl" / "include", run / "whl")


def test_objects_are_shared_between_runs_by_content_not_by_folder(tmp_path, monkeypatch):
    calls = _fake_compiler(monkeypatch)
    obj = tmp_path / "obj"
    tc1, tc2 = _toolchain(tmp_path / "runs" / "1-a"), _toolchain(tmp_path / "runs" / "2-b")
    first = xlatest_build.compile_cached(tc1, tc1.tree / "xla" / "a.cc", obj, lambda s: None)
    second = xlatest_build.compile_cached(tc2, tc2.tree / "xla" / "a.cc", obj, lambda s: None)
    assert first == second and len(calls) == 1
    # the temporary output names the process, so two runs never write one file
    assert f".{os.getpid()}.tmp.o" in calls[0][calls[0].index("-o") + 1]
    assert not list(obj.glob("*.tmp.o"))
    (tc2.tree / "xla" / "a.h").write_text("// another header\n")
    third = xlatest_build.compile_cached(tc2, tc2.tree / "xla" / "a.cc", obj, lambda s: None)
    assert third != first and len(calls) == 2


def test_a_failed_run_removes_its_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(xlatest, "check_toolchain", lambda cxx: None)
    monkeypatch.setattr(xlatest, "ensure_wheel", lambda cache: tmp_path / "whl")
    src = tmp_path / "empty-xla"
    src.mkdir()
    # --allow-dirty: whether this checkout has local changes is not what this test is about
    assert xlatest.main(["test", "--xla-src", str(src), "--cache", str(tmp_path / "cache"), "--allow-dirty"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "is not in the XLA tree" in err[0]
    assert list((tmp_path / "cache" / "xla-test" / "runs").iterdir()) == []


def test_files_lists_every_file_a_partial_tree_needs():
    texts = [p.path(SERIES.root).read_text() for p in SERIES.upstream("xla").select("default")]
    files = xlatest_plan.source_files_needed(texts)
    for f in ("xla/hlo/analysis/alias_info.h", "xla/service/BUILD", "xla/service/instruction_fusion.h",
              "xla/service/instruction_fusion.cc", "xla/service/instruction_fusion_test.cc",
              *xlatest_plan.SUPPORT_FILES):
        assert f in files, f
    assert len(files) == len(set(files))


def test_the_docs_list_what_files_prints(capsys):
    assert xlatest.main(["files"]) == 0
    printed = capsys.readouterr().out.split()
    docs = (ROOT / "docs" / "workbench.md").read_text()
    start = docs.index("<!-- xla-src-files -->")
    listed = docs[start:docs.index("<!-- /xla-src-files -->")].split()
    missing = [f for f in printed if f not in listed]
    assert missing == [], f"docs/workbench.md's partial XLA_SRC list lacks {missing}"


def test_files_of_an_unknown_series_is_one_error(capsys):
    assert xlatest.main(["files", "--series", "nope"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "nope" in err[0]


def test_compile_failure_leaves_no_temporary_object(tmp_path, monkeypatch):
    def run(argv, **kw):
        return subprocess.CompletedProcess(argv, 1, "", "a.cc:1: error: nope\n")

    monkeypatch.setattr(xlatest_build.subproc, "run", run)
    tc = _toolchain(tmp_path / "runs" / "1-a")
    with pytest.raises(HarnessError, match="does not compile"):
        xlatest_build.compile_cached(tc, tc.tree / "xla" / "a.cc", tmp_path / "obj", lambda s: None)
    assert not list((tmp_path / "obj").glob("*.o"))


def test_stock_and_sources_from_together_is_one_error(tmp_path, capsys):
    argv = ["test", "--xla-src", str(tmp_path), "--stock-sources", "--sources-from", str(tmp_path)]
    assert xlatest.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: give --stock-sources (STOCK=1) or --sources-from (SOURCES_FROM=dir), not both"]


@pytest.mark.slow
def test_sources_from_puts_another_version_under_the_patched_tests(tmp_path):
    patches = [p.path(SERIES.root) for p in SERIES.upstream("xla").select("default")]
    src = tmp_path / "xla-src"
    preimage_tree(patches[0].read_text(), src)
    (src / "xla/service/instruction_fusion.h").write_text("// header\n")
    other = tmp_path / "other"
    (other / "xla/service").mkdir(parents=True)
    (other / "xla/service/instruction_fusion.cc").write_text("// another version\n")
    units, _ = xlatest_build.prepare_tree(src, patches, tmp_path / "t", tmp_path / "inc", sources_from=other)
    assert (tmp_path / "t/xla/service/instruction_fusion.cc").read_text() == "// another version\n"
    assert "ShouldFuseInPlaceOpForbidsLayoutChangingCopyIntoScatter" in (
        tmp_path / "t/xla/service/instruction_fusion_test.cc").read_text()
    with pytest.raises(HarnessError, match="is not in the --sources-from folder"):
        xlatest_build.prepare_tree(src, patches, tmp_path / "u", tmp_path / "inc", sources_from=tmp_path / "none")


def test_pr_evidence_says_what_each_xla_log_is(tmp_path):
    from xla_harness.upstream import pr

    logs = tmp_path / "results" / "xla" / "abc"
    logs.mkdir(parents=True)
    (logs / "xla-test-stock.log").write_text("== instruction_fusion_test: failed: 3 tests, 1 failed (exit 1)\n")
    (logs / "xla-test.log").write_text("== instruction_fusion_test: passed: 3 tests, 0 failed (exit 0)\n")
    (logs / "xla-other.log").write_text("== instruction_fusion_test: passed: 3 tests, 0 failed (exit 0)\n")
    lines = pr._xla_test_evidence(tmp_path / "results")
    assert lines[0].startswith("`results/xla/abc/xla-other.log`: instruction_fusion_test: passed")
    assert lines[0].endswith("(exit 0)")  # a log of no known kind gets no label
    assert "failed: 3 tests, 1 failed (exit 1) (the patch's tests over stock sources" in lines[1]
    assert lines[2].endswith("(exit 0) (the patched source and its tests)")


# ----------------------------------------------------------------------------- evidence from a clean commit


def _git(repo: Path, *argv: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *argv], capture_output=True, text=True, check=True,
                          timeout=60).stdout.strip()


@pytest.fixture
def planted_checkout(tmp_path, monkeypatch):
    """A git repository standing in for the xla-harness checkout, with one commit and a tracked
    file changed since: what the run's log would record as xla-harness <commit>-dirty."""
    repo = tmp_path / "harness"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "a.py").write_text("x = 1\n")
    _git(repo, "add", "a.py")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "one")
    (repo / "a.py").write_text("x = 2\n")
    monkeypatch.setattr(xlatest_build, "source_checkout", lambda: repo)
    return repo


def _argv(command: str, tmp_path: Path) -> list[str]:
    src = tmp_path / "xla-src"
    src.mkdir(exist_ok=True)
    argv = [command, "--xla-src", str(src), "--cache", str(tmp_path / "cache")]
    if command == "blast-radius":
        (tmp_path / "modules").mkdir(exist_ok=True)
        (tmp_path / "modules" / "m.before_fusion.txt").write_text("HloModule m\n")
        argv += ["--modules", str(tmp_path / "modules")]
    return argv


@pytest.mark.slow
@pytest.mark.parametrize("command", ["test", "mutants", "blast-radius"])
def test_a_checkout_with_local_changes_writes_no_evidence(planted_checkout, tmp_path, monkeypatch, capsys, command):
    reached = []
    monkeypatch.setattr(xlatest, "check_toolchain", lambda cxx: reached.append(cxx))
    assert xlatest.main(_argv(command, tmp_path)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: xla-{command}: the xla-harness checkout ")
    assert "has local changes (M a.py)" in err[0] and "--allow-dirty" in err[0]
    assert reached == []  # refused before anything is built or downloaded


def _stop_at_the_toolchain(cxx: str) -> None:
    raise HarnessError("the toolchain check was reached")


@pytest.mark.slow
@pytest.mark.parametrize("command", ["test", "mutants", "blast-radius"])
def test_allow_dirty_runs_from_a_checkout_with_local_changes(planted_checkout, tmp_path, monkeypatch, capsys,
                                                             command):
    monkeypatch.setattr(xlatest, "check_toolchain", _stop_at_the_toolchain)
    assert xlatest.main([*_argv(command, tmp_path), "--allow-dirty"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == ["error: the toolchain check was reached"]
    head = _git(planted_checkout, "rev-parse", "--short=12", "HEAD")
    assert xlatest_build.tool_versions("g++").endswith(f"; xla-harness {head}-dirty")  # what its log records


@pytest.mark.slow
def test_a_clean_checkout_runs_without_allow_dirty(planted_checkout, tmp_path, monkeypatch, capsys):
    _git(planted_checkout, "checkout", "-q", "--", "a.py")
    (planted_checkout / "untracked.txt").write_text("not part of the commit\n")  # as git describe --dirty
    monkeypatch.setattr(xlatest, "check_toolchain", _stop_at_the_toolchain)
    assert xlatest.main(_argv("test", tmp_path)) == 2
    assert capsys.readouterr().err.strip().splitlines() == ["error: the toolchain check was reached"]
    head = _git(planted_checkout, "rev-parse", "--short=12", "HEAD")
    assert xlatest_build.tool_versions("g++").endswith(f"; xla-harness {head}")
