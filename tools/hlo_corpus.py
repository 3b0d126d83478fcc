#!/usr/bin/env python3
"""Measure the HLO reader against XLA's parser on a corpus written by others.

    tools/hlo_corpus.py extract --xla-git DIR --rev REV [--out DIR]
        every *.hlo file and every raw string holding an HLO module (R"(...)", R"hlo(...)hlo")
        in the C++ sources of an XLA git mirror, one file each under
        ~/.cache/xla-harness/hlo-corpus/<rev>/written/ (outside the repository)
    tools/hlo_corpus.py measure [--out DIR] [--jax-dumps DIR ...] [--limit N] [--show N]
        for each module: XLA's verdict, ours, and (both accepting) the first structural
        difference; the same for XLA's own reprint of each module XLA accepts; prints the
        table of docs/scan.md's "reader against XLA" section and a JSON summary.

Nothing fetched or extracted is written into the repository.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from xla_harness.runtime import subproc  # noqa: E402  (children in their own process group, bounded waits)

GIT_TIMEOUT_S = 600  # one git call on a local mirror
DUMP_TIMEOUT_S = 3600  # the jax programs dumping every pass
DEFAULT_OUT = Path.home() / ".cache" / "xla-harness" / "hlo-corpus"
_RAW = re.compile(r'R"([A-Za-z_]{0,16})\((.*?)\)\1"', re.S)
_LOOKS_HLO = re.compile(r"(^|\n)\s*(HloModule\s|ENTRY\s)")


def _git(git_dir: str, *args: str) -> bytes | None:
    """Output of a git command; None when it fails (a blob absent from a partial mirror)."""
    proc = subproc.run(["git", f"--git-dir={git_dir}", *args], capture_output=True, timeout=GIT_TIMEOUT_S)
    return proc.stdout if proc.returncode == 0 else None


def extract(git_dir: str, rev: str, out: Path) -> int:
    dest = out / rev / "written"
    dest.mkdir(parents=True, exist_ok=True)
    listing = _git(git_dir, "ls-tree", "-r", "--name-only", rev)
    if listing is None:
        print(f"error: cannot list {rev} in {git_dir}", file=sys.stderr)
        return 2
    names = listing.decode().splitlines()
    hlo_files = [n for n in names if n.endswith(".hlo")]
    cc_files = [n for n in names if n.endswith((".cc", ".h")) and ("test" in n or "/tests/" in n)]
    count = absent = 0
    for n in hlo_files:
        data = _git(git_dir, "show", f"{rev}:{n}")
        if data is None:
            absent += 1
            continue
        (dest / (n.replace("/", "__"))).write_bytes(data)
        count += 1
    for n in cc_files:
        data = _git(git_dir, "show", f"{rev}:{n}")
        if data is None:
            absent += 1
            continue
        text = data.decode("utf-8", "replace")
        if "HloModule" not in text and "ENTRY" not in text:
            continue
        for k, m in enumerate(_RAW.finditer(text)):
            body = m.group(2)
            if _LOOKS_HLO.search(body):
                (dest / f"{n.replace('/', '__')}__{k}.hlo").write_text(body)
                count += 1
    n_files = len(hlo_files) - sum(1 for n in hlo_files if not (dest / n.replace("/", "__")).exists())
    print(f"extracted {n_files} .hlo files and {count - n_files} raw strings into {dest}"
          f" ({absent} blobs absent from the mirror)")
    return 0


def _verdict_row(name: str, text: str) -> dict:
    """One module: our and XLA's verdict on it and on XLA's reprint of it; every module ours
    accepts is also scanned (a scanner exception counts as a crash of ours)."""
    from xla_harness.hlo.parser import parse_module
    from xla_harness.hlo.scan import scan
    from xla_harness.hlo.xla_oracle import compare

    row: dict = {"name": name}
    for key, body in (("written", text), ("reprint", None)):
        if body is None:
            if not row["written"].get("xla"):
                break
            body = row.pop("_reprint")
        try:
            v = compare(body, name)
            row[key] = {"xla": v.xla_accepts, "cat": v.category,
                        "detail": (v.mismatch or v.ours_error or v.xla_error)[:240]}
            if key == "written":
                row["_reprint"] = v.reprint
            if v.ours_accepts:
                scan(parse_module(body, name))
        except Exception as exc:  # noqa: BLE001 - a crash of ours is counted and shown
            xla = row.get(key, {}).get("xla", True)
            row[key] = {"xla": xla, "cat": "crash", "detail": f"{type(exc).__name__}: {exc}"[:240]}
    row.pop("_reprint", None)
    return row


def worker() -> int:
    """Read file paths on stdin, print one JSON verdict row per file (flushed)."""
    for line in sys.stdin:
        path = Path(line.rstrip("\n"))
        row = _verdict_row(path.name, path.read_text(encoding="utf-8", errors="replace"))
        print(json.dumps(row), flush=True)
    return 0


def _run_workers(paths: list[Path], timeout: float) -> list[dict]:
    """Verdicts for every path. jaxlib's parser can crash the process on some inputs, and either
    parser could hang: the child prints one row per file, and when it dies or prints nothing for
    ``timeout`` seconds, the file it was on is counted (XLA crash / hang) and a new child goes on
    with the next file."""
    rows: list[dict] = []
    todo = list(paths)
    while todo:
        proc = subproc.start([sys.executable, __file__, "_worker"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
        feeder = threading.Thread(target=_feed, args=(proc, todo), daemon=True)
        feeder.start()
        lines: queue.Queue = queue.Queue()
        threading.Thread(target=_drain, args=(proc.stdout, lines), daemon=True).start()
        done = 0
        failure = ""
        while done < len(todo):
            try:
                line = lines.get(timeout=timeout)
            except queue.Empty:
                failure = "hang"
                subproc.signal_group(proc, signal.SIGKILL)
                break
            if line is None:
                failure = "xla-crash"
                break
            if line.startswith("{"):
                rows.append(json.loads(line))
                done += 1
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:  # answered everything but does not exit
            subproc.signal_group(proc, signal.SIGKILL)
            proc.wait()
        todo = todo[done:]
        if failure and todo:
            detail = (f"no answer in {timeout:.0f} s" if failure == "hang"
                      else f"XLA's parser crashed ({proc.returncode})")
            verdict = {"xla": False, "cat": failure, "detail": detail}
            if failure == "xla-crash":  # ours is pure Python: read and scan it here, so a crash of ours counts
                verdict["ours"] = _ours_only(todo[0])
            rows.append({"name": todo[0].name, "written": verdict})
            todo = todo[1:]
    return rows


def _ours_only(path: Path) -> str:
    from xla_harness.hlo.parser import HloParseError, parse_module
    from xla_harness.hlo.scan import scan

    try:
        scan(parse_module(path.read_text(encoding="utf-8", errors="replace"), path.name))
    except HloParseError:
        return "rejects"
    except Exception:  # noqa: BLE001 - counted as a crash of ours
        return "crash"
    return "accepts"


def _drain(stream, lines: queue.Queue) -> None:
    for line in stream:
        lines.put(line)
    lines.put(None)


def _feed(proc: subprocess.Popen, paths: list[Path]) -> None:
    try:
        for p in paths:
            proc.stdin.write(f"{p}\n")
            proc.stdin.flush()
        proc.stdin.close()
    except (BrokenPipeError, ValueError):
        pass


def _tally(rows: list[dict], key: str, label: str, show: int) -> collections.Counter:
    counts: collections.Counter = collections.Counter()
    shown: collections.Counter = collections.Counter()
    for row in rows:
        v = row.get(key)
        if v is None:
            continue
        counts["modules"] += 1
        counts["xla-accepts"] += bool(v["xla"]) and v["cat"] != "xla-crash"
        counts[v["cat"]] += 1
        counts["crash"] += v.get("ours") == "crash"
        counts["ours-accepts-xla-crashes"] += v.get("ours") == "accepts"
        if v["cat"] != "agree" and shown[v["cat"]] < show:
            shown[v["cat"]] += 1
            print(f"  [{label}] {v['cat']}: {row['name']}: {v['detail']}")
    return counts


COLUMNS = ("set", "modules", "XLA accepts", "ours accepts of those", "ours rejects what XLA accepts",
           "silent mismatches", "ours accepts what XLA rejects", "crashes (ours / process)", "hangs")


def table_row(label: str, c: collections.Counter) -> list[str]:
    acc = c["xla-accepts"]
    ok = acc - c["ours-rejects"] - c["mismatch"]
    pct = f"{ok:,} ({100 * ok / acc:.2f}%)" if acc else "-"
    return [label, f"{c['modules']:,}", f"{acc:,}", pct, f"{c['ours-rejects']:,}", str(c["mismatch"]),
            str(c["ours-accepts-xla-rejects"]), f"{c['crash']} / {c['xla-crash']}", str(c["hang"])]


def dump_jax(dest: Path) -> int:
    """--xla_dump_to dumps (every pass) of the jax programs the reader's tests compile, on CPU."""
    from tests.jax_hlo_programs import JAX_PROGRAMS

    dest.mkdir(parents=True, exist_ok=True)
    flags = (f"--xla_force_host_platform_device_count=8 --xla_dump_to={dest} --xla_dump_hlo_as_text "
             "--xla_dump_hlo_pass_re=.*")
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": flags}
    subproc.run([sys.executable, "-c", JAX_PROGRAMS], env=env, check=True, timeout=DUMP_TIMEOUT_S,
                what="dumping the jax programs")
    n = sum(1 for p in dest.rglob("*.txt") if p.read_text(errors="replace").lstrip().startswith("HloModule"))
    print(f"{n} HLO modules dumped into {dest}")
    return 0


def write_results(args, lines: list[str], summary: dict, rows: list[dict], dump_rows: list[dict],
                  n_files: int, elapsed: float) -> None:
    """The table, the counts, the environment, and every file not agreeing by name and category
    (no upstream text: the details stay on stdout)."""
    import platform

    import jaxlib

    others = []
    for set_name, group in (("upstream", rows), ("dumps", dump_rows)):
        for r in group:
            cats = {k: r[k]["cat"] for k in ("written", "reprint") if k in r}
            if any(c != "agree" for c in cats.values()):
                others.append({"set": set_name, "name": r["name"], **cats})
    env = {"date": time.strftime("%Y-%m-%d", time.gmtime()), "jaxlib": jaxlib.__version__,
           "python": platform.python_version(), "corpus": sorted(p.name for p in args.out.iterdir()),
           "jax_dumps": [d.name for d in args.jax_dumps]}  # names: no path of this machine
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps({"environment": env, "table": lines, "summary": summary, "files": n_files,
                                        "seconds": round(elapsed), "not_agreeing": others}, indent=1) + "\n")


def measure(args) -> int:
    files = sorted(args.out.glob("*/written/*"))
    if args.limit:
        files = files[:args.limit]
    t0 = time.perf_counter()
    rows = _run_workers(files, args.timeout)
    sets = [("upstream as written", _tally(rows, "written", "written", args.show)),
            ("XLA's own reprint", _tally(rows, "reprint", "reprint", args.show))]
    dumps = []
    for d in args.jax_dumps:
        dumps += [p for p in sorted(Path(d).rglob("*.txt"))
                  if p.read_text(errors="replace").lstrip().startswith("HloModule")]
    dump_rows = _run_workers(dumps, args.timeout) if dumps else []
    if dumps:
        sets.append(("jax dumps (CPU)", _tally(dump_rows, "written", "dumps", args.show)))
        sets.append(("XLA's reprint of the jax dumps", _tally(dump_rows, "reprint", "dumps-reprint", args.show)))
    elapsed = time.perf_counter() - t0
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(table_row(label, c)) + " |" for label, c in sets]
    print()
    print("\n".join(lines))
    print(f"\n{len(files) + len(dumps)} files in {elapsed:.0f} s")
    summary = {label: dict(c) for label, c in sets}
    print(json.dumps(summary))
    if args.results:
        write_results(args, lines, summary, rows, dump_rows, len(files) + len(dumps), elapsed)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("extract")
    e.add_argument("--xla-git", required=True)
    e.add_argument("--rev", required=True)
    e.add_argument("--out", type=Path, default=DEFAULT_OUT)
    d = sub.add_parser("dump-jax")
    d.add_argument("--dest", type=Path, default=DEFAULT_OUT.parent / "jax-dumps")
    m = sub.add_parser("measure")
    m.add_argument("--out", type=Path, default=DEFAULT_OUT)
    m.add_argument("--jax-dumps", nargs="*", default=[])
    m.add_argument("--limit", type=int, default=0)
    m.add_argument("--show", type=int, default=5)
    m.add_argument("--timeout", type=float, default=60.0, help="seconds one file may take before it counts as a hang")
    m.add_argument("--results", type=Path, help="write the table, the counts and every file not agreeing (JSON)")
    if sys.argv[1:] == ["_worker"]:
        return worker()
    args = ap.parse_args()
    if args.cmd == "extract":
        return extract(args.xla_git, args.rev, args.out)
    if args.cmd == "dump-jax":
        return dump_jax(args.dest)
    return measure(args)


if __name__ == "__main__":
    raise SystemExit(main())
