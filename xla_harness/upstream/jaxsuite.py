"""JAX's own test files against the patched jax, with jax_zero_cotangent_masking off and on.

    python -m xla_harness.upstream.jaxsuite --jax-src DIR [--python PY] [--out DIR] [--files a,b]

DIR is a jax-ml/jax source tree (only its ``tests/``, ``conftest.py`` and ``pyproject.toml`` are
used). They are copied to ``OUT/src``, the series' patches that touch ``tests/`` (0002) are applied
there, and each file of ``SUITE`` runs with pytest in the patched venv twice, one file at a time:
``JAX_ZERO_COTANGENT_MASKING=0`` and ``=1`` (the env var the patched config reads), with
``JAX_NUM_GENERATED_CASES`` set. Per file: passed/failed/errors/skipped for each flag value, and
every test whose outcome differs. Writes ``OUT/<flag>/<file>.xml`` (junit), ``OUT/summary.json``
and ``OUT/table.md``; exit 1 when any outcome differs, 2 on bad input and when a file could not be
compared: its run timed out, failed to collect, ran no test (none selected, or all skipped), or
has no results for the other flag value. Such a file is named in the table and in one ``error:``
line; a file not compared never counts as "no difference".
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass, field
from pathlib import Path

from xla_harness.errors import HarnessError
from xla_harness.runtime import subproc
from xla_harness.upstream.apply import apply_patch, init_repo
from xla_harness.upstream.patchcheck import parse_patch
from xla_harness.upstream.series import load_series

FLAGS = {"off": "0", "on": "1"}
EIGHT_DEVICES = "--xla_force_host_platform_device_count=8"


@dataclass(frozen=True)
class SuiteFile:
    file: str
    select: str | None = None  # pytest -k expression; None runs the whole file
    devices: int = 1  # host CPU devices the file needs
    # (text, replacement) applied to the copied file when the text is present: imports of names the
    # jax under test lacks (jax main's tests are newer than the sdist); reported with the results.
    adapt: tuple[tuple[str, str], ...] = ()


GRADIENT_TESTS = "grad or jvp or vjp or jac or hessian or lineariz"
# jax main's api_test imports two names jax 0.12.0.1 lacks; without them the tests that use them skip.
API_TEST_IMPORT = "from jax._src.ad_checkpoint import saved_residuals, custom_remat, SaveOnlyTheseNames\n"
API_TEST_IMPORT_ADAPTED = """from jax._src.ad_checkpoint import saved_residuals
try:
  from jax._src.ad_checkpoint import custom_remat, SaveOnlyTheseNames
except ImportError:  # not in the jax under test: the tests that use them skip
  import unittest as _unittest
  class SaveOnlyTheseNames: pass
  def custom_remat(*args, **kwargs):
    raise _unittest.SkipTest('jax._src.ad_checkpoint.custom_remat is not in the jax under test')
"""
SUITE = (
    SuiteFile("lax_autodiff_test.py"),
    SuiteFile("nn_test.py"),
    SuiteFile("pjit_test.py", f"reduced or remat or {GRADIENT_TESTS}", devices=8),
    SuiteFile("lax_control_flow_test.py", GRADIENT_TESTS),
    SuiteFile("api_test.py", GRADIENT_TESTS, adapt=((API_TEST_IMPORT, API_TEST_IMPORT_ADAPTED),)),
    SuiteFile("linalg_test.py", GRADIENT_TESTS),
    SuiteFile("lax_test.py", GRADIENT_TESTS),
)


@dataclass
class FileRun:
    file: str
    select: str | None
    flag: str
    outcomes: dict[str, str] = field(default_factory=dict)  # test id -> passed|failed|error|skipped
    seconds: float = 0.0
    note: str = ""  # why there are no outcomes (timeout, collection error)

    def counts(self) -> dict[str, int]:
        out = {k: 0 for k in ("passed", "failed", "error", "skipped")}
        for v in self.outcomes.values():
            out[v] += 1
        return out

    def problem(self) -> str:
        """Why this run cannot be compared ('' when it can): its note (timeout, collection error),
        or no test ran."""
        if self.note:
            return self.note
        if not self.outcomes:
            return "no tests ran"
        if all(v == "skipped" for v in self.outcomes.values()):
            return f"no tests ran (all {len(self.outcomes)} skipped)"
        return ""


def parse_junit(text: str, file: str) -> dict[str, str]:
    """Test id (``file::Class::name``) -> outcome, from pytest's junit XML."""
    outcomes: dict[str, str] = {}
    for case in ET.fromstring(text).iter("testcase"):
        cls = case.get("classname", "").rsplit(".", 1)[-1]
        tid = f"{file}::{cls}::{case.get('name', '')}"
        tags = {child.tag for child in case}
        if "error" in tags:
            outcome = "error"
        elif "failure" in tags:
            outcome = "failed"
        elif "skipped" in tags:
            outcome = "skipped"
        else:
            outcome = "passed"
        # A test failing in call and erroring in teardown appears twice: keep the worse.
        if outcomes.get(tid) not in ("error", "failed"):
            outcomes[tid] = outcome
    return outcomes


def junit_collection_errors(text: str) -> list[str]:
    """The modules pytest failed to collect, from its junit XML (a testcase with an error whose
    message is 'collection failure', named after the module)."""
    return [case.get("name", "") for case in ET.fromstring(text).iter("testcase")
            if any(child.tag == "error" and child.get("message") == "collection failure" for child in case)]


def _read_results(run: FileRun, xml: Path) -> None:
    """Fill ``run.outcomes`` from the junit file ``xml``; a collection error or an unreadable file
    goes to ``run.note``."""
    try:
        text = xml.read_text(encoding="utf-8")
        run.outcomes = parse_junit(text, run.file)
        broken = junit_collection_errors(text)
    except (OSError, ET.ParseError) as exc:
        run.note = run.note or f"unreadable results ({exc})"
        return
    if broken and not run.note:
        run.note = f"collection error in {', '.join(broken)}"


def not_compared(runs: dict[tuple[str, str], FileRun]) -> dict[str, str]:
    """File -> why its flag off and flag on outcomes were not compared, for every file in ``runs``
    that cannot be: a run with a problem, or no run for one of the flag values."""
    out: dict[str, str] = {}
    for file in dict.fromkeys(f for f, _ in runs):
        why = []
        for flag in FLAGS:
            run = runs.get((file, flag))
            if run is None:
                why.append(f"flag {flag}: no results")
            elif run.problem():
                why.append(f"flag {flag}: {run.problem()}")
        if why:
            out[file] = "; ".join(why)
    return out


def differences(off: FileRun, on: FileRun) -> list[tuple[str, str, str]]:
    """(test id, outcome flag off, outcome flag on) for every test whose outcome differs."""
    ids = sorted(set(off.outcomes) | set(on.outcomes))
    return [(t, off.outcomes.get(t, "absent"), on.outcomes.get(t, "absent")) for t in ids
            if off.outcomes.get(t, "absent") != on.outcomes.get(t, "absent")]


def _cell(run: FileRun | None) -> str:
    if run is None:
        return "no results"
    if run.note:
        return run.note
    c = run.counts()
    return f"{c['passed']}/{c['failed']}/{c['error']}/{c['skipped']}"


def render_table(runs: dict[tuple[str, str], FileRun]) -> str:
    """Markdown: one row per file, passed/failed/errors/skipped with the flag off and on."""
    lines = ["| file | tests run (-k) | flag off p/f/e/s | flag on p/f/e/s | differences |",
             "|---|---|---|---|---|"]
    diffs_all: list[tuple[str, str, str]] = []
    skipped = not_compared(runs)
    for file in dict.fromkeys(f for f, _ in runs):
        off, on = runs.get((file, "off")), runs.get((file, "on"))
        some = off or on
        assert some is not None, file  # the file is a key of runs, so one of the two is there
        select = f"`-k {some.select}`" if some.select else "all"
        if file in skipped or off is None or on is None:  # not_compared lists a missing flag value too
            column = "not compared"
        else:
            diffs = differences(off, on)
            diffs_all += diffs
            column = str(len(diffs))
        lines.append(f"| {file} | {select} | {_cell(off)} | {_cell(on)} | {column} |")
    lines.append("")
    if not runs:
        lines.append("Nothing was compared: no file has results.")
    if skipped:
        lines.append("Files not compared (their outcomes are unknown, not the same):")
        lines += [f"- {file}: {why}" for file, why in skipped.items()]
        lines.append("")
    if diffs_all:
        lines.append("Tests whose outcome differs (flag off -> flag on):")
        lines += [f"- `{t}`: {a} -> {b}" for t, a, b in diffs_all]
    elif runs and not skipped:
        lines.append("No test outcome differs between flag off and flag on.")
    elif len(skipped) < len(dict.fromkeys(f for f, _ in runs)):
        lines.append("No test outcome differs between flag off and flag on in the files compared.")
    return "\n".join(lines) + "\n"


def prepare_tests(jax_src: Path, dest: Path) -> list[str]:
    """Copy ``jax_src``'s tests/, conftest.py and pyproject.toml to ``dest`` and apply the jax
    series' patches that touch tests/; returns the applied patch names."""
    if not (jax_src / "tests" / "lax_autodiff_test.py").is_file():
        raise HarnessError(f"{jax_src} is not a jax source tree (no tests/lax_autodiff_test.py)")
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(jax_src / "tests", dest / "tests", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("conftest.py", "pyproject.toml"):
        if (jax_src / name).is_file():
            shutil.copyfile(jax_src / name, dest / name)
    init_repo(dest)
    series = load_series()
    applied = []
    for p in series.upstream("jax").select("default"):
        path = p.path(series.root)
        if not all(h.file.startswith("tests/") for h in parse_patch(path.read_text(encoding="utf-8"))):
            continue
        apply_patch(path, dest, p.file)
        applied.append(p.file)
    for entry in SUITE:
        test = dest / "tests" / entry.file
        for text, replacement in entry.adapt:
            if test.is_file() and text in (body := test.read_text(encoding="utf-8")):
                test.write_text(body.replace(text, replacement), encoding="utf-8")
                applied.append(f"{entry.file}: {text!r} -> {replacement!r}")
    return applied


def run_file(python: str, src: Path, entry: SuiteFile, flag: str, out: Path, cases: int,
             timeout: float) -> FileRun:
    """One file, one flag value, in a fresh pytest process (argv list, no shell)."""
    xml = (out / flag / (entry.file.removesuffix(".py") + ".xml")).absolute()
    xml.parent.mkdir(parents=True, exist_ok=True)
    xml.unlink(missing_ok=True)
    env = {**os.environ, "JAX_ZERO_COTANGENT_MASKING": FLAGS[flag], "JAX_NUM_GENERATED_CASES": str(cases),
           "JAX_PLATFORMS": "cpu"}
    if entry.devices > 1:
        env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} {EIGHT_DEVICES}".strip()
    argv = [os.path.abspath(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={xml}",
            f"tests/{entry.file}"]
    if entry.select:
        argv += ["-k", entry.select]
    run = FileRun(entry.file, entry.select, flag)
    t0 = time.monotonic()
    rc = None
    try:  # pytest in its own process group: a timeout kills what it started too
        rc = subproc.run(argv, cwd=src, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         timeout=timeout).returncode
    except subproc.ChildTimeout:
        run.note = f"timeout after {timeout:.0f} s"
    run.seconds = time.monotonic() - t0
    if xml.is_file():
        _read_results(run, xml)
    elif not run.note:
        run.note = f"no results (collection failed, pytest exit {rc})"
    # pytest: 0 all passed, 1 some failed, 5 no tests collected; 2, 3, 4: interrupted, internal
    # error, usage error (a run that did not finish: its outcomes are not the file's).
    if rc not in (None, 0, 1, 5) and not run.note:
        run.note = f"pytest exit {rc} (interrupted or usage error)"
    return run


def earlier_run(out: Path, entry: SuiteFile, flag: str) -> FileRun | None:
    """The results of an earlier run of ``entry`` with ``flag`` kept in ``out``, if any."""
    xml = out / flag / (entry.file.removesuffix(".py") + ".xml")
    if not xml.is_file():
        return None
    run = FileRun(entry.file, entry.select, flag)
    _read_results(run, xml)
    return run


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m xla_harness.upstream.jaxsuite", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jax-src", type=Path, required=True, help="jax-ml/jax source tree (its tests/ is used)")
    ap.add_argument("--python", default=".venv-jax-patched/bin/python", help="python of the patched venv")
    ap.add_argument("--out", type=Path, default=Path("out/jax-suite"))
    ap.add_argument("--files", default="", help="comma-separated subset of the suite's files")
    ap.add_argument("--generated-cases", type=int, default=3, help="JAX_NUM_GENERATED_CASES")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per file and flag value")
    ap.add_argument("--flags", default="off,on",
                    help="flag values to run (default off,on); a value not run is read from OUT/<flag>/<file>.xml "
                         "of an earlier run when present")
    args = ap.parse_args(argv)
    try:
        wanted = [f for f in args.files.split(",") if f]
        flags = [f for f in args.flags.split(",") if f]
        if not flags or set(flags) - set(FLAGS):
            raise HarnessError(f"--flags must name off and/or on, got {args.flags!r}")
        unknown = sorted(set(wanted) - {e.file for e in SUITE})
        if unknown:
            raise HarnessError(f"--files: {unknown[0]} is not in the suite ({', '.join(e.file for e in SUITE)})")
        if not Path(args.python).is_file():
            raise HarnessError(f"{args.python} does not exist; build the patched venv with 'make jax-patched-venv'")
        applied = prepare_tests(args.jax_src, args.out / "src")
    except HarnessError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    print(f"jax tests from {args.jax_src}; applied: {'; '.join(applied) or 'nothing'}", flush=True)
    runs: dict[tuple[str, str], FileRun] = {}
    for entry in SUITE:
        if wanted and entry.file not in wanted:
            continue
        for flag in FLAGS:
            if flag in flags:
                run = run_file(args.python, args.out / "src", entry, flag, args.out, args.generated_cases,
                               args.timeout)
                print(f"{entry.file} flag {flag}: {_cell(run)} (p/f/e/s) in {run.seconds:.0f} s", flush=True)
            else:
                earlier = earlier_run(args.out, entry, flag)
                if earlier is None:
                    continue
                run = earlier
            runs[(entry.file, flag)] = run
    table = render_table(runs)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "table.md").write_text(table, encoding="utf-8")
    (args.out / "summary.json").write_text(json.dumps([asdict(r) for r in runs.values()], indent=1),
                                           encoding="utf-8")
    print(table, end="")
    skipped = not_compared(runs)
    if skipped or not runs:
        named = "; ".join(f"{file} ({why})" for file, why in skipped.items()) or "no file has results"
        sys.stderr.write(f"error: jax-suite: not compared (no test outcome known): {named}\n")
        return 2
    same = all(not differences(runs[(f, "off")], runs[(f, "on")]) for f, fl in runs if fl == "off")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
