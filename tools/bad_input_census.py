"""Count how the CLI answers the generated bad-input cases (tests/bad_input_cases.py).

Each case runs in a forked child (memory capped, killed after --timeout seconds) so a hang
or a memory blow-up is counted instead of stopping the census. Cases that need jax import
it in their child, so the timeout must allow for that on a loaded machine. Prints one line per outcome
class (clear; traceback; wrong-exit; error-lines; internal: one `error: internal:` line for a
user's mistake; hang; killed; changed-files) and, with --list, the case ids per class.

    .venv/bin/python tools/bad_input_census.py [--timeout 60] [--list] [-k SUBSTRING]
"""

from __future__ import annotations

import argparse
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

from bad_input_cases import Case, all_cases, tree_hashes  # noqa: E402


def _child(case: Case, tmp: Path, err_path: Path, mem_bytes: int) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (mem_bytes, mem_bytes))
    fd = os.open(err_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(fd, 2)
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    # The streams Python writes through, onto those descriptors (the parent may have replaced them,
    # as pytest's capture does).
    sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115 - lives until os._exit
    sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
    os.chdir(tmp)
    try:
        if case.entry == "build":
            import importlib.util

            spec = importlib.util.spec_from_file_location("entry", ROOT / "build" / "build_jaxlib.py")
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            main = getattr(mod, "entry", None) or mod.main
        else:
            from xla_harness.cli import main
        code = main(case.args(tmp))
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - an uncaught exception is what the census counts
        import traceback

        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code if isinstance(code, int) else 1)


def classify(case: Case, timeout: float, mem_bytes: int) -> tuple[str, str]:
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d) / "case"
        tmp.mkdir()
        case.setup(tmp)
        before = tree_hashes(tmp)
        err_path = Path(d) / "stderr"
        pid = os.fork()
        if pid == 0:
            _child(case, tmp, err_path, mem_bytes)
        deadline = time.monotonic() + timeout
        status = None
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            time.sleep(0.05)
        else:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return "hang", ""
        err = err_path.read_text(errors="replace")
        after = tree_hashes(tmp)
        changed = [k for k, v in before.items() if after.get(k) != v]
    if os.WIFSIGNALED(status):
        return "killed", f"signal {os.WTERMSIG(status)}"
    code = os.WEXITSTATUS(status)
    if "Traceback" in err or "MemoryError" in err:
        return "traceback", err.strip().splitlines()[-1] if err.strip() else ""
    if changed:
        return "changed-files", ", ".join(changed)
    errors = [ln for ln in err.splitlines() if ln.startswith("error:")]
    if code != 2:
        return "wrong-exit", f"exit {code}"
    if len(errors) != 1:
        return "error-lines", f"{len(errors)} error: lines"
    if errors[0].startswith("error: internal:"):  # a user's mistake reported as the harness's own bug
        return "internal", errors[0]
    return "clear", errors[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--timeout", type=float, default=60.0)
    ap.add_argument("--mem-gb", type=float, default=6.0)
    ap.add_argument("--list", action="store_true", help="the case ids of every class but clear")
    ap.add_argument("--show-clear", action="store_true", help="with --list, also each clear case's error line")
    ap.add_argument("-k", default="", help="only cases whose id contains this")
    ap.add_argument("--ids", default="", help="only these case ids (comma-separated)")
    args = ap.parse_args()
    import xla_harness

    here = Path(xla_harness.__file__).resolve().parent
    if here != ROOT / "xla_harness":
        sys.stderr.write(f"error: xla_harness is imported from {here}, not from this checkout ({ROOT})\n")
        return 2
    # jax is not imported here: a child forked after jax started its threads can deadlock.
    ids = set(args.ids.split(",")) if args.ids else None
    cases = [c for c in all_cases() if args.k in c.id and (ids is None or c.id in ids)]
    if not cases:  # a census of nothing is no measure
        sys.stderr.write("error: no case matches -k/--ids\n")
        return 2
    outcomes: dict[str, list[tuple[str, str]]] = {}
    for c in cases:
        kind, detail = classify(c, args.timeout, int(args.mem_gb * 2**30))
        outcomes.setdefault(kind, []).append((c.id, detail))
    print(f"tried {len(cases)} cases on {ROOT}")
    for kind in ("clear", "traceback", "wrong-exit", "error-lines", "internal", "hang", "killed", "changed-files"):
        print(f"{kind:<14} {len(outcomes.get(kind, []))}")
    if args.list:
        for kind, items in outcomes.items():
            if kind == "clear" and not args.show_clear:
                continue
            for cid, detail in items:
                print(f"  {kind}: {cid}: {detail[:200]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
