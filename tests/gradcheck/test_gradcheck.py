"""gradcheck on the installed (stock) jax, and the patched-venv builder's failure path."""

import json
from pathlib import Path

import pytest

from xla_harness.cli import main
from xla_harness.errors import HarnessError
from xla_harness.gradcheck import check
from xla_harness.gradcheck.cases import REGISTRY, by_name
from xla_harness.upstream.patchfile import preimage_tree

ROOT = Path(__file__).resolve().parents[2]


def test_registry_covers_the_bug_classes():
    kinds = {c.kind for c in REGISTRY}
    assert kinds == {"where-guard", "select-jvp", "loop", "corpus"}
    assert len(REGISTRY) >= 50
    names = by_name()
    assert {"where_sqrt", "where_reciprocal", "where_log", "safe_distance_identical",
            "safe_l2_normalize", "fori_acc_div_x_n4", "while_acc_times_x_n3"} <= set(names)
    assert not names["while_acc_times_x_n3"].reverse


@pytest.mark.slow
def test_stock_jax_leaks_nan_through_where_guards_and_nothing_else(capsys):
    rc = main(["gradcheck", "--json"])
    data = json.loads(capsys.readouterr().out)
    assert rc == 1
    bad = {(v["case"], v["status"]) for v in data["verdicts"] if v["status"] in ("NaN", "WRONG")}
    guards = {c.name for c in REGISTRY if c.kind == "where-guard"}
    assert {case for case, _ in bad} == guards  # the bug is real, and only there
    assert {status for _, status in bad} == {"NaN"}
    det = {v["case"]: v["status"] for v in data["verdicts"] if v["kind"] == "determinism"}
    assert det == {"jit_step_twice": "OK", "random_key_reproducible": "OK", "scatter_add_duplicates": "OK"}


def test_loops_forward_only_and_second_order():
    verdicts = check.run(["fori_acc_times_x_n3", "while_acc_div_x_n3"])
    got = {(v.case, v.mode): v.status for v in verdicts}
    assert got[("fori_acc_times_x_n3", "grad2")] == "OK"
    assert got[("while_acc_div_x_n3", "jvp")] == "OK" and got[("while_acc_div_x_n3", "eager")] == "SKIP"


def test_checker_catches_a_wrong_rule():
    import jax
    import jax.numpy as jnp

    from xla_harness.gradcheck.cases import Case

    @jax.custom_jvp
    def bad_sin(x):
        return jnp.sin(x)

    bad_sin.defjvp(lambda p, t: (jnp.sin(p[0]), jnp.sin(p[0]) * t[0]))  # should be cos
    verdicts = check.check_case(Case("bad_sin", "corpus", lambda F, x: bad_sin(x), (0.3, 1.1), smooth=(True, True)))
    assert {v.status for v in verdicts if v.mode in check.MODES} == {"WRONG"}


@pytest.mark.parametrize("args,needle", [
    (["--cases", "nope"], "unknown gradcheck case 'nope'"),
    (["--modes", "eager,sideways"], "unknown mode 'sideways'"),
    (["--masking"], "no jax_zero_cotangent_masking flag"),
])
def test_bad_input(capsys, args, needle):
    assert main(["gradcheck", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and needle in err[0]


def test_list(capsys):
    assert main(["gradcheck", "--list"]) == 0
    assert "where_log" in capsys.readouterr().out


@pytest.mark.slow
def test_patched_venv_refuses_a_patch_that_does_not_apply(tmp_path, capsys):
    from xla_harness.upstream import jaxvenv

    sdist = tmp_path / "jax-0.12.0.1"
    preimage_tree((ROOT / "patches/jax/0001-zero-cotangent-masking.patch").read_text(), sdist)
    (sdist / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: jax\nVersion: 0.12.0.1\n")
    config = sdist / "jax/_src/config.py"
    config.write_text(config.read_text().replace("debug_infs = bool_state(", "# changed"))
    venv = tmp_path / ".venv-jax-patched"
    assert jaxvenv.main(["--sdist", str(sdist), "--venv", str(venv)]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("error: jax/0001-zero-cotangent-masking.patch: hunk #")
    assert "jax/_src/config.py" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["jax-0.12.0.1"]  # no half-built venv


@pytest.mark.slow
def test_patched_source_applies_a_patch_that_creates_files(tmp_path, capsys):
    from xla_harness.upstream import jaxvenv

    sdist = tmp_path / "jax-0.12.0.1"
    preimage_tree((ROOT / "patches/jax/0001-zero-cotangent-masking.patch").read_text(), sdist)
    new_module = "jax/_src/lax/zero_cotangent_masking.py"
    assert not (sdist / new_module).exists()  # the patch creates it: the sdist need not ship it
    applied = jaxvenv.patched_source(sdist, tmp_path / "src")
    assert applied == ["jax/0001-zero-cotangent-masking.patch"]
    assert "masked_scale_p" in (tmp_path / "src" / new_module).read_text()
    assert "0002-tests-zero-cotangent-masking.patch not applied" in capsys.readouterr().err


@pytest.mark.slow
def test_patched_source_refuses_a_tree_no_patch_applies_to(tmp_path):
    from xla_harness.upstream import jaxvenv

    (tmp_path / "empty").mkdir()
    with pytest.raises(HarnessError, match="no patch of the jax series"):
        jaxvenv.patched_source(tmp_path / "empty", tmp_path / "src")
    assert not (tmp_path / "src").exists()


def test_cross_framework_table_without_tf_or_mlx(capsys):
    """In a venv without TensorFlow and MLX: one 'not installed' column each, jax still runs."""
    from xla_harness.gradcheck.frameworks import mlx_adapter, tf_adapter

    if not tf_adapter.available() or not mlx_adapter.available():
        pytest.skip("tf or mlx is installed here; tests/frameworks covers that venv")
    rc = main(["gradcheck", "--framework", "jax,tf,mlx", "--cases", "where_sqrt,fori_acc_times_x_n2"])
    out = capsys.readouterr().out.splitlines()
    assert rc == 1  # jax leaks NaN through the where-guard
    assert out[0].split() == ["case", "jax:eager", "jax:jit", "jax:vjp", "jax:jvp", "tf", "mlx", "modes", "disagree"]
    rows = {line.split()[0]: line for line in out[2:-2]}
    assert rows["where_sqrt"].split()[1:5] == ["NaN", "NaN", "NaN", "OK"]
    assert "not installed" in rows["fori_acc_times_x_n2"] and "jax: eager!=jvp" in rows["where_sqrt"]
    assert "tf not installed: cannot import tensorflow" in out[-1]


def test_unknown_framework(capsys):
    assert main(["gradcheck", "--framework", "jax,torch"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: unknown framework 'torch'; expected one of jax, tf, mlx"]
