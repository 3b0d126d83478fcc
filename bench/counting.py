"""Machine-independent counts of what a loop asks of the device, taken from jax and numpy themselves
(not from the harness's own bookkeeping): every host read of a jax Array with its bytes
(``ArrayImpl._value``, behind ``float()``, ``__array__``, ``jax.device_get``; and ``np.asarray`` /
``np.array`` of a jax Array, which on the CPU reads it through the buffer protocol without calling
jax), every ``block_until_ready``, and every backend compile by function name (``jax.monitoring``).
Used by ``bench/stress_overhead.py`` and by the tests that assert the stress loop's costs
(``tests/stress/test_stress_costs.py``).

    with DeviceCounts() as counts:
        ...                      # counts.reads, counts.read_bytes, counts.waits, counts.syncs
    compiles = CompileCounts()   # process-wide from here on: compiles.of("step")
"""

from __future__ import annotations

import collections
import threading
from dataclasses import dataclass, field

import jax
import numpy as np


@dataclass
class DeviceCounts:
    """Host reads of jax Arrays (each a transfer that waits for the array), their bytes, and explicit
    waits (``block_until_ready``), counted while the context is open (main thread and others)."""

    reads: int = 0
    read_bytes: int = 0
    waits: int = 0
    _saved: dict = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def syncs(self) -> int:
        return self.reads + self.waits

    def _read(self, x) -> None:
        with self._lock:
            self.reads += 1
            self.read_bytes += int(x.nbytes)

    def __enter__(self) -> DeviceCounts:
        from jax._src import array

        impl = array.ArrayImpl
        value, wait = impl._value, impl.block_until_ready
        counts = self
        inside = threading.local()  # a read counted by np.asarray is not counted again by _value

        def counted_value(self):
            if self._npy_value is None and not getattr(inside, "on", False):  # a cached host copy is no transfer
                counts._read(self)
            return value.fget(self)

        def counted_wait(self):
            with counts._lock:
                counts.waits += 1
            return wait(self)

        def numpy_reader(real):
            def read(x, *args, **kwargs):
                if not isinstance(x, impl) or getattr(inside, "on", False):
                    return real(x, *args, **kwargs)
                if x._npy_value is None:
                    counts._read(x)
                inside.on = True
                try:
                    return real(x, *args, **kwargs)
                finally:
                    inside.on = False
            return read

        self._saved = {(impl, "_value"): value, (impl, "block_until_ready"): wait,
                       (np, "asarray"): np.asarray, (np, "array"): np.array}
        impl._value = property(counted_value)
        impl.block_until_ready = counted_wait
        np.asarray, np.array = numpy_reader(np.asarray), numpy_reader(np.array)
        return self

    def __exit__(self, *exc) -> None:
        for (owner, name), attr in self._saved.items():
            setattr(owner, name, attr)


class CompileCounts:
    """Backend compiles by function name, from the moment it is made (a process-wide listener)."""

    def __init__(self) -> None:
        self.by_name: collections.Counter[str] = collections.Counter()
        self.total = 0
        jax.monitoring.register_event_duration_secs_listener(self._heard)

    def _heard(self, event: str, duration: float, **kwargs) -> None:
        if event == "/jax/core/compile/backend_compile_duration":
            self.total += 1
            self.by_name[str(kwargs.get("fun_name", "?"))] += 1

    def of(self, name: str) -> int:
        """Compiles of functions called ``name`` (``jit(name)``, ``jit_name`` and ``name`` alike)."""
        return sum(n for k, n in self.by_name.items() if k in (name, f"jit({name})", f"jit_{name}"))
