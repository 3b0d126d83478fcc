"""harness.upstream.jaxlib_build (entry: build/build_jaxlib.py), offline: pin parsing, the plan,
jax repository (our own small files), a local XLA tarball and a fake bazelisk on PATH."""

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from harness.errors import HarnessError
from harness.upstream.patchcheck import preimage_tree

ROOT = Path(__file__).resolve().parent.parent
from harness.upstream import jaxlib_build as bj  # noqa: E402

P1 = ROOT / "patches/xla/0001-alias-info-trace-bitcast-equivalent-transpose-reshape.patch"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


# ----------------------------------------------------------------------------- pure parts


def test_parse_revision_and_workspace_variants():
    revision = f'# To update XLA to a new revision,\nXLA_COMMIT = "{COMMIT}"\nXLA_SHA256 = "{"a" * 64}"\n'
    assert bj.parse_xla_pin(revision) == (COMMIT, "a" * 64)
    workspace = ('load("//third_party:repo.bzl", "tf_http_archive")\n\n'
                 '# Comment mentioning XLA_COMMIT = "ffff"\n'
                 f'XLA_COMMIT = "{COMMIT}"\nXLA_SHA256 = "{"b" * 64}"\n\ndef repo():\n    pass\n')
    assert bj.parse_xla_pin(workspace) == (COMMIT, "b" * 64)
    with pytest.raises(HarnessError, match="no XLA_COMMIT"):
        bj.parse_xla_pin('load("//third_party/xla:revision.bzl", "XLA_COMMIT", "XLA_SHA256")\n')
    # The oldest layout: an inline http_archive in WORKSPACE; a commented-out one is ignored.
    old = ('# local_repository(\n#    name = "xla",\n#    strip_prefix = "xla-ffffffff",\n# )\n'
           f'http_archive(\n    name = "xla",\n    sha256 = "{"c" * 64}",\n    strip_prefix = "xla-{COMMIT}",\n'
           f'    urls = ["https://github.com/openxla/xla/archive/{COMMIT}.tar.gz"],\n)\n')
    assert bj.parse_xla_pin(old, "WORKSPACE") == (COMMIT, "c" * 64)
    with pytest.raises(HarnessError):
        bj.parse_xla_pin("\n".join("# " + ln for ln in old.splitlines()), "WORKSPACE")


def test_find_pin_prefers_revision_bzl_and_skips_a_loading_workspace_bzl(tmp_path):
    (tmp_path / "third_party/xla").mkdir(parents=True)
    (tmp_path / "third_party/xla/workspace.bzl").write_text(
        'load("//third_party/xla:revision.bzl", "XLA_COMMIT", "XLA_SHA256")\n')
    with pytest.raises(HarnessError, match="pins no XLA commit"):
        bj.find_xla_pin(tmp_path, "jax-v9")
    (tmp_path / "third_party/xla/revision.bzl").write_text(f'XLA_COMMIT = "{COMMIT}"\nXLA_SHA256 = "{"d" * 64}"\n')
    assert bj.find_xla_pin(tmp_path, "jax-v9") == (COMMIT, "d" * 64, "third_party/xla/revision.bzl")


def test_plan_argv_cpu_and_cuda(tmp_path):
    cpu = bj.build_argv("py", Path("/x"), "3.12", "/w/bin/bazelisk", Path("/w"), False, "13", Path("/w/dist/a"))
    assert cpu == ["py", "build/build.py", "build", "--wheels=jaxlib", "--local_xla_path=/x",
                   "--python_version=3.12", "--bazel_path=/w/bin/bazelisk",
                   "--bazel_options=--disk_cache=/w/bazel-disk-cache",
                   "--bazel_options=--repository_cache=/w/bazel-repo-cache", "--output_path=/w/dist/a"]
    cuda = bj.build_argv("py", Path("/x"), "3.12", "b", Path("/w"), True, "12", Path("/o"))
    assert "--wheels=jaxlib,jax-cuda-plugin,jax-cuda-pjrt" in cuda and cuda[-1] == "--cuda_major_version=12"
    assert bj.bazel_test_argv("b", ["//t:x"], Path("/w"), "3.12") == [
        "b", "test", "--disk_cache=/w/bazel-disk-cache", "--repository_cache=/w/bazel-repo-cache",
        "--repo_env=HERMETIC_PYTHON_VERSION=3.12", "--test_output=errors", "//t:x"]
    with pytest.raises(HarnessError):
        bj.jax_tag("latest")


def test_lock_file_check(tmp_path):
    (tmp_path / "build").mkdir()
    (tmp_path / "build/requirements_lock_3_12.txt").write_text("")
    (tmp_path / "build/requirements_lock_3_13.txt").write_text("")
    bj.check_lock_file(tmp_path, "3.13")
    with pytest.raises(HarnessError, match=r"no build/requirements_lock for Python 3.11; it builds for 3.12, 3.13"):
        bj.check_lock_file(tmp_path, "3.11")


def test_dry_run_prints_every_stage_and_touches_nothing(tmp_path, capsys):
    work = tmp_path / "work"
    assert bj.main(["--dry-run", "--cuda", "--work-dir", str(work)]) == 0
    out = capsys.readouterr().out
    for stage in bj.STAGES:
        assert f"\n{stage}:" in out or out.startswith(f"{stage}:")
    assert "git clone --depth 1 --branch jax-v0.12.0.1 https://github.com/jax-ml/jax.git" in out
    assert "build/build.py build --wheels=jaxlib,jax-cuda-plugin,jax-cuda-pjrt" in out
    assert "--local_xla_path=" in out and "--cuda_major_version=12" in out
    assert "configure.py --backend=CPU" in out and out.index("preflight:") < out.index("resolve:")
    assert "git apply patches/xla/0001-alias-info" in out
    assert "test --disk_cache=" in out and "//xla/hlo/analysis:alias_info_test" in out
    assert not work.exists()


# ----------------------------------------------------------------------------- fakes

FAKE_BUILD = r'''
import json, os, pathlib, subprocess, sys
args = sys.argv[1:]
with open(os.environ["FAKE_RECORD"], "a") as f:
    f.write(json.dumps({"tool": "build.py", "argv": args, "cwd": os.getcwd()}) + "\n")
get = lambda k: next(a.split("=", 1)[1] for a in args if a.startswith(k + "="))
subprocess.run([get("--bazel_path"), "build", "//jaxlib/tools:jaxlib_wheel"], check=True)
# What jax's build.py leaves in its tree: the bazelrc it writes and Bazel's symlinks.
pathlib.Path(".jax_configure.bazelrc").write_text("build --repo_env=X=1\n")
if not os.path.lexists("bazel-bin"):
    os.symlink(os.environ["FAKE_RECORD"], "bazel-bin")
out = pathlib.Path(get("--output_path"))
out.mkdir(parents=True, exist_ok=True)
(out / "jaxlib-0.12.0.1.dev0+selfbuilt-cp312-cp312-linux_x86_64.whl").write_bytes(b"not a real wheel")
sys.exit(1 if os.environ.get("FAKE_BUILD_FAIL") else 0)
'''

FAKE_BAZELISK = r'''#!{python}
import json, os, sys
with open(os.environ["FAKE_RECORD"], "a") as f:
    f.write(json.dumps({{"tool": "bazelisk", "argv": sys.argv[1:], "cwd": os.getcwd(),
                        "USE_BAZEL_VERSION": os.environ.get("USE_BAZEL_VERSION")}}) + "\n")
print("bazel 7.7.0")
'''


def _git(cwd, *args):
    subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", *args], cwd=cwd, check=True,
                   capture_output=True)


@pytest.fixture
def world(tmp_path, monkeypatch):
    """A fake jax repo tagged jax-v0.12.0.1, an XLA tarball the series applies to, a fake bazelisk."""
    xla_dir = tmp_path / "xla-src" / f"xla-{COMMIT}"
    preimage_tree(P1.read_text(), xla_dir)
    (xla_dir / "README.md").write_text("fake xla\n")
    (xla_dir / ".bazelversion").write_text("7.4.1\n")  # XLA pins its own Bazel, unlike jax's
    (xla_dir / "configure.py").write_text(
        "import pathlib, sys\npathlib.Path('xla_configure.bazelrc').write_text(' '.join(sys.argv[1:]))\n")
    tarball = tmp_path / f"xla-{COMMIT}.tar.gz"
    with tarfile.open(tarball, "w:gz") as tf:
        tf.add(xla_dir, arcname=f"xla-{COMMIT}")
    sha = hashlib.sha256(tarball.read_bytes()).hexdigest()

    jax = tmp_path / "jax-repo"
    for patch in sorted((ROOT / "patches/jax").glob("*.patch")):  # sources the jax series applies to
        preimage_tree(patch.read_text(), jax)
    (jax / "third_party/xla").mkdir(parents=True)
    (jax / "build").mkdir()
    (jax / "third_party/xla/revision.bzl").write_text(f'XLA_COMMIT = "{COMMIT}"\nXLA_SHA256 = "{sha}"\n')
    (jax / ".bazelversion").write_text("7.7.0\n")
    (jax / "build/build.py").write_text(FAKE_BUILD)
    for v in ("3_12", "3_13", "3_14"):  # the Pythons jax's hermetic build has locks for
        (jax / f"build/requirements_lock_{v}.txt").write_text("")
    _git(jax, "init", "-q")
    _git(jax, "add", "-A")
    _git(jax, "commit", "-qm", "fake jax")
    _git(jax, "tag", "jax-v0.12.0.1")

    bindir = tmp_path / "bin"
    bindir.mkdir()
    fake = bindir / "bazelisk"
    fake.write_text(FAKE_BAZELISK.format(python=sys.executable))
    fake.chmod(0o755)
    record = tmp_path / "record.jsonl"
    monkeypatch.setenv("FAKE_RECORD", str(record))
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    args = ["--work-dir", str(tmp_path / "work"), "--jax-repo", str(jax),
            "--xla-url", f"file://{tmp_path}/xla-{{commit}}.tar.gz", "--min-free-gb", "0"]
    return {"tmp": tmp_path, "args": args, "record": record, "jax": jax, "work": tmp_path / "work",
            "tarball": tarball}


def _records(world):
    return [json.loads(x) for x in world["record"].read_text().splitlines()] if world["record"].exists() else []


def test_stages_end_to_end_with_fake_tools(world, capsys):
    assert bj.main([*world["args"], "--to", "build"]) == 0
    out = capsys.readouterr().out
    assert [ln.split(":")[0] for ln in out.splitlines()] == ["resolve", "fetch", "prepare", "bazel", "build"]
    work = world["work"]
    tree = next((work / "trees").glob("xla-0123456789ab-*"))
    # The default series really was applied to the fetched XLA sources.
    assert "IsNoOpForAliasAnalysis(\n    const HloInstruction* instruction) const {" in \
        (tree / "xla/hlo/analysis/alias_info.cc").read_text()
    recs = _records(world)
    build = next(r for r in recs if r["tool"] == "build.py")
    assert build["argv"][:2] == ["build", "--wheels=jaxlib"]
    assert f"--local_xla_path={tree}" in build["argv"]
    assert any(a.startswith("--bazel_options=--disk_cache=") for a in build["argv"])
    bazel_calls = [r for r in recs if r["tool"] == "bazelisk"]
    assert {r["USE_BAZEL_VERSION"] for r in bazel_calls} == {"7.7.0"}  # jax's .bazelversion respected
    assert ["build", "//jaxlib/tools:jaxlib_wheel"] in [r["argv"] for r in bazel_calls]

    # Resume: everything is stamped, nothing runs again.
    n = len(_records(world))
    assert bj.main([*world["args"], "--to", "build"]) == 0
    out = capsys.readouterr().out
    assert set(out.split()) >= {"resolve:", "skipped"} and "done" not in out
    assert len(_records(world)) == n
    # Changing the series redoes prepare and what follows, not resolve/fetch.
    assert bj.main([*world["args"], "--to", "build", "--series", "experimental"]) == 0
    lines = dict(ln.split(": ") for ln in capsys.readouterr().out.splitlines())
    assert lines == {"resolve": "skipped", "fetch": "skipped", "prepare": "done", "bazel": "done",
                     "build": "done"}
    assert len(list((work / "trees").glob("xla-*"))) == 2  # one clean tree per series fingerprint


def test_test_stage_runs_bazel_test_and_harness(world, capsys, tmp_path):
    assert bj.main([*world["args"], "--to", "build"]) == 0
    # The install stage needs real wheels; stand in for it with this project's own venv.
    stamp = world["work"] / "stamps" / "install.json"
    stamp.write_text(json.dumps({"inputs": "x", "outputs": {"venv": str(Path(sys.executable).parent.parent)}}))
    res = tmp_path / "results"
    rc = bj.main([*world["args"], "--from", "test", "--harness-tests", "tests/test_stats.py",
                  "--stress-steps", "1", "--results", str(res)])
    assert rc == 0, capsys.readouterr().err
    test_calls = [r["argv"] for r in _records(world) if r["tool"] == "bazelisk" and r["argv"][:1] == ["test"]]
    assert test_calls and test_calls[0][-1] == "//xla/hlo/analysis:alias_info_test"
    test_rec = next(r for r in _records(world) if r["tool"] == "bazelisk" and r["argv"][:1] == ["test"])
    xla_tree = Path(test_rec["cwd"])
    assert xla_tree.name.startswith("xla-") and test_rec["USE_BAZEL_VERSION"] == "7.4.1"  # XLA's, not jax's
    assert (xla_tree / "xla_configure.bazelrc").read_text() == "--backend=CPU"
    assert list(res.glob("default-cpu-*/stress.jsonl"))


def test_sha_mismatch_is_refused(world, capsys):
    world["tarball"].write_bytes(world["tarball"].read_bytes() + b"tampered")
    assert bj.main([*world["args"], "--to", "fetch"]) == 2
    err = [ln for ln in capsys.readouterr().err.strip().splitlines() if not ln.startswith("[")]
    assert len(err) == 1 and err[0].startswith("error: fetch: sha256 mismatch")
    assert not (world["work"] / "stamps" / "fetch.json").exists()
    assert not list((world["work"] / "src").glob("*.partial"))


def test_no_network_is_one_error_line(world, capsys):
    args = [a if not a.startswith("file://") else "file:///nonexistent/xla-{commit}.tar.gz" for a in world["args"]]
    assert bj.main([*args, "--to", "fetch"]) == 2
    assert "error: fetch: cannot download" in capsys.readouterr().err


def test_prepare_refuses_a_dirty_tree(world, capsys):
    assert bj.main([*world["args"], "--to", "prepare"]) == 0
    tree = next((world["work"] / "trees").glob("xla-*"))
    (tree / "README.md").write_text("local edit\n")
    (world["work"] / "stamps" / "prepare.json").unlink()
    capsys.readouterr()
    assert bj.main([*world["args"], "--to", "prepare"]) == 2
    err = capsys.readouterr().err
    assert "has local changes" in err and "README.md" in err


def test_patch_that_does_not_apply_leaves_no_tree(world, capsys):
    xla_dir = world["tmp"] / "xla-src" / f"xla-{COMMIT}"
    cc = xla_dir / "xla/hlo/analysis/alias_info.cc"
    cc.write_text(cc.read_text().replace("FollowNoOpIndirection(", "Renamed("))
    with tarfile.open(world["tarball"], "w:gz") as tf:
        tf.add(xla_dir, arcname=f"xla-{COMMIT}")
    sha = hashlib.sha256(world["tarball"].read_bytes()).hexdigest()
    rev = world["jax"] / "third_party/xla/revision.bzl"
    rev.write_text(f'XLA_COMMIT = "{COMMIT}"\nXLA_SHA256 = "{sha}"\n')
    _git(world["jax"], "commit", "-qam", "new pin")
    _git(world["jax"], "tag", "-f", "jax-v0.12.0.1")
    assert bj.main([*world["args"], "--to", "prepare"]) == 2
    err = capsys.readouterr().err
    assert "prepare: 0001-alias-info" in err and "does not apply" in err
    assert not list((world["work"] / "trees").glob("xla-*"))


def _one_error(capsys) -> str:
    err = [ln for ln in capsys.readouterr().err.splitlines() if not ln.startswith("[")]
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


def test_preflight_checks_fail_before_any_stage(world, capsys, monkeypatch, tmp_path):
    """Missing bazelisk, an old Python, too little disk: one error line, exit 2, nothing started."""
    with monkeypatch.context() as m:
        m.setattr(bj.shutil, "which", lambda name: None)
        assert bj.main(world["args"]) == 2
        assert "bazelisk not found on PATH and npx is missing" in _one_error(capsys)
        assert bj.main([*world["args"], "--to", "prepare"]) == 0  # stages that need no bazel still run
        capsys.readouterr()
    old = tmp_path / "python3.11"
    old.write_text("#!/bin/sh\necho 3.11\n")
    old.chmod(0o755)
    assert bj.main([*world["args"], "--python", str(old)]) == 2
    assert "is Python 3.11; building jaxlib 0.12.0.1 needs Python >= 3.12" in _one_error(capsys)
    args = [a if a != "0" else "1e9" for a in world["args"]]
    assert bj.main([*args, "--from", "build"]) == 2
    assert "GiB free; the build needs at least 1e+09 GiB" in _one_error(capsys)
    assert not list((world["work"] / "stamps").glob("b*.json"))  # neither bazel nor build started
    # In a dry run the same failures are shown in the plan instead of stopping it.
    assert bj.main([*args, "--dry-run"]) == 0
    assert "WARNING, a real run would stop here" in capsys.readouterr().out


def test_build_outputs_do_not_make_a_tree_dirty_and_stale_stamps_are_redone(world, capsys):
    assert bj.main([*world["args"], "--to", "build"]) == 0
    jax_tree = next((world["work"] / "trees").glob("jax-*"))
    assert (jax_tree / ".jax_configure.bazelrc").exists() and (jax_tree / "bazel-bin").is_symlink()
    # prepare's own check accepts what the build left behind (bazelrc, bazel-* links) ...
    (world["work"] / "stamps" / "prepare.json").unlink()
    capsys.readouterr()
    assert bj.main([*world["args"], "--to", "prepare"]) == 0
    # ... and a stamp whose tree was deleted is redone, not trusted.
    shutil.rmtree(jax_tree)
    assert bj.main([*world["args"], "--to", "build"]) == 0
    lines = dict(ln.split(": ") for ln in capsys.readouterr().out.splitlines()[-5:])
    assert lines == {"resolve": "skipped", "fetch": "skipped", "prepare": "done", "bazel": "done", "build": "done"}
    assert (jax_tree / ".xla-harness-prepared").exists()


def test_stage_killed_midway_is_redone(world, capsys, monkeypatch):
    monkeypatch.setenv("FAKE_BUILD_FAIL", "1")
    assert bj.main([*world["args"], "--to", "build"]) == 2
    assert "build: jax build/build.py failed" in capsys.readouterr().err
    assert not (world["work"] / "stamps" / "build.json").exists()
    monkeypatch.delenv("FAKE_BUILD_FAIL")
    assert bj.main([*world["args"], "--to", "build"]) == 0
    lines = dict(ln.split(": ") for ln in capsys.readouterr().out.splitlines())
    assert lines["build"] == "done" and lines["prepare"] == "skipped"
