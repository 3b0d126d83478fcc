"""The results report's figure (``--plot``): the non-finite rate per configuration with its bound."""

from __future__ import annotations

from pathlib import Path

from xla_harness.errors import HarnessError
from xla_harness.stress.report.summary import Table


def plot(t: Table, path: Path) -> Path:
    """PNG: non-finite rate per configuration with its one-sided exact 95% upper bound.

    Whether ``path`` may be replaced is the caller's decision (the CLI refuses an input, a results
    file, or an existing file without --force); here a results file is refused all the same."""
    if Path(path).is_dir():
        raise HarnessError(f"cannot write plot {path}: it is a folder")
    first = b""
    if Path(path).is_file() and Path(path).suffix == ".jsonl":
        try:
            with open(path, "rb") as fh:
                first = fh.read(4096).split(b"\n", 1)[0]
        except OSError:
            pass
        if b'"kind"' in first and b'"header"' in first:
            raise HarnessError(f"cannot write plot {path}: it is a stress results file")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise HarnessError("plotting needs matplotlib: pip install 'xla-harness[plot]'") from None
    labels = [r.label for r in t.rows]
    rates = [r.rate().rate for r in t.rows]
    lo = [0.0 for _ in t.rows]
    hi = [r.rate().upper - r.rate().rate for r in t.rows]
    fig, ax = plt.subplots(figsize=(max(5.0, 1.1 * len(labels) + 2), 3.8))
    ax.errorbar(range(len(labels)), rates, yerr=[lo, hi], fmt="o", capsize=5, color="C3")
    for i, r in enumerate(t.rows):
        ax.annotate(f"{r.k}/{r.n}", (i, rates[i]), textcoords="offset points", xytext=(8, 4), fontsize=8)
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, rotation=25, ha="right", fontsize=8)
    ax.set_ylim(-0.02, 1.02)
    ax.set_ylabel("non-finite update rate")
    env = t.env or {}
    ax.set_title(f"non-finite updates per configuration (bars: one-sided exact 95% upper bound) - "
                 f"{env.get('backend', '?')} "
                 f"{env.get('device_kind', '')}", fontsize=9)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=120, format="png")
    except OSError as exc:
        raise HarnessError(f"cannot write plot {path}: {exc.strerror}") from None
    finally:
        plt.close(fig)
    return path
