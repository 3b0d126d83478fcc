"""The triage report's figures, each a PNG (matplotlib, Agg): the non-finite rates with their one-sided
exact 95% upper bounds (:func:`rates_figure`), nondeterminism per output leaf (:func:`nondet_figure`)
and an in-place scatter fusion's compiled neighbourhood (:func:`neighbourhood_figure`, its columns cut
to :data:`MAX_COLUMN` nodes by :func:`collapsed`). :mod:`~xla_harness.triage.render` places them.
"""

from __future__ import annotations

import io

from xla_harness.stress.report import stats
from xla_harness.triage.answer_record import CONFIDENCE, bound_text
from xla_harness.triage.compiled import Neighbourhood, Node


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    _pyplot().close(fig)
    return buf.getvalue()


def rates_figure(rows: list[tuple[str, int, int]]) -> bytes:
    """Non-finite rate per row (stage, configuration or variant), its line up to the one-sided exact 95%
    upper bound (the report's one convention)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 0.45 * len(rows) + 1.2))
    for i, (_, k, n) in enumerate(rows):
        hi = stats.upper_bound(k, n, CONFIDENCE)
        rate = k / n if n else 0.0
        ax.plot([0.0, hi], [i, i], color="tab:blue", lw=2)
        ax.plot([rate], [i], "o", color="tab:red" if k else "tab:blue")
        ax.text(hi, i, f"  {k}/{n}, at most {bound_text(k, n)}", va="center", fontsize=8)
    ax.set_yticks(range(len(rows)), [r[0] for r in rows], fontsize=8)
    ax.set_xlabel("non-finite rate (the line: up to its one-sided exact 95% upper bound)")
    ax.set_xlim(0, min(1.0, max(0.05, max(stats.upper_bound(k, n, CONFIDENCE) for _, k, n in rows) * 1.4)))
    ax.invert_yaxis()
    return _png(fig)


def nondet_size(d: dict) -> str:
    """How far a leaf's nondeterministic values were apart: elements, the largest |diff| first (ULPs
    alone mislead near zero: 1e-45 and 0 are millions of ULPs apart), its ULPs after."""
    parts = [f"{d['max_elements']} el."]
    if d.get("max_abs") is not None:
        parts.append(f"|diff| <= {d['max_abs']:.3g}" + (f" ({d['max_ulp']:.0f} ULP)" if d.get("max_ulp") is not None
                                                         else ""))
    elif d.get("max_ulp") is not None:
        parts.append(f"<= {d['max_ulp']:.0f} ULP")
    return ", ".join(parts)


def nondet_figure(leaves: dict[str, dict]) -> bytes:
    """Per output leaf: how many nondeterministic steps changed it."""
    plt = _pyplot()
    ranked = sorted(leaves.items(), key=lambda kv: -kv[1]["steps"])[:20]
    fig, ax = plt.subplots(figsize=(7, 0.35 * len(ranked) + 1.2))
    ax.barh(range(len(ranked)), [d["steps"] for _, d in ranked], color="tab:orange")
    ax.set_yticks(range(len(ranked)), [name for name, _ in ranked], fontsize=8)
    for i, (_, d) in enumerate(ranked):
        ax.text(d["steps"], i, f"  {nondet_size(d)}", va="center", fontsize=7)
    ax.set_xlabel("nondeterministic steps that changed the leaf")
    ax.invert_yaxis()
    return _png(fig)


MAX_COLUMN = 8  # nodes a column of the neighbourhood figure shows before the rest are grouped


def collapsed(g: Neighbourhood, limit: int = MAX_COLUMN) -> Neighbourhood:
    """``g`` with each role's column cut to ``limit`` nodes: the in-place path (the fusion, the nodes on
    its "in place" edge and their producers) is always kept, the rest beyond the limit become one node
    per column counting them by opcode ("+19 more: 12 parameter, 7 fusion"); their edges go to it."""
    hot = {n.name for n in g.nodes if n.role == "fusion"}
    for _ in range(3):  # the in-place operand, then its producers up the path
        hot |= {src for src, dst, label in g.edges if dst in hot and (label == "in place" or dst != g.fusion)}
    by_role: dict[str, list[Node]] = {}
    for node in g.nodes:
        by_role.setdefault(node.role, []).append(node)
    nodes, renamed = [], {}
    for role, members in by_role.items():
        if len(members) <= limit:
            nodes += members
            continue
        keep = [n for n in members if n.name in hot]
        keep += [n for n in members if n.name not in hot][:max(0, limit - 1 - len(keep))]
        rest = [n for n in members if n not in keep]
        kinds: dict[str, int] = {}
        for n in rest:
            op = (n.label.split("\n") + ["?"])[1].split(" ")[0]
            kinds[op] = kinds.get(op, 0) + 1
        name = f"+{len(rest)} more {role}s"
        text = f"+{len(rest)} more\n" + ", ".join(f"{c} {op}" for op, c in sorted(kinds.items(), key=lambda kv: -kv[1]))
        nodes += keep + [Node(name, text, role)]
        renamed.update({n.name: name for n in rest})
    edges, seen = [], set()
    for src, dst, label in g.edges:
        src, dst = renamed.get(src, src), renamed.get(dst, dst)
        label = label if label == "in place" or (src not in renamed.values() and dst not in renamed.values()) else ""
        if (src, dst, label) not in seen:
            seen.add((src, dst, label))
            edges.append((src, dst, label))
    return Neighbourhood(g.fusion, nodes, edges)


def neighbourhood_figure(g: Neighbourhood) -> bytes:
    """The in-place scatter fusion (centre), its operands and their producers (left) and its users
    (right); the in-place operand's edge in red."""
    plt = _pyplot()
    columns = {"producer": 0, "operand": 1, "fusion": 2, "user": 3}
    g = collapsed(g)
    placed: dict[str, tuple[float, float]] = {}
    per_col: dict[int, list[str]] = {}
    for node in g.nodes:
        per_col.setdefault(columns.get(node.role, 1), []).append(node.name)
    height = max(len(v) for v in per_col.values())
    for col, names in per_col.items():
        for i, name in enumerate(names):
            placed[name] = (col * 3.2, (height - 1) / 2 - i + (len(names) - 1) / 2 - (height - 1) / 2)
    fig, ax = plt.subplots(figsize=(11, 1.1 * height + 1))
    for src, dst, label in g.edges:
        if src in placed and dst in placed:
            (x0, y0), (x1, y1) = placed[src], placed[dst]
            hot = label == "in place"
            ax.annotate("", xy=(x1 - 0.9, y1), xytext=(x0 + 0.9, y0),
                        arrowprops={"arrowstyle": "->", "color": "tab:red" if hot else "0.5", "lw": 2 if hot else 1})
            if label:
                ax.text((x0 + x1) / 2, (y0 + y1) / 2 + 0.12, label, fontsize=7, ha="center",
                        color="tab:red" if hot else "0.3")
    for node in g.nodes:
        x, y = placed[node.name]
        face = {"fusion": "#ffe0b0", "operand": "#e0ecff", "producer": "#f0f0f0", "user": "#e8ffe0"}[node.role]
        lines = node.label.split("\n")
        text = "\n".join(line if len(line) <= 34 else line[:31] + "..." for line in lines)
        ax.text(x, y, text, ha="center", va="center", fontsize=6.5, family="monospace",
                bbox={"boxstyle": "round", "fc": face, "ec": "0.4"})
    ax.set_xlim(-1.6, 3 * 3.2 + 1.6)
    ax.set_ylim(-height / 2 - 0.6, height / 2 + 0.6)
    ax.axis("off")
    ax.set_title(f"{g.fusion}: compiled neighbourhood (red: the in-place operand)", fontsize=9)
    return _png(fig)
