"""The triage report: ``report.md`` and a self-contained ``report.html`` (no network, no external file:
every figure a PNG inline as a data URL), drawn from ``triage.json`` and the stage folders alone, so
``xla-harness report DIR --html`` draws it again.

The answer comes first, in one paragraph; then per target a table of what its compiler made of the
step, its in-place scatter fusions and a small graph of each one's compiled neighbourhood; then the
local runs (rates with their one-sided exact 95% upper bounds per configuration and variant, the
one convention of the whole report, stated once; nondeterminism per leaf), where each seed of the
frozen and train stages failed (its non-finite steps, the first bad value of each, its loss along the
run), what to run next, the pass bisection and the bundle, the command behind each figure, and the
versions. The figures themselves are drawn by :mod:`~xla_harness.triage.figures`.
"""

from __future__ import annotations

import base64
import html
import json
import re
from dataclasses import dataclass
from pathlib import Path

from xla_harness.errors import HarnessError
from xla_harness.runtime.files import shown
from xla_harness.triage.answer import answer
from xla_harness.triage.answer_record import BOUND_NOTE, Answer, bound_text
from xla_harness.triage.compiled import TargetVerdict
from xla_harness.triage.figures import neighbourhood_figure, nondet_figure, rates_figure
from xla_harness.triage.next_steps import triage_command


@dataclass
class Figure:
    title: str
    png: bytes
    command: str = ""


@dataclass
class Block:
    kind: str  # heading | paragraph | table | figure | code
    text: str = ""
    rows: list[list[str]] | None = None
    figure: Figure | None = None
    level: int = 2


# ----------------------------------------------------------------------------- content


def _plan_cell(v: TargetVerdict) -> str:
    plan = v.memory_plan
    if not plan:
        return "-"
    if plan.get("error"):
        return "not checked"
    if v.memory_conflicts:
        return f"{plan.get('conflicts', 0)} conflict(s)"
    differ = f"; live range differs on {plan['disagreements']}" if plan.get("disagreements") else ""
    return f"clean ({plan.get('values', 0)} values{differ})"


def _target_rows(targets: list[TargetVerdict]) -> list[list[str]]:
    rows = [["target", "compiler", "instructions", "hazard", "fused data-moving producer", "in-place scatters",
             "W's scatter writes into", "aliasing truth", "non-deterministic ops", "memory plan", "compile CPU s"]]
    for v in targets:
        w = v.w_scatter()
        compiler = ", ".join(f"{k} {val}" for k, val in v.versions.items()) or "-"
        target = f"{v.target} ({v.scope()})" if v.scope() else v.target
        rows.append([target, compiler, str(v.instructions), str(v.hazard), str(v.fused_producer),
                     str(len(v.scatters)), f"{w.writes_w} ({w.fusion})" if w else "-",
                     "compiler" if v.compiler_states_aliasing else "scanner walk",
                     "-" if v.nondeterministic is None else str(len(v.nondeterministic)), _plan_cell(v),
                     f"{v.compile_cpu_s:.0f}" if v.compile_cpu_s is not None else "-"])
    return rows


def _library(frame: str) -> bool:
    """Whether a source frame lies in an installed package (flax, optax, ...), not in the user's files."""
    return bool(re.search(r"(/(site|dist)-packages/|^<site-packages>/)", frame))


def source_shown(source: str) -> str:
    """Where an instruction came from, with no path of this machine in it: the innermost frame in the
    user's own files first, then, when the innermost frame is a library's (``flax/linen/linear.py``),
    that frame after "via"; "-" when the dump says nothing."""
    frames = [f for f in source.split(" <- ") if f]
    if not frames:
        return "-"
    user = next((f for f in frames if not _library(f)), None)
    text = frames[0] if user is None or user == frames[0] else f"{user} via {frames[0]}"
    return shown(re.sub(r"\S*/(site|dist)-packages/", "<site-packages>/", text))


def _scatter_rows(v: TargetVerdict) -> list[list[str]]:
    rows = [["fusion", "scatter", "in-place operand", "class", "compiler", "writes W's gradient into", "source"]]
    for s in v.scatters:
        rows.append([s.fusion, s.scatter, f"parameter {s.in_place_parameter} <- " + (" <- ".join(s.path) or "itself"),
                     s.cls, s.compiler or "-", s.writes_w or "-", source_shown(s.source)])
    return rows


def _table_rows(table) -> list[list[str]]:
    from xla_harness.stress.report.summary import baseline_comparisons

    comps = baseline_comparisons(table)
    rows = [["configuration", "non-finite", "rate", "at most (95%)", "nondet", "vs baseline"]]
    for r in table.rows:
        c = comps.get(r.label)
        rows.append([r.label, f"{r.k}/{r.n}", f"{r.k / r.n:.2%}" if r.n else "-", bound_text(r.k, r.n),
                     str(r.nondet), f"p={c['p_value']:.2g}" if c else "-"])
    return rows


def _target_blocks(v: TargetVerdict, commands: list[str], figures: bool) -> list[Block]:
    out = [Block("heading", f"{v.target}: in-place scatter fusions", level=3), Block("paragraph", _target_note(v))]
    if v.scatters:
        out.append(Block("table", rows=_scatter_rows(v)))
    if v.nondeterministic:
        out.append(Block("paragraph", "Run non-deterministically on this target: " + "; ".join(
            f"{op['fusion'] or op['instruction']} ({op['shape']}"
            + (f"; {source_shown(op['source'])}" if op.get("source") else "") + ")" for op in v.nondeterministic[:6])))
    for g in v.neighbourhoods if figures else []:
        out.append(Block("figure", figure=Figure(f"{v.target}: {g.fusion}", neighbourhood_figure(g),
                                                 commands[0] if commands else "")))
    return out


LOCAL_TITLES = {"frozen": "Frozen protocol (the reporter's: the same inputs every call)",
                "train": "Train protocol (a trajectory)", "variants": "Workaround variants"}


def _local_blocks(name: str, run, commands: list[str], figures: bool) -> list[Block]:
    out = [Block("heading", LOCAL_TITLES[name]), Block("table", rows=_table_rows(run.table)),
           Block("paragraph", f"Question answered: {run.answer or 'not within the budget'}; rounds: "
                              f"{', '.join(run.rounds)}.")]
    command = commands[-1] if commands else ""
    rows = [(r.label, r.k, r.n) for r in run.table.rows]
    if figures and len(rows) > 1:  # one rate is the table's one row: a figure of it adds nothing
        out.append(Block("figure", figure=Figure(f"{name}: non-finite rates", rates_figure(rows), command)))
    leaves = {leaf: d for r in run.table.rows for leaf, d in r.nondet_leaves.items()}
    if figures and leaves:
        out.append(Block("figure", figure=Figure(f"{name}: nondeterminism per leaf", nondet_figure(leaves), command)))
    return out


def executables(stages: dict, out: Path | None) -> list[list[str]]:
    """Every compiled step the triage ran or scanned, side by side: (where, fingerprint, instructions,
    donated arguments, aliased and temp bytes). The local stages' come from their first block record
    (``out``: the triage folder), the compiles' from their compile record."""
    from xla_harness.stress.results.store import read_results

    rows = []
    for name, s in stages.items():
        fp, donate = None, None
        if name.startswith("compile:") and isinstance(s.get("record"), dict):
            fp = s["record"].get("fingerprint")
            donate = (fp or {}).get("donate_argnums")
        elif name in ("frozen", "train") and s.get("rounds") and out is not None:
            try:
                blocks = read_results(Path(out) / s["rounds"][0] / "stress.jsonl").blocks
            except (OSError, ValueError, HarnessError):
                continue
            if blocks:
                fp, donate = blocks[0].fingerprint, list(blocks[0].donate_argnums)
        if isinstance(fp, dict) and fp.get("id"):
            rows.append([name, str(fp["id"]), str(fp.get("instructions", "-")),
                         "(" + ", ".join(map(str, donate or [])) + ")", str(fp.get("alias_size_in_bytes", "-")),
                         str(fp.get("temp_size_in_bytes", "-"))])
    return rows


def _executable_blocks(stages: dict, folder: Path | None) -> list[Block]:
    rows = executables(stages, folder)
    if not rows:
        return []
    ids = {r[1] for r in rows}
    note = ("One executable throughout." if len(ids) == 1 else
            f"{len(ids)} different executables: frozen donates nothing (its inputs are reused every call), so XLA "
            "aliases and plans its memory differently; a compile stage and a run of the same step differ when their "
            "compiler options or flags do (a compile dumps its HLO, for one). A verdict holds for the executable "
            "it was drawn from.")
    return [Block("heading", "Executables"), Block("paragraph", note),
            Block("table", rows=[["stage", "fingerprint", "instructions", "donated", "aliased bytes", "temp bytes"],
                                 *rows])]


def _closing_blocks(state: dict, ans: Answer, folder: Path | None = None) -> list[Block]:
    stages = state.get("stages", {})
    out = []
    for name in ("bisect", "bundle"):
        s = stages.get(name)
        if s:
            out += [Block("heading", {"bisect": "Pass bisection", "bundle": "Repro bundle"}[name]),
                    Block("paragraph", s["skipped"] if s.get("skipped") else
                          json.dumps(s.get("result") or s.get("bundle") or s.get("error"), default=str))]
    out.append(Block("heading", "Commands"))
    made = triage_command(state, folder) if folder is not None else ""
    out.append(Block("code", "\n".join(([f"# the triage itself (again, or --resume to continue it)\n{made}"]
                                        if made else []) +
                                       [f"# {name}\n" + "\n".join(s.get("commands", []))
                                        for name, s in stages.items() if s.get("commands")])))
    out += _executable_blocks(stages, folder)
    out.append(Block("heading", "Stages and versions"))
    rows = [["stage", "seconds", "result"]]
    for name, s in stages.items():
        result = s.get("answer") or ("ok" if s.get("ok") else s.get("error", "-"))
        rows.append([name, str(s.get("seconds", "-")), str(result)])
    out.append(Block("table", rows=rows))
    envs = {json.dumps(run.table.env, sort_keys=True) for run in ans.local.values() if run.table.env}
    for e in sorted(envs):
        env = json.loads(e)
        out.append(Block("paragraph", "Local runs: " + ", ".join(
            f"{k} {env.get(k)}" for k in ("jax", "jaxlib", "backend", "device_kind", "device_count") if env.get(k))))
    return out


def blocks(state: dict, ans: Answer, figures: bool = True, folder: Path | None = None) -> list[Block]:
    """The report's content, in order (the same for Markdown and HTML); ``folder``: the triage's (its
    stage records, for the executables' fingerprints)."""
    spec = state.get("spec", {})
    stages = state.get("stages", {})
    out = [Block("heading", f"Triage of {spec.get('program')} {' '.join(spec.get('options', []))}".strip(), level=1),
           Block("paragraph", ans.paragraph),
           Block("paragraph", f"Exit {ans.exit_code}: " + ("; ".join(ans.findings) if ans.findings
                                                           else "nothing measured" if not ans.measured
                                                           else "partial: open: " + "; ".join(ans.open_questions)
                                                           if ans.exit_code == 2 else "nothing found") + ".")]
    out += _whose_blocks(ans)
    if ans.local:
        out.append(Block("paragraph", f"Rates: {BOUND_NOTE}."))
    out += _where_blocks(ans)
    if ans.targets:
        out += [Block("heading", "What each compiler made of the step"), Block("table", rows=_target_rows(ans.targets))]
        for v in ans.targets:
            out += _target_blocks(v, stages.get(f"compile:{v.target}", {}).get("commands", []), figures)
    for name in LOCAL_TITLES:
        if name in ans.local:
            out += _local_blocks(name, ans.local[name], stages.get(name, {}).get("commands", []), figures)
    return out + _closing_blocks(state, ans, folder=folder)


def _whose_blocks(ans: Answer) -> list[Block]:
    """Whose NaN each failing step is (its origin, decided from the state before it): the first table,
    since it decides whether anything about the compiler needs reading at all."""
    rows = [["stage", "seed", "step", "origin", "where", "what"]]
    for t in ans.where:
        for s, _, planted in t.bad:
            o = t.origin_of(s, planted)
            w = (o or {}).get("where") or {}
            at = f"{w['file']}:{w['line']}" if w.get("file") else "-"
            rows.append([t.stage, str(t.seed), str(s), o["class"] if o else "not explained", at,
                         (o or {}).get("summary", "past --explain-max: not explained")])
    if len(rows) == 1:
        return []
    return [Block("heading", "Whose NaN"),
            Block("paragraph", "Each failing step's origin, decided after the run from the state before it and its "
                               "batch (docs/triage.md): input (a non-finite batch or state), race (a replay from the "
                               "same state differs), program or precision (op by op in float32; float64 on the CPU "
                               "decides which), compiler (op by op finite, every replay not), unknown (why)."),
            Block("table", rows=rows)]


def _where_blocks(ans: Answer) -> list[Block]:
    """Where each seed of the frozen and train stages failed, and what to run next."""
    out = []
    if ans.where:
        rows = [["stage", "configuration", "seed", "round", "steps", "non-finite steps (first bad value)",
                 "loss along the run"]]
        rows += [[t.stage, t.label, str(t.seed), t.round, str(t.steps),
                  f"{len(t.bad)}: {t.bad_text()}" if t.bad else "none", t.loss_text()] for t in ans.where]
        out += [Block("heading", "Where"),
                Block("paragraph", "Per stage, configuration and seed (each round of a stage runs one seed): the "
                                   "non-finite steps, each with the first bad value its record names (planted: a "
                                   "fault --inject-rate put there), and the loss at a few steps along the run with "
                                   "its lowest, median and highest and the last finite one. The records: "
                                   "ROUND/stress.jsonl."),
                Block("table", rows=rows)]
    if ans.next_steps:
        out += [Block("heading", "What next"),
                Block("code", "\n".join(f"# {why}\n{command}" for why, command in ans.next_steps))]
    return out


def _target_note(v: TargetVerdict) -> str:
    from xla_harness.triage.answer import target_sentence

    sentence = target_sentence(v)
    text = sentence[0].upper() + sentence[1:] + "."
    if v.w_dims:
        text += f" W is the {v.w_dims[0]}x{v.w_dims[1]} parameter the program names."
    if v.disagreements:
        text += f" The compiler's aliasing disagrees with the scanner's walk on {v.disagreements} output(s)."
    return text


# ----------------------------------------------------------------------------- writers


def markdown(content: list[Block], figure_dir: str = "") -> str:
    lines = []
    n = 0
    for b in content:
        if b.kind == "heading":
            lines += ["#" * b.level + " " + b.text, ""]
        elif b.kind == "paragraph":
            lines += [b.text, ""]
        elif b.kind == "table" and b.rows:
            head, *body = b.rows
            lines.append("| " + " | ".join(head) + " |")
            lines.append("|" + "---|" * len(head))
            lines += ["| " + " | ".join(c.replace("|", "\\|").replace("\n", " ") for c in row) + " |" for row in body]
            lines.append("")
        elif b.kind == "figure" and b.figure is not None:
            n += 1
            lines.append(f"*Figure {n}: {b.figure.title}* (in report.html)")
            if b.figure.command:
                lines.append(f"`{b.figure.command}`")
            lines.append("")
        elif b.kind == "code":
            lines += ["```", b.text, "```", ""]
    return "\n".join(lines)


def html_page(content: list[Block]) -> str:
    esc = html.escape
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
             "<title>xla-harness triage</title>",
             "<style>body{font-family:sans-serif;max-width:70em;margin:2em auto;line-height:1.4}"
             "table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #bbb;padding:.2em .5em;"
             "font-size:.9em}th{background:#eee}"
             "pre{background:#f6f6f6;padding:.5em;white-space:pre-wrap;overflow-wrap:anywhere}"
             "img{max-width:100%;height:auto}code{overflow-wrap:anywhere}"
             "figure{margin:1em 0}figcaption{font-size:.9em;color:#444}</style></head><body>"]
    n = 0
    for b in content:
        if b.kind == "heading":
            parts.append(f"<h{b.level}>{esc(b.text)}</h{b.level}>")
        elif b.kind == "paragraph":
            parts.append(f"<p>{esc(b.text)}</p>")
        elif b.kind == "table" and b.rows:
            head, *body = b.rows
            parts.append("<table><tr>" + "".join(f"<th>{esc(c)}</th>" for c in head) + "</tr>")
            parts += ["<tr>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>" for row in body]
            parts.append("</table>")
        elif b.kind == "figure" and b.figure is not None:
            n += 1
            data = base64.b64encode(b.figure.png).decode("ascii")
            cmd = f"<br><code>{esc(b.figure.command)}</code>" if b.figure.command else ""
            parts.append(f'<figure><img alt="{esc(b.figure.title)}" src="data:image/png;base64,{data}">'
                         f"<figcaption>Figure {n}: {esc(b.figure.title)}{cmd}</figcaption></figure>")
        elif b.kind == "code":
            parts.append(f"<pre>{esc(b.text)}</pre>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def write_report(out: Path, state: dict | None = None) -> Answer:
    """Write ``out/report.md`` and ``out/report.html`` from ``out/triage.json`` (or ``state``)."""
    from xla_harness.errors import HarnessError
    from xla_harness.triage.answer import read_state

    out = Path(out)
    if state is None:
        state = read_state(out)
    for name in ("report.md", "report.html"):  # written by replacing: never through a link, never onto a folder
        target = out / name
        if target.is_symlink() or (target.exists() and not target.is_file()):
            raise HarnessError(f"{target} exists and is not a regular file; remove it to write the report")
    ans = answer(state, out)
    content = blocks(state, ans, folder=out)
    _atomic(out / "report.md", markdown(content))
    _atomic(out / "report.html", html_page(content))
    return ans


def _atomic(path: Path, text: str) -> None:
    """``text`` as ``path``, replaced whole: written to a new temporary file of its own beside it
    (created exclusively, so a link or file already there is never written through), then renamed."""
    import os
    import tempfile

    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
