"""A target's devices, the compiler behind them, and the environment that compiler needs.

Ahead-of-time targets need no hardware: libtpu (``pip install 'xla-harness[tpu]'``) describes any
TPU topology and the CUDA plugin (``pip install 'xla-harness[cuda]'``: jax-cuda12-plugin and
jax-cuda12-pjrt, no NVIDIA libraries) any GPU of :mod:`xla_harness.targets.gpu`. The host backend
is pinned to the CPU for them (``JAX_PLATFORMS=cpu`` unless set): nothing runs, and a machine
without a TPU must not try to open one.
"""

from __future__ import annotations

import importlib.util
import os
from importlib import metadata

from xla_harness.errors import HarnessError
from xla_harness.targets.spec import Target

# What each ahead-of-time platform needs installed: (importable module, distributions to report).
_NEEDS = {
    "tpu": ("libtpu", ("libtpu",), "pip install 'xla-harness[tpu]' (or make setup-targets)"),
    "cuda": ("jax_plugins.xla_cuda12", ("jax-cuda12-plugin", "jax-cuda12-pjrt"),
             "pip install 'xla-harness[cuda]' (or make setup-targets)"),
}


def prepare_environment(target: Target) -> None:
    """Set what the target's compiler needs before jax is imported: the CPU as the host backend,
    for libtpu leave to load it in more than one process at once (probes run in subprocesses), and
    for the CUDA plugin no check of a CUDA runtime that is not needed: jax 0.9's plugin checks the
    runtime's version at load even when JAX_PLATFORMS leaves CUDA out (0.12's skips it then), fails
    without NVIDIA's libraries and registers no platform ("topology not implemented for cuda")."""
    if target.is_host:
        return
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    if target.platform == "cuda":
        os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")
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
    if any(missing(Target(p, "", "")) is None for p in _NEEDS):
        os.environ["JAX_PLATFORMS"] = "cpu"


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
    module, _, how = _NEEDS[target.platform]
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    return None if found else f"--target {target.text} needs {module.split('.')[-1]}: {how}"


def compiler_versions(target: Target) -> dict[str, str]:
    """The installed versions of what compiles for ``target`` (jaxlib for the host; libtpu or the CUDA
    plugin otherwise), from package metadata."""
    dists = ("jax", "jaxlib") + (() if target.is_host else _NEEDS[target.platform][1])
    out = {}
    for dist in dists:
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "not installed"
    return out


def target_devices(target: Target) -> list:
    """The target's devices: the host backend's, or those of the TPU/GPU topology (no hardware needed)."""
    import jax

    if target.is_host:
        return list(jax.devices())
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
