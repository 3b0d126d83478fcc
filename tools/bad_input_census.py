"""Count how the CLI and the tools answer the generated cases (tests/bad_input_cases.py).

Each case runs in a forked child (memory capped, killed after --timeout seconds, or the case's own
longer limit) so a hang or a memory blow-up is counted instead of stopping the census; a case that
needs a fresh interpreter (signals, standard input) or a script (make tpu-sweep) runs as its own
process. Cases that need jax import it in their child, so the timeout must allow for that on a
loaded machine. Prints one line per outcome class (tests/bad_input_cases.py ``CLASSES``: clear;
traceback; wrong-exit; error-lines; internal: one ``error: internal:`` line for a user's mistake;
vague: an error line that does not name the cause; silent: exit 0 where the input should have been
refused or the signal acted on, or a result that is wrong; late: a refusal after work it could not
use; hang; killed; changed-files: a file changed, lost or created; python-startup: a signal the
interpreter took before any harness code ran), with ``--by-tag`` one row per tag, and with --list
the case ids per class.

    .venv/bin/python tools/bad_input_census.py [--timeout 60] [--list] [-k SUBSTRING] [--tag round4] [--by-tag r4-]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import resource
import signal
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The census measures the checkout it is in (another commit's worktree too): its own package first,
# ahead of an editable install of another checkout; main() refuses to count any other.
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from bad_input_cases import CLASSES, Case, all_cases, held_lock, run_process, tree_hashes, verdict  # noqa: E402


def _entry(case: Case):
    """The main function a forked child calls for ``case``."""
    if case.entry in ("build", "publish"):
        path = ROOT / "build" / "build_jaxlib.py" if case.entry == "build" else ROOT / "tools" / "publish_hlo.py"
        spec = importlib.util.spec_from_file_location("entry", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return getattr(mod, "entry", None) or mod.main
    from xla_harness.cli import main

    return main


def _child(case: Case, tmp: Path, out_path: Path, err_path: Path, mem_bytes: int) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (mem_bytes, mem_bytes))
    fd = os.open(err_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(fd, 2)
    fd = os.open(out_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(fd, 1)
    # The streams Python writes through, onto those descriptors (the parent may have replaced them,
    # as pytest's capture does).
    sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115 - lives until os._exit
    sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
    os.chdir(tmp)
    os.environ.update(case.environ(tmp))
    try:
        code = _entry(case)(case.args(tmp))
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - an uncaught exception is what the census counts
        import traceback

        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code if isinstance(code, int) else 1)


def _forked(case: Case, tmp: Path, timeout: float, mem_bytes: int) -> tuple[int | None, int | None, str, str, float]:
    err_path, out_path = tmp.parent / "stderr", tmp.parent / "stdout"
    t0 = time.monotonic()
    pid = os.fork()
    if pid == 0:
        _child(case, tmp, out_path, err_path, mem_bytes)
    deadline = t0 + timeout
    status = None
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.05)
    else:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        return None, None, "", "", time.monotonic() - t0
    seconds = time.monotonic() - t0
    out = out_path.read_text(errors="replace")
    err = err_path.read_text(errors="replace")
    if os.WIFSIGNALED(status):
        return None, os.WTERMSIG(status), out, err, seconds
    return os.WEXITSTATUS(status), None, out, err, seconds


def classify(case: Case, timeout: float, mem_bytes: int) -> tuple[str, str]:
    timeout = max(timeout, case.timeout or 0)
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d) / "case"
        tmp.mkdir()
        case.setup(tmp)
        before = tree_hashes(tmp)
        with held_lock(case, tmp):
            if case.entry in ("process", "sweep"):
                code, signum, out, err, seconds = run_process(case, tmp, ROOT, timeout)
            else:
                code, signum, out, err, seconds = _forked(case, tmp, timeout, mem_bytes)
        return verdict(case, code, out, err, before, tree_hashes(tmp), seconds, tmp, signum)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--timeout", type=float, default=60.0)
    ap.add_argument("--mem-gb", type=float, default=6.0)
    ap.add_argument("--list", action="store_true", help="the case ids of every class but clear")
    ap.add_argument("--show-clear", action="store_true", help="with --list, also each clear case's error line")
    ap.add_argument("-k", default="", help="only cases whose id contains this")
    ap.add_argument("--ids", default="", help="only these case ids (comma-separated)")
    ap.add_argument("--tag", default="", help="only cases with this tag (round4: the #34 surfaces)")
    ap.add_argument("--skip-tag", default="", help="leave out cases with any of these tags (comma-separated)")
    ap.add_argument("--by-tag", default="", metavar="PREFIX", help="also one row per tag starting with PREFIX")
    args = ap.parse_args()
    import xla_harness

    here = Path(xla_harness.__file__).resolve().parent
    if here != ROOT / "xla_harness":
        sys.stderr.write(f"error: xla_harness is imported from {here}, not from this checkout ({ROOT})\n")
        return 2
    # jax is not imported here: a child forked after jax started its threads can deadlock.
    ids = set(args.ids.split(",")) if args.ids else None
    skip = {t for t in args.skip_tag.split(",") if t}
    cases = [c for c in all_cases() if args.k in c.id and (ids is None or c.id in ids)
             and (not args.tag or args.tag in c.tags) and not (skip & c.tags)]
    if not cases:  # a census of nothing is no measure
        sys.stderr.write("error: no case matches -k/--ids/--tag\n")
        return 2
    outcomes: dict[str, list[tuple[str, str]]] = {}
    by_tag: dict[str, dict[str, int]] = {}
    for c in cases:
        kind, detail = classify(c, args.timeout, int(args.mem_gb * 2**30))
        outcomes.setdefault(kind, []).append((c.id, detail))
        for tag in c.tags:
            if args.by_tag and tag.startswith(args.by_tag):
                by_tag.setdefault(tag, {}).setdefault(kind, 0)
                by_tag[tag][kind] += 1
        if args.list and kind != "clear":
            print(f"  {kind}: {c.id}: {detail[:200]}", file=sys.stderr, flush=True)
    print(f"tried {len(cases)} cases on {ROOT}")
    _print_counts(outcomes, by_tag, args.list, args.show_clear)
    return 0


def _print_counts(outcomes: dict[str, list[tuple[str, str]]], by_tag: dict[str, dict[str, int]], listed: bool,
                  show_clear: bool) -> None:
    for kind in CLASSES:
        print(f"{kind:<14} {len(outcomes.get(kind, []))}")
    if by_tag:
        shown = [k for k in CLASSES if any(k in row for row in by_tag.values())]
        print("\n" + f"{'class':<18} {'cases':>5} " + " ".join(f"{k:>{max(len(k), 5)}}" for k in shown))
        for tag in sorted(by_tag):
            row = by_tag[tag]
            print(f"{tag:<18} {sum(row.values()):>5} " + " ".join(f"{row.get(k, 0):>{max(len(k), 5)}}" for k in shown))
    if listed:
        for kind, items in outcomes.items():
            if kind == "clear" and not show_clear:
                continue
            for cid, detail in items:
                print(f"  {kind}: {cid}: {detail[:200]}")


if __name__ == "__main__":
    raise SystemExit(main())
