"""xla_harness.upstream.jaxlib_build (entry: build/build_jaxlib.py), offline: pin parsing, the plan,
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

from xla_harness.errors import HarnessError
from xla_harness.upstream.patchfile import parse_patch, preimage_tree
from xla_harness.upstream.series import load_series

ROOT = Path(__file__).resolve().parents[2]
from xla_harness.upstream import jaxlib_build as bj  # noqa: E402
from xla_harness.upstream import jaxlib_plan as plan  # noqa: E402
from xla_harness.upstream import jaxlib_stages as stages  # noqa: E402

P1 = ROOT / "patches/xla/0001-instruction-fusion-no-data-moving-producer-into-in-place-scatter.patch"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


# ----------------------------------------------------------------------------- pure parts


def test_parse_revision_and_workspace_variants():
    revision = f'# To update XLA to a new revision,\nXLA_COMMIT = "{COMMIT}"\nXLA_SHA256 = "{"a" * 64}"\n'
    assert plan.parse_xla_pin(revision) == (COMMIT, "a" * 64)
    workspace = ('load("//third_party:repo.bzl", "tf_http_archive")\n\n'
                 '# Comment mentioning XLA_COMMIT = "ffff"\n'
                 f'XLA_COMMIT = "{COMMIT}"\nXLA_SHA256 = "{"b" * 64}"\n\ndef repo():\n    pass\n')
    assert plan.parse_xla_pin(workspace) == (COMMIT, "b" * 64)
    with pytest.raises(HarnessError, match="no XLA_COMMIT"):
        plan.parse_xla_pin('load("//third_party/xla:revision.bzl", "XLA_COMMIT", "XLA_SHA256")\n')
    # The oldest layout: an inline http_archive in WORKSPACE; a commented-out one is ignored.
    old = ('# local_repository(\n#    name = "xla",\n#    strip_prefix = "xla-ffffffff",\n# )\n'
           f'http_archive(\n    name = "xla",\n    sha256 = "{"c" * 64}",\n    strip_prefix = "xla-{COMMIT}",\n'
           f'    urls = ["https://github.com/openxla/xla/archive/{COMMIT}.tar.gz"],\n)\n')
    assert plan.parse_xla_pin(old, "WORKSPACE") == (COMMIT, "c" * 64)
    with pytest.raises(HarnessError):
        plan.parse_xla_pin("\n".join("# " + ln for ln in old.splitlines()), "WORKSPACE")


def test_find_pin_prefers_revision_bzl_and_skips_a_loading_workspace_bzl(tmp_path):
    (tmp_path / "third_party/xla").mkdir(parents=True)
    (tmp_path / "third_party/xla/workspace.bzl").write_text(
        'load("//third_party/xla:revision.bzl", "XLA_COMMIT", "XLA_SHA256")\n')
    with pytest.raises(HarnessError, match="pins no XLA commit"):
        plan.find_xla_pin(tmp_path, "jax-v9")
    (tmp_path / "third_party/xla/revision.bzl").write_text(f'XLA_COMMIT = "{COMMIT}"\nXLA_SHA256 = "{"d" * 64}"\n')
    assert plan.find_xla_pin(tmp_path, "jax-v9") == (COMMIT, "d" * 64, "third_party/xla/revision.bzl")


def test_plan_argv_cpu_and_cuda(tmp_path):
    cpu = plan.build_argv("py", Path("/x"), "3.12", "/w/bin/bazelisk", Path("/w"), False, "13", Path("/w/dist/a"))
    assert cpu == ["py", "build/build.py", "build", "--wheels=jaxlib", "--local_xla_path=/x",
                   "--python_version=3.12", "--bazel_path=/w/bin/bazelisk",
                   "--bazel_startup_options=--output_user_root=/w/bazel-root",
                   "--bazel_options=--disk_cache=/w/bazel-disk-cache",
                   "--bazel_options=--repository_cache=/w/bazel-repo-cache", "--output_path=/w/dist/a"]
    cuda = plan.build_argv("py", Path("/x"), "3.12", "b", Path("/w"), True, "12", Path("/o"))
    assert "--wheels=jaxlib,jax-cuda-plugin,jax-cuda-pjrt" in cuda and cuda[-1] == "--cuda_major_version=12"
    assert plan.bazel_test_argv("b", [], ["//t:x"], "3.12") == [
        "b", "test", "--repo_env=HERMETIC_PYTHON_VERSION=3.12", "--verbose_failures=true", "--test_output=errors",
        "@xla//t:x"]
    with pytest.raises(HarnessError):
        plan.jax_tag("latest")


def test_lock_file_check(tmp_path):
    (tmp_path / "build").mkdir()
    (tmp_path / "build/requirements_lock_3_12.txt").write_text("")
    (tmp_path / "build/requirements_lock_3_13.txt").write_text("")
    stages.check_lock_file(tmp_path, "3.13")
    with pytest.raises(HarnessError, match=r"no build/requirements_lock for Python 3.11; it builds for 3.12, 3.13"):
        stages.check_lock_file(tmp_path, "3.11")


@pytest.mark.slow
def test_dry_run_prints_every_stage_and_touches_nothing(tmp_path, capsys):
    work = tmp_path / "work"
    assert bj.main(["--dry-run", "--cuda", "--work-dir", str(work)]) == 0
    out = capsys.readouterr().out
    for stage in bj.STAGES:
        assert f"\n{stage}:" in out or out.startswith(f"{stage}:")
    assert "git clone --depth 1 --branch jax-v0.12.0.1 https://github.com/jax-ml/jax.git" in out
    assert "build/build.py build --wheels=jaxlib,jax-cuda-plugin,jax-cuda-pjrt" in out
    assert "--local_xla_path=" in out and "--cuda_major_version=12" in out
    assert "configure.py" not in out and out.index("preflight:") < out.index("resolve:")
    assert "git apply patches/xla/0001-instruction-fusion" in out
    assert " test --repo_env=HERMETIC_PYTHON_VERSION=" in out and "@xla//xla/service:instruction_fusion_test" in out
    # The new order: target check in prepare, dirty check before the build, XLA tests in the jax tree.
    assert out.index("defines //xla/service:instruction_fusion_test") < out.index("\nbazel:")
    assert out.index("have no local changes") < out.index("build/build.py build")
    assert f"{work}/bin/bazelisk --output_user_root={work}/bazel-root test" in out
    assert not work.exists()


# ----------------------------------------------------------------------------- fakes

FAKE_BUILD = r'''
import json, os, pathlib, subprocess, sys
args = sys.argv[1:]
with open(os.environ["FAKE_RECORD"], "a") as f:
    f.write(json.dumps({"tool": "build.py", "argv": args, "cwd": os.getcwd()}) + "\n")
get = lambda k: next(a.split("=", 1)[1] for a in args if a.startswith(k + "="))
startup = [a.split("=", 1)[1] for a in args if a.startswith("--bazel_startup_options=")]
subprocess.run([get("--bazel_path"), *startup, "build", "//jaxlib/tools:jaxlib_wheel"], check=True)
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
# Behaves as bazelisk 1.28.1 (npm @bazel/bazelisk) does where the pipeline depends on it: the version is
# USE_BAZEL_VERSION as given, else the first line of the workspace's .bazelversion as it stands (no
# comment or blank line skipped, no spaces trimmed; an empty one means "latest", which needs the
# network); a string that is not a version is refused with "invalid version"; startup options come
# before the command.
import json, os, pathlib, re, sys
version = os.environ.get("USE_BAZEL_VERSION")
if version is None:
    d = pathlib.Path.cwd()
    while d != d.parent and not any((d / m).is_file() for m in ("WORKSPACE", "MODULE.bazel", "WORKSPACE.bazel")):
        d = d.parent
    f = d / ".bazelversion"
    version = (f.read_text().split("\n", 1)[0] if f.is_file() else "") or "latest"
if version == "latest":
    sys.exit("could not resolve the version 'latest' to an actual version number: no network")
if not re.fullmatch(r"\d+\.\d+\.\d+(rc\d+)?", version):
    sys.exit(f"could not resolve the version {{version!r}} to an actual version number: invalid version")
args = sys.argv[1:]
n = next((i for i, a in enumerate(args) if not a.startswith("--")), len(args))
startup, rest = args[:n], args[n:]
with open(os.environ["FAKE_RECORD"], "a") as f:
    f.write(json.dumps({{"tool": "bazelisk", "argv": rest, "startup": startup, "cwd": os.getcwd(),
                        "USE_BAZEL_VERSION": os.environ.get("USE_BAZEL_VERSION"), "version": version}}) + "\n")
print(f"bazel {{version}}")
if rest[:1] == ["test"] and os.environ.get("FAKE_BAZEL_TEST_FAIL"):
    sys.exit(int(os.environ["FAKE_BAZEL_TEST_FAIL"]))
'''


XLA_BUILD = """load("//xla:xla.default.bzl", "xla_cc_test")

cc_library(
    name = "alias_info",
    srcs = ["alias_info.cc"],
)

xla_cc_test(
    name = "alias_info_test",
    srcs = ["alias_info_test.cc"],
)
"""


def _series_base_tree(root: Path) -> None:
    """Sources every XLA patch applies to in series order (default, then experimental): per file,
    the pre-images of each patch's hunks, in order, each once; a later patch finds its context
    (an earlier one's post-image) in its own chunk."""
    chunks: dict[str, list[str]] = {}
    for patch in load_series().upstream("xla").patches:
        for h in parse_patch(patch.path(ROOT / "patches").read_text()):
            if not h.creates_file and h.preimage not in chunks.setdefault(h.file, []):
                chunks[h.file].append(h.preimage)
    for rel, parts in chunks.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("".join(parts))


def _write_build_files(xla_dir: Path) -> None:
    """BUILD files that define every Bazel target series.toml names for XLA (as the real tree does),
    after whatever a patch's BUILD hunk needs as its context (`_series_base_tree`)."""
    by_pkg: dict[str, list[str]] = {}
    for t in sorted({t for p in load_series().upstream("xla").patches for t in p.bazel_targets}):
        pkg, name = t.removeprefix("//").split(":")
        by_pkg.setdefault(pkg, []).append(name)
    for pkg, names in by_pkg.items():
        (xla_dir / pkg).mkdir(parents=True, exist_ok=True)
        build = xla_dir / pkg / "BUILD"
        context = build.read_text() if build.is_file() else ""
        build.write_text(context + XLA_BUILD + "".join(
            f'\nxla_cc_test(\n    name = "{n}",\n    srcs = ["{n}.cc"],\n)\n' for n in names if n != "alias_info_test"))


def _git(cwd, *args):
    subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", *args], cwd=cwd, check=True,
                   capture_output=True)


@pytest.fixture
def world(tmp_path, monkeypatch):
    """A fake jax repo tagged jax-v0.12.0.1, an XLA tarball the series applies to, a fake bazelisk."""
    xla_dir = tmp_path / "xla-src" / f"xla-{COMMIT}"
    _series_base_tree(xla_dir)
    (xla_dir / "README.md").write_text("fake xla\n")
    (xla_dir / ".bazelversion").write_text("7.4.1\n")  # XLA pins its own Bazel, unlike jax's
    _write_build_files(xla_dir)
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
    (jax / ".bazelversion").write_text("7.7.0\n# NOTE: a comment line, as XLA's .bazelversion has\n")
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


@pytest.mark.slow
def test_stages_end_to_end_with_fake_tools(world, capsys):
    assert bj.main([*world["args"], "--to", "build"]) == 0
    out = capsys.readouterr().out
    assert [ln.split(":")[0] for ln in out.splitlines()] == ["resolve", "fetch", "prepare", "bazel", "build"]
    work = world["work"]
    tree = next((work / "trees").glob("xla-0123456789ab-*"))
    # The default series really was applied to the fetched XLA sources.
    assert "// Only a dynamic-update-slice gets the index checks further down." in \
        (tree / "xla/service/instruction_fusion.cc").read_text()
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


FAKE_VENV_PYTHON = r'''#!{python}
# The python of a stand-in .venv-patched: records what it is asked to run; `xla_harness.cli stress`
# writes an empty results file.
import json, os, pathlib, sys
args = sys.argv[1:]
with open(os.environ["FAKE_RECORD"], "a") as f:
    f.write(json.dumps({{"tool": "venv-python", "argv": args, "exe": sys.argv[0]}}) + "\n")
if "stress" in args:
    out = pathlib.Path(args[args.index("--out") + 1])
    out.mkdir(parents=True, exist_ok=True)
    (out / "stress.jsonl").write_text("")
'''


def _fake_venv(world) -> Path:
    venv = world["tmp"] / "fake-venv"
    (venv / "bin").mkdir(parents=True)
    py = venv / "bin" / "python"
    py.write_text(FAKE_VENV_PYTHON.format(python=sys.executable))
    py.chmod(0o755)
    return venv


@pytest.mark.slow
def test_test_stage_runs_xla_tests_inside_the_jax_tree(world, capsys, tmp_path):
    assert bj.main([*world["args"], "--to", "build"]) == 0
    stamp = world["work"] / "stamps" / "install.json"
    stamp.write_text(json.dumps({"inputs": "x", "outputs": {"venv": str(_fake_venv(world))}}))
    res = tmp_path / "results"
    rc = bj.main([*world["args"], "--from", "test", "--results", str(res)])
    assert rc == 0, capsys.readouterr().err
    recs = _records(world)
    build = next(r for r in recs if r["tool"] == "bazelisk" and "build" in r["argv"])
    test = next(r for r in recs if r["tool"] == "bazelisk" and "test" in r["argv"])
    # One workspace, one Bazel: the jax tree (whose .jax_configure.bazelrc points @xla at the patched
    # tree and holds the caches and toolchain flags), jax's Bazel version, the build's startup options
    # (so the same output base) and the build's hermetic Python.
    assert test["cwd"] == build["cwd"] and Path(test["cwd"]).name.startswith("jax-")
    assert test["USE_BAZEL_VERSION"] == build["USE_BAZEL_VERSION"] == "7.7.0"
    assert test["startup"] == build["startup"]
    assert test["argv"][-1] == "@xla" + stages.series_bazel_targets("default")[-1]
    pyver = f"{sys.version_info[0]}.{sys.version_info[1]}"
    assert f"--repo_env=HERMETIC_PYTHON_VERSION={pyver}" in test["argv"]
    assert not list((world["work"] / "trees").glob("xla-*/xla_configure.bazelrc"))  # no configure.py step
    assert list(res.glob("default-cpu-*/stress.jsonl"))
    out = capsys.readouterr().out
    assert f"bazel test @xla{stages.series_bazel_targets('default')[-1]}: passed" in out


@pytest.mark.slow
def test_a_failing_bazel_test_does_not_hide_the_harness_checks(world, capsys, tmp_path, monkeypatch):
    assert bj.main([*world["args"], "--to", "build"]) == 0
    stamp = world["work"] / "stamps" / "install.json"
    stamp.write_text(json.dumps({"inputs": "x", "outputs": {"venv": str(_fake_venv(world))}}))
    monkeypatch.setenv("FAKE_BAZEL_TEST_FAIL", "3")
    res = tmp_path / "results"
    rc = bj.main([*world["args"], "--from", "test", "--results", str(res)])
    cap = capsys.readouterr()
    assert rc == 1, cap.err  # tests found a problem: exit 1, not a crash
    assert f"bazel test @xla{stages.series_bazel_targets('default')[-1]}: FAILED (exit 3)" in cap.out
    assert "harness tests: passed" in cap.out and "stress matrix: passed" in cap.out
    ran = [r["argv"][:3] for r in _records(world) if r["tool"] == "venv-python"]
    assert ran == [["-m", "pytest", "-q"], ["-m", "xla_harness.cli", "stress"]]  # both ran after the failure
    assert list(res.glob("default-cpu-*/stress.jsonl"))
    assert not (world["work"] / "stamps" / "test.json").exists()


@pytest.mark.slow
def test_sha_mismatch_is_refused(world, capsys):
    world["tarball"].write_bytes(world["tarball"].read_bytes() + b"tampered")
    assert bj.main([*world["args"], "--to", "fetch"]) == 2
    err = [ln for ln in capsys.readouterr().err.strip().splitlines() if not ln.startswith("[")]
    assert len(err) == 1 and err[0].startswith("error: fetch: sha256 mismatch")
    assert not (world["work"] / "stamps" / "fetch.json").exists()
    assert not list((world["work"] / "src").glob("*.partial"))


@pytest.mark.slow
def test_no_network_is_one_error_line(world, capsys):
    args = [a if not a.startswith("file://") else "file:///nonexistent/xla-{commit}.tar.gz" for a in world["args"]]
    assert bj.main([*args, "--to", "fetch"]) == 2
    assert "error: fetch: cannot download" in capsys.readouterr().err


@pytest.mark.slow
def test_prepare_refuses_a_dirty_tree(world, capsys):
    assert bj.main([*world["args"], "--to", "prepare"]) == 0
    tree = next((world["work"] / "trees").glob("xla-*"))
    (tree / "README.md").write_text("local edit\n")
    (world["work"] / "stamps" / "prepare.json").unlink()
    capsys.readouterr()
    assert bj.main([*world["args"], "--to", "prepare"]) == 2
    err = capsys.readouterr().err
    assert "has local changes" in err and "README.md" in err


@pytest.mark.slow
def test_patch_that_does_not_apply_leaves_no_tree(world, capsys):
    xla_dir = world["tmp"] / "xla-src" / f"xla-{COMMIT}"
    cc = xla_dir / "xla/service/instruction_fusion.cc"
    cc.write_text(cc.read_text().replace("non-elementwise ops, bailing", "non-elementwise ops, renamed"))
    with tarfile.open(world["tarball"], "w:gz") as tf:
        tf.add(xla_dir, arcname=f"xla-{COMMIT}")
    sha = hashlib.sha256(world["tarball"].read_bytes()).hexdigest()
    rev = world["jax"] / "third_party/xla/revision.bzl"
    rev.write_text(f'XLA_COMMIT = "{COMMIT}"\nXLA_SHA256 = "{sha}"\n')
    _git(world["jax"], "commit", "-qam", "new pin")
    _git(world["jax"], "tag", "-f", "jax-v0.12.0.1")
    assert bj.main([*world["args"], "--to", "prepare"]) == 2
    err = capsys.readouterr().err
    assert "prepare: xla " in err and "0001-instruction-fusion" in err and "does not apply" in err
    assert not list((world["work"] / "trees").glob("xla-*"))


def _one_error(capsys) -> str:
    err = [ln for ln in capsys.readouterr().err.splitlines() if not ln.startswith("[")]
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


@pytest.mark.slow
def test_preflight_checks_fail_before_any_stage(world, capsys, monkeypatch, tmp_path):
    """Missing bazelisk, an old Python, too little disk: one error line, exit 2, nothing started."""
    with monkeypatch.context() as m:
        m.setattr(stages.shutil, "which", lambda name: None)
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


@pytest.mark.slow
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


@pytest.mark.slow
def test_stage_killed_midway_is_redone(world, capsys, monkeypatch):
    monkeypatch.setenv("FAKE_BUILD_FAIL", "1")
    assert bj.main([*world["args"], "--to", "build"]) == 2
    assert "build: jax build/build.py failed" in capsys.readouterr().err
    assert not (world["work"] / "stamps" / "build.json").exists()
    monkeypatch.delenv("FAKE_BUILD_FAIL")
    assert bj.main([*world["args"], "--to", "build"]) == 0
    lines = dict(ln.split(": ") for ln in capsys.readouterr().out.splitlines())
    assert lines["build"] == "done" and lines["prepare"] == "skipped"


# ----------------------------------------------------------------------------- venvs at their final path

FAKE_INTERPRETER = r'''#!{python}
# An interpreter whose `-m venv DIR` makes a stand-in venv: DIR/bin/python records what it runs and,
# like pip, writes console scripts whose #! line is the interpreter path it was invoked by. Anything
# else runs on the real interpreter.
import os, pathlib, sys
if sys.argv[1:3] == ["-m", "venv"]:
    bindir = pathlib.Path(sys.argv[3]) / "bin"
    bindir.mkdir(parents=True)
    (bindir / "python").write_text({venv_python!r})
    (bindir / "python").chmod(0o755)
    sys.exit(0)
os.execv({python!r}, [{python!r}, *sys.argv[1:]])
'''

VENV_PYTHON = r'''#!{python}
import json, os, pathlib, sys
args = sys.argv[1:]
with open(os.environ["FAKE_RECORD"], "a") as f:
    f.write(json.dumps({{"tool": "venv-python", "argv": args, "exe": sys.argv[0]}}) + "\n")
if args[:1] == ["-c"]:
    print("numpy>=1.26")
elif "install" in args:
    if os.environ.get("FAKE_PIP_FAIL") and os.environ["FAKE_PIP_FAIL"] in args:
        sys.exit(1)
    script = pathlib.Path(sys.argv[0]).parent / "console-script"
    script.write_text(f"#!{{sys.argv[0]}}\nprint('hello')\n")
    script.chmod(0o755)
'''


def _fake_interpreter(tmp_path: Path) -> str:
    venv_python = VENV_PYTHON.format(python=sys.executable)
    exe = tmp_path / "fake-python"
    exe.write_text(FAKE_INTERPRETER.format(python=sys.executable, venv_python=venv_python))
    exe.chmod(0o755)
    return str(exe)


def _script_runs(venv: Path) -> bool:
    """Would the kernel find the interpreter of the venv's console script (the original failure was
    'cannot execute: required file not found', the #! line naming the .partial path)?"""
    shebang = (venv / "bin" / "console-script").read_text().splitlines()[0][2:]
    return os.access(shebang, os.X_OK) and Path(shebang).parent == venv / "bin"


@pytest.mark.slow
def test_patched_venv_is_built_at_its_final_path_and_stamped_last(world, capsys, monkeypatch):
    assert bj.main([*world["args"], "--to", "build"]) == 0
    venv = world["tmp"] / ".venv-patched"
    args = [*world["args"], "--python", _fake_interpreter(world["tmp"]), "--venv", str(venv)]
    monkeypatch.setenv("FAKE_PIP_FAIL", "-r")  # jax's requirements fail to install, midway
    assert bj.main([*args, "--from", "install", "--to", "install"]) == 2
    assert "install: pip install of jax's requirements failed" in capsys.readouterr().err
    assert not (venv / stages.VENV_COMPLETE).exists() and not (world["work"] / "stamps" / "install.json").exists()
    monkeypatch.delenv("FAKE_PIP_FAIL")
    assert bj.main([*args, "--from", "install", "--to", "install"]) == 0
    assert _script_runs(venv) and (venv / stages.VENV_COMPLETE).exists()
    assert not [r for r in _records(world) if ".partial" in json.dumps(r)]
    # A venv without its stamp (killed after the stage's stamp was read) is not trusted: redone.
    (venv / stages.VENV_COMPLETE).unlink()
    capsys.readouterr()
    assert bj.main([*args, "--from", "install", "--to", "install"]) == 0
    assert capsys.readouterr().out.strip() == "install: done" and (venv / stages.VENV_COMPLETE).exists()


@pytest.mark.slow
def test_jax_patched_venv_is_built_at_its_final_path(tmp_path, monkeypatch, capsys):
    from xla_harness.upstream import jaxvenv

    monkeypatch.setenv("FAKE_RECORD", str(tmp_path / "record.jsonl"))
    sdist = tmp_path / "jax-0.12.0.1"
    sdist.mkdir()
    (sdist / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: jax\nVersion: 0.12.0.1\n")
    for patch in sorted((ROOT / "patches/jax").glob("0001-*.patch")):  # the files the series changes
        preimage_tree(patch.read_text(), sdist)
    venv = tmp_path / ".venv-jax-patched"
    py = _fake_interpreter(tmp_path)
    monkeypatch.setenv("FAKE_PIP_FAIL", "--no-deps")
    assert jaxvenv.main(["--sdist", str(sdist), "--venv", str(venv), "--python", py]) == 2
    assert not (venv / jaxvenv.STAMP).exists()
    monkeypatch.delenv("FAKE_PIP_FAIL")
    assert jaxvenv.main(["--sdist", str(sdist), "--venv", str(venv), "--python", py]) == 0
    assert _script_runs(venv) and (venv / jaxvenv.STAMP).exists()
    assert ".partial" not in (tmp_path / "record.jsonl").read_text()


# ----------------------------------------------------------------------------- fail fast before the build


def test_bazel_version_is_the_first_line_that_is_not_a_comment(tmp_path):
    """Lenient where bazelisk is strict (it takes the first line as it stands); the pipeline passes
    the result as USE_BAZEL_VERSION, so bazelisk never reads the file itself."""
    (tmp_path / ".bazelversion").write_text("# pinned for CI\n\n  7.7.0  \n# NOTE: keep in sync\n8.0.0\n")
    assert stages.bazel_version_of(tmp_path) == "7.7.0"
    (tmp_path / ".bazelversion").write_text("# only a comment\n")
    assert stages.bazel_version_of(tmp_path) == ""


@pytest.mark.slow
def test_bazel_gets_a_valid_version_and_its_output_root_lives_in_the_work_dir(world, capsys):
    assert bj.main([*world["args"], "--to", "build"]) == 0, capsys.readouterr().err
    bazel_calls = [r for r in _records(world) if r["tool"] == "bazelisk"]
    assert {r["version"] for r in bazel_calls} == {"7.7.0"}
    root = f"--output_user_root={world['work'] / 'bazel-root'}"
    assert all(r["startup"] == [root] for r in bazel_calls if r["argv"][:1] == ["build"])
    build = next(r for r in _records(world) if r["tool"] == "build.py")
    assert f"--bazel_startup_options={root}" in build["argv"]


@pytest.mark.slow
def test_a_series_target_missing_from_the_patched_tree_fails_in_prepare(world, capsys):
    target = stages.series_bazel_targets("default")[0]
    pkg, name = target.removeprefix("//").split(":")
    xla_dir = world["tmp"] / "xla-src" / f"xla-{COMMIT}"
    build = xla_dir / pkg / "BUILD"
    build.write_text(build.read_text().replace(f'"{name}"', '"other_test"'))
    with tarfile.open(world["tarball"], "w:gz") as tf:
        tf.add(xla_dir, arcname=f"xla-{COMMIT}")
    sha = hashlib.sha256(world["tarball"].read_bytes()).hexdigest()
    (world["jax"] / "third_party/xla/revision.bzl").write_text(f'XLA_COMMIT = "{COMMIT}"\nXLA_SHA256 = "{sha}"\n')
    _git(world["jax"], "commit", "-qam", "new pin")
    _git(world["jax"], "tag", "-f", "jax-v0.12.0.1")
    assert bj.main(world["args"]) == 2
    assert f"prepare: {target} (series.toml) is not defined in " in _one_error(capsys)
    assert not (world["work"] / "stamps" / "prepare.json").exists()
    assert not [r for r in _records(world) if r["tool"] == "build.py"]


def test_target_check_reads_build_and_build_bazel(tmp_path):
    (tmp_path / "a/b").mkdir(parents=True)
    (tmp_path / "a/b/BUILD.bazel").write_text('cc_test(\n    name = "t",\n)\n# name = "commented"\n')
    assert plan.undefined_targets(tmp_path, ["//a/b:t", "//a/b:commented", "//a/c:t", "//a/b"]) == [
        "//a/b:commented", "//a/c:t", "//a/b"]


@pytest.mark.slow
def test_an_edited_tree_is_never_built(world, capsys):
    """The dirty-tree check runs before every build, not only when prepare runs."""
    assert bj.main([*world["args"], "--to", "build"]) == 0
    n = len([r for r in _records(world) if r["tool"] == "build.py"])
    tree = next((world["work"] / "trees").glob("xla-*"))
    (tree / "xla/hlo/analysis/alias_info.cc").write_text("// edited after prepare\n")
    capsys.readouterr()
    assert bj.main([*world["args"], "--from", "build", "--to", "build"]) == 2
    err = _one_error(capsys)
    assert "build: " in err and "has local changes" in err and "alias_info.cc" in err
    assert len([r for r in _records(world) if r["tool"] == "build.py"]) == n  # build.py never started


def test_jax_sdist_sha256_is_verified_against_series_toml(tmp_path, capsys):
    from xla_harness.upstream import jaxvenv

    sdist = tmp_path / "jax-0.12.0.1"
    sdist.mkdir()
    (sdist / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: jax\nVersion: 0.12.0.1\n")
    archive = tmp_path / "jax-0.12.0.1.tar.gz"
    with tarfile.open(archive, "w:gz") as tf:
        tf.add(sdist, arcname="jax-0.12.0.1")
    venv = tmp_path / "venv"
    assert jaxvenv.main(["--sdist", str(sdist), "--archive", str(archive), "--venv", str(venv)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "sha256" in err and "f543fb1151c3" in err and "\n" not in err
    assert not venv.exists()


FAKE_XLA_MK = """.PHONY: stand-in-xla-test
stand-in-xla-test:
\t@echo "quick test ran on $(XLA_SRC)"; exit 3
"""


def _make_build_and_test(tmp_path, *args, xla_mk: bool):
    """`make build-and-test` of this checkout; an extra makefile (MAKEFILES) defines a stand-in for
    the `xla-test` target (XLA_QUICK_TEST names it), and `-o setup` keeps make from running
    `setup` (which would rebuild .venv) at all."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAKE")}
    target = "xla-test"
    if xla_mk:
        (tmp_path / "xla.mk").write_text(FAKE_XLA_MK)
        env["MAKEFILES"] = str(tmp_path / "xla.mk")
        target = "stand-in-xla-test"
    return subprocess.run(["make", "--no-print-directory", "-o", "setup", "build-and-test",
                           f"XLA_QUICK_TEST={target}",
                           f"WORK_DIR={tmp_path / 'work'}", f"PY={sys.executable}", *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("make") is None, reason="not checked: no make on PATH")
def test_make_runs_the_quick_xla_test_first_and_stops_on_its_failure(tmp_path):
    res = _make_build_and_test(tmp_path, "XLA_SRC=/src/xla", xla_mk=True)
    assert res.returncode != 0 and "quick test ran on /src/xla" in res.stdout
    assert not (tmp_path / "work").exists()  # the pipeline never started
    dry = _make_build_and_test(tmp_path, "XLA_SRC=/src/xla", "DRY_RUN=1", xla_mk=True)
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.index("quick XLA test first: make stand-in-xla-test XLA_SRC=/src/xla") < dry.stdout.index("plan:")
    assert "quick test ran" not in dry.stdout  # a dry run only shows it
    plain = _make_build_and_test(tmp_path, "DRY_RUN=1", xla_mk=True)
    assert "not checked first: the quick XLA test (no XLA_SRC=dir given)" in plain.stdout


# ----------------------------------------------------------------------------- bazelisk, free-threaded Python

PLAIN_BAZEL = "#!/bin/sh\necho 'bazel 6.5.0'\n"  # a plain Bazel: ignores USE_BAZEL_VERSION and .bazelversion


@pytest.mark.slow
def test_a_plain_bazel_of_another_version_is_refused(world, capsys, monkeypatch):
    bindir = world["tmp"] / "plain-bin"
    bindir.mkdir()
    (bindir / "bazel").write_text(PLAIN_BAZEL)
    (bindir / "bazel").chmod(0o755)
    with monkeypatch.context() as m:  # only this plain bazel can be found
        m.setattr(stages.shutil, "which", lambda name: str(bindir / name) if (bindir / name).exists() else None)
        assert bj.main([*world["args"], "--to", "bazel"]) == 2
        err = _one_error(capsys)
        assert f"{bindir / 'bazel'} runs Bazel 6.5.0" in err and "no Bazel 7.7.0" in err and "bazelisk" in err
        assert not (world["work"] / "stamps" / "bazel.json").exists()
        # bazelisk installed as `bazel` (as its packages do) is accepted.
        (bindir / "bazel").write_text((world["tmp"] / "bin" / "bazelisk").read_text())
        assert bj.main([*world["args"], "--to", "bazel"]) == 0, capsys.readouterr().err


def _free_threaded(tmp_path) -> str:
    exe = tmp_path / "python3t"
    exe.write_text(
        "#!" + sys.executable + "\n"
        "import sys, sysconfig\n"
        "_get = sysconfig.get_config_var\n"
        "sysconfig.get_config_var = lambda name: 1 if name == 'Py_GIL_DISABLED' else _get(name)\n"
        "assert sys.argv[1] == '-c'\n"
        "code = sys.argv[2]\n"
        "sys.argv = ['-c', *sys.argv[3:]]\n"
        "exec(code)\n")
    exe.chmod(0o755)
    return str(exe)


@pytest.mark.slow
def test_free_threaded_python_builds_the_ft_variant(tmp_path, capsys):
    py = _free_threaded(tmp_path)
    ver = f"{sys.version_info[0]}.{sys.version_info[1]}"
    assert stages._python_version(py) == f"{ver}-ft"
    (tmp_path / "build").mkdir()
    (tmp_path / f"build/requirements_lock_{ver.replace('.', '_')}.txt").write_text("")
    with pytest.raises(HarnessError, match=rf"no build/requirements_lock for Python {ver}-ft; it builds for {ver} \("):
        stages.check_lock_file(tmp_path, f"{ver}-ft")
    (tmp_path / f"build/requirements_lock_{ver.replace('.', '_')}_ft.txt").write_text("")
    stages.check_lock_file(tmp_path, f"{ver}-ft")
    assert '--@rules_python//python/config_settings:py_freethreaded="yes"' in plan.bazel_test_argv(
        "b", [], ["//t:x"], f"{ver}-ft")
    assert bj.main(["--dry-run", "--python", py, "--work-dir", str(tmp_path / "w")]) == 0
    assert f"--python_version={ver}-ft" in capsys.readouterr().out


@pytest.mark.slow
def test_disk_check_measures_bazels_output_root(tmp_path, monkeypatch, capsys):
    """Where WORK/bazel-root exists (a link to a bigger disk, say), that is the filesystem measured."""
    work = tmp_path / "work"
    (tmp_path / "big").mkdir()
    work.mkdir()
    (work / "bazel-root").symlink_to(tmp_path / "big")
    probed = []
    real = shutil.disk_usage

    def usage(path):
        probed.append(Path(path))
        return real(path)

    monkeypatch.setattr(stages.shutil, "disk_usage", usage)
    assert bj.main(["--dry-run", "--work-dir", str(work), "--min-free-gb", "0"]) == 0
    assert probed == [work / "bazel-root"]
    assert f"free disk for {work / 'bazel-root'}" in capsys.readouterr().out


# ----------------------------------------------------------------------------- series variants per jax version

V0901 = "jax/v0.9.0.1/0001-zero-cotangent-masking.patch"


def _series_with_xla_variant(tmp_path, monkeypatch) -> Path:
    """A copy of patches/ whose series.toml also has an xla entry for jax-v0.9.0.1 (the series' own
    file, when the checkout has none yet), read by the pipeline as if it were this checkout's."""
    from xla_harness.upstream import series as series_mod

    root = tmp_path / "checkout"
    (root / "patches").mkdir(parents=True)
    for d in ("xla", "jax", "tensorflow"):
        (root / "patches" / d).symlink_to(ROOT / "patches" / d)
    text = (ROOT / "patches/series.toml").read_text()
    if not any(v.base_ref == "jax-v0.9.0.1" for v in load_series().upstream("xla").variants):
        own = [p.file for p in load_series().upstream("xla").select("default")]
        block = ('\n[[upstream.xla.variants]]\nbase_ref = "jax-v0.9.0.1"\nadapted = "planted by the test"\n'
                 f"files = {json.dumps(own)}\n")
        text = text.replace("\n[upstream.jax]\n", block + "\n[upstream.jax]\n")
    (root / "patches/series.toml").write_text(text)
    monkeypatch.setattr(series_mod, "PATCHES_DIR", root / "patches")
    monkeypatch.setattr(stages, "REPO", root)
    return root


@pytest.mark.slow
def test_dry_run_for_jax_0_9_0_1_applies_its_variant(tmp_path, monkeypatch, capsys):
    _series_with_xla_variant(tmp_path, monkeypatch)
    work = tmp_path / "work"
    assert bj.main(["--dry-run", "--jax-version", "0.9.0.1", "--work-dir", str(work)]) == 0
    out = capsys.readouterr().out
    assert "git clone --depth 1 --branch jax-v0.9.0.1 " in out
    assert f"jax series default, variant for jax-v0.9.0.1: {V0901}, jax/0002-" in out
    prepare = next(ln for ln in out.splitlines() if "[prepare] copy <jax source>" in ln)
    assert f"git apply patches/{V0901}; git apply patches/jax/0002-tests" in prepare
    assert "git apply patches/jax/0001-" not in out  # the 0.12.0.1 file is not applied to 0.9.0.1
    fp = load_series().fingerprint("jax", "default", "jax-v0.9.0.1")[:12]
    assert f"trees/jax-0.9.0.1-{fp}" in prepare
    assert not work.exists()


def test_a_jax_version_without_a_variant_is_one_error_before_anything(tmp_path, capsys):
    work = tmp_path / "work"
    assert bj.main(["--dry-run", "--jax-version", "0.9.2", "--work-dir", str(work)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: series.toml has no ") and "series for jax-v0.9.2: " in err[0]
    assert "jax-v0.12.0.1" in err[0] and not work.exists()


def test_prepare_refuses_a_variant_on_another_commit_of_its_base(tmp_path):
    from xla_harness.upstream.jaxlib_context import Ctx

    ctx = Ctx(work=tmp_path, jax_version="0.9.0.1")
    tag_commit = load_series().upstream("jax").variant("jax-v0.9.0.1").commit
    stages.check_base_commit(ctx, "jax", tag_commit)
    with pytest.raises(HarnessError, match=f"the jax variant for jax-v0.9.0.1 was made for jax {tag_commit[:12]}, "
                                           "but this build's jax is 000000000000"):
        stages.check_base_commit(ctx, "jax", "0" * 40)
    stages.check_base_commit(Ctx(work=tmp_path, jax_version="0.12.0.1"), "jax", "0" * 40)  # own base: no commit


def test_jax_patched_venv_refuses_a_version_without_a_variant(tmp_path, capsys):
    from xla_harness.upstream import jaxvenv

    sdist = tmp_path / "jax-0.9.2"
    sdist.mkdir()
    (sdist / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: jax\nVersion: 0.9.2\n")
    venv = tmp_path / "venv"
    assert jaxvenv.main(["--sdist", str(sdist), "--venv", str(venv)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: series.toml has no jax series for jax-v0.9.2: it exists for jax-v0.12.0.1, ")
    assert "\n" not in err and not venv.exists() and not (tmp_path / "venv.src").exists()


def test_jax_sdist_of_a_variant_is_verified_against_its_sha256(tmp_path, capsys):
    from xla_harness.upstream import jaxvenv

    sdist = tmp_path / "jax-0.9.0.1"
    sdist.mkdir()
    (sdist / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: jax\nVersion: 0.9.0.1\n")
    archive = tmp_path / "jax-0.9.0.1.tar.gz"
    archive.write_bytes(b"not the sdist")
    assert jaxvenv.main(["--sdist", str(sdist), "--archive", str(archive), "--venv", str(tmp_path / "v")]) == 2
    err = capsys.readouterr().err.strip()
    want = load_series().upstream("jax").variant("jax-v0.9.0.1").base_sha256
    assert err.startswith("error: ") and f"base_sha256 {want} for jax-v0.9.0.1" in err and "\n" not in err


@pytest.mark.slow
def test_patched_source_applies_the_variant_for_the_sdist_version(tmp_path):
    from xla_harness.upstream import jaxvenv

    sdist = tmp_path / "jax-0.9.0.1"
    preimage_tree((ROOT / "patches" / V0901).read_text(), sdist)
    assert jaxvenv.patched_source(sdist, tmp_path / "src", "0.9.0.1") == [V0901]
    assert "zero_cotangent_masking as zero_cotangent_masking" in (tmp_path / "src/jax/__init__.py").read_text()
    # the 0.12.0.1 files do not apply to that tree: the version picks the files
    with pytest.raises(HarnessError, match=r"jax/0001-zero-cotangent-masking.patch: hunk #1 .*jax/__init__.py"):
        jaxvenv.patched_source(sdist, tmp_path / "src2", "0.12.0.1")
