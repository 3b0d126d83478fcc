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
messages, the results files and the per-target prose that does not change between releases
(templates/pr_<target>.md); missing evidence is stated, never invented.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from xla_harness.errors import HarnessError
from xla_harness.runtime.resources import source_checkout
from xla_harness.upstream.series import Series, Upstream

ROOT = source_checkout() or Path()  # results/ of this checkout; installed from a wheel, the cwd's

# Per-target prose that does not change between releases: templates/pr_<target>.md, one
# paragraph per "## key" section (its lines joined by single spaces).
_SECTION = re.compile(r"^## (\w+)$", re.M)


@functools.cache
def context(target: str) -> dict[str, str]:
    """The prose of ``target``'s pull request, by key, from the package's templates/pr_<target>.md
    (the comment before the first section is not part of it)."""
    text = (resources.files("xla_harness.upstream") / "templates" / f"pr_{target}.md").read_text(encoding="utf-8")
    parts = _SECTION.split(text)[1:]
    return {key: " ".join(line.strip() for line in body.splitlines() if line.strip())
            for key, body in zip(parts[::2], parts[1::2], strict=True)}


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
        from xla_harness.stress.report import summary as report

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
    lines += ["", context("xla")["not_run"], "", "### Known limits", "", context("xla")["limits"], "",
              "### TPU", "", context("xla")["tpu"], ""]
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
    ctx = context("xla")
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

    ctx = context(target)
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
