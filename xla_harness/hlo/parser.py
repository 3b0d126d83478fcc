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
This module assembles modules and computations and reads the one-line instruction's fast path;
the text's tokens are :mod:`xla_harness.hlo.lexer`'s, any other instruction is read by
:mod:`xla_harness.hlo.instructions`, and each parse reads its shapes through a
:class:`~xla_harness.hlo.shapes.ShapeTable` of its own.
"""

from __future__ import annotations

import gc
import re
from pathlib import Path

from xla_harness.errors import HarnessError
from xla_harness.hlo.inference import SHAPE_BUILT_BY_XLA
from xla_harness.hlo.instructions import (
    ASYNC_SUFFIXES,
    LITERAL_OPCODES,
    MAX_NESTING,
    NO_CALL_OPCODES,
    Scope,
    async_sugar,
    line_called,
    line_operands,
    line_shape,
    read_instruction,
)
from xla_harness.hlo.ir import Computation, HloModule, Instruction
from xla_harness.hlo.lexer import WS, match_brace, skip_attributes, skip_value, strip_comments, ws_end
from xla_harness.hlo.shapes import Shape, ShapeTable, parse_shape
from xla_harness.hlo.validate import (
    LineError,
    check_instruction,
    check_line_instruction,
    check_parameter_numbers,
    check_result_shape,
)


class HloParseError(HarnessError):
    """HLO text that cannot be read; the message names the file and line."""


_NAME = r"[A-Za-z_][\w.\-]*"
_NAME_RE = re.compile(rf"%?({_NAME})")
_HEADER = re.compile(r"HloModule\b\s*")
_FAST_LINE = re.compile(rf"\s*(ROOT[ \t]+)?%?({_NAME})[ \t]*=[ \t]*"
                        r"([a-z][a-z0-9]*\[[^\]\n]*\](?:\{[^{}\n]*\})?|\((?:[^(){}\n]|\{[^{}\n]*\})*\))"
                        r"[ \t]+([a-z][a-z0-9\-]*)\(([^()\"\n]*)\)([^\n]*)(?![^\n])(?!\s*,)")
# (the last two: the attributes run to the end of the line, and the next line does not go on
# with more of them)
# A computation's signature on one line, '(p: f32[2]) -> f32[2]{0} {': the declared shape's text (the
# parameter list is skipped, as _signature does); the match ends after the '{'.
_SIGNATURE_LINE = re.compile(r'\([^()"\n]*\)[ \t]*->[ \t]*([^\n]*?)[ \t]*\{(?=[ \t]*\n)')
_SECTION = re.compile(r"(FileNames|FunctionNames|FileLocations|StackFrames)\b")
_SECTION_ENTRY = re.compile(r"\s*\d+\s+")
_COMP_HEAD = re.compile(rf"\s*(ENTRY\s+)?%?({_NAME})\s*")
_NEXT = re.compile(rf"\s*(?:(\}})|(ROOT\s+)?%?({_NAME})\s*=\s*)")


class _Reader:
    """A cursor over the whole text; each method reads one construct and moves on."""

    def __init__(self, text: str, filename: str) -> None:
        self.text = text
        self.filename = filename
        self.shapes = ShapeTable()  # the shapes this parse reads, by their text
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
        m = WS.match(self.text, self.pos)
        assert m is not None  # '\s*' matches at every index (ws_end inline: this runs per token)
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
            end = skip_attributes(text, after)
            header_attrs = text[after:end]
            self.pos = end
            k = header_attrs.find("input_output_alias")
            if k >= 0:
                j = header_attrs.index("{", k)
                io_alias = header_attrs[j:match_brace(header_attrs, j)]
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
                self.pos = skip_value(text, e.end())

    def computation(self, defined: dict[str, Computation]) -> Computation:
        text = self.text
        start = self.ws()
        m = _COMP_HEAD.match(text, start)
        if m is None:
            raise ValueError(f"expected a computation near {text[start:start + 40]!r}")
        is_entry, name = bool(m.group(1)), m.group(2)
        line = self.line_at(start)
        h = _SIGNATURE_LINE.match(text, m.end())
        declared = self.shapes.get(h.group(1)) if h is not None else None
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
        after = ws_end(text, self.pos)
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
        if len(self.inline_stack) >= MAX_NESTING:
            raise ValueError(f"computations written inline nested deeper than {MAX_NESTING} levels")
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
        :func:`~xla_harness.hlo.lexer.attributes_end_here` (inline), :func:`~xla_harness.hlo.instructions.line_operands`
        and :func:`~xla_harness.hlo.instructions.line_called` (this runs once per line)."""
        root, name, shape_text, opcode, inner, rest = fm.groups()
        shapes = self.shapes
        if rest:  # not attributes_end_here(rest), inline
            last = rest[-1]
            if rest[0] != "," or last.isspace():
                s = rest.strip()
                ok = not s or (s[0] == "," and s[-1] not in ",=")
            else:
                ok = last != "," and last != "="
            if not ok or rest.count("{") != rest.count("}") \
                    or (rest.count('"') - (rest.count('\\"') if "\\" in rest else 0)) % 2:
                return None
        if name in by_name or opcode in SHAPE_BUILT_BY_XLA:
            return None
        literal = ""
        operands: list[str] | None
        if opcode in LITERAL_OPCODES:
            operands = []
            literal = inner.strip()
        else:
            operands = line_operands(inner, by_name, shapes.arrays)
        shape = shapes.arrays.get(shape_text) or shapes.tuples.get(shape_text) or line_shape(shape_text, shapes)
        if operands is None or shape is None:
            return None
        if "=" in rest and opcode not in NO_CALL_OPCODES:
            called = line_called(rest, opcode)
            if called is None:  # a computation written inline: the general reader takes it
                return None
        else:
            called = []
        async_wrapped, opcode = async_sugar(opcode) if opcode.endswith(ASYNC_SUFFIXES) else ("", opcode)
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
            close = j + 1 if j > 0 and "(" not in text[i + 1:j] and '"' not in text[i + 1:j] else match_brace(text, i)
            i = ws_end(text, close)
            if not text.startswith("->", i):
                raise ValueError(f"expected '->' after the parameters of {name}")
            j = ws_end(text, i + 2)
            eol = text.find("\n", j)
            head = text[j:eol if eol >= 0 else len(text)].rstrip()
            key = head[:-1].rstrip() if head.endswith("{") else ""
            declared = self.shapes.get(key) if key else None
            if declared is not None:  # '-> shape {' on one line, the shape read before
                i = j + len(key)
            else:
                declared, i = parse_shape(text, j, self.shapes)
                if key and i == j + len(key) and declared.is_tuple:
                    self.shapes.remember_tuple(key, declared)
            i = ws_end(text, i)
        if not text.startswith("{", i):
            raise ValueError(f"expected '{{' opening computation {name}")
        return i + 1, declared

    def _thread(self, name: str) -> str:
        """The ', execution_thread="..."' after a computation's '}' ('' when absent)."""
        text = self.text
        end = skip_attributes(text, self.pos)
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
        scope = Scope(instructions, defined_ins, defined_comps, line, self, self.shapes)
        ins, self.pos = read_instruction(self.text, head.end(), name, is_root, scope, 0)
        return ins



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
    reader = _Reader(strip_comments(text), filename)
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
