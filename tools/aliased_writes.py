#!/usr/bin/env python3
"""The table of a folder of #35409 compile records (results/tpu-aot/*/jaxPIN), with where W's
scatter writes: for each record, what the compiler made and, read from its optimized HLO, the
operand libtpu aliases to the output of each fusion holding a scatter of W's shard shape, as the
calling computation produces it (xla_harness.hlo.tied.aliased_scatter_writes).

    python tools/aliased_writes.py [--factors jit,donate,...] FOLDER...

One Markdown row per record: the options named by --factors (default: every option the records do
not all share), instructions, temp / aliased bytes, compile CPU s, hazard / fused data-moving
producer, libtpu aliased fusions (with a scatter), disagreements with the walk, and where the
aliased scatter writes (where no scatter fusion is aliased: where W's scatters add instead,
xla_harness.hlo.tied.tied_summary). W's shard: W[100352, 2048] of the full-size program (scale 1) split by its
embed_spec over the ("model", "data") = (2, 4) mesh of the v6e:2x4 target. The HLO is read from
FOLDER/<record's hlo> or the same name with .gz (tools/publish_hlo.py)."""

from __future__ import annotations

import gzip
import itertools
import json
import sys
import zlib
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MESH = {"model": 2, "data": 4, "none": 1}
VOCAB, D_MODEL = 100352, 2048


def w_shard(options: dict) -> tuple[int, int]:
    a, b = str(options.get("embed_spec", "model,data")).split(",")
    return VOCAB // MESH[a], D_MODEL // MESH[b]


def _embed_spec_ok(value: object) -> bool:
    parts = value.split(",") if isinstance(value, str) else []
    return len(parts) == 2 and all(p in MESH for p in parts)


def _file_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:  # a directory, or unreadable
        raise ValueError(f"{path}: not a file ({exc.strerror})") from None


def _gunzipped(path: Path) -> bytes:
    try:
        return gzip.decompress(_file_bytes(path))
    except (OSError, EOFError, zlib.error) as exc:  # not gzip, truncated, or corrupt within
        raise ValueError(f"{path}: not gzip ({exc})") from None


def _utf8(path: Path, data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not UTF-8 text (byte {exc.start})") from None


def hlo_file(folder: Path, record: dict) -> tuple[Path, str]:
    """The record's HLO file (FOLDER/<hlo>, or the same name with .gz) and its text; ValueError naming
    the file that is missing or is not (gzipped) UTF-8 text."""
    path = folder / record["hlo"]
    if path.exists():
        return path, _utf8(path, _file_bytes(path))
    gz = Path(f"{path}.gz")
    if gz.exists():
        return gz, _utf8(gz, _gunzipped(gz))
    raise ValueError(f"{path}: no such file (nor {gz.name})")


def hlo_text(folder: Path, record: dict) -> str:
    """The record's HLO (:func:`hlo_file`)."""
    return hlo_file(folder, record)[1]


def _check_aliasing(path: Path, module) -> None:
    """The compiler's aliasing field (``aliasing_operands`` in a fusion's backend_config) as the column
    reads it: JSON, ``{"lists": [{"indices": [...]}, ...]}``, each index a non-negative integer (or
    its decimal string). ValueError naming the file, line and fusion otherwise: read leniently, a
    malformed field would be a fusion the compiler did not alias, and the column would be wrong."""
    from xla_harness.hlo.compiler_alias import KEY, find_key

    for comp in module.computations:
        for ins in comp.instructions:
            if ins.opcode != "fusion" or KEY not in ins.attr_text:
                continue
            at = f"{path}:{ins.line}: {ins.name}'s backend_config"
            try:
                field = find_key(json.loads(ins.attrs.get("backend_config", "")), KEY)
            except (ValueError, RecursionError):
                raise ValueError(f"{at} names {KEY} but is not JSON") from None
            lists = field.get("lists") if isinstance(field, dict) else None
            if not isinstance(lists, list) or not all(isinstance(g, dict) for g in lists):
                raise ValueError(f'{at}: {KEY} is not {{"lists": [{{"indices": [...]}}, ...]}}')
            for group in lists:
                indices = group.get("indices", [])
                if not isinstance(indices, list) or not all(
                        (isinstance(i, int) and not isinstance(i, bool) and i >= 0)
                        or (isinstance(i, str) and i.isdecimal()) for i in indices):
                    raise ValueError(f"{at}: {KEY} indices {json.dumps(indices)[:60]} are not non-negative "
                                     "integers")


def where_written(folder: Path, record: dict) -> str:
    """The column "where the aliased scatter writes"; ValueError (or HloParseError, a HarnessError)
    naming the HLO file that is not a module the column can be read from."""
    from xla_harness.hlo.parser import parse_module

    shard = w_shard(record["options"])
    path, text = hlo_file(folder, record)
    module = parse_module(text, str(path))
    _check_aliasing(path, module)
    try:
        return _where_written(module, shard)
    except (IndexError, KeyError, AttributeError, TypeError, ValueError, RecursionError) as exc:
        # a module the parser takes whose instructions are not what the walk reads (a gather without operands)
        raise ValueError(f"{path}: not a module the column can be read from ({type(exc).__name__}: {exc})") \
            from None


def _where_written(module, shard: tuple[int, int]) -> str:
    from xla_harness.hlo.tied import aliased_scatter_writes, tied_summary

    writes = aliased_scatter_writes(module, shard)
    if writes:
        return "; ".join(w.text for w in writes)
    sources = [s.in_place_source for s in tied_summary(module, shard).scatters]
    words = {"broadcast": "broadcast zeros", "dense": "the dense gradient", "barrier": "a barrier's output",
             "parameter": "a parameter", "other": "other buffers"}
    into = ", ".join(f"{sources.count(k)} into {words[k]}" for k in words if k in sources)
    return f"no aliased scatter fusion ({len(sources)} scatters of W's shape{': ' + into if into else ''})"


def _gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB"


def row(folder: Path, record: dict, factors: list[str]) -> list[str]:
    fp, scan = record["fingerprint"], record["scan"]
    alias = scan.get("compiler_alias") or {}
    versions = record.get("versions", {})
    libtpu = versions.get("libtpu", "?")
    return [f"{versions.get('jax', '?')} / {libtpu}", *(str(record["options"].get(f, "")) for f in factors),
            f"{fp['instructions']:,}", f"{_gb(fp['temp_size_in_bytes'])} / {_gb(fp['alias_size_in_bytes'])}",
            f"{record['compile_cpu_s']:.0f}", f"{scan.get('hazard', 0)} / {scan.get('decisions', 0)}",
            f"{alias.get('aliased_fusions', 0)} ({alias.get('aliased_scatter_fusions', 0)})",
            str(alias.get("disagreements", 0)), where_written(folder, record)]


# The keys a row needs, with the JSON type each must have.
RECORD_KEYS = {"hlo": (str, "a string"), "options": (dict, "an object"), "fingerprint": (dict, "an object")}


def json_kind(value: object) -> str:
    """The JSON name of a parsed value's type, for error lines."""
    kinds = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}
    return kinds.get(type(value), "a number")


def _record(where: str, line: str) -> dict:
    try:
        rec = json.loads(line)
    except ValueError:
        rec = None
    if not isinstance(rec, dict) or not RECORD_KEYS.keys() <= rec.keys():
        raise ValueError(f"{where}: not a compile record with its HLO")
    for key, (kind, name) in RECORD_KEYS.items():
        if not isinstance(rec[key], kind):
            raise ValueError(f"{where}: {key} is {json_kind(rec[key])}, not {name}")
    return rec


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# What a row reads beyond RECORD_KEYS: (dotted path, required, check, what it must be). A field under
# one that is absent (or null: scan.compiler_alias) is not read.
ROW_FIELDS: list[tuple[str, bool, Callable[[object], bool], str]] = [
    ("fingerprint.instructions", True, _is_int, "an integer"),
    ("fingerprint.temp_size_in_bytes", True, _is_number, "a number"),
    ("fingerprint.alias_size_in_bytes", True, _is_number, "a number"),
    ("compile_cpu_s", True, _is_number, "a number"),
    ("scan", True, lambda v: isinstance(v, dict), "an object"),
    ("scan.hazard", False, _is_int, "an integer"),
    ("scan.decisions", False, _is_int, "an integer"),
    ("scan.compiler_alias", False, lambda v: v is None or isinstance(v, dict), "an object"),
    ("scan.compiler_alias.aliased_fusions", False, _is_int, "an integer"),
    ("scan.compiler_alias.aliased_scatter_fusions", False, _is_int, "an integer"),
    ("scan.compiler_alias.disagreements", False, _is_int, "an integer"),
    ("versions", False, lambda v: isinstance(v, dict), "an object"),
    ("versions.jax", False, lambda v: isinstance(v, str), "a string"),
    ("versions.libtpu", False, lambda v: isinstance(v, str), "a string"),
    ("options.embed_spec", False, _embed_spec_ok, "two of model, data, none joined by a comma"),
]


def check_row_fields(where: str, rec: dict) -> None:
    """ValueError naming the record (``where``) and the first field a row reads that is missing or is
    not what the row needs; and the hlo field, which must name a file."""
    hlo = rec["hlo"]
    if not hlo.strip() or "\0" in hlo:
        raise ValueError(f"{where}: hlo is {json.dumps(hlo)[:80]}, not a file name")
    for dotted, required, ok, name in ROW_FIELDS:
        *parents, key = dotted.split(".")
        holder: object = rec
        for parent in parents:
            holder = holder.get(parent) if isinstance(holder, dict) else None
        if not isinstance(holder, dict):
            continue
        if key not in holder:
            if required:
                raise ValueError(f"{where}: no {dotted}")
            continue
        if not ok(holder[key]):
            shown = json.dumps(holder[key])
            value = shown if isinstance(holder[key], str) and len(shown) <= 40 else json_kind(holder[key])
            raise ValueError(f"{where}: {dotted} is {value}, not {name}")


def _lines(path: Path) -> list[str]:
    if not path.is_file():
        raise ValueError(f"{path} is not a file")
    lines = _utf8(path, _file_bytes(path)).splitlines()
    if not lines:
        raise ValueError(f"{path}: no compile records")
    return lines


def read_records(folders: list[str]) -> list[tuple[Path, dict]]:
    """Every compile record of each FOLDER/compile.jsonl, with its folder; ValueError naming the first
    folder without one or without records, or the first line that is not a compile record with its HLO."""
    records: list[tuple[Path, dict]] = []
    for name in folders:
        folder = Path(name)
        path = folder / "compile.jsonl"
        records += [(folder, _record(f"{path}:{n}", line)) for n, line in enumerate(_lines(path), 1)]
    return records


def table_rows(records: list[tuple[Path, dict]], factors: list[str]) -> list[list[str]]:
    """Every row, read before any is printed (a bad record or HLO file leaves no half table);
    ValueError or HarnessError naming the record or the file."""
    for folder, group in itertools.groupby(records, key=lambda fr: fr[0]):  # one group a FOLDER argument
        for n, (_, rec) in enumerate(group, 1):
            check_row_fields(f"{folder / 'compile.jsonl'}:{n}", rec)
    return [row(folder, rec, factors) for folder, rec in records]


def main(argv: list[str]) -> int:
    factors: list[str] | None = None
    if argv[:1] == ["--factors"]:
        if len(argv) < 2:
            print("error: --factors takes a comma-separated list of option names", file=sys.stderr)
            return 2
        factors, argv = argv[1].split(","), argv[2:]
    if not argv:
        print("error: usage: python tools/aliased_writes.py [--factors a,b,...] FOLDER... (folders of compile.jsonl)",
              file=sys.stderr)
        return 2
    from xla_harness.errors import HarnessError  # HloParseError, naming the HLO file and line

    try:
        records = read_records(argv)
        if factors is None:
            keys = sorted({k for _, r in records for k in r["options"]})
            factors = [k for k in keys if len({json.dumps(r["options"].get(k)) for _, r in records}) > 1]
        rows = table_rows(records, factors)
    except (ValueError, HarnessError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    header = ["jax / libtpu", *factors, "instructions", "temp / aliased", "compile CPU s",
              "hazard / fused data-moving producer", "libtpu aliased fusions (with a scatter)",
              "disagreements with the walk", "where the aliased scatter writes"]
    print("| " + " | ".join(header) + " |")
    print("|" + " --- |" * len(header))
    for cells in rows:
        print("| " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
