"""#34 item 7: the start of a command.

A flag the compiler does not know in XLA_FLAGS or LIBTPU_INIT_ARGS ended the process from C++ with
exit 1, the code for "a problem was found"; JAX_PLATFORMS=bogus was ``error: internal:``. Now one
``error:`` line naming the variable and the flag, exit 2, before jax starts here
(xla_harness/targets/envcheck.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ..bad_input_cases import Case, run_process

ROOT = Path(__file__).resolve().parents[2]


STRESS = ["stress", "--quiet", "--out", "{tmp}/o", "--modes", "full", "--remat", "on", "--seeds", "1", "--steps", "2",
          "--vocab", "64", "--d-model", "32", "--layers", "1", "--heads", "2", "--seq", "8", "--batch", "8"]


# ----------------------------------------------------------------------------- item 7


@pytest.mark.slow
@pytest.mark.parametrize("env,says", [
    ({"XLA_FLAGS": "--xla_bogus_flag=1"}, "error: XLA_FLAGS: XLA does not know the flag --xla_bogus_flag=1"),
    ({"XLA_FLAGS": "--xla_cpu_enable_fast_math=false --xla_typo=2"}, "XLA does not know the flag --xla_typo=2"),
    ({"JAX_PLATFORMS": "bogus"}, "error: JAX_PLATFORMS=bogus: jax cannot start that backend"),
], ids=["xla-flags", "one-of-two", "jax-platforms"])
@pytest.mark.parametrize("argv", [STRESS, ["scan", "--model", "--vocab", "64", "--d-model", "32"]],
                         ids=["stress", "scan"])
def test_a_compiler_setting_it_refuses_is_one_error_line(argv, env, says, tmp_path):
    case = Case("env", argv, entry="process", env=env)
    code, _, _, err, _ = run_process(case, tmp_path, ROOT, 300)
    assert code == 2 and says in err.strip().splitlines()[-1], err
    assert err.count("error:") == 1 and "Traceback" not in err
    assert not (tmp_path / "o").exists()


@pytest.mark.slow
def test_a_libtpu_flag_it_refuses_is_one_error_line(tmp_path):
    from xla_harness.targets import parse_target
    from xla_harness.targets.devices import missing

    if missing(parse_target("tpu:v6e:2x4")):
        pytest.skip(missing(parse_target("tpu:v6e:2x4")))
    case = Case("env", ["scan", "--model", "--target", "tpu:v6e:2x4", "--vocab", "64", "--d-model", "32"],
                entry="process", env={"LIBTPU_INIT_ARGS": "--xla_tpu_bogus_flag=1"})
    code, _, _, err, _ = run_process(case, tmp_path, ROOT, 300)
    assert code == 2 and err.strip().splitlines() == [
        "error: LIBTPU_INIT_ARGS: libtpu does not know the flag --xla_tpu_bogus_flag (it refuses to start with it); "
        "correct or remove it"], err


def test_what_the_compiler_died_of_is_said_in_one_line():
    from xla_harness.targets.envcheck import explain

    given = {"XLA_FLAGS": "--xla_dump_to=/d --xla_bogus=1", "LIBTPU_INIT_ARGS": "--xla_tpu_x=2", "JAX_PLATFORMS": ""}
    assert explain("F1127 parse_flags_from_env.cc:234] Unknown flag in XLA_FLAGS: --xla_bogus=1\n", 1, given) == \
        "XLA_FLAGS: XLA does not know the flag --xla_bogus=1 (it refuses to start with it); correct or remove it"
    assert explain("ERROR: Unknown command line flag 'xla_tpu_x'\n", 1, given).startswith(
        "LIBTPU_INIT_ARGS: libtpu does not know the flag --xla_tpu_x")
    assert explain("ERROR: Unknown command line flag 'xla_bogus'\n", 1, given).startswith("XLA_FLAGS: libtpu")
    assert explain("Fatal: something else\n", -6, given) == \
        ("the compiler did not start with XLA_FLAGS=--xla_dump_to=/d --xla_bogus=1, LIBTPU_INIT_ARGS=--xla_tpu_x=2: "
         "Fatal: something else")


def test_only_settings_the_compiler_could_refuse_are_tried():
    """The harness's own additions (the CPU split, autotune results) and JAX_PLATFORMS=cpu start no child."""
    from xla_harness.targets.envcheck import needs_trying

    assert not needs_trying({"XLA_FLAGS": "", "LIBTPU_INIT_ARGS": "", "JAX_PLATFORMS": ""})
    assert not needs_trying({"XLA_FLAGS": "--xla_force_host_platform_device_count=8", "JAX_PLATFORMS": "cpu"})
    assert needs_trying({"XLA_FLAGS": "--xla_force_host_platform_device_count=x"})
    assert needs_trying({"XLA_FLAGS": "--xla_dump_to=/tmp/d"})
    assert needs_trying({"LIBTPU_INIT_ARGS": "--xla_tpu_x=1"})
    assert needs_trying({"JAX_PLATFORMS": "cuda"})
