"""bisect-passes with a real compiler oracle (a property of the compiled HLO) and a
stochastic oracle (faults injected while a given pass is enabled)."""

import json

import pytest

from xla_harness.cli import main
from xla_harness.errors import HarnessError
from xla_harness.repro import bisect

from ..helpers import TINY_ARGS


def test_ddmin_finds_a_one_minimal_set():
    needed = {"b", "e"}
    calls = []

    def removes(disabled):
        calls.append(disabled)
        return needed <= disabled

    assert sorted(bisect.ddmin(list("abcdefgh"), removes)) == ["b", "e"]
    assert len(set(calls)) < 30  # distinct probes (the log answers repeats)


def test_passes_from_dump_names():
    names = ["module_0001.jit_f.0003.simplification.after_algsimp.before_cse.txt",
             "module_0001.jit_f.0004.simplification.after_cse.before_pipeline-end.txt",
             "module_0001.jit_f.cpu_after_optimizations.txt"]
    assert bisect.passes_from_dump(names) == ["algsimp", "cse"]


@pytest.mark.slow
def test_hlo_oracle_finds_the_pass_that_creates_the_property(tmp_path, capsys):
    out = tmp_path / "b"
    rc = main(["bisect-passes", "--oracle", "hlo", "--property", "multi-op-fusion", "--program", "small",
               "--out", str(out), "--quiet"])
    assert rc == 0
    text = capsys.readouterr().out
    minimal = text.split("removes the failure: ")[1].splitlines()[0].split(", ")
    # Check the answer with the real compiler, independently of the bisection's own probes.
    oracle = bisect.SubprocessOracle({"program": "small", "oracle": "hlo", "property": "multi-op-fusion"})
    assert not oracle(frozenset(minimal)).failing  # disabling the set removes the property
    assert oracle(frozenset()).failing  # the stock compile has it
    for p in minimal:  # 1-minimal: each pass of the set is needed
        assert oracle(frozenset(minimal) - {p}).failing
    assert f"XLA_FLAGS=--xla_disable_hlo_passes={','.join(minimal)}" in text
    # Resume: every probe comes from the log.
    assert main(["bisect-passes", "--oracle", "hlo", "--property", "multi-op-fusion", "--program", "small",
                 "--out", str(out), "--resume", "--quiet"]) == 0
    assert "0 new probe(s)" in capsys.readouterr().out
    kinds = [json.loads(x)["kind"] for x in (out / "bisect.jsonl").read_text().splitlines()]
    assert kinds.count("result") == 2 and "probe" in kinds


@pytest.mark.slow
def test_stochastic_oracle_with_statistical_stopping(tmp_path, capsys):
    passes = "batched_gather_scatter_normalizer,algsimp,zero_sized_hlo_elimination,simplification,cse,fusion"
    rc = main(["bisect-passes", "--oracle", "stress", "--inject-pass", "algsimp", "--inject-rate", "0.3",
               "--baseline-steps", "60", "--passes", passes, "--out", str(tmp_path / "s"), *TINY_ARGS])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    assert "removes the failure: algsimp\n" in captured.out
    # baseline k/60 -> runs_needed(k/60, 0.95) steps per probe, and it says so.
    base = [json.loads(x) for x in (tmp_path / "s" / "bisect.jsonl").read_text().splitlines()
            if json.loads(x)["kind"] == "baseline"][0]
    from xla_harness.stress.report import stats

    assert base["steps_per_probe"] == stats.runs_needed(base["nonfinite"] / base["steps"], 0.95)
    assert f"each probe runs up to {base['steps_per_probe']} steps (95% confidence)" in captured.err


@pytest.mark.slow
def test_config_that_does_not_fail(tmp_path, capsys):
    rc = main(["bisect-passes", "--oracle", "stress", "--baseline-steps", "5", "--out", str(tmp_path / "n"),
               "--quiet", *TINY_ARGS])
    assert rc == 2
    assert capsys.readouterr().err.strip().endswith("the configuration does not fail: 0 non-finite steps in 5")


def test_bad_input(tmp_path, capsys):
    assert main(["bisect-passes", "--oracle", "hlo", "--property", "weird", "--out", str(tmp_path / "x")]) == 2
    assert "unknown property 'weird'" in capsys.readouterr().err


@pytest.mark.slow
def test_hlo_property_absent_from_the_stock_compile_is_refused(tmp_path, capsys):
    out = tmp_path / "never"
    rc = main(["bisect-passes", "--oracle", "hlo", "--property", "regex:NEVER_IN_ANY_HLO", "--program", "small",
               "--out", str(out), "--quiet"])
    captured = capsys.readouterr()
    assert rc == 2
    assert "minimal set" not in captured.out
    assert captured.err.count("error:") == 1 and "does not fail with every pass enabled" in captured.err
    probes = [json.loads(x) for x in (out / "bisect.jsonl").read_text().splitlines()]
    assert [p["kind"] for p in probes] == ["task", "probe"] and probes[1]["disabled"] == []


def test_resume_refuses_a_log_of_another_task(tmp_path, capsys):
    out = tmp_path / "r"
    task = {"program": "small", "oracle": "hlo", "property": "multi-op-fusion"}
    bisect.ProbeLog(out / "bisect.jsonl", resume=False, task=task).record(
        "probe", disabled=["algsimp"], failing=True, detail="x")
    again = bisect.ProbeLog(out / "bisect.jsonl", resume=True, task=task)
    assert again.known == {frozenset({"algsimp"}): bisect.Probe(frozenset({"algsimp"}), True, "x")}
    before = (out / "bisect.jsonl").read_bytes()
    rc = main(["bisect-passes", "--oracle", "hlo", "--property", "scatter-root-fusion", "--program", "small",
               "--out", str(out), "--resume", "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2 and "holds a bisection of another task (differs in " in err
    assert "property" in err.split("differs in ")[1].split(")")[0]
    assert (out / "bisect.jsonl").read_bytes() == before
    (out / "bisect.jsonl").write_text('{"kind": "probe", "disabled": [], "failing": true}\n')
    with pytest.raises(HarnessError, match="no task line"):
        bisect.ProbeLog(out / "bisect.jsonl", resume=True, task=task)


def _fake_bisect(tmp_path, probes_before_time_is_up):
    """ddmin over 8 passes, the failure coming from b and e, with a clock that reaches the deadline after
    ``probes_before_time_is_up`` probes of the oracle."""
    needed = {"b", "e"}
    ran = []

    def oracle(disabled):
        ran.append(disabled)
        return bisect.Probe(disabled, not needed <= disabled, "fake")

    log = bisect.ProbeLog(tmp_path / "bisect.jsonl", False, task={"t": 1})
    return ran, log, lambda: bisect.bisect(list("abcdefgh"), oracle, log, deadline=1.0,
                                           clock=lambda: 1.0 if len(ran) >= probes_before_time_is_up else 0.0)


def test_a_bisection_out_of_time_says_what_it_narrowed(tmp_path):
    ran, log, go = _fake_bisect(tmp_path, 10)
    with pytest.raises(bisect.OutOfTime) as stop:
        go()
    partial = stop.value.partial
    assert len(ran) == 10 and partial["probes"] == 10 and partial["candidates"] == 8
    # The smallest set seen to remove the failure, still holding both passes it needs.
    assert {"b", "e"} <= set(partial["narrowed"]) and len(partial["narrowed"]) < 8
    assert "narrowed so far" in str(stop.value) and ", ".join(partial["narrowed"]) in str(stop.value)
    last = json.loads((tmp_path / "bisect.jsonl").read_text().splitlines()[-1])
    assert last["kind"] == "stopped" and last["narrowed"] == partial["narrowed"]
    # --resume takes the log (the "stopped" line included) and finishes with the same answer.
    resumed = bisect.ProbeLog(tmp_path / "bisect.jsonl", True, task={"t": 1})
    assert len(resumed.known) == 10
    result = bisect.bisect(list("abcdefgh"), lambda d: bisect.Probe(d, not {"b", "e"} <= d, "fake"), resumed)
    assert result.minimal == ["b", "e"]


def test_a_bisection_out_of_time_before_any_removing_probe_says_so(tmp_path):
    ran, _, go = _fake_bisect(tmp_path, 0)
    with pytest.raises(bisect.OutOfTime) as stop:
        go()
    assert ran == [] and stop.value.partial == {"probes": 0, "candidates": 8, "narrowed": None}
    assert "no set of disabled passes tried so far removes the failure" in str(stop.value)


@pytest.mark.slow
def test_time_limit_stops_before_the_next_probe_and_says_so(tmp_path, capsys):
    """--time-limit spent by the pass listing: no probe starts, exit 1, the partial state in --json."""
    out = tmp_path / "b"
    rc = main(["bisect-passes", "--oracle", "hlo", "--property", "multi-op-fusion", "--program", "small",
               "--out", str(out), "--quiet", "--json", "--time-limit", "0.001"])
    got = json.loads(capsys.readouterr().out)
    assert rc == 1 and got["finished"] is False
    assert got["partial"]["probes"] == 0 and got["partial"]["narrowed"] is None and got["partial"]["candidates"] > 0
    assert "no set of disabled passes tried so far" in got["summary"]
    assert json.loads((out / "bisect.jsonl").read_text().splitlines()[-1])["kind"] == "stopped"
