"""Where a stress run's devices come from: the host platform split into devices
(:func:`ensure_host_devices`) and ``jax.distributed`` start-up for several processes
(:func:`init_distributed`)."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from typing import Any

from xla_harness.errors import HarnessError


def ensure_host_devices(n: int) -> None:
    """Split the CPU into ``n`` devices; must run before jax is imported."""
    if n <= 1:
        return
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" in flags:
        return
    if "jax" in sys.modules:
        return  # too late to change; build_program reports a clear error if devices are missing
    os.environ["XLA_FLAGS"] = (flags + f" --xla_force_host_platform_device_count={n}").strip()


def wait_for_coordinator(address: str, timeout: float) -> None:
    """Poll HOST:PORT until it accepts a TCP connection. jax's client aborts the whole process
    when the coordinator is unreachable, so non-zero processes check first and fail cleanly."""
    import socket

    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise HarnessError(f"--coordinator must be HOST:PORT, got {address!r}")
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=2):
                return
        except OSError:
            if time.monotonic() >= deadline:
                raise HarnessError(f"coordinator {address} did not come up within {timeout:g} s; start "
                                   "process 0 first, or check the address") from None
            time.sleep(0.5)  # polling a socket, not timing anything


def init_distributed(coordinator: str | None, num_processes: int | None, process_id: int | None,
                     from_environment: bool, init_timeout: float) -> int:
    """jax.distributed.initialize from the flags (``--coordinator``, ``--num-processes``, ``--process-id``)
    or from the environment (``--distributed``); returns the process count."""
    explicit = coordinator or num_processes or process_id is not None
    if not (explicit or from_environment):
        return 1
    if explicit and not (coordinator and num_processes and process_id is not None):
        raise HarnessError("--coordinator, --num-processes and --process-id go together")
    if explicit and not 0 <= int(process_id or 0) < int(num_processes or 0):
        raise HarnessError(f"--process-id must be in [0, {num_processes})")
    import jax

    with contextlib.suppress(AttributeError, ValueError):  # CPU collectives across processes (not TPU/GPU)
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    kwargs: dict[str, Any] = {"initialization_timeout": init_timeout}
    if explicit and process_id != 0:
        wait_for_coordinator(str(coordinator), init_timeout)
    if explicit:
        kwargs.update(coordinator_address=coordinator, num_processes=num_processes, process_id=process_id)
    try:
        jax.distributed.initialize(**kwargs)
    except Exception as exc:  # jax raises several types here; all mean "not connected"
        where = coordinator or "the coordinator from the environment"
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise HarnessError(f"jax.distributed could not connect to {where} within {init_timeout} s "
                           f"({first[:160]})") from None
    return jax.process_count()
