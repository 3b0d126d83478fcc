"""Parse HLO text as XLA tools print it into the dataclasses of :mod:`xla_harness.hlo.ir`.

Reads ``compiled.as_text()`` / ``lowered.as_text(dialect="hlo")`` from jax, the files of
``--xla_dump_to`` (``*after_optimizations.txt`` and friends) and the modules of XLA's own
tests. The reader walks the text by tokens and brackets, as XLA's parser does, not by
lines: an instruction or an attribute may wrap over several lines, a computation may sit on
one line. It follows XLA's grammar where the scanner depends on it:

- operands with or without shapes, names with or without ``%``, ``name#i#j`` tuple
  elements, ``/* ... */`` and ``// ...`` comments anywhere;
- shapes (read by :mod:`xla_harness.hlo.shapes`): nested tuples, ``b(...)`` buffers, dynamic
  dims, layouts with tiles and memory spaces (``{1,0:T(8,128)S(1)}``);
- attribute values with nested brackets and quoted strings (multi-line backend configs);
- the module header with attributes, headerless modules (``ENTRY e {...}``), stack-frame
  tables, ``}, execution_thread="..."``;
- async sugar (``call-start``, ``custom-call-start``, ...): read as async-start/-update/-done
  wrapping that opcode;
- computations written inline (``calls={ p = ... }``), named ``_``, ``_.1`` ... as XLA names them;
- shape-less instructions whose shape XLA infers (:mod:`xla_harness.hlo.inference`: tuple,
  get-tuple-element, elementwise, transpose, pad, concatenate, real/imag, dot, one-input
  reduce, reduce-window, convolution, sort, call, conditional, ...); send/recv/outfeed and
  their ``-done`` ops get the shape XLA builds from their operands.

It rejects what XLA's parser rejects where the scanner's answer would otherwise be wrong (the
checks of each instruction and computation are :mod:`xla_harness.hlo.validate`'s):
an operand or a called computation used before it is defined (so no cycles), two ROOTs,
two ENTRYs, a name defined twice, a declared result shape (``-> shape``) that is not the
root's (layouts aside; without a ROOT line the last instruction is the root, as in XLA),
``parameter(N)`` numbers taken twice or outside 0..n-1, in-place and indirection ops with the wrong number of
operands, ``name#k`` on a non-tuple, malformed ``output_to_operand_aliasing``, dims beyond
64 bits, parentheses in a real constant's literal.
Nothing here recurses on the input's nesting, so deep input cannot exhaust the stack.
The common one-line instruction takes a fast path (one regex match; XLA's printed operand
lists read by string splits against the shapes and names read before), so reading a
100k-instruction module costs about three quarters of jaxlib's C++ parse of it.
Entry points: :func:`parse_module`, :func:`parse_modules`, :func:`parse_file`.
"""

from __future__ import annotations

import gc
import re
from dataclasses import dataclass
from pathlib import Path

from xla_harness.errors import HarnessError
from xla_harness.hlo.inference import _SHAPE_BUILT_BY_XLA, _built_shape, _infer_shape
from xla_harness.hlo.ir import Computation, HloModule, Instruction, _split_top
from xla_harness.hlo.shapes import (
    _OPENERS,
    _SHAPE_CACHE,
    _TUPLE_SHAPES,
    _WS,
    Shape,
    _array_shape,
    _match_brace,
    _skip_string,
    _ws_end,
    parse_shape,
)
from xla_harness.hlo.validate import (
    XLA_OPCODES,
    LineError,
    check_instruction,
    check_line_instruction,
    check_parameter_numbers,
    check_result_shape,
)


class HloParseError(HarnessError):
    """HLO text that cannot be read; the message names the file and line."""


# ----------------------------------------------------------------------------- instructions


_LITERAL_OPCODES = {"constant", "parameter", "iota", "rng-bit-generator-state"}
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
        names = [n[1:] if n[:1] == "%" else n for n in inner.split(", ")]
        for n in names:  # as XLA prints them, '%a, %b': names defined before need no other check
            if n not in defined:
                break
        else:
            return names
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
        m = _BARE_VALUE.match(text, i)
        assert m is not None  # the pattern matches the empty string
        i = m.end()
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
        j = _ws_end(text, i)
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
        j = _ws_end(text, eol)
        return eol if not text.startswith(",", j) else _skip_attributes(text, i)
    if (s[0] == "," and s[-1] not in ",=" and seg.count("{") == seg.count("}") and seg.count("(") == seg.count(")")
            and seg.count("[") == seg.count("]") and (seg.count('"') - seg.count('\\"')) % 2 == 0
            and not text.startswith(",", _ws_end(text, eol))):
        return eol
    return _skip_attributes(text, i)


# ----------------------------------------------------------------------------- modules


_HEADER = re.compile(r"HloModule\b\s*")
_FAST_LINE = re.compile(rf"\s*(ROOT[ \t]+)?%?({_NAME})[ \t]*=[ \t]*"
                        r"([a-z][a-z0-9]*\[[^\]\n]*\](?:\{[^{}\n]*\})?|\((?:[^(){}\n]|\{[^{}\n]*\})*\))"
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
# A computation's signature on one line, '(p: f32[2]) -> f32[2]{0} {': the declared shape's text (the
# parameter list is skipped, as _signature does); the match ends after the '{'.
_SIGNATURE_LINE = re.compile(r'\([^()"\n]*\)[ \t]*->[ \t]*([^\n]*?)[ \t]*\{(?=[ \t]*\n)')
_SECTION = re.compile(r"(FileNames|FunctionNames|FileLocations|StackFrames)\b")
_SECTION_ENTRY = re.compile(r"\s*\d+\s+")
_COMP_HEAD = re.compile(rf"\s*(ENTRY\s+)?%?({_NAME})\s*")
_NEXT = re.compile(rf"\s*(?:(\}})|(ROOT\s+)?%?({_NAME})\s*=\s*)")
_BLOCK_COMMENT = re.compile(r"/\*.*?\*/", re.S)
_LINE_COMMENT = re.compile(r'"(?:[^"\\\n]|\\.)*"|//')


_COMMENT_START = re.compile(r"/[*/]")  # one regex search: faster than two substring tests of the whole text


def _strip_comments(text: str) -> str:
    """Remove /* */ and // comments outside strings, keeping line numbers."""
    if _COMMENT_START.search(text) is None:
        return text
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
        m = _WS.match(self.text, self.pos)
        assert m is not None  # '\s*' matches at every index (_ws_end inline: this runs per token)
        self.pos = m.end()
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
        frames_at = self.ws()
        self.stack_frames()
        source_tables = text[frames_at:self.pos] if self.pos > frames_at else ""
        comps: list[Computation] = []
        by_name: dict[str, Computation] = {}
        while not self.at_end() and not _HEADER.match(text, self.pos):
            c = self.computation(by_name)
            for inline in self.inline:
                comps.append(inline)
            self.inline.clear()
            if c.name in by_name:
                raise LineError(c.line, f"computation {c.name!r} is defined twice (first at line "
                                        f"{by_name[c.name].line})")
            if c.is_entry and any(o.is_entry for o in comps):
                raise LineError(c.line, f"module {name or '(headerless)'} has a second ENTRY computation {c.name!r}")
            comps.append(c)
            by_name[c.name] = c
        if not comps:
            raise ValueError(f"module {name} has no computations (truncated?)")
        if not name:
            entry = next((c for c in comps if c.is_entry), comps[-1])
            name = f"module_{entry.name}"
        return HloModule(name, comps, io_alias, self.filename, header_attrs=header_attrs,
                         source_tables=source_tables.strip())

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
        h = _SIGNATURE_LINE.match(text, m.end())
        declared = (_SHAPE_CACHE.get(h.group(1)) or _TUPLE_SHAPES.get(h.group(1))) if h is not None else None
        if declared is not None:  # '(params) -> shape {' on one line, the shape read before: as _signature reads it
            self.pos = h.end()  # type: ignore[union-attr]
        else:
            self.pos, declared = self._signature(name, m.end())
        comp = self.body(name, is_entry, line, defined)
        if declared is not None:
            shape = comp.root.shape
            if not (declared is shape or (declared.tuple_shapes is None and shape.tuple_shapes is None
                                          and declared.element_type == shape.element_type
                                          and declared.dims == shape.dims)):  # validate._compatible of arrays, inline
                check_result_shape(comp, declared)
        after = _ws_end(text, self.pos)
        comp.execution_thread = self._thread(name) if text.startswith(",", after) else ""
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
                if ins.is_root:
                    root = _add(name, ins, root, instructions, by_name)
                else:  # _add of an instruction that is not the ROOT
                    instructions.append(ins)
                    by_name[ins.name] = ins
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
            raise LineError(line, f"computation {name} has no instructions")
        check_parameter_numbers(name, instructions)
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
        Checks as ``check_instruction`` (its common case: :func:`check_line_instruction`); the
        attribute text, operands and called computation are read by the common cases of
        ``_attributes_end_here`` (inline), ``_one_line_operands`` and ``_called`` (this runs once per line)."""
        root, name, shape_text, opcode, inner, rest = fm.groups()
        if rest:  # not _attributes_end_here(rest), inline
            last = rest[-1]
            if rest[0] != "," or last.isspace():
                s = rest.strip()
                ok = not s or (s[0] == "," and s[-1] not in ",=")
            else:
                ok = last != "," and last != "="
            if not ok or rest.count("{") != rest.count("}") \
                    or (rest.count('"') - (rest.count('\\"') if "\\" in rest else 0)) % 2:
                return None
        if name in by_name or opcode in _SHAPE_BUILT_BY_XLA:
            return None
        literal = ""
        operands: list[str] | None
        if opcode in _LITERAL_OPCODES:
            operands = []
            literal = inner.strip()
        else:
            operands = _line_operands(inner, by_name)
        shape = _SHAPE_CACHE.get(shape_text) or _TUPLE_SHAPES.get(shape_text) or _line_shape(shape_text)
        if operands is None or shape is None:
            return None
        if "=" in rest and opcode not in _NO_CALL_OPCODES:
            called = _line_called(rest, opcode)
            if called is None:  # a computation written inline: the general reader takes it
                return None
        else:
            called = []
        async_wrapped, opcode = _async_sugar(opcode) if opcode.endswith(_ASYNC_SUFFIXES) else ("", opcode)
        start = fm.start(2)
        if start >= self._line_pos:  # self.line_at(start), inline
            self._line_no += self.text.count("\n", self._line_pos, start)
            self._line_pos = start
            line = self._line_no
        else:
            line = self.line_at(start)
        ins = Instruction(name, shape, opcode, operands, rest, bool(root), line, literal, called, async_wrapped)
        self.pos = start
        if "(" in literal or "output_to_operand_aliasing" in rest:
            check_instruction(ins, by_name, comps)
        else:
            check_line_instruction(ins, by_name, comps)
        self.pos = fm.end()
        return ins

    def _signature(self, name: str, i: int) -> tuple[int, Shape | None]:
        """Read '(params) -> shape' if present and the '{': the index after it and the declared
        result shape (None when there is no signature). The parameter list is skipped: XLA's
        parser does not compare it with the parameter instructions either."""
        text = self.text
        declared = None
        if text.startswith("(", i):
            j = text.find(")", i)
            close = j + 1 if j > 0 and "(" not in text[i + 1:j] and '"' not in text[i + 1:j] else _match_brace(text, i)
            i = _ws_end(text, close)
            if not text.startswith("->", i):
                raise ValueError(f"expected '->' after the parameters of {name}")
            j = _ws_end(text, i + 2)
            eol = text.find("\n", j)
            head = text[j:eol if eol >= 0 else len(text)].rstrip()
            key = head[:-1].rstrip() if head.endswith("{") else ""
            declared = (_SHAPE_CACHE.get(key) or _TUPLE_SHAPES.get(key)) if key else None
            if declared is not None:  # '-> shape {' on one line, the shape read before
                i = j + len(key)
            else:
                declared, i = parse_shape(text, j)
                if key and i == j + len(key) and declared.is_tuple and len(_TUPLE_SHAPES) < 100_000:
                    _TUPLE_SHAPES[key] = declared
            i = _ws_end(text, i)
        if not text.startswith("{", i):
            raise ValueError(f"expected '{{' opening computation {name}")
        return i + 1, declared

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
            raise LineError(line, f"instruction name {name!r} is used twice (first at line {defined_ins[name].line})")
        scope = _Scope(instructions, defined_ins, defined_comps, line, self)
        ins, self.pos = _rhs(self.text, head.end(), name, is_root, scope, 0)
        return ins


def _async_sugar(opcode: str) -> tuple[str, str]:
    """'call-start' -> ('call', 'async-start'): the wrapped opcode and the async opcode XLA reads the
    sugar as; ('', opcode) for the ops that are async of their own (all-reduce-start ...), and for what
    XLA does not read as sugar: an op that has async forms of its own (``all-gather-update``,
    ``copy-update``, ``send-start``: XLA says unknown opcode, and so does the check after this) or that
    is no opcode at all."""
    if opcode in _NATIVE_ASYNC:
        return "", opcode
    wrapped, _, kind = opcode.rpartition("-")
    if wrapped not in XLA_OPCODES or f"{wrapped}-start" in _NATIVE_ASYNC or f"{wrapped}-done" in _NATIVE_ASYNC:
        return "", opcode
    return wrapped, "async-" + kind


def _line_shape(text: str) -> Shape | None:
    """The shape of a one-line instruction: an array shape, or a tuple of array shapes (no nested
    tuple: the line's regex takes parentheses only inside layouts), remembered by its text; None
    when the text is not one whole shape (the general reader says what is wrong)."""
    if text[0] != "(":
        return _array_shape(text, 0)[0]
    try:
        shape, k = parse_shape(text)
    except ValueError:
        return None
    if k != len(text):
        return None
    if len(_TUPLE_SHAPES) < 100_000:
        _TUPLE_SHAPES[text] = shape
    return shape


def _add(comp: str, ins: Instruction, root: Instruction | None, instructions: list[Instruction],
         by_name: dict[str, Instruction]) -> Instruction | None:
    """Append an instruction to its computation; the ROOT so far (a second one is an error)."""
    if ins.is_root:
        if root is not None:
            raise LineError(ins.line, f"computation {comp} has a second ROOT {ins.name!r} (the first is {root.name!r})")
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
    called = _called(rest, opcode) if "=" in rest else []
    if called is None:
        raise ValueError("a computation written inline in a list of computations is not supported here")
    async_wrapped = ""
    if opcode.endswith(_ASYNC_SUFFIXES):
        async_wrapped, opcode = _async_sugar(opcode)
    if shape is None:
        shape = _infer_shape(opcode, operands, rest, scope.defined, scope.comps)
    if opcode in _SHAPE_BUILT_BY_XLA:
        shape = _built_shape(opcode, operands, shape, scope.defined)
    ins = Instruction(name, shape, opcode, operands, rest, is_root, scope.line, literal, called, async_wrapped)
    check_instruction(ins, scope.defined, scope.comps)
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


def _line_operands(inner: str, defined: dict[str, Instruction]) -> list[str] | None:
    """:func:`_one_line_operands`, with its common case inline: operands as XLA prints them,
    'f32[2,3]{1,0} %a, s32[] %b', every shape one read before and every name defined before."""
    if "[" in inner:  # _printed_operands, inline
        pieces = inner.split(" %")
        if len(pieces) > 1 and pieces[0] in _SHAPE_CACHE and pieces[-1] in defined:
            names = []
            for piece in pieces[1:-1]:
                name, comma, shape = piece.partition(", ")
                if not comma or name not in defined or shape not in _SHAPE_CACHE:
                    break
                names.append(name)
            else:
                names.append(pieces[-1])
                return names
    return _one_line_operands(inner, defined)


def _line_called(rest: str, opcode: str) -> list[str] | None:
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
    except LineError as exc:
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
            what = ("no such file" if not path.exists() and not path.is_symlink() else
                    "a link to nothing" if not path.exists() else "a directory" if path.is_dir() else
                    "not a regular file (a FIFO or a device)")
            raise HloParseError(f"{path}:1: cannot read: {what}")
        data = path.read_bytes()
    except OSError as exc:
        raise HloParseError(f"{path}:1: cannot read: {exc.strerror}") from None
    if data[:2] == b"\x1f\x8b":
        raise HloParseError(f"{path}:1: a gzip-compressed file, not HLO text; decompress it first (gunzip -k {path})")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise HloParseError(f"{path}:{line}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset "
                            f"{exc.start})") from None
    return parse_module(text, str(path))
