"""A dump's files, read and held to each other before any verdict: the module, its buffer assignment
and (where dumped) the compiler's live range must be one compile's, complete and well-formed;
otherwise :class:`~xla_harness.errors.HarnessError` names the file and line (exit 2), never a
verdict drawn from files that do not belong together."""

from __future__ import annotations

import gzip
import io
import re
import zlib
from pathlib import Path

from xla_harness.errors import HarnessError
from xla_harness.hlo.ir import HloModule
from xla_harness.hlo.memplan.checks import Stages
from xla_harness.hlo.memplan.model import io_alias
from xla_harness.hlo.memplan.values import indices
from xla_harness.hlo.timeline import LiveRangeDump, Timeline, sequence_disagreements
from xla_harness.runtime.files import read_regular

GUNZIP_CHUNK = 1 << 22  # bytes decompressed between two returns to the interpreter (where a signal acts)
_ALLOC = re.compile(r"^allocation (-?\d+): size (-?\d+)(.*):\s*$")
_VALUE = re.compile(r"^ value: <(-?\d+) ([^\s{@>]+)(\{[\d,\s]*\})?( \(phi\))?(?: @(\d+))?> "
                    r"\(size=(-?\d+),offset=(-?\d+)\): (\S.*)$")
_ARRAY = re.compile(r"^(\w+)\[([\d,]*)\]")
_PARAMETER = re.compile(r"\bparameter (\d+), shape \|([^|]*)\| at ShapeIndex \{([\d,\s]*)\}")
_SECTION_END = ("Total bytes used", "Used values:", "HloLiveRange")


def read_text(path: Path) -> str:
    """A dump file's text, gzip-compressed or not."""
    data = read_regular(path)
    if data[:2] == b"\x1f\x8b":
        data = gunzip(data, path)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise HarnessError(f"{path}: not UTF-8 text (byte offset {exc.start})") from None


def gunzip(data: bytes, path: Path) -> bytes:
    """``data`` decompressed a few MiB at a time, so Ctrl-C stops a large dump's read at once (one call
    of ``gzip.decompress`` holds the interpreter until the whole file is out)."""
    parts = []
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(data)) as fh:
            while chunk := fh.read(GUNZIP_CHUNK):
                parts.append(chunk)
    except (OSError, EOFError, zlib.error) as exc:
        raise HarnessError(f"{path}: a broken gzip file ({exc})") from None
    return b"".join(parts)


def beside(module_path: Path, suffix: str) -> Path | None:
    """``X.txt[.gz]`` -> ``X-<suffix>.txt[.gz]`` when it exists."""
    name = module_path.name
    stem = name.removesuffix(".gz").removesuffix(".txt")
    for ext in (".txt", ".txt.gz"):
        p = module_path.with_name(f"{stem}-{suffix}{ext}")
        if p.is_file():
            return p
    return None


def backend_of(module: HloModule, path: str) -> str:
    if "aliasing_operands" in module.header_attrs or "tpu" in path.lower():
        return "tpu"
    if "_gpu_" in path or ".sm_" in path or "gpu" in path.lower():
        return "gpu"
    return "cpu"


def _array(text: str) -> tuple[str, str] | None:
    m = _ARRAY.match(text.strip())
    return (m.group(1), m.group(2)) if m else None


def check_buffer_text(text: str, name: str) -> None:
    """The buffer assignment is whole and well-formed: every line of its allocation list is an allocation
    or a value line, the last one ended; sizes and offsets are non-negative and inside their
    allocation; value ids are unique."""
    lines = text.split("\n")
    if text and not text.endswith("\n"):  # XLA ends every line, the last one too
        raise HarnessError(f"{name}:{len(lines)}: the file ends mid-line: cut short")
    seen: dict[int, int] = {}
    alloc: tuple[int, int] | None = None  # (size, line) of the allocation the values belong to
    for lineno, line in enumerate(lines[:-1], 1):
        if line.startswith(_SECTION_END):
            break
        if not line.strip() or line == "BufferAssignment:":
            continue
        if line.startswith("allocation"):
            m = _ALLOC.match(line)
            if m is None or int(m.group(2)) < 0:
                raise HarnessError(f"{name}:{lineno}: not an allocation line as XLA prints it")
            alloc = (int(m.group(2)), lineno)
            continue
        _check_value_line(line, f"{name}:{lineno}", alloc, seen)
        seen[int(line.split("<", 1)[1].split()[0])] = lineno


def _check_value_line(line: str, where: str, alloc: tuple[int, int] | None, seen: dict[int, int]) -> None:
    m = _VALUE.match(line)
    if m is None:
        raise HarnessError(f"{where}: not a value line as XLA prints it")
    vid, size, offset = int(m.group(1)), int(m.group(6)), int(m.group(7))
    if size < 0 or offset < 0:
        raise HarnessError(f"{where}: a negative {'size' if size < 0 else 'offset'}")
    if alloc is None:
        raise HarnessError(f"{where}: a value line before any allocation")
    if offset + size > alloc[0]:
        raise HarnessError(f"{where}: bytes [{offset}, {offset + size}) run past the end of allocation of size "
                           f"{alloc[0]} (line {alloc[1]})")
    if vid in seen:
        raise HarnessError(f"{where}: value id {vid} is also the value of line {seen[vid]}")


def check_one_compile(s: Stages, ba_text: str, name: str) -> None:
    """The module and the buffer assignment are one compile's: every value names an instruction of the
    module (or a hidden wrapped instruction tied to one of its async starts) at an index of its shape,
    with that shape's element type and dimensions; each parameter allocation holds the module's entry
    parameter with its shape; a parameter's allocation is live out only where the module donates it or
    returns it, and a donated one is live out (the sibling compile with the other donation fails here)."""
    module, hidden = s.plan.module, s.plan.hidden
    shapes = {ins.name: ins.shape for comp in module.computations for ins in comp.instructions}
    untied = {v.id for v in hidden.untied}
    tied = set(hidden.positions.values()) | set(hidden.tables)
    lines: dict[int, tuple[int, str]] = {}
    for i, line in enumerate(ba_text.split("\n"), 1):
        m = _VALUE.match(line)
        if m:
            lines.setdefault(int(m.group(1)), (i, m.group(8)))
    for a in s.plan.ba.allocations:
        for v in a.values:
            lineno, printed = lines.get(v.id, (1, ""))
            where = f"{name}:{lineno}"
            shape = shapes.get(v.name)
            if shape is None:
                if v.id in tied or v.id in untied or v.phi:  # untied: left out, and said so (coverage)
                    continue
                raise HarnessError(f"{where}: {v.name} is no instruction of the module: {_NOT_ONE}")
            try:
                sub = shape.subshape(v.index)
            except IndexError:
                raise HarnessError(f"{where}: {v.name} has no index {{{','.join(map(str, v.index))}}} in the module's "
                                   f"shape {shape}: {_NOT_ONE}") from None
            theirs = _array(printed)
            if theirs and sub.tuple_shapes is None and theirs != (sub.element_type, ",".join(map(str, sub.dims))):
                raise HarnessError(f"{where}: {v.name} is {printed} here and {sub} in the module: {_NOT_ONE}")
    _check_parameters(s, name)


_NOT_ONE = "the buffer assignment and the module are not one compile's"


def _check_parameters(s: Stages, name: str) -> None:
    module = s.plan.module
    params = {p.parameter_number: p for p in module.entry.instructions if p.opcode == "parameter"}
    donated = {n for _, (n, _) in io_alias(module.input_output_alias)}
    root = module.entry.root
    returned = {vid for idx in indices(root.shape) for vid in s.flow.at((root.name, idx))}
    for a in s.plan.ba.allocations:
        m = _PARAMETER.search(a.attributes)
        if m is None:
            continue
        n = int(m.group(1))
        p = params.get(n)
        if p is None:
            raise HarnessError(f"{name}: allocation {a.number} holds entry parameter {n}, which the module does not "
                               f"have: {_NOT_ONE}")
        index = tuple(int(x) for x in m.group(3).split(",") if x.strip())
        try:
            sub = p.shape.subshape(index)
        except IndexError:
            sub = None
        if sub is None or (_array(m.group(2)) and _array(m.group(2)) != _array(str(sub))):
            raise HarnessError(f"{name}: allocation {a.number} holds parameter {n} as {m.group(2)}, the module's is "
                               f"{p.shape}: {_NOT_ONE}")
        live_out = "maybe-live-out" in a.attributes
        if n in donated and not live_out:
            raise HarnessError(f"{name}: the module donates parameter {n} (input_output_alias), but allocation "
                               f"{a.number} holding it is not live out: the buffer assignment is of a compile that "
                               "does not donate it")
        if live_out and n not in donated and s.plan.by_pos.get((p.name, index)) not in returned:
            raise HarnessError(f"{name}: allocation {a.number} of parameter {n} is live out, but the module neither "
                               f"donates parameter {n} nor returns it: the buffer assignment is of a compile that "
                               "donates it")


def check_live_range(dump: LiveRangeDump, tl: Timeline, name: str) -> None:
    """The live range is this module's: its instruction sequence is the module's schedule."""
    wrong = sequence_disagreements(dump, tl)
    if wrong:
        raise HarnessError(f"{name} (live range): its instruction sequence is not the module's schedule "
                           f"({len(wrong)} differences; the first: {wrong[0]}): not one compile's")
