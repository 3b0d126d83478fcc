"""#34 items 4 and 8: what a run is configured with is what the user asked for, or refused.

4. --devices with a program and a target is honoured (it compiled on all 8 chips), a
   --program-option devices= that disagrees with it is refused (it silently won), --compile-only
   --protocol frozen compiles the step as the frozen protocol runs it (no donation), and scan's
   program flags without --model are refused (ignored before).
8. Every numeric flag is a finite number in range, checked while the command line is read
   (--checkpoint-seconds nan was an ``error: internal:`` after the run had started).
(Item 1, the programs' option tables: tests/programs/test_options.py.)
"""

from __future__ import annotations

import math

import pytest

from xla_harness.cli import main
from xla_harness.errors import HarnessError

from ..bad_input_cases import TINY_35409

# ----------------------------------------------------------------------------- item 4: flags


@pytest.mark.parametrize("argv", [
    ["stress", "--quiet", "--out", "OUT", "--program", "issue-35409", "--devices", "2", "--program-option",
     "devices=4"],
    ["stress", "--compile-only", "--quiet", "--program", "issue-35409", "--devices", "2", "--program-option",
     "devices=4"],
    ["scan", "--model", "issue-35409", "--devices", "2", "--program-option", "devices=4"],
], ids=["stress", "compile-only", "scan"])
def test_devices_and_a_program_option_devices_that_disagree_are_refused(argv, tmp_path, capsys):
    argv = [str(tmp_path / "o") if a == "OUT" else a for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "--devices 2 and --program-option devices=4 disagree" in err
    assert not (tmp_path / "o").exists()


def test_with_devices_gives_the_count_to_the_program():
    from xla_harness.commands.flags import with_devices

    assert with_devices({"remat": True}, 2) == {"remat": True, "devices": 2}
    assert with_devices({"devices": 2}, 2) == {"devices": 2}
    assert with_devices({"devices": 4}, None) == {"devices": 4}
    with pytest.raises(HarnessError, match="disagree"):
        with_devices({"devices": 4}, 2)


@pytest.mark.parametrize("flag", [["--devices", "2"], ["--program-option", "remat=False"]])
def test_scan_refuses_program_flags_without_model(flag, tmp_path, capsys):
    (tmp_path / "m.hlo").write_text("HloModule m\n\nENTRY e {\n  ROOT p = f32[4] parameter(0)\n}\n")
    assert main(["scan", str(tmp_path / "m.hlo"), *flag]) == 2
    assert f"error: {flag[0]} needs --model" in capsys.readouterr().err


@pytest.mark.slow
def test_compile_only_devices_reaches_a_program_that_takes_it(tmp_path, capsys):
    """--devices 2 on the #35409 program: it compiled for its own default (one device on the host, all
    of a target's) before; the record now says 2."""
    import json

    assert main(["stress", "--compile-only", "--quiet", "--json", "--program", "issue-35409", *TINY_35409,
                 "--devices", "2"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [c["devices"] for c in doc["configurations"]] == [2]
    assert doc["configurations"][0]["options"]["devices"] == 2


@pytest.mark.slow
def test_compile_only_devices_on_a_tpu_target(capsys):
    import json

    from xla_harness.targets import parse_target
    from xla_harness.targets.devices import missing

    why = missing(parse_target("tpu:v6e:2x4"))
    if why:
        pytest.skip(why)
    assert main(["stress", "--compile-only", "--quiet", "--json", "--target", "tpu:v6e:2x4", "--program",
                 "issue-35409", *TINY_35409, "--devices", "2"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [c["devices"] for c in doc["configurations"]] == [2]  # all 8 chips before


@pytest.mark.slow
def test_scan_model_devices_reaches_the_program_on_a_target(tmp_path, capsys):
    """scan --model the same: --devices 2 on tpu:v6e:2x4 compiles the #35409 program for 2 chips."""
    from xla_harness.targets import parse_target
    from xla_harness.targets.devices import missing

    why = missing(parse_target("tpu:v6e:2x4"))
    if why:
        pytest.skip(why)
    saved = tmp_path / "m.hlo"
    assert main(["scan", "--model", "issue-35409", *TINY_35409, "--target", "tpu:v6e:2x4", "--devices", "2",
                 "--save-hlo", str(saved)]) in (0, 1)
    header = saved.read_text().split("\n", 1)[0]
    assert "num_partitions=2" in header, header


@pytest.mark.slow
def test_compile_only_frozen_compiles_the_step_without_donation(tmp_path):
    """The frozen protocol calls the step on the same inputs every time, so it donates nothing; the
    compile-only record of a frozen matrix is that step (it was the donated train step)."""
    from xla_harness.stress.compile_only.run import compile_matrix
    from xla_harness.stress.spec import StressSpec
    from xla_harness.targets import HOST

    small = dict(vocab=64, d_model=32, layers=1, heads=2, seq=8, batch=8, modes=("full",), remats=(True,))
    [frozen] = list(compile_matrix(StressSpec(protocol="frozen", **small), HOST))
    [train] = list(compile_matrix(StressSpec(protocol="train", **small), HOST))
    assert frozen.record["fingerprint"]["donate_argnums"] == [] and frozen.record["protocol"] == "frozen"
    assert train.record["fingerprint"]["donate_argnums"] == [0, 1]
    assert frozen.record["fingerprint"]["alias_size_in_bytes"] < train.record["fingerprint"]["alias_size_in_bytes"]


# ----------------------------------------------------------------------------- item 8: numbers


@pytest.mark.parametrize("argv,flag", [
    (["stress", "--checkpoint-seconds", "nan"], "--checkpoint-seconds"),
    (["stress", "--checkpoint-seconds", "inf"], "--checkpoint-seconds"),
    (["stress", "--checkpoint-seconds", "-1"], "--checkpoint-seconds"),
    (["stress", "--stop-grace", "nan"], "--stop-grace"), (["stress", "--stop-grace", "inf"], "--stop-grace"),
    (["stress", "--lr", "nan"], "--lr"), (["stress", "--lr", "1e400"], "--lr"), (["stress", "--lr", "0"], "--lr"),
    (["stress", "--steps", "0"], "--steps"), (["stress", "--seeds", "1,-2"], "--seeds"),
    (["stress", "--seeds", str(2**31)], "--seeds"), (["stress", "--process-id", "-1"], "--process-id"),
    (["bundle", "--check", "x.tar.gz", "--timeout", "nan"], "--timeout"),
    (["bundle", "--check", "x.tar.gz", "--timeout", "inf"], "--timeout"),
    (["bundle", "--check", "x.tar.gz", "--timeout", "0"], "--timeout"),
    (["bundle", "--check", "x.tar.gz", "--max-steps", "-1"], "--max-steps"),
    (["bundle", "--out", "o.tar.gz", "--seeds", "-1"], "--seeds"),
    (["compare", "a", "b", "--alpha", "nan"], "--alpha"), (["compare", "a", "b", "--alpha", "1"], "--alpha"),
    (["bisect-passes", "--inject-rate", "inf"], "--inject-rate"), (["bisect-passes", "--seed", "-1"], "--seed"),
    (["bisect-passes", "--baseline-steps", "0"], "--baseline-steps"),
])
def test_numeric_flags_are_checked_while_the_command_line_is_read(argv, flag, monkeypatch, capsys, tmp_path):
    """One line naming the flag, from the parser: the command itself never starts."""
    import importlib

    module = {"stress": "stress", "bundle": "bundle", "compare": "compare", "bisect-passes": "bisect_passes"}[argv[0]]
    monkeypatch.setattr(importlib.import_module(f"xla_harness.commands.{module}"), "run",
                        lambda args: pytest.fail("the command ran"))
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: xla-harness {argv[0]}: argument {flag}")


def test_a_spec_refuses_a_checkpoint_interval_that_is_no_number():
    from xla_harness.stress.spec import StressSpec

    for bad in (math.nan, math.inf, -1.0):
        with pytest.raises(HarnessError, match="checkpoint-seconds"):
            StressSpec(checkpoint_seconds=bad)
