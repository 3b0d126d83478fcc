"""Find the compiler passes whose disabling removes a failure: delta debugging over
``xla_disable_hlo_passes``.

1. The candidate passes come from a real pass dump of the program on the current backend
   (``xla_dump_hlo_pass_re=.*``: one file per pass that changed the module).
2. An oracle says whether the failure is present with a given set of passes disabled:
   ``HloPropertyOracle`` (a property of the compiled HLO, deterministic) or ``StressOracle``
   (training steps until a non-finite update; stochastic).
3. ``ddmin`` shrinks the disabled set to a 1-minimal one: disabling it removes the failure,
   and disabling any proper subset obtained by dropping one pass does not.

Probes pass the disabled set as a per-compile option (equivalent to
``XLA_FLAGS=--xla_disable_hlo_passes=...``, or ``LIBTPU_INIT_ARGS`` on TPU; the result
prints the flag to reproduce). Every probe is appended to a JSONL log, so an interrupted
bisection resumes without repeating probes.

For a stochastic failure each probe runs ``runs_needed(p, 0.95)`` steps, p the baseline rate:
if the failure were still there at rate p, seeing none in that many steps has probability
<= 5%. A probe stops at the first non-finite step (failure present, certain).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from xla_harness.errors import HarnessError
from xla_harness.stress.report import stats

# Dump files are named <module>.<NNNN>.<pipeline>.after_<pass>.before_<pass>.txt
_PASS = re.compile(r"\.(?:after|before)_([A-Za-z0-9_\-]+)")
_PSEUDO = {"pipeline-start", "pipeline-end", "optimizations", "after_layout_assignment",
           "layout_assignment", "adding_copies_to_resolve_interference", "adding_special-case_copies",
           "removing_unnecessary_copies", "scheduling"}


def passes_from_dump(names: list[str], module: str | None = None) -> list[str]:
    """Pass names, in pipeline order, from the file names of a pass dump."""
    order: list[str] = []
    for name in sorted(names):
        if module and module not in name:
            continue
        for p in _PASS.findall(name):
            if p not in _PSEUDO and not p.startswith("optimizations") and p not in order:
                order.append(p)
    return order


# Passes that keep the module well-formed; disabling them makes the compiler fail rather
# than answer, so they are never candidates.
STRUCTURAL = {"layout-assignment", "copy-insertion", "flatten-call-graph", "call-inliner",
              "sharding-remover", "sub-byte-size-setter", "shape-canonicalizer", "literal-canonicalizer",
              "cse_barrier_expander", "propagate-call-metadata", "async-collective-custom-call-rewriter",
              "strip-memory-placement-annotations"}


def compile_options(disabled) -> dict | None:
    return {"xla_disable_hlo_passes": ",".join(sorted(disabled))} if disabled else None


@dataclass(frozen=True)
class Probe:
    disabled: frozenset[str]
    failing: bool
    detail: str = ""


PROPERTIES = ("multi-op-fusion", "scatter-root-fusion")


def count_property(text: str, prop: str) -> int:
    """How often the compiled HLO has the property (the deterministic 'failure')."""
    if prop.startswith("regex:"):
        try:
            pattern = re.compile(prop[6:])
        except re.error as exc:
            raise HarnessError(f"--property {prop!r}: not a regular expression ({exc})") from None
        return len(pattern.findall(text))
    if prop not in PROPERTIES:
        raise HarnessError(f"unknown property {prop!r}; expected one of {', '.join(PROPERTIES)} or regex:<pattern>")
    from xla_harness.hlo.parser import parse_module

    mod = parse_module(text, "probe")
    n = 0
    for comp in mod.computations:
        for ins in comp.instructions:
            if ins.opcode != "fusion" or not ins.called:
                continue
            body = mod.computation(ins.called[0])
            if prop == "multi-op-fusion":
                n += sum(i.opcode != "parameter" for i in body.instructions) >= 2
            elif body.root.opcode == "scatter":
                n += 1
    return n


def _child_said(stderr: str) -> str:
    """What a probe that failed said about it: its own ``error:`` line (a bad program, option or target),
    else the last line it printed (the compiler's exception), else nothing."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    own = [ln for ln in lines if ln.startswith("error: ")]
    if own:
        return own[-1].removeprefix("error: ")[:400]
    return lines[-1][:400] if lines else ""


class SubprocessOracle:
    """Runs each probe in a fresh interpreter (``python -m xla_harness.repro.probe``): per-probe
    compiler options, and a compiler crash under some disabled set is an answer ("cannot
    build without these passes", treated as failure not removed), not the end of the run."""

    def __init__(self, task: dict, python: str | None = None, timeout: float = 600):
        import sys

        self.task, self.python, self.timeout = task, python or sys.executable, timeout

    def _call(self, extra: dict) -> dict:
        import os

        from xla_harness.runtime import subproc
        from xla_harness.runtime.resources import import_root

        root = str(import_root())  # where xla_harness is imported from: the checkout or site-packages
        env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
        try:  # in its own process group: a timeout kills whatever the probe started too
            res = subproc.run([self.python, "-m", "xla_harness.repro.probe", json.dumps({**self.task, **extra})],
                              capture_output=True, text=True, timeout=self.timeout, env=env)
        except subproc.ChildTimeout:
            return {"crashed": f"probe timed out after {self.timeout:g} s"}
        lines = [ln for ln in res.stdout.splitlines() if ln.startswith("{")]
        if res.returncode != 0 or not lines:
            return {"crashed": f"compiler exited {res.returncode}", "said": _child_said(res.stderr or "")}
        return json.loads(lines[-1])

    def passes(self) -> list[str]:
        out = self._call({"action": "passes"})
        if "crashed" in out:
            raise HarnessError(f"listing passes failed: {out['said'] or out['crashed']}")
        return [p for p in out["passes"] if p not in STRUCTURAL]

    def baseline(self, steps: int) -> tuple[int, int]:
        """(non-finite steps, steps) with no pass disabled."""
        out = self._call({"action": "probe", "disabled": [], "steps": steps, "count": True})
        if "crashed" in out:
            raise HarnessError(f"baseline run failed: {out['said'] or out['crashed']}")
        return out["nonfinite"], out["steps"]

    def __call__(self, disabled: frozenset[str]) -> Probe:
        out = self._call({"action": "probe", "disabled": sorted(disabled)})
        if "crashed" in out:
            return Probe(disabled, True, out["crashed"])
        return Probe(disabled, out["failing"], out["detail"])


class ProbeLog:
    """JSONL of probes: append + fsync; earlier results are reused on resume.

    The first line names the task (oracle, property, program and its options); ``--resume``
    refuses a log of any other task, so probes of one question never answer another.
    """

    def __init__(self, path: Path | None, resume: bool, task: dict | None = None):
        self.path = path
        self.task = task or {}
        self.known: dict[frozenset[str], Probe] = {}
        if path is None:
            return
        if path.exists() and not path.is_file():
            raise HarnessError(f"{path} is not a regular file")
        if path.exists() and path.stat().st_size and not resume:
            raise HarnessError(f"{path} already holds a bisection; pass --resume or choose another --out")
        self._task_due = False
        if path.exists() and path.stat().st_size:
            self._load(path)
        else:
            self._task_due = True  # written with the first record: a bisection refused before it creates nothing

    def _load(self, path: Path) -> None:
        from xla_harness.runtime.files import read_regular

        try:
            lines = read_regular(path).decode("utf-8").splitlines()
        except UnicodeDecodeError:
            raise HarnessError(f"{path}: not a bisection log (not UTF-8)") from None
        first = _json_or_none(lines[0]) if lines else None
        if not isinstance(first, dict) or first.get("kind") != "task":
            raise HarnessError(f"{path}:1: not a bisection log of this version (no task line); choose another --out")
        their_task = first.get("task")
        if their_task != json.loads(json.dumps(self.task)):
            theirs = their_task if isinstance(their_task, dict) else {}
            keys = sorted(k for k in self.task.keys() | theirs.keys() if theirs.get(k) != self.task.get(k))
            raise HarnessError(f"{path} holds a bisection of another task (differs in {', '.join(keys)}); "
                               "choose another --out")
        for lineno, line in enumerate(lines[1:], start=2):
            rec = _json_or_none(line)
            if rec is None:
                if lineno == len(lines):
                    continue  # a line cut short by a kill: that probe runs again
                raise HarnessError(f"{path}:{lineno}: not a JSON record")
            if isinstance(rec, dict) and rec.get("kind") == "probe":
                disabled, failing = rec.get("disabled"), rec.get("failing")
                if not (isinstance(disabled, list) and all(isinstance(x, str) for x in disabled)
                        and isinstance(failing, bool)):
                    raise HarnessError(f"{path}:{lineno}: malformed probe record")
                d = frozenset(disabled)
                self.known[d] = Probe(d, failing, str(rec.get("detail", "")))

    def record(self, kind: str, **fields) -> None:
        if self.path is None:
            return
        import os

        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a") as fh:
            if getattr(self, "_task_due", False):
                fh.write(json.dumps({"kind": "task", "task": self.task}, sort_keys=True) + "\n")
                self._task_due = False
            fh.write(json.dumps({"kind": kind, **fields}, sort_keys=True) + "\n")
            fh.flush()
            os.fsync(fh.fileno())


def _json_or_none(line: str):
    try:
        return json.loads(line)
    except (ValueError, RecursionError):
        return None


def ddmin(items: list[str], removes_failure: Callable[[frozenset[str]], bool]) -> list[str]:
    """A 1-minimal subset S of ``items`` with removes_failure(S) (Zeller's ddmin, inverted)."""
    cur = list(items)
    n = 2
    while len(cur) >= 2:
        size = max(1, len(cur) // n)
        chunks = [cur[i:i + size] for i in range(0, len(cur), size)]
        for c in chunks:
            if removes_failure(frozenset(c)):
                cur, n = c, 2
                break
        else:
            for c in chunks:
                rest = [x for x in cur if x not in c]
                if rest and removes_failure(frozenset(rest)):
                    cur, n = rest, max(n - 1, 2)
                    break
            else:
                if n >= len(cur):
                    break
                n = min(len(cur), 2 * n)
    return cur


class OutOfTime(Exception):
    """The bisection reached its time limit before its next probe; ``partial`` is what it had narrowed
    (:func:`narrowed_so_far`)."""

    def __init__(self, partial: dict) -> None:
        super().__init__(partial_text(partial))
        self.partial = partial


def narrowed_so_far(known: dict[frozenset[str], Probe], candidates: list[str]) -> dict:
    """Where a bisection stands: its probes, its candidates and the smallest set of passes whose
    disabling was seen to remove the failure (the set ddmin is narrowing; None when no probe has
    removed it yet), not yet shown 1-minimal."""
    removing = [d for d, probe in known.items() if not probe.failing]
    best = min(removing, key=len) if removing else None
    return {"probes": len(known), "candidates": len(candidates),
            "narrowed": sorted(best) if best is not None else None}


def partial_text(partial: dict) -> str:
    """One sentence of :func:`narrowed_so_far`."""
    head = f"after {partial['probes']} probe(s) over {partial['candidates']} candidate passes"
    if partial.get("narrowed") is None:
        return f"{head}: no set of disabled passes tried so far removes the failure"
    names = partial["narrowed"]
    return (f"{head}: the failure goes when these {len(names)} are disabled (narrowed so far, not yet shown "
            f"minimal): {', '.join(names)}")


@dataclass
class BisectResult:
    passes: list[str]
    minimal: list[str]
    probes: int
    steps_per_probe: int | None
    baseline: str

    def flag(self) -> str:
        return "--xla_disable_hlo_passes=" + ",".join(self.minimal)


def bisect(candidates: list[str], oracle: Callable[[frozenset[str]], Probe], log: ProbeLog,
           progress: Callable[[str], None] = lambda s: None, baseline: str = "",
           steps_per_probe: int | None = None, deadline: float | None = None,
           clock: Callable[[], float] = time.monotonic) -> BisectResult:
    """ddmin over ``candidates`` with ``oracle``, every probe logged. Once ``clock()`` reaches
    ``deadline`` no new probe starts: :class:`OutOfTime` carries what was narrowed."""
    if not candidates:
        raise HarnessError("the pass dump listed no passes to bisect")
    count = 0

    def removes(disabled: frozenset[str]) -> bool:
        nonlocal count
        if disabled in log.known:
            probe = log.known[disabled]
        else:
            if deadline is not None and clock() >= deadline:
                partial = narrowed_so_far(log.known, candidates)
                log.record("stopped", **partial)
                raise OutOfTime(partial)
            probe = oracle(disabled)
            count += 1
            log.known[disabled] = probe
            log.record("probe", disabled=sorted(disabled), failing=probe.failing, detail=probe.detail)
        progress(f"probe {len(log.known):3d}: disable {len(disabled):3d} pass(es) -> "
                 f"{'still failing' if probe.failing else 'failure gone'} ({probe.detail})")
        return not probe.failing

    if steps_per_probe is None:  # a deterministic oracle: the failure must be there with nothing disabled
        base: frozenset[str] = frozenset()
        if removes(base):
            raise HarnessError("the configuration does not fail with every pass enabled (baseline probe): "
                               "nothing to bisect")
        if log.known[base].detail.startswith(("compiler exited", "probe timed out")):
            raise HarnessError(f"the baseline probe (nothing disabled) failed to run: {log.known[base].detail}")
    full = frozenset(candidates)
    if not removes(full) and not log.known[full].detail.startswith(("compiler exited", "probe timed out")):
        raise HarnessError("the failure remains with every listed pass disabled: it does not come "
                           "from passes that can be disabled")
    # If the compiler cannot run with every pass disabled, ddmin still searches the subsets.
    minimal = ddmin(candidates, removes)
    if not removes(frozenset(minimal)):
        raise HarnessError("no set of passes whose disabling removes the failure was found")
    result = BisectResult(candidates, sorted(minimal), count, steps_per_probe, baseline)
    log.record("result", minimal=result.minimal, flag=result.flag(), probes=count)
    return result


def steps_for_rate(k: int, n: int, confidence: float = 0.95) -> int:
    """Steps per probe so that a failure still present at the baseline rate k/n is seen
    with probability >= confidence."""
    if k == 0:
        raise HarnessError(f"the configuration does not fail: 0 non-finite steps in {n}")
    return stats.runs_needed(min(k / n, 0.999999), confidence)
