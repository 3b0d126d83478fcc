"""The results report as JSON (``report --json``, ``stress --json``): per configuration its counts, rate,
bound and seed spread, the run's totals, environment, gaps and warnings."""

from __future__ import annotations

import json

from xla_harness.stress.report.summary import Table, baseline_comparisons, stats


def table_json(t: Table) -> dict:
    vs_base = baseline_comparisons(t)
    return {
        "configs": [
            {"config": r.label,
             "per_seed": {str(s): {"nonfinite": k, "steps": n} for s, (k, n) in sorted(r.per_seed.items())},
             **r.rate().to_dict(),
             "seed_dispersion": r.dispersion(),
             "injected": r.injected,
             "first_bad": r.first_bad,
             "silent": r.silent, "referenced": r.referenced,
             "nondet": r.nondet, "protocol": r.protocol,
             **({"nondet_leaves": r.nondet_leaves} if r.nondet else {}),
             **({"reruns": {"steps": r.rerun_steps, "differ": sorted(r.rerun_differ),
                            "nonfinite": sorted(r.rerun_nonfinite), "unrecoverable": sorted(r.unrecoverable)}}
                if r.rerun_steps or r.unrecoverable else {}),
             **({"per_seed_upper": {str(s): stats.upper_bound(k, n) for s, (k, n) in sorted(r.per_seed.items())}}
                if r.protocol == "frozen" else {}),
             **({"vs_baseline": vs_base[r.label]} if r.label in vs_base else {})}
            for r in t.rows
        ],
        "seeds": t.seeds,
        "total_nonfinite": t.total_nonfinite,
        "total_nondet": sum(r.nondet for r in t.rows),
        "finite_errors": {"referenced_steps": sum(r.referenced for r in t.rows), "steps": sum(r.n for r in t.rows),
                          "silent": sum(r.silent for r in t.rows)},
        "env": t.env,
        "gaps": t.gaps,
        "warnings": t.warnings,
    }


def dumps(t: Table, fingerprints: dict | None = None, origins: list[dict] | None = None) -> str:
    data = table_json(t)
    if fingerprints is not None:
        data["fingerprints"] = fingerprints
    if origins is not None:
        data["origins"] = origins
    return json.dumps(data, indent=2, sort_keys=True)
