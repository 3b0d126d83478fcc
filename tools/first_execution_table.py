"""The table of issue #43 measured against the execution oracle (``tests/oracle_program.py``), for any
checkout: a step that is NaN on its executions 9 and 17 (20 steps, blocks of 5), and a step NaN on
each execution with probability 1% (200 steps, the program's seeds 0-5), NaN into the loss and
through the gradient into the parameters, under ``--commit step`` and ``--commit block``. Each line
gives the recorded non-finite steps against the oracle's (the steps whose first execution from a
finite state drew a NaN).

    python tools/first_execution_table.py [CHECKOUT]    (default: this checkout)
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

CHECKOUT = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent).resolve()
sys.path.insert(0, str(CHECKOUT))
ORACLE = Path(__file__).resolve().parent.parent / "tests" / "oracle_program.py"


def _oracle():
    spec = importlib.util.spec_from_file_location("oracle_program", ORACLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(program, commit: str, steps: int, block: int | None = None) -> list[int]:
    from xla_harness.stress.runner import initial_state, prepare, run_config
    from xla_harness.stress.spec import StressSpec

    spec = StressSpec(program="oracle", seeds=(1,), steps=steps, commit=commit, block=block)
    h = prepare(spec, {}, program)
    state = initial_state(h, 1)
    return sorted(r.step for b in run_config(h, 1, state) for r in b.records if not r.finite)


def main() -> int:
    oracle = _oracle()
    import xla_harness

    print(f"checkout {CHECKOUT} (xla_harness from {Path(xla_harness.__file__).parent})")
    for commit in ("step", "block"):
        program = oracle.make(where="both", nan_execs=(9, 17))
        got = run(program, commit, 20, 5)
        want, _ = oracle.expected(oracle.entries_of(program), range(20))
        print(f"NaN on executions 9 and 17, --commit {commit}: recorded {got} ({len(got)}/20); oracle {want}")
    for commit in ("step", "block"):
        cells = []
        for seed in range(6):
            program = oracle.make(p=0.01, where="both", seed=seed)
            got = run(program, commit, 200)
            want, _ = oracle.expected(oracle.entries_of(program), range(200))
            cells.append(f"{len(got)}/{len(want)}" + ("" if got == want else " DIFFER"))
        print(f"p=1% per execution, 200 steps, seeds 0-5, --commit {commit}: recorded/oracle {', '.join(cells)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
