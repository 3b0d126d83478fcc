"""The options of a built-in program, each declared once (name, what it takes, a line of help), and
the one validator every way into the program goes through.

A program module declares its table beside its factory and wraps the factory with it::

    OPTIONS = OptionTable("issue-35409", (
        Option("remat", boolean(), "each used layer under jax.checkpoint"),
        Option("jit", choice("step", "bare", "nested"), "where jax.jit sits"),
        ...
    ))

    @OPTIONS.checked
    def make(remat: bool = True, jit: str = "step", ...): ...

Adding an option is one line in the table and one parameter of the factory (a test holds the two
equal). ``--program-option KEY=VALUE`` reads VALUE as a Python literal (else a string), so
``remat=off`` arrives as the text ``"off"``: every value is checked by type and range, and
anything else is one :class:`HarnessError` naming the program, the option and what it takes.
Nothing is coerced silently (``int(1.5)``, ``bool("off")``); what passes is returned normalized
(a list pair as a tuple). No jax here: the command line checks a built-in's options before jax
starts (:func:`xla_harness.programs.interface.check_program_options`).
"""

from __future__ import annotations

import ast
import functools
import inspect
import math
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from xla_harness.errors import HarnessError

Check = Callable[[Any], Any]  # value -> normalized value; ValueError(what it takes) otherwise


def _is_int(v) -> bool:
    """An integer (numpy's too), never a bool."""
    if isinstance(v, bool) or type(v).__name__ == "bool_":
        return False
    try:
        return int(v.__index__()) == v
    except (AttributeError, TypeError):
        return False


def _is_number(v) -> bool:
    if isinstance(v, bool) or type(v).__name__ == "bool_":
        return False
    return _is_int(v) or isinstance(v, float) or type(v).__name__ in ("float32", "float64", "float16")


def boolean() -> Check:
    def check(v):
        if isinstance(v, bool) or type(v).__name__ == "bool_":
            return bool(v)
        raise ValueError("True or False")
    return check


def integer(low: int = 1) -> Check:
    def check(v):
        if _is_int(v) and int(v) >= low:
            return int(v)
        raise ValueError(f"an integer >= {low}")
    return check


def number(low: float = 0.0, high: float = math.inf, low_open: bool = True) -> Check:
    """A finite number in (low, high] (or [low, high] with ``low_open=False``)."""
    def check(v):
        if _is_number(v):
            f = float(v)
            if math.isfinite(f) and (f > low if low_open else f >= low) and f <= high:
                return v if _is_int(v) else f
        where = f"{'(' if low_open else '['}{low:g}, {high:g}]" if math.isfinite(high) else \
            f"{'>' if low_open else '>='} {low:g}"
        raise ValueError(f"a finite number {'in ' if math.isfinite(high) else ''}{where}")
    return check


def choice(*allowed: str) -> Check:
    def check(v):
        if isinstance(v, str) and v in allowed:
            return v
        raise ValueError(f"one of {', '.join(allowed)}")
    return check


def int_pair(what: str, ordered: bool = False) -> Check:
    """A pair of integers >= 1 (a tuple or list); ``ordered``: the first at most the second."""
    def check(v):
        if isinstance(v, tuple | list) and len(v) == 2 and all(_is_int(x) and int(x) >= 1 for x in v):
            pair = (int(v[0]), int(v[1]))
            if not ordered or pair[0] <= pair[1]:
                return pair
        raise ValueError(f"a pair of integers >= 1 ({what})")
    return check


def optional(inner: Check) -> Check:
    def check(v):
        return None if v is None else inner(v)
    check.__doc__ = inner.__doc__
    return check


def device_count_or_list() -> Check:
    """A device count (an integer >= 1) or a non-empty list of devices (a compile target's)."""
    def check(v):
        if _is_int(v) and int(v) >= 1:
            return int(v)
        if isinstance(v, list | tuple) and v and all(hasattr(d, "platform") and hasattr(d, "id") for d in v):
            return list(v)
        raise ValueError("a device count (an integer >= 1) or a list of devices")
    return check


@dataclass(frozen=True)
class Option:
    name: str
    check: Check
    help: str = ""


def _shown(v) -> str:
    text = repr(v)
    return text if len(text) <= 80 else text[:77] + "..."


@dataclass(frozen=True)
class OptionTable:
    """A program's options (:class:`Option`), by name."""

    program: str
    options: tuple[Option, ...]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(o.name for o in self.options)

    def validate(self, given: Mapping[str, Any]) -> dict:
        """``given`` checked and normalized; HarnessError naming the first option that is unknown or
        whose value its check refuses."""
        table = {o.name: o for o in self.options}
        out = {}
        for key, value in given.items():
            opt = table.get(key)
            if opt is None:
                raise HarnessError(f"--program {self.program}: unknown option {key!r}; it takes "
                                   f"{', '.join(self.names)}")
            try:
                out[key] = opt.check(value)
            except ValueError as exc:
                raise HarnessError(f"--program {self.program}: option {key} must be {exc}, got {_shown(value)}") \
                    from None
        return out

    def checked(self, factory: Callable) -> Callable:
        """``factory`` with every option it is given validated first (:meth:`validate`); the defaults
        are the factory's own."""
        sig = inspect.signature(factory)

        @functools.wraps(factory)
        def wrapper(*args, **kwargs):
            unknown = [k for k in kwargs if k not in sig.parameters]
            if unknown:
                self.validate({unknown[0]: kwargs[unknown[0]]})  # raises: names what it takes
            try:
                bound = sig.bind(*args, **kwargs)
            except TypeError as exc:
                raise HarnessError(f"--program {self.program}: {exc}") from None
            return factory(**self.validate(bound.arguments))

        wrapper.options = self  # type: ignore[attr-defined]
        return wrapper


def literal_option(text: str) -> tuple[str, Any]:
    """``KEY=VALUE`` as --program-option reads it: VALUE a Python literal, else the text itself;
    ValueError for text that is not ``KEY=VALUE``."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise ValueError(f"expected KEY=VALUE, got {text!r}")
    try:
        parsed = ast.literal_eval(value)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        parsed = value
    return key.strip(), parsed


def main(argv: list[str]) -> int:
    """``python -m xla_harness.programs.options PROGRAM KEY=VALUE...``: the options of one configuration
    of a built-in checked against its table (what make tpu-matrix/tpu-sweep do for every entry before
    anything is created or compiled); one ``error:`` line and exit 2 when one is refused."""
    from xla_harness.programs.interface import BUILTIN_OPTION_TABLES, check_program_options

    if not argv or argv[0] not in BUILTIN_OPTION_TABLES:
        sys.stderr.write(f"error: usage: python -m xla_harness.programs.options PROGRAM KEY=VALUE... (PROGRAM one "
                         f"of {', '.join(BUILTIN_OPTION_TABLES)})\n")
        return 2
    options: dict[str, Any] = {}
    try:
        for text in argv[1:]:
            try:
                key, value = literal_option(text)
            except ValueError as exc:
                raise HarnessError(str(exc)) from None
            if key in options and options[key] != value:
                raise HarnessError(f"{key} is given twice ({options[key]!r} and {value!r})")
            options[key] = value
        check_program_options(argv[0], options)
    except HarnessError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
