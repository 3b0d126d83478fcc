"""Per-framework adapters for the gradcheck registry.

Each adapter module offers ``NAME``, ``MODES``, ``available() -> str`` (empty when the
framework imports, else why not), ``version() -> str``, ``ops(...)`` (the namespace ``F``
the cases are written against) and ``gradient(case, mode, x) -> np.ndarray`` (d f / d x at
each point, float32). Frameworks are imported lazily: a missing one is reported, never a
crash.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from xla_harness.errors import HarnessError

FRAMEWORKS = ("jax", "tf", "mlx")


class Unsupported(Exception):  # noqa: N818 - a verdict ("n/a"), not an error
    """The framework has no such op; the cell reads n/a."""


def adapter(name: str) -> ModuleType:
    if name not in FRAMEWORKS:
        raise HarnessError(f"unknown framework {name!r}; expected one of {', '.join(FRAMEWORKS)}")
    return importlib.import_module(f"xla_harness.gradcheck.frameworks.{name}_adapter")
