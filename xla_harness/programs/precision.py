"""The matmul precision of a program's dots, set the way a user sets it.

``precision`` (an option of the built-in programs): ``"default"`` leaves the dots as jax writes them
(no ``precision`` on the dots, or what ``jax_default_matmul_precision`` says when the user set it in
the environment or with ``jax.config.update``: the harness records that setting with every result);
``"high"`` and ``"highest"`` trace the step under ``jax.default_matmul_precision(...)``, the
context a user wraps around a step, so every dot of the step and of its gradient carries
``precision = [HIGH, HIGH]`` or ``[HIGHEST, HIGHEST]`` in the lowered StableHLO. On TPU an f32 dot at
the default precision is one bf16 pass and at ``highest`` several; on CPU the precision changes the
lowered program only, not the values.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from xla_harness.errors import HarnessError

PRECISIONS = ("default", "high", "highest")


def check_precision(value) -> str:
    """``value`` if it is one of :data:`PRECISIONS`; HarnessError otherwise."""
    if not isinstance(value, str) or value not in PRECISIONS:
        raise HarnessError(f"unknown precision {value!r}; expected one of {', '.join(PRECISIONS)}")
    return value


def with_matmul_precision(step: Callable, precision: str) -> Callable:
    """``step`` traced under ``jax.default_matmul_precision(precision)`` (``step`` itself for
    ``"default"``: the program as it was)."""
    check_precision(precision)
    if precision == "default":
        return step

    @functools.wraps(step)
    def traced_at(*args, **kwargs):
        import jax

        with jax.default_matmul_precision(precision):
            return step(*args, **kwargs)

    return traced_at
