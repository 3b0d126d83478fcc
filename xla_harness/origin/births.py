"""What an op-by-op evaluation of a step reports (:mod:`~xla_harness.origin.eager` makes it): each
equation's place (:class:`Site`, its :class:`SourceLine` frames), the births of non-finite values
(:class:`Birth`, with each :class:`Operand` at the first non-finite element) and the
:class:`Evaluation` holding them; and a float as JSON gives it (:func:`json_float`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class SourceLine:
    """One frame of the Python stack that traced an equation."""

    file: str
    line: int
    function: str

    def text(self) -> str:
        return f"{self.file}:{self.line} ({self.function})"

    def to_json(self) -> dict:
        return {"file": self.file, "line": self.line, "function": self.function}


@dataclass(frozen=True)
class Site:
    """An equation: its path of indices through the nesting, its primitive, its source lines."""

    path: tuple[int, ...]
    primitive: str
    frames: tuple[SourceLine, ...]  # innermost first; jax's own and the standard library's left out


@dataclass
class Operand:
    """An operand of a birth, at the first non-finite element of the birth's output."""

    finite: bool
    value: float | None  # the operand's element there (a scalar operand's value; None: shapes differ)
    producer: Site | None  # the equation that made it (None: an input of the step, a literal)
    literal: bool = False

    def to_json(self) -> dict:
        return {"finite": self.finite, "value": json_float(self.value), "literal": self.literal,
                "producer": {"primitive": self.producer.primitive, "path": list(self.producer.path)}
                if self.producer is not None else None}


@dataclass
class Birth:
    """Where a non-finite value first appeared along one chain: an equation's output that is not
    finite although its operands are (or that holds a NaN although its operands hold none)."""

    order: int  # position in evaluation order
    site: Site
    kind: str  # "nan", "inf" or "-inf": the first non-finite element's
    index: tuple[int, ...]  # of that element in the output
    count: int  # non-finite elements in the output
    size: int  # elements in the output
    operands: list[Operand]
    output: int = 0  # which result of a multi-result equation
    nan_from_inf: bool = False  # a NaN made of infinities (inf - inf, 0 * inf), not of finite numbers
    masked_by: Site | None = None  # the select whose zero cotangent met an infinite derivative
    from_constant: bool = False  # its non-finite value is a constant the program holds (jnp.nan, jnp.inf)

    def to_json(self) -> dict:
        return {"primitive": self.site.primitive, "path": list(self.site.path), "kind": self.kind,
                "index": list(self.index), "count": self.count, "size": self.size,
                "operands": [o.to_json() for o in self.operands], "nan_from_inf": self.nan_from_inf,
                "from_constant": self.from_constant}


@dataclass
class Evaluation:
    """What one op-by-op evaluation found."""

    outputs: list  # the step's flat outputs (host arrays)
    nonfinite: list[int]  # indices of the checked outputs that are not finite
    births: list[Birth]  # the births the non-finite checked outputs descend from, in evaluation order
    captured: dict[tuple[int, ...], tuple[list, list]] = field(default_factory=dict)  # path -> (operands, results)
    equations: int = 0  # equations evaluated (entered bodies counted equation by equation)
    inputs: list[int] = field(default_factory=list)  # the non-finite arguments the non-finite outputs descend from

    @property
    def finite(self) -> bool:
        return not self.nonfinite

    @property
    def first(self) -> Birth | None:
        return self.births[0] if self.births else None

    @property
    def first_nan(self) -> Birth | None:
        """The earliest birth of a NaN (``0 * inf``, ``0 / 0``), where it differs from :attr:`first`."""
        return next((b for b in self.births if b.kind == "nan"), None)


def json_float(x: float | None):
    if x is None:
        return None
    if np.isnan(x):
        return "nan"
    if np.isinf(x):
        return "inf" if x > 0 else "-inf"
    return float(x)
