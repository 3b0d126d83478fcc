"""The package as users install it beside their own code.

Fast: the resolver's rules (xla_harness/runtime/resources.py). Slow: `pip wheel` of this tree, the
wheel installed into a fresh venv outside the checkout, and every subcommand's happy path run
from a scratch git repository of the "user" (its own commit, nothing of this project on
PYTHONPATH): the patch series is read from the wheel, and results never record the user's
commit as the harness's.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import pytest

import xla_harness
from xla_harness.runtime import resources

from ..helpers import FOREIGN_PROGRAM, TINY_ARGS

ROOT = Path(__file__).resolve().parents[2]
SUBCOMMANDS = ("stress", "report", "compare", "merge", "scan", "patches-check", "pr", "gradcheck",
               "bisect-passes", "bundle")
PINNED = ("jax", "jaxlib", "numpy", "optax")  # installed at this venv's versions: the same code, from the cache


# ----------------------------------------------------------------------------- the resolver (fast)


@pytest.fixture
def fresh_resolver():
    resources.source_checkout.cache_clear()
    yield resources
    resources.source_checkout.cache_clear()


def test_this_checkout_is_recognised_and_its_patches_are_read_in_place(fresh_resolver):
    if resources.import_root() != ROOT:
        pytest.skip("xla_harness is not imported from this checkout")
    assert resources.source_checkout() == ROOT
    assert resources.patches_dir() == ROOT / "patches"


@pytest.mark.parametrize("pyproject", [None, '[project]\nname = "my-model"\n', "not toml [", '[project]\nname = 1\n'])
def test_another_projects_folder_is_not_a_checkout(fresh_resolver, monkeypatch, tmp_path, pyproject):
    """Installed in site-packages, or vendored inside the user's project: no checkout, and the
    patch series is the packaged copy (xla_harness/_data/patches), whatever lies around it."""
    if pyproject is not None:
        (tmp_path / "pyproject.toml").write_text(pyproject)
    (tmp_path / "patches").mkdir()  # a user's own patches/ folder is not the series
    monkeypatch.setattr(resources, "import_root", lambda: tmp_path)
    assert resources.source_checkout() is None
    assert resources.patches_dir() == Path(xla_harness.__file__).resolve().parent / "_data" / "patches"


# ----------------------------------------------------------------------------- the wheel (slow)


@dataclass(frozen=True)
class Installed:
    wheel: Path
    venv: Path
    user: Path  # the cwd: a git repository of the user's own, outside the checkout
    user_commit: str
    env: dict

    @property
    def python(self) -> str:
        return str(self.venv / "bin" / "python")

    def run(self, *args, rc: int = 0, timeout: float = 300) -> subprocess.CompletedProcess:
        """`xla-harness ARGS` from the user's repository; its exit code must be ``rc``."""
        res = subprocess.run([str(self.venv / "bin" / "xla-harness"), *map(str, args)], cwd=self.user,
                             env=self.env, capture_output=True, text=True, timeout=timeout)
        assert res.returncode == rc, f"xla-harness {' '.join(map(str, args))}: exit {res.returncode}\n" \
                                     f"{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
        assert "Traceback" not in res.stderr, res.stderr[-3000:]
        return res


def _check(argv: list, timeout: float = 600, **kw) -> subprocess.CompletedProcess:
    res = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=timeout, **kw)
    assert res.returncode == 0, f"{' '.join(map(str, argv))}: exit {res.returncode}\n{res.stdout[-3000:]}\n" \
                                f"{res.stderr[-3000:]}"
    return res


def _source_copy(dest: Path) -> Path:
    """What a clone of this tree holds (tracked files and new ones git does not ignore): the wheel
    is built from that, so no build output of the checkout (egg-info, build dirs) can hide a gap,
    and the build writes nothing into the checkout."""
    listing = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                             capture_output=True, timeout=60)
    if listing.returncode != 0:
        pytest.skip("the checkout is not a git clone: cannot tell its files from build outputs")
    for rel in filter(None, listing.stdout.decode().split("\0")):
        src = ROOT / rel
        if src.is_file():  # a file deleted in the work tree is still listed
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    return dest


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Installed:
    base = tmp_path_factory.mktemp("wheel")
    src = _source_copy(base / "src")
    dist = base / "dist"
    _check([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", dist, src])
    (wheel,) = dist.glob("xla_harness-*.whl")
    venv = base / "venv"
    _check([sys.executable, "-m", "venv", venv])
    pins = base / "constraints.txt"
    pins.write_text("".join(f"{d}=={metadata.version(d)}\n" for d in PINNED))
    _check([venv / "bin" / "python", "-m", "pip", "install", "-q", "-c", pins, wheel])
    user = base / "user"
    user.mkdir()
    (user / "train.py").write_text("print('the user code')\n")
    git = ["git", "-c", "user.email=u@example.com", "-c", "user.name=u"]
    for argv in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "user's own project"]):
        _check([*git, *argv], cwd=user)
    commit = _check(["git", "rev-parse", "HEAD"], cwd=user).stdout.strip()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env.update(JAX_PLATFORMS="cpu", PYTHONNOUSERSITE="1", PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}")
    return Installed(wheel, venv, user, commit, env)


@pytest.mark.slow
def test_wheel_holds_the_patch_series_and_the_package_data(installed):
    names = set(zipfile.ZipFile(installed.wheel).namelist())
    series = {f"xla_harness/_data/{p.relative_to(ROOT).as_posix()}" for p in (ROOT / "patches").rglob("*")
              if p.is_file()}
    assert "xla_harness/_data/patches/series.toml" in series and "xla_harness/_data/patches/xla/guards.toml" in series
    assert series <= names, sorted(series - names)
    data = {p.relative_to(ROOT).as_posix() for p in (ROOT / "xla_harness").rglob("*")
            if p.is_file() and p.suffix not in (".py", ".pyc") and "__pycache__" not in p.parts}
    assert "xla_harness/py.typed" in data and data <= names, sorted(data - names)
    tops = {n.split("/")[0] for n in names}
    assert tops == {"xla_harness", f"xla_harness-{xla_harness.__version__}.dist-info"}, tops  # no top-level harness


@pytest.mark.slow
def test_import_from_site_packages_and_no_harness_module(installed):
    probe = ("import importlib.util, json, xla_harness\n"
             "from importlib import metadata\n"
             "from xla_harness.runtime import resources\n"
             "print(json.dumps({'file': xla_harness.__file__,\n"
             "  'harness': importlib.util.find_spec('harness') is not None,\n"
             "  'version': xla_harness.__version__, 'dist': metadata.version('xla-harness'),\n"
             "  'checkout': str(resources.source_checkout()), 'patches': str(resources.patches_dir())}))\n")
    res = subprocess.run([installed.python, "-c", probe], cwd=installed.user, env=installed.env, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout)
    site = installed.venv.resolve()
    assert Path(got["file"]).resolve().is_relative_to(site) and not got["harness"]
    assert got["version"] == got["dist"] == xla_harness.__version__
    assert got["checkout"] == "None"
    assert Path(got["patches"]).resolve().is_relative_to(site) and (Path(got["patches"]) / "series.toml").is_file()


@pytest.mark.slow
def test_help_lists_every_subcommand(installed):
    out = installed.run("--help").stdout
    assert all(name in out for name in SUBCOMMANDS)


@pytest.mark.slow
def test_stress_report_merge_compare_and_no_user_commit(installed):
    run = ["--modes", "full", "--remat", "off", "--steps", "2", "--block", "2", "--quiet", *TINY_ARGS]
    installed.run("stress", "--out", "a", "--seeds", "1", *run)
    shutil.copytree(installed.user / "a", installed.user / "b")  # a second run's folder, for merge and compare
    text = (installed.user / "a" / "stress.jsonl").read_text()
    for line in text.splitlines():
        env = json.loads(line)["env"]
        assert env["repo_commit"] is None  # the user's repository is not the harness's
        assert env["harness_version"] == xla_harness.__version__
    assert installed.user_commit not in text
    assert "full/remat=off/f32" in installed.run("report", "a").stdout
    assert "full/remat=off/f32" in installed.run("merge", "a", "b").stdout
    assert "full/remat=off/f32" in installed.run("compare", "a", "b").stdout


@pytest.mark.slow
def test_scan_files_and_the_model(installed):
    for name, rc in (("operand_is_parameter.hlo", 0), ("transpose_moves_data.hlo", 1)):
        shutil.copy(ROOT / "tests" / "hlo" / name, installed.user / name)
        out = installed.run("scan", name, rc=rc).stdout
        assert "scanned 1 module(s)" in out
    assert "scanned 1 module(s)" in installed.run("scan", "--model", "tied-embedding", *TINY_ARGS).stdout


@pytest.mark.slow
def test_patches_check_reads_the_packaged_series(installed):
    from xla_harness.upstream.patchfile import preimage_tree

    tree = installed.user / "jax-src"
    for patch in sorted((ROOT / "patches" / "jax").glob("*.patch")):  # the files each patch touches, as before it
        preimage_tree(patch.read_text(), tree)
    out = installed.run("patches-check", "--jax-src", tree).stdout
    assert "cannot read" not in out and "jax" in out
    res = json.loads(installed.run("patches-check", "--jax-src", tree, "--json").stdout)
    assert res["applies"] >= 1 and res["error"] is None


@pytest.mark.slow
def test_pr_bundle_from_the_packaged_series(installed):
    out = installed.user / "pr"
    installed.run("pr", "--target", "jax", "--out", out)
    assert {p.name for p in out.iterdir()} >= {"series.mbox", "PR.md", "CHECKLIST.md"}
    assert (out / "series.mbox").read_text().count("\nSubject: [PATCH") >= 1


@pytest.mark.slow
def test_gradcheck_subset(installed):
    out = installed.run("gradcheck", "--cases", "select_const_cond_true,fori_acc_times_x_n2").stdout
    assert "0 failing checks" in out


@pytest.mark.slow
def test_bisect_passes_probes_import_the_installed_package(installed):
    out = installed.run("bisect-passes", "--oracle", "hlo", "--property", "multi-op-fusion", "--program", "small",
                        "--passes", "fusion", "--out", "bisect", "--quiet").stdout
    assert "removes the failure: fusion" in out


@pytest.mark.slow
def test_bundle_of_a_user_program_copies_the_installed_interface(installed):
    (installed.user / "prog.py").write_text(FOREIGN_PROGRAM)
    installed.run("bundle", "--out", "r.tar.gz", "--program", "prog.py:make", "--seeds", "1", "--steps", "2")
    with tarfile.open(installed.user / "r.tar.gz") as tf:
        names = set(tf.getnames())
    assert {"bundle/program/prog.py", "bundle/program/xla_harness/programs/interface.py"} <= names
    installed.run("bundle", "--check", "r.tar.gz", "--run-program")
