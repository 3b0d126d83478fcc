"""Compile and run XLA's own unit tests for the patch series without Bazel.

Method: the files the series touches (and, for each patched ``.cc``, its header and its
upstream ``*_test.cc``) are copied from an XLA source tree, the series is applied to the
copy, and only those files are compiled with g++. Everything else (the HLO parser, the
verifier, ShapeUtil, the rest of XLA) comes from the prebuilt XLA inside a pinned
tf-nightly wheel: its ``include/`` tree and ``libtensorflow_framework.so.2``. The
patched definitions interpose the wheel's copies at link time. gtest/gmock come from the
system (Debian: ``libgtest-dev libgmock-dev``); a small stand-in for XLA's
hardware-independent test base lives in ``xlatest_shim/`` (the wheel lacks it).

So a run tests *the patched source files* on top of *the wheel's XLA*; the two should be
close in time, and the output says which is which.

This module holds the commands (test, mutants, blast-radius, files) and their parser. The
pure planning is apart from the I/O: xlatest_plan (the wheel pin, what to copy, compile and
link), xlatest_gtest (gtest output), xlatest_guards (the guards mutants delete) and
xlatest_blast (fusion decisions compared) do no I/O; xlatest_build downloads, copies,
compiles and runs.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from collections.abc import Iterable
from pathlib import Path

from xla_harness.errors import HarnessError
from xla_harness.runtime import subproc
from xla_harness.upstream.prefusion import module_patterns, prefusion_modules
from xla_harness.upstream.series import Series, load_series
from xla_harness.upstream.xlatest_blast import PROBE_SOURCE, compare_decisions, refused_modules
from xla_harness.upstream.xlatest_build import (
    base_ref_for,
    build_and_run,
    cache_dir,
    check_toolchain,
    compile_cached,
    describe,
    ensure_wheel,
    new_run_dir,
    prepare_tree,
    refuse_local_changes,
    source_commit,
)
from xla_harness.upstream.xlatest_guards import check_guards_cover, guards_for_base, load_guards, mutate
from xla_harness.upstream.xlatest_plan import BUILD_TIMEOUT_S, TestUnit, Toolchain, source_files_needed


def _setup(args: argparse.Namespace, series: Series) -> tuple[Toolchain, list, list[TestUnit], list[str], Path]:
    xla_src = Path(args.xla_src)
    if not xla_src.is_dir():
        raise HarnessError(f"XLA_SRC {xla_src} is not a directory")
    refuse_local_changes(args.allow_dirty, f"xla-{args.command}")
    check_toolchain(args.cxx)
    patches = list(series.upstream("xla").select(args.series, args.base_ref))
    wheel = ensure_wheel(Path(args.cache))
    work = new_run_dir(Path(args.cache) / "xla-test")
    args.run_dir = work  # removed by main() when the command ends
    tree = work / "tree"
    sources_from = getattr(args, "sources_from", "")
    units, support_cc = prepare_tree(xla_src, [p.path(series.root) for p in patches], tree,
                                     wheel / "include", stock_sources=getattr(args, "stock_sources", False),
                                     sources_from=Path(sources_from) if sources_from else None)
    tc = Toolchain(args.cxx, tree, wheel / "include", wheel)
    return tc, patches, units, support_cc, work


def _resolve_base(args: argparse.Namespace, series: Series) -> None:
    """args.base_ref becomes the base the run is for (None: the series' own), and is printed."""
    up = series.upstream("xla")
    args.base_ref = base_ref_for(up, source_commit(Path(args.xla_src)), args.base_ref)
    which = (f"its variant for {args.base_ref}" if args.base_ref else f"the series' own files ({up.base_ref})")
    how = " (recorded for the tree's XLA commit)" if args.base_ref and not args.asked_base_ref else ""
    print(f"xla-{args.command}: series for the base: {which}{how}")


def cmd_files(args: argparse.Namespace) -> int:
    series = load_series()
    texts = [p.path(series.root).read_text(encoding="utf-8")
             for p in series.upstream("xla").select(args.series, args.base_ref or None)]
    for f in source_files_needed(texts):
        print(f)
    return 0


def cmd_test(args: argparse.Namespace) -> int:
    if args.stock_sources and args.sources_from:
        raise HarnessError("give --stock-sources (STOCK=1) or --sources-from (SOURCES_FROM=dir), not both")
    if not args.xla_src:
        print("xla-test: not checked: no XLA_SRC")
        return 0
    series = load_series()
    _resolve_base(args, series)
    tc, patches, units, support_cc, work = _setup(args, series)
    for line in describe(Path(args.xla_src), args.series, [p.file for p in patches], tc.wheel_lib_dir,
                         args.stock_sources, args.sources_from):
        print("xla-test: " + line)
    if not units:
        raise HarnessError(f"series {args.series!r} patches no XLA source with a unit test: nothing to run")
    worst = 0
    empty = []
    for unit in units:
        print(f"== {unit.test} (with {unit.source})", flush=True)
        run = build_and_run(tc, unit, support_cc, work, lambda s: print(s, flush=True), args.filter)
        for r in run.results:
            print(f"  {r.status.upper():7} {r.name}")
        n_fail = sum(r.status == "failed" for r in run.results)
        print(f"== {unit.name}: {run.verdict}: {len(run.results)} tests, {n_fail} failed (exit {run.returncode})")
        if run.verdict == "crashed":
            print(run.output[-3000:])
        if run.verdict == "no tests":
            empty.append(unit.name)
        worst = max(worst, 0 if run.verdict == "passed" else 1)
    if empty:  # a binary that ran no test checked nothing: not a pass, not a finding
        filt = f" (--filter {args.filter!r})" if args.filter else ""
        print(f"error: xla-test: no test ran in {', '.join(empty)}{filt}", file=sys.stderr)
        return 2
    return worst


def unit_for(units: Iterable[TestUnit], source: str, what: str) -> TestUnit:
    """The unit test compiled with ``source``; a clear error (not StopIteration) when there is none."""
    for unit in units:
        if unit.source == source:
            return unit
    raise HarnessError(f"{what}: no unit test is built with {source} (each guarded file needs its *_test.cc "
                       "in the tree); nothing to run the mutant against")


def cmd_mutants(args: argparse.Namespace) -> int:
    if not args.xla_src:
        print("xla-mutants: not checked: no XLA_SRC")
        return 0
    series = load_series()
    args.series = "default"
    _resolve_base(args, series)
    guards, absent = guards_for_base(load_guards(), series.upstream("xla"), args.base_ref)
    patches = [p.file for p in series.upstream("xla").select("default", args.base_ref)]
    uncovered = check_guards_cover(guards, patches)
    if uncovered:
        raise HarnessError(f"no guards listed for {', '.join(uncovered)} in patches/xla/guards.toml")
    tc, _, units, support_cc, work = _setup(args, series)
    for line in describe(Path(args.xla_src), "default", patches, tc.wheel_lib_dir, False):
        print("xla-mutants: " + line)
    if absent:  # listed, not skipped in silence: the guarded code does not exist at this base
        print(f"xla-mutants: {len(absent)} guards of the series have no counterpart at {args.base_ref} "
              "(patches/xla/guards.toml says why); not mutated:")
        for g, why in absent:
            print(f"  absent  {g.name}: {why}")
    pristine = {f: (tc.tree / f).read_text() for f in {g.file for g in guards}}
    rows = []
    for g in guards:
        if g.patch not in patches:
            continue
        unit = unit_for(units, g.file, f"guard {g.name} of {g.patch}")
        (tc.tree / g.file).write_text(mutate(pristine[g.file], g))
        try:
            print(f"== mutant: {g.patch} / {g.name}", flush=True)
            run = build_and_run(tc, unit, support_cc, work, lambda s: print(s, flush=True))
        finally:
            (tc.tree / g.file).write_text(pristine[g.file])
        failing = [r.name for r in run.results if r.status in ("failed", "crashed")]
        killed = bool(failing) or run.verdict == "crashed"
        rows.append((g.patch.split("/")[-1][:4], g.name, "killed" if killed else "SURVIVED",
                     ", ".join(failing) or ("crashed" if killed else "-")))
    print("\n| patch | guard deleted | verdict | failing tests |\n| --- | --- | --- | --- |")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    if not rows:
        raise HarnessError("no guard of the default series' patches was mutated: nothing checked")
    survivors = sum(r[2] == "SURVIVED" for r in rows)
    print(f"xla-mutants: {len(rows)} mutants, {len(rows) - survivors} killed, {survivors} survived"
          + (f"; {len(absent)} guards absent at this base (listed above)" if absent else ""))
    return 1 if survivors else 0


def cmd_blast(args: argparse.Namespace) -> int:
    if not args.xla_src:
        print("xla-blast-radius: not checked: no XLA_SRC")
        return 0
    modules = prefusion_modules(Path(args.modules))
    if not modules:
        raise HarnessError(f"no pre-fusion modules ({module_patterns()}) under {args.modules} "
                           "(make them with python -m xla_harness.upstream.prefusion --out DIR [--target T])")
    series = load_series()
    args.series = "default"
    _resolve_base(args, series)
    tc, patches, units, _, work = _setup(args, series)
    unit = next((u for u in units if u.source == "xla/service/instruction_fusion.cc"), None)
    if unit is None:
        raise HarnessError("the default series does not patch xla/service/instruction_fusion.cc")
    for line in describe(Path(args.xla_src), "default", [p.file for p in patches], tc.wheel_lib_dir, False):
        print("xla-blast-radius: " + line)
    if args.sources_from:
        print(f"xla-blast-radius: the patched side is {unit.source} from {args.sources_from}, not the series")
    log = lambda s: print(s, flush=True)  # noqa: E731
    stock_dir = work / "stock" / Path(unit.source).parent
    stock_dir.mkdir(parents=True, exist_ok=True)
    stock_src = stock_dir / Path(unit.source).name
    shutil.copyfile(Path(args.xla_src) / unit.source, stock_src)
    probe = compile_cached(tc, PROBE_SOURCE, work / "obj", log)
    outputs: dict[str, str] = {}
    refused: dict[str, list[tuple[str, str]]] = {}
    for label, src in (("stock", stock_src), ("patched", tc.tree / unit.source)):
        obj = compile_cached(tc, src, work / "obj", log)
        exe = work / "bin" / f"fusion_decisions_{label}"
        exe.parent.mkdir(parents=True, exist_ok=True)
        res = subproc.run(tc.link_argv([probe, obj], exe), capture_output=True, text=True, timeout=BUILD_TIMEOUT_S,
                          what=f"linking the {label} probe")
        if res.returncode != 0:
            raise HarnessError(f"linking the {label} probe failed: {(res.stderr.strip().splitlines() or ['?'])[-1]}")
        run = subproc.run([str(exe), *map(str, modules)], capture_output=True, text=True, timeout=BUILD_TIMEOUT_S,
                          what=f"the {label} probe")
        if run.returncode not in (0, 2):
            raise HarnessError(f"the {label} probe died (exit {run.returncode})")
        outputs[label] = run.stdout
        refused[label] = refused_modules(run.stderr)
    if refused["stock"] != refused["patched"]:
        raise HarnessError("the stock and patched probes refused different modules; the runs are not comparable")
    radius = compare_decisions(outputs["stock"], outputs["patched"], len(modules) - len(refused["stock"]))
    print(f"xla-blast-radius: {len(modules)} pre-fusion modules from {args.modules}, "
          f"{len(refused['stock'])} the wheel's parser refused, {radius.modules} read, "
          f"{radius.modules_with_pairs} with in-place candidate pairs, {radius.pairs} pairs evaluated, "
          f"{len(radius.changed)} decisions changed")
    for row in radius.changed:
        print("  changed: " + "  ".join(row))
    for file, why in refused["stock"]:
        print(f"  refused: {Path(file).name}  {why[:300]}")
    return 1 if refused["stock"] else 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m xla_harness.upstream.xlatest", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    for name, help_text in (("test", "compile and run the patched XLA unit tests"),
                            ("mutants", "delete each guard of each default patch; every mutant must fail a test"),
                            ("blast-radius", "count fusion decisions the default series changes over HLO modules")):
        p = sub.add_parser(name, help=help_text)
        p.add_argument("--xla-src", default="", help="XLA source tree (checkout or partial copy)")
        p.add_argument("--cache", default=str(cache_dir()), help="download/build cache")
        p.add_argument("--cxx", default="g++", help="C++ compiler")
        p.add_argument("--base-ref", default="", help="the base the XLA tree is, as series.toml names it "
                       "(e.g. jax-v0.9.0.1): its variant's files; default: the variant recorded for the "
                       "tree's XLA commit, else the series' own files")
        p.add_argument("--allow-dirty", action="store_true",
                       help="run from an xla-harness checkout with local changes (its log records "
                            "xla-harness <commit>-dirty and is not evidence); refused without it")
        if name == "test":
            p.add_argument("--series", default="default", help="default | experimental")
        if name in ("test", "blast-radius"):
            p.add_argument("--sources-from", default="", metavar="DIR",
                           help="take the patched non-test sources from DIR (same relative paths) instead "
                                "(blast-radius: the decisions of that source against stock)")
        if name == "test":
            p.add_argument("--stock-sources", action="store_true",
                           help="keep the non-test sources stock (patched tests over stock code)")
            p.add_argument("--filter", default="", help="gtest filter")
        if name == "blast-radius":
            p.add_argument("--modules", default="",
                           help=f"folder of pre-fusion modules ({module_patterns()}; searched recursively)")
    files = sub.add_parser("files", help="print the XLA files a partial XLA_SRC needs for a series (for git archive)")
    files.add_argument("--series", default="default", help="default | experimental")
    files.add_argument("--base-ref", default="", help="the base (e.g. jax-v0.9.0.1): its variant's files")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.asked_base_ref = args.base_ref
    try:
        commands = {"test": cmd_test, "mutants": cmd_mutants, "blast-radius": cmd_blast, "files": cmd_files}
        return commands[args.command](args)
    except HarnessError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    finally:
        run_dir = getattr(args, "run_dir", None)
        if run_dir is not None:
            shutil.rmtree(run_dir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
