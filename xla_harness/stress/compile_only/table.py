"""The table of a compile-only matrix (``report`` of folders holding ``compile.jsonl``): one row per
compiled configuration, and the check that no configuration was compiled under two sets of jax
settings."""

from __future__ import annotations

import json

from xla_harness.errors import HarnessError


def _versions_key(r: dict) -> str:
    return json.dumps([r.get("target"), r.get("versions", {})], sort_keys=True)


def check_compile_settings(records: list[dict]) -> None:
    """Refuse one configuration (label, target, versions) compiled under two sets of jax settings:
    two programs under one name. A record without settings (written before they were recorded)
    counts as unknown settings, different from any recorded ones."""
    from xla_harness.stress.results.provenance import JAX_CONFIG_KEY, settings_difference

    first: dict[str, dict] = {}
    for r in records:
        key = json.dumps([r.get("label"), _versions_key(r)])
        other = first.setdefault(key, r)
        diff = settings_difference(other.get(JAX_CONFIG_KEY), r.get(JAX_CONFIG_KEY))
        if diff:
            raise HarnessError(f"{r.get('label')} on {r.get('target')} was compiled under two sets of jax settings "
                               f"({diff}); report them apart, or pass --allow-mixed-specs to list both")


def _differing_settings(records: list[dict]) -> dict[str, set[str]]:
    """Per versions key: the jax settings whose values differ between records of those versions."""
    values: dict[str, dict[str, set[str]]] = {}
    for r in records:
        for k, v in (r.get("jax_config") or {}).items():
            values.setdefault(_versions_key(r), {}).setdefault(k, set()).add(json.dumps(v))
    return {vk: {k for k, vs in d.items() if len(vs) > 1} for vk, d in values.items()}


def compile_table_rows(records: list[dict]) -> list[list[str]]:
    """One row per compiled configuration: target, versions, configuration, what the compiler made
    (fingerprint, instructions, fusions libtpu aliased and those holding a scatter) and the scan.
    Where records of one jax version differ in a jax setting, the configuration names its value."""
    rows = []
    differing = _differing_settings(records)
    for r in records:
        shown = sorted(differing.get(_versions_key(r), ()))
        settings = r.get("jax_config")
        note = "" if not shown else (" {jax settings unknown}" if settings is None else
                                     " {" + ",".join(f"{k}={settings.get(k)}" for k in shown) + "}")
        versions = r.get("versions", {})
        compiler = next((f"{k} {v}" for k, v in versions.items() if k not in ("jax", "jaxlib")), "")
        alias = r["scan"].get("compiler_alias") or {}
        aliased = (f"{alias.get('aliased_fusions', 0)} ({alias.get('aliased_scatter_fusions', 0)} scatter, "
                   f"{alias.get('disagreements', 0)} disagree)" if alias.get("instructions_with_field") else "-")
        rows.append([r.get("target", "?"), f"jax {versions.get('jax', '?')}", compiler or "-",
                     str(r.get("label")) + note,
                     r["fingerprint"].get("id", "?"), str(r["fingerprint"].get("instructions", "?")), aliased,
                     str(r["scan"].get("hazard", 0)), str(r["scan"].get("decisions", 0)),
                     f"{r.get('compile_cpu_s', 0):.0f}"])
    return rows


COMPILE_TABLE_HEADER = ["target", "jax", "compiler", "configuration", "fingerprint", "instructions",
                        "compiler-aliased fusions", "hazard", "fused-producer", "compile CPU s"]
