"""HLO shapes as XLA prints them, read into an immutable :class:`Shape`.

``f32[2,3]{1,0}``, nested tuples, ``b(...)`` buffers, dynamic dims, layouts with tiles and
memory spaces (``{1,0:T(8,128)S(1)}``). A :class:`ShapeTable` holds the shapes one parse
has read by their text (the reader makes one per parse; nothing here is kept between calls).
Tuples are read with an explicit stack: no recursion on the input's nesting.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from xla_harness.hlo.lexer import ws_end


@dataclass(frozen=True)
class Shape:
    """An array shape (element type, dims, layout), a tuple of shapes, or a buffer."""

    element_type: str
    dims: tuple[int, ...] = ()
    minor_to_major: tuple[int, ...] | None = None  # None: no layout printed
    tuple_shapes: tuple[Shape, ...] | None = None
    layout_extra: str = ""  # tiles, memory space etc. as printed after ':'
    is_buffer: bool = False  # b(f32[...]): a buffer holding an array of this shape

    @property
    def is_tuple(self) -> bool:
        return self.tuple_shapes is not None

    def subshape(self, index: tuple[int, ...]) -> Shape:
        s = self
        for i in index:
            subs = s.tuple_shapes
            if subs is None or i >= len(subs):
                raise IndexError(f"shape index {index} out of range")
            s = subs[i]
        return s

    def leaves(self, prefix: tuple[int, ...] = ()) -> list[tuple[tuple[int, ...], Shape]]:
        """(shape index, array shape) of every leaf, in order (no recursion)."""
        if self.tuple_shapes is None:
            return [(prefix, self)]
        out: list[tuple[tuple[int, ...], Shape]] = []
        stack: list[tuple[tuple[int, ...], Shape]] = [(prefix, self)]
        while stack:
            index, s = stack.pop()
            if s.tuple_shapes is not None:
                stack.extend((index + (i,), sub) for i, sub in reversed(list(enumerate(s.tuple_shapes))))
            else:
                out.append((index, s))
        return out

    def layout_or_default(self) -> tuple[int, ...]:
        """minor_to_major, or XLA's default descending layout when none was printed."""
        if self.minor_to_major is not None:
            return self.minor_to_major
        return tuple(range(len(self.dims) - 1, -1, -1))

    def __str__(self) -> str:
        if self.tuple_shapes is not None:
            return "(" + ", ".join(str(s) for s in self.tuple_shapes) + ")"
        dims = ",".join(str(d) for d in self.dims)
        lay = ""
        if self.minor_to_major is not None:
            lay = "{" + ",".join(str(d) for d in self.minor_to_major) + (
                ":" + self.layout_extra if self.layout_extra else "") + "}"
        text = f"{self.element_type}[{dims}]{lay}"
        return f"b({text})" if self.is_buffer else text


_DIM_RE = re.compile(r"<?=?(\d+|\?)")
_DIMS_OK = re.compile(r"\s*(?:<=)?\s*(?:\d+|\?)\s*(?:,\s*(?:<=)?\s*(?:\d+|\?)\s*)*")
# An array shape with an optional layout (no nested braces inside a layout), in one match.
_ARRAY_FAST = re.compile(r"([a-z][a-z0-9]*)\s*\[([^\]]*)\](?:\s*\{(?=\s*[\d}:])([^}:]*)(?::([^}]*))?\})?")
_MAX_DIM = 2**63 - 1


class ShapeTable:
    """The shapes one parse has read, by their printed text: ``arrays`` (array shapes, as any
    reader of the parse meets them) and ``tuples`` (the flat tuple shapes of one-line
    instructions and of computation signatures). Made fresh for each parse and handed to what
    reads shapes in it (a parse never sees another's); Shape is immutable, so a text read
    again gives the same object. Each part holds at most ``LIMIT`` shapes."""

    __slots__ = ("arrays", "tuples")
    LIMIT = 100_000

    def __init__(self) -> None:
        self.arrays: dict[str, Shape] = {}
        self.tuples: dict[str, Shape] = {}

    def get(self, text: str) -> Shape | None:
        """The shape read before from exactly this text (array or tuple); None if none was."""
        return self.arrays.get(text) or self.tuples.get(text)

    def remember_tuple(self, text: str, shape: Shape) -> None:
        """Keep a tuple shape by its text (ignored once the table holds ``LIMIT`` of them)."""
        if len(self.tuples) < self.LIMIT:
            self.tuples[text] = shape


def array_shape(text: str, i: int, table: ShapeTable | None = None) -> tuple[Shape, int]:
    """Read one array shape (no tuple, no buffer) at text[i]: it and the index after it; with a
    table, a text read before gives the shape read then, and a new one is kept in it."""
    m = _ARRAY_FAST.match(text, i)
    if m is None:
        raise ValueError(f"expected a shape near {text[i:i + 30]!r}")
    key = m.group()
    if table is not None:
        shape = table.arrays.get(key)
        if shape is not None:
            return shape, m.end()
    etype, dims_text, main, extra = m.groups()
    if dims_text.isdigit() and len(dims_text) < 19:
        dims: tuple[int, ...] = (int(dims_text),)
    elif not dims_text:
        dims = ()
    else:
        if not _DIMS_OK.fullmatch(dims_text):
            raise ValueError(f"bad dimensions [{dims_text}]")
        dims = tuple(int(d) if d != "?" else -1 for d in _DIM_RE.findall(dims_text))
        if any(d > _MAX_DIM for d in dims):
            raise ValueError(f"dimension out of range in [{dims_text}] (XLA's dims are 64-bit)")
    m2m = None
    if main is not None:
        main = main.strip()
        m2m = tuple(int(x) for x in main.split(",")) if main else ()
        if sorted(m2m) != list(range(len(dims))):  # XLA: the layout names each dimension once
            raise ValueError(f"layout {{{main}}} is not a permutation of the {len(dims)} dimension(s) of "
                             f"{etype}[{dims_text}]")
    shape = Shape(etype, dims, m2m, None, extra or "")
    if table is not None and len(table.arrays) < ShapeTable.LIMIT:
        table.arrays[key] = shape
    return shape, m.end()


def parse_shape(text: str, i: int = 0, table: ShapeTable | None = None) -> tuple[Shape, int]:
    """Parse a shape starting at text[i]; return it and the index after it (its array shapes
    kept in and taken from ``table`` when one is given).
    Tuples are read with an explicit stack, so any nesting depth is fine."""
    c = text[i:i + 1]
    if c.isalpha() and not text.startswith("b(", i):  # the common case: one array shape
        return array_shape(text, i, table)
    stack: list[list[Shape]] = []
    while True:
        i = ws_end(text, i)
        if text.startswith("(", i):
            stack.append([])
            i = ws_end(text, i + 1)
            if not text.startswith(")", i):
                continue
            shape, i = Shape("tuple", tuple_shapes=()), i + 1
            stack.pop()
        elif text.startswith("b(", i):
            inner, i = array_shape(text, ws_end(text, i + 2), table)
            i = ws_end(text, i)
            if not text.startswith(")", i):
                raise ValueError(f"expected ')' closing a buffer shape near {text[i:i + 20]!r}")
            shape, i = Shape(inner.element_type, inner.dims, inner.minor_to_major, None, inner.layout_extra,
                             True), i + 1
        else:
            shape, i = array_shape(text, i, table)
        while True:  # attach the finished shape to the enclosing tuple(s)
            if not stack:
                return shape, i
            stack[-1].append(shape)
            i = ws_end(text, i)
            if text.startswith(",", i):
                i += 1
                break
            if not text.startswith(")", i):
                raise ValueError(f"bad tuple shape near {text[i:i + 20]!r}")
            shape, i = Shape("tuple", tuple_shapes=tuple(stack.pop())), i + 1
