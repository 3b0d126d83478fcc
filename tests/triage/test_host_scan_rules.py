"""A compile for the host is scanned by its device's compiler's rules with its buffer assignment as the
aliasing truth, as triage judges it: the compile line says ``scan (cpu)`` on a CPU, never ``unknown``,
and its counts equal the triage verdict's for the same module."""

from __future__ import annotations

from pathlib import Path

import pytest

from xla_harness.stress.compile_only.run import host_rules
from xla_harness.stress.spec import StressSpec

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = str(ROOT / "examples/quickstart/my_model.py") + ":make"


@pytest.mark.parametrize("kind, rules", [("cpu", "cpu"), ("NVIDIA H100 80GB HBM3", "gpu"), ("TPU v6 lite", "tpu")])
def test_host_rules_follow_the_device(kind, rules):
    assert host_rules(kind) == rules


def test_the_host_compile_record_scans_as_triage_does(tmp_path):
    from xla_harness.stress.compile_only.run import compile_matrix
    from xla_harness.targets.spec import parse_target
    from xla_harness.triage.compiled import record_rules, verdict_of_record

    spec = StressSpec(program=QUICKSTART, steps=1)
    recs = list(compile_matrix(spec, parse_target("host"), out=tmp_path))
    record = recs[0].record
    assert record["scan"]["backend"] == "cpu" and "scan (cpu)" in recs[0].line()
    assert record_rules(record) == record["scan"]["backend"]
    verdict = verdict_of_record(record, tmp_path, "host")
    assert verdict.backend == record["scan"]["backend"]
    assert verdict.hazard == record["scan"]["hazard"]
