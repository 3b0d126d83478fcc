"""Prepare an upstream pull request bundle from series.toml and the evidence under results/.

``out/pr/<target>/`` receives:

* ``series.mbox``   the default patches in ``git format-patch`` layout, ready for ``git am``;
* ``PR.md``         the description: problem, root cause, why this fix and not the reported
                    one, tests added, evidence (scanner findings and stress tables found
                    under ``results/``, with their environment lines), risk, how to reproduce;
* ``CHECKLIST.md``  the upstream contribution checklist with the validation commands;
* ``APPENDIX.md``   (XLA) the long form above with its evidence, while PR.md is what a reviewer
                    reads: what is refused and why, what it changes (the blast radius), why not
                    GPU's rule, the change, its tests and limits.

Nothing is hand-written per release: texts come from series.toml, the patches' own commit
messages and the results files; missing evidence is stated, never invented.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from xla_harness.errors import HarnessError
from xla_harness.resources import source_checkout
from xla_harness.upstream.series import Series, Upstream

ROOT = source_checkout() or Path()  # results/ of this checkout; installed from a wheel, the cwd's

# Per-target prose that does not change between releases.
CONTEXT = {
    "xla": {
        "problem": (
            "A model that ties its embedding matrix (token lookup = gather, output projection = "
            "dot with the same matrix) has two gradient paths into one parameter: a sparse "
            "scatter-add and a dense dot. jax-ml/jax#35409 reports non-finite updates in 34 of 80 "
            "steps on TPU v6e-8 for the full tied model with remat, 0 of 80 in five other "
            "configurations. The optimized HLO had a fusion whose root is a scatter whose in-place "
            "operand is `transpose(parameter)` (openxla/xla#38597)."),
        "review": (
            "This answers the review of openxla/xla#38607 (https://github.com/openxla/xla/pull/38607): "
            "\"most likely not the right fix. Instead, such fusions should not be created.\" That "
            "PR skipped every transpose and reshape when tracing fusion in-place operands; this "
            "change instead stops the fusion from being created, at the fusion decision."),
        "root_cause": (
            "Generic `InstructionFusion::ShouldFuseInPlaceOp` (xla/service/instruction_fusion.cc) "
            "applies its index checks to a dynamic-update-slice only (`if (dus_ops.empty()) return "
            "Allow();`, under a TODO asking which other ops have an in-place emitter). For any other "
            "in-place op a producer with one non-elementwise op fuses into the in-place operand, "
            "`transpose(w)` into a scatter included, and a producer of the updates may read the "
            "in-place operand (`scatter(w, idx, negate(w))`). `AliasInfo` gives the transposed case no "
            "in-place pair; openxla/xla#38607 proposed giving it one, which would let the scatter "
            "overwrite elements the transpose has yet to read."),
        "why": (
            "Tracing the in-place pair through a data-moving transpose (openxla/xla#38607) is "
            "unsound: element i of `transpose(p)` is not the bytes of element i of `p`. Refusing the "
            "fusion leaves alias analysis as it is and keeps the invariant every sharing of the "
            "output with what the in-place operand reads needs: element i comes from element i. "
            "PR.md says what is refused and why; at bases without the backend's no-op hook (the XLA "
            "jax 0.9.0.1 pins) the no-ops are bitcasts, what `AliasInfo` follows there."),
        "refuses": (
            "For every in-place op but a dynamic-update-slice (whose index checks stay as they are): "
            "scatter, in-place collectives, custom-calls with `output_to_operand_aliasing`. "
            "`ShouldFuseInPlaceOp` now refuses to fuse (1) a producer that moves data into the op's "
            "in-place operand: element i of its result is not element i of the buffer it reads (a "
            "transpose or reshape that is not a bitcast under its layouts, an elementwise op such as "
            "`copy` whose operand layout or element size differs from its result's, a broadcast of as "
            "many elements as it makes, any other non-elementwise op the backend's "
            "`IsNoOpForAliasAnalysis` does not name), also inside a fusion nested in the producer; "
            "(2) a producer of another operand (the updates) that reads the in-place operand."),
        "reason": (
            "A fused in-place op writes its output into the buffer its in-place operand reads whenever "
            "the two share one: through `AliasInfo`'s in-place pairs, buffer reuse of an operand that "
            "dies there, or a backend's own aliasing (libtpu states its own in `backend_config`). "
            "Sharing is safe when element i is computed from element i, since each element is read "
            "before the op overwrites it: elementwise producers, iota and broadcasts of fewer "
            "elements keep fusing. It is not safe when the producer moves data: writing element i "
            "overwrites the element some later i' still has to read. (2) is a race whatever the "
            "producer: the op overwrites the in-place buffer while the fused updates still read it."),
        "changes": (
            "This is hardening of the generic decision, not the fix of a miscompile seen in open XLA. "
            "CPU does not fuse a scatter with its producers, and GPU's priority fusion asks "
            "`CanEmitInputFusedScatter` first, which already refuses every producer into, or reading, "
            "a scatter's in-place operand. The case it guards is the report's: jax-ml/jax#35409 shows "
            "a TPU program whose optimized HLO has a scatter fused with `transpose(w)` as its in-place "
            "operand (openxla/xla#38597); TPU compiles with libtpu, which carries its own XLA, so "
            "whether this decision reaches it is libtpu's to say."),
        "not_gpu_rule": (
            "GPU's rule, applied generically (nothing fuses into the in-place operand), is simpler but "
            "refuses the elementwise and broadcast producers that can run in place: the "
            "zero-initialised gradient buffer of a gather (`broadcast(0)` into a scatter-add) and "
            "the scaled updates of an optimizer. On the CPU pre-fusion modules above it changes "
            "{gpu_rule} decisions against this change's {ours}; `MovesData` (layouts, element "
            "sizes, broadcast counts, the backend's hook) is what tells those apart."),
        "risk": (
            "Fewer fusions where an in-place op other than dynamic-update-slice (scatter in "
            "practice) has a data-moving producer, or updates that read its in-place operand: an "
            "extra materialized buffer for such producers. Blast radius, measured with the generic "
            "decision function over the pre-fusion modules of 18 JAX programs (embedding and "
            "segment-sum gradients, scatter-add, scans, cache updates, MLP, sort, conv): on XLA's "
            "CPU pipeline 53 modules, 83 (producer, in-place consumer) pairs, 2 decisions change, "
            "both the #35409 shape after layout assignment (`scatter(copy(transpose(w)))`, the copy "
            "the physical transpose), 0 needless refusals (the zero-initialised "
            "`broadcast(constant)` gradient buffers still fuse); as they enter libtpu's "
            "`tpu_fusion` (v6e:2x4, ahead of time, plus the #35409 program at scale 1/32) 95 "
            "modules, 1100 pairs, 10 changes, all wanted: one pair in each of two programs (the tied "
            "model with remat on and off; a layout-changing copy of W's dense gradient into the "
            "scatter's in-place operand) at each of libtpu's five entries into the pass; as they "
            "enter the CUDA plugin's `priority-fusion` (H100) 19 modules, 95 pairs, 3 changes: 2 "
            "wanted (`transpose(w)` into a scatter-add) and 1 "
            "needless but inert (a reduce-scatter into the #35409 program's second scatter, which "
            "no fusion pass fuses)."),
        "tests_note": (
            "The new `InstructionFusionTest` cases are listed in the commit message. Each forbidden "
            "case fails on stock sources (named under Evidence); each allowed case fails when the "
            "exemption it covers is deleted (`make xla-mutants`); four forbidden cases pin the known "
            "limits. `ShouldFuseInPlaceOpAllowsElementwiseIntoScatter` is a regression test, not "
            "evidence: it passes on stock and under every mutant. The existing dynamic-update-slice "
            "tests pass unchanged."),
        "run_where": (
            "`make xla-test` (xla-harness) compiled the patched `instruction_fusion.cc` and "
            "XLA's `instruction_fusion_test.cc` with g++ against the XLA inside the tf-nightly "
            "2.23.0.dev20261026 wheel (headers and libtensorflow_framework.so.2; a small stand-in "
            "for the hardware-independent test base) and ran them on x86-64 CPU, on the XLA "
            "sources of the bases listed below. The tests that need the change fail on stock "
            "sources and pass patched; `make xla-mutants` deletes each guard of the change in turn "
            "(and asks the backend's no-op hook first, for the hook order) and every mutant fails a "
            "test. Not run: Bazel, GPU, TPU (libtpu carries its own XLA)."),
        "limits": (
            "What the change refuses though it could be allowed (stock fuses each): a producer that "
            "reads a larger buffer than the output (a slice, a reduce-scatter, a dynamic-slice: it cannot "
            "be the output's buffer) or a smaller one (a pad), a scatter into a scatter's in-place "
            "operand, a same-index slice into a dynamic-update-slice inside a nested fusion (the index "
            "checks do not look there), and, on tiled layouts, an elementwise op such as a `convert` "
            "whose operand and result tile differently (tiled shapes are never asked the bitcast "
            "predicates). What it leaves as stock does: a layout-changing `copy` into a "
            "dynamic-update-slice's in-place operand, decided by the DUS checks. The only such pair "
            "in the blast radius is the GPU's reduce-scatter into the #35409 program's second "
            "scatter, which no fusion pass fuses. The change is to the generic decision only: GPU's "
            "own fusion rules and TPU's closed compiler decide for themselves, and backends that do "
            "not call `ShouldFuseInPlaceOp` are not affected."),
        "tpu": (
            "What is known, not assumed. The report (jax-ml/jax#35409) saw non-finite updates on TPU "
            "v6e-8 and an optimized HLO with a fusion whose root is a scatter into "
            "`transpose(parameter)`. For such a fusion generic `AliasInfo` reports no in-place pair; if a "
            "compiler nevertheless wrote the scatter's output into the buffer the transpose reads, "
            "elements would be overwritten before they are read. TPU programs are "
            "compiled by the closed libtpu, which carries its own XLA: whether libtpu fuses or "
            "aliases that way, and whether that fusion caused the report's non-finite steps, is not "
            "established here. This change makes generic XLA refuse the fusion; it changes libtpu "
            "only if libtpu takes this code."),
        "not_run": (
            "Not run: Bazel (`bazel test //xla/service:instruction_fusion_test`, layering checks); "
            "GPU execution and XLA's GPU fusion tests (GPU priority fusion calls "
            "`ShouldFuseInPlaceOp` for every pair); TPU (libtpu carries its own XLA)."),
    },
    "jax": {
        "problem": ("`grad(lambda x: jnp.where(x > 0, jnp.sqrt(x), 0.))` is NaN at x <= 0: the zero "
                    "cotangent of the dead branch times an infinite derivative is NaN."),
        "root_cause": "0 * inf = NaN in the JVP/transpose rules of primitives with singular derivatives.",
        "why": "A zero cotangent wins over an infinite derivative, as JAX already does for symbolic zeros.",
        "risk": "Behind an opt-in config flag; default behaviour is bit-for-bit unchanged.",
        "tests_note": "The tests run against the patched jax 0.12.0.1 sdist in xla-harness's CI.",
    },
    "tensorflow": {
        "problem": (
            "The gradient of `tf.where(x > 0, tf.sqrt(x), 0.0)` at x = [-1, 0, 1, 4] is "
            "[0, 0, 0.5, 0.25] in eager mode and under tf.function, but [nan, nan, 0.5, 0.25] "
            "under `tf.function(jit_compile=True)`; the same for `tf.math.rsqrt` and "
            "`tf.math.reciprocal`. A model that guards a singular op with tf.where trains under "
            "eager and turns NaN as soon as it is compiled with XLA."),
        "root_cause": (
            "tf.where sends a zero upstream gradient into the branch it did not select. The CPU and "
            "GPU kernels of SqrtGrad, RsqrtGrad and ReciprocalGrad "
            "(tensorflow/core/kernels/cwise_ops_gradients.h) return 0 where that gradient is 0; "
            "their lowerings multiply unguarded, and 0 * inf (y == 0, or y == inf for the "
            "reciprocal) is NaN. TF lowers them in two places: the tf2xla kernels "
            "(tensorflow/compiler/tf2xla/kernels/binary_ops.cc: the old bridge, which "
            "jit_compile uses on CPU in TF 2.21, and the MLIR bridge with op fallback, where "
            "SqrtGrad and RsqrtGrad are in IsOpTypeAllowedTf2XlaPreferred) and the TF-to-TF "
            "patterns LowerSqrtGradOp and LowerRsqrtGradOp of "
            "tensorflow/compiler/mlir/tensorflow/transforms/lower_tf.td (xla-legalize-tf without "
            "preferring tf2xla, TF to StableHLO, TFLite's prepare-tf). ReciprocalGrad has only "
            "the tf2xla kernel."),
        "why": (
            "Both lowering paths take the eager kernels' semantics: select(dy == 0, 0, formula) "
            "(0001: the tf2xla kernels; 0002: the lower_tf.td patterns, through one DRR class in "
            "the style of BinaryNoNanPat). Nothing changes where dy != 0. Ops whose eager kernels "
            "have no such guard (TanhGrad, SigmoidGrad, SoftplusGrad, the gradient of RealDiv) "
            "are left alone, so XLA and eager keep agreeing on them; the commit message lists "
            "each op of cwise_ops_gradients.h."),
        "risk": (
            "Results change only where dy == 0, from NaN or +-0 to +0, as in eager. One select and "
            "one compare per element, which XLA fuses into the existing elementwise fusion."),
        "tests_note": (
            "0001's test block is run by xla-harness against the installed tensorflow-cpu 2.21.0 "
            "in float32, float64, bfloat16 and float16 with the patch's lowerings compiled into an "
            "op library (HarnessSqrtGrad etc.): it passes on the eager kernels and on the patched "
            "lines and fails on TF's own jit_compile lowering and on the control, the same library "
            "built from the lines the patch replaces. 0002's FileCheck tests were not run (no "
            "tf-opt here)."),
        "run_where": (
            "xla-harness compiled the new lines of binary_ops.cc with g++ against the headers of the "
            "tensorflow-cpu 2.21.0 wheel, linked them to its libtensorflow_cc.so.2 as ops "
            "HarnessSqrtGrad etc., and ran them inside that TF under jit_compile=True on x86-64 "
            "CPU: equal to eager on its whole gradient registry, bitwise at the dead-branch "
            "points. The control (the replaced lines, compiled and run the same way) equals TF's "
            "own jit_compile lowering bitwise and gives NaN at every singular dead-branch point "
            "where the patched lines give 0, in four dtypes (table below). TF 2.21's "
            "jit_compile on CPU compiles with the tf2xla kernels whatever the MLIR bridge setting "
            "(xla_compiler.cc logs `CompileFunction with XlaBuilder`); TF 2.21's own "
            "xla-legalize-tf pass lowers SqrtGrad and RsqrtGrad with the unguarded lower_tf.td "
            "patterns unless it prefers tf2xla: that is the code 0002 changes, read from the "
            "installed TF, but 0002 itself was not compiled or run (no TF build). The new lines "
            "of 0001 compile (g++ -fsyntax-only) against the headers of the tf-nightly "
            "2.23.0.dev20261026 wheel. `git apply --check` passed on the newest TensorFlow texts "
            "readable there; not run: `git apply` on the v2.21.0 tag and on a nightly's source "
            "(not readable), a Bazel build of TensorFlow, GPU, TPU."),
    },
}


@dataclass
class Bundle:
    folder: Path
    files: list[Path]


_SUBJECT = re.compile(r"^Subject: (.*(?:\n [^\n]*)*)", re.M)


def patch_subject(text: str) -> str:
    m = _SUBJECT.search(text)
    if not m:
        return "(no subject)"
    return re.sub(r"\s*\n\s*", " ", m.group(1)).strip()


def patch_message(text: str) -> str:
    """The commit message body of a format-patch file (between the headers and '---')."""
    head, _, rest = text.partition("\n\n")
    body, _, _ = rest.partition("\n---\n")
    return body.strip()


def diffstat(text: str) -> str:
    _, _, rest = text.partition("\n---\n")
    stat, _, _ = rest.partition("\ndiff --git")
    return stat.strip("\n").rstrip()


def _evidence(results_dir: Path) -> tuple[list[str], list[str]]:
    """(scanner lines, stress lines) from results/, each with its environment."""
    scans, stress = [], []
    for f in sorted(results_dir.rglob("*findings.json")):
        try:
            data = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        for m in data.get("modules", []):
            classes: dict[str, int] = {}
            for finding in m.get("findings", []):
                classes[finding["class"]] = classes.get(finding["class"], 0) + 1
            summary = ", ".join(f"{v} {k}" for k, v in sorted(classes.items())) or "no in-place fusions"
            scans.append(f"`{f.relative_to(results_dir.parent)}`: module `{m.get('module')}`: {summary}")
    folders = sorted({p.parent for p in results_dir.rglob("stress*.jsonl")})
    if folders:
        from xla_harness.stress import report

        for folder in folders:
            table = report.load_table([folder])
            stress.append(f"`{folder.relative_to(results_dir.parent)}`:\n\n```\n{report.format_table(table)}\n```")
    return scans, stress


_XLA_LOG_LINE = re.compile(
    r"^(== \S+: (?:passed|failed|crashed).*|xla-mutants: \d+ mutants.*|xla-blast-radius: \d+ .*)$", re.M)


# What each committed log is, so that an expected failure is not read as the patch failing.
_XLA_LOG_KIND = {
    "xla-test.log": "the patched source and its tests",
    "xla-test-stock.log": "the patch's tests over stock sources: the tests that need the patch fail",
    "xla-test-v1-source.log": "the patch's tests over its first version's source: what that version got wrong",
    "xla-test-v2-source.log": "the patch's tests over its second version's source, the one the project's review "
                              "read: what that version got wrong",
    "xla-mutants.log": "each guard deleted in turn: every mutant must fail a test",
    "xla-blast-radius.log": "stock and patched fusion decisions over CPU pre-fusion modules",
    "xla-blast-radius-tpu.log": "stock and patched fusion decisions over the modules entering libtpu's tpu_fusion "
                                "(tpu:v6e:2x4, compiled ahead of time)",
    "xla-blast-radius-tpu-main-fusion.log": "the same over the TPU modules entering tpu_fusion from libtpu's "
                                            "Main_fusion pipeline alone (one entry per compile)",
    "xla-blast-radius-cuda.log": "stock and patched fusion decisions over the modules entering the CUDA plugin's "
                                 "priority-fusion (cuda:h100, compiled ahead of time)",
}


def _xla_test_evidence(results_dir: Path) -> list[str]:
    """Verdict lines of the committed `make xla-test` / `xla-mutants` / `xla-blast-radius` logs."""
    lines = []
    for f in sorted(results_dir.glob("xla/*/xla-*.log")):
        found = _XLA_LOG_LINE.findall(f.read_text(encoding="utf-8", errors="replace"))
        if found:
            kind = _XLA_LOG_KIND.get(f.name)
            lines.append(f"`{f.relative_to(results_dir.parent)}`: " + "; ".join(x.strip("= ") for x in found)
                         + (f" ({kind})" if kind else ""))
    return lines


# The logs each recorded XLA base should have, and what each says.
_XLA_BASE_LOGS = (
    ("xla-test.log", "tests (patched)"),
    ("xla-test-stock.log", "new tests on stock source"),
    ("xla-mutants.log", "mutants"),
    ("xla-blast-radius.log", "blast radius (CPU)"),
)
_TEST_VERDICT = re.compile(r"^== \S+: (passed|failed|crashed|no tests): (\d+) tests, (\d+) failed", re.M)
_MUTANTS = re.compile(r"^xla-mutants: (\d+) mutants, (\d+) killed, (\d+) survived", re.M)
_PROGRAMS = re.compile(r"^prefusion: (\d+) programs compiled", re.M)
_BLAST = re.compile(r"^xla-blast-radius: (\d+) pre-fusion modules .*?(\d+) pairs evaluated, (\d+) decisions changed",
                    re.M)
_FAILED_TEST = re.compile(r"^  (?:FAILED|CRASHED) +(\S+)$", re.M)


def _log_cell(name: str, text: str) -> str:
    """One table cell from a committed log: its verdict, or what the log says instead."""
    if name == "xla-mutants.log":
        m = _MUTANTS.search(text)
        return f"{m.group(2)}/{m.group(1)} killed" if m else "no verdict in the log"
    if name == "xla-blast-radius.log":
        m = _BLAST.search(text)
        return f"{m.group(3)} of {m.group(2)} decisions change ({m.group(1)} modules)" if m else "no verdict in the log"
    m = _TEST_VERDICT.search(text)
    if m is None:
        err = next((ln for ln in text.splitlines() if ln.startswith("error: ")), "")
        return err.removeprefix("error: ")[:200] or "no verdict in the log"
    total, failed = int(m.group(2)), int(m.group(3))
    return f"{total - failed}/{total} pass" if name == "xla-test.log" else f"{failed} of {total} fail"


def xla_base_table(up: Upstream, results_dir: Path) -> tuple[list[str], list[str], dict[str, list[str]]]:
    """Per recorded base of the default series: (table lines, missing logs, tests that fail on
    stock per base). A log a base should have and does not is named, never skipped."""
    rows = ["| base | XLA of | series files | applies | compiles | " + " | ".join(h for _, h in _XLA_BASE_LOGS) + " |",
            "| --- | --- | --- | --- | --- | " + " | ".join("---" for _ in _XLA_BASE_LOGS) + " |"]
    missing: list[str] = []
    stock_fails: dict[str, list[str]] = {}
    yes = {True: "yes", False: "no"}
    for b in (b for b in up.bases if b.series == "default"):
        # the base's folder of logs: its evidence's, read under results_dir (which may be another copy)
        sub = Path(b.evidence).parent if b.evidence.startswith("results/") else Path("results/xla") / b.commit[:10]
        folder = results_dir / sub.relative_to("results")
        cells = []
        for name, _ in _XLA_BASE_LOGS:
            log = folder / name
            rel = f"{sub}/{name}"
            if not log.is_file():
                missing.append(rel)
                cells.append(f"not recorded (`{rel}` missing)")
                continue
            text = log.read_text(encoding="utf-8", errors="replace")
            cells.append(_log_cell(name, text))
            if name == "xla-test-stock.log":
                stock_fails[b.commit[:10]] = _FAILED_TEST.findall(text)
        files = ", ".join(p.file.rsplit("/", 1)[-1][:4] for p in up.select("default", b.variant or None))
        files += f" (variant for {b.variant})" if b.variant else ""
        rows.append(f"| {b.commit[:10]} | {b.what} | {files} | {yes[b.applies]} | {yes[b.compiles]} | "
                    + " | ".join(cells) + " |")
    return rows, missing, stock_fails


def _xla_evidence_lines(up: Upstream, results_dir: Path) -> list[str]:
    """The xla Evidence: per base (tests, stock, mutants, blast radius), the tests that need the
    change, what was not measured, the known limits and what is known about TPU."""
    rows, missing, stock_fails = xla_base_table(up, results_dir)
    lines = ["Per recorded base (`make xla-test`, `STOCK=1`, `make xla-mutants`, `make xla-blast-radius`; "
             "each log under results/xla/<base>/ names the wheel, the XLA commit of the patched source, the "
             "tools and the commit of xla-harness it ran from):", "", *rows, ""]
    if missing:
        lines += ["Not recorded (these runs are missing, so nothing is claimed for them): "
                  + ", ".join(f"`{m}`" for m in missing), ""]
    others = [x for x in (_xla_test_evidence(results_dir) if results_dir.is_dir() else [])
              if not any(f"/{name}`" in x for name, _ in _XLA_BASE_LOGS)]
    if others:
        lines += ["Other committed logs:", "", *(f"- {x}" for x in others), ""]
    sets: dict[tuple[str, ...], list[str]] = {}
    for base, names in stock_fails.items():
        sets.setdefault(tuple(names), []).append(base)
    for failing, bases in sets.items():
        lines += [f"The new tests that fail on stock sources (base {', '.join(bases)}: the patch's tests over "
                  f"stock `instruction_fusion.cc`), {len(failing)}:", "", *(f"- `{n}`" for n in failing), ""]
    aot = sorted(results_dir.glob("xla/*/xla-blast-radius-*.log")) if results_dir.is_dir() else []
    lines += ["Blast radius: the stock and patched `ShouldFuseInPlaceOp` over every (producer, in-place "
              "consumer) pair of the pre-fusion modules XLA's CPU pipeline dumps for the programs of "
              "xla-harness (`xla_harness/upstream/prefusion.py`). It counts generic decisions; CPU does not "
              "fuse scatter with producers and GPU has its own rule, so it is not a count of changed "
              "kernels."]
    if aot:
        cited = ", ".join(f"`{f.relative_to(results_dir.parent)}`" for f in aot)
        lines += ["", f"Other pre-fusion modules: {cited} (as they enter the TPU's or GPU's fusion pass, compiled "
                  "ahead of time)"]
    else:
        lines += ["", "Not measured: pre-fusion modules of the TPU and CUDA ahead-of-time compiles (none are "
                  "recorded under results/xla/)."]
    lines += ["", CONTEXT["xla"]["not_run"], "", "### Known limits", "", CONTEXT["xla"]["limits"], "",
              "### TPU", "", CONTEXT["xla"]["tpu"], ""]
    tpu = results_dir / "tpu-aot" / "README.md"
    if tpu.is_file():
        lines += [f"Ahead-of-time compiles of the #35409 program by libtpu on this side are in "
                  f"`{tpu.relative_to(results_dir.parent)}` (what they show and what they cannot).", ""]
    return lines


def _scan_and_stress_lines(scans: list[str], stress: list[str]) -> list[str]:
    lines = []
    if scans:
        lines += ["Scanner findings (`xla-harness scan`):", "", *(f"- {s}" for s in scans), ""]
    else:
        lines += ["No scanner findings are recorded under results/.", ""]
    if stress:
        lines += ["Stress tables (`xla-harness stress`; the line under each table is its environment):", "",
                  *stress, ""]
    else:
        lines += ["No stress runs are recorded under results/ yet: no before/after comparison is claimed.", ""]
    return lines


def _evidence_lines(target: str, results_dir: Path, scans: list[str], stress: list[str],
                    up: Upstream) -> list[str]:
    """The Evidence section: XLA test logs (xla), gradient tables (tensorflow), scans and stress tables."""
    lines: list[str] = []
    if target == "xla":  # the change's own evidence; CPU stress tables say nothing about a fusion decision
        return _xla_evidence_lines(up, results_dir)
    grads = sorted(results_dir.rglob("gradcheck*.txt")) if results_dir.is_dir() else []
    if target == "tensorflow":
        controls = sorted(results_dir.rglob("tensorflow/**/control.md")) if results_dir.is_dir() else []
        for f in controls:
            lines += [f"Control (`make tf-control`), `{f.relative_to(results_dir.parent)}`:", "",
                      *f.read_text(encoding="utf-8").rstrip("\n").replace("\n# ", "\n### ")
                      .replace("\n## ", "\n#### ").lstrip("# ").splitlines(), ""]
        if not controls:
            lines += ["No control table (stock vs patched lowerings) is recorded under results/.", ""]
        for f in grads:
            lines += [f"Gradient table (`xla-harness gradcheck`), `{f.relative_to(results_dir.parent)}`:", "",
                      "```", f.read_text(encoding="utf-8").rstrip("\n"), "```", ""]
        if not grads:
            lines += ["No gradient tables are recorded under results/.", ""]
    else:
        lines += _scan_and_stress_lines(scans, stress)
    return lines


_BLAST_KIND = {"": "CPU (XLA's own pipeline)", "-tpu": "TPU v6e:2x4 (as modules enter libtpu's tpu_fusion)",
               "-tpu-main-fusion": "TPU v6e:2x4 (libtpu's Main_fusion entry alone)",
               "-cuda": "H100 (as modules enter the CUDA plugin's priority-fusion)",
               "-gpu-rule": "CPU, GPU's scatter rule applied generically instead of this change"}


def _blast_lines(results_dir: Path) -> tuple[list[str], dict[str, str]]:
    """One line per committed blast-radius log (what it measured, its verdict), and the CPU counts of
    this change and of GPU's rule on the same modules ({"ours", "gpu_rule"}; "?" when not recorded)."""
    rows: list[tuple[int, str, str]] = []
    counts = {"ours": "?", "gpu_rule": "?"}
    order = list(_BLAST_KIND)
    gpu_rule = sorted(results_dir.glob("xla/*/xla-blast-radius-gpu-rule.log")) if results_dir.is_dir() else []
    compared_at = gpu_rule[-1].parent.name if gpu_rule else ""  # the base GPU's rule was measured on
    for f in sorted(results_dir.glob("xla/*/xla-blast-radius*.log")) if results_dir.is_dir() else []:
        kind = f.name.removeprefix("xla-blast-radius").removesuffix(".log")
        text = f.read_text(encoding="utf-8", errors="replace")
        m = _BLAST.search(text)
        if kind not in _BLAST_KIND or m is None:
            continue
        programs = _PROGRAMS.search(text)
        of = f"{m.group(1)} modules" + (f" of {programs.group(1)} JAX programs" if programs else "")
        verdict = f"{m.group(3)} of {m.group(2)} decisions change ({of})"
        rows.append((order.index(kind), f.parent.name, f"- {_BLAST_KIND[kind]}, base {f.parent.name}: {verdict}"))
        if kind in ("", "-gpu-rule") and f.parent.name == compared_at:
            counts["ours" if kind == "" else "gpu_rule"] = f"{m.group(3)} of {m.group(2)}"
    return [line for _, _, line in sorted(rows)], counts


def xla_pr_lines(title: str, patches: Sequence, texts: list[str], results_dir: Path) -> list[str]:
    """PR.md for XLA: what is refused and why, what it changes (the blast radius), why not GPU's rule,
    the change, its tests and limits; the evidence is in APPENDIX.md."""
    ctx = CONTEXT["xla"]
    blast, counts = _blast_lines(results_dir)
    tests = sorted({t for p in patches for t in p.bazel_targets})
    new_tests = sum(len(re.findall(r"^\+TEST_F\(", t, re.M)) for t in texts)
    lines = [f"# {title}", "", ctx["review"], "", "## What this refuses, and why", "", ctx["refuses"], "",
             ctx["reason"], "", "## What it changes", "", ctx["changes"], "",
             "Blast radius: the stock and patched `ShouldFuseInPlaceOp` over every (producer, in-place "
             "consumer) pair of pre-fusion modules (JAX programs: embedding and segment-sum gradients, "
             "scatter-adds, scans, cache updates, the #35409 program); it counts generic decisions, not "
             "changed kernels:", "", *(blast or ["- not recorded"]), "",
             "## Why not GPU's rule", "", ctx["not_gpu_rule"].format(gpu_rule=counts["gpu_rule"], ours=counts["ours"]),
             "", "## The change", ""]
    for t in texts:
        lines += ["```", diffstat(t), "```", ""]
    lines += ["## Tests", "", f"{new_tests} new `InstructionFusionTest` cases (HLO text): each forbidden case "
              "checks the decision's reason and fails on stock; each allowed case covers one exemption and "
              "fails when that exemption is deleted.", "", "```", *(f"bazel test {t}" for t in tests), "```", "",
              "## Known limits", "", ctx["limits"], "",
              "## Evidence", "", "`APPENDIX.md`: per XLA base, the test logs (patched, over stock sources, "
              "mutants), the blast-radius logs, what was run where and what was not (Bazel, GPU, TPU), and what "
              "is known about the TPU report.", "",
              "Related: " + ", ".join(dict.fromkeys(link for p in patches for link in p.links)), ""]
    return lines


# The files build_bundle writes into its output folder (the CLI checks them before it runs).
BUNDLE_FILES = ("series.mbox", "PR.md", "CHECKLIST.md", "APPENDIX.md")


def bundle_inputs(series: Series, target: str, results_dir: Path | None = None) -> list[Path]:
    """What build_bundle reads: the target's patch files and the evidence under ``results_dir``
    (never to be replaced by a bundle file)."""
    paths = [p.path(series.root) for p in series.upstream(target).select("default")]
    results_dir = results_dir or (ROOT / "results")
    if results_dir.is_dir():
        paths += [*results_dir.rglob("*findings.json"), *results_dir.rglob("stress*.jsonl"),
                  *results_dir.glob("xla/*/xla-*.log")]
    return paths


def build_bundle(series: Series, target: str, out: Path, results_dir: Path | None = None) -> Bundle:
    up: Upstream = series.upstream(target)
    patches = up.select("default")
    if not patches:
        raise HarnessError(f"series.toml has no default patches for {target}: nothing to send upstream")
    results_dir = results_dir or (ROOT / "results")
    texts = []
    for p in patches:
        path = p.path(series.root)
        try:
            texts.append(path.read_text(encoding="utf-8"))
        except OSError:
            raise HarnessError(f"{p.file}: patch file is missing") from None
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise HarnessError(f"cannot create {out}: {exc.strerror}") from None
    # Renumber "[PATCH i/n]" for the default patches alone (experimental ones are not sent).
    texts = [re.sub(r"^Subject: \[PATCH \d+/\d+\]", f"Subject: [PATCH {i}/{len(texts)}]", t, count=1,
                    flags=re.M) if len(texts) > 1 else
             re.sub(r"^Subject: \[PATCH \d+/\d+\]", "Subject: [PATCH]", t, count=1, flags=re.M)
             for i, t in enumerate(texts, 1)]
    mbox = out / BUNDLE_FILES[0]
    mbox.write_text("".join(t if t.endswith("\n") else t + "\n" for t in texts), encoding="utf-8")

    ctx = CONTEXT[target]
    scans, stress = _evidence(results_dir) if results_dir.is_dir() and target != "xla" else ([], [])
    title = re.sub(r"^\[PATCH[^\]]*\]\s*", "", patch_subject(texts[0]))
    lines = [f"# {title}", ""]
    if "review" in ctx:
        lines += [ctx["review"], ""]
    lines += ["## Problem", "", ctx["problem"], "", "## Root cause", "", ctx["root_cause"], "",
              "## Why this fix and not the reported one", "", ctx["why"], "", "## The change", ""]
    for p, t in zip(patches, texts, strict=True):
        lines += [f"### {patch_subject(t)}", "", f"Purpose: {p.purpose}", "", "```", diffstat(t), "```", "",
                  patch_message(t), ""]
    tests = sorted({t for p in patches for t in p.bazel_targets})
    lines += ["## Tests added", "", *(f"- `{t}`" for t in tests), "",
              *([ctx["tests_note"], ""] if "tests_note" in ctx else []), "## Evidence", ""]
    lines += _evidence_lines(target, results_dir, scans, stress, up)
    if "run_where" in ctx:
        lines += ["## What was run where", "", ctx["run_where"], ""]
        if up.bases:
            lines += ["| base | series | variant | applies | compiles | tests pass | command |",
                      "| --- | --- | --- | --- | --- | --- | --- |"]
            yes = {True: "yes", False: "no"}
            lines += [f"| {b.commit[:12]} ({b.what}) | {b.series} | {b.variant or 'own files'} | {yes[b.applies]} | "
                      f"{yes[b.compiles]} | {yes[b.tests_pass]} | `{b.command}` |" for b in up.bases]
            lines += [""]
    lines += ["## Risk", "", ctx["risk"], "", "## How to reproduce", "",
              "```", "git am series.mbox", *(f"{c}" for p in patches for c in p.validate), "```", "",
              "Upstream status: " + "; ".join(f"{p.file}: {p.status}" for p in patches), "",
              "Related: " + ", ".join(dict.fromkeys(link for p in patches for link in p.links)), ""]
    desc = out / BUNDLE_FILES[1]
    written = [mbox, desc]
    if target == "xla":  # what a reviewer reads; the harness's evidence goes to the appendix
        appendix = out / BUNDLE_FILES[3]
        appendix.write_text("\n".join([f"# Appendix to \"{title}\": the evidence", "",
                                       "The runs behind PR.md, with the environment of each.", "",
                                       *lines[2:]]), encoding="utf-8")
        lines = xla_pr_lines(title, patches, texts, results_dir)
        written.append(appendix)
    desc.write_text("\n".join(lines), encoding="utf-8")

    checklist = out / BUNDLE_FILES[2]
    checklist.write_text("\n".join([
        f"# Upstream checklist: {target}", "",
        "- [ ] Contributor License Agreement signed for the author address in series.mbox",
        f"- [ ] Rebased on current {up.clone_url} main; `make patches-check` with that tree passes",
        *(f"- [ ] `bazel test {t}` passes" for t in tests),
        "- [ ] clang-format / buildifier clean on the touched files",
        "- [ ] PR description is PR.md; evidence tables carry their environment lines",
        "- [ ] Experimental patches of the series are not included (series.mbox holds default ones only)",
        "- [ ] Reviewer's earlier objections addressed: " + ", ".join(
            dict.fromkeys(link for p in patches for link in p.links if "/pull/" in link)), ""]),
        encoding="utf-8")
    return Bundle(out, [*written, checklist])
