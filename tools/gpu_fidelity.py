#!/usr/bin/env python3
"""How close an ahead-of-time compile comes to a GPU's own: compile the #35409 program for a cuda:
target and hold its HLO against the device's committed compile, fusion by fusion (``make gpu-fidelity``).

    python tools/gpu_fidelity.py --device results/gpu/h200-2026-11-26/compile-only \\
        --out results/gpu/h200-2026-11-26/fidelity [--target cuda:h200:1x1x1] [--autotune-results FILE]

Run it in the venv of the jax the device ran (the make target builds ``.venv-jax0.11.2`` with the CUDA 13
plugin). ``--device`` is a ``stress --compile-only`` folder from the device (compile.jsonl, the optimized
HLO under hlo/, gzipped or not). The ahead-of-time compile is ``xla-harness stress --program
issue-35409 --compile-only --target T`` (the same program and options as the device's record) into
OUT/aot/, its dump gzipped with tools/publish_hlo.py; OUT/table.md is the comparison
(:mod:`xla_harness.hlo.fidelity`) with both compiles' versions and figures, OUT/fidelity.json the same
as data. ``--aot DIR`` compares an existing compile-only folder instead of compiling. Exit 0 when the
table was written, 2 on bad input (one ``error:`` line).
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMPILE_TIMEOUT_S = 1800  # one full-size ahead-of-time GPU compile takes minutes on 2 cores
PUBLISH_TIMEOUT_S = 600
sys.path.insert(0, str(ROOT))

from xla_harness import subproc  # noqa: E402
from xla_harness.errors import HarnessError  # noqa: E402
from xla_harness.hlo import fidelity  # noqa: E402
from xla_harness.hlo.parser import parse_module  # noqa: E402
from xla_harness.stress.compile_only import read_compile_records  # noqa: E402


def _record_and_hlo(folder: Path) -> tuple[dict, str, str]:
    """The one compile record of ``folder``, its optimized HLO text and that file's name."""
    path = folder / "compile.jsonl"
    if not path.is_file():
        raise HarnessError(f"{folder}: no compile.jsonl (a stress --compile-only --out folder)")
    records = read_compile_records(path)
    if len(records) != 1:
        raise HarnessError(f"{path}: {len(records)} compile records; expected the one of issue-35409")
    found = sorted((folder / "hlo").glob("*after_optimizations.txt.gz")) or \
        sorted((folder / "hlo").glob("*after_optimizations.txt"))
    if len(found) != 1:
        raise HarnessError(f"{folder}/hlo: {len(found)} optimized HLO files; expected one")
    raw = found[0].read_bytes()
    text = gzip.decompress(raw).decode() if found[0].suffix == ".gz" else raw.decode()
    return records[0], text, found[0].name


def _compile(out: Path, target: str, options: dict, autotune: Path | None) -> None:
    """The ahead-of-time compile into ``out`` (replaced), its dump made publishable."""
    if out.exists():
        shutil.rmtree(out)
    argv = [sys.executable, "-m", "xla_harness", "stress", "--program", "issue-35409", "--compile-only",
            "--target", target, "--out", str(out)]
    for key, value in sorted(options.items()):
        argv += ["--program-option", f"{key}={value}"]
    if autotune is not None:
        argv += ["--autotune-results", str(autotune)]
    print("$ " + " ".join(argv[1:]), flush=True)
    done = subproc.run(argv, cwd=ROOT, timeout=COMPILE_TIMEOUT_S, what="the ahead-of-time compile")
    if done.returncode not in (0, 1):  # 1: the scan found a hazard, a result like any other
        raise HarnessError(f"the ahead-of-time compile failed (exit {done.returncode})")
    subproc.run([sys.executable, str(ROOT / "tools" / "publish_hlo.py"), str(out / "hlo")], check=True,
                timeout=PUBLISH_TIMEOUT_S, what="publish_hlo.py")


def _figures(rec: dict) -> dict:
    fp = rec["fingerprint"]
    return {"versions": rec.get("versions", {}), "target": rec.get("target"), "device_kind": rec.get("device_kind"),
            "XLA_FLAGS": rec.get("XLA_FLAGS", ""), "fingerprint": fp.get("id"),
            "temp_size_in_bytes": fp.get("temp_size_in_bytes"), "compile_cpu_s": rec.get("compile_cpu_s")}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", type=Path, required=True, help="the device's stress --compile-only folder")
    p.add_argument("--out", type=Path, required=True, help="where the table (and aot/) go")
    p.add_argument("--target", default="cuda:h200:1x1x1", help="the ahead-of-time target (default cuda:h200:1x1x1)")
    p.add_argument("--autotune-results", type=Path, default=None, metavar="FILE",
                   help="the device's autotune results, loaded into the ahead-of-time compile")
    p.add_argument("--aot", type=Path, default=None, help="compare this compile-only folder; compile nothing")
    args = p.parse_args(argv)
    try:
        device_rec, device_text, device_file = _record_and_hlo(args.device)
        aot_dir = args.aot or args.out / "aot"
        if args.aot is None:
            _compile(aot_dir, args.target, device_rec.get("options", {}), args.autotune_results)
        aot_rec, aot_text, aot_file = _record_and_hlo(aot_dir)
    except HarnessError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    names = (f"device ({device_rec.get('device_kind')})", f"ahead of time ({aot_rec.get('target')})")
    result = fidelity.compare(parse_module(device_text, device_file), parse_module(aot_text, aot_file), names)
    dev, aot = _figures(device_rec), _figures(aot_rec)
    rows = [("compiler", f"jax {dev['versions'].get('jax')}, on the device", ", ".join(
        f"{k} {v}" for k, v in aot["versions"].items())),
        ("XLA_FLAGS", dev["XLA_FLAGS"] or "(none)", aot["XLA_FLAGS"] or "(none)"),
        ("step fingerprint", dev["fingerprint"], aot["fingerprint"]),
        ("temp bytes (buffer assignment)", f"{dev['temp_size_in_bytes']:,}", f"{aot['temp_size_in_bytes']:,}"),
        ("compile CPU s", str(dev["compile_cpu_s"]), str(aot["compile_cpu_s"]))]
    head = "\n".join(f"| {a} | {b} | {c} |" for a, b, c in rows)
    table = (f"| compile | {names[0]} | {names[1]} |\n| --- | --- | --- |\n{head}\n\n"
             + fidelity.format_fidelity(result))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "table.md").write_text(table)
    (args.out / "fidelity.json").write_text(json.dumps({
        "device": dev, "ahead_of_time": aot,
        "rows": [{"aspect": a, "device": x, "ahead_of_time": y, "same": s} for a, x, y, s in result.rows],
        "scatters": [{"scatter": w, "device": x, "ahead_of_time": y} for w, x, y in result.scatters],
        "fusions": [{"name": n, "device": x, "ahead_of_time": y, "device_matched": mx, "ahead_of_time_matched": my}
                    for n, x, y, mx, my in result.fusion_rows],
        "matched_fusions": list(result.matched_fusions),
        "tiles": {k: list(v) for k, v in result.tiles.items()}}, indent=1, sort_keys=True) + "\n")
    print(table)
    print(f"wrote {args.out / 'table.md'} and {args.out / 'fidelity.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
