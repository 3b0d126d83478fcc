"""Tables and plots of stress results, shaped like the matrix in jax-ml/jax#35409.

Rows are configurations (mode x remat for the built-in, the program's label otherwise),
columns are the seeds (``k/n`` non-finite steps), then total, rate, the one-sided exact 95%
upper bound (the method ``runs_needed`` uses) and the spread of the per-seed rates with a
chi-square test of whether the seeds share one rate. The same table as JSON is
:mod:`~xla_harness.stress.report.as_json`'s, its figure :mod:`~xla_harness.stress.report.plot`'s.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from xla_harness.errors import HarnessError
from xla_harness.stress.report import stats
from xla_harness.stress.results import records
from xla_harness.stress.results import store as results
from xla_harness.table import format_rows, printable


@dataclass
class Row:
    label: str
    per_seed: dict[int, tuple[int, int]] = field(default_factory=dict)  # seed -> (nonfinite, steps)
    silent: int = 0
    referenced: int = 0
    injected: int = 0
    # Steps found nondeterministic, (seed, step): frozen, a finite call whose outputs differ from the
    # first's; train, a step its record marks so (results written before the first execution was the
    # measurement: a replay whose loss differed).
    nondet_steps: set[tuple[int, int]] = field(default_factory=set)
    # Per output leaf a nondeterministic step changed: {"steps", "max_elements", "max_abs", "max_ulp"}.
    nondet_leaves: dict[str, dict] = field(default_factory=dict)
    nondet_detailed: int = 0  # nondet steps whose record says which leaves differed
    # Train, block commit: steps run again only to rebuild a rolled-back state (never measurements):
    # how many, (seed, step) of those whose loss differed in any bit from the first execution, of those
    # whose new state came out non-finite, and (seed, step) where no finite state could be rebuilt.
    rerun_steps: int = 0
    rerun_differ: set[tuple[int, int]] = field(default_factory=set)
    rerun_nonfinite: set[tuple[int, int]] = field(default_factory=set)
    unrecoverable: list[tuple[int, int]] = field(default_factory=list)
    protocol: str = "train"
    first_bad: dict[str, int] = field(default_factory=dict)
    config: dict = field(default_factory=dict)  # the first block's configuration
    losses: dict[tuple[int, int], float | None] = field(default_factory=dict)  # variants runs: (seed, step)
    # Finite steps whose record gives max |new params - old params| (frozen, --commit step), and of them
    # those whose update was exactly 0: a step that changes nothing (a learning rate of 0) measures little.
    updates_known: int = 0
    updates_zero: int = 0

    @property
    def nondet(self) -> int:
        return len(self.nondet_steps)

    @property
    def k(self) -> int:
        return sum(k for k, _ in self.per_seed.values())

    @property
    def n(self) -> int:
        return sum(n for _, n in self.per_seed.values())

    def rate(self) -> stats.Rate:
        return stats.Rate(self.k, self.n)

    def dispersion(self) -> dict:
        return stats.seed_dispersion([self.per_seed[s] for s in sorted(self.per_seed)])


@dataclass
class Table:
    rows: list[Row]
    seeds: list[int]
    env: dict | None = None
    gaps: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def total_nonfinite(self) -> int:
        return sum(r.k for r in self.rows)


# A step's identity across files: (spec fingerprint, label, seed, step).
StepKey = tuple[str, str, int, int]


def summarize(files: list[results.Results], order: list[str] | None = None) -> Table:
    """Aggregate validated results files into per-configuration rows.

    A step is keyed by (spec fingerprint, label, seed, step) and counted once; the same key
    recorded twice with different outcomes is kept as first read and reported as a warning.
    """
    rows: dict[str, Row] = {}
    seen: dict[StepKey, tuple[bool, str | None, str]] = {}
    conflicts: list[str] = []
    seeds: set[int] = set()
    for f in files:
        fp = f.header.fingerprint
        for b in f.blocks:
            row = rows.setdefault(b.label, Row(b.label, config=dict(b.config), protocol=b.protocol))
            seeds.add(b.seed)
            if b.recompute is not None:
                row.rerun_steps += b.recompute["steps"]
                row.rerun_differ |= {(b.seed, t) for t in b.recompute["nondet"]}
                row.rerun_nonfinite |= {(b.seed, t) for t in b.recompute.get("nonfinite", ())}
                if b.recompute.get("unrecoverable"):
                    row.unrecoverable.append((b.seed, b.end - 1))
            for s in b.steps:
                key = (fp, b.label, b.seed, s.step)
                if key in seen:
                    if seen[key][:2] != (s.finite, s.first_bad):
                        conflicts.append(f"{b.label} seed {b.seed} step {s.step}: {seen[key][2]} and {f.path.name} "
                                         "disagree; the first is counted")
                    continue
                seen[key] = (s.finite, s.first_bad, f.path.name)
                _count(row, b.seed, s)
    labels = list(rows)
    if order:
        labels = [lab for lab in order if lab in rows] + [lab for lab in labels if lab not in order]
    table = Table([rows[lab] for lab in labels], sorted(seeds), files[0].header.env if files else None)
    for r in table.rows:
        table.warnings += _row_warnings(r)
    if conflicts:
        table.warnings.append(f"{len(conflicts)} step(s) recorded twice with different outcomes "
                              f"(first: {conflicts[0]})")
    return table


def _row_warnings(r: Row) -> list[str]:
    out = [f"{r.label} seed {seed}: stopped after step {step}: the state before it could not be rebuilt finite "
           "(every recompute from its restore points came out non-finite); the seed's later steps were not measured"
           for seed, step in r.unrecoverable]
    if r.updates_known and r.updates_zero == r.updates_known:
        out.append(f"{r.label}: every finite step changed no parameter (max |update| 0 in all {r.updates_known}): "
                   "the step measured is a no-op update (a learning rate of 0 at these steps, as a warmup gives at "
                   "step 0), not the training step")
    return out


def _count(row: Row, seed: int, s: records.Step) -> None:
    k, n = row.per_seed.get(seed, (0, 0))
    row.per_seed[seed] = (k + (not s.finite), n + 1)
    row.injected += s.injected is not None
    if s.finite and s.max_abs_update is not None:
        row.updates_known += 1
        row.updates_zero += s.max_abs_update == 0.0
    if s.nondet:
        row.nondet_steps.add((seed, s.step))
        row.nondet_detailed += s.nondet_detail is not None
        for d in s.nondet_detail or ():
            leaf = row.nondet_leaves.setdefault(d["leaf"], {"steps": 0, "max_elements": 0, "max_abs": None,
                                                            "max_ulp": None})
            leaf["steps"] += 1
            leaf["max_elements"] = max(leaf["max_elements"], d["elements"])
            for key in ("max_abs", "max_ulp"):
                if d[key] is not None:
                    leaf[key] = d[key] if leaf[key] is None else max(leaf[key], d[key])
    if "variant" in row.config:
        row.losses[(seed, s.step)] = s.loss
    if s.first_bad:
        row.first_bad[s.first_bad] = row.first_bad.get(s.first_bad, 0) + 1
    ref = s.reference
    if ref is not None and not ref.get("skipped"):
        row.referenced += 1
        row.silent += not ref["ok"]


def first_missing(have: set[int], steps: int) -> tuple[int, int]:
    """(steps recorded in [0, steps), first step missing) without materialising range(steps)."""
    got = sorted(s for s in have if s < steps)
    first = next((i for i, s in enumerate(got) if s != i), len(got))
    return len(got), first


def find_gaps(res: results.Results) -> list[str]:
    """Configurations and seeds the file's own spec asked for but whose steps it lacks
    (a process that died, or a run that is still going)."""
    spec = res.header.spec
    have: dict[tuple[str, int], set[int]] = {}
    for b in res.blocks:
        have.setdefault((b.label, b.seed), set()).update(s.step for s in b.steps)
    gaps = []
    steps = spec["steps"]
    for label in records.spec_labels(spec):
        for seed in spec["seeds"]:
            n, first = first_missing(have.get((label, seed), set()), steps)
            if n < steps:
                gaps.append(f"{res.path.name}: {label} seed {seed}: {n}/{steps} steps (missing from step {first})")
    return gaps


def check_specs(files: list[results.Results]) -> None:
    """Refuse one label recorded under two specs (different options, same row name)."""
    first: dict[str, results.Results] = {}
    for f in files:
        for lab in {b.label for b in f.blocks} | set(records.spec_labels(f.header.spec)):
            other = first.setdefault(lab, f)
            if other.header.fingerprint != f.header.fingerprint:
                diff = results.spec_difference(other.header.spec, f.header.spec) or "fingerprint"
                raise HarnessError(f"{other.path} and {f.path} hold {lab} from different runs ({diff}); "
                                   "report them apart, or pass --allow-mixed-specs to pool them")


def check_blocks_in_spec(res: results.Results) -> None:
    """Every block of a file agrees with its header's spec (FILE:LINE and why, if not: block k is line k+1)."""
    lines = res.block_lines or list(range(2, len(res.blocks) + 2))
    for lineno, b in zip(lines, res.blocks, strict=True):
        try:
            records.check_block_in_spec(b, res.header.spec)
        except records.RecordError as exc:
            raise HarnessError(f"{res.path}:{lineno}: {exc}") from None
    origin_lines: list[int | None] = list(res.origin_lines) or [None] * len(res.origins)
    for at, o in zip(origin_lines, res.origins, strict=True):
        try:
            records.check_origin_in_spec(o, res.header.spec)
        except records.RecordError as exc:
            raise HarnessError(f"{res.path}:{at}: {exc}" if at else f"{res.path}: {exc}") from None


def load_table(folders: list[Path], allow_mixed_specs: bool = False) -> Table:
    """Read and validate every results file in the given folders into one table (with gaps)."""
    files: list[results.Results] = []
    for folder in folders:
        folder = Path(folder)
        if not folder.is_dir():
            raise HarnessError(f"{folder} is not a results folder")
        paths = results.results_files(folder)
        if not paths:
            raise HarnessError(f"{folder} holds no stress*.jsonl results")
        files.extend(results.read_results(p) for p in paths)
    for f in files:
        check_blocks_in_spec(f)
    if not allow_mixed_specs:
        check_specs(files)
    order: list[str] = []
    for f in files:
        order += [lab for lab in records.spec_labels(f.header.spec) if lab not in order]
    table = summarize(files, order)
    table.gaps = [g for f in files for g in find_gaps(f)]
    return table


def baseline_comparisons(t: Table) -> dict[str, dict]:
    """For every variant row of a ``--variants`` run: its baseline row (same configuration,
    ``variant=baseline``), the two-sided Fisher exact p of the two non-finite rates, and the
    largest relative loss difference over the (seed, step) both recorded as finite."""
    by_config = {json.dumps(r.config, sort_keys=True): r for r in t.rows}
    out = {}
    for r in t.rows:
        if r.config.get("variant", "baseline") == "baseline":
            continue
        base = by_config.get(json.dumps({**r.config, "variant": "baseline"}, sort_keys=True))
        if base is None:
            continue
        pairs = [(loss, b) for key, loss in r.losses.items()
                 if loss is not None and (b := base.losses.get(key)) is not None]
        diff = max((abs(a - b) / max(abs(b), 1e-30) for a, b in pairs), default=None)
        out[r.label] = {"baseline": base.label, "p_value": stats.fisher_exact(r.k, r.n, base.k, base.n),
                        "max_loss_rel_diff": diff, "compared_steps": len(pairs)}
    return out


def _fmt_vs_baseline(c: dict | None) -> str:
    if c is None:
        return "-"
    text = f"p={c['p_value']:.2g}"
    if c["max_loss_rel_diff"] is not None:
        text += f" dloss={c['max_loss_rel_diff']:.1e}"
    return text


def _fmt_spread(r: Row) -> str:
    d = r.dispersion()
    if len(d["rates"]) < 2:
        return "-"
    text = f"{d['min']:.3f}-{d['max']:.3f}"
    return text + (f" p={d['p_value']:.2g}" if d["p_value"] is not None else "")


def _fmt_seed(r: Row, seed: int) -> str:
    k, n = r.per_seed.get(seed, (0, 0))
    if not n:
        return "-"
    # Frozen: a seed's calls share one input; each seed is its own verdict, with its own bound.
    return f"{k}/{n} <={stats.upper_bound(k, n):.3f}" if r.protocol == "frozen" else f"{k}/{n}"


def _columns(t: Table) -> list[tuple[str, Callable[[Row], str]]]:
    """The optional columns the table needs, each (header, cell of a row)."""
    vs_base = baseline_comparisons(t)
    cols: list[tuple[str, Callable[[Row], str]]] = []
    if any(r.protocol == "frozen" or r.nondet for r in t.rows):
        cols.append(("nondet", lambda r: str(r.nondet)))
    if any(r.rerun_steps for r in t.rows):
        cols.append(("rerun diff", lambda r: f"{len(r.rerun_differ)}/{r.rerun_steps}" if r.rerun_steps else "-"))
    if any(r.injected for r in t.rows):
        cols.append(("injected", lambda r: str(r.injected)))
    if any(r.referenced for r in t.rows):
        cols.append(("silent (ref)", lambda r: f"{r.silent}/{r.referenced}"))
    if vs_base:
        cols.append(("vs baseline", lambda r: _fmt_vs_baseline(vs_base.get(r.label))))
    return cols


def _row_cells(r: Row, seeds: list[int]) -> list[str]:
    cells = [r.label] + [_fmt_seed(r, s) for s in seeds]
    if r.protocol == "frozen":
        return cells + [f"{r.k}/{r.n}", "-", "per seed", "-"]
    rate = r.rate()
    return cells + [f"{r.k}/{r.n}", f"{rate.rate:.3f}", f"{rate.upper:.4f}", _fmt_spread(r)]


def _notes(t: Table, headers: list[str]) -> list[str]:
    out = ["95% upper: one-sided exact (Clopper-Pearson) bound on the rate; seed spread: lowest-highest "
           "per-seed rate, p = chi-square test that all seeds share one rate"]
    if any(r.protocol == "frozen" for r in t.rows):
        out.append("frozen: every call of a seed gets the same inputs, so seeds are not pooled: each seed cell is "
                   "its own verdict, k/n <= its one-sided exact 95% upper bound")
    if "nondet" in headers:
        out.append("nondet: steps whose outputs were not a function of their inputs (frozen: a finite call whose "
                   "outputs differ in any bit from the seed's first finite call; train: a step its record marks "
                   "so, in results written by an earlier version that replayed failed blocks)")
        out += [line for r in t.rows for line in nondet_lines(r)]
    if "rerun diff" in headers:
        out.append("rerun diff: steps run again only to rebuild a rolled-back state (from the block's restore "
                   "point to the failed step), never counted: of those, how many gave a loss that differs in any "
                   "bit from their first execution (nondeterminism) / how many were run again")
        out += [f"  {r.label}: {len(r.rerun_nonfinite)} rerun step(s) came out non-finite (the rerun was tried "
                "again; the first execution, finite, is what counts)" for r in t.rows if r.rerun_nonfinite]
    out.append(_finite_errors_note(t))
    if "vs baseline" in headers:
        out.append("vs baseline: two-sided Fisher exact p of the row's rate against its configuration's baseline "
                   "row; dloss: largest relative loss difference at the same seed and step (both finite)")
    return out


def nondet_lines(r: Row, leaves: int = 5) -> list[str]:
    """Where a row's nondeterministic steps differed: the leaves most often changed, with how many
    elements and by how much; the steps recorded without that detail are counted."""
    if not r.nondet:
        return []
    out = [f"  {r.label}: {r.nondet} nondet step(s)"]
    if r.nondet_leaves:
        ranked = sorted(r.nondet_leaves.items(), key=lambda kv: (-kv[1]["steps"], -kv[1]["max_elements"]))
        parts = []
        for name, d in ranked[:leaves]:
            size = f"|diff| <= {d['max_abs']:.3g}" if d["max_abs"] is not None else "|diff| not finite"
            ulp = f", <= {d['max_ulp']:.0f} ULP" if d["max_ulp"] is not None else ""
            parts.append(f"{name} in {d['steps']} (up to {d['max_elements']} element(s), {size}{ulp})")
        more = f"; {len(ranked) - leaves} more leaves" if len(ranked) > leaves else ""
        out[0] += ": " + "; ".join(parts) + more
    undetailed = r.nondet - r.nondet_detailed
    if undetailed > 0:
        out.append(f"    {undetailed} of them recorded without the leaves that differed (results written before "
                   "per-leaf detail; run again with this version)")
    return out


def format_table(t: Table) -> str:
    """Plain-text table, one row per configuration."""
    cols = _columns(t)
    extra = [name for name, _ in cols]
    head = ["config"] + [f"seed {s}" for s in t.seeds] + ["total", "rate", "95% upper", "seed spread"] + extra
    lines = [_row_cells(r, t.seeds) + [cell(r) for _, cell in cols] for r in t.rows]
    out = format_rows(lines, header=head)
    if t.env:
        e = t.env
        out.append(f"(jax {e.get('jax')}, jaxlib {e.get('jaxlib')}, backend {e.get('backend')}, "
                   f"{e.get('device_count')} x {e.get('device_kind')})")
    out += _notes(t, extra)
    for g in t.gaps:
        out.append(f"gap: {g}")
    return printable("\n".join(out))


def _finite_errors_note(t: Table) -> str:
    """What the table says of finite errors (a wrong update with no NaN or inf in it)."""
    referenced = sum(r.referenced for r in t.rows)
    if not referenced:
        return ("finite errors: not looked for (counts are non-finite steps only; --reference recomputes steps "
                "in float64 and counts wrong finite updates as silent)")
    steps = sum(r.n for r in t.rows)
    return (f"silent (ref): wrong finite updates among the steps recomputed in float64; {referenced} of {steps} "
            "steps were recomputed" + ("" if referenced == steps else " (--reference-every, or steps skipped "
                                       "because they were non-finite): the others were not looked at"))


def load_origins(folders: list[Path]) -> list[dict]:
    """Every failing step's origin recorded in the folders' results files (``stress --explain``), as
    ``{"config", "seed", "step", "class", "summary", "where", "evidence", "seconds"}``, by
    configuration, seed and step; a step recorded twice counts once, as first read."""
    found: dict[tuple[str, int, int], dict] = {}
    for folder in folders:
        for path in results.results_files(Path(folder)):
            for o in results.read_results(path).origins:
                found.setdefault((o.label, o.seed, o.step), {"config": o.label, "seed": o.seed, "step": o.step,
                                                             **o.origin.to_json(), "seconds": o.seconds})
    return [found[k] for k in sorted(found)]


def origin_counts(origins: list[dict]) -> dict[str, int]:
    """How many explained steps each origin class holds, in the order of the classes."""
    from xla_harness.origin.classify import CLASSES

    counts = {c: 0 for c in CLASSES}
    for o in origins:
        counts[o["class"]] += 1
    return {c: n for c, n in counts.items() if n}


def format_origins(origins: list[dict], nonfinite: int) -> str:
    """Whose NaN each explained step is: a count per class, then one line per step."""
    if not origins:
        return ("whose NaN: no failing step to explain" if not nonfinite else
                f"whose NaN: none of the {nonfinite} non-finite steps was explained (planted by --inject, or "
                "stopped before its explanation)")
    counts = ", ".join(f"{n} {c}" for c, n in origin_counts(origins).items())
    lines = [f"whose NaN: {len(origins)} of {nonfinite} non-finite steps explained: {counts}"]
    for o in origins:
        lines.append(f"  {o['config']} seed {o['seed']} step {o['step']}: {o['class']}: {o['summary']}")
    return "\n".join(lines)
