"""Check a compiled program's memory plan for races, from what the compiler dumps: the scheduled
module and its buffer assignment (and, where dumped, the compiler's live range to compare against).

One stage per module, each a function of the earlier stages' results:

* :mod:`.inputs`: the files read and held to each other (one compile's, whole, well-formed);
* :mod:`.model`: the :class:`Plan` (values, the flattened schedule, lookups derived once), with
  :mod:`.hidden` tying the values of async computations the text hides to their starts;
* :mod:`.dataflow`: which values each position holds;
* :mod:`.rules`: which values are one buffer (:data:`RULES`, one function each);
* :mod:`.liveness`: each value's interval, and what was left out of the timing and why;
* :mod:`.checks`: overlap, in-place/donation and async races;
* :mod:`.liverange`: our intervals held to the compiler's own live range.
"""

from __future__ import annotations

import time
from pathlib import Path

from xla_harness.errors import HarnessError
from xla_harness.hlo.buffers import BufferAssignment, parse_buffer_assignment
from xla_harness.hlo.ir import HloModule
from xla_harness.hlo.memplan import checks, inputs
from xla_harness.hlo.memplan.dataflow import Flow, dataflow
from xla_harness.hlo.memplan.inputs import backend_of, beside, gunzip, read_text
from xla_harness.hlo.memplan.liveness import LEFT_OUT, Coverage, Liveness, coverage, liveness
from xla_harness.hlo.memplan.liverange import compare
from xla_harness.hlo.memplan.model import Plan, plan_of
from xla_harness.hlo.memplan.report import Finding, Report
from xla_harness.hlo.memplan.rules import RULE_FUNCTIONS, RULES, Buffers, group
from xla_harness.hlo.parser import parse_module
from xla_harness.hlo.timeline import parse_live_range

__all__ = ["LEFT_OUT", "RULES", "RULE_FUNCTIONS", "Buffers", "Coverage", "Finding", "Flow", "Liveness", "Plan",
           "Report", "backend_of", "beside", "check_files", "check_module", "check_texts", "gunzip", "read_text",
           "stages"]


def stages(module: HloModule, ba: BufferAssignment, backend: str = "cpu",
           disabled: frozenset[str] = frozenset()) -> checks.Stages:
    """Plan, dataflow, grouping (every rule but ``disabled``) and liveness of a module and its buffer
    assignment, each stage from the previous ones' results."""
    plan = plan_of(module, ba, backend)
    flow = dataflow(plan)
    return checks.Stages(plan, flow, group(plan, flow, disabled), liveness(plan, flow))


def check_texts(hlo: str, ba_text: str, live_range: str | None = None, name: str = "<string>",
                backend: str = "", disabled: frozenset[str] = frozenset(),
                names: tuple[str, str, str] | None = None) -> Report:
    """memcheck of a dump's texts: ``names`` the module's, buffer assignment's and live range's file
    names for the errors (default: ``name`` and what it is)."""
    t0 = time.perf_counter()
    n_mod, n_ba, n_lr = names or (name, f"{name} (buffer assignment)", f"{name} (live range)")
    module = parse_module(hlo, n_mod)
    inputs.check_buffer_text(ba_text, n_ba)
    ba = parse_buffer_assignment(ba_text, n_ba)
    return check_module(module, ba, live_range, name, backend, disabled, t0, ba_text=ba_text, names=(n_ba, n_lr))


def check_module(module: HloModule, ba: BufferAssignment, live_range: str | None = None, name: str = "<string>",
                 backend: str = "", disabled: frozenset[str] = frozenset(), t0: float | None = None,
                 ba_text: str | None = None, names: tuple[str, str] | None = None) -> Report:
    """memcheck of a parsed module and its buffer assignment (and the compiler's live-range text, where
    dumped); ``t0``: when the work began (the report's seconds count from there). With ``ba_text`` the
    buffer assignment is held to the module first (:func:`inputs.check_one_compile`)."""
    t0 = time.perf_counter() if t0 is None else t0
    n_ba, n_lr = names or (f"{name} (buffer assignment)", f"{name} (live range)")
    s = stages(module, ba, backend or backend_of(module, name), disabled)
    if ba_text is not None:
        inputs.check_one_compile(s, ba_text, n_ba)
    cover = coverage(s.plan, s.live)
    if cover.timed == 0:
        raise HarnessError(f"{name}: no value of the buffer assignment is defined in the module's schedule "
                           "(a buffer assignment of another module?)")
    dump = parse_live_range(live_range, n_lr) if live_range is not None else None
    if dump is not None:
        inputs.check_live_range(dump, s.plan.tl, n_lr)
    pairs, found = checks.overlap(s)
    found += checks.in_place(s)
    windows, in_flight = checks.async_windows(s)
    cmp = compare(s.plan, s.buffers, s.live, dump) if dump is not None else None
    return Report(name, cover, len(ba.allocations), windows, pairs, found + in_flight,
                  cmp.disagreements if cmp else [], cmp.compared if cmp else -1, cmp.unprinted_ends if cmp else [],
                  s.buffers.rules_used, s.buffers.aliasing_not_taken, time.perf_counter() - t0)


def check_files(module_path: Path) -> Report:
    """memcheck of a module file with its buffer assignment (and live range, when dumped) beside it."""
    ba = beside(module_path, "buffer-assignment")
    if ba is None:
        raise HarnessError(f"{module_path}: no buffer assignment beside it (…-buffer-assignment.txt)")
    lr = beside(module_path, "live-range")
    return check_texts(read_text(module_path), read_text(ba), read_text(lr) if lr else None, str(module_path),
                       names=(str(module_path), str(ba), str(lr)))
