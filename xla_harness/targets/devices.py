"""A target's devices, the compiler behind them, and the environment that compiler needs.

Ahead-of-time targets need no hardware: libtpu describes any TPU topology and the CUDA plugin
(jax-cuda12-plugin and jax-cuda12-pjrt, or their CUDA 13 pair; no NVIDIA libraries) any GPU of
:mod:`xla_harness.targets.gpu`. The host backend is pinned to the CPU for them
(``JAX_PLATFORMS=cpu`` unless set): nothing runs, and a machine without a TPU must not try to open one.

Where the compilers live. ``make setup-targets`` installs them into a folder of their own,
``<venv>/xla-harness-targets`` (``pip install --target``), which is not on ``sys.path``: only the
harness adds it (:func:`use_target_compilers`), and only for a ``tpu:``/``cuda:`` target. Everything
else in the venv imports jax as before: installed into site-packages, the CUDA plugin prints a
"cuDNN not found" traceback and libtpu five lines of warnings on every ``import jax`` of a machine
without the hardware, and jax would try to open a TPU or GPU. ``XLA_HARNESS_TARGET_COMPILERS`` names
another folder. Installed into site-packages instead (``pip install 'xla-harness[tpu]'``, as on a
TPU VM, where jax must see libtpu), they are used from there.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import sys
from importlib import metadata
from pathlib import Path

from xla_harness.errors import HarnessError
from xla_harness.targets.spec import Target

COMPILERS_ENV = "XLA_HARNESS_TARGET_COMPILERS"
COMPILERS_DIR = "xla-harness-targets"  # under the venv (sys.prefix)
_HOW = "make setup-targets (or pip install 'xla-harness[{extra}]')"
# What each ahead-of-time platform needs: (importable modules, any one will do; distributions to report).
_NEEDS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "tpu": (("libtpu",), ("libtpu",)),
    "cuda": (("jax_plugins.xla_cuda12", "jax_plugins.xla_cuda13"),
             ("jax-cuda12-plugin", "jax-cuda12-pjrt", "jax-cuda13-plugin", "jax-cuda13-pjrt")),
}


def compilers_dir() -> Path | None:
    """The folder the target compilers were installed into apart from site-packages
    (``$XLA_HARNESS_TARGET_COMPILERS``, else ``<venv>/xla-harness-targets``); None when there is none."""
    env = os.environ.get(COMPILERS_ENV, "")
    path = Path(env) if env else Path(sys.prefix) / COMPILERS_DIR
    return path if path.is_dir() else None


def use_target_compilers() -> None:
    """Put :func:`compilers_dir` on ``sys.path`` (last, so it shadows nothing), once. Before jax has
    looked for its plugins this is all it takes (jax finds the CUDA plugin by its entry point and
    libtpu by import when a topology is asked for); after, the CUDA plugin is registered here."""
    where = compilers_dir()
    if where is None or str(where) in sys.path:
        return
    sys.path.append(str(where))
    importlib.invalidate_caches()
    _register_cuda_plugin_late()


def _register_cuda_plugin_late() -> None:
    """jax looks for plugins once, when its first backend starts: if that already happened without the
    folder (a library user who ran jax first), initialise the CUDA plugin now. Feature-detected: a jax
    without these internals is left alone (the topology request then says what is missing)."""
    bridge = sys.modules.get("jax._src.xla_bridge")
    if bridge is None or not getattr(bridge, "_plugins_registered", False):
        return
    factories = getattr(bridge, "_topology_factories", None)
    if not isinstance(factories, dict) or "cuda" in factories:
        return
    for name in _NEEDS["cuda"][0]:
        if not _find(name):
            continue
        # No CUDA runtime is needed to compile; the plugin checks one unless told not to (and jax's
        # platform setting, which would also skip the check, was read when jax started).
        os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")
        try:
            importlib.import_module(name).initialize()
        except Exception as exc:  # noqa: BLE001 - the plugin's refusal: one line
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
            raise HarnessError(f"the CUDA plugin ({name}) could not be loaded after jax started: {first}") from None
        return


def _find(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def prepare_environment(target: Target) -> None:
    """Set what the target's compiler needs before jax is imported: the CPU as the host backend,
    for libtpu leave to load it in more than one process at once (probes run in subprocesses), and
    no check by the CUDA plugin of a CUDA runtime that is not needed: jax 0.9's plugin checks the
    runtime's version at load even when JAX_PLATFORMS leaves CUDA out (0.12's skips it then), fails
    without NVIDIA's libraries and registers no platform ("topology not implemented for cuda")."""
    if target.is_host:
        return
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    # For a tpu: target too: the CUDA plugin shares the compilers' folder, jax loads every plugin it
    # finds, and jax 0.9's would print its "Unable to load CUDA" traceback during a TPU compile.
    os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")
    use_target_compilers()
    if target.platform == "tpu":
        os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
        if not _has_tpu_chips():
            # What a TPU VM's metadata server would say; without it libtpu prints five lines of
            # warnings when it loads. The compile does not depend on them (fingerprints equal).
            os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
            os.environ.setdefault("TPU_ACCELERATOR_TYPE", accelerator_type(target))


def pin_cpu_without_accelerators() -> None:
    """``JAX_PLATFORMS=cpu`` (unless set) on a machine with libtpu or the CUDA plugin installed but no
    TPU or GPU device files: jax would fall back to the CPU anyway, after libtpu's warnings and the
    plugin's "cuDNN not found" traceback on every start. A machine with the hardware is left alone."""
    import glob

    if "JAX_PLATFORMS" in os.environ:
        return
    if glob.glob("/dev/nvidia[0-9]*") or glob.glob("/dev/kfd") or _has_tpu_chips():
        return
    if any(_find(module) for modules, _ in _NEEDS.values() for module in modules):
        os.environ["JAX_PLATFORMS"] = "cpu"


LOAD_AUTOTUNE_FLAG = "xla_gpu_load_autotune_results_from"
DUMP_AUTOTUNE_FLAG = "xla_gpu_dump_autotune_results_to"


def load_autotune_results(path: Path, target: Target) -> None:
    """Have XLA's GPU compiler load the autotune results in ``path``: ``--xla_gpu_load_autotune_results_from``
    appended to ``XLA_FLAGS`` (XLA reads it once, before the first compile; it loads the file at most
    once per process). HarnessError, before anything is compiled, for a file that is not there or
    cannot be read, a TPU target, a host without a GPU, or XLA_FLAGS already naming a file."""
    import glob

    if target.platform == "tpu":
        raise HarnessError(f"--autotune-results: {target.text} has no GPU autotuner; the file is for a cuda: "
                           "target or a GPU host")
    if target.is_host and not glob.glob("/dev/nvidia[0-9]*"):
        raise HarnessError("--autotune-results: this host has no GPU, so its compiler has no GPU autotuner; "
                           "compile for a cuda: target (--target cuda:h200 ...)")
    if not path.exists():
        raise HarnessError(f"--autotune-results {path}: no such file")
    if not path.is_file():
        raise HarnessError(f"--autotune-results {path}: not a regular file")
    try:
        with open(path, "rb") as fh:
            fh.read(1)
    except OSError as exc:
        raise HarnessError(f"--autotune-results {path}: cannot read: {exc.strerror or exc}") from None
    flags = os.environ.get("XLA_FLAGS", "")
    if LOAD_AUTOTUNE_FLAG in flags:
        raise HarnessError(f"--autotune-results {path}: XLA_FLAGS already names a file for --{LOAD_AUTOTUNE_FLAG}; "
                           "give one")
    os.environ["XLA_FLAGS"] = f"{flags} --{LOAD_AUTOTUNE_FLAG}={flag_value(path.resolve())}".strip()


def flag_value(path: Path) -> str:
    """``path`` as the value of a flag in XLA_FLAGS: in double quotes when it holds white space (XLA
    splits XLA_FLAGS at white space outside quotes); HarnessError for a path XLA_FLAGS cannot carry."""
    text = str(path)
    if '"' in text or "\n" in text:
        raise HarnessError(f"{path}: a path with a double quote or a newline cannot be passed in XLA_FLAGS; "
                           "rename the file")
    return f'"{text}"' if any(c.isspace() for c in text) else text


def flag_path(flags: str, name: str) -> str | None:
    """The path a flag ``--name=`` names in XLA_FLAGS text (its quotes removed), or None."""
    m = re.search(rf'--{name}=(?:"([^"]*)"|(\S+))', flags)
    return None if m is None else (m.group(1) if m.group(1) is not None else m.group(2))


def autotune_dump_path(devices: list, stem: str) -> str | None:
    """Where a compile on a real GPU writes the autotune results its device chose (``STEM.autotune.txt``,
    text), or None when the devices are not a GPU's: ahead of time no autotuner runs."""
    if not devices or getattr(devices[0], "platform", "") not in ("gpu", "cuda", "rocm"):
        return None
    if "CompileOnly" in type(getattr(devices[0], "client", None)).__name__:  # a topology's devices: no device
        return None
    return f"{stem}.autotune.txt"


def _has_tpu_chips() -> bool:
    """Whether this machine has TPU chips (their device files), when the TPU VM's own settings stand."""
    import glob

    return bool(glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*"))


def accelerator_type(target: Target) -> str:
    """The Cloud TPU accelerator type of a TPU target (``v6e-8``; v4 and v5p count TensorCores, two per
    chip; v5e is ``v5litepod``)."""
    chips = target.device_count
    name = {"v5e": "v5litepod"}.get(target.kind, target.kind)
    return f"{name}-{chips * 2 if target.kind in ('v4', 'v5p') else chips}"


def missing(target: Target) -> str | None:
    """Why ``target`` cannot be compiled for here (what to install), or None when it can."""
    if target.is_host:
        return None
    use_target_compilers()
    modules, _ = _NEEDS[target.platform]
    if any(_find(module) for module in modules):
        return None
    what = "libtpu" if target.platform == "tpu" else "the CUDA plugin (jax-cuda12-plugin and jax-cuda12-pjrt)"
    return f"--target {target.text} needs {what}: " + _HOW.format(extra=target.platform)


def compiler_versions(target: Target) -> dict[str, str]:
    """The installed versions of what compiles for ``target`` (jaxlib for the host; libtpu or the CUDA
    plugin otherwise), from package metadata."""
    out = {}
    for dist in ("jax", "jaxlib"):
        out[dist] = _version(dist) or "not installed"
    if not target.is_host:
        use_target_compilers()
        dists = _NEEDS[target.platform][1]
        found = {d: v for d in dists if (v := _version(d))}
        # the pair that is installed (CUDA 12 or 13), or every name "not installed"
        out.update(found or dict.fromkeys(dists[:2], "not installed"))
    return out


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def target_devices(target: Target) -> list:
    """The target's devices: the host backend's, or those of the TPU/GPU topology (no hardware needed)."""
    import jax

    if target.is_host:
        return list(jax.devices())
    prepare_environment(target)  # a library caller may not have: libtpu's leave to load beside another process
    why = missing(target)
    if why:
        raise HarnessError(why)
    from jax.experimental import topologies

    try:
        if target.platform == "tpu":
            topo = topologies.get_topology_desc(platform="tpu", topology_name=f"{target.kind}:{target.topology}")
        else:
            from xla_harness.targets.gpu import GPU_KINDS, target_config

            topo = topologies.get_topology_desc(platform="cuda", topology_name=target.kind,
                                                target_config=target_config(GPU_KINDS[target.kind]),
                                                topology=target.topology)
    except HarnessError:
        raise
    except Exception as exc:  # noqa: BLE001 - the compiler's refusal of a topology is the user's input
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        raise HarnessError(f"--target {target.text}: the compiler refused the topology: {first}") from None
    devices = list(topo.devices)
    if not devices:
        raise HarnessError(f"--target {target.text}: the topology has no devices")
    return devices


def device_kind(devices: list) -> str:
    return str(getattr(devices[0], "device_kind", "unknown")) if devices else "unknown"
