"""``triage``: run every stage of :func:`~xla_harness.triage.plan.plan` against a step, each as a child
``xla-harness`` process in its own folder under ``OUT/stages``, and gather the verdicts into
``OUT/triage.json`` and the report (:mod:`~xla_harness.triage.render`).

Stages run as children so that each compiles for its own target in a process of its own (libtpu and
the CUDA plugin need their environment before jax starts), a crash or a hang of one is one stage's
failure, and every stage is resumable by the child's own ``--resume``. A stage's ``stage.json`` is
written (atomically) when it is done; ``--resume`` skips those and resumes the rest where their
children left off. Children are killed with this process (``PR_SET_PDEATHSIG``, which each child
sets on itself: ``subproc.start(die_with_parent=True)``), so a ``kill -9`` leaves no child writing.
This process imports no jax and starts no device: the children own them. What was asked is
:mod:`~xla_harness.triage.spec`'s; how a child ended, in words, :mod:`~xla_harness.triage.child_ends`'s.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

from xla_harness.errors import HarnessError
from xla_harness.runtime import interrupts, subproc
from xla_harness.stress.stopping import STOP_GRACE_S
from xla_harness.triage import plan as plan_mod
from xla_harness.triage.answer import answer
from xla_harness.triage.answer_record import Answer
from xla_harness.triage.child_ends import NO_OUTPUT, ended, last_said, no_step
from xla_harness.triage.compiled import memory_plan, record_summary, target_verdict, verdict_of_record
from xla_harness.triage.plan import Stage
from xla_harness.triage.spec import TriageSpec, read_spec

STATE = "triage.json"
NOTHING_TO_COMPARE = ("not run: {} saw no non-finite step, so no variant could fail less than the baseline "
                      "(the variants stage runs when one of them fails)")
NOT_THE_COMPILER = ("not run: every explained failing step is your input's, your program's or float32's ({}), "
                    "none a race's, the compiler's or undecided, so no compiler pass or workaround is a suspect "
                    "(variants and pass bisection run only when one is)")
NOTHING_RAN = "not run: no local stage recorded a step, so there is no baseline to compare a variant with"
STAGE_SPENT = "spent.json"  # in a running stage's folder: its seconds so far (a killed run's kept)
CHILD_GRACE_S = 120.0  # beyond the budget, what a compile, a bisection or a bundle gets to finish
BISECT_FLOOR_S = 60.0  # the pass bisection's time when its share is smaller and the budget has that left
BISECT_MIN_S = 10.0  # with less of the budget left, the bisection is not started (its baseline alone takes that)
STRESS_GRACE_S = 10.0  # after a round's own --stop-grace: for it to flush and end before it is killed
STOP_GRACE_FLOOR_S = 5.0  # a round's --stop-grace: three steps' time, at least this, at most stress's default
MIN_ROUND_STEPS = 10  # a round shorter than this is not worth its start-up


def _interrupted(where: str) -> None:
    """Raise :class:`~xla_harness.runtime.interrupts.Interrupted` (exit 130/143) if SIGINT/SIGTERM has arrived."""
    signum = interrupts.received()
    if signum is not None:
        raise interrupts.Interrupted(signum, where)


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=2, default=str)  # in the order the stages ran
        fh.write("\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


class Triage:
    """One triage into ``out``; ``log`` gets the progress lines (stderr)."""

    def __init__(self, spec: TriageSpec, out: Path, resume: bool = False,
                 log: Callable[[str], None] | None = None) -> None:
        self.spec, self.out, self.resume = spec, Path(out), resume
        self.log = log or (lambda line: None)
        self.stages = plan_mod.plan(spec.targets, spec.hlo)
        self.t0 = time.monotonic()
        self.spent_before = 0.0  # seconds spent by earlier runs of this triage (resumed)
        self.running: tuple[Stage, float, float] | None = None  # the stage under way: (it, its start, its time before)
        self.commands: dict[str, list[str]] = {}
        self.per_step: float | None = None  # seconds a step of the local runs took (the shortest round's)
        self.notes: dict[str, list[str]] = {}  # a stage's rounds that recorded nothing, and why

    # -- bookkeeping

    @property
    def state_path(self) -> Path:
        return self.out / STATE

    def stage_dir(self, stage: Stage) -> Path:
        return self.out / "stages" / stage.folder

    def _done(self, stage: Stage) -> dict | None:
        path = self.stage_dir(stage) / "stage.json"
        if not path.is_file():
            return None
        try:
            done = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError, RecursionError):
            return None  # a stage whose record is unreadable runs again (its children resume)
        return done if isinstance(done, dict) else None  # so does one that is not a stage's record

    def _finish(self, stage: Stage, summary: dict, seconds: float) -> dict:
        seconds += self._stage_spent_before(stage)  # a run of it killed earlier counts too
        summary = {"stage": stage.name, "seconds": round(seconds, 1), **summary}
        self.stage_dir(stage).mkdir(parents=True, exist_ok=True)
        _write_json(self.stage_dir(stage) / "stage.json", summary)
        self.running = None
        (self.stage_dir(stage) / STAGE_SPENT).unlink(missing_ok=True)
        self._save_spent()
        return summary

    def _stage_spent_before(self, stage: Stage) -> float:
        """Seconds earlier, killed runs of ``stage`` spent (``STAGE_SPENT`` in its folder), 0 when none."""
        try:
            spent = json.loads((self.stage_dir(stage) / STAGE_SPENT).read_text(encoding="utf-8")).get("spent_s", 0.0)
        except (OSError, ValueError, AttributeError, RecursionError):
            return 0.0
        return float(spent) if isinstance(spent, int | float) and not isinstance(spent, bool) and \
            math.isfinite(spent) and spent >= 0 else 0.0

    def _save_spent(self) -> None:
        """The time this triage has spent so far, kept where ``--resume`` reads it (a kill loses at most
        the time since the last progress line), and the running stage's own (its table keeps it)."""
        _write_json(self.out / "triage-spec.json", {"spec": self.spec.to_json(), "spent_s": round(self.elapsed(), 1)})
        if self.running is not None:
            stage, t0, before = self.running
            self.stage_dir(stage).mkdir(parents=True, exist_ok=True)
            _write_json(self.stage_dir(stage) / STAGE_SPENT, {"spent_s": round(before + time.monotonic() - t0, 1)})

    def elapsed(self) -> float:
        return self.spent_before + time.monotonic() - self.t0

    def left(self) -> float:
        return max(0.0, self.spec.budget_s - self.elapsed())

    def _progress(self, text: str) -> None:
        self._save_spent()
        e, b = self.elapsed(), self.spec.budget_s
        self.log(f"triage [{_mmss(e)} of {_mmss(b)}, at most {_mmss(max(0.0, b - e))} left] {text}")

    # -- children

    def _program_args(self) -> list[str]:
        out = ["--program", self.spec.program]
        for o in self.spec.options:
            out += ["--program-option", o]
        return out

    def _child(self, stage: Stage, name: str, argv: list[str], timeout: float,
               grace: float = subproc.GRACE_S) -> subproc.subprocess.CompletedProcess:
        """Run ``xla-harness ARGV`` for ``stage``; its output kept in the stage's folder. An interrupt
        that arrived before or while it ran ends the triage here (:func:`_interrupted`), also one whose
        exception was swallowed on its way (raised in a finalizer, where CPython only prints it)."""
        _interrupted(f"starting triage stage {stage.name}")
        folder = self.stage_dir(stage)
        folder.mkdir(parents=True, exist_ok=True)
        full = [sys.executable, "-m", "xla_harness", *argv]
        self.commands.setdefault(stage.name, []).append("xla-harness " + subproc.shown(argv))
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        with open(folder / f"{name}.stdout.txt", "wb") as out, open(folder / f"{name}.stderr.txt", "wb") as err:
            try:
                done = subproc.run(full, timeout=max(timeout, 30.0), what=f"triage stage {stage.name}",
                                   stdout=out, stderr=err, env=env, die_with_parent=True,
                                   grace=grace)
            except subproc.ChildTimeout:
                done = subproc.subprocess.CompletedProcess(full, 124, b"", b"")
        _interrupted(f"running triage stage {stage.name}")
        return done

    def _child_error(self, stage: Stage, name: str) -> str:
        return last_said(self.stage_dir(stage) / f"{name}.stderr.txt")

    # -- stages

    def compile_stage(self, stage: Stage) -> dict:
        from xla_harness.stress.compile_only.records import COMPILE_RESULTS, read_compile_records

        folder = self.stage_dir(stage) / "compile"
        argv = ["stress", *self._program_args(), "--compile-only", "--target", stage.target, "--quiet",
                "--out", str(folder)]
        if folder.exists():  # a compile cut short may have left its HLO: resumed, not overwritten
            argv.append("--resume")
        self._progress(f"compiling for {stage.target}")
        done = self._child(stage, "compile", argv, timeout=max(self.left(), 60.0) + CHILD_GRACE_S)
        records = read_compile_records(folder / COMPILE_RESULTS) if (folder / COMPILE_RESULTS).is_file() else []
        if done.returncode not in (0, 1) or not records:
            why = "did not finish in its time" if done.returncode == 124 else self._child_error(stage, "compile")
            return {"ok": False, "error": f"the compile for {stage.target} failed: {why}"}
        verdict = verdict_of_record(records[-1], folder, stage.target)
        return {"ok": True, "verdict": verdict.to_json(), "record": record_summary(records[-1])}

    def hlo_stage(self, stage: Stage) -> dict:
        from xla_harness.hlo.memplan import beside
        from xla_harness.hlo.parser import parse_file

        module = parse_file(Path(stage.target))
        verdict = target_verdict(module, f"hlo:{stage.target}")
        if beside(Path(stage.target), "buffer-assignment") is not None:  # a dump: its memory plan too
            verdict.memory_plan = memory_plan(Path(stage.target))
        return {"ok": True, "verdict": verdict.to_json()}

    def _rounds(self, stage: Stage, budget: float, extra: list[str], configs: int, judge) -> dict:
        """Rounds of ``stress`` (``extra``: the stage's own flags) until ``judge(table)`` answers the
        stage's question or its ``budget`` is spent. Each round runs a new seed and twice the steps of
        the one before, sized down to the time left once a step's time is known (``configs``: the
        configurations each step runs); a round cut off by the budget (SIGTERM: stress finishes its
        step and keeps what ran) still counts."""
        from xla_harness.stress.report import summary as report

        rounds: list[str] = []
        started = time.monotonic()
        per_step = self.per_step
        answer_now = None
        for r in range(plan_mod.ROUNDS):
            left = budget - (time.monotonic() - started)
            steps = plan_mod.round_steps(self.spec.rate_of_interest, r)
            if per_step is not None:
                steps = min(steps, int(left / max(per_step * configs, 1e-9)))
            if rounds and steps < MIN_ROUND_STEPS or left <= 0:
                break
            steps = max(steps, MIN_ROUND_STEPS)
            folder = self.stage_dir(stage) / f"round-{r + 1}"
            # a step still running that long after the round's SIGTERM is abandoned (a hung collective, a
            # host callback): the budget holds within seconds, and what ran is kept
            stop_grace = min(STOP_GRACE_S, max(STOP_GRACE_FLOOR_S, 3 * (per_step or STOP_GRACE_FLOOR_S)))
            argv = ["stress", *self._program_args(), *extra, "--seeds", str(r + 1), "--steps", str(steps),
                    "--progress", "--out", str(folder), "--stop-grace", f"{stop_grace:.0f}", *self._inject_args(),
                    *self._explain_args(stage, rounds)]
            if (folder / "stress.jsonl").is_file():
                argv.append("--resume")
            self._progress(f"{stage.name}: round {r + 1}, {steps} steps x {configs} configuration(s) (seed {r + 1})")
            t = time.monotonic()
            done = self._child(stage, f"round-{r + 1}", argv, timeout=max(left, 30.0),
                               grace=stop_grace + STRESS_GRACE_S)
            ran = (folder / "stress.jsonl").is_file() and done.returncode in (0, 1, 124, 143)
            if not ran:
                if rounds:
                    break  # what the earlier rounds answered stands
                said = self._child_error(stage, f"round-{r + 1}")
                return {"ok": False, "error": f"stress {' '.join(extra)} failed: "
                                              f"{ended(done.returncode) if said == NO_OUTPUT else said}"}
            recorded = report.load_table([folder]).rows
            if not sum(row.n for row in recorded):  # the round ran and recorded no step: why, in words
                why = no_step(done.returncode, left, self._child_error(stage, f"round-{r + 1}"))
                if rounds:
                    self.notes.setdefault(stage.name, []).append(f"round {r + 1}: {why}")
                    break  # what the earlier rounds answered stands
                return {"ok": False, "error": f"{stage.name}: round {r + 1} recorded no step: {why}"}
            rounds.append(str(folder.relative_to(self.out)))
            table = report.load_table([self.out / f for f in rounds])
            done_steps = sum(row.n for row in table.rows)
            got = sum(row.n for row in recorded)
            if done.returncode in (124, 143) and got < steps * configs:  # stopped: say where, keep what ran
                last = f"no step after step {got // max(configs, 1) - 1}" if got >= configs else "no step"
                self.notes.setdefault(stage.name, []).append(
                    f"round {r + 1} was stopped at its time limit ({max(left, 30.0):.0f} s) with {got} of "
                    f"{steps * configs} steps recorded: {last} finished (a step that hangs, a collective or a "
                    "host callback, is stopped there; what ran is kept)")
            per_step = (time.monotonic() - t) / max(steps * configs, 1)  # its startup included: conservative
            self.per_step = per_step if self.per_step is None else min(self.per_step, per_step)
            answer_now = judge(table)
            if answer_now is not None or done.returncode in (124, 143) or not done_steps:
                break
        if not rounds:  # not a verdict: nothing ran (the budget was spent before this stage)
            return {"ok": False, "error": f"{stage.name}: no round ran within the budget "
                                          f"({max(0.0, budget):.0f} s were left for it; give a larger --budget)"}
        notes = self.notes.pop(stage.name, [])
        return {"ok": True, "rounds": rounds, "answer": answer_now, "per_step_s": per_step,
                **({"notes": notes} if notes else {})}

    def rate_stage(self, stage: Stage, budget: float) -> dict:
        def judge(table):
            if not table.rows:
                return None
            row = table.rows[0]
            return plan_mod.rate_answer(row.k, row.n, self.spec.rate_of_interest, row.nondet)

        return self._rounds(stage, budget, ["--protocol", stage.kind], 1, judge)

    def variants_stage(self, stage: Stage, budget: float, backend: str) -> dict:
        names = _variants(self.spec.program, backend)
        if len(names) < 2:
            return {"ok": True, "skipped": f"no workaround variant applies to this program on {backend}"}

        def judge(table):
            rows = [(r.config.get("variant", "?"), r.k, r.n) for r in table.rows]
            return plan_mod.variants_answer(rows, self.spec.rate_of_interest)

        return {**self._rounds(stage, budget, ["--variants", ",".join(names)], len(names), judge), "variants": names}

    def bisect_stage(self, stage: Stage, budget: float) -> dict:
        folder = self.stage_dir(stage) / "bisect"
        argv = ["bisect-passes", "--oracle", "stress", *self._program_args(), "--out", str(folder), "--json",
                "--quiet", "--time-limit", f"{budget:.0f}"]
        if (folder / "bisect.jsonl").is_file():
            argv.append("--resume")
        self._progress("bisecting the compiler's passes (the failure seen on the local backend)")
        # At its --time-limit it starts no probe and says what it narrowed; the grace is for the probe in flight.
        done = self._child(stage, "bisect", argv, timeout=budget + CHILD_GRACE_S)
        out = (self.stage_dir(stage) / "bisect.stdout.txt").read_text(encoding="utf-8", errors="replace")
        try:
            result = json.loads(out) if done.returncode in (0, 1) and out.strip() else None
        except ValueError:
            result = None
        if done.returncode == 124:
            return {"ok": False, "error": f"the bisection did not finish within its {budget:.0f} s and "
                                          f"{CHILD_GRACE_S:.0f} s of grace (a probe or the baseline run was still "
                                          f"going; its probes are in {folder.relative_to(self.out)}/bisect.jsonl)"}
        if isinstance(result, dict) and result.get("finished") is False and isinstance(result.get("partial"), dict):
            return {"ok": False, "partial": result["partial"], "folder": str(folder.relative_to(self.out)),
                    "error": f"the bisection stopped at its {budget:.0f} s {result.get('summary', '')}".rstrip()}
        if not isinstance(result, dict) or done.returncode != 0:
            return {"ok": False, "error": f"bisect-passes: {self._child_error(stage, 'bisect')}"}
        return {"ok": True, "result": result, "folder": str(folder.relative_to(self.out))}

    def bundle_stage(self, stage: Stage, failing_rounds: list[str], bisect_folder: str | None) -> dict:
        path = self.out / "repro.tar.gz"
        if path.is_file():
            return {"ok": True, "bundle": path.name}
        Path(f"{path}.partial").unlink(missing_ok=True)  # this triage's own bundle, cut short
        argv = ["bundle", *self._program_args(), "--out", str(path), "--results", str(self.out / failing_rounds[-1])]
        if bisect_folder:
            argv += ["--bisect", str(self.out / bisect_folder)]
        self._progress("writing the repro bundle")
        done = self._child(stage, "bundle", argv, timeout=max(self.left(), 120.0) + CHILD_GRACE_S)
        if done.returncode != 0 or not path.is_file():
            return {"ok": False, "error": f"bundle: {self._child_error(stage, 'bundle')}"}
        return {"ok": True, "bundle": path.name}

    def _explain_args(self, stage: Stage, rounds: list[str]) -> list[str]:
        """``--explain`` for a frozen or train round while fewer than the spec's ``explain_max``
        (:data:`~xla_harness.triage.spec.EXPLAIN_MAX` by default) of the stage's failing steps have an
        origin (the rounds before it decided the rest)."""
        if stage.kind not in ("frozen", "train"):
            return []
        from xla_harness.triage.where import traces

        explained = sum(len(t.origins) for t in traces(stage.kind, rounds, self.out))
        left = self.spec.explain_max - explained
        return ["--explain", "--explain-max", str(left)] if left > 0 else []

    def _inject_args(self) -> list[str]:
        if not self.spec.inject_rate:
            return []
        return ["--inject", self.spec.inject or "nan", "--inject-rate", repr(self.spec.inject_rate)]

    # -- the whole triage

    def run(self) -> tuple[dict, Answer]:
        self._open()
        summaries: dict[str, dict] = {}
        for stage in self.stages:
            if stage.kind in ("bisect", "bundle", "variants"):
                continue
            summaries[stage.name] = self._stage(stage, summaries)
        backend = _local_backend(self.out, summaries)
        failing = [s for s in ("frozen", "train") if summaries.get(s, {}).get("answer") == "fails"]
        measured = [s for s in ("frozen", "train") if summaries.get(s, {}).get("rounds")]
        innocent = self._not_the_compiler(summaries, failing)
        for stage in self.stages:
            if stage.kind == "variants":
                skipped = (NOTHING_TO_COMPARE.format(" and ".join(measured)) if measured else NOTHING_RAN) \
                    if not failing else innocent
                if skipped and self._done(stage) is None:  # only a compiler's failing baseline can improve
                    self._progress(f"{stage.name}: {skipped}")
                    summaries[stage.name] = self._finish(stage, {"ok": True, "skipped": skipped}, 0.0)
                    continue
                summaries[stage.name] = self._stage(stage, summaries, backend=backend)
        if failing:
            for stage in self.stages:
                if stage.kind in ("bisect", "bundle"):
                    if innocent and self._done(stage) is None:
                        self._progress(f"{stage.name}: {innocent}")
                        summaries[stage.name] = self._finish(stage, {"ok": True, "skipped": innocent}, 0.0)
                        continue
                    summaries[stage.name] = self._stage(stage, summaries, failing=failing)
        state = self._state(summaries, backend)
        _write_json(self.state_path, state)
        return state, answer(state, self.out)

    def _not_the_compiler(self, summaries: dict, failing: list[str]) -> str | None:
        """Why variants and pass bisection do not run (:data:`NOT_THE_COMPILER`): the failing stages'
        explained steps are all input, program or precision; None when some is a race, the compiler's
        or unknown, or none was explained (then the compiler stays a suspect)."""
        from xla_harness.triage import whose
        from xla_harness.triage.where import traces

        found = [t for s in failing for t in traces(s, summaries[s].get("rounds", []), self.out)]
        if not whose.compiler_cleared(found):
            return None
        return NOT_THE_COMPILER.format(", ".join(f"{n} {k}" for k, n in whose.counts(found).items()))

    def _stage(self, stage: Stage, summaries: dict, backend: str = "", failing: list[str] | None = None) -> dict:
        done = self._done(stage)
        if done is not None and done.get("per_step_s"):  # what sizes the later stages' rounds, as before
            self.per_step = min(self.per_step or math.inf, float(done["per_step_s"]))
        if done is not None:
            said = done.get("answer") or ("ok" if done.get("ok") else "failed")
            self._progress(f"{stage.name}: done earlier ({said})")
            return done
        t = time.monotonic()
        self.running = (stage, t, self._stage_spent_before(stage))
        budget = plan_mod.budget_for(stage.kind, self.left(), max(self.spec.budget_s - self._compile_seconds(), 60.0))
        if stage.kind == "compile":
            summary = self.compile_stage(stage)
        elif stage.kind == "hlo":
            summary = self.hlo_stage(stage)
        elif stage.kind in ("frozen", "train"):
            summary = self.rate_stage(stage, budget)
        elif stage.kind == "variants":
            summary = self.variants_stage(stage, budget, backend)
        elif stage.kind == "bisect":
            # its share, at least a minute where the budget still has one: never past the budget's end
            limit = min(max(budget, BISECT_FLOOR_S), self.left())
            summary = self.bisect_stage(stage, limit) if limit >= BISECT_MIN_S else {
                "ok": False, "error": f"the bisection was not started: {self.left():.0f} s of the budget was left "
                                      f"(it needs {BISECT_MIN_S:.0f} s or more)"}
        else:
            failing_rounds = [r for s in failing or [] for r in summaries[s].get("rounds", [])]
            bisect = summaries.get("bisect", {})
            summary = self.bundle_stage(stage, failing_rounds, bisect.get("folder") if bisect.get("ok") else None)
        summary["commands"] = self.commands.get(stage.name, [])
        return self._finish(stage, summary, time.monotonic() - t)

    def _compile_seconds(self) -> float:
        total = 0.0
        for s in self.stages:
            d = self._done(s) if s.kind == "compile" else None
            total += float(d.get("seconds", 0.0)) if d else 0.0
        return total

    def _open(self) -> None:
        """Check ``out`` before anything runs: a new (or empty) folder, or with ``--resume`` one this
        triage (same program, options, targets) started: its ``triage-spec.json``, written first, says
        so. A folder without it (an empty ``stages/`` and a file of the user's, say) is not a triage's
        and is never run into."""
        begun = self.out / "triage-spec.json"
        if not self.out.is_dir() and self.out.exists():
            raise HarnessError(f"{self.out} exists and is not a folder; choose another --out")
        if begun.exists() or self.state_path.exists():
            if not self.resume:
                raise HarnessError(f"{self.out} holds a triage already; pass --resume to continue it, or choose "
                                   "another --out")
            if not begun.is_file():
                raise HarnessError(f"{self.out} has no readable triage-spec.json (what a triage writes first); "
                                   "it cannot be resumed: choose another --out")
            old = read_spec(begun)
            if old["spec"] != self.spec.to_json():
                diff = [k for k in self.spec.to_json() if old["spec"].get(k) != self.spec.to_json()[k]]
                raise HarnessError(f"{self.out} holds a triage of another request (differs in "
                                   f"{', '.join(diff) or 'its fields'}); choose another --out")
            self.spent_before = old["spent_s"]
        elif self.out.exists() and any(self.out.iterdir()):
            raise HarnessError(f"{self.out} exists and is not a triage folder (no triage-spec.json); choose another "
                               "--out")
        self.out.mkdir(parents=True, exist_ok=True)
        _write_json(self.out / "triage-spec.json", {"spec": self.spec.to_json(), "spent_s": self.spent_before})

    def _state(self, summaries: dict, backend: str) -> dict:
        _write_json(self.out / "triage-spec.json", {"spec": self.spec.to_json(), "spent_s": round(self.elapsed(), 1)})
        return {"kind": "triage", "schema": 1, "spec": self.spec.to_json(), "backend": backend,
                "stages": summaries, "elapsed_s": round(self.elapsed(), 1)}


def _mmss(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    return f"{seconds // 60}:{seconds % 60:02d}"


def _local_backend(out: Path, summaries: dict) -> str:
    """The backend the local stages ran on (their results' header), "" when none ran."""
    from xla_harness.stress.results import store

    for name in ("frozen", "train"):
        for folder in summaries.get(name, {}).get("rounds", []):
            for path in store.results_files(out / folder):
                return str(store.read_results(path).header.env.get("backend", ""))
    return ""


def _variants(program: str, backend: str) -> list[str]:
    """``baseline`` and every workaround that applies: the program variants when the program's factory
    takes ``variant=``, and the compiler-flag sets meant for ``backend``."""
    import inspect

    from xla_harness.programs.interface import program_factory
    from xla_harness.programs.variants import FLAG_SETS, VARIANTS

    names = ["baseline"]
    try:
        make = program_factory(program)
        params = inspect.signature(getattr(make, "__wrapped__", make)).parameters
        if "variant" in params:
            names += [v for v in VARIANTS if v != "baseline"]
    except (HarnessError, TypeError, ValueError):
        pass
    names += [n for n, fs in FLAG_SETS.items() if backend in fs.backends]
    return names
