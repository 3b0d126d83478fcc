#!/usr/bin/env python3
"""Build jaxlib (and the CUDA plugin) from source with this project's patch series.

Stages, each idempotent and resumable; each writes a log and, on success, a stamp that
records its inputs under WORK/ (default ~/.cache/xla-harness, or $XLA_HARNESS_WORK):

  resolve  jax version -> tag jax-v<version> -> XLA commit and sha256 from that tag's
           third_party/xla/revision.bzl (older tags: workspace.bzl; the oldest: WORKSPACE);
           the jax tag is cloned shallow into WORK/src/jax-<tag> (cached)
  fetch    XLA at that commit: the GitHub tarball, verified against the sha256 jax pins,
           unpacked into WORK/src/xla-<commit> (cached by commit)
  prepare  clean work trees per (commit, series fingerprint): WORK/trees/xla-<c>-<fp> and
           WORK/trees/jax-<version>-<fp> with the series applied by `git apply`: for each of
           xla and jax, the series' own files at its base_ref, else its variant for jax-v<version>
           (patches/series.toml); a version either series has no variant for is refused before
           any stage, and a variant that records its base commit is applied to that commit only
  bazel    find bazelisk (PATH, else `npx @bazel/bazelisk`); each later Bazel call gets
           USE_BAZEL_VERSION from the .bazelversion of the tree it runs in
  build    jax's own build/build.py build --wheels=jaxlib[,jax-cuda-plugin,jax-cuda-pjrt]
           --local_xla_path=<patched xla> --python_version=X.Y [--cuda_major_version=N]
           with a Bazel disk cache and repository cache under WORK (via --bazel_options)
  install  .venv-patched: the built wheels + the patched jax and its requirements + this package
  test     in the jax tree, `bazel test @xla//<target>` of the targets the series touches
           (series.toml) with the build's Bazel, output base, hermetic Python and toolchain;
           then, whatever that gave, this project's tests and a short stress matrix against
           .venv-patched (results/patched/); each part's result is printed, and any failure
           makes the exit status 1

Before any stage starts: Python >= 3.12, bazelisk (when a Bazel stage is selected) and free
disk (--min-free-gb, doubled with --cuda) are checked.
A stage is skipped when its stamp matches its current inputs; a stage whose inputs changed
is redone, and so are the stages after it. --dry-run prints every stage's exact commands
and touches nothing. Errors (no network, sha256 mismatch, a patch that does not apply,
bazelisk missing, Python too old, too little free disk) are one `error:` line and exit 2;
a stage killed midway leaves no stamp, and the next run redoes it from a clean state.
Every command runs in its own process group, killed with everything it started when it runs
longer than --command-timeout seconds (one `error:` line naming the command).

The TPU compiler lives in libtpu and is not rebuilt by any of this.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path
from typing import Any, NoReturn

from xla_harness.errors import HarnessError
from xla_harness.upstream.jaxlib_context import (
    COMMAND_TIMEOUT_S,
    DEFAULT_JAX,
    JAX_REPO,
    MIN_FREE_GB,
    REPO,
    XLA_TARBALL,
    Ctx,
    Runner,
)
from xla_harness.upstream.jaxlib_plan import fingerprint, jax_tag
from xla_harness.upstream.jaxlib_stages import (
    BUILT_UPSTREAMS,
    RUN,
    VENV_COMPLETE,
    TestsFailed,
    check_clean,
    describe_series,
    preflight,
)
from xla_harness.upstream.series import load_series

# The pieces: jaxlib_plan (pure helpers), jaxlib_context (Ctx, Runner, REPO and the defaults),
# jaxlib_stages (the stages and the preflight checks); here: stamps, the pipeline, the command line.
STAGES = ("resolve", "fetch", "prepare", "bazel", "build", "install", "test")


def stage_inputs(ctx: Ctx, stage: str) -> dict[str, Any]:
    """What a stage depends on: its options plus everything earlier stages produced."""
    base: dict[str, Any] = {"stage": stage, "state": dict(ctx.state)}
    if stage == "resolve":
        base.update(jax_version=ctx.jax_version, jax_repo=ctx.jax_repo)
    elif stage == "fetch":
        base.update(xla_url=ctx.xla_url)
    elif stage == "prepare":
        series = load_series()
        base.update(series=ctx.series, fingerprints={n: series.fingerprint(n, ctx.series, ctx.tag)
                                                     for n in BUILT_UPSTREAMS if n in series.upstreams})
    elif stage == "build":
        base.update(cuda=ctx.cuda, cuda_major=ctx.cuda_major, python=ctx.python)
    elif stage == "install":
        base.update(venv=str(ctx.venv))
    elif stage == "test":
        base.update(tests=list(ctx.harness_tests), steps=ctx.stress_steps, results=str(ctx.results))
    return base


# Stage outputs that name paths: a stamp whose paths are gone (a deleted tree or venv) is stale.
PATH_OUTPUTS = ("jax_src", "xla_src", "xla_tree", "jax_tree", "bazel", "dist", "venv")


def outputs_present(outputs: dict) -> bool:
    """Every path a stage produced still exists (a venv also carries its completion stamp)."""
    if "venv" in outputs and not (Path(outputs["venv"]) / VENV_COMPLETE).is_file():
        return False
    return all(Path(outputs[k]).exists() for k in PATH_OUTPUTS if k in outputs)


def check_trees_clean(ctx: Ctx, stage: str) -> None:
    """Before every build or bazel test, run or skipped: the trees hold the series and nothing else,
    so neither new wheels nor a stamp's claim about old ones can stand for edited sources."""
    for key in ("xla_tree", "jax_tree"):
        if key in ctx.state:
            check_clean(Path(ctx.state[key]), stage)


def read_stamp(path: Path) -> dict:
    """A stage's stamp ({"inputs": ..., "outputs": {...}}); a corrupt one is an error naming it."""
    from xla_harness.runtime.files import read_regular

    try:
        data = json.loads(read_regular(path).decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        data = None
    if not isinstance(data, dict) or not isinstance(data.get("outputs"), dict):
        raise HarnessError(f"{path} is not a stage stamp of this pipeline; delete it to run that stage again")
    return data


def check_options(ctx: Ctx) -> None:
    """Option values that would otherwise fail only after hours of building."""
    if not math.isfinite(ctx.min_free_gb) or ctx.min_free_gb < 0:
        raise HarnessError(f"--min-free-gb must be a non-negative number, got {ctx.min_free_gb}")
    if not math.isfinite(ctx.command_timeout_s) or ctx.command_timeout_s <= 0:
        raise HarnessError(f"--command-timeout must be a positive number of seconds, got {ctx.command_timeout_s}")
    if ctx.stress_steps <= 0:
        raise HarnessError(f"--stress-steps must be a positive integer, got {ctx.stress_steps}")
    if not ctx.harness_tests:
        raise HarnessError("--harness-tests lists no test file")
    if ctx.work.exists() and not ctx.work.is_dir():
        raise HarnessError(f"--work-dir {ctx.work} is not a folder")


def describe_plan(ctx: Ctx) -> list[str]:
    """The dry run's first lines: what is built, and the patch files each series applies for
    this jax version. Raises HarnessError for a version that is not a release, or that a series
    has no variant for."""
    jax_tag(ctx.jax_version)
    return [f"plan: jax {ctx.jax_version} ({ctx.tag}), series {ctx.series}, "
            f"{'CPU + CUDA ' + ctx.cuda_major if ctx.cuda else 'CPU'} wheels, work dir {ctx.work}",
            *(f"  {line}" for line in describe_series(ctx))]


def run_pipeline(ctx: Ctx, first: str = "resolve", last: str = "test") -> list[tuple[str, str]]:
    """Run stages first..last; returns (stage, 'done'|'skipped'|'planned') per stage."""
    i, j = STAGES.index(first), STAGES.index(last)
    if i > j:
        raise HarnessError(f"--from {first} comes after --to {last}")
    report = []
    run = Runner(ctx)
    # Outputs of stages before --from come from their stamps.
    for stage in STAGES[:i]:
        st = ctx.stamp(stage)
        if st.exists():
            ctx.state.update(read_stamp(st)["outputs"])
        elif not ctx.dry_run:
            raise HarnessError(f"--from {first}: stage {stage} has not run yet (no stamp in {st.parent})")
    redo = False
    for stage in STAGES[i:j + 1]:
        if stage in ("build", "test") and not ctx.dry_run:
            check_trees_clean(ctx, stage)
        inputs = fingerprint(stage_inputs(ctx, stage))
        st = ctx.stamp(stage)
        if not redo and st.exists():
            data = read_stamp(st)
            if data.get("inputs") == inputs and outputs_present(data.get("outputs", {})):
                ctx.state.update(data["outputs"])
                report.append((stage, "skipped"))
                if ctx.dry_run:
                    print(f"{stage}: up to date (stamp {st})")
                continue
        redo = True  # every later stage depends on this one's outputs
        if ctx.dry_run:
            print(f"{stage}:")
            ctx.state.update(RUN[stage](ctx, run))
            report.append((stage, "planned"))
            continue
        sys.stderr.write(f"[{stage}] running (log: {ctx.log(stage)})\n")
        st.unlink(missing_ok=True)
        outputs = RUN[stage](ctx, run)
        ctx.state.update(outputs)
        st.parent.mkdir(parents=True, exist_ok=True)
        tmp = st.with_suffix(".tmp")
        tmp.write_text(json.dumps({"inputs": inputs, "outputs": outputs}, indent=2))
        tmp.replace(st)
        report.append((stage, "done"))
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="build_jaxlib.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jax-version", default=DEFAULT_JAX, help=f"jax release to build (default {DEFAULT_JAX})")
    ap.add_argument("--series", choices=["default", "experimental"], default="default",
                    help="patch series: default, or default + experimental (A/B runs)")
    ap.add_argument("--cuda", action="store_true", help="also build jax-cuda-plugin and jax-cuda-pjrt")
    ap.add_argument("--cuda-major", default="12", choices=["12", "13"],
                    help="CUDA major version of the GPU wheels: jax's --cuda_major_version, which selects "
                         "--config=cuda<N> and its hermetic CUDA/cuDNN (default 12, as in jax's build.py)")
    ap.add_argument("--python", default=sys.executable, help="Python to build for and install into")
    ap.add_argument("--work-dir", type=Path,
                    default=Path(os.environ.get("XLA_HARNESS_WORK", Path.home() / ".cache" / "xla-harness")),
                    help="work dir for sources, trees, caches, logs and stamps")
    ap.add_argument("--jax-repo", default=JAX_REPO, help="jax git repository to clone the tag from")
    ap.add_argument("--xla-url", default=XLA_TARBALL, help="XLA tarball URL template with {commit}")
    ap.add_argument("--venv", type=Path, default=REPO / ".venv-patched", help="venv to install into")
    ap.add_argument("--from", dest="first", choices=STAGES, default="resolve", help="first stage to run")
    ap.add_argument("--to", dest="last", choices=STAGES, default="test", help="last stage to run")
    ap.add_argument("--min-free-gb", type=float, default=MIN_FREE_GB, help="free disk required to build")
    ap.add_argument("--dry-run", action="store_true", help="print every stage's commands, touch nothing")
    ap.add_argument("--results", type=Path, default=REPO / "results" / "patched",
                    help="where the test stage writes its stress results")
    ap.add_argument("--harness-tests", default="tests/hlo/test_hlo.py,tests/stress/test_stress.py",
                    help="comma-separated test files the test stage runs against the venv")
    ap.add_argument("--stress-steps", type=int, default=10, help="steps of the test stage's stress matrix")
    ap.add_argument("--command-timeout", type=float, default=COMMAND_TIMEOUT_S, metavar="SECONDS",
                    help="how long one command of a stage may run before its process group is killed "
                         f"(default {COMMAND_TIMEOUT_S:g})")

    def _error(message: str) -> NoReturn:
        sys.stderr.write(f"error: {message} (see --help)\n")
        raise SystemExit(2)

    ap.error = _error  # type: ignore[method-assign]
    try:
        args = ap.parse_args(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 0
    ctx = Ctx(work=args.work_dir.expanduser(), jax_version=args.jax_version, series=args.series,
              cuda=args.cuda, cuda_major=args.cuda_major, python=args.python, jax_repo=args.jax_repo,
              xla_url=args.xla_url, dry_run=args.dry_run, min_free_gb=args.min_free_gb, venv=args.venv,
              results=args.results, harness_tests=tuple(t for t in args.harness_tests.split(",") if t),
              stress_steps=args.stress_steps, command_timeout_s=args.command_timeout)
    try:
        check_options(ctx)
        plan = describe_plan(ctx)  # a jax version the series has no variant for stops here
        if ctx.dry_run:
            print("\n".join(plan))
            print("preflight:")
        stages = STAGES[STAGES.index(args.first):STAGES.index(args.last) + 1]
        for line in preflight(ctx, stages):
            if ctx.dry_run:
                print(f"  {line}")
        report = run_pipeline(ctx, args.first, args.last)
    except TestsFailed as exc:
        sys.stderr.write(f"{exc}\n")
        return 1
    except HarnessError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    except OSError as exc:
        sys.stderr.write(f"error: {exc.filename or ''}: {exc.strerror or exc}\n")
        return 2
    except KeyboardInterrupt:
        sys.stderr.write("interrupted: the current stage left no stamp and will be redone\n")
        return 130
    if not ctx.dry_run:
        for stage, status in report:
            print(f"{stage}: {status}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
