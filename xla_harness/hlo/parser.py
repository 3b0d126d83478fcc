"""Parse HLO text as XLA tools print it into plain dataclasses.

Reads ``compiled.as_text()`` / ``lowered.as_text(dialect="hlo")`` from jax, the files of
``--xla_dump_to`` (``*after_optimizations.txt`` and friends) and the modules of XLA's own
tests. The reader walks the text by tokens and brackets, as XLA's parser does, not by
lines: an instruction or an attribute may wrap over several lines, a computation may sit on
one line. It follows XLA's grammar where the scanner depends on it:

- operands with or without shapes, names with or without ``%``, ``name#i#j`` tuple
  elements, ``/* ... */`` and ``// ...`` comments anywhere;
- shapes: nested tuples, ``b(...)`` buffers, dynamic dims, layouts with tiles and memory
  spaces (``{1,0:T(8,128)S(1)}``);
- attribute values with nested brackets and quoted strings (multi-line backend configs);
- the module header with attributes, headerless modules (``ENTRY e {...}``), stack-frame
  tables, ``}, execution_thread="..."``;
- async sugar (``call-start``, ``custom-call-start``, ...): read as async-start/-update/-done
  wrapping that opcode;
- computations written inline (``calls={ p = ... }``), named ``_``, ``_.1`` ... as XLA names them;
- shape-less instructions whose shape XLA infers (tuple, get-tuple-element, elementwise,
  transpose, pad, concatenate, real/imag, dot, one-input reduce, reduce-window, convolution,
  sort, call, conditional, ...); send/recv/outfeed and their ``-done`` ops get the shape XLA
  builds from their operands.

It rejects what XLA's parser rejects where the scanner's answer would otherwise be wrong:
an operand or a called computation used before it is defined (so no cycles), two ROOTs,
two ENTRYs, a name defined twice, in-place and indirection ops with the wrong number of
operands, ``name#k`` on a non-tuple, malformed ``output_to_operand_aliasing``, dims beyond
64 bits, parentheses in a real constant's literal.
Nothing here recurses on the input's nesting, so deep input cannot exhaust the stack.
The common one-line instruction takes a fast path (one regex match; XLA's printed operand
lists read by string splits against the shapes and names read before), so reading a
100k-instruction module costs about three quarters of jaxlib's C++ parse of it.
"""

from __future__ import annotations

import functools
import gc
import re
from dataclasses import dataclass, field
from pathlib import Path

from xla_harness.errors import HarnessError


class HloParseError(HarnessError):
    """HLO text that cannot be read; the message names the file and line."""


# ----------------------------------------------------------------------------- shapes


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
            if not s.is_tuple or i >= len(s.tuple_shapes):
                raise IndexError(f"shape index {index} out of range")
            s = s.tuple_shapes[i]
        return s

    def leaves(self, prefix: tuple[int, ...] = ()) -> list[tuple[tuple[int, ...], Shape]]:
        """(shape index, array shape) of every leaf, in order (no recursion)."""
        if self.tuple_shapes is None:
            return [(prefix, self)]
        out: list[tuple[tuple[int, ...], Shape]] = []
        stack: list[tuple[tuple[int, ...], Shape]] = [(prefix, self)]
        while stack:
            index, s = stack.pop()
            if s.is_tuple:
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
        if self.is_tuple:
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
_WS = re.compile(r"\s*")
_BRACKETS = re.compile(r'[{}()\[\]"]')
_OPENERS = {"{": "}", "(": ")", "[": "]"}
# An array shape with an optional layout (no nested braces inside a layout), in one match.
_ARRAY_FAST = re.compile(r"([a-z][a-z0-9]*)\s*\[([^\]]*)\](?:\s*\{(?=\s*[\d}:])([^}:]*)(?::([^}]*))?\})?")


def _match_brace(text: str, i: int, open_ch: str = "", close_ch: str = "") -> int:
    """Index just past the bracket closing the one at text[i] (quotes respected, any
    bracket kind nested inside)."""
    stack: list[str] = []
    n = len(text)
    pat = _BRACKETS
    while i < n:
        m = pat.search(text, i)
        if m is None:
            break
        ch = m.group()
        i = m.end()
        if ch == '"':
            i = _skip_string(text, i)
        elif ch in _OPENERS:
            stack.append(_OPENERS[ch])
        else:
            if not stack or stack[-1] != ch:
                raise ValueError(f"unbalanced '{ch}'")
            stack.pop()
            if not stack:
                return i
    raise ValueError(f"unbalanced '{open_ch or text[i:i + 1]}'")


_STR_END = re.compile(r'\\.|"', re.S)


def _skip_string(text: str, i: int) -> int:
    """Index just past the closing quote of a string whose body starts at i."""
    while True:
        m = _STR_END.search(text, i)
        if m is None:
            raise ValueError("unterminated string")
        if m.group() == '"':
            return m.end()
        i = m.end()


_MAX_DIM = 2**63 - 1
_SHAPE_CACHE: dict[str, Shape] = {}  # array shapes by their text (Shape is immutable)


def clear_caches() -> None:
    """Forget the shapes read so far (the next parse starts as a fresh process would)."""
    _SHAPE_CACHE.clear()


def _array_shape(text: str, i: int) -> tuple[Shape, int]:
    m = _ARRAY_FAST.match(text, i)
    if m is None:
        raise ValueError(f"expected a shape near {text[i:i + 30]!r}")
    key = m.group()
    shape = _SHAPE_CACHE.get(key)
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
    shape = Shape(etype, dims, m2m, None, extra or "")
    if len(_SHAPE_CACHE) < 100_000:
        _SHAPE_CACHE[key] = shape
    return shape, m.end()


def parse_shape(text: str, i: int = 0) -> tuple[Shape, int]:
    """Parse a shape starting at text[i]; return it and the index after it.
    Tuples are read with an explicit stack, so any nesting depth is fine."""
    c = text[i:i + 1]
    if c.isalpha() and not text.startswith("b(", i):  # the common case: one array shape
        return _array_shape(text, i)
    stack: list[list[Shape]] = []
    while True:
        i = _WS.match(text, i).end()
        if text.startswith("(", i):
            stack.append([])
            i = _WS.match(text, i + 1).end()
            if not text.startswith(")", i):
                continue
            shape, i = Shape("tuple", tuple_shapes=()), i + 1
            stack.pop()
        elif text.startswith("b(", i):
            inner, i = _array_shape(text, _WS.match(text, i + 2).end())
            i = _WS.match(text, i).end()
            if not text.startswith(")", i):
                raise ValueError(f"expected ')' closing a buffer shape near {text[i:i + 20]!r}")
            shape, i = Shape(inner.element_type, inner.dims, inner.minor_to_major, None, inner.layout_extra,
                             True), i + 1
        else:
            shape, i = _array_shape(text, i)
        while True:  # attach the finished shape to the enclosing tuple(s)
            if not stack:
                return shape, i
            stack[-1].append(shape)
            i = _WS.match(text, i).end()
            if text.startswith(",", i):
                i += 1
                break
            if not text.startswith(")", i):
                raise ValueError(f"bad tuple shape near {text[i:i + 20]!r}")
            shape, i = Shape("tuple", tuple_shapes=tuple(stack.pop())), i + 1


# ----------------------------------------------------------------------------- instructions


@dataclass
class Instruction:
    name: str
    shape: Shape
    opcode: str
    operands: list[str]
    attr_text: str = ""  # everything after the operand list, parsed into ``attrs`` on demand
    is_root: bool = False
    line: int = 0
    literal: str = ""  # operand text of constant/parameter/iota-like opcodes

    called: list[str] = field(default_factory=list)  # computations called (calls=, to_apply=, ...)
    async_wrapped: str = ""  # 'call' for the sugar 'call-start' (opcode then 'async-start')

    @functools.cached_property
    def attrs(self) -> dict[str, str]:
        """Attributes as key -> raw value text (``dimensions`` -> ``{1,0}``)."""
        out: dict[str, str] = {}
        rest = self.attr_text.strip()
        if rest.startswith(","):
            rest = rest[1:]
        if rest:
            for part in _split_top(rest):
                key, eq, value = part.partition("=")
                if eq:
                    out[key.strip()] = value.strip()
        return out

    @property
    def parameter_number(self) -> int:
        return int(self.literal)

    @property
    def fusion_kind(self) -> str | None:
        return self.attrs.get("kind")

    def int_list(self, key: str) -> tuple[int, ...]:
        """``dimensions={1,0}`` -> (1, 0); a direct search when the key occurs once."""
        t = self.attr_text
        k = t.find(key + "={")
        i = k - 1
        while i > 0 and t[i] in " \t\n":
            i -= 1
        if k > 0 and t[i] == "," and t.count(key + "=") == 1:  # the attribute, once, not inside a string
            j = k + len(key) + 2
            e = t.find("}", j)
            body = t[j:e]
            if e > 0 and body.replace(",", "").isdigit():
                return tuple(map(int, body.split(",")))
        found = re.findall(rf"(?:^|,)\s*{re.escape(key)}\s*=\s*\{{([\d,\s]*)\}}", self.attr_text)
        if len(found) == 1 and self.attr_text.count(key + "=") == 1:
            return tuple(int(x) for x in found[0].split(",") if x.strip())
        v = self.attrs.get(key, "").strip().strip("{}")
        return tuple(int(x) for x in v.split(",") if x.strip())

    def output_to_operand_aliasing(self) -> list[tuple[tuple[int, ...], int, tuple[int, ...]]]:
        """[(output index, operand number, operand shape index)] from the attribute."""
        return parse_output_to_operand_aliasing(self.attrs.get("output_to_operand_aliasing", ""))


def split_ref(ref: str) -> tuple[str, tuple[int, ...]]:
    """'p#1#0' -> ('p', (1, 0)): the instruction named and the tuple index selected."""
    if "#" not in ref:
        return ref, ()
    base, *idx = ref.split("#")
    return base, tuple(int(k) for k in idx)


@dataclass
class Computation:
    name: str
    instructions: list[Instruction]
    is_entry: bool = False
    line: int = 0
    execution_thread: str = ""
    by_name: dict[str, Instruction] = field(default_factory=dict)
    _users: dict[str, list[Instruction]] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not self.by_name:
            self.by_name = {ins.name: ins for ins in self.instructions}

    @functools.cached_property
    def root(self) -> Instruction:
        for ins in self.instructions:
            if ins.is_root:
                return ins
        return self.instructions[-1]

    def operand(self, ref: str) -> tuple[Instruction, tuple[int, ...]]:
        """The instruction an operand reference names, and the tuple index of ``name#k``
        (newer XLA prints tuple elements this way instead of a get-tuple-element)."""
        base, index = split_ref(ref)
        return self.by_name[base], index

    def users(self, name: str) -> list[Instruction]:
        """Instructions using ``name`` as an operand (index built on first use)."""
        if self._users is None:
            index: dict[str, list[Instruction]] = {}
            for ins in self.instructions:
                for op in ins.operands:
                    base = op.partition("#")[0] if "#" in op else op
                    users = index.get(base)
                    if users is None:
                        index[base] = [ins]
                    elif users[-1] is not ins:  # each user once, however many operands it takes
                        users.append(ins)
            self._users = index
        return self._users.get(name, [])


@dataclass
class HloModule:
    name: str
    computations: list[Computation]
    input_output_alias: str = ""
    filename: str = "<string>"
    by_name: dict[str, Computation] = field(default_factory=dict)
    header_attrs: str = ""  # the module header's attribute text as printed

    def __post_init__(self) -> None:
        self.by_name = {c.name: c for c in self.computations}

    @property
    def entry(self) -> Computation:
        for c in self.computations:
            if c.is_entry:
                return c
        return self.computations[-1]

    def computation(self, name: str) -> Computation:
        try:
            return self.by_name[name]
        except KeyError:
            raise HarnessError(f"{self.filename}: module {self.name} has no computation {name!r}") from None

    def instruction_count(self) -> int:
        return sum(len(c.instructions) for c in self.computations)


_IDX = r"\{\s*(?:\d+\s*(?:,\s*\d+\s*)*)?\}"
_OTOA_ONE = re.compile(rf"\s*({_IDX})\s*:\s*\(\s*(-?\d+)\s*,\s*({_IDX})\s*\)\s*")
_OTOA_RE = re.compile(r"\{([\d,\s]*)\}\s*:\s*\(\s*(-?\d+)\s*,\s*\{([\d,\s]*)\}")


def _index(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.strip("{} ").split(",") if x.strip())


def parse_output_to_operand_aliasing(text: str) -> list[tuple[tuple[int, ...], int, tuple[int, ...]]]:
    return [(_index(a), int(b), _index(c)) for a, b, c in _OTOA_RE.findall(text)]


def check_output_to_operand_aliasing(text: str) -> list[tuple[tuple[int, ...], int, tuple[int, ...]]]:
    """Strict reading of ``{{out}: (operand, {index}), ...}``; ValueError when malformed."""
    body = text.strip()
    if not (body.startswith("{") and body.endswith("}")):
        raise ValueError(f"malformed output_to_operand_aliasing {text[:60]!r}")
    body = body[1:-1]
    pairs = []
    if body.strip():
        for part in _split_top(body):
            m = _OTOA_ONE.fullmatch(part)
            if m is None:
                raise ValueError(f"malformed output_to_operand_aliasing entry {part.strip()[:60]!r}")
            pairs.append((_index(m.group(1)), int(m.group(2)), _index(m.group(3))))
    return pairs


_SPECIAL = re.compile(r'[{}()\[\]",]')
_CALL_RE = re.compile(r"(?<![\w.\-])(calls|to_apply|body|condition|true_computation|false_computation|"
                      r"branch_computations|called_computations|select|scatter)=\s*(\{[^}]*\}|%?[^\s,{}]+)")
_LITERAL_OPCODES = {"constant", "parameter", "iota", "rng-bit-generator-state"}
_PCT_NAME = re.compile(r"%([^\s,()%{}]+)")
_OPERAND_NAME = re.compile(r"%?([A-Za-z_][\w.\-]*(?:#\d+)*)\s*$")
_NAME = r"[A-Za-z_][\w.\-]*"
_NAME_RE = re.compile(rf"%?({_NAME})")
_OPCODE = re.compile(r"\s*([a-z][a-z0-9\-]*)\s*\(")
_ATTR_KEY = re.compile(rf"\s*({_NAME})\s*=\s*")
_BARE_VALUE = re.compile(r'[^\s,{}()\[\]"]*')
# Opcodes XLA has of its own with these suffixes; any other 'X-start' etc. is async sugar.
_NATIVE_ASYNC = {"all-gather-start", "all-gather-done", "all-reduce-start", "all-reduce-done",
                 "collective-permute-start", "collective-permute-done", "copy-start", "copy-done",
                 "send-done", "recv-done", "async-start", "async-update", "async-done"}
_ASYNC_SUFFIXES = ("-start", "-update", "-done")
# Minimum/exact operand counts of the ops the alias model reads (as XLA's parser demands).
_OPERAND_COUNTS: dict[str, tuple[int, int | None]] = {
    "bitcast": (1, 1), "transpose": (1, 1), "reshape": (1, 1), "copy": (1, 1),
    "get-tuple-element": (1, 1), "dynamic-update-slice": (2, None), "set-dimension-size": (2, 2),
    "ragged-all-to-all": (6, 6), "async-done": (1, 1), "async-update": (1, None),
    "all-reduce-start": (1, None), "collective-permute-start": (1, None), "collective-permute": (1, None),
    "send": (2, 2), "recv": (1, 1), "send-done": (1, 1), "recv-done": (1, 1), "outfeed": (2, 2),
}


def _split_top(text: str) -> list[str]:
    """Split at commas not nested in brackets or strings."""
    parts: list[str] = []
    depth = 0
    start = 0
    i = 0
    while True:
        m = _SPECIAL.search(text, i)
        if m is None:
            break
        ch = m.group()
        i = m.end()
        if ch == '"':
            i = _skip_string(text, i)
        elif ch in "{([":
            depth += 1
        elif ch in "})]":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i - 1])
            start = i
    parts.append(text[start:])
    return parts


def _operand_name(text: str) -> str:
    """'f32[2]{0} %a' / '%a' / 'a' / 'a#1' -> the reference; the shape before it must parse."""
    m = _OPERAND_NAME.search(text)
    if m is None:
        raise ValueError(f"bad operand {text.strip()!r}")
    head = text[:m.start()].strip()
    if head:
        _, end = parse_shape(head)
        if head[end:].strip():
            raise ValueError(f"bad operand {text.strip()!r}")
    return m.group(1)


_ITEM = r"\s*(?:[a-z][a-z0-9]*\[[^\]\[{}()]*\](?:\{[^{}()]*\})?\s+)?%?[A-Za-z_][\w.\-]*(?:#\d+)*\s*"
_OPERAND_LIST = re.compile(rf"(?:{_ITEM},)*{_ITEM}")
_LIST_NAME = re.compile(r"%?([A-Za-z_][\w.\-]*(?:#\d+)*)\s*(?:,|$)")


def _attributes_end_here(rest: str) -> bool:
    """The attribute text after a one-line instruction's operands is complete on its line:
    empty, or ', ...' with braces and quotes balanced, not ending in ',' or '=' (XLA prints
    '(' and '[' in attribute values only inside braces or strings, so those balance with them)."""
    s = rest.strip()
    return not s or (s[0] == "," and s[-1] not in ",=" and rest.count("{") == rest.count("}")
                     and (rest.count('"') - (rest.count('\\"') if "\\" in rest else 0)) % 2 == 0)


def _one_line_operands(inner: str, defined: dict[str, Instruction]) -> list[str] | None:
    """The operand names of a one-line instruction (untyped 'a, %b#1' or typed
    'f32[2]{0} %a, ...'); None when the list is any other form (the general reader takes it)."""
    if "[" not in inner and "{" not in inner:
        if _UNTYPED_LIST.fullmatch(inner) is None:
            return None if inner.strip() else []
        return [p.strip().lstrip("%") for p in inner.split(",")]
    operands = _printed_operands(inner, defined)
    if operands is None:
        if not _OPERAND_LIST.fullmatch(inner):
            return None
        operands = _LIST_NAME.findall(inner)
    return operands


def _printed_operands(inner: str, defined: dict[str, Instruction]) -> list[str] | None:
    """Operands as XLA prints them, 'f32[2,3]{1,0} %a, s32[] %b', read with string splits: the
    names, when every shape is one read before (a key of the shape cache) and every name is
    an instruction defined before; None otherwise (the regular reader decides)."""
    pieces = inner.split(" %")
    if len(pieces) < 2 or pieces[0] not in _SHAPE_CACHE:
        return None
    names = []
    for piece in pieces[1:-1]:
        name, comma, shape = piece.partition(", ")
        if not comma or name not in defined or shape not in _SHAPE_CACHE:
            return None
        names.append(name)
    last = pieces[-1]
    if last not in defined:
        return None
    names.append(last)
    return names


def _parse_operands(inner: str, scope: _Scope | None = None, depth: int = 0) -> list[str]:
    if not inner.strip():
        return []
    if "(" not in inner and '"' not in inner and _OPERAND_LIST.fullmatch(inner):
        return _LIST_NAME.findall(inner)  # 'f32[2,3]{1,0} %a, b#1, ...': array shapes or none
    if "[" in inner or "(" in inner or "{" in inner or '"' in inner:
        out = []
        for p in _split_top(inner):
            try:
                out.append(_operand_name(p))
            except ValueError:
                if scope is None or "(" not in p:
                    raise
                out.append(_nested_operand(p, scope, depth))
        return out
    out = []
    for p in inner.split(","):  # untyped operands: 'a, b' or '%a, %b'
        m = _OPERAND_NAME.fullmatch(p.strip())
        if m is None:
            raise ValueError(f"bad operand {p.strip()!r}")
        out.append(m.group(1))
    return out


def _skip_value(text: str, i: int) -> int:
    """Index just past one attribute value starting at text[i]: a bracketed group, a string,
    or a bare token that may carry bracketed parts (``[2,4]<=[8]T(1,0)``)."""
    start = i
    n = len(text)
    while i < n:
        i = _BARE_VALUE.match(text, i).end()
        if i >= n:
            break
        ch = text[i]
        if ch in _OPENERS:
            i = _match_brace(text, i)
        elif ch == '"':
            i = _skip_string(text, i + 1)
        else:
            break
    if i == start:
        raise ValueError(f"expected an attribute value near {text[i:i + 20]!r}")
    return i


def _skip_attributes(text: str, i: int) -> int:
    """Index after ', key=value' attributes starting at text[i] (none: i itself)."""
    while True:
        j = _WS.match(text, i).end()
        if not text.startswith(",", j):
            return i
        m = _ATTR_KEY.match(text, j + 1)
        if m is None:
            raise ValueError(f"expected 'name=value' after ',' near {text[j:j + 30]!r}")
        i = _skip_value(text, m.end())


def _attr_end(text: str, i: int) -> int:
    """End of the attribute list of an instruction whose operands closed at i. Fast path: the
    rest of the line is complete (balanced, not ending in ',', next line not starting with ',')."""
    eol = text.find("\n", i)
    if eol < 0:
        eol = len(text)
    seg = text[i:eol]
    s = seg.strip()
    if not s:
        j = _WS.match(text, eol).end()
        return eol if not text.startswith(",", j) else _skip_attributes(text, i)
    if (s[0] == "," and s[-1] not in ",=" and seg.count("{") == seg.count("}") and seg.count("(") == seg.count(")")
            and seg.count("[") == seg.count("]") and (seg.count('"') - seg.count('\\"')) % 2 == 0
            and not text.startswith(",", _WS.match(text, eol).end())):
        return eol
    return _skip_attributes(text, i)


# ----------------------------------------------------------------------------- modules


_HEADER = re.compile(r"HloModule\b\s*")
_FAST_LINE = re.compile(rf"\s*(ROOT[ \t]+)?%?({_NAME})[ \t]*=[ \t]*([a-z][a-z0-9]*\[[^\]\n]*\](?:\{{[^{{}}\n]*\}})?)"
                        r"[ \t]+([a-z][a-z0-9\-]*)\(([^()\"\n]*)\)([^\n]*)(?![^\n])(?!\s*,)")
# (the last two: the attributes run to the end of the line, and the next line does not go on
# with more of them)
_CALL_KEYS = ("calls=", "to_apply=", "body=", "condition=", "true_computation=", "false_computation=",
              "branch_computations=", "called_computations=", "select=", "scatter=")
_CALL_VALUE = re.compile(r"\s*(\{[^}]*\}|%?[^\s,{}]+)")
_UNTYPED_LIST = re.compile(r"\s*%?[A-Za-z_][\w.\-]*(?:#\d+)*\s*(?:,\s*%?[A-Za-z_][\w.\-]*(?:#\d+)*\s*)*")
# Opcodes XLA gives no called computation (its parser refuses calls=/to_apply=... on them):
# the reader does not look for one in their attributes.
_NO_CALL_OPCODES = frozenset((
    "abs", "add", "and", "atan2", "bitcast", "bitcast-convert", "broadcast", "cbrt", "ceil", "clamp",
    "clz", "compare", "complex", "concatenate", "constant", "convert", "convolution", "copy", "cosine",
    "divide", "dot", "dynamic-slice", "dynamic-update-slice", "erf", "exponential", "exponential-minus-one",
    "floor", "gather", "get-tuple-element", "imag", "iota", "is-finite", "log", "log-plus-one", "logistic",
    "maximum", "minimum", "multiply", "negate", "not", "or", "pad", "parameter", "popcnt", "power", "real",
    "reduce-precision", "remainder", "reshape", "reverse", "round-nearest-afz", "round-nearest-even", "rsqrt",
    "select", "shift-left", "shift-right-arithmetic", "shift-right-logical", "sign", "sine", "slice", "sqrt",
    "subtract", "tan", "tanh", "transpose", "tuple", "xor"))


def _called(rest: str) -> list[str] | None:
    """The computations an instruction's attributes name (what _CALL_RE finds, in text order,
    found with str.find, which is much faster than the regex on long attribute text); None
    when one is written inline ('calls={ p = ... }')."""
    found: list[tuple[int, list[str]]] = []
    for key in _CALL_KEYS:
        k = rest.find(key)
        while k >= 0:
            before = rest[k - 1] if k else " "
            if not (before.isalnum() or before in "_.-"):
                m = _CALL_VALUE.match(rest, k + len(key))
                if m is not None:
                    value = m.group(1)
                    if value.startswith("{") and "=" in value:
                        return None
                    found.append((k, [n.strip().lstrip("%") for n in value.strip("{}").split(",") if n.strip()]))
            k = rest.find(key, k + 1)
    if len(found) > 1:
        found.sort()
    return [n for _, names in found for n in names]
_SECTION = re.compile(r"(FileNames|FunctionNames|FileLocations|StackFrames)\b")
_SECTION_ENTRY = re.compile(r"\s*\d+\s+")
_COMP_HEAD = re.compile(rf"\s*(ENTRY\s+)?%?({_NAME})\s*")
_NEXT = re.compile(rf"\s*(?:(\}})|(ROOT\s+)?%?({_NAME})\s*=\s*)")
_BLOCK_COMMENT = re.compile(r"/\*.*?\*/", re.S)
_LINE_COMMENT = re.compile(r'"(?:[^"\\\n]|\\.)*"|//')


def _strip_comments(text: str) -> str:
    """Remove /* */ and // comments outside strings, keeping line numbers."""
    if "/*" in text:
        text = _BLOCK_COMMENT.sub(lambda m: "\n" * m.group().count("\n") or " ", text)
    if "//" in text:
        lines = text.split("\n")
        for k, line in enumerate(lines):
            if "//" in line:
                for m in _LINE_COMMENT.finditer(line):
                    if m.group() == "//":
                        lines[k] = line[:m.start()]
                        break
        text = "\n".join(lines)
    return text


class _Reader:
    """A cursor over the whole text; each method reads one construct and moves on."""

    def __init__(self, text: str, filename: str) -> None:
        self.text = text
        self.filename = filename
        self.pos = 0
        self._line_pos = 0
        self._line_no = 1
        self.inline: list[Computation] = []  # computations written inline, not yet placed in the module
        self.inline_stack: list[int] = []

    def line_at(self, pos: int) -> int:
        if pos < self._line_pos:
            return self.text.count("\n", 0, pos) + 1
        self._line_no += self.text.count("\n", self._line_pos, pos)
        self._line_pos = pos
        return self._line_no

    def ws(self) -> int:
        self.pos = _WS.match(self.text, self.pos).end()
        return self.pos

    def at_end(self) -> bool:
        return self.ws() >= len(self.text)

    def modules(self) -> list[HloModule]:
        modules = []
        while not self.at_end():
            modules.append(self.module())
        return modules

    def module(self) -> HloModule:
        text = self.text
        m = _HEADER.match(text, self.pos)
        name, header_attrs, io_alias = "", "", ""
        if m:
            nm = _NAME_RE.match(text, m.end())
            if nm is None:
                raise ValueError("expected a module name after 'HloModule'")
            name = nm.group(1)
            after = nm.end() + text.startswith(":", nm.end())  # 'HloModule name:' (XLA's lexer allows it)
            end = _skip_attributes(text, after)
            header_attrs = text[after:end]
            self.pos = end
            k = header_attrs.find("input_output_alias")
            if k >= 0:
                j = header_attrs.index("{", k)
                io_alias = header_attrs[j:_match_brace(header_attrs, j)]
        else:
            h = _COMP_HEAD.match(text, self.pos)
            if h is None or not (h.group(1) or text.startswith("{", h.end())):
                raise ValueError("expected 'HloModule <name>' first: this is not HLO text")
        self.stack_frames()
        comps: list[Computation] = []
        by_name: dict[str, Computation] = {}
        while not self.at_end() and not _HEADER.match(text, self.pos):
            c = self.computation(by_name)
            for inline in self.inline:
                comps.append(inline)
            self.inline.clear()
            if c.name in by_name:
                raise _At(c.line, f"computation {c.name!r} is defined twice (first at line "
                                  f"{by_name[c.name].line})")
            if c.is_entry and any(o.is_entry for o in comps):
                raise _At(c.line, f"module {name or '(headerless)'} has a second ENTRY computation {c.name!r}")
            comps.append(c)
            by_name[c.name] = c
        if not comps:
            raise ValueError(f"module {name} has no computations (truncated?)")
        if not name:
            entry = next((c for c in comps if c.is_entry), comps[-1])
            name = f"module_{entry.name}"
        return HloModule(name, comps, io_alias, self.filename, header_attrs=header_attrs)

    def stack_frames(self) -> None:
        text = self.text
        while True:
            self.ws()
            m = _SECTION.match(text, self.pos)
            if m is None:
                return
            self.pos = m.end()
            while True:
                e = _SECTION_ENTRY.match(text, self.pos)
                if e is None:
                    break
                self.pos = _skip_value(text, e.end())

    def computation(self, defined: dict[str, Computation]) -> Computation:
        text = self.text
        start = self.ws()
        m = _COMP_HEAD.match(text, start)
        if m is None:
            raise ValueError(f"expected a computation near {text[start:start + 40]!r}")
        is_entry, name = bool(m.group(1)), m.group(2)
        line = self.line_at(start)
        self.pos = self._signature(name, m.end())
        comp = self.body(name, is_entry, line, defined)
        comp.execution_thread = self._thread(name)
        return comp

    def body(self, name: str, is_entry: bool, line: int, defined: dict[str, Computation]) -> Computation:
        """The instructions after a computation's '{' up to its '}'."""
        text = self.text
        instructions: list[Instruction] = []
        by_name: dict[str, Instruction] = {}
        root: Instruction | None = None
        fast_line = _FAST_LINE.match
        fast_instruction = self._fast_instruction
        while True:
            fm = fast_line(text, self.pos)
            ins = fast_instruction(fm, by_name, defined) if fm is not None else None
            if ins is not None:
                root = _add(name, ins, root, instructions, by_name)
                continue
            nm = _NEXT.match(text, self.pos)
            if nm is None:
                if self.at_end():
                    raise _Truncated(f"computation {name} is not closed")
                raise ValueError(f"expected an instruction or '}}' near {text[self.pos:self.pos + 40]!r}")
            if nm.group(1):
                self.pos = nm.end()
                break
            root = _add(name, self.instruction(nm, instructions, by_name, defined), root, instructions, by_name)
        if not instructions:
            raise _At(line, f"computation {name} has no instructions")
        return Computation(name, instructions, is_entry, line, "", by_name)

    def inline_computation(self, brace: int, defined: dict[str, Computation]) -> str:
        """A computation written in place of a name ('calls={ p = ... }'): read it as XLA does,
        named '_' made unique, placed before the computation using it; its name."""
        if len(self.inline_stack) >= _MAX_NESTING:
            raise ValueError(f"computations written inline nested deeper than {_MAX_NESTING} levels")
        saved = self.pos
        self.inline_stack.append(brace)
        try:
            self.pos = brace + 1
            comp = self.body("_", False, self.line_at(brace), defined)
        finally:
            self.inline_stack.pop()
            self.pos = saved
        name, n = "_", 0  # named when complete, so one written inside it comes first (as in XLA)
        while name in defined:
            n += 1
            name = f"_.{n}"
        comp.name = name
        self.inline.append(comp)
        defined[name] = comp
        return name

    def _fast_instruction(self, fm: re.Match, by_name: dict[str, Instruction],
                          comps: dict[str, Computation]) -> Instruction | None:
        """The common one-line instruction 'name = f32[..]{..} op(a, b), attrs' read from one
        regex match; None when the line is anything else (the general reader takes it).
        Checks as ``_check_instruction``, its common case inline (this runs once per line)."""
        root, name, shape_text, opcode, inner, rest = fm.groups()
        end = fm.end()
        if rest and not _attributes_end_here(rest):
            return None
        if name in by_name or opcode in _SHAPE_BUILT_BY_XLA:
            return None
        literal = ""
        if opcode in _LITERAL_OPCODES:
            operands: list[str] | None = []
            literal = inner.strip()
        else:
            operands = _one_line_operands(inner, by_name)
            if operands is None:
                return None
        shape = _SHAPE_CACHE.get(shape_text) or _array_shape(shape_text, 0)[0]
        if "=" in rest and opcode not in _NO_CALL_OPCODES:
            called = _called(rest)
            if called is None:  # a computation written inline: the general reader takes it
                return None
        else:
            called = []
        async_wrapped = ""
        if opcode.endswith(_ASYNC_SUFFIXES) and opcode not in _NATIVE_ASYNC:
            async_wrapped, _, kind = opcode.rpartition("-")
            opcode = "async-" + kind
        start = fm.start(2)
        ins = Instruction(name, shape, opcode, operands, rest, bool(root), self.line_at(start), literal, called,
                          async_wrapped)
        self.pos = start
        if called or "(" in literal or opcode == "scatter" or "output_to_operand_aliasing" in rest:
            _check_instruction(ins, by_name, comps)
        else:  # what _check_instruction checks of such an instruction, inline
            for op in operands:
                if op not in by_name:  # undefined, or 'name#k': the full check says which
                    _check_operands(ins, by_name)
                    break
            if opcode in _OPERAND_COUNTS:
                _check_operand_count(ins)
        self.pos = end
        return ins

    def _signature(self, name: str, i: int) -> int:
        """Skip '(params) -> shape' if present and the '{'; the index after it."""
        text = self.text
        if text.startswith("(", i):
            j = text.find(")", i)
            close = j + 1 if j > 0 and "(" not in text[i + 1:j] and '"' not in text[i + 1:j] else _match_brace(text, i)
            i = _WS.match(text, close).end()
            if not text.startswith("->", i):
                raise ValueError(f"expected '->' after the parameters of {name}")
            _, i = parse_shape(text, i + 2)
            i = _WS.match(text, i).end()
        if not text.startswith("{", i):
            raise ValueError(f"expected '{{' opening computation {name}")
        return i + 1

    def _thread(self, name: str) -> str:
        """The ', execution_thread="..."' after a computation's '}' ('' when absent)."""
        text = self.text
        end = _skip_attributes(text, self.pos)
        if end == self.pos:
            return ""
        attrs = text[self.pos:end].strip()[1:]
        key, _, value = attrs.partition("=")
        if key.strip() != "execution_thread" or not value.strip().startswith('"') or "," in value:
            raise ValueError(f"unexpected attribute after computation {name}: {attrs[:40]!r}")
        self.pos = end
        return value.strip().strip('"')

    def instruction(self, head: re.Match, instructions: list[Instruction], defined_ins: dict[str, Instruction],
                    defined_comps: dict[str, Computation]) -> Instruction:
        is_root, name = bool(head.group(2)), head.group(3)
        self.pos = head.start(3)
        line = self.line_at(self.pos)
        if name in defined_ins:
            raise _At(line, f"instruction name {name!r} is used twice (first at line {defined_ins[name].line})")
        scope = _Scope(instructions, defined_ins, defined_comps, line, self)
        ins, self.pos = _rhs(self.text, head.end(), name, is_root, scope, 0)
        return ins


def _add(comp: str, ins: Instruction, root: Instruction | None, instructions: list[Instruction],
         by_name: dict[str, Instruction]) -> Instruction | None:
    """Append an instruction to its computation; the ROOT so far (a second one is an error)."""
    if ins.is_root:
        if root is not None:
            raise _At(ins.line, f"computation {comp} has a second ROOT {ins.name!r} (the first is {root.name!r})")
        root = ins
    instructions.append(ins)
    by_name[ins.name] = ins
    return root


@dataclass
class _Scope:
    """Where an instruction is being defined: the computation so far, the computations before."""

    instructions: list[Instruction]
    defined: dict[str, Instruction]
    comps: dict[str, Computation]
    line: int
    reader: _Reader | None = None


_MAX_NESTING = 64  # nested instructions as operands, 'add(f32[] constant(0), x)' (XLA caps this too)


def _rhs(text: str, i: int, name: str, is_root: bool, scope: _Scope, depth: int,
         nested: bool = False) -> tuple[Instruction, int]:
    """Read 'shape opcode(operands), attrs' at text[i]; the instruction and the index after it.
    A nested instruction (an operand written as an instruction) takes the rest of its text."""
    shape: Shape | None = None
    if text.startswith("b(", i) or not _OPCODE.match(text, i):  # no shape: XLA infers it for some ops
        shape, i = parse_shape(text, i)
    m = _OPCODE.match(text, i)
    if m is None:
        raise ValueError(f"expected an opcode near {text[i:i + 30]!r}")
    opcode = m.group(1)
    open_at = m.end() - 1
    j = text.find(")", open_at)
    inner = text[open_at + 1:j] if j > 0 else ""
    if j > 0 and "(" not in inner and '"' not in inner:
        close = j + 1  # the common case: no nested parentheses in the operand list
    else:
        close = _match_brace(text, open_at)
        inner = text[open_at + 1:close - 1]
    literal = ""
    if opcode in _LITERAL_OPCODES:
        operands: list[str] = []
        literal = inner.strip()
    else:
        operands = _parse_operands(inner, scope, depth)
    end = len(text) if nested else _attr_end(text, close)
    rest = text[close:end]
    if "{" in rest and _INLINE_CALL.search(rest):
        rest = _inline_computations(text, close, rest, scope)
    called = _called(rest) if "=" in rest else []
    if called is None:
        raise ValueError("a computation written inline in a list of computations is not supported here")
    async_wrapped = ""
    if opcode.endswith(_ASYNC_SUFFIXES) and opcode not in _NATIVE_ASYNC:
        async_wrapped, _, kind = opcode.rpartition("-")
        opcode = "async-" + kind
    if shape is None:
        shape = _infer_shape(opcode, operands, rest, scope)
    if opcode in _SHAPE_BUILT_BY_XLA:
        shape = _built_shape(opcode, operands, shape, scope.defined)
    ins = Instruction(name, shape, opcode, operands, rest, is_root, scope.line, literal, called, async_wrapped)
    _check_instruction(ins, scope.defined, scope.comps)
    return ins, end


_INLINE_CALL = re.compile(r"(?<![\w.\-])(calls|to_apply|body|condition|true_computation|false_computation)"
                          r"=\s*\{(?=[^}]*=)")


def _inline_computations(text: str, offset: int, rest: str, scope: _Scope) -> str:
    """The attribute text with each computation written inline read and replaced by its name."""
    reader = scope.reader
    if reader is None or text is not reader.text:
        raise ValueError("a computation written inline inside a nested operand is not supported here")
    parts = []
    last = 0
    while True:
        m = _INLINE_CALL.search(rest, last)
        if m is None:
            break
        brace = m.end() - 1
        name = reader.inline_computation(offset + brace, scope.comps)
        parts += [rest[last:m.start()], f"{m.group(1)}={name}"]
        last = _match_brace(rest, brace)
    return "".join(parts) + rest[last:]


def _nested_operand(part: str, scope: _Scope, depth: int) -> str:
    """An operand written as an instruction: define it (named as XLA does, 'opcode.anon',
    made unique) before the instruction using it; return its name."""
    if depth >= _MAX_NESTING:
        raise ValueError(f"instructions nested deeper than {_MAX_NESTING} levels")
    text = part.strip()
    k = 0 if _OPCODE.match(text) else parse_shape(text)[1]
    m = _OPCODE.match(text, k)
    if m is None:
        raise ValueError(f"bad operand {text!r}")
    base = f"{m.group(1)}.anon"
    name, n = base, 0
    while name in scope.defined:
        n += 1
        name = f"{base}.{n}"
    ins, _ = _rhs(text, 0, name, False, scope, depth + 1, nested=True)
    scope.instructions.append(ins)
    scope.defined[name] = ins
    return name


_SAME_SHAPE_OPCODES = {"abs", "add", "atan2", "cbrt", "ceil", "clamp", "copy", "cosine", "divide", "exponential",
                       "exponential-minus-one", "floor", "log", "log-plus-one", "logistic", "maximum", "minimum",
                       "multiply", "negate", "power", "remainder", "round-nearest-afz", "round-nearest-even",
                       "rsqrt", "sign", "sine", "sqrt", "subtract", "tanh", "and", "or", "xor", "not",
                       "shift-left", "shift-right-arithmetic", "shift-right-logical", "add-dependency"}


def _infer_shape(opcode: str, operands: list[str], attr_text: str, scope: _Scope) -> Shape:
    """The shape XLA infers for an instruction written without one (the ops the scanner
    follows; others are refused rather than guessed)."""
    defined = scope.defined

    def of(ref: str) -> Shape:
        base, index = split_ref(ref)
        if base not in defined:
            raise ValueError(f"undefined operand {base!r}")
        return defined[base].shape.subshape(index)

    if opcode == "tuple":
        return Shape("tuple", tuple_shapes=tuple(of(o) for o in operands))
    by_operand = {"while": 0, "select": 1, "compare": 0}
    if opcode in by_operand and len(operands) > by_operand[opcode]:
        s = of(operands[by_operand[opcode]])
        return Shape("pred", s.dims) if opcode == "compare" else s
    if opcode == "get-tuple-element" and len(operands) == 1:
        m = re.search(r"\bindex=(\d+)", attr_text)
        if m:
            return of(operands[0]).subshape((int(m.group(1)),))
    if opcode in _SAME_SHAPE_OPCODES and operands:
        return of(operands[0])
    if opcode == "after-all":
        return Shape("token")
    inferred = _INFERRED.get(opcode)
    if inferred is not None and operands:
        return inferred([of(o) for o in operands], attr_text)
    if opcode in ("call", "conditional"):  # the (first) called computation's result
        first = {m.group(1): m.group(2) for m in _CALL_RE.finditer(attr_text)}
        name = first.get("to_apply") or first.get("true_computation") or first.get("branch_computations", "")
        callee = scope.comps.get(name.strip("{}").split(",")[0].strip().lstrip("%"))
        if callee is not None:
            return callee.root.shape
    raise ValueError(f"a {opcode} written without a shape is not supported here")


_SHAPE_BUILT_BY_XLA = {"send", "recv", "send-done", "recv-done", "outfeed"}
_TOKEN = Shape("token")


def _built_shape(opcode: str, operands: list[str], written: Shape, defined: dict[str, Instruction]) -> Shape:
    """The shape XLA's parser gives send/recv/outfeed and their -done ops, built from the
    operands whatever the text says (a wrong operand count is left to the checks after)."""
    sources = [defined.get(split_ref(o)[0]) for o in operands]
    if None in sources or len(operands) != {"send": 2, "outfeed": 2}.get(opcode, 1):
        return written
    first = sources[0].shape.subshape(split_ref(operands[0])[1])
    if opcode == "send":
        return Shape("tuple", tuple_shapes=(first, Shape("u32"), _TOKEN))
    if opcode == "recv":
        if not written.is_tuple or not written.tuple_shapes:
            raise ValueError("recv must have a non-empty tuple shape")
        return Shape("tuple", tuple_shapes=(written.tuple_shapes[0], Shape("u32"), _TOKEN))
    if opcode == "recv-done":
        if not first.is_tuple or not first.tuple_shapes:
            raise ValueError("recv-done takes a recv (a tuple-shaped operand)")
        return Shape("tuple", tuple_shapes=(first.tuple_shapes[0], _TOKEN))
    return _TOKEN  # send-done, outfeed


def _padded(operand: Shape, attr_text: str) -> Shape:
    """XLA's inferred pad shape: each dim grows by low + high + interior * (size - 1)."""
    m = re.search(r"\bpadding=([\d_x\-]+)", attr_text)
    specs = m.group(1).split("x") if m else []
    if operand.is_tuple or len(specs) != len(operand.dims):
        raise ValueError("pad without a shape needs padding=... for each of its operand's dims")
    dims = []
    for d, spec in zip(operand.dims, specs, strict=True):
        lo, hi, interior = ([int(x) for x in spec.split("_")] + [0])[:3]
        dims.append(lo + hi + d + max(d - 1, 0) * interior)
    return Shape(operand.element_type, tuple(dims))


def _concatenated(shapes: list[Shape], attr_text: str) -> Shape:
    """XLA's inferred concatenate shape: the operands' sizes summed along ``dimensions``."""
    m = re.search(r"\bdimensions=\{\s*(\d+)\s*\}", attr_text)
    first = shapes[0]
    k = int(m.group(1)) if m else -1
    if first.is_tuple or not 0 <= k < len(first.dims) or any(len(s.dims) != len(first.dims) for s in shapes):
        raise ValueError("concatenate without a shape needs dimensions={k} and operands of one rank")
    dims = list(first.dims)
    dims[k] = sum(s.dims[k] for s in shapes)
    return Shape(first.element_type, tuple(dims))


def _transposed(operand: Shape, attr_text: str) -> Shape:
    """XLA's inferred transpose shape: dims permuted, the layout permuted along (a bitcast)."""
    m = re.search(r"\bdimensions=\{([\d,\s]*)\}", attr_text)
    perm = tuple(int(x) for x in m.group(1).split(",") if x.strip()) if m else ()
    if operand.is_tuple or sorted(perm) != list(range(len(operand.dims))):
        raise ValueError("transpose without a shape needs dimensions={...} permuting its operand's dims")
    inverse = {d: i for i, d in enumerate(perm)}  # an operand printed without a layout has the default one
    m2m = tuple(inverse[d] for d in operand.layout_or_default())
    return Shape(operand.element_type, tuple(operand.dims[d] for d in perm), m2m, None, operand.layout_extra)


def _real_part(shapes: list[Shape], attr_text: str) -> Shape:
    s = shapes[0]
    real = {"c64": "f32", "c128": "f64"}.get(s.element_type, s.element_type)
    return Shape(real, s.dims, s.minor_to_major, None, s.layout_extra)


def _attr_ints(attr_text: str, key: str) -> list[int]:
    m = re.search(rf"(?<![\w.\-]){key}=\{{([\d,\s]*)\}}", attr_text)
    return [int(x) for x in m.group(1).split(",") if x.strip()] if m else []


_WIDER_FLOAT = {frozenset(("f32", "bf16")): "f32", frozenset(("f32", "f16")): "f32",
                frozenset(("f64", "f32")): "f64"}


def _dot_shape(shapes: list[Shape], attr_text: str) -> Shape:
    """XLA's inferred dot shape: batch dims, then lhs and rhs free dims; the wider element type."""
    if len(shapes) != 2 or shapes[0].is_tuple or shapes[1].is_tuple:
        raise ValueError("dot without a shape needs two array operands")
    lhs, rhs = shapes
    lb, lc = _attr_ints(attr_text, "lhs_batch_dims"), _attr_ints(attr_text, "lhs_contracting_dims")
    rb, rc = _attr_ints(attr_text, "rhs_batch_dims"), _attr_ints(attr_text, "rhs_contracting_dims")
    if any(d >= len(lhs.dims) for d in lb + lc) or any(d >= len(rhs.dims) for d in rb + rc) or len(lb) != len(rb):
        raise ValueError("dot dimension numbers out of range")
    etype = lhs.element_type if lhs.element_type == rhs.element_type else \
        _WIDER_FLOAT.get(frozenset((lhs.element_type, rhs.element_type)))
    if etype is None:
        raise ValueError(f"a dot of {lhs.element_type} and {rhs.element_type} written without a shape "
                         "is not supported here")
    dims = [lhs.dims[d] for d in lb]
    dims += [n for d, n in enumerate(lhs.dims) if d not in lb and d not in lc]
    dims += [n for d, n in enumerate(rhs.dims) if d not in rb and d not in rc]
    return Shape(etype, tuple(dims))


def _reduce_shape(shapes: list[Shape], attr_text: str) -> Shape:
    """XLA's inferred shape of a one-input reduce: the reduced dims dropped, the init's type."""
    if len(shapes) != 2 or shapes[0].is_tuple:
        raise ValueError("a reduce of several inputs written without a shape is not supported here")
    dropped = set(_attr_ints(attr_text, "dimensions"))
    return Shape(shapes[1].element_type, tuple(n for d, n in enumerate(shapes[0].dims) if d not in dropped))


_WINDOW_FIELDS = {"size": "size", "stride": "stride", "pad": "pad", "lhs_dilate": "base_dilation",
                  "rhs_dilate": "window_dilation", "rhs_reversal": "reversal"}


def _window(attr_text: str, rank: int) -> list[dict[str, tuple[int, ...] | int]]:
    """``window={size=2x3 stride=1x2 pad=1_1x0_0 lhs_dilate=.. rhs_dilate=..}`` per dimension,
    XLA's defaults (stride and dilations 1, padding 0) where a field is not written."""
    m = re.search(r"(?<![\w.\-])window=\{([^{}]*)\}", attr_text)
    fields: dict[str, list[str]] = {}
    for part in (m.group(1).split() if m else []):
        key, eq, value = part.partition("=")
        if not eq or key not in _WINDOW_FIELDS:
            raise ValueError(f"bad window field {part!r}")
        fields[_WINDOW_FIELDS[key]] = value.split("x")
    if "size" not in fields or any(len(v) != rank for v in fields.values()):
        raise ValueError(f"window needs size=... with {rank} dimension(s), each field as many")
    dims = []
    for i in range(rank):
        lo, _, hi = fields.get("pad", ["0_0"] * rank)[i].partition("_")
        dims.append({"size": int(fields["size"][i]), "stride": int(fields.get("stride", ["1"] * rank)[i]),
                     "pad": (int(lo), int(hi or "0")),
                     "base_dilation": int(fields.get("base_dilation", ["1"] * rank)[i]),
                     "window_dilation": int(fields.get("window_dilation", ["1"] * rank)[i])})
    if any(d["stride"] < 1 or d["base_dilation"] < 1 or d["window_dilation"] < 1 or d["size"] < 0 for d in dims):
        raise ValueError("window strides and dilations must be >= 1")
    return dims


def _windowed(bounds: tuple[int, ...], window: list[dict]) -> tuple[int, ...]:
    """XLA's InferWindowOutputShape: each bound base-dilated and padded, then strided by the
    dilated window."""
    out = []
    for bound, w in zip(bounds, window, strict=True):
        dilated = (bound - 1) * w["base_dilation"] + 1 if bound else 0
        padded = w["pad"][0] + dilated + w["pad"][1]
        size = (w["size"] - 1) * w["window_dilation"] + 1 if w["size"] else 0
        out.append(0 if size > padded else (padded - size) // w["stride"] + 1)
    return tuple(out)


def _reduce_window_shape(shapes: list[Shape], attr_text: str) -> Shape:
    """XLA's inferred reduce-window shape: each input windowed, the init values' types."""
    n = len(shapes) // 2
    if len(shapes) % 2 or n < 1 or any(s.is_tuple for s in shapes):
        raise ValueError("reduce-window takes N array inputs and N init values")
    window = _window(attr_text, len(shapes[0].dims))
    outs = [Shape(init.element_type, _windowed(s.dims, window)) for s, init in zip(shapes[:n], shapes[n:],
                                                                                   strict=True)]
    return outs[0] if n == 1 else Shape("tuple", tuple_shapes=tuple(outs))


def _dim_labels(attr_text: str) -> tuple[str, str, str]:
    m = re.search(r"(?<![\w.\-])dim_labels=([0-9a-z]+)_([0-9a-z]+)->([0-9a-z]+)", attr_text)
    if m is None:
        raise ValueError("convolution without a shape needs dim_labels=..._...->...")
    return m.group(1), m.group(2), m.group(3)


def _convolution_shape(shapes: list[Shape], attr_text: str) -> Shape:
    """XLA's inferred convolution shape (InferConvolveShape): the batch divided by the batch
    group count, the kernel's output features, the spatial dims windowed."""
    if len(shapes) != 2 or shapes[0].is_tuple or shapes[1].is_tuple:
        raise ValueError("convolution without a shape needs two array operands")
    lhs, rhs = shapes
    lhs_labels, rhs_labels, out_labels = _dim_labels(attr_text)
    rank = len(lhs.dims)
    if not (len(lhs_labels) == len(rhs_labels) == len(out_labels) == rank == len(rhs.dims)) or any(
            sorted(labels) != sorted("".join(map(str, range(rank - 2))) + letters)
            for labels, letters in ((lhs_labels, "bf"), (rhs_labels, "io"), (out_labels, "bf"))):
        raise ValueError(f"dim_labels {lhs_labels}_{rhs_labels}->{out_labels} do not fit rank {rank}")
    window = _window(attr_text, rank - 2)
    spatial = _windowed(tuple(lhs.dims[lhs_labels.index(str(k))] for k in range(rank - 2)), window)
    groups = re.search(r"(?<![\w.\-])batch_group_count=(\d+)", attr_text)
    batch = lhs.dims[lhs_labels.index("b")] // (int(groups.group(1)) if groups else 1)
    etype = lhs.element_type if lhs.element_type == rhs.element_type else \
        _WIDER_FLOAT.get(frozenset((lhs.element_type, rhs.element_type)))
    if etype is None:
        raise ValueError(f"a convolution of {lhs.element_type} and {rhs.element_type} written without a shape "
                         "is not supported here")
    dims = [batch if c == "b" else rhs.dims[rhs_labels.index("o")] if c == "f" else spatial[int(c)]
            for c in out_labels]
    return Shape(etype, tuple(dims))


def _sort_shape(shapes: list[Shape], attr_text: str) -> Shape:
    """XLA's inferred sort shape: the operand's, a tuple of them for several."""
    return shapes[0] if len(shapes) == 1 else Shape("tuple", tuple_shapes=tuple(shapes))


_INFERRED = {"dot": _dot_shape, "reduce": _reduce_shape, "reduce-window": _reduce_window_shape,
             "convolution": _convolution_shape, "sort": _sort_shape,
             "transpose": lambda shapes, attrs: _transposed(shapes[0], attrs),
             "pad": lambda shapes, attrs: _padded(shapes[0], attrs),
             "concatenate": _concatenated, "real": _real_part, "imag": _real_part}


def _check_instruction(ins: Instruction, defined: dict[str, Instruction], comps: dict[str, Computation]) -> None:
    """What XLA's parser checks and the alias model relies on (raises _At)."""
    if ins.literal and "(" in ins.literal and ins.opcode == "constant":
        _check_literal_parens(ins)
    _check_operands(ins, defined)
    for callee in ins.called:
        if callee not in comps:
            raise _At(ins.line, f"{ins.name} calls computation {callee!r}, which is not defined before it")
    if ins.opcode in _OPERAND_COUNTS or ins.opcode == "scatter":
        _check_operand_count(ins)
    if "output_to_operand_aliasing" in ins.attr_text:
        try:
            pairs = check_output_to_operand_aliasing(ins.attrs.get("output_to_operand_aliasing", ""))
        except ValueError as exc:
            raise _At(ins.line, f"{ins.name}: {exc}") from None
        for _, op_num, _ in pairs:
            if op_num >= len(ins.operands) and ins.opcode not in ("async-start", "async-update"):
                raise _At(ins.line, f"{ins.name}: output_to_operand_aliasing names operand {op_num}, "
                                    f"it has {len(ins.operands)}")


_NAN_PAYLOAD = re.compile(r"nan\(0x[0-9a-fA-F]+\)")


def _check_literal_parens(ins: Instruction) -> None:
    """XLA takes '(' in a literal only for complex numbers, tuples and NaN payloads."""
    if ins.shape.is_tuple or ins.shape.element_type in ("c64", "c128"):
        return
    if "(" in _NAN_PAYLOAD.sub("", ins.literal):
        raise _At(ins.line, f"{ins.name}: '(' in the literal of a {ins.shape.element_type} constant "
                            "(parens are only for complex numbers and tuples)")


def _check_operands(ins: Instruction, defined: dict[str, Instruction]) -> None:
    for op in ins.operands:
        if "#" not in op and op in defined:
            continue  # the common case
        base, index = split_ref(op)
        src = defined.get(base)
        if src is None:
            why = " (itself: a cycle)" if base == ins.name else " (operands are defined before use)"
            raise _At(ins.line, f"{ins.name} uses undefined operand {base!r}{why}")
        if index:
            try:
                src.shape.subshape(index)
            except IndexError:
                raise _At(ins.line, f"{ins.name}: operand {op!r} selects a tuple element {src.name} "
                                    "does not have") from None


def _check_operand_count(ins: Instruction) -> None:
    n = len(ins.operands)
    if ins.opcode == "scatter" and (n < 3 or n % 2 == 0):
        raise _At(ins.line, f"{ins.name}: scatter takes 2N+1 operands (N inputs, indices, N updates), got {n}")
    lo_hi = _OPERAND_COUNTS.get(ins.opcode)
    if lo_hi is not None and not ins.async_wrapped:
        lo, hi = lo_hi
        if n < lo or (hi is not None and n > hi):
            want = f"{lo}" if lo == hi else f"at least {lo}"
            raise _At(ins.line, f"{ins.name}: {ins.opcode} takes {want} operand(s), got {n}")


class _At(ValueError):
    """A parse error that knows its own line."""

    def __init__(self, line: int, message: str) -> None:
        super().__init__(message)
        self.line = line


class _Truncated(ValueError):
    pass


def parse_module(text: str, filename: str = "<string>") -> HloModule:
    """Parse one HLO module; raise HloParseError naming file and line on malformed text."""
    modules = parse_modules(text, filename)
    if len(modules) != 1:
        raise HloParseError(f"{filename}: expected one HloModule, found {len(modules)}")
    return modules[0]


def parse_modules(text: str, filename: str = "<string>") -> list[HloModule]:
    """Parse every HloModule in the text (a file usually holds one)."""
    if not text.strip():
        raise HloParseError(f"{filename}:1: empty file, no HloModule")
    reader = _Reader(_strip_comments(text), filename)
    gc_was_enabled = gc.isenabled()
    gc.disable()  # the reader makes many small acyclic objects; collecting while it runs only costs time
    try:
        return reader.modules()
    except _At as exc:
        raise HloParseError(f"{filename}:{exc.line}: {exc}") from None
    except (ValueError, IndexError) as exc:
        line = reader.line_at(min(reader.pos, len(reader.text)))
        rest = reader.text[reader.pos:]
        if isinstance(exc, _Truncated) or ("\n" not in rest.strip() and reader.pos > 0
                                           and _looks_cut(reader.text, reader.pos)):
            last = reader.text.count("\n", 0, len(reader.text.rstrip())) + 1
            raise HloParseError(f"{filename}:{last}: truncated module: the text ends inside "
                                f"an instruction or computation ({exc})") from None
        raise HloParseError(f"{filename}:{line}: {exc}") from None
    finally:
        if gc_was_enabled:
            gc.enable()


def _looks_cut(text: str, pos: int) -> bool:
    """True when the reader stopped in the last non-empty line (the file was cut short)."""
    return text.count("\n", pos, len(text.rstrip())) == 0


def parse_file(path: Path | str) -> HloModule:
    """Read and parse one HLO text file (UTF-8; a FIFO, device or directory is refused)."""
    path = Path(path)
    try:
        if not path.is_file():
            what = "a directory" if path.is_dir() else "not a regular file"
            raise HloParseError(f"{path}:1: cannot read: {what}")
        data = path.read_bytes()
    except OSError as exc:
        raise HloParseError(f"{path}:1: cannot read: {exc.strerror}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise HloParseError(f"{path}:{line}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset "
                            f"{exc.start})") from None
    return parse_module(text, str(path))
