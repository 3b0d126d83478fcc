"""The program interface: what a user implements in their own file so the harness can stress it.

A program is a training step exactly as the user compiles it, plus how to make its inputs::

    from xla_harness.programs.interface import TrainProgram, step_from_loss

    def init(key):                      # -> (params, opt_state), pytrees of arrays
        params = ...
        return params, optimizer.init(params)

    def batch(key, step):               # -> the step's third argument (any pytree of arrays)
        return jax.random.randint(key, (8, 128), 0, 1000)

    program = TrainProgram(name="my-model", init=init, batch=batch,
                           step=step_from_loss(loss_fn, optimizer))

``step(params, opt_state, batch) -> (new_params, new_opt_state, aux)`` is the user's own step;
``aux`` is a dict holding at least ``"loss"`` (and ``"grads"``/``"updates"`` when the user wants
them checked). The harness jits ``step`` the way the user does (``donate_argnums`` as given, no
ops inserted) and checks its outputs with a separate jitted checker, so the measured program is
the user's, unchanged.

``--program`` names one: a built-in (``tied-embedding``), ``path/to/file.py:name`` or
``package.module:name``; the object is a :class:`TrainProgram` or a callable returning one.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import json
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from xla_harness.errors import HarnessError
from xla_harness.names import BUILTIN_PROGRAM
from xla_harness.runtime import interrupts

if TYPE_CHECKING:
    from jax.stages import Wrapped


@dataclass(frozen=True)
class TrainProgram:
    """A user's training step and how to make its state and inputs."""

    name: str
    init: Callable[[Any], tuple[Any, Any]]  # init(key) -> (params, opt_state)
    batch: Callable[[Any, int], Any]  # batch(key, step) -> batch pytree
    step: Callable[[Any, Any, Any], tuple[Any, Any, dict]]  # (params, opt_state, batch) -> (p, o, aux)
    donate_argnums: tuple[int, ...] = (0, 1)
    jit_kwargs: dict = field(default_factory=dict)  # e.g. in_shardings/out_shardings, as the user jits
    options: dict = field(default_factory=dict)  # the sizes/flags it was built with (recorded in results)
    # The parameter leaf (jax keystr path, e.g. "['embed']") that injected faults corrupt;
    # None: the largest floating-point leaf.
    target_leaf: str | None = None

    def jit(self) -> Wrapped:
        """The step compiled as the user compiles it: same donation, same shardings, nothing added."""
        import jax

        return jax.jit(self.step, donate_argnums=self.donate_argnums, **self.jit_kwargs)


def step_from_loss(loss_fn: Callable[[Any, Any], Any], optimizer) -> Callable:
    """The plain optax training step for ``loss_fn(params, batch) -> scalar``."""
    import jax
    import optax

    def step(params, opt_state, batch):
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        updates, new_opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), new_opt_state, {"loss": loss}

    return step


def label(config: Mapping[str, Any], program: str = BUILTIN_PROGRAM) -> str:
    """The run label of a configuration (rows of every table): the built-in program's
    ``mode/remat=on|off/dtype`` (``...[variant=NAME]`` in a ``--variants`` run); any other
    program's ``PROGRAM[key=value,...]`` (the variant is one of its keys)."""
    if program == BUILTIN_PROGRAM:
        remat = config.get("remat", True)
        text = f"{config.get('mode', 'full')}/remat={'on' if remat else 'off'}/{config.get('dtype', 'f32')}"
        return text + (f"[variant={config['variant']}]" if "variant" in config else "")
    # Values as the results file holds them (a tuple option is a JSON list), so the label of a
    # block and the one derived from the header's spec agree.
    extra = ",".join(f"{k}={json.loads(json.dumps(v))}" for k, v in sorted(config.items()))
    return program + (f"[{extra}]" if extra else "")


BUILTINS: dict[str, str] = {
    # name -> "module:factory"; each factory takes keyword options and returns a TrainProgram
    BUILTIN_PROGRAM: "xla_harness.programs.tied_embedding:program",
    "issue-35409": "xla_harness.programs.issue_35409:make",
}


# Built-ins whose option table (:mod:`xla_harness.programs.options`) is read without importing jax: the
# command line checks --program-option against it before anything starts.
BUILTIN_OPTION_TABLES: dict[str, str] = {
    "issue-35409": "xla_harness.programs.issue_35409:OPTIONS",
}


def check_program_options(spec_text: str, options: Mapping[str, Any]) -> dict:
    """``options`` of ``--program spec_text`` checked against the program's option table where it is a
    built-in with one (HarnessError naming the option otherwise); any other program's options are its
    own factory's to judge, when it is built."""
    ref = BUILTIN_OPTION_TABLES.get(spec_text)
    if ref is None:
        return dict(options)
    module, attr = ref.split(":")
    return getattr(importlib.import_module(module), attr).validate(options)


class ProgramExited(SystemExit):
    """Raised in place of ``os._exit`` when the user's program calls it in the harness's own process
    (:func:`process_exit_guarded`): the program may end the work it is given, never the process that
    measures it, which would stop with its results cut short and exit with the program's code."""

    def __str__(self) -> str:
        return f"os._exit({self.code!r})"


@contextlib.contextmanager
def process_exit_guarded():
    """While the CLI runs a command, ``os._exit`` called from outside ``xla_harness`` in this process
    raises :class:`ProgramExited` (one error line naming the program, exit 2) instead of ending the
    process unmeasured. A forked child (its pid is not this one) and the harness's own calls (a signal
    that must end the process at once) exit as before; on leaving, ``os._exit`` is restored."""
    real = os._exit
    pid = os.getpid()

    def guard(code: int) -> None:
        caller = sys._getframe(1).f_globals.get("__name__") or ""
        if os.getpid() != pid or caller == "xla_harness" or caller.startswith("xla_harness."):
            real(code)
        raise ProgramExited(code)

    os._exit = guard
    try:
        yield
    finally:
        os._exit = real


def _describe(exc: BaseException) -> str:
    """``Type: first line of the message`` (``SystemExit(0)``-style for an exit)."""
    if isinstance(exc, ProgramExited):
        return str(exc)
    if isinstance(exc, SystemExit):
        return f"SystemExit({exc.code!r})"
    first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
    return type(exc).__name__ + (f": {first}" if first else "")


def _signals_noted() -> bool:
    """Whether this process is the CLI with its SIGINT handler in place: then every Ctrl-C is recorded
    (:func:`xla_harness.runtime.interrupts.received`) and a KeyboardInterrupt no signal left a record of is a
    program's own."""
    import signal

    from xla_harness import _early

    return _early.cli_process and signal.getsignal(signal.SIGINT) not in (signal.default_int_handler,
                                                                        signal.SIG_DFL)


def guard_user_error(exc: BaseException, spec_text: str, doing: str) -> HarnessError:
    """The HarnessError for anything the user's code raised while ``doing`` (importing, building, calling
    init/batch/step): a SystemExit, a BaseException subclass or an ordinary error all become one line
    naming the program. An interrupt wins: once SIGINT/SIGTERM has arrived
    (:func:`xla_harness.runtime.interrupts.received`), whatever was raised (a compiler whose child the signal
    killed: ``ptxas exited with non-zero error code 15``) is raised as
    :class:`~xla_harness.runtime.interrupts.Interrupted` saying where (exit 130/143). A KeyboardInterrupt
    that no signal caused (the CLI notes every SIGINT, and none arrived) is the program's own raise,
    an error like any other; elsewhere (a library user's process, where a Ctrl-C is a plain
    KeyboardInterrupt) it and HarnessError are re-raised as they are."""
    where = f"--program {spec_text} was in {doing}"
    if isinstance(exc, interrupts.Interrupted):
        exc.arrived_while(where)
        raise exc
    signum = interrupts.received()
    if signum is not None:
        caused = "" if isinstance(exc, KeyboardInterrupt) else _describe(exc)
        raise interrupts.Interrupted(signum, where, caused) from exc
    if isinstance(exc, KeyboardInterrupt) and _signals_noted():
        return HarnessError(f"--program {spec_text}: {doing} raised KeyboardInterrupt (no interrupt arrived: the "
                            "program raised it itself)")
    if isinstance(exc, KeyboardInterrupt | HarnessError):
        raise exc
    if isinstance(exc, ProgramExited):
        return HarnessError(f"--program {spec_text}: {doing} called {exc}, which would have ended the harness's "
                            "process with its results cut short")
    return HarnessError(f"--program {spec_text}: {doing} raised {_describe(exc)}")


def _import_attr(module_part: str, attr: str, spec_text: str):
    if module_part.endswith(".py") or "/" in module_part:
        path = Path(module_part)
        if not path.is_file():
            raise HarnessError(f"--program {spec_text}: no such file {path}")
        mod_name = f"_harness_program_{abs(hash(str(path.resolve())))}"
        spec = importlib.util.spec_from_file_location(mod_name, path)
        if spec is None or spec.loader is None:
            raise HarnessError(f"--program {spec_text}: cannot load {path} as Python")
        module = importlib.util.module_from_spec(spec)
        sys.modules[mod_name] = module
        _importable_beside(path)
        try:
            spec.loader.exec_module(module)
        except BaseException as e:  # noqa: BLE001 - the user's file: report, never a traceback or an exit
            sys.modules.pop(mod_name, None)
            raise guard_user_error(e, spec_text, f"importing {path}") from e
    else:
        try:
            module = importlib.import_module(module_part)
        except BaseException as e:  # noqa: BLE001
            if isinstance(e, Exception):
                raise HarnessError(f"--program {spec_text}: cannot import {module_part}: {_describe(e)}") from e
            raise guard_user_error(e, spec_text, f"importing {module_part}") from e
    try:
        return getattr(module, attr)
    except AttributeError:
        raise HarnessError(f"--program {spec_text}: {module_part} has no attribute {attr!r}") from None
    except BaseException as e:  # noqa: BLE001 - a module __getattr__ of the user's
        raise guard_user_error(e, spec_text, f"looking up {attr}") from e


def _importable_beside(path: Path) -> None:
    """The folder of a program file first on ``sys.path``, as ``python FILE.py`` puts it there: a
    program split over several files imports its siblings (``from model import ...``), when it is
    loaded and when its functions run later."""
    folder = str(path.resolve().parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)


def program_factory(spec_text: str) -> Callable[..., TrainProgram]:
    """``--program`` as a function of keyword options (what workaround variants need: they call it
    with ``variant=``; a name bound to a TrainProgram object takes no options: TypeError)."""
    module_part, attr = _split_spec(spec_text)
    obj = _import_attr(module_part, attr, spec_text)

    def make(**options) -> TrainProgram:
        if isinstance(obj, TrainProgram) and options:
            raise TypeError(f"{attr} is a TrainProgram object, not a factory taking {', '.join(options)}")
        return _instantiate(obj, attr, spec_text, options)

    make.__wrapped__ = obj  # type: ignore[attr-defined]  # inspect.signature(make) is the factory's own
    return make


def _split_spec(spec_text: str) -> tuple[str, str]:
    if spec_text in BUILTINS:
        module_part, attr = BUILTINS[spec_text].split(":")
        return module_part, attr
    if ":" in spec_text:
        module_part, attr = spec_text.rsplit(":", 1)
        if not module_part or not attr:
            raise HarnessError(f"--program {spec_text}: expected FILE.py:NAME or MODULE:NAME")
        return module_part, attr
    raise HarnessError(f"--program {spec_text}: not a built-in ({', '.join(sorted(BUILTINS)) or 'none'}) "
                       "and not FILE.py:NAME or MODULE:NAME")


def load_program(spec_text: str, **options) -> TrainProgram:
    """Resolve ``--program`` to a TrainProgram (built-in name, ``file.py:name`` or ``module:name``)."""
    module_part, attr = _split_spec(spec_text)
    return _instantiate(_import_attr(module_part, attr, spec_text), attr, spec_text, options)


def _instantiate(obj, attr: str, spec_text: str, options: dict) -> TrainProgram:
    if not isinstance(obj, TrainProgram):
        if not callable(obj):
            raise HarnessError(f"--program {spec_text}: {attr} is neither a TrainProgram nor a callable")
        try:
            obj = obj(**options)
        except TypeError as e:
            raise HarnessError(f"--program {spec_text}: {attr}({', '.join(options)}) failed: {e}") from e
        except BaseException as e:  # noqa: BLE001 - SystemExit, KeyboardInterrupt (re-raised), the user's own
            raise guard_user_error(e, spec_text, f"building the program ({attr})") from e
    if not isinstance(obj, TrainProgram):
        raise HarnessError(f"--program {spec_text}: {attr} returned {type(obj).__name__}, not a TrainProgram")
    return obj
