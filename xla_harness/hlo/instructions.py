"""Reading one HLO instruction's text: its shape, opcode, operands, attribute text and the
computations it calls, into an :class:`~xla_harness.hlo.ir.Instruction`.

:func:`read_instruction` reads any instruction at an index of the module's text (operands
with or without shapes, operands written as instructions, computations written inline,
async sugar, shapes XLA infers); the ``line_*`` functions are the common cases of the
one-line instruction that :mod:`xla_harness.hlo.parser` reads from one regex match, each
answering None when the text is anything else (the general reader then takes it).
Shapes are read through the parse's :class:`~xla_harness.hlo.shapes.ShapeTable`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Protocol

from xla_harness.hlo.inference import SHAPE_BUILT_BY_XLA, built_shape, infer_shape
from xla_harness.hlo.ir import Computation, Instruction
from xla_harness.hlo.lexer import attr_end, match_brace, split_top
from xla_harness.hlo.shapes import Shape, ShapeTable, array_shape, parse_shape
from xla_harness.hlo.validate import XLA_OPCODES, check_instruction

LITERAL_OPCODES = {"constant", "parameter", "iota", "rng-bit-generator-state"}  # their (...) is a literal, not operands
_OPERAND_NAME = re.compile(r"%?([A-Za-z_][\w.\-]*(?:#\d+)*)\s*$")
_OPCODE = re.compile(r"\s*([a-z][a-z0-9\-]*)\s*\(")
# Opcodes XLA has of its own with these suffixes; any other 'X-start' etc. is async sugar.
NATIVE_ASYNC = {"all-gather-start", "all-gather-done", "all-reduce-start", "all-reduce-done",
                "collective-permute-start", "collective-permute-done", "copy-start", "copy-done",
                "send-done", "recv-done", "async-start", "async-update", "async-done"}
ASYNC_SUFFIXES = ("-start", "-update", "-done")


def _operand_name(text: str, table: ShapeTable | None = None) -> str:
    """'f32[2]{0} %a' / '%a' / 'a' / 'a#1' -> the reference; the shape before it must parse."""
    m = _OPERAND_NAME.search(text)
    if m is None:
        raise ValueError(f"bad operand {text.strip()!r}")
    head = text[:m.start()].strip()
    if head:
        _, end = parse_shape(head, 0, table)
        if head[end:].strip():
            raise ValueError(f"bad operand {text.strip()!r}")
    return m.group(1)


_ITEM = r"\s*(?:[a-z][a-z0-9]*\[[^\]\[{}()]*\](?:\{[^{}()]*\})?\s+)?%?[A-Za-z_][\w.\-]*(?:#\d+)*\s*"
_OPERAND_LIST = re.compile(rf"(?:{_ITEM},)*{_ITEM}")
_LIST_NAME = re.compile(r"%?([A-Za-z_][\w.\-]*(?:#\d+)*)\s*(?:,|$)")

def _one_line_operands(inner: str, defined: dict[str, Instruction], arrays: dict[str, Shape]) -> list[str] | None:
    """The operand names of a one-line instruction (untyped 'a, %b#1' or typed
    'f32[2]{0} %a, ...'); None when the list is any other form (the general reader takes it)."""
    if "[" not in inner and "{" not in inner:
        names = [n[1:] if n[:1] == "%" else n for n in inner.split(", ")]
        for n in names:  # as XLA prints them, '%a, %b': names defined before need no other check
            if n not in defined:
                break
        else:
            return names
        if _UNTYPED_LIST.fullmatch(inner) is None:
            return None if inner.strip() else []
        return [p.strip().lstrip("%") for p in inner.split(",")]
    operands = _printed_operands(inner, defined, arrays)
    if operands is None:
        if not _OPERAND_LIST.fullmatch(inner):
            return None
        operands = _LIST_NAME.findall(inner)
    return operands


def _printed_operands(inner: str, defined: dict[str, Instruction], arrays: dict[str, Shape]) -> list[str] | None:
    """Operands as XLA prints them, 'f32[2,3]{1,0} %a, s32[] %b', read with string splits: the
    names, when every shape is one read before (a key of ``arrays``, the parse's array shapes) and every name is
    an instruction defined before; None otherwise (the regular reader decides)."""
    pieces = inner.split(" %")
    if len(pieces) < 2 or pieces[0] not in arrays:
        return None
    names = []
    for piece in pieces[1:-1]:
        name, comma, shape = piece.partition(", ")
        if not comma or name not in defined or shape not in arrays:
            return None
        names.append(name)
    last = pieces[-1]
    if last not in defined:
        return None
    names.append(last)
    return names


def _parse_operands(inner: str, scope: Scope | None = None, depth: int = 0) -> list[str]:
    if not inner.strip():
        return []
    if "(" not in inner and '"' not in inner and _OPERAND_LIST.fullmatch(inner):
        return _LIST_NAME.findall(inner)  # 'f32[2,3]{1,0} %a, b#1, ...': array shapes or none
    if "[" in inner or "(" in inner or "{" in inner or '"' in inner:
        out = []
        for p in split_top(inner):
            try:
                out.append(_operand_name(p, scope.shapes if scope is not None else None))
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


_CALL_KEYS = ("calls=", "to_apply=", "body=", "condition=", "true_computation=", "false_computation=",
              "branch_computations=", "called_computations=", "select=", "scatter=")
_CALL_VALUE = re.compile(r"\s*(\{[^}]*\}|%?[^\s,{}]+)")
_UNTYPED_LIST = re.compile(r"\s*%?[A-Za-z_][\w.\-]*(?:#\d+)*\s*(?:,\s*%?[A-Za-z_][\w.\-]*(?:#\d+)*\s*)*")
# Opcodes XLA gives no called computation (its parser refuses calls=/to_apply=... on them):
# the reader does not look for one in their attributes.
NO_CALL_OPCODES = frozenset((
    "abs", "add", "and", "atan2", "bitcast", "bitcast-convert", "broadcast", "cbrt", "ceil", "clamp",
    "clz", "compare", "complex", "concatenate", "constant", "convert", "convolution", "copy", "cosine",
    "divide", "dot", "dynamic-slice", "dynamic-update-slice", "erf", "exponential", "exponential-minus-one",
    "floor", "gather", "get-tuple-element", "imag", "iota", "is-finite", "log", "log-plus-one", "logistic",
    "maximum", "minimum", "multiply", "negate", "not", "or", "pad", "parameter", "popcnt", "power", "real",
    "reduce-precision", "remainder", "reshape", "reverse", "round-nearest-afz", "round-nearest-even", "rsqrt",
    "select", "shift-left", "shift-right-arithmetic", "shift-right-logical", "sign", "sine", "slice", "sqrt",
    "subtract", "tan", "tanh", "transpose", "tuple", "xor"))


# The one attribute naming a computation that XLA's parser takes on these opcodes (it refuses a
# module giving them any other): only that one is looked for in their (often long) attribute text.
_CALL_KEYS_OF = {"fusion": ("calls=",), "scatter": ("to_apply=",), "reduce": ("to_apply=",),
                 "reduce-window": ("to_apply=",), "sort": ("to_apply=",), "map": ("to_apply=",),
                 "all-reduce": ("to_apply=",), "all-reduce-start": ("to_apply=",), "reduce-scatter": ("to_apply=",)}


def _called(rest: str, opcode: str = "") -> list[str] | None:
    """The computations an instruction's attributes name (what _CALL_RE finds, in text order,
    found with str.find, which is much faster than the regex on long attribute text; for the
    opcodes of ``_CALL_KEYS_OF`` only their own attribute); None when one is written inline
    ('calls={ p = ... }')."""
    found: list[tuple[int, list[str]]] = []
    for key in _CALL_KEYS_OF.get(opcode, _CALL_KEYS):
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


def async_sugar(opcode: str) -> tuple[str, str]:
    """'call-start' -> ('call', 'async-start'): the wrapped opcode and the async opcode XLA reads the
    sugar as; ('', opcode) for the ops that are async of their own (all-reduce-start ...), and for what
    XLA does not read as sugar: an op that has async forms of its own (``all-gather-update``,
    ``copy-update``, ``send-start``: XLA says unknown opcode, and so does the check after this) or that
    is no opcode at all."""
    if opcode in NATIVE_ASYNC:
        return "", opcode
    wrapped, _, kind = opcode.rpartition("-")
    if wrapped not in XLA_OPCODES or f"{wrapped}-start" in NATIVE_ASYNC or f"{wrapped}-done" in NATIVE_ASYNC:
        return "", opcode
    return wrapped, "async-" + kind


def line_shape(text: str, table: ShapeTable) -> Shape | None:
    """The shape of a one-line instruction: an array shape, or a tuple of array shapes (no nested
    tuple: the line's regex takes parentheses only inside layouts), remembered by its text; None
    when the text is not one whole shape (the general reader says what is wrong)."""
    if text[0] != "(":
        return array_shape(text, 0, table)[0]
    try:
        shape, k = parse_shape(text, 0, table)
    except ValueError:
        return None
    if k != len(text):
        return None
    table.remember_tuple(text, shape)
    return shape


class InlineReader(Protocol):
    """What reads a computation written inline ('calls={ p = ... }'): the parser's cursor."""

    text: str

    def inline_computation(self, brace: int, defined: dict[str, Computation]) -> str:
        """Read the computation whose '{' is text[brace], place it in the module; its name."""
        ...


@dataclass
class Scope:
    """Where an instruction is being defined: the computation so far, the computations before."""

    instructions: list[Instruction]
    defined: dict[str, Instruction]
    comps: dict[str, Computation]
    line: int
    reader: InlineReader | None = None
    shapes: ShapeTable | None = None  # the parse's shapes


MAX_NESTING = 64  # nested instructions as operands, 'add(f32[] constant(0), x)' (XLA caps this too)


def read_instruction(text: str, i: int, name: str, is_root: bool, scope: Scope, depth: int,
                     nested: bool = False) -> tuple[Instruction, int]:
    """Read 'shape opcode(operands), attrs' at text[i]; the instruction and the index after it.
    A nested instruction (an operand written as an instruction) takes the rest of its text."""
    shape: Shape | None = None
    if text.startswith("b(", i) or not _OPCODE.match(text, i):  # no shape: XLA infers it for some ops
        shape, i = parse_shape(text, i, scope.shapes)
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
        close = match_brace(text, open_at)
        inner = text[open_at + 1:close - 1]
    literal = ""
    if opcode in LITERAL_OPCODES:
        operands: list[str] = []
        literal = inner.strip()
    else:
        operands = _parse_operands(inner, scope, depth)
    end = len(text) if nested else attr_end(text, close)
    rest = text[close:end]
    if "{" in rest and _INLINE_CALL.search(rest):
        rest = _inline_computations(text, close, rest, scope)
    called = _called(rest, opcode) if "=" in rest else []
    if called is None:
        raise ValueError("a computation written inline in a list of computations is not supported here")
    async_wrapped = ""
    if opcode.endswith(ASYNC_SUFFIXES):
        async_wrapped, opcode = async_sugar(opcode)
    if shape is None:
        shape = infer_shape(opcode, operands, rest, scope.defined, scope.comps)
    if opcode in SHAPE_BUILT_BY_XLA:
        shape = built_shape(opcode, operands, shape, scope.defined)
    ins = Instruction(name, shape, opcode, operands, rest, is_root, scope.line, literal, called, async_wrapped)
    check_instruction(ins, scope.defined, scope.comps)
    return ins, end


_INLINE_CALL = re.compile(r"(?<![\w.\-])(calls|to_apply|body|condition|true_computation|false_computation)"
                          r"=\s*\{(?=[^}]*=)")


def _inline_computations(text: str, offset: int, rest: str, scope: Scope) -> str:
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
        last = match_brace(rest, brace)
    return "".join(parts) + rest[last:]


def _nested_operand(part: str, scope: Scope, depth: int) -> str:
    """An operand written as an instruction: define it (named as XLA does, 'opcode.anon',
    made unique) before the instruction using it; return its name."""
    if depth >= MAX_NESTING:
        raise ValueError(f"instructions nested deeper than {MAX_NESTING} levels")
    text = part.strip()
    k = 0 if _OPCODE.match(text) else parse_shape(text, 0, scope.shapes)[1]
    m = _OPCODE.match(text, k)
    if m is None:
        raise ValueError(f"bad operand {text!r}")
    base = f"{m.group(1)}.anon"
    name, n = base, 0
    while name in scope.defined:
        n += 1
        name = f"{base}.{n}"
    ins, _ = read_instruction(text, 0, name, False, scope, depth + 1, nested=True)
    scope.instructions.append(ins)
    scope.defined[name] = ins
    return name


def line_operands(inner: str, defined: dict[str, Instruction], arrays: dict[str, Shape]) -> list[str] | None:
    """:func:`_one_line_operands`, with its common case inline: operands as XLA prints them,
    'f32[2,3]{1,0} %a, s32[] %b', every shape one read before and every name defined before."""
    if "[" in inner:  # _printed_operands, inline
        pieces = inner.split(" %")
        if len(pieces) > 1 and pieces[0] in arrays and pieces[-1] in defined:
            names = []
            for piece in pieces[1:-1]:
                name, comma, shape = piece.partition(", ")
                if not comma or name not in defined or shape not in arrays:
                    break
                names.append(name)
            else:
                names.append(pieces[-1])
                return names
    return _one_line_operands(inner, defined, arrays)


def line_called(rest: str, opcode: str) -> list[str] | None:
    """:func:`_called`, with its common case inline: an opcode of ``_CALL_KEYS_OF`` naming its one
    computation once, by name ('calls=%f' after ' ' or ',')."""
    keys = _CALL_KEYS_OF.get(opcode)
    if keys is not None:
        key = keys[0]
        k = rest.find(key)
        if k > 0 and rest.find(key, k + 1) < 0 and rest[k - 1] in " ,":
            m = _CALL_VALUE.match(rest, k + len(key))
            if m is not None and m.group(1)[0] != "{":
                return [m.group(1).lstrip("%")]
    return _called(rest, opcode)


