"""Repro bundles: round trip with --check, tamper detection, missing dump files, env filter."""

import json
import tarfile
from pathlib import Path

import pytest

from xla_harness.cli import main

from ..helpers import TINY_ARGS

ROOT = Path(__file__).resolve().parents[2]


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


@pytest.mark.slow
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
    # The built-in's repro.py is the harness's standalone module (jax and numpy only), no program/.
    assert repro == (ROOT / "xla_harness/repro/standalone.py").read_text()
    assert "import xla_harness" not in repro and "from xla_harness" not in repro
    assert not any(n.startswith("bundle/program/") for n in names)
    config = json.loads(_read(bundle, "config.json"))
    assert config["program"] == "tied-embedding" and config["model"]["mode"] == "full"
    findings = json.loads(_read(bundle, "findings.json"))
    assert findings["modules"][0]["module"] == "jit_step"


def _rewrite(bundle, dst_path, edit, extra=()):
    """Copy a bundle, passing each member's bytes through edit(name, data) -> data; add extra members."""
    import io

    with tarfile.open(bundle) as src, tarfile.open(dst_path, "w:gz") as dst:
        for m in src.getmembers():
            data = src.extractfile(m).read() if m.isfile() else None
            if data is not None:
                data = edit(m.name, data)
                m.size = len(data)
            dst.addfile(m, io.BytesIO(data) if data is not None else None)
        for info, data in extra:
            dst.addfile(info, io.BytesIO(data) if data is not None else None)
    return dst_path


@pytest.mark.slow
def test_check_round_trip(bundle, capsys):
    assert main(["bundle", "--check", str(bundle)]) == 0
    out = capsys.readouterr().out
    assert out.count("-> same") == 2
    assert "sha256 all match" in out and "repro.py: same as this harness's copy" in out
    assert "findings.json: same as" in out and "stress/table.txt: same as" in out


def _set_nonfinite(name, data):
    if name != "bundle/expected.json":
        return data
    exp = json.loads(data)
    exp["seeds"]["1"]["nonfinite"] = 3
    return json.dumps(exp).encode()


def _append(target, text):
    return lambda name, data: data + text if name.endswith(target) else data


@pytest.mark.parametrize("edit,expect", [
    (_set_nonfinite, "bundle/expected.json changed"),
    (_append("findings.json", b" "), "findings.json changed"),
    (_append("stress.jsonl", b"\n"), "stress/stress.jsonl changed"),
    (_append("env.json", b" "), "env.json changed"),
    (_append("after_optimizations.txt", b"\n"), "after_optimizations.txt changed"),
])
@pytest.mark.slow
def test_check_reports_tampering_of_any_file(bundle, tmp_path, capsys, edit, expect):
    tampered = _rewrite(bundle, tmp_path / "t.tar.gz", edit)
    assert main(["bundle", "--check", str(tampered)]) == 1
    out = capsys.readouterr().out
    assert expect.replace("bundle/", "") in out


@pytest.mark.slow
def test_check_recomputes_findings_and_counts_even_with_a_rewritten_manifest(bundle, tmp_path, capsys):
    # Whoever edits findings and expected.json can rewrite the manifest too: the recomputation and
    # the re-run still catch it.
    import hashlib

    def edit(name, data):
        if name.endswith("findings.json"):
            data = json.dumps({"modules": []}).encode()
        data = _set_nonfinite(name, data)
        return data

    def fix_manifest(name, data):
        if name != "bundle/manifest.json":
            return edit(name, data)
        table = json.loads(data)["sha256"]
        with tarfile.open(bundle) as src:
            for n in ("findings.json", "expected.json"):
                new = edit(f"bundle/{n}", src.extractfile(f"bundle/{n}").read())
                table[n] = hashlib.sha256(new).hexdigest()
        return json.dumps({"sha256": table}).encode()

    tampered = _rewrite(bundle, tmp_path / "t.tar.gz", fix_manifest)
    assert main(["bundle", "--check", str(tampered)]) == 1
    out = capsys.readouterr().out
    assert "sha256 all match" in out
    assert "findings.json: DIFFERENT" in out and "seed 1: non-finite 0 (bundle: 3)" in out


@pytest.mark.slow
def test_check_never_runs_the_archives_repro(bundle, tmp_path, capsys):
    marker = tmp_path / "ran"
    evil = f"open({str(marker)!r}, 'w').write('x')\n".encode()
    tampered = _rewrite(bundle, tmp_path / "t.tar.gz",
                        lambda name, data: evil if name == "bundle/repro.py" else data)
    assert main(["bundle", "--check", str(tampered)]) == 1
    out = capsys.readouterr().out
    assert "repro.py: DIFFERENT from this harness's copy" in out
    assert "-> same" in out  # the harness's own copy ran and matched
    assert not marker.exists()


def _member(name, size=0, kind=tarfile.REGTYPE, linkname=""):
    info = tarfile.TarInfo(name)
    info.size, info.type, info.linkname = size, kind, linkname
    return info


@pytest.mark.parametrize("extra,expect", [
    ([(_member("bundle/link", kind=tarfile.SYMTYPE, linkname="/etc/passwd"), None)], "not a regular file"),
    ([(_member("outside.txt", 1), b"x")], "outside bundle/"),
    ([(_member("bundle/../../x", 1), b"x")], "outside bundle/"),
    ([(_member("bundle/fifo", kind=tarfile.FIFOTYPE), None)], "not a regular file"),
])
def test_check_refuses_unsafe_members(bundle, tmp_path, capsys, extra, expect):
    bad = _rewrite(bundle, tmp_path / "t.tar.gz", lambda name, data: data, extra)
    assert main(["bundle", "--check", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and expect in err


def test_check_refuses_a_decompression_bomb_before_writing_it(tmp_path, capsys):
    import io

    bomb = tmp_path / "bomb.tar.gz"
    size = 64 << 20  # 64 MiB of zeros compresses to ~64 KiB; the cap below is 1 MiB
    with tarfile.open(bomb, "w:gz") as tf:
        tf.addfile(_member("bundle/zeros", size), io.BytesIO(bytes(size)))
    assert bomb.stat().st_size < 1 << 20
    from xla_harness.errors import HarnessError
    from xla_harness.repro import bundle_check

    dest = tmp_path / "x"
    dest.mkdir()
    with pytest.raises(HarnessError, match="more than 1048576 bytes"):
        bundle_check.safe_extract(bomb, dest, max_bytes=1 << 20)
    assert not (dest / "bundle" / "zeros").exists()


@pytest.mark.slow
def test_repro_timeout_kills_the_whole_process_group(tmp_path):
    import os
    import time

    from xla_harness.errors import HarnessError
    from xla_harness.repro import bundle as bundle_mod

    pidfile = tmp_path / "child.pid"
    script = tmp_path / "slow.py"
    script.write_text(
        "import subprocess, sys, time\n"
        f"p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        f"open({str(pidfile)!r}, 'w').write(str(p.pid))\n"
        "time.sleep(60)\n")
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(HarnessError, match="did not finish in 2 s"):
        bundle_mod.run_repro(script, tmp_path / "config.json", timeout=2)
    child = int(pidfile.read_text())
    for _ in range(50):  # the grandchild was killed with the group (reaped by init)
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        with open(f"/proc/{child}/stat") as f:
            if f.read().split()[2] == "Z":
                break
        time.sleep(0.1)
    else:
        raise AssertionError("the repro's child survived the timeout")


def test_standalone_repro_is_the_harness_module():
    from xla_harness.repro import bundle as bundle_mod
    from xla_harness.repro import standalone

    assert __import__("pathlib").Path(standalone.__file__) == bundle_mod.STANDALONE
    src = bundle_mod.STANDALONE.read_text()
    assert "import xla_harness" not in src and "optax" not in src


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


@pytest.mark.slow
def test_bundle_of_the_35409_preset_runs_from_its_own_program_folder(tmp_path, capsys):
    """A built-in other than tied-embedding is bundled as a program: every module of
    xla_harness/programs it may import (the preset imports variants) travels with it."""
    out = tmp_path / "b.tar.gz"
    options = ["--program-option", "scale=0.015625", "--program-option", "seq_scale=0.125",
               "--program-option", "layers=(1, 2)"]
    assert main(["bundle", "--program", "issue-35409", *options, "--steps", "2", "--out", str(out)]) == 0
    with tarfile.open(out) as tf:
        assert "bundle/program/xla_harness/programs/variants.py" in tf.getnames()
    capsys.readouterr()
    assert main(["bundle", "--check", str(out), "--run-program"]) == 0
    assert "-> same" in capsys.readouterr().out
