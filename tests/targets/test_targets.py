"""Compile targets: --target parsing, the GPU descriptions, and ahead-of-time compiles for TPU
(libtpu) and GPU (the CUDA plugin) on this CPU-only machine. The compile tests need the targets
extra (make setup-targets) and skip, naming it, without it; CI installs it."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import jax
import pytest

from xla_harness.cli import main
from xla_harness.errors import HarnessError
from xla_harness.targets import HOST, Target, parse_target
from xla_harness.targets.devices import accelerator_type, compilers_dir, missing
from xla_harness.targets.gpu import GPU_KINDS, target_config

from ..helpers import FOREIGN_PROGRAM, TINY_ARGS

V6E = Target("tpu", "v6e", "2x4")
H100 = Target("cuda", "h100", "1x1x8")
needs_libtpu = pytest.mark.skipif(missing(V6E) is not None, reason=str(missing(V6E)))
needs_cuda_plugin = pytest.mark.skipif(missing(H100) is not None, reason=str(missing(H100)))
TINY_PRESET = ["--program", "issue-35409", "--program-option", "scale=0.015625",
               "--program-option", "seq_scale=0.125", "--program-option", "layers=(1,2)"]


# ----------------------------------------------------------------------------- parsing (pure)


@pytest.mark.parametrize("text,want", [
    ("host", HOST),
    ("tpu:v6e:2x4", Target("tpu", "v6e", "2x4")),
    ("TPU:v5e:2x2", Target("tpu", "v5e", "2x2")),
    ("tpu:v4:2x2x1", Target("tpu", "v4", "2x2x1")),
    ("tpu:v5p:2x2x2", Target("tpu", "v5p", "2x2x2")),
    ("cuda:h100", Target("cuda", "h100", "1x1x8")),
    ("cuda:a100:1x1x4", Target("cuda", "a100", "1x1x4")),
    ("cuda:h200:1x1x1", Target("cuda", "h200", "1x1x1")),
])
def test_parse_target(text, want):
    got = parse_target(text)
    assert got == want
    assert parse_target(got.text) == got  # the recorded spelling reads back


@pytest.mark.parametrize("text,says", [
    ("tpu", "unknown TPU generation ''"),
    ("tpu:v9:2x4", "unknown TPU generation 'v9'"),
    ("tpu:v6e", "2-dimensional chip shape"),
    ("tpu:v6e:2x2x2", "2-dimensional chip shape"),
    ("tpu:v4:2x4", "3-dimensional chip shape"),
    ("tpu:v6e:0x4", "2-dimensional chip shape"),
    ("cuda:v100", "unknown GPU kind 'v100'"),
    ("cuda:h100:8", "SLICESxHOSTSxDEVICES"),
    ("cuda:h200:", "an empty GPU topology"),
    ("cuda:h200:1x1x100000", "at most 16 a host"),
    ("cuda:h200:4096x64x8", "8,192 in all"),
    ("gpu:h100", "expected host, tpu:GEN:SHAPE"),
    ("", "expected host"),
])
def test_parse_target_refuses(text, says):
    with pytest.raises(HarnessError, match=re.escape(says)):
        parse_target(text)


def test_bad_target_is_one_error_line(capsys):
    assert main(["scan", "--model", "--target", "tpu:v9:2x4"]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "unknown TPU generation 'v9'" in err


def test_accelerator_type_counts_cores_where_cloud_tpu_does():
    assert accelerator_type(Target("tpu", "v6e", "2x4")) == "v6e-8"
    assert accelerator_type(Target("tpu", "v5e", "2x2")) == "v5litepod-4"
    assert accelerator_type(Target("tpu", "v4", "2x2x1")) == "v4-8"
    assert accelerator_type(Target("tpu", "v5p", "2x2x2")) == "v5p-16"


def test_missing_names_what_to_install(monkeypatch):
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    assert "xla-harness[tpu]" in missing(V6E)
    assert "xla-harness[cuda]" in missing(H100)
    assert missing(HOST) is None


@pytest.mark.parametrize("target,skips_cuda_check", [(H100, True), (V6E, True), (HOST, False)])
def test_prepare_environment_lets_the_cuda_plugin_load_without_nvidia_libraries(monkeypatch, target,
                                                                                 skips_cuda_check):
    # jax 0.9's plugin checks the CUDA runtime at load unless told not to, and then registers no cuda
    # platform on a machine without NVIDIA's libraries; a user's own setting stands. For a tpu: target
    # too: jax loads every plugin in the compilers' folder, the CUDA plugin with libtpu.
    import os

    from xla_harness.targets.devices import prepare_environment

    env: dict[str, str] = {}
    monkeypatch.setattr(os, "environ", env)  # an empty environment, restored after the test
    prepare_environment(target)
    assert (env.get("JAX_SKIP_CUDA_CONSTRAINTS_CHECK") == "1") is skips_cuda_check
    assert env.get("JAX_PLATFORMS") == (None if target is HOST else "cpu")
    env["JAX_SKIP_CUDA_CONSTRAINTS_CHECK"] = ""
    prepare_environment(target)
    assert env["JAX_SKIP_CUDA_CONSTRAINTS_CHECK"] == ""


# ----------------------------------------------------------------------------- where the compilers live


def _plain_env() -> dict:
    """The environment of a user's own command in the venv: none of this suite's jax settings."""
    import os

    return {k: v for k, v in os.environ.items()
            if k not in ("JAX_PLATFORMS", "XLA_FLAGS", "PYTHONPATH", "JAX_SKIP_CUDA_CONSTRAINTS_CHECK")
            and not k.startswith("TPU_") and k != "ALLOW_MULTIPLE_LIBTPU_LOAD"}


IMPORT_JAX = "import jax; print(jax.devices())"


@pytest.mark.slow
def test_import_jax_in_the_venv_prints_the_devices_and_nothing_else():
    """After make setup-targets a plain `import jax` in the venv is what it was before: the device list
    on stdout, nothing on stderr (the compilers are in a folder only the harness adds)."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", IMPORT_JAX], capture_output=True, text=True, timeout=300,
                          env=_plain_env())
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("[CpuDevice(id=0)") and done.stdout.count("\n") == 1
    assert done.stderr == ""


@pytest.mark.slow
@pytest.mark.skipif(compilers_dir() is None, reason="no target compilers folder (make setup-targets)")
def test_the_compilers_on_the_path_are_what_made_import_jax_noisy():
    """The planted case: the same command with the compilers' folder on the path prints what a venv
    with them in site-packages printed (the CUDA plugin's cuDNN traceback, libtpu's warnings): the
    check above would see it."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", IMPORT_JAX], capture_output=True, text=True, timeout=300,
                          env={**_plain_env(), "PYTHONPATH": str(compilers_dir())})
    assert done.stderr != ""
    assert "cuDNN" in done.stderr or "TPU" in done.stderr


TPU_TARGET_IMPORT = ("from xla_harness.targets import parse_target\n"
                     "from xla_harness.targets.devices import prepare_environment\n"
                     "prepare_environment(parse_target('tpu:v6e:2x4'))\n"
                     "import jax; print(jax.devices())\n")


def _tpu_target_start(**env: str) -> subprocess.CompletedProcess:
    import sys

    return subprocess.run([sys.executable, "-c", TPU_TARGET_IMPORT], capture_output=True, text=True,
                          timeout=300, env={**_plain_env(), **env,
                                            "PYTHONPATH": str(Path(__file__).resolve().parents[2])})


@pytest.mark.slow
@pytest.mark.skipif(compilers_dir() is None, reason="no target compilers folder (make setup-targets)")
def test_a_tpu_target_starts_jax_without_the_cuda_plugins_traceback():
    """The CUDA plugin shares libtpu's folder and jax loads it for a tpu: target too; jax 0.9's plugin
    then checked a CUDA runtime this machine does not have and printed "Unable to load CUDA" with a
    traceback during every TPU compile."""
    done = _tpu_target_start()
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and "Unable to load CUDA" not in done.stderr


@pytest.mark.slow
@pytest.mark.skipif(compilers_dir() is None, reason="no target compilers folder (make setup-targets)")
@pytest.mark.skipif(tuple(int(p) for p in jax.__version__.split(".")[:2]) >= (0, 10),
                    reason="this jax's CUDA plugin checks no runtime when JAX_PLATFORMS leaves CUDA out")
def test_the_cuda_check_left_on_prints_the_traceback_the_check_above_would_see():
    # The planted case: a user's own empty setting stands, and jax 0.9's plugin checks the runtime.
    done = _tpu_target_start(JAX_SKIP_CUDA_CONSTRAINTS_CHECK="")
    assert "Unable to load CUDA" in done.stderr


def test_the_harness_adds_the_compilers_folder_once_and_last(tmp_path, monkeypatch):
    import sys

    from xla_harness.targets import devices

    monkeypatch.setattr(sys, "path", ["a", "b"])
    monkeypatch.setenv(devices.COMPILERS_ENV, str(tmp_path / "none"))
    assert devices.compilers_dir() is None
    devices.use_target_compilers()
    assert sys.path == ["a", "b"]
    monkeypatch.setenv(devices.COMPILERS_ENV, str(tmp_path))
    assert devices.compilers_dir() == tmp_path
    devices.use_target_compilers()
    devices.use_target_compilers()
    assert sys.path == ["a", "b", str(tmp_path)]
    monkeypatch.delenv(devices.COMPILERS_ENV)
    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    assert devices.compilers_dir() is None  # no <venv>/xla-harness-targets
    (tmp_path / devices.COMPILERS_DIR).mkdir()
    assert devices.compilers_dir() == tmp_path / devices.COMPILERS_DIR


@pytest.mark.slow
@needs_cuda_plugin
def test_a_cuda_target_after_jax_started_without_the_compilers():
    """A library user who ran jax before asking for a cuda: target still gets its devices: jax looked for
    plugins once, without the folder, and the harness registers the CUDA plugin then."""
    import subprocess
    import sys

    code = ("import jax; jax.devices()\n"
            "from xla_harness.targets import parse_target\n"
            "from xla_harness.targets.devices import prepare_environment, target_devices\n"
            "t = parse_target('cuda:h100:1x1x1'); prepare_environment(t)\n"
            "print(target_devices(t)[0].device_kind)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**_plain_env(), "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "NVIDIA H100 80GB HBM3"


def test_gpu_target_config_holds_each_kind():
    h100 = target_config(GPU_KINDS["h100"])
    assert "cuda_compute_capability { major: 9 minor: 0 }" in h100
    assert "core_count: 132\n" in h100 and "shared_memory_per_core: 233472\n" in h100
    assert 'device_description_str: "NVIDIA H100 80GB HBM3"' in h100
    h200 = target_config(GPU_KINDS["h200"])
    # what the H200 of results/gpu/ reported (143771 MiB) and its datasheet's L2, bandwidth and SMs
    assert "device_memory_size: 150754820096\n" in h200 and "l2_cache_size: 62914560\n" in h200
    assert "memory_bandwidth: 4800000000000\n" in h200 and "core_count: 132\n" in h200
    assert "major: 9 minor: 0" in h200 and 'device_description_str: "NVIDIA H200"' in h200
    a100 = target_config(GPU_KINDS["a100"])
    assert "major: 8 minor: 0" in a100 and "core_count: 108\n" in a100
    assert h100 != a100


def test_target_without_compile_only_refused(capsys):
    assert main(["stress", "--target", "tpu:v6e:2x4", *TINY_ARGS]) == 2
    assert "add --compile-only" in capsys.readouterr().err


@pytest.mark.parametrize("flag", [["--plot", "x.png"], ["--reference"], ["--inject-rate", "0.5"],
                                  ["--fail-on-nonfinite"]])
def test_compile_only_refuses_flags_that_run_steps(flag, capsys):
    assert main(["stress", "--compile-only", *flag, *TINY_ARGS]) == 2
    assert "--compile-only runs none" in capsys.readouterr().err


def test_scan_target_needs_model(tmp_path, capsys):
    f = tmp_path / "m.hlo"
    f.write_text("HloModule m\n\nENTRY e {\n  ROOT c = f32[] constant(0)\n}\n")
    assert main(["scan", str(f), "--target", "tpu:v6e:2x4"]) == 2
    assert "--target needs --model" in capsys.readouterr().err


# ----------------------------------------------------------------------------- compiles


@pytest.mark.slow
def test_host_compile_only_matches_the_run_fingerprint(tmp_path, capsys):
    """--compile-only on the host compiles from abstract state; the fingerprint equals the one a real
    stress run prints for the same configuration (same program, same compiler)."""
    common = ["--modes", "full", "--remat", "on", "--seeds", "1", *TINY_ARGS]
    assert main(["stress", "--compile-only", *common, "--quiet"]) == 0
    compiled = re.search(r"step fingerprint (\w+)", capsys.readouterr().out).group(1)
    assert main(["stress", "--steps", "1", "--out", str(tmp_path / "run"), "--quiet", *common]) == 0
    ran = re.search(r"step fingerprint [^:]+: (\w+)", capsys.readouterr().out).group(1)
    assert compiled == ran


@pytest.mark.slow
@needs_libtpu
def test_scan_model_for_tpu(tmp_path, capsys):
    hlo = tmp_path / "tpu.hlo"
    assert main(["scan", "--model", "--target", "tpu:v6e:2x4", "--json", "--save-hlo", str(hlo),
                 *TINY_ARGS]) == 0
    [module] = json.loads(capsys.readouterr().out)["modules"]
    assert module["backend"] == "tpu"
    text = hlo.read_text()
    # What only libtpu prints: tiled layouts and its own aliasing decision per fusion.
    assert ":T(8,128)" in text and '"aliasing_operands"' in text
    assert "scatter" in text
    # libtpu's memory plan checked (its buffer assignment and live range): no conflict, and ours
    # agrees with its live range
    plan = module["memory_plan"]
    assert plan["conflicts"] == [] and plan["async_windows"] > 0 and plan["live_range_compared"] > 0
    assert plan["live_range_disagreements"] == []


@pytest.mark.slow
@needs_libtpu
def test_compile_only_preset_variants_for_tpu(tmp_path, capsys):
    out = tmp_path / "aot"
    args = ["stress", *TINY_PRESET, "--compile-only", "--target", "tpu:v6e:2x4",
            "--variants", "baseline,barrier,onehot,sumgrad", "--out", str(out), "--quiet"]
    assert main(args) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if "step fingerprint" in ln]
    assert len(lines) == 4
    assert all("on tpu:v6e:2x4 (8x TPU v6 lite)" in ln for ln in lines)
    ids = {re.search(r"step fingerprint (\w+)", ln).group(1) for ln in lines}
    assert len(ids) == 4  # four different programs
    records = [json.loads(ln) for ln in (out / "compile.jsonl").read_text().splitlines()]
    assert [r["options"]["variant"] for r in records] == ["baseline", "barrier", "onehot", "sumgrad"]
    assert all(r["versions"]["libtpu"] != "not installed" and r["devices"] == 8 for r in records)
    # libtpu's own aliasing decision is read from every record's HLO (backend_config).
    assert all(r["scan"]["compiler_alias"]["instructions_with_field"] > 0 for r in records)
    assert "compiler aliased" in lines[0]
    for r in records:
        hlo = out / r["hlo"]
        assert hlo.read_text().startswith("HloModule")
        assert hlo.with_name(hlo.name.replace(".txt", "-buffer-assignment.txt")).is_file()
    # --resume compiles nothing already recorded; without it the results are never overwritten.
    assert main(args + ["--resume"]) == 0
    assert "already recorded" in capsys.readouterr().out
    assert main(args) == 2
    assert "pass --resume" in capsys.readouterr().err


@pytest.mark.slow
@needs_libtpu
def test_tpu_no_fusion_flag_set_reaches_libtpu():
    """tpu-no-fusion disables libtpu's fusion pass through compile options: fewer fusions than the
    baseline on the same target (a flag libtpu ignored would change nothing)."""
    from xla_harness.stress.compile_only.run import compile_program

    opts = {"vocab": 64, "d_model": 32, "layers": 1, "heads": 2, "seq": 8, "batch": 8, "devices": 1}
    base = compile_program("tied-embedding", opts, V6E).hlo_text
    off = compile_program("tied-embedding", {**opts, "variant": "tpu-no-fusion"}, V6E).hlo_text
    assert base.count(" fusion(") > off.count(" fusion(")
    with pytest.raises(HarnessError, match="is for tpu, but the step compiles for gpu"):
        compile_program("tied-embedding", {**opts, "variant": "tpu-no-fusion"}, H100)


@pytest.mark.slow
@needs_libtpu
def test_program_that_ignores_target_devices_is_refused(tmp_path):
    """A program whose init pins its state to this machine's CPU cannot be compiled for a TPU: one
    clear error, not a CPU compile reported as the TPU's."""
    from xla_harness.stress.compile_only.run import compile_program

    f = tmp_path / "pinned.py"
    f.write_text(FOREIGN_PROGRAM + '''

def pinned(devices=None):
    p = make()
    cpu = jax.devices("cpu")[0]
    return p.__class__(name="pinned", init=jax.jit(p.init, out_shardings=jax.sharding.SingleDeviceSharding(cpu)),
                       batch=p.batch, step=p.step)
''')
    with pytest.raises(HarnessError, match="placed on cpu devices, not on the target's tpu devices"):
        compile_program(f"{f}:pinned", {}, V6E)
    # The same program without the pin compiles for the TPU on one chip.
    step = compile_program(f"{f}:make", {}, V6E)
    assert step.device_kind == "TPU v6 lite" and ":T(" in step.hlo_text


@pytest.mark.slow
@needs_cuda_plugin
def test_scan_model_for_cuda(tmp_path, capsys):
    hlo = tmp_path / "gpu.hlo"
    assert main(["scan", "--model", "--target", "cuda:h100:1x1x2", "--devices", "2", "--json",
                 "--save-hlo", str(hlo), *TINY_ARGS]) == 0
    [module] = json.loads(capsys.readouterr().out)["modules"]
    assert module["backend"] == "gpu"
    text = hlo.read_text()
    # What only the GPU compiler prints: its fusion kinds and per-instruction GPU backend configs.
    assert "kind=kInput" in text and '"operation_queue_id"' in text
    assert ":T(" not in text  # not a TPU module


CUDA_FIXTURE_ARGS = ["--target", "cuda:h100:1x1x2", "--devices", "2", "--remat", "on", *TINY_ARGS]


def _kept_dump(monkeypatch, where):
    """compile_step's dump folder kept at ``where`` (it is a temporary folder otherwise)."""
    import contextlib

    from xla_harness.targets import compile as compile_mod

    class _Kept:
        @staticmethod
        @contextlib.contextmanager
        def TemporaryDirectory(prefix=""):  # noqa: N802 - stands in for tempfile's
            where.mkdir()
            yield str(where)

    monkeypatch.setattr(compile_mod, "tempfile", _Kept)


def _verdicts(module: dict) -> list[tuple]:
    return [(f["fusion"], tuple(f["output_index"]), f["class"], f.get("compiler", ""), f.get("compiler_from", ""),
             f.get("agreement", "")) for f in module["findings"]]


@pytest.mark.slow
@needs_cuda_plugin
def test_scan_model_for_cuda_reads_the_compilers_values_file(tmp_path, monkeypatch, capsys):
    """`scan --model --target cuda:` gives the GPU compiler's own truth exactly as scanning the files of
    the same compile's dump does: the buffer assignment and its values file (whose uses resolve the
    async reduce-scatter feeding input_scatter_fusion; by name it gets no verdict)."""
    dump = tmp_path / "dump"
    _kept_dump(monkeypatch, dump)
    assert main(["scan", "--model", "--json", *CUDA_FIXTURE_ARGS]) == 0
    captured = capsys.readouterr()
    assert "warning" not in captured.err
    [model] = json.loads(captured.out)["modules"]
    [ba] = dump.glob("*.jit_step.sm_9.0a_gpu_after_optimizations-buffer-assignment.txt")  # what scan DIR reads
    assert ba.with_name(ba.name.replace(".txt", "-values.txt")).is_file()
    assert main(["scan", str(dump), "--json"]) == 0
    [files] = json.loads(capsys.readouterr().out)["modules"]
    assert model["backend"] == files["backend"] == "gpu"
    assert _verdicts(model) == _verdicts(files)
    assert model["findings"] == files["findings"]
    said = {f[0]: f[3:] for f in _verdicts(model)}
    assert "input_scatter_fusion" in said and len(said) == 4
    assert set(said.values()) == {("aliased", "buffer assignment", "agree")}
    # The memory plan of the compile (collectives as async-start wrapping a computation): no conflict,
    # and our live range is the compiler's on every value it times (24 of 256 differed before).
    plan = model["memory_plan"]
    assert plan["conflicts"] == [] and plan["live_range_compared"] > 200
    assert plan["live_range_disagreements"] == [], plan["live_range_disagreements"][:3]


@pytest.mark.slow
@needs_cuda_plugin
def test_scan_model_for_cuda_says_when_the_values_file_is_missing(tmp_path, monkeypatch, capsys):
    """Planted: the compile's values file is not found. The scan says so on standard error, and the
    output whose operand value only the values file resolves gets no verdict (not a guessed one)."""
    from xla_harness.targets import compile as compile_mod

    monkeypatch.setattr(compile_mod, "values_path", lambda ba: ba.with_name("not-written.txt"))
    assert main(["scan", "--model", "--json", *CUDA_FIXTURE_ARGS]) == 0
    captured = capsys.readouterr()
    assert "warning: <tied-embedding" in captured.err and "no values file" in captured.err
    said = {f[0]: f[3:] for f in _verdicts(json.loads(captured.out)["modules"][0])}
    assert said.pop("input_scatter_fusion") == ("", "", "")
    assert set(said.values()) == {("aliased", "buffer assignment", "agree")} and len(said) == 3


def test_compile_keeps_the_buffer_assignment_its_values_file_and_its_live_range(tmp_path):
    from xla_harness.targets.compile import _buffer_assignment

    assert _buffer_assignment(tmp_path) == (None, None, None)
    stem = tmp_path / "module_0001.jit_step.sm_9.0a_gpu_after_optimizations"
    (tmp_path / f"{stem.name}-buffer-assignment.txt").write_text("allocation 0: size 4:\n")
    assert _buffer_assignment(tmp_path) == ("allocation 0: size 4:\n", None, None)
    (tmp_path / f"{stem.name}-buffer-assignment-values.txt").write_text("<0 w @0>\n")
    assert _buffer_assignment(tmp_path) == ("allocation 0: size 4:\n", "<0 w @0>\n", None)
    (tmp_path / f"{stem.name}-live-range.txt").write_text("HloLiveRange (max 1):\n")
    assert _buffer_assignment(tmp_path) == ("allocation 0: size 4:\n", "<0 w @0>\n", "HloLiveRange (max 1):\n")


def test_model_buffers_read_the_values_file_or_say_it_is_missing(capsys):
    from xla_harness.commands.scan import _model_buffers

    ba_text = "allocation 0: size 4:\n value: <0 w @0> (size=4,offset=0): f32[]\n"
    ba = _model_buffers("<m>", ba_text, "<0 w @0>\n uses:\n  f, operand 2 {1}\n", H100)
    assert ba is not None and ba.uses == {("f", 2, (1,)): 0}
    assert capsys.readouterr().err == ""
    ba = _model_buffers("<m>", ba_text, None, H100)
    assert ba is not None and ba.uses is None
    assert "warning: <m>: the compiler wrote a buffer assignment but no values file" in capsys.readouterr().err
    assert _model_buffers("<m>", None, None, H100) is None
    assert "warning: <m>: the compiler wrote no buffer assignment" in capsys.readouterr().err
    assert _model_buffers("<m>", None, None, V6E) is None  # libtpu states its decision in the HLO
    assert capsys.readouterr().err == ""
    with pytest.raises(HarnessError, match="not a buffer-assignment values file"):
        _model_buffers("<m>", ba_text, "garbage\n", H100)


@pytest.mark.slow
@needs_libtpu
def test_bisect_passes_on_tpu_finds_libtpus_fusion_passes(tmp_path, capsys):
    """A pass bisection with libtpu's own passes (probes compile for v6e in subprocesses): the
    multi-op fusions of a small function go when libtpu's two fusion passes are disabled."""
    rc = main(["bisect-passes", "--program", "small", "--oracle", "hlo", "--property", "multi-op-fusion",
               "--target", "tpu:v6e:2x4", "--passes", "algsimp,tpu_fusion,cse,tpu_multi_output_fusion",
               "--out", str(tmp_path), "--quiet", "--json"])
    assert rc == 0
    result = json.loads(capsys.readouterr().out)
    assert sorted(result["minimal"]) == ["tpu_fusion", "tpu_multi_output_fusion"]
    header = json.loads((tmp_path / "bisect.jsonl").read_text().splitlines()[0])
    assert "tpu:v6e:2x4" in json.dumps(header)


def test_bisect_stress_oracle_needs_the_hardware(tmp_path, capsys):
    assert main(["bisect-passes", "--target", "tpu:v6e:2x4", "--out", str(tmp_path)]) == 2
    assert "use --oracle hlo" in capsys.readouterr().err


@pytest.mark.slow
@needs_libtpu
def test_bundle_carries_the_step_compiled_for_the_target(tmp_path, capsys):
    import tarfile

    out = tmp_path / "repro.tar.gz"
    assert main(["bundle", "--out", str(out), "--target", "tpu:v6e:2x4", "--steps", "2", *TINY_ARGS]) == 0
    with tarfile.open(out) as tf:
        names = tf.getnames()
        hlo = tf.extractfile("bundle/hlo/tpu_v6e_2x4/jit_step.after_optimizations.txt").read().decode()
        findings = json.loads(tf.extractfile("bundle/findings.json").read())
    assert "bundle/hlo/tpu_v6e_2x4/jit_step.after_optimizations-buffer-assignment.txt" in names
    assert '"aliasing_operands"' in hlo and ":T(8,128)" in hlo
    [tpu] = [m for m in findings["modules"] if m.get("target") == "tpu:v6e:2x4"]
    assert tpu["backend"] == "tpu" and tpu["device_kind"] == "TPU v6 lite"
    capsys.readouterr()
    assert main(["bundle", "--check", str(out)]) == 0  # the manifest covers the target's files


def _record(label: str, hazard: int = 0) -> dict:
    return {"kind": "compile", "schema": 1, "label": label, "target": "tpu:v6e:2x4",
            "versions": {"jax": "0.12.0.1", "jaxlib": "0.12.0.1", "libtpu": "0.0.50.1"},
            "fingerprint": {"id": "0123456789abcdef", "instructions": 10}, "compile_cpu_s": 3.0,
            "scan": {"hazard": hazard, "decisions": 0, "compiler_alias": {
                "instructions_with_field": 4, "aliased_fusions": 2, "aliased_scatter_fusions": 1,
                "disagreements": 0}}}


def test_report_prints_the_compile_table_of_a_matrix(tmp_path, capsys):
    for pin, hazard in (("0.12.0.1", 0), ("0.9.0.1", 1)):
        (tmp_path / f"jax{pin}").mkdir()
        (tmp_path / f"jax{pin}" / "compile.jsonl").write_text(json.dumps(_record(f"cell-{pin}", hazard)) + "\n")
    assert main(["report", str(tmp_path)]) == 1  # a hazard in one cell is a finding
    out = capsys.readouterr().out
    assert "cell-0.12.0.1" in out and "cell-0.9.0.1" in out and "libtpu 0.0.50.1" in out
    assert "2 (1 scatter, 0 disagree)" in out
    (tmp_path / "jax0.9.0.1" / "compile.jsonl").write_text('{"kind": "compile"}\n')
    assert main(["report", str(tmp_path)]) == 2
    assert "compile.jsonl:1: not a compile record" in capsys.readouterr().err
