"""Build ``.venv-jax-patched``: the stock jaxlib of the pinned version plus the jax sources of
the PyPI sdist with the jax patch series applied: its variant for the sdist's version
(series.toml ``[[upstream.jax.variants]]``); a version the series has no variant for is one
``error:`` line (exit 2), before anything is built.

    python -m xla_harness.upstream.jaxvenv --sdist DIR [--archive DIR.tar.gz] --venv .venv-jax-patched [--python PY]

The venv is built at its final path (a venv's scripts name its interpreter by absolute path,
so one renamed after the fact is broken); a stamp keyed by the patch files and the sdist is
written last, so a patch that does not apply (one ``error:`` line naming patch, file and
hunk; exit 2), a failed install (the venv is removed) or an interrupted one (no stamp: the
next run rebuilds) never passes for a complete venv, and reruns of a complete one are instant.
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import sys
from pathlib import Path

from xla_harness.errors import HarnessError
from xla_harness.runtime import subproc
from xla_harness.upstream.apply import apply_patch, init_repo
from xla_harness.upstream.patchcheck import parse_patch
from xla_harness.upstream.series import load_series

STAMP = ".xla-harness-jax-patched"
STEP_TIMEOUT_S = 3600  # one venv or pip step (jaxlib is a large download); then its process group is killed


def _sdist_version(sdist: Path) -> str:
    for line in (sdist / "PKG-INFO").read_text(encoding="utf-8", errors="replace").splitlines():
        if line.startswith("Version:"):
            return line.split(":", 1)[1].strip()
    raise HarnessError(f"{sdist}/PKG-INFO has no Version line: not a jax sdist")


def base_ref_of(version: str) -> str:
    """The jax tag of a release version: the base its series variant is declared for."""
    return f"jax-v{version}"


def patched_source(sdist: Path, dest: Path, version: str | None = None) -> list[str]:
    """Copy the sdist to ``dest`` and apply the default jax series (its variant for jax
    ``version``; without one, the series' own files); returns applied patch names.
    Patches touching files the sdist does not ship (tests/) are left out and named."""
    series = load_series()
    selected = series.upstream("jax").select("default", base_ref_of(version) if version else None)
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(sdist, dest, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    init_repo(dest)
    applied = []
    for p in selected:
        path = p.path(series.root)
        files = {h.file for h in parse_patch(path.read_text(encoding="utf-8")) if not h.creates_file}
        if any(not (dest / f).is_file() for f in files):
            sys.stderr.write(f"note: {p.file} not applied: it changes files the sdist does not ship "
                             f"({', '.join(sorted(files))})\n")
            continue
        try:
            apply_patch(path, dest, p.file)
        except HarnessError:
            shutil.rmtree(dest, ignore_errors=True)
            raise
        applied.append(p.file)
    if not applied:
        shutil.rmtree(dest, ignore_errors=True)
        raise HarnessError(f"no patch of the jax series changes files that {sdist} ships: not a jax sdist?")
    return applied


def verify_sdist(archive: Path, version: str) -> None:
    """The sdist archive is the one series.toml names as the base of the jax series (or of its
    variant) for ``version``: a series for that version exists, and the sha256 is that base's."""
    jax = load_series().upstream("jax")
    ref = base_ref_of(version)
    expected = jax.base_sha256_for(ref)  # refuses a version the series has no variant for
    if not expected:
        raise HarnessError(f"series.toml records no base_sha256 for {ref}; cannot verify the sdist")
    from xla_harness.runtime.files import sha256_file

    try:
        digest = sha256_file(archive)
    except OSError as exc:
        raise HarnessError(f"cannot read {archive}: {exc.strerror or exc}") from None
    if digest != expected:
        raise HarnessError(f"{archive}: sha256 {digest} differs from series.toml's base_sha256 "
                           f"{expected} for {ref}")


def build(sdist: Path, venv: Path, python: str, extra: list[str], archive: Path | None = None) -> str:
    if not (sdist / "PKG-INFO").is_file():
        raise HarnessError(f"{sdist} is not an unpacked sdist (no PKG-INFO)")
    version = _sdist_version(sdist)
    if archive is not None:
        verify_sdist(archive, version)
    series = load_series()
    fp = series.fingerprint("jax", "default", base_ref_of(version))  # refuses a version with no variant
    key = hashlib.sha256((version + fp + " ".join(extra)).encode()).hexdigest()
    if (venv / STAMP).is_file() and (venv / STAMP).read_text().strip() == key:
        return f"{venv} is up to date (jax {version}, series {key[:12]})"
    # Built at its final path: a venv's scripts name its interpreter by absolute path, so a venv
    # renamed after the fact is broken. The stamp is written last; a venv without it is rebuilt.
    src = venv.with_name(venv.name + ".src")
    applied = patched_source(sdist, src, version)
    shutil.rmtree(venv, ignore_errors=True)
    try:
        for argv in ([python, "-m", "venv", str(venv)],
                     [str(venv / "bin/python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                      f"jaxlib=={version}", *extra],
                     [str(venv / "bin/python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                      "--no-deps", str(src)]):
            try:
                res = subproc.run(argv, capture_output=True, text=True, timeout=STEP_TIMEOUT_S,
                                  what=f"building {venv}: {' '.join(argv[1:4])}")
            except subproc.ChildTimeout:
                shutil.rmtree(venv, ignore_errors=True)
                raise
            if res.returncode != 0:
                last = (res.stderr.strip().splitlines() or ["(no output)"])[-1]
                shutil.rmtree(venv, ignore_errors=True)
                raise HarnessError(f"building {venv}: {' '.join(argv[1:4])} failed: {last}")
        (venv / STAMP).write_text(key + "\n")
    finally:
        shutil.rmtree(src, ignore_errors=True)
    return f"built {venv}: stock jaxlib {version} + jax {version} with {', '.join(applied) or 'no patches'}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m xla_harness.upstream.jaxvenv", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sdist", type=Path, required=True, help="unpacked jax sdist directory")
    ap.add_argument("--archive", type=Path,
                    help="the sdist archive SDIST was unpacked from: its sha256 must equal series.toml's base_sha256")
    ap.add_argument("--venv", type=Path, default=Path(".venv-jax-patched"))
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--with", dest="extra", default="numpy,optax,pytest",
                    help="comma-separated extra packages for the venv (default numpy,optax,pytest)")
    args = ap.parse_args(argv)
    try:
        print(build(args.sdist, args.venv, args.python, [e for e in args.extra.split(",") if e], args.archive))
    except HarnessError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
