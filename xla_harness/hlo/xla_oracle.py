"""Differential check of the HLO reader against XLA's own parser (through jaxlib).

``compare(text)`` parses the text with both and returns a ``Verdict``: does each accept it,
and, when both do, the first difference in computations, instruction order, names, opcodes,
shapes (with layouts), operands and roots. XLA's side is read from the parsed module's
objects (``computations()``, ``instructions()``, ``operands()``), the roots and the entry
from its reprint. Two things XLA adds while parsing are mapped back: a ``name#k`` operand
becomes a get-tuple-element instruction in XLA (read back as ``name#k``), and async sugar
(``call-start``) gets a wrapped computation that the text does not have. XLA makes names
unique in the module (a second ``p0`` becomes ``p0.1``): names are matched by stem in order.
The computations each instruction calls are compared too (as sets). Not compared: the
element size ``E(n)`` of a layout (XLA's printer omits the default one).

XLA's parser aborts the process on some inputs (a CHECK failure: a parameter number out of
range, "is not scheduled after its operand" on scheduled dumps). :class:`IsolatedXlaParser`
runs it in a child process (``python -m xla_harness.hlo.xla_oracle``, one JSON line per text
each way) and turns such an end into the verdict ``crashed`` (signal or exit status, XLA's
last log line); ``compare(text, xla=...)`` and :func:`compare_many` use it.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from xla_harness.errors import HarnessError
from xla_harness.hlo.ir import Computation, HloModule
from xla_harness.hlo.parser import HloParseError, parse_module
from xla_harness.hlo.shapes import Shape, parse_shape
from xla_harness.runtime import subproc

_COMMENT = re.compile(r"/\*.*?\*/")
_UNIQUE_SUFFIX = re.compile(r"\.\d+$")
_ELEMENT_SIZE = re.compile(r"E\(\d+\)")

_KEBAB = re.compile(r"(?<!^)(?=[A-Z])")
_OPCODE_EXCEPTIONS = {"kClz": "count-leading-zeros", "kCos": "cosine", "kExp": "exponential",
                      "kExpm1": "exponential-minus-one", "kLog1p": "log-plus-one",
                      "kOptimizationBarrier": "opt-barrier", "kPopulationCount": "popcnt", "kSin": "sine",
                      "kTopK": "topk"}
_COMP_LINE = re.compile(r"^(ENTRY )?%?(\S+) .*\{\s*$|^(ENTRY )?%?(\S+) \{\s*$")
_ROOT_LINE = re.compile(r"^\s*ROOT %?([^\s=]+) =")
_INDEX_ATTR = re.compile(r"index=(\d+)")
_XLA_CALL = re.compile(r"(?<![\w.\-])(calls|to_apply|body|condition|true_computation|false_computation|"
                       r"branch_computations|called_computations|select|scatter)=(\{[^}]*\}|%?[^\s,{}]+)")


def opcode_text(enum_name: str) -> str:
    """'kGetTupleElement' -> 'get-tuple-element' (XLA's opcode strings)."""
    return _OPCODE_EXCEPTIONS.get(enum_name) or _KEBAB.sub("-", enum_name[1:]).lower()


def _norm_shape(shape: Shape) -> tuple:
    """Leaves as (type, dims, layout, tiles, buffer), XLA's default layout where none is printed."""
    return tuple((s.element_type, s.dims, s.layout_or_default() if s.dims or s.minor_to_major else (),
                  _ELEMENT_SIZE.sub("", s.layout_extra), s.is_buffer) for _, s in shape.leaves()) + (
        ("tuple-arity", len(shape.tuple_shapes)) if shape.tuple_shapes is not None else ())


@dataclass
class Verdict:
    xla_accepts: bool
    ours_accepts: bool
    mismatch: str = ""  # first structural difference when both accept
    xla_error: str = ""
    ours_error: str = ""
    reprint: str = ""  # XLA's to_string() when it accepts
    xla_crashed: str = ""  # how XLA's parser ended its process (isolated runs only), '' when it did not

    @property
    def category(self) -> str:
        if self.xla_crashed:
            return "xla-crashed"
        if self.xla_accepts and not self.ours_accepts:
            return "ours-rejects"
        if self.ours_accepts and not self.xla_accepts:
            return "ours-accepts-xla-rejects"
        if self.xla_accepts and self.mismatch:
            return "mismatch"
        return "agree"


# XLA's side of one computation: its root's name and a row per instruction, (name, opcode,
# shape text, operand names, tuple index of a get-tuple-element or -1, computations it calls).
# Plain data, so a child process can send it back as JSON.
XlaRow = tuple[str, str, str, list[str], int, list[str]]
XlaComputation = tuple[str, list[XlaRow]]


def xla_structure(xla_module, reprint: str) -> tuple[dict[str, XlaComputation], str]:
    """{computation: (root, [rows])} and the entry name, from XLA's objects."""
    roots: dict[str, str] = {}
    entry = ""
    current = None
    for line in reprint.splitlines():
        m = _COMP_LINE.match(line)
        if m and not line.startswith(" "):
            current = m.group(2) or m.group(4)
            if m.group(1) or m.group(3):
                entry = current
            continue
        r = _ROOT_LINE.match(line)
        if r and current is not None:
            roots[current] = r.group(1)
    out: dict[str, XlaComputation] = {}
    for comp in xla_module.computations():
        rows: list[XlaRow] = []
        for ins in comp.instructions():
            printed = ins.to_string()
            opcode = opcode_text(ins.opcode.name)
            m = _INDEX_ATTR.search(printed) if opcode == "get-tuple-element" else None
            called = sorted(n.strip().lstrip("%") for c in _XLA_CALL.finditer(printed)
                            for n in c.group(2).strip("{}").split(",") if n.strip())
            rows.append((ins.name, opcode, _COMMENT.sub("", str(ins.shape)),
                         [o.name for o in ins.operands()], int(m.group(1)) if m else -1, called))
        out[comp.name] = (roots.get(comp.name, rows[-1][0] if rows else ""), rows)
    return out, entry


def compare_structures(ours: HloModule, xla_module, reprint: str) -> str:
    """The first difference between our reading and XLA's, '' when none."""
    return compare_to_structure(ours, *xla_structure(xla_module, reprint))


def compare_to_structure(ours: HloModule, xla: dict[str, XlaComputation], xla_entry: str) -> str:
    """The first difference between our reading and XLA's (as :func:`xla_structure` gives it)."""
    has_sugar = any(i.async_wrapped for c in ours.computations for i in c.instructions)
    xla_names = list(xla)
    matched: dict[str, str] = {}  # ours -> XLA (XLA makes names unique in the module)
    k = 0
    for comp in ours.computations:
        j = k
        while j < len(xla_names) and not _same_stem(comp.name, xla_names[j]):
            j += 1
        if j == len(xla_names):
            return f"ours has computation {comp.name} that XLA does not"
        if j > k and not has_sugar:
            return f"XLA has computations {xla_names[k:j][:3]} that ours does not"
        matched[comp.name] = xla_names[j]
        k = j + 1
    if k < len(xla_names) and not has_sugar:
        return f"XLA has computations {xla_names[k:][:3]} that ours does not"
    if xla_entry and matched.get(ours.entry.name) != xla_entry:
        return f"entry: ours {ours.entry.name}, XLA {xla_entry}"
    for comp in ours.computations:
        xla_root, xla_rows = xla[matched[comp.name]]
        diff = _compare_computation(comp, xla_root, xla_rows, matched)
        if diff:
            return f"computation {comp.name}: {diff}"
    return ""


def _compare_computation(comp: Computation, xla_root: str, xla_rows: list[XlaRow], matched: dict[str, str]) -> str:
    synthesized: set[str] = set()  # XLA's names for the get-tuple-elements it makes of 'p#1#0': p_1, p_1_0
    for i in comp.instructions:
        for o in i.operands:
            parts = o.split("#")
            synthesized.update("_".join(parts[:n]) for n in range(2, len(parts) + 1))
    alias: dict[str, str] = {}  # XLA's synthesized get-tuple-element -> 'base#k'
    rows: list[XlaRow] = []
    extra = len(xla_rows) - len(comp.instructions)
    for name, opcode, shape, operands, index, called in xla_rows:
        operands = [alias.get(o, o) for o in operands]
        if (extra > 0 and opcode == "get-tuple-element"
                and (name in synthesized or _UNIQUE_SUFFIX.sub("", name) in synthesized)):
            extra -= 1
            alias[name] = f"{operands[0]}#{index if index >= 0 else '?'}"
            continue
        rows.append((name, opcode, shape, operands, index, called))
    if len(rows) != len(comp.instructions):
        return f"{len(comp.instructions)} instructions, XLA {len(rows)}"
    renamed = {}  # XLA makes names unique in the module: 'p0' in a second computation is 'p0.1'
    for ins, row in zip(comp.instructions, rows, strict=True):
        if ins.name != row[0] and _same_stem(ins.name, row[0]):
            renamed[row[0]] = ins.name
    def ref(o: str) -> str:
        base, sep, k = o.partition("#")
        return renamed.get(base, base) + sep + k

    rows = [(renamed.get(n, n), op, sh, [ref(o) for o in ops], k, c) for n, op, sh, ops, k, c in rows]
    xla_root = ref(alias.get(xla_root, xla_root))
    for ins, row in zip(comp.instructions, rows, strict=True):
        diff = _compare_instruction(ins, *row[:4]) or _compare_called(ins, row[5], matched)
        if diff:
            return diff
    if comp.root.name != xla_root:
        return f"root: ours {comp.root.name}, XLA {xla_root}"
    return ""


def _compare_instruction(ins, name: str, opcode: str, shape: str, operands: list[str]) -> str:
    """The first difference in one instruction, '' when none."""
    if ins.name != name:
        return f"instruction order: ours {ins.name}, XLA {name}"
    if ins.opcode != opcode:
        return f"{name}: opcode ours {ins.opcode}, XLA {opcode}"
    if _norm_shape(ins.shape) != _norm_shape(parse_shape(shape)[0]):
        return f"{name}: shape ours {ins.shape}, XLA {shape}"
    ours_ops = list(ins.operands)
    if ins.async_wrapped and ins.opcode != "async-start":
        ours_ops = ours_ops[:len(operands)]
    if ours_ops != operands:
        return f"{name}: operands ours {ours_ops}, XLA {operands}"
    return ""


def _compare_called(ins, xla_called: list[str], matched: dict[str, str]) -> str:
    """The computations an instruction calls (calls=, to_apply=, body= ...), as sets."""
    if ins.async_wrapped or ins.opcode.startswith("async-"):
        return ""  # XLA wraps the sugar's callee in a computation the text does not have
    ours = sorted(matched.get(c, c) for c in ins.called)
    if ours != xla_called:
        return f"{ins.name}: calls ours {ours}, XLA {xla_called}"
    return ""


def _same_stem(ours: str, xla: str) -> bool:
    return _UNIQUE_SUFFIX.sub("", ours) == _UNIQUE_SUFFIX.sub("", xla) or _UNIQUE_SUFFIX.sub("", xla) == ours


def _xla_hlo():
    """jaxlib's module holding XLA's HLO parser; HarnessError when this jaxlib cannot serve."""
    from xla_harness import jaxcompat
    from xla_harness.errors import HarnessError

    if not jaxcompat.xla_hlo_reads_structure():
        import jaxlib

        raise HarnessError(f"jaxlib {jaxlib.__version__} does not expose the instructions and shapes of "
                           "XLA's parsed HLO module (jaxlib >= 0.12 does): the XLA comparison needs a newer jaxlib")
    return jaxcompat.xla_hlo()


@dataclass
class XlaParse:
    """XLA's verdict on one text. ``crashed`` says how its parser ended the process that ran
    it ('' when it did not), e.g. 'SIGABRT: Check failed: ...'; ``structure`` and ``entry``
    are :func:`xla_structure`'s answer when asked for and XLA accepts."""

    accepts: bool
    error: str = ""
    crashed: str = ""
    reprint: str = ""
    structure: dict[str, XlaComputation] | None = None
    entry: str = ""
    cpu_s: float = 0.0  # process CPU time of the parse alone
    wall_s: float = 0.0


def _error_text(exc: Exception) -> str:
    lines = str(exc).splitlines()  # the first line is generic; the second says where and why
    return " ".join(lines[1:3] or lines)[:200]


def xla_parse(text: str, structure: bool = True) -> tuple[XlaParse, Any]:
    """XLA's parser on ``text`` in this process (a CHECK failure in it ends the process:
    :class:`IsolatedXlaParser` runs it in a child); the verdict and the parsed module."""
    xla_hlo = _xla_hlo()
    c0, t0 = time.process_time(), time.perf_counter()
    try:
        module = xla_hlo.hlo_module_from_text(text)
    except Exception as exc:  # noqa: BLE001 - any rejection by XLA counts
        return XlaParse(False, _error_text(exc)), None
    cpu, wall = time.process_time() - c0, time.perf_counter() - t0
    if not structure:
        return XlaParse(True, cpu_s=cpu, wall_s=wall), module
    reprint = module.to_string()
    comps, entry = xla_structure(module, reprint)
    return XlaParse(True, reprint=reprint, structure=comps, entry=entry, cpu_s=cpu, wall_s=wall), module


class IsolatedXlaParser:
    """XLA's parser in a child process: a crash of it (a CHECK failure aborts the process, as
    on some scheduled dumps) becomes the verdict ``crashed`` for that text, and the next text
    goes to a fresh child. One child serves texts one after another while it lives.

        with IsolatedXlaParser() as xla:
            verdict = xla.parse(text)
    """

    def __init__(self, timeout: float = 600.0) -> None:
        self.timeout = timeout
        self._proc: subprocess.Popen | None = None
        self._stderr: Any = None

    def __enter__(self) -> IsolatedXlaParser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            if proc.stdin is not None:
                proc.stdin.close()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                subproc.signal_group(proc, signal.SIGKILL)
                proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None

    def _start(self) -> subprocess.Popen:
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as the child
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        # In its own process group, killed as a group (xla_harness.runtime.subproc) when it does not answer.
        self._proc = subproc.start([sys.executable, "-m", "xla_harness.hlo.xla_oracle"], stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, stderr=self._stderr, env=env, text=True)
        return self._proc

    def parse(self, text: str | None, structure: bool = True) -> XlaParse:
        """XLA's verdict on ``text`` (None: the text of the previous call again, as a timing
        loop wants it, without sending it again)."""
        proc = self._proc or self._start()
        assert proc.stdin is not None and proc.stdout is not None
        request = {"structure": structure} if text is None else {"text": text, "structure": structure}
        timed_out = threading.Event()

        def kill() -> None:
            timed_out.set()
            subproc.signal_group(proc, signal.SIGKILL)

        timer = threading.Timer(self.timeout, kill)
        timer.start()
        try:
            proc.stdin.write(json.dumps(request) + "\n")
            proc.stdin.flush()
            line = proc.stdout.readline()
        except (BrokenPipeError, OSError):
            line = ""
        finally:
            timer.cancel()
        if line:
            return _from_json(json.loads(line))
        return XlaParse(False, crashed=self._ended(proc, timed_out.is_set()))

    def _ended(self, proc: subprocess.Popen, timed_out: bool) -> str:
        """How the child ended while parsing: its signal or exit status and XLA's last words."""
        try:
            code = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            subproc.signal_group(proc, signal.SIGKILL)
            code = proc.wait()
        self._proc = None
        why = ""
        if self._stderr is not None:
            self._stderr.seek(0)
            log = self._stderr.read().decode("utf-8", "replace").splitlines()
            self._stderr.close()
            self._stderr = None
            checks = [ln for ln in log if "Check failed" in ln]
            why = (checks or [ln for ln in log if ln.strip()] or [""])[-1].strip()
            k = why.find("Check failed")
            why = (why[k:] if k >= 0 else why)[:600]  # without the log line's time and place
        if code < 0:
            try:
                how = signal.Signals(-code).name
            except ValueError:
                how = f"signal {-code}"
        else:
            how = f"exit status {code}"
        if timed_out:
            how = f"no answer in {self.timeout:g} s, killed ({how})"
        return f"{how}: {why}" if why else how


def _from_json(row: dict) -> XlaParse:
    structure = row.get("structure")
    if structure is not None:
        structure = {name: (root, [tuple(r) for r in rows]) for name, (root, rows) in structure.items()}
    return XlaParse(row["accepts"], row.get("error", ""), "", row.get("reprint", ""), structure,
                    row.get("entry", ""), row.get("cpu_s", 0.0), row.get("wall_s", 0.0))


def _serve() -> int:
    """The child's side of :class:`IsolatedXlaParser`: one JSON request a line on stdin, one
    JSON answer a line on stdout."""
    last = ""
    for line in sys.stdin:
        request = json.loads(line)
        last = request.get("text", last)
        try:
            verdict, _ = xla_parse(last, request.get("structure", True))
        except HarnessError as exc:
            verdict = XlaParse(False, f"cannot run XLA's parser: {exc}")
        row = {"accepts": verdict.accepts, "error": verdict.error, "reprint": verdict.reprint,
               "structure": verdict.structure, "entry": verdict.entry, "cpu_s": verdict.cpu_s,
               "wall_s": verdict.wall_s}
        sys.stdout.write(json.dumps(row) + "\n")
        sys.stdout.flush()
    return 0


def compare(text: str, filename: str = "<string>", xla: IsolatedXlaParser | None = None) -> Verdict:
    """Parse ``text`` with XLA (jaxlib) and with ours; say where they disagree. XLA's parser
    runs in this process unless ``xla`` is given (then in its child process, where a crash
    of XLA's parser is the verdict ``xla_crashed``)."""
    if xla is None:
        parsed, _ = xla_parse(text)
    else:
        _xla_hlo()  # a jaxlib that cannot serve is an error here, not a verdict on the text
        parsed = xla.parse(text)
    try:
        ours = parse_module(text, filename)
        ours_ok, ours_err = True, ""
    except HloParseError as exc:
        ours, ours_ok, ours_err = None, False, str(exc)
    xla_err = f"XLA's parser crashed ({parsed.crashed})" if parsed.crashed else parsed.error
    verdict = Verdict(parsed.accepts, ours_ok, "", xla_err, ours_err, parsed.reprint, parsed.crashed)
    if ours is not None and parsed.accepts and parsed.structure is not None:
        verdict.mismatch = compare_to_structure(ours, parsed.structure, parsed.entry)
    return verdict


def compare_many(texts: list[tuple[str, str]], timeout: float = 600.0) -> list[Verdict]:
    """:func:`compare` of each (text, filename), XLA's parser in one child process for the
    batch (a fresh one after a crash)."""
    with IsolatedXlaParser(timeout) as xla:
        return [compare(text, filename, xla) for text, filename in texts]


if __name__ == "__main__":
    raise SystemExit(_serve())
