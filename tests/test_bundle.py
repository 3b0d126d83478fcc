"""Repro bundles: round trip with --check, tamper detection, missing dump files, env filter."""

import json
import tarfile

import pytest

from harness.cli import main

from .helpers import TINY_ARGS


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    import os

    out = tmp_path_factory.mktemp("b") / "repro.tar.gz"
    os.environ["MY_PRIVATE_TOKEN"] = "do-not-ship"
    try:
        assert main(["bundle", "--out", str(out), "--steps", "4", "--seeds", "1,2", *TINY_ARGS]) == 0
    finally:
        del os.environ["MY_PRIVATE_TOKEN"]
    return out


def _read(bundle, name):
    with tarfile.open(bundle) as tf:
        return tf.extractfile(f"bundle/{name}").read().decode()


def test_bundle_contents(bundle):
    with tarfile.open(bundle) as tf:
        names = set(tf.getnames())
    assert {"bundle/repro.py", "bundle/config.json", "bundle/env.json", "bundle/expected.json",
            "bundle/findings.json", "bundle/stress/stress.jsonl", "bundle/stress/table.txt"} <= names
    assert any(n.endswith("after_optimizations-buffer-assignment.txt") for n in names)
    env = json.loads(_read(bundle, "env.json"))
    assert "MY_PRIVATE_TOKEN" not in env["env"] and all(k.startswith(("XLA_", "LIBTPU_", "JAX_", "TPU_"))
                                                       for k in env["env"])
    assert env["devices"] and env["jax"]
    repro = _read(bundle, "repro.py")
    # repro.py imports the bundled program (its source and the interface), not an installed harness.
    assert "from harness.programs.interface import load_program" in repro
    with tarfile.open(bundle) as tf:
        assert "bundle/program/harness/programs/tied_embedding.py" in tf.getnames()
    assert json.loads(_read(bundle, "config.json"))["program"] == "tied-embedding"
    findings = json.loads(_read(bundle, "findings.json"))
    assert findings["modules"][0]["module"] == "jit_step"


def test_check_round_trip_and_tampering(bundle, tmp_path, capsys):
    assert main(["bundle", "--check", str(bundle)]) == 0
    assert capsys.readouterr().out.count("-> same") == 2
    # A bundle whose recorded result differs from what repro.py gives is reported.
    tampered = tmp_path / "t.tar.gz"
    with tarfile.open(bundle) as src, tarfile.open(tampered, "w:gz") as dst:
        for m in src.getmembers():
            data = src.extractfile(m).read() if m.isfile() else None
            if m.name == "bundle/expected.json":
                exp = json.loads(data)
                exp["seeds"]["1"]["nonfinite"] = 3
                data = json.dumps(exp).encode()
                m.size = len(data)
            import io

            dst.addfile(m, io.BytesIO(data) if data is not None else None)
    assert main(["bundle", "--check", str(tampered)]) == 1
    assert "DIFFERENT" in capsys.readouterr().out


def test_missing_dump_file_is_named(tmp_path, capsys):
    dump = tmp_path / "dump"
    dump.mkdir()
    (dump / "module_0001.jit_step.cpu_after_optimizations.txt").write_text("HloModule x\n")
    rc = main(["bundle", "--out", str(tmp_path / "x.tar.gz"), "--dump", str(dump), "--steps", "1", *TINY_ARGS])
    assert rc == 2
    err = capsys.readouterr().err
    assert "missing module_0001.jit_step.cpu_after_optimizations-buffer-assignment.txt" in err
    assert not (tmp_path / "x.tar.gz").exists()
    assert main(["bundle", "--check", str(tmp_path / "nope.tar.gz")]) == 2
