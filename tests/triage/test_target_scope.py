"""A target's verdict says how much of the target was compiled: a factory without ``devices=`` builds
its step for one device, and a ``tpu:v6e:2x4`` verdict drawn from it says "compiled for 1 of 8
devices" in the compile line, the answer and the report's table; a step compiled for all of the
target's devices says nothing more."""

from __future__ import annotations

import pytest

from xla_harness.stress.compile_only.run import CompileRecord
from xla_harness.triage.answer import target_sentence
from xla_harness.triage.compiled import TargetVerdict, verdict_from_json
from xla_harness.triage.render import _target_rows


def verdict(devices, target_devices) -> TargetVerdict:
    return TargetVerdict(target="tpu:v6e:2x4", backend="tpu", versions={"libtpu": "0.0.50"}, instructions=10,
                         hazard=0, fused_producer=0, hazard_fusions=[], decision_fusions=[], scatters=[],
                         compiler_states_aliasing=True, disagreements=0, nondeterministic=None, w_dims=None,
                         devices=devices, target_devices=target_devices)


def test_one_of_eight_devices_is_said_everywhere_the_target_is_named():
    v = verdict(1, 8)
    assert v.scope() == "compiled for 1 of 8 devices"
    assert "(libtpu 0.0.50; compiled for 1 of 8 devices)" in target_sentence(v)
    assert _target_rows([v])[1][0] == "tpu:v6e:2x4 (compiled for 1 of 8 devices)"
    assert verdict_from_json(v.to_json()).scope() == v.scope()  # kept in triage.json


@pytest.mark.parametrize("devices, of", [(8, 8), (None, 8), (1, None), (None, None)])
def test_a_whole_or_unknown_scope_adds_nothing(devices, of):
    v = verdict(devices, of)
    assert v.scope() == "" and "compiled for" not in target_sentence(v)
    assert _target_rows([v])[1][0] == "tpu:v6e:2x4"


def test_a_verdict_written_before_the_fields_existed_still_reads_and_a_wrong_type_is_refused():
    old = verdict(None, None).to_json()
    del old["devices"], old["target_devices"]
    assert verdict_from_json(old).scope() == ""
    bad = verdict(1, 8).to_json()
    bad["target_devices"] = "8"
    with pytest.raises(ValueError, match="target_devices"):
        verdict_from_json(bad)


def _record(devices: int, target_devices: int) -> dict:
    return {"target": "tpu:v6e:2x4", "devices": devices, "target_devices": target_devices, "device_kind": "TPU v6 lite",
            "compile_cpu_s": 1.0, "fingerprint": {"id": "f", "instructions": 1, "temp_size_in_bytes": 0,
                                                  "alias_size_in_bytes": 0},
            "scan": {"backend": "tpu", "hazard": 0, "decisions": 0, "aliased": 0, "layout-preserving-miss": 0}}


def test_the_compile_line_says_the_devices_it_covers():
    assert "(1x TPU v6 lite, 1 of the target's 8 devices)" in CompileRecord("m", _record(1, 8)).line()
    assert "(8x TPU v6 lite)" in CompileRecord("m", _record(8, 8)).line()


def test_the_host_runs_the_programs_own_device_count_and_says_nothing():
    v = TargetVerdict(**{**verdict(1, 8).to_json(), "target": "host"})
    assert v.scope() == "" and "compiled for" not in target_sentence(v)
    assert "devices" not in CompileRecord("m", {**_record(1, 8), "target": "host"}).line().split("):")[0].split("(")[-1]
