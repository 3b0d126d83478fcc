"""Provenance: what every record says about where it was made: the versions, the backend and
devices, the variables and jax settings that decide what XLA compiles (:func:`environment`), the
harness's version and its checkout's commit, and the time; and how two records' jax settings differ
(:func:`settings_difference`: report, merge and --resume refuse to pool runs made under different
settings)."""

from __future__ import annotations

import os
import platform
import socket
import subprocess
from datetime import UTC, datetime
from functools import lru_cache
from importlib import metadata

from xla_harness.errors import HarnessError
from xla_harness.names import VERSION
from xla_harness.runtime import subproc
from xla_harness.runtime.resources import source_checkout

ENV_VARS_RECORDED = ("XLA_FLAGS", "LIBTPU_INIT_ARGS", "JAX_PLATFORMS", "TPU_NAME")
PLUGIN_DISTRIBUTIONS = (
    "libtpu", "libtpu-nightly", "jax-cuda12-plugin", "jax-cuda12-pjrt",
    "jax-cuda13-plugin", "jax-cuda13-pjrt", "jax-rocm-plugin",
)


# The jax settings that change the program jax lowers or XLA compiles, however they were set (a
# JAX_... environment variable, jax.config.update, a context manager around the run). Each record
# holds the ones this jax has, under "jax_config"; a stress header's spec holds them too, so they
# enter its fingerprint and report/merge refuse to pool runs made under different settings.
JAX_SETTINGS_RECORDED = (
    # the lowered program (StableHLO)
    "jax_default_matmul_precision", "jax_enable_x64", "jax_default_prng_impl", "jax_threefry_partitionable",
    "jax_random_seed_offset", "jax_use_shardy_partitioner", "jax_softmax_custom_jvp", "jax_use_direct_linearize",
    "jax_use_simplified_jaxpr_constants", "jax_threefry_gpu_kernel_lowering", "jax_accurate_erf_inv",
    "jax_high_dynamic_range_gumbel", "jax_use_hlo_logistic_lowering", "jax_disable_jit",
    # the compile options jax passes to XLA
    "jax_optimization_level", "jax_memory_fitting_level", "jax_exec_time_optimization_effort",
    "jax_memory_fitting_effort", "jax_xla_profile_version", "jax_disable_most_optimizations",
    "jax_compiler_enable_remat_pass", "jax_enable_pgle",
)
JAX_CONFIG_KEY = "jax_config"


def _setting_json(value):
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return getattr(value, "name", None) or str(value)  # an enum (optimization levels) by its name


def jax_settings() -> dict:
    """The value of every :data:`JAX_SETTINGS_RECORDED` setting this jax has, as it reads now."""
    import jax

    values = getattr(jax.config, "values", {})
    out = {}
    for name in JAX_SETTINGS_RECORDED:
        if name not in values:
            continue
        try:
            value = getattr(jax.config, name)
        except AttributeError:  # a setting without an attribute: its global value
            value = values[name]
        out[name] = _setting_json(value)
    return out


def with_jax_settings(spec: dict) -> dict:
    """A stress spec as a results header holds it: with the jax settings of this process."""
    return {**spec, JAX_CONFIG_KEY: jax_settings()}


def settings_difference(old: dict | None, new: dict | None) -> str | None:
    """The first jax setting in which two records differ, as a phrase, or None. A record written
    before the settings were recorded (None) differs from every record that has them: its settings
    are unknown."""
    if old == new:
        return None
    if old is None or new is None:
        return ("jax settings not recorded (a record written before the harness recorded them), now recorded"
                if old is None else "jax settings recorded, now not recorded")
    for k in sorted(set(old) | set(new)):
        if old.get(k, "<absent>") != new.get(k, "<absent>"):
            return f"jax setting {k}={old.get(k, '<absent>')!r}, now {new.get(k, '<absent>')!r}"
    return None


def _dist_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


@lru_cache(maxsize=1)
def repo_commit() -> str | None:
    """Git commit of this project's checkout (with '+dirty' if it has local changes), 'unknown'
    when git cannot say, or None when the harness runs from an installed wheel: the git
    repository around site-packages (or the cwd) is the user's, never this project's. Asked of git
    once per process: the code a process runs is the code it loaded."""
    root = source_checkout()
    if root is None or not (root / ".git").exists():  # not a clone (e.g. an unpacked sdist): no commit
        return None
    try:
        head = subproc.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                           text=True, timeout=10, check=True).stdout.strip()
        dirty = subproc.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                            capture_output=True, text=True, timeout=10).stdout.strip()
        return head + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError, HarnessError):  # HarnessError: git hung, its group killed
        return "unknown"


def harness_version() -> str:
    """The version of the harness that wrote the record (``xla_harness.__version__``)."""
    return VERSION


def environment() -> dict:
    """Versions, backend and variables that decide what XLA compiles; recorded on every line."""
    import jax

    devices = jax.devices()
    try:
        import jaxlib

        jaxlib_version = getattr(jaxlib, "__version__", None) or _dist_version("jaxlib")
    except ImportError:
        jaxlib_version = None
    return {
        "jax": jax.__version__,
        "jaxlib": jaxlib_version,
        "plugins": {n: v for n in PLUGIN_DISTRIBUTIONS if (v := _dist_version(n))},
        "backend": jax.default_backend(),
        "device_kind": devices[0].device_kind,
        "device_count": jax.device_count(),
        "local_device_count": jax.local_device_count(),
        "process_index": jax.process_index(),
        "process_count": jax.process_count(),
        "env": {k: os.environ.get(k, "") for k in ENV_VARS_RECORDED},
        JAX_CONFIG_KEY: jax_settings(),
        "host": socket.gethostname(),
        "python": platform.python_version(),
        "harness_version": harness_version(),
        "repo_commit": repo_commit(),
    }


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def compile_provenance() -> dict:
    """Who compiled (``stress --compile-only``'s every record): the harness version and commit, Python,
    the host's CPU count, the env vars that decide what XLA compiles and the jax settings that change
    the lowered or compiled program."""
    return {"harness_version": harness_version(), "repo_commit": repo_commit(),
            "python": platform.python_version(), "host_cpus": os.cpu_count(),
            "env": {k: os.environ.get(k, "") for k in ENV_VARS_RECORDED}, JAX_CONFIG_KEY: jax_settings()}
