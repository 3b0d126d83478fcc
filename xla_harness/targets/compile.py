"""A program's training step compiled for a target: abstract state in, the compiler's output out.

The state is never built: ``jax.eval_shape`` of the program's ``init`` and ``batch`` gives each
leaf's shape, dtype, weak type and sharding, and a leaf the program left unplaced is put on the
target's first device. The step is then lowered and compiled exactly as the program jits it
(:meth:`~xla_harness.programs.interface.TrainProgram.jit`: donation, shardings and compiler options
as given) for the target's devices, so the HLO is what the target's own compiler decided.
"""

from __future__ import annotations

import glob
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from xla_harness.errors import HarnessError
from xla_harness.hlo.buffers import values_path
from xla_harness.programs.interface import TrainProgram, guard_user_error
from xla_harness.runtime import interrupts
from xla_harness.targets.spec import Target


@dataclass
class CompiledStep:
    """What the target's compiler made of the step."""

    target: Target
    compiled: Any  # jax.stages.Compiled
    hlo_text: str  # optimized HLO, as the compiler prints it
    buffer_assignment: str | None  # the compiler's buffer assignment dump, when it wrote one
    cpu_seconds: float  # process CPU time of lowering + compiling
    device_kind: str
    # The values file dumped beside the buffer assignment (``*-buffer-assignment-values.txt``): which
    # value each operand of each instruction reads, by the compiler's own dataflow; None when absent.
    buffer_values: str | None = None
    # The compiler's own live range (``*-live-range.txt``: its flattened schedule and each value's
    # interval; CPU and GPU write it, libtpu does not): what memcheck compares its timeline with.
    live_range: str | None = None


def _platform(sharding) -> str | None:
    devices = getattr(sharding, "device_set", None)
    if not devices:
        return None
    return next(iter(devices)).platform


def abstract_arguments(program: TrainProgram, devices: list, program_name: str | None = None,
                       place_unplaced: bool = True) -> tuple:
    """``(params, opt_state, batch)`` of ``program`` as ``jax.ShapeDtypeStruct``s (nothing computed):
    shardings as the program placed them, unplaced leaves on ``devices[0]`` (``place_unplaced``; on
    the host they stay unplaced, as the arrays of a real run are: uncommitted, so the step compiles
    exactly as it runs); HarnessError when the program put its state on devices of another platform
    than the target's (it ignored ``devices=``)."""
    import jax
    from jax.sharding import SingleDeviceSharding

    name = program_name or program.name
    key = jax.random.key(0)
    try:
        state = jax.eval_shape(program.init, key)
        batch = jax.eval_shape(program.batch, key, 0)
    except BaseException as e:  # noqa: BLE001 - the user's code: one error line
        raise guard_user_error(e, name, "tracing init/batch for the target") from e
    if not isinstance(state, tuple | list) or len(state) != 2:
        raise HarnessError(f"--program {name}: init must return (params, opt_state)")
    placed_by_jit = "in_shardings" in program.jit_kwargs
    want = devices[0].platform

    def place(x):
        sharding = getattr(x, "sharding", None)
        platform = _platform(sharding)
        if platform is not None and platform != want:
            raise HarnessError(f"--program {name}: its state is placed on {platform} devices, not on the target's "
                               f"{want} devices; a program compiled for a target must build its shardings on the "
                               "devices it is given (a factory taking devices=)")
        if sharding is None and not placed_by_jit and place_unplaced:
            sharding = SingleDeviceSharding(devices[0])
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding, weak_type=getattr(x, "weak_type", False))

    params, opt_state = (jax.tree_util.tree_map(place, t) for t in state)
    return params, opt_state, jax.tree_util.tree_map(place, batch)


def _buffer_assignment(dump: Path) -> tuple[str | None, str | None, str | None]:
    """The buffer assignment the compiler dumped for the optimized module (the last one written: the
    step's own), the values file XLA writes beside it (``X-buffer-assignment-values.txt``) and its live
    range (``X-live-range.txt``); None for each that is not there."""
    found = sorted(glob.glob(str(dump / "*after_optimizations-buffer-assignment.txt")))
    if not found:
        return None, None, None
    path = Path(found[-1])
    values = values_path(path)
    live = Path(str(path).replace("-buffer-assignment.txt", "-live-range.txt"))
    return (path.read_text(encoding="utf-8", errors="replace"),
            values.read_text(encoding="utf-8", errors="replace") if values.is_file() else None,
            live.read_text(encoding="utf-8", errors="replace") if live.is_file() else None)


def lower_step(program: TrainProgram, target: Target, devices: list, program_name: str | None = None):
    """``program``'s step lowered for ``target`` from abstract state (``jax.stages.Lowered``), jitted as
    the program jits it except for its ``compiler_options`` (:func:`compile_step` passes them)."""
    import jax

    args = abstract_arguments(program, devices, program_name, place_unplaced=not target.is_host)
    kwargs = {k: v for k, v in program.jit_kwargs.items() if k != "compiler_options"}
    try:
        return jax.jit(program.step, donate_argnums=program.donate_argnums, **kwargs).lower(*args)
    except BaseException as e:  # noqa: BLE001 - tracing runs the user's step
        raise guard_user_error(e, program_name or program.name, "tracing step for the target") from e


def compile_step(program: TrainProgram, target: Target, devices: list, *, dump_to: Path | None = None,
                 program_name: str | None = None, autotune_to: str | None = None) -> CompiledStep:
    """Lower and compile ``program``'s step for ``target`` (its ``devices``). With ``dump_to`` the
    compiler's own dump (HLO before/after optimizations, buffer assignment and its values file) is
    written there; either way the buffer assignment and its values file are kept in the result. With
    ``autotune_to`` (a compile on a real GPU) the device's autotuner writes what it chose there
    (XLA's ``xla_gpu_dump_autotune_results_to``, for this compile only)."""
    from xla_harness.targets.devices import DUMP_AUTOTUNE_FLAG, device_kind

    options = dict(program.jit_kwargs.get("compiler_options") or {})
    if autotune_to is not None:
        options[DUMP_AUTOTUNE_FLAG] = autotune_to
    t0 = time.process_time()
    with tempfile.TemporaryDirectory(prefix="xla-harness-aot-") as tmp:
        dump = Path(dump_to) if dump_to is not None else Path(tmp)
        dump.mkdir(parents=True, exist_ok=True)
        options.update({"xla_dump_to": str(dump), "xla_dump_hlo_as_text": True})
        lowered = lower_step(program, target, devices, program_name)
        where = f"compiling {program_name or program.name} for {target.text}"
        try:
            compiled = lowered.compile(compiler_options=options)
        except interrupts.Interrupted as exc:
            exc.arrived_while(where)
            raise
        except Exception as exc:  # noqa: BLE001 - a compiler refusal is a verdict on this program and target
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:400]
            signum = interrupts.received()
            if signum is not None:  # a signal killed the compiler's children (ptxas): the signal's doing
                raise interrupts.Interrupted(signum, where, f"{type(exc).__name__}: {first}") from exc
            raise HarnessError(f"{target.text}: the compiler failed on {program_name or program.name}: {first}") \
                from None
        text = compiled.as_text()
        ba, values, live_range = _buffer_assignment(dump)
    seconds = time.process_time() - t0
    _check_platform(compiled, target, devices)
    return CompiledStep(target, compiled, text, ba, seconds, device_kind(devices), values, live_range)


def _check_platform(compiled, target: Target, devices: list) -> None:
    """The executable is for the target's platform (a program whose jit pins other devices is refused)."""
    if target.is_host:
        return
    shardings = getattr(compiled, "input_shardings", None)
    leaves = []
    if shardings is not None:
        import jax

        leaves = jax.tree_util.tree_leaves(shardings)
    platforms = {p for p in (_platform(s) for s in leaves) if p}
    want = devices[0].platform
    if platforms and platforms != {want}:
        raise HarnessError(f"{target.text}: the step compiled for {', '.join(sorted(platforms))}, not {want}")


def environment(target: Target, devices: list) -> dict:
    """What a compiled result records about its target: the text, device kind and count, versions."""
    from xla_harness.targets.devices import compiler_versions, device_kind

    return {"target": target.text, "device_kind": device_kind(devices), "target_devices": len(devices),
            "versions": compiler_versions(target), "XLA_FLAGS": os.environ.get("XLA_FLAGS", "")}
