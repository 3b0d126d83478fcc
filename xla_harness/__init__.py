"""xla-harness: reproduce, measure and localise intermittent non-finite updates under XLA.

The public API is what ``__all__`` names; every other module is internal and may change.
Names load on first use, so ``import xla_harness`` costs no jax import::

    import xla_harness as xh

    program = xh.TrainProgram(name="mine", init=init, batch=batch, step=xh.step_from_loss(loss, opt))
    xh.run_matrix(xh.StressSpec(program="my_model.py:make", seeds=(1, 2), steps=50), out_dir)
    table = xh.load_table([out_dir])              # rows per configuration, counts, bounds
    print(xh.format_table(table))
    findings, decisions, backend = xh.scan_text(open("module.txt").read())
    xh.stats.upper_bound(0, 80)                   # one-sided 95% bound on a failure rate
    xh.origin_of(step, (params, opt_state), batch, replay=None).cls   # whose NaN: "input", "program", ...
"""

from __future__ import annotations

import xla_harness._early  # noqa: F401 - first: started as the CLI, signals are noted from here on

# isort: split
import importlib
from typing import TYPE_CHECKING, Any

from xla_harness.names import VERSION as __version__

# public name -> (module, attribute); attribute None: the module itself.
_EXPORTS: dict[str, tuple[str, str | None]] = {
    "HarnessError": ("xla_harness.errors", "HarnessError"),
    "TrainProgram": ("xla_harness.programs.interface", "TrainProgram"),
    "step_from_loss": ("xla_harness.programs.interface", "step_from_loss"),
    "load_program": ("xla_harness.programs.interface", "load_program"),
    "StressSpec": ("xla_harness.stress.spec", "StressSpec"),
    "run_matrix": ("xla_harness.stress.runner", "run_matrix"),
    "load_table": ("xla_harness.stress.report.summary", "load_table"),
    "format_table": ("xla_harness.stress.report.summary", "format_table"),
    "read_results": ("xla_harness.stress.results.store", "read_results"),
    "parse_hlo": ("xla_harness.hlo.parser", "parse_module"),
    "scan_text": ("xla_harness.hlo.scan", "scan_text"),
    "stats": ("xla_harness.stress.report.stats", None),
    "origin_of": ("xla_harness.origin.classify", "origin_of"),
    "Origin": ("xla_harness.origin.classify", "Origin"),
}

__all__ = [
    "__version__", "HarnessError", "TrainProgram", "step_from_loss", "load_program", "StressSpec", "run_matrix",
    "load_table", "format_table", "read_results", "parse_hlo", "scan_text", "stats", "origin_of", "Origin",
]

if TYPE_CHECKING:
    from xla_harness.errors import HarnessError
    from xla_harness.hlo.parser import parse_module as parse_hlo
    from xla_harness.hlo.scan import scan_text
    from xla_harness.origin.classify import Origin, origin_of
    from xla_harness.programs.interface import TrainProgram, load_program, step_from_loss
    from xla_harness.stress.report.summary import format_table, load_table, stats
    from xla_harness.stress.results.store import read_results
    from xla_harness.stress.runner import run_matrix
    from xla_harness.stress.spec import StressSpec


def __getattr__(name: str) -> Any:
    try:
        module, attr = _EXPORTS[name]
    except KeyError:
        raise AttributeError(f"module 'xla_harness' has no attribute {name!r}") from None
    value = importlib.import_module(module)
    if attr is not None:
        value = getattr(value, attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
