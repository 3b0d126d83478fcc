"""bench/gpu_breakdown.py's arithmetic, apart from any machine: the parts (row, copy, loop, verdict and
writer) are differences of interleaved loops that add up to the gap block - user, and a part left out
is said, not summed as zero; the trace summary finds a device's idle gaps longer than 20 us (a
planted one is found, a 19 us one is not) and keeps the main thread apart. A tiny run of the whole
script on the CPU is in the gpu-evidence test (``make gpu-evidence --tiny``)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
_spec = importlib.util.spec_from_file_location("gpu_breakdown", ROOT / "bench" / "gpu_breakdown.py")
gpu_breakdown = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpu_breakdown)


def _times(rounds: int = 9, steps: int = 100) -> dict[str, list[float]]:
    base = {"user": 1.0, "+row": 1.1, "+copy": 1.12, "quiet": 1.15, "block": 1.2}  # ms per step
    return {k: [(v + 0.001 * ((r * 7 + i) % 5)) * 1e-3 * steps for r in range(rounds)]
            for i, (k, v) in enumerate(base.items())}


def test_the_parts_add_up_to_the_gap():
    b = gpu_breakdown.breakdown(_times(), 100)
    assert list(b["parts_s"]) == ["row", "copy", "loop", "verdict and writer"]
    assert b["adds_up"] is True
    assert b["gap_s"] == pytest.approx(0.2e-3, abs=5e-6)
    assert b["parts_s"]["row"]["median"] == pytest.approx(0.1e-3, abs=5e-6)
    assert 0.8 < b["user_over_block"]["median"] < 0.85


def test_a_loop_left_out_is_not_a_part_and_nothing_claims_to_add_up():
    times = {k: v for k, v in _times().items() if k in ("user", "block")}
    b = gpu_breakdown.breakdown(times, 100)
    assert b["parts_s"] == {} and b["adds_up"] is None


def test_parts_that_do_not_add_up_are_said_to():
    """The check can fail: medians of differences need not add up (they do per round): a quiet loop and
    a block loop whose rounds vary against each other leave the parts' sum 1 ms from the median gap."""
    ms = {"user": [1, 1, 1], "+row": [1, 1, 1], "+copy": [1, 1, 1], "quiet": [1, 2, 3], "block": [1, 4, 3]}
    b = gpu_breakdown.breakdown({k: [x * 1e-3 for x in v] for k, v in ms.items()}, 1)
    assert b["parts_sum_s"] == pytest.approx(1e-3) and b["gap_s"] == pytest.approx(2e-3)
    assert b["adds_up"] is False


def _trace(gaps_us: list[float]) -> dict:
    events = [{"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "/device:GPU:0"}},
              {"ph": "M", "pid": 2, "name": "process_name", "args": {"name": "/host:CPU"}},
              {"ph": "M", "pid": 2, "tid": 9, "name": "thread_name", "args": {"name": "python"}}]
    ts = 0.0
    for gap in [0.0, *gaps_us]:
        ts += gap
        events.append({"ph": "X", "pid": 1, "tid": 5, "ts": ts, "dur": 100.0, "name": "fusion"})
        events.append({"ph": "X", "pid": 1, "tid": 6, "ts": ts + 10, "dur": 50.0, "name": "overlapping stream"})
        ts += 100.0
    events.append({"ph": "X", "pid": 2, "tid": 9, "ts": 0.0, "dur": 30.0, "name": "dispatch"})
    return {"traceEvents": events}


def test_the_trace_summary_finds_device_idle_gaps_over_20_us():
    s = gpu_breakdown.summarize_trace(_trace([5.0, 19.0, 21.0, 400.0]), wall_s=0.01, main_cpu_s=0.002)
    device = s["timelines"]["/device:GPU:0"]
    assert device["gaps_over_20us"] == 2
    assert device["gaps_over_20us_s"] == pytest.approx(421e-6)
    assert device["largest_gap_s"] == pytest.approx(400e-6)
    assert device["busy_s"] == pytest.approx(500e-6)  # five events, the overlapping stream merged into them
    assert s["timelines"]["python main thread"]["busy_s"] == pytest.approx(30e-6)
    assert s["wall_s"] == 0.01 and s["main_thread_cpu_s"] == 0.002
    assert gpu_breakdown.summarize_trace(_trace([19.0, 5.0]))["timelines"]["/device:GPU:0"]["gaps_over_20us"] == 0
