"""Generated bad-input cases for every subcommand, build/build_jaxlib.py and the tools.

Each case is an argv (``{tmp}`` is replaced by the case's own folder) and a setup that
writes the files the argv names. A refused input (``expect`` 2, the default) must end with
exit 2, exactly one ``error:`` line on stderr, no traceback, no file that existed before
changed and, on the surfaces of round 4, no file created (a new lock beside an existing results
file aside); a case may
instead expect the command to work (0, ``check`` then says whether what it did is right) or
to be interrupted (130/143, ``signal``). :func:`verdict` sorts an outcome into one class.
Used by tests/cli/test_bad_input.py and by tools/bad_input_census.py (which counts outcomes).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

TINY_ARGS = ["--vocab", "64", "--d-model", "32", "--layers", "1", "--heads", "2", "--seq", "8", "--batch", "8"]
# The stress options the synthetic results files below were "written" with.
RUN_ARGS = ["--modes", "full", "--remat", "on", "--seeds", "1", "--steps", "4", "--block", "2", *TINY_ARGS]
SPEC = {"batch": 8, "block": 2, "checkpoint_seconds": 300.0, "d_model": 32, "devices": 1, "dtype": "f32",
        "heads": 2, "inject": "nan", "inject_rate": 0.0, "layers": 1, "learning_rate": 0.001, "modes": ["full"],
        "program": "tied-embedding", "program_options": {}, "protocol": "train", "reference": False,
        "reference_every": 5, "remats": [True], "seeds": [1], "seq": 8, "steps": 4, "vocab": 64}
CONFIG = {"batch": 8, "d_model": 32, "dtype": "f32", "heads": 2, "layers": 1, "mode": "full", "remat": True,
          "seq": 8, "vocab": 64}
ENV = {"backend": "cpu", "device_count": 1, "device_kind": "cpu", "jax": "0.12.0.1", "jaxlib": "0.12.0.1"}


@dataclass
class Case:
    id: str
    argv: list[str]
    setup: Callable[[Path], None] = lambda tmp: None
    # "cli": xla_harness.cli.main in this process (the census: a forked child); "build":
    # build/build_jaxlib.py; "publish": tools/publish_hlo.py's main; "process": python -m
    # xla_harness.cli in a fresh interpreter (signals, standard input, what kills a process);
    # "sweep": tools/tpu-sweep (bash), with a stand-in make (the venvs are not what it measures).
    entry: str = "cli"
    needs_nonroot: bool = False
    tags: set[str] = field(default_factory=set)
    env: dict[str, str] = field(default_factory=dict)  # set for the run ({tmp} replaced)
    expect: int = 2  # 2: a refusal; 0: the command must work (check says whether right); 130/143: interrupted
    signal: tuple[int, float] | None = None  # process: (signum, seconds after start; -1: pending from before exec)
    stdin: str | None = None  # process: this path ({tmp}) as standard input
    check: Callable[[Path, str], str | None] | None = None  # after a run that must work: what is wrong, or None
    needle: str = ""  # a refusal's error line must name this (the cause, not a symptom)
    lock: str | None = None  # a file ({tmp}) another process holds an exclusive flock on during the run
    late: float | None = None  # a refusal after more seconds than this came after work it could not use
    timeout: float | None = None  # the census's own limit for this case, when longer than its default

    def args(self, tmp: Path) -> list[str]:
        return [a.replace("{tmp}", str(tmp)) for a in self.argv]

    def environ(self, tmp: Path) -> dict[str, str]:
        return {k: v.replace("{tmp}", str(tmp)) for k, v in self.env.items()}


CLASSES = ("clear", "traceback", "wrong-exit", "error-lines", "internal", "vague", "silent", "late", "hang",
           "killed", "changed-files", "python-startup")


def _python_startup_only(err: str) -> bool:
    """The interpreter's own start-up failed, before any harness code ran: a traceback entirely inside
    site (a signal there), or CPython refusing to start at all (standard input a folder)."""
    if "Fatal Python error: init_sys_streams" in err:
        return True
    frames = [ln for ln in err.splitlines() if ln.lstrip().startswith("File ")]
    return bool(frames) and all("<frozen site>" in f or "<frozen importlib" in f or '"<string>"' in f
                                for f in frames)


def changed_paths(before: dict, after: dict) -> list[str]:
    """Files that existed and changed or went, and paths that appeared (a lock file beside an existing
    results file aside: a run's lock, by design)."""
    out = sorted(k for k, v in before.items() if after.get(k) != v)
    for k in sorted(set(after) - set(before)):
        if k.endswith(".jsonl.lock") and k[:-len(".lock")] in before:
            continue
        out.append(f"{k} (created)")
    return out


def verdict(case: Case, code: int | None, out: str, err: str, before: dict, after: dict,
            seconds: float, tmp: Path, signum: int | None = None) -> tuple[str, str]:
    """The class of one outcome (:data:`CLASSES`) and a detail: ``code`` the exit status (None when
    killed by ``signum``)."""
    if code is None:
        return ("hang", f"still running after {seconds:.0f} s") if signum is None else ("killed", f"signal {signum}")
    if _python_startup_only(err) and case.entry == "process":
        return "python-startup", (err.strip().splitlines() or [""])[0]
    if "Traceback" in err or "MemoryError" in err:
        return "traceback", err.strip().splitlines()[-1] if err.strip() else ""
    errors = [ln for ln in err.splitlines() if ln.startswith("error:")]
    if code == 0 and case.expect != 0:  # taken (and whatever it wrote with it): a silent wrong result
        return "silent", f"exit 0 ({'the signal was not acted on' if case.expect >= 128 else 'the input was taken'})"
    changed = _changed(case, before, after)
    if changed:
        return "changed-files", ", ".join(changed)
    if case.expect == 0 and code == 0 and case.check is not None:
        problem = case.check(tmp, out)
        if problem:
            return "silent", problem
    if code != case.expect:
        return "wrong-exit", f"exit {code}, not {case.expect}: " + (errors[-1] if errors else err.strip()[-200:])
    if case.expect >= 128:
        return _interrupted(case, errors, err, seconds)
    if case.expect == 0:
        return ("error-lines", errors[0]) if errors else ("clear", "")
    return _refusal(case, errors, seconds)


def _interrupted(case: Case, errors: list[str], err: str, seconds: float) -> tuple[str, str]:
    """The class of a run a signal must end (130/143): no error line, in time."""
    if errors:
        return "internal", errors[0]
    if case.late is not None and seconds > case.late:  # the signal acted only after work it could not stop
        return "late", f"{seconds:.1f} s to act on the signal"
    return "clear", err.strip()[-200:]


def _changed(case: Case, before: dict, after: dict) -> list[str]:
    """What a refusal or an interrupted run changed that it must not have: a refusal nothing that was
    there, and on the surfaces of round 4 (tagged ``round4``) nothing created either; an interrupted
    run nothing that was there (what it wrote before the signal it keeps). The earlier rounds'
    cases promise the first only: a stress run whose program fails when it is first traced has
    written its results header by then."""
    if case.expect == 0:
        return []
    changed = changed_paths(before, after)
    if case.expect >= 128 or not {"round4", "round5"} & case.tags:
        changed = [c for c in changed if not c.endswith("(created)")]
    return changed


def _refusal(case: Case, errors: list[str], seconds: float) -> tuple[str, str]:
    """The class of a refusal that exited 2: one line, the user's mistake, naming the cause, in time."""
    if len(errors) != 1:
        return "error-lines", f"{len(errors)} error: lines"
    # a user's mistake reported as the harness's own bug (a scanner's unforeseen exception included)
    if errors[0].startswith("error: internal:") or "could not be scanned (" in errors[0]:
        return "internal", errors[0]
    if case.needle and case.needle not in errors[0]:
        return "vague", errors[0]
    if case.late is not None and seconds > case.late:
        return "late", f"{seconds:.1f} s: {errors[0]}"
    return "clear", errors[0]


@contextlib.contextmanager
def held_lock(case: Case, tmp: Path):
    """While the case runs, another holder's exclusive flock on ``case.lock`` (a run already writing)."""
    if case.lock is None:
        yield
        return
    import fcntl

    path = Path(case.lock.replace("{tmp}", str(tmp)))
    with open(path, "a") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        yield


STUB_MAKE = "#!/bin/sh\n# the census's stand-in: making the venvs is not what a sweep case measures\nexit 0\n"


def process_command(case: Case, tmp: Path, root: Path) -> tuple[list[str], dict[str, str]]:
    """argv and environment of a case run as its own process (entries ``process`` and ``sweep``)."""
    import sys

    env = {**os.environ, "PYTHONPATH": str(root), **case.environ(tmp)}
    if case.entry == "sweep":
        stub = tmp.parent / "bin"
        stub.mkdir(exist_ok=True)
        (stub / "make").write_text(STUB_MAKE)
        (stub / "make").chmod(0o755)
        env["PATH"] = f"{stub}{os.pathsep}{env.get('PATH', '')}"
        env.setdefault("CHECK_PY", sys.executable)
        return ["bash", str(root / "tools" / "tpu-sweep")], env
    return [sys.executable, "-m", "xla_harness.cli", *case.args(tmp)], env


def as_from_a_terminal(blocked: set[int]) -> None:
    """In a child before it starts: SIGINT and SIGQUIT as a command typed at a terminal gets them (a
    suite started in the background, ``cmd &`` without job control, hands its children SIGINT
    ignored, and the harness rightly leaves an inherited SIG_IGN alone), then ``blocked`` blocked."""
    import signal as _signal

    for sig in (_signal.SIGINT, _signal.SIGQUIT):
        _signal.signal(sig, _signal.SIG_DFL)
    if blocked:
        _signal.pthread_sigmask(_signal.SIG_BLOCK, blocked)


def catches_sigterm(pid: int) -> bool:
    """Whether process ``pid`` has a handler for SIGTERM: the harness's first instruction
    (xla_harness/_early.py) installs one; CPython starting up has none."""
    import signal as _signal

    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    caught = next((line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:")), "0")
    return bool(int(caught, 16) >> (_signal.SIGTERM - 1) & 1)


def harness_started(proc, deadline: float) -> None:
    """Wait until the harness's own code runs in ``proc`` (its signal handlers are installed), the
    process ended, or ``deadline``: on a loaded machine CPython's start-up alone can take longer than
    a case's delay, and a signal then is CPython's to handle, not the harness's."""
    import time

    while proc.poll() is None and not catches_sigterm(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.002)


def run_process(case: Case, tmp: Path, root: Path, timeout: float) -> tuple[int | None, int | None, str, str, float]:
    """Run a ``process``/``sweep`` case: (exit code or None, the signal that killed it, stdout, stderr,
    seconds); (None, None, ..) after ``timeout`` (it was killed: a hang)."""
    import signal as _signal
    import subprocess
    import time

    argv, env = process_command(case, tmp, root)
    # standard input: the case's path (a folder too: opened as a descriptor), else nothing
    stdin = os.open(case.stdin.replace("{tmp}", str(tmp)), os.O_RDONLY) if case.stdin else subprocess.DEVNULL
    pending = case.signal is not None and case.signal[1] < 0
    blocked = {case.signal[0]} if case.signal is not None else set()
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, cwd=tmp, env=env, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True,
                            preexec_fn=lambda: as_from_a_terminal(blocked if pending else set()))
    try:
        if case.signal is not None:
            signum, after = case.signal
            if after > 0:
                if case.entry == "process":  # counted from the harness's first instruction, not CPython's start
                    harness_started(proc, deadline=t0 + timeout)
                time.sleep(after)  # the moment the signal arrives is what the case is about
            proc.send_signal(signum)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, _signal.SIGKILL)
            out, err = proc.communicate()
            return None, None, out, err, time.monotonic() - t0
    finally:
        if case.stdin:
            os.close(stdin)
    seconds = time.monotonic() - t0
    if proc.returncode < 0:
        return None, -proc.returncode, out, err, seconds
    return proc.returncode, None, out, err, seconds


def header() -> dict:
    return {"kind": "header", "spec": dict(SPEC), "time": "2026-01-01T00:00:00+00:00", "env": dict(ENV)}


def block(start: int, end: int, seed: int = 1) -> dict:
    steps = [{"step": s, "finite": True, "first_bad": None, "max_abs_update": 0.01, "loss": 4.0}
             for s in range(start, end)]
    return {"kind": "block", "config": dict(CONFIG), "label": "full/remat=on/f32", "seed": seed, "start": start,
            "end": end, "nonfinite": 0, "silent": 0, "steps": steps, "time": "2026-01-01T00:00:00+00:00",
            "env": dict(ENV)}


def lines(records: list) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in records)


def good_results() -> bytes:
    return lines([header(), block(0, 2), block(2, 4)])


def _mutate_block(fn) -> bytes:
    b = block(0, 2)
    fn(b)
    return lines([header(), b, block(2, 4)])


def _mutate_header(fn) -> bytes:
    h = header()
    fn(h)
    return lines([h, block(0, 2), block(2, 4)])


def _set(d: dict, path: str, value) -> None:
    keys = path.split(".")
    for k in keys[:-1]:
        d = d[k] if not isinstance(d, list) else d[int(k)]
    if isinstance(d, list):
        d[int(keys[-1])] = value
    else:
        d[keys[-1]] = value


def _del(d: dict, path: str) -> None:
    keys = path.split(".")
    for k in keys[:-1]:
        d = d[k] if not isinstance(d, list) else d[int(k)]
    del d[keys[-1]]


GOOD = good_results()
GOOD_LINES = GOOD.split(b"\n")

# Results files that are not valid stress results. The corruption is never only in the last
# line (a torn tail is repaired by --resume, by design).
CORRUPT_RESULTS: dict[str, bytes] = {
    "empty": b"",
    "blank-lines": b"\n\n\n",
    "non-utf8": GOOD_LINES[0] + b"\n" + b"\xff\xfe\x80 not utf-8\n" + GOOD_LINES[2] + b"\n",
    "non-utf8-in-string": GOOD.replace(b"full/remat=on/f32", b"full/remat=on/\xe9\xff", 1),
    "latin1-header": GOOD.replace(b'"cpu"', b'"cp\xe9"', 1),
    "binary": bytes(range(256)) * 8 + b"\n" + GOOD,
    "nul-bytes": GOOD_LINES[0] + b"\n\x00\x00\x00\n" + GOOD_LINES[2] + b"\n",
    "not-json-middle": GOOD_LINES[0] + b"\n{not json}\n" + GOOD_LINES[2] + b"\n",
    "json-array": GOOD_LINES[0] + b"\n[1, 2, 3]\n" + GOOD_LINES[2] + b"\n",
    "json-string": GOOD_LINES[0] + b'\n"block"\n' + GOOD_LINES[2] + b"\n",
    "json-null": GOOD_LINES[0] + b"\nnull\n" + GOOD_LINES[2] + b"\n",
    "deep-nesting": GOOD_LINES[0] + b"\n" + b"[" * 100000 + b"]" * 100000 + b"\n" + GOOD_LINES[2] + b"\n",
    "deep-nesting-in-block": GOOD_LINES[0] + b'\n{"kind": "block", "steps": ' + b"[" * 50000 + b"]" * 50000
    + b"}\n" + GOOD_LINES[2] + b"\n",
    "no-header": lines([block(0, 2), block(2, 4)]),
    "foreign-jsonl": b'{"event": "login", "user": 1}\n{"event": "logout", "user": 1}\n',
    "two-headers": lines([header(), block(0, 2), header(), block(2, 4)]),
    "unknown-kind": lines([header(), {**block(0, 2), "kind": "blok"}, block(2, 4)]),
    "header-no-spec": _mutate_header(lambda h: _del(h, "spec")),
    "header-spec-list": _mutate_header(lambda h: _set(h, "spec", [1, 2])),
    "header-steps-string": _mutate_header(lambda h: _set(h, "spec.steps", "4")),
    "header-steps-negative": _mutate_header(lambda h: _set(h, "spec.steps", -4)),
    "header-steps-float": _mutate_header(lambda h: _set(h, "spec.steps", 4.5)),
    "header-steps-bool": _mutate_header(lambda h: _set(h, "spec.steps", True)),
    "header-seeds-strings": _mutate_header(lambda h: _set(h, "spec.seeds", ["1"])),
    "header-seeds-dup": _mutate_header(lambda h: _set(h, "spec.seeds", [1, 1])),
    "header-modes-dup": _mutate_header(lambda h: _set(h, "spec.modes", ["full", "full"])),
    "header-modes-null": _mutate_header(lambda h: _set(h, "spec.modes", None)),
    "header-remats-strings": _mutate_header(lambda h: _set(h, "spec.remats", ["on"])),
    "header-env-list": _mutate_header(lambda h: _set(h, "env", [])),
    "block-no-label": _mutate_block(lambda b: _del(b, "label")),
    "block-label-int": _mutate_block(lambda b: _set(b, "label", 3)),
    "block-no-seed": _mutate_block(lambda b: _del(b, "seed")),
    "block-seed-string": _mutate_block(lambda b: _set(b, "seed", "1")),
    "block-seed-float": _mutate_block(lambda b: _set(b, "seed", 1.5)),
    "block-no-steps": _mutate_block(lambda b: _del(b, "steps")),
    "block-steps-dict": _mutate_block(lambda b: _set(b, "steps", {"0": True})),
    "block-start-after-end": _mutate_block(lambda b: (_set(b, "start", 2), _set(b, "end", 0))),
    "block-start-negative": _mutate_block(lambda b: _set(b, "start", -1)),
    "block-nonfinite-string": _mutate_block(lambda b: _set(b, "nonfinite", "0")),
    "step-no-finite": _mutate_block(lambda b: _del(b, "steps.0.finite")),
    "step-finite-string": _mutate_block(lambda b: _set(b, "steps.0.finite", "yes")),
    "step-no-step": _mutate_block(lambda b: _del(b, "steps.0.step")),
    "step-step-string": _mutate_block(lambda b: _set(b, "steps.0.step", "0")),
    "step-outside-block": _mutate_block(lambda b: _set(b, "steps.1.step", 7)),
    "step-not-dict": _mutate_block(lambda b: _set(b, "steps.0", 0)),
    "step-first-bad-int": _mutate_block(lambda b: _set(b, "steps.0.first_bad", 1)),
    "step-loss-string": _mutate_block(lambda b: _set(b, "steps.0.loss", "nan")),
    "step-reference-list": _mutate_block(lambda b: _set(b, "steps.0.reference", [])),
    "step-count-mismatch": _mutate_block(lambda b: _set(b, "steps", b["steps"][:1])),
    "huge-seed": _mutate_block(lambda b: _set(b, "seed", 10**400)),
}

_READERS: list[tuple[str, list[str]]] = [
    ("report", ["report", "{tmp}/res"]),
    ("report-json", ["report", "--json", "{tmp}/res"]),
    ("merge", ["merge", "{tmp}/res"]),
    ("compare-a", ["compare", "{tmp}/res", "{tmp}/good"]),
    ("compare-b", ["compare", "{tmp}/good", "{tmp}/res"]),
    ("stress-resume", ["stress", "--resume", "--quiet", "--out", "{tmp}/res", *RUN_ARGS]),
]


def _results_setup(content: bytes) -> Callable[[Path], None]:
    def setup(tmp: Path) -> None:
        (tmp / "res").mkdir()
        (tmp / "res" / "stress.jsonl").write_bytes(content)
        (tmp / "good").mkdir()
        (tmp / "good" / "stress.jsonl").write_bytes(GOOD)
    return setup


def _mkfifo(path: Path) -> None:
    os.mkfifo(path)


def _files(**files: bytes | str | None) -> Callable[[Path], None]:
    """Setup writing files (None: a FIFO; the str '/': a directory). A key names a path with
    '__' for '/' and, unless the name has a dot already, its last '__' for the dot of the
    extension: a__stress__jsonl is a/stress.jsonl, w__stamps__resolve.json is w/stamps/resolve.json."""
    def setup(tmp: Path) -> None:
        for key, data in files.items():
            parts = key.split("__")
            dotted = len(parts) >= 3 and "." not in parts[-1]
            rel = "/".join([*parts[:-2], f"{parts[-2]}.{parts[-1]}"] if dotted else parts)
            p = tmp / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            if data is None:
                _mkfifo(p)
            elif isinstance(data, str) and data == "/":
                p.mkdir()
            else:
                p.write_bytes(data if isinstance(data, bytes) else data.encode())
    return setup


def results_cases() -> list[Case]:
    out = []
    for name, content in CORRUPT_RESULTS.items():
        for reader, argv in _READERS:
            if name == "empty" and reader == "stress-resume":
                continue  # an empty file is a run that has not started: --resume starts it
            out.append(Case(f"results-{name}-{reader}", argv, _results_setup(content), tags={"results"}))
    # Not-a-results-folder inputs.
    for reader, argv in _READERS:
        out.append(Case(f"results-fifo-{reader}", argv, _files(res__stress__jsonl=None, good__stress__jsonl=GOOD)))
        if reader != "stress-resume":  # --resume with nothing to resume starts the run
            out.append(Case(f"results-missing-{reader}", argv, _files(good__stress__jsonl=GOOD)))
        out.append(Case(f"results-dir-is-file-{reader}", argv, _files(res=GOOD, good__stress__jsonl=GOOD)))
        out.append(Case(f"results-jsonl-is-dir-{reader}", argv,
                        _files(res__stress__jsonl="/", good__stress__jsonl=GOOD)))
    return out


def _bad(flag_cases: dict[str, list[str]], prefix: str, base: list[str], setup=None) -> list[Case]:
    return [Case(f"{prefix}-{k}", [*base, *v], setup or (lambda tmp: None)) for k, v in flag_cases.items()]


STRESS_FLAGS = {
    "steps-zero": ["--steps", "0"], "steps-negative": ["--steps", "-3"], "steps-word": ["--steps", "many"],
    "steps-float": ["--steps", "2.5"], "steps-empty": ["--steps", ""],
    "seeds-empty": ["--seeds", ""], "seeds-word": ["--seeds", "a,b"], "seeds-dup": ["--seeds", "1,1"],
    "seeds-negative": ["--seeds", "-1"], "seeds-huge": ["--seeds", str(2**40)], "seeds-commas": ["--seeds", ",,,"],
    "modes-unknown": ["--modes", "bogus"], "modes-dup": ["--modes", "full,full"], "modes-empty": ["--modes", ""],
    "modes-case": ["--modes", "FULL"], "remat-word": ["--remat", "maybe"], "remat-dup": ["--remat", "on,on"],
    "remat-dup-alias": ["--remat", "on,true"], "remat-empty": ["--remat", ""],
    "dtype-f64": ["--dtype", "f64"], "dtype-empty": ["--dtype", ""], "devices-zero": ["--devices", "0"],
    "devices-word": ["--devices", "x"], "block-zero": ["--block", "0"], "block-negative": ["--block", "-1"],
    "lr-negative": ["--lr", "-1"], "lr-zero": ["--lr", "0"], "lr-nan": ["--lr", "nan"], "lr-inf": ["--lr", "inf"],
    "lr-word": ["--lr", "fast"], "rate-two": ["--inject-rate", "2"], "rate-nan": ["--inject-rate", "nan"],
    "rate-negative": ["--inject-rate", "-0.1"], "ref-every-zero": ["--reference-every", "0"],
    "vocab-zero": ["--vocab", "0"], "dmodel-zero": ["--d-model", "0"], "heads-indivisible": ["--heads", "3"],
    "seq-one": ["--seq", "1"], "layers-word": ["--layers", "two"], "batch-negative": ["--batch", "-8"],
    "unknown-flag": ["--frobnicate"], "positional": ["extra"],
    "coordinator-alone": ["--coordinator", "localhost:1234"],
    "process-id-range": ["--coordinator", "localhost:1", "--num-processes", "2", "--process-id", "5"],
    "process-id-negative": ["--coordinator", "localhost:1", "--num-processes", "2", "--process-id", "-1"],
    "devices-indivisible": ["--devices", "3", "--num-processes", "2", "--coordinator", "h:1", "--process-id", "0"],
    "init-timeout-zero": ["--init-timeout", "0"],
    "variants-empty": ["--variants", ""], "variants-dup": ["--variants", "baseline,baseline"],
    "variants-unknown": ["--variants", "baseline,bogus"], "variants-no-baseline": ["--variants", "barrier"],
    "variants-unknown-flag-set": ["--variants", "baseline,barrier+bogus"],
    "variants-other-backend": ["--variants", "baseline,tpu-no-fusion", "--steps", "1", *TINY_ARGS],
    "block-over-rows": ["--block", "1025"], "block-far-over-rows": ["--block", "2000"],
    "commit-step-frozen": ["--commit", "step", "--protocol", "frozen"],
    "explain-max-zero": ["--explain", "--explain-max", "0"], "explain-replays-word": ["--explain-replays", "many"],
    "explain-compile-only": ["--explain", "--compile-only"],
    "explain-multi-process": ["--explain", "--coordinator", "h:1", "--num-processes", "2", "--process-id", "0"],
}


def _foreign_block() -> bytes:
    """The first half of a run (steps 2-3 left to run), then a block another program wrote."""
    other = {**block(2, 4), "program": "other.py:make", "label": "other.py:make", "config": {}}
    return lines([header(), block(0, 2), other])


def stress_cases() -> list[Case]:
    base = ["stress", "--quiet", "--out", "{tmp}/out"]
    out = _bad(STRESS_FLAGS, "stress", base)
    out += [
        Case("stress-out-is-file", ["stress", "--quiet", "--out", "{tmp}/f", *RUN_ARGS], _files(f=b"x")),
        Case("stress-out-under-file", ["stress", "--quiet", "--out", "{tmp}/f/sub", *RUN_ARGS], _files(f=b"x")),
        Case("stress-out-has-results", ["stress", "--quiet", "--out", "{tmp}/res", *RUN_ARGS],
             _files(res__stress__jsonl=GOOD)),
        Case("stress-out-foreign-jsonl-resume", ["stress", "--resume", "--quiet", "--out", "{tmp}/res", *RUN_ARGS],
             _files(res__stress__jsonl=b'{"a": 1}\n{"b": 2')),
        Case("stress-out-foreign-text-resume", ["stress", "--resume", "--quiet", "--out", "{tmp}/res", *RUN_ARGS],
             _files(res__stress__jsonl=b"my notes, not results")),
        Case("stress-out-foreign-no-newline", ["stress", "--quiet", "--out", "{tmp}/res", *RUN_ARGS],
             _files(res__stress__jsonl=b"hello")),
        Case("stress-resume-other-options", ["stress", "--resume", "--quiet", "--out", "{tmp}/res",
                                             *RUN_ARGS, "--lr", "0.01"], _files(res__stress__jsonl=GOOD)),
        Case("stress-resume-other-options-torn-tail",
             ["stress", "--resume", "--quiet", "--out", "{tmp}/res", *RUN_ARGS, "--steps", "8"],
             _files(res__stress__jsonl=GOOD + b'{"kind": "block", "sta')),
        Case("stress-resume-other-options-valid-tail",
             ["stress", "--resume", "--quiet", "--out", "{tmp}/res", *RUN_ARGS, "--seeds", "2"],
             _files(res__stress__jsonl=GOOD.rstrip(b"\n"))),
        Case("stress-resume-foreign-program-block", ["stress", "--resume", "--quiet", "--out", "{tmp}/res", *RUN_ARGS],
             _files(res__stress__jsonl=_foreign_block())),
        Case("stress-resume-fifo-results", ["stress", "--resume", "--quiet", "--out", "{tmp}/res", *RUN_ARGS],
             _files(res__stress__jsonl=None)),
        Case("stress-plot-is-dir", ["stress", "--quiet", "--out", "{tmp}/o", "--plot", "{tmp}/d", "--steps", "0"],
             _files(d="/")),
        # a KeyboardInterrupt no signal caused is the program's own raise (the CLI notes every SIGINT)
        Case("stress-program-raises-keyboard-interrupt-at-import",
             ["stress", "--quiet", "--out", "{tmp}/o", "--program", "{tmp}/kbi.py:make"],
             _files(**{"kbi.py": b"raise KeyboardInterrupt\n"}), entry="process"),
        Case("stress-program-raises-keyboard-interrupt-in-make",
             ["stress", "--quiet", "--out", "{tmp}/o", "--program", "{tmp}/kbi.py:make"],
             _files(**{"kbi.py": b"def make():\n    raise KeyboardInterrupt\n"}), entry="process"),
    ]
    return out


# Odd but valid HLO: XLA's parser takes the last computation as the entry when none is marked
# (checked with jaxlib's hlo_module_from_text), and a 20000-deep one-element tuple shape is
# grammatical (XLA's recursive parser overflows its stack on it). scan must read them: exit 0.
ODD_VALID_HLO: dict[str, bytes] = {
    "no-entry": b"HloModule m\n\n%f {\n  ROOT c = f32[] constant(0)\n}\n",
}
HLO_GOOD = "HloModule m\n\nENTRY e {\n  p = f32[4] parameter(0)\n  ROOT n = f32[4] negate(p)\n}\n"
DEEP_TUPLE = "(" * 20000 + "f32[]" + ")" * 20000
ODD_VALID_HLO["deep-tuple-shape"] = f"HloModule m\n\nENTRY e {{\n  ROOT p = {DEEP_TUPLE} parameter(0)\n}}\n".encode()
SCAN_FILES: dict[str, bytes | None] = {
    "empty": b"",
    "non-utf8": b"HloModule m\n\xff\xfe\nENTRY e {\n ROOT c = f32[] constant(0)\n}\n",
    "binary": bytes(range(256)) * 16,
    "not-hlo": b"hello world\n",
    "json": b'{"HloModule": 1}\n',
    "unclosed-brace": b"HloModule m\n\nENTRY e {\n  ROOT c = f32[] constant(0)\n",
    "self-cycle": b"HloModule m\n\nENTRY e {\n  %t = f32[4] bitcast(%t)\n  ROOT r = f32[4] negate(%t)\n}\n",
    "two-cycle": b"HloModule m\n\nENTRY e {\n  a = f32[4] bitcast(b)\n  b = f32[4] bitcast(a)\n"
                 b"  ROOT r = f32[4] negate(a)\n}\n",
    "self-calling-fusion": b"HloModule m\n\n%f (p: f32[4]) -> f32[4] {\n  p = f32[4] parameter(0)\n"
                           b"  ROOT x = f32[4] fusion(p), kind=kLoop, calls=%f\n}\n\nENTRY e {\n"
                           b"  p = f32[4] parameter(0)\n  ROOT x = f32[4] fusion(p), kind=kLoop, calls=%f\n}\n",
    "mutual-calls": b"HloModule m\n\n%f (p: f32[4]) -> f32[4] {\n  p = f32[4] parameter(0)\n"
                    b"  ROOT x = f32[4] fusion(p), kind=kLoop, calls=%g\n}\n\n%g (p: f32[4]) -> f32[4] {\n"
                    b"  p = f32[4] parameter(0)\n  ROOT x = f32[4] fusion(p), kind=kLoop, calls=%f\n}\n\n"
                    b"ENTRY e {\n  p = f32[4] parameter(0)\n  ROOT x = f32[4] fusion(p), kind=kLoop, calls=%f\n}\n",
    "deep-parens": b"HloModule m\n\nENTRY e {\n  ROOT c = f32[] constant(" + b"(" * 50000 + b"0" + b")" * 50000
    + b")\n}\n",
    "undefined-operand": b"HloModule m\n\nENTRY e {\n  ROOT r = f32[4] negate(nothere)\n}\n",
    "duplicate-names": b"HloModule m\n\nENTRY e {\n  a = f32[4] parameter(0)\n  a = f32[4] negate(a)\n"
                       b"  ROOT r = f32[4] negate(a)\n}\n",
    "two-roots": b"HloModule m\n\nENTRY e {\n  ROOT a = f32[4] parameter(0)\n  ROOT r = f32[4] negate(a)\n}\n",
    "bad-shape": b"HloModule m\n\nENTRY e {\n  ROOT p = f32[-1,q] parameter(0)\n}\n",
    "huge-dims": b"HloModule m\n\nENTRY e {\n  ROOT p = f32[99999999999999999999999999] parameter(0)\n}\n",
    "fifo": None,
}


def scan_cases() -> list[Case]:
    out = []
    for name, content in SCAN_FILES.items():
        setup = _files(**{"m.hlo": content})
        out.append(Case(f"scan-file-{name}", ["scan", "{tmp}/m.hlo"], setup))
        out.append(Case(f"scan-file-json-{name}", ["scan", "--json", "{tmp}/m.hlo"], setup))
        if content is not None:
            out.append(Case(f"scan-dir-{name}", ["scan", "{tmp}/d"],
                            _files(**{"d__module_0001.e.after_optimizations.txt": content})))
    out += [
        Case("scan-missing", ["scan", "{tmp}/nothere.hlo"]),
        Case("scan-nothing", ["scan"]),
        Case("scan-empty-dir", ["scan", "{tmp}/d"], _files(d="/")),
        Case("scan-dir-no-hlo", ["scan", "{tmp}/d"], _files(d__notes__txt=b"not hlo")),
        Case("scan-dir-fifo-only", ["scan", "{tmp}/d"], _files(**{"d__x.after_optimizations.txt": None})),
        Case("scan-dev-null", ["scan", "/dev/null"]),
        Case("scan-model-mode", ["scan", "--model", "tied-embedding", "--mode", "bogus"]),
        Case("scan-model-dtype", ["scan", "--model", "tied-embedding", "--dtype", "f64"]),
        Case("scan-model-unknown", ["scan", "--model", "gpt"]),
        Case("scan-devices-zero", ["scan", "--model", "tied-embedding", "--devices", "0"]),
        Case("scan-devices-word", ["scan", "--model", "tied-embedding", "--devices", "x"]),
        Case("scan-remat-word", ["scan", "--model", "tied-embedding", "--remat", "maybe"]),
        Case("scan-model-heads", ["scan", "--model", "tied-embedding", "--heads", "3"]),
        Case("scan-model-seq", ["scan", "--model", "tied-embedding", "--seq", "1"]),
    ]
    return out


def gradcheck_cases() -> list[Case]:
    flags = {
        "cases-unknown": ["--cases", "no_such_case"], "modes-unknown": ["--modes", "warp"],
        "modes-empty": ["--modes", ""], "modes-dup": ["--modes", "jit,jit"], "cases-dup": ["--cases", "sqrt,sqrt"],
        "modes-commas": ["--modes", ",,"], "framework": ["--framework", "torch"], "unknown-flag": ["--fast"],
        "cases-empty": ["--cases", ","],
    }
    return _bad(flags, "gradcheck", ["gradcheck"])


def compare_cases() -> list[Case]:
    setup = _files(a__stress__jsonl=GOOD, b__stress__jsonl=GOOD)
    flags = {
        "alpha-zero": ["--alpha", "0"], "alpha-one": ["--alpha", "1"], "alpha-nan": ["--alpha", "nan"],
        "alpha-word": ["--alpha", "x"], "alpha-negative": ["--alpha", "-0.5"], "alpha-inf": ["--alpha", "inf"],
    }
    out = _bad(flags, "compare", ["compare", "{tmp}/a", "{tmp}/b"], setup)
    out += [
        Case("compare-one-arg", ["compare", "{tmp}/a"], setup),
        Case("compare-missing-b", ["compare", "{tmp}/a", "{tmp}/nothere"], setup),
        Case("compare-empty-dir", ["compare", "{tmp}/a", "{tmp}/e"], _files(a__stress__jsonl=GOOD, e="/")),
        Case("compare-disjoint", ["compare", "{tmp}/a", "{tmp}/c"],
             _files(a__stress__jsonl=GOOD, c__stress__jsonl=GOOD.replace(b"full/remat=on/f32", b"full/remat=off/f32")
                    .replace(b'"remat": true', b'"remat": false').replace(b'"remats": [true]', b'"remats": [false]'))),
    ]
    return out


def report_cases() -> list[Case]:
    good = _files(a__stress__jsonl=GOOD)
    return [
        Case("report-no-args", ["report"]),
        Case("merge-no-args", ["merge"]),
        Case("report-plot-is-dir", ["report", "{tmp}/a", "--plot", "{tmp}/a"], good),
        Case("report-plot-under-file", ["report", "{tmp}/a", "--plot", "{tmp}/a/stress.jsonl/x.png"], good),
        Case("report-one-good-one-missing", ["report", "{tmp}/a", "{tmp}/nothere"], good),
        Case("merge-one-good-one-bad", ["merge", "{tmp}/a", "{tmp}/b"],
             _files(a__stress__jsonl=GOOD, b__stress__jsonl=CORRUPT_RESULTS["not-json-middle"])),
        Case("report-dev-null", ["report", "/dev/null"]),
        Case("report-unknown-flag", ["report", "--csv", "{tmp}/a"], good),
        Case("merge-mixed-specs", ["merge", "{tmp}/a", "{tmp}/b"],
             _files(a__stress__jsonl=GOOD, b__stress__jsonl=GOOD.replace(b'"learning_rate": 0.001',
                                                                          b'"learning_rate": 0.01'))),
        Case("report-mixed-specs", ["report", "{tmp}/a", "{tmp}/b"],
             _files(a__stress__jsonl=GOOD, b__stress__jsonl=GOOD.replace(b'"inject_rate": 0.0',
                                                                          b'"inject_rate": 0.5'))),
    ]


SERIES_BAD: dict[str, bytes | None] = {
    "empty": b"",
    "non-utf8": b"schema = 1\n# \xff\xfe\n",
    "not-toml": b"this is = = not toml\n",
    "schema-2": b"schema = 2\n",
    "schema-string": b'schema = "1"\n',
    "no-schema": b"[upstream.xla]\nclone_url = 'x'\n",
    "unknown-upstream": b"schema = 1\n[upstream.llvm]\nclone_url = 'x'\nbase = 'b'\nbase_ref = 'r'\n",
    "upstream-not-table": b"schema = 1\nupstream = 3\n",
    "missing-clone-url": b"schema = 1\n[upstream.xla]\nbase = 'b'\nbase_ref = 'r'\n",
    "patches-not-list": b"schema = 1\n[upstream.xla]\nclone_url = 'x'\nbase = 'b'\nbase_ref = 'r'\npatches = 3\n",
    "patch-missing-file": b"schema = 1\n[upstream.xla]\nclone_url = 'x'\nbase = 'b'\nbase_ref = 'r'\n"
                          b"[[upstream.xla.patches]]\npurpose = 'p'\nseries = 'default'\nstatus = 's'\n",
    "patch-bad-series": b"schema = 1\n[upstream.xla]\nclone_url = 'x'\nbase = 'b'\nbase_ref = 'r'\n"
                        b"[[upstream.xla.patches]]\nfile = 'xla/x.patch'\npurpose = 'p'\nseries = 'nightly'\n"
                        b"status = 's'\n",
    "patch-links-string": b"schema = 1\n[upstream.xla]\nclone_url = 'x'\nbase = 'b'\nbase_ref = 'r'\n"
                          b"[[upstream.xla.patches]]\nfile = 'xla/x.patch'\npurpose = 'p'\nseries = 'default'\n"
                          b"status = 's'\nlinks = 'https://x'\n",
    "patch-escapes": b"schema = 1\n[upstream.xla]\nclone_url = 'x'\nbase = 'b'\nbase_ref = 'r'\n"
                     b"[[upstream.xla.patches]]\nfile = '../../etc/passwd'\npurpose = 'p'\nseries = 'default'\n"
                     b"status = 's'\n",
    "deep-arrays": b"schema = 1\nx = " + b"[" * 5000 + b"]" * 5000 + b"\n",
    "fifo": None,
}


def series_cases() -> list[Case]:
    out = []
    for name, content in SERIES_BAD.items():
        setup = _files(**{"series.toml": content})
        out.append(Case(f"patches-check-series-{name}", ["patches-check", "--series-file", "{tmp}/series.toml"],
                        setup))
        out.append(Case(f"pr-series-{name}", ["pr", "--target", "xla", "--out", "{tmp}/pr",
                                              "--series-file", "{tmp}/series.toml"], setup))
    out += [
        Case("patches-check-series-missing", ["patches-check", "--series-file", "{tmp}/nothere.toml"]),
        Case("patches-check-series-is-dir", ["patches-check", "--series-file", "{tmp}"]),
        Case("patches-check-series-kind", ["patches-check", "--series", "nightly"]),
        Case("patches-check-xla-src-missing", ["patches-check", "--xla-src", "{tmp}/nothere"]),
        Case("patches-check-xla-src-file", ["patches-check", "--xla-src", "{tmp}/f"], _files(f=b"x")),
        Case("patches-check-jax-src-fifo", ["patches-check", "--jax-src", "{tmp}/f"], _files(f=None)),
        Case("patches-check-tf-src-empty-dir", ["patches-check", "--tf-src", "{tmp}/d"], _files(d="/")),
        Case("pr-no-target", ["pr", "--out", "{tmp}/pr"]),
        Case("pr-bad-target", ["pr", "--target", "llvm", "--out", "{tmp}/pr"]),
        Case("pr-out-is-file", ["pr", "--target", "xla", "--out", "{tmp}/f"], _files(f=b"keep me")),
        Case("pr-out-under-file", ["pr", "--target", "xla", "--out", "{tmp}/f/pr"], _files(f=b"keep me")),
        Case("pr-results-missing", ["pr", "--target", "jax", "--out", "{tmp}/pr", "--results", "{tmp}/nothere"]),
        Case("pr-results-is-file", ["pr", "--target", "jax", "--out", "{tmp}/pr", "--results", "{tmp}/f"],
             _files(f=b"x")),
        Case("pr-series-missing", ["pr", "--target", "xla", "--out", "{tmp}/pr", "--series-file", "{tmp}/no.toml"]),
    ]
    return out


def bisect_cases() -> list[Case]:
    base = ["bisect-passes", "--quiet", "--out", "{tmp}/b", *TINY_ARGS]
    flags = {
        "oracle-unknown": ["--oracle", "magic"], "program-unknown": ["--program", "gpt"],
        "mode-unknown": ["--mode", "bogus"], "dtype-f64": ["--dtype", "f64"], "remat-word": ["--remat", "x"],
        "seed-negative": ["--seed", "-1"], "seed-word": ["--seed", "one"], "seed-huge": ["--seed", str(2**40)],
        "property-unknown": ["--oracle", "hlo", "--property", "no-such-property"],
        "property-bad-regex": ["--oracle", "hlo", "--property", "regex:(unclosed"],
        "property-empty": ["--oracle", "hlo", "--property", ""],
        "inject-with-hlo": ["--oracle", "hlo", "--inject-pass", "fusion"],
        "inject-rate-two": ["--inject-pass", "fusion", "--inject-rate", "2"],
        "inject-rate-nan": ["--inject-pass", "fusion", "--inject-rate", "nan"],
        "baseline-steps-zero": ["--baseline-steps", "0"],
        "baseline-steps-word": ["--baseline-steps", "x"], "heads-indivisible": ["--heads", "3"],
        "passes-empty": ["--passes", ","],
        "time-limit-zero": ["--time-limit", "0"], "time-limit-word": ["--time-limit", "soon"],
    }
    out = _bad(flags, "bisect", base)
    for name, content in {"not-json": b"{nope\n{nope\n", "non-utf8": b"\xff\xfe\n\xff\n",
                          "array": b"[1]\n[2]\n", "fifo": None}.items():
        out.append(Case(f"bisect-resume-log-{name}", [*base, "--resume"], _files(b__bisect__jsonl=content)))
    out.append(Case("bisect-out-is-file", ["bisect-passes", "--quiet", "--out", "{tmp}/f", *TINY_ARGS],
                    _files(f=b"x")))
    return out


def bundle_cases() -> list[Case]:
    out = [
        Case("bundle-nothing", ["bundle"]),
        Case("bundle-check-missing", ["bundle", "--check", "{tmp}/nothere.tar.gz"]),
        Case("bundle-check-fifo", ["bundle", "--check", "{tmp}/b.tar.gz"], _files(**{"b.tar.gz": None})),
        Case("bundle-check-dir", ["bundle", "--check", "{tmp}/d"], _files(d="/")),
        Case("bundle-check-empty", ["bundle", "--check", "{tmp}/b.tar.gz"], _files(**{"b.tar.gz": b""})),
        Case("bundle-check-text", ["bundle", "--check", "{tmp}/b.tar.gz"], _files(**{"b.tar.gz": b"not a tar"})),
        Case("bundle-check-non-utf8", ["bundle", "--check", "{tmp}/b.tar.gz"],
             _files(**{"b.tar.gz": b"\xff\xfe\x00\x01" * 100})),
        Case("bundle-check-gzip-garbage", ["bundle", "--check", "{tmp}/b.tar.gz"],
             _files(**{"b.tar.gz": b"\x1f\x8b\x08\x00" + b"\x00" * 64})),
        Case("bundle-check-dev-null", ["bundle", "--check", "/dev/null"]),
    ]
    base = ["bundle", "--out", "{tmp}/o.tar.gz", *TINY_ARGS]
    flags = {
        "steps-zero": ["--steps", "0"], "steps-word": ["--steps", "x"], "seeds-empty": ["--seeds", ""],
        "seeds-dup": ["--seeds", "1,1"], "mode-unknown": ["--mode", "bogus"], "dtype-f64": ["--dtype", "f64"],
        "remat-word": ["--remat", "x"], "heads-indivisible": ["--heads", "3"],
        "results-missing": ["--results", "{tmp}/nothere"], "dump-missing": ["--dump", "{tmp}/nothere"],
        "bisect-missing": ["--bisect", "{tmp}/nothere"],
    }
    out += _bad(flags, "bundle", base)
    out.append(Case("bundle-out-is-dir", ["bundle", "--out", "{tmp}/d", *TINY_ARGS], _files(d="/")))
    out.append(Case("bundle-out-exists", ["bundle", "--out", "{tmp}/o.tar.gz", *TINY_ARGS],
                    _files(**{"o.tar.gz": b"keep"})))
    out.append(Case("bundle-results-corrupt", ["bundle", "--out", "{tmp}/o.tar.gz", "--results", "{tmp}/res",
                                               *TINY_ARGS], _files(res__stress__jsonl=CORRUPT_RESULTS["binary"])))
    # a step that raises while it is traced is the program's error, in bundle as in stress
    out.append(Case("bundle-program-step-raises", ["bundle", "--out", "{tmp}/o.tar.gz", "--program", "{tmp}/p.py:make"],
                    _files(**{"p.py": TYPE_ERROR_STEP}), entry="process"))
    # results of the built-in given as a user program's: one program's counts never travel with another's code
    out.append(Case("bundle-results-of-another-program",
                    ["bundle", "--out", "{tmp}/o.tar.gz", "--results", "{tmp}/res", "--program", "{tmp}/mine.py:make"],
                    _files(res__stress__jsonl=GOOD, **{"mine.py": TYPE_ERROR_STEP.replace(
                        b'raise TypeError("the step\'s own bug")', b"return p, o, {'loss': (b['x'] ** 2).mean()}")})))
    return out


TYPE_ERROR_STEP = b"""import jax
import optax
from xla_harness.programs.interface import TrainProgram
opt = optax.sgd(0.01)
def init(key):
    p = {"w": jax.random.normal(key, (4, 3))}
    return p, opt.init(p)
def batch(key, step):
    return {"x": jax.random.normal(key, (8, 4))}
def step(p, o, b):
    raise TypeError("the step's own bug")
def make():
    return TrainProgram(name="raises", init=init, batch=batch, step=step)
"""


def cli_cases() -> list[Case]:
    return [
        Case("cli-no-command", []),
        Case("cli-unknown-command", ["frobnicate"]),
        Case("cli-unknown-global-flag", ["--frobnicate", "report", "x"]),
    ]


def _stamp_setup(content: bytes | None) -> Callable[[Path], None]:
    return _files(**{"w__stamps__resolve.json": content})


BUILD_STAMPS: dict[str, bytes | None] = {
    "non-utf8": b"\xff\xfe{}",
    "not-json": b"{nope",
    "array": b"[1, 2]",
    "no-outputs": b'{"inputs": "x"}',
    "outputs-list": b'{"inputs": "x", "outputs": [1]}',
    "deep": b"[" * 100000 + b"]" * 100000,
    "fifo": None,
}


def build_cases() -> list[Case]:
    base = ["--dry-run", "--work-dir", "{tmp}/w", "--venv", "{tmp}/venv", "--results", "{tmp}/r"]
    flags = {
        "from-after-to": ["--from", "test", "--to", "resolve"], "from-unknown": ["--from", "nowhere"],
        "series-unknown": ["--series", "nightly"], "cuda-major": ["--cuda", "--cuda-major", "11"],
        "jax-version-word": ["--jax-version", "latest"], "jax-version-empty": ["--jax-version", ""],
        "jax-version-injection": ["--jax-version", "0.1; rm -rf /"],
        "min-free-negative": ["--min-free-gb", "-1"], "min-free-nan": ["--min-free-gb", "nan"],
        "min-free-word": ["--min-free-gb", "x"], "stress-steps-zero": ["--stress-steps", "0"],
        "stress-steps-word": ["--stress-steps", "x"], "harness-tests-empty": ["--harness-tests", ","],
        "unknown-flag": ["--fast"], "positional": ["extra"],
    }
    out = [Case(f"build-{k}", [*base, *v], entry="build") for k, v in flags.items()]
    out.append(Case("build-work-dir-is-file", ["--dry-run", "--work-dir", "{tmp}/f"], _files(f=b"x"), entry="build"))
    for name, content in BUILD_STAMPS.items():
        out.append(Case(f"build-stamp-{name}", [*base, "--from", "fetch", "--to", "fetch"], _stamp_setup(content),
                        entry="build"))
    return out


# The classes of the 2026-11 red team (#27), each one a user mistake that must end in one clear
# `error:` line (never `error: internal:`), exit 2 and no file changed.
_PROGRAM_HEAD = """
import jax
import jax.numpy as jnp
import optax
from xla_harness.programs.interface import TrainProgram, step_from_loss

OPT = optax.sgd(0.1)

def _loss(p, b):
    return jnp.mean((b @ p["w"]) ** 2)

def _init(key):
    params = {"w": jnp.ones((4, 4))}
    return params, OPT.init(params)

def _batch(key, step):
    return jnp.ones((8, 4))

def _good_step(p, o, b):
    return step_from_loss(_loss, OPT)(p, o, b)

def program(**overrides):
    fns = {"init": _init, "batch": _batch, "step": _good_step, **overrides}
    return TrainProgram(name="bad", donate_argnums=(0, 1), **fns)
"""

USER_PROGRAMS: dict[str, str] = {
    # BaseExceptions from the user's code, at each stage.
    "systemexit-at-import": "raise SystemExit(0)\n",
    "systemexit-3-at-import": "import sys\nsys.exit(3)\n",
    "baseexception-subclass-at-import": "class Stop(BaseException):\n    pass\nraise Stop('planted')\n",
    "generatorexit-at-import": "raise GeneratorExit\n",
    "syntax-error": "def make(:\n",
    "import-missing-module": "import not_a_module_anywhere_xyz\n",
    "make-raises-systemexit": _PROGRAM_HEAD + "def make():\n    raise SystemExit(0)\n",
    "init-raises-systemexit": _PROGRAM_HEAD + "def make():\n    def init(key):\n        raise SystemExit(0)\n"
                              "    return program(init=init)\n",
    "batch-raises-baseexception": _PROGRAM_HEAD + "class Stop(BaseException):\n    pass\n"
                                  "def make():\n    def batch(key, step):\n        raise Stop()\n"
                                  "    return program(batch=batch)\n",
    "step-raises-systemexit": _PROGRAM_HEAD + "def make():\n    def step(p, o, b):\n        raise SystemExit(0)\n"
                              "    return program(step=step)\n",
    "make-returns-none": _PROGRAM_HEAD + "def make():\n    return None\n",
    "make-not-callable": _PROGRAM_HEAD + "make = 3\n",
    # What init, batch and step return, against the interface.
    "step-returns-two": _PROGRAM_HEAD + "def make():\n    return program(step=lambda p, o, b: (p, o))\n",
    "step-returns-scalar": _PROGRAM_HEAD + "def make():\n    return program(step=lambda p, o, b: 1.0)\n",
    "step-aux-without-loss": _PROGRAM_HEAD + "def make():\n    return program(step=lambda p, o, b: (p, o, {}))\n",
    "step-aux-not-dict": _PROGRAM_HEAD + "def make():\n    return program(step=lambda p, o, b: (p, o, 3))\n",
    "step-loss-not-scalar": _PROGRAM_HEAD + "def make():\n"
                            "    return program(step=lambda p, o, b: (p, o, {'loss': jnp.ones(3)}))\n",
    "step-changes-dtype": _PROGRAM_HEAD + "def make():\n"
                          "    def step(p, o, b):\n        p2, o2, aux = _good_step(p, o, b)\n"
                          "        return {'w': p2['w'].astype(jnp.float16)}, o2, aux\n"
                          "    return program(step=step)\n",
    "step-changes-shape": _PROGRAM_HEAD + "def make():\n"
                          "    def step(p, o, b):\n        p2, o2, aux = _good_step(p, o, b)\n"
                          "        return {'w': p2['w'][:2]}, o2, aux\n"
                          "    return program(step=step)\n",
    "step-drops-a-leaf": _PROGRAM_HEAD + "def make():\n"
                         "    def step(p, o, b):\n        p2, o2, aux = _good_step(p, o, b)\n"
                         "        return {}, o2, aux\n"
                         "    return program(step=step)\n",
    "init-returns-one": _PROGRAM_HEAD + "def make():\n    return program(init=lambda key: {'w': jnp.ones((4, 4))})\n",
    "init-returns-strings": _PROGRAM_HEAD + "def make():\n    return program(init=lambda key: ('a', 'b'))\n",
    "batch-returns-string": _PROGRAM_HEAD + "def make():\n    return program(batch=lambda key, step: 'tokens')\n",
    "batch-returns-object": _PROGRAM_HEAD + "def make():\n    return program(batch=lambda key, step: object())\n",
}


SMALL_HLO = b"HloModule m\n\nENTRY e {\n  p = f32[4] parameter(0)\n  ROOT n = f32[4] negate(p)\n}\n"


def _dump_with_buffers_linked_to(target: str) -> Callable[[Path], None]:
    def setup(tmp: Path) -> None:
        (tmp / "dump").mkdir()
        (tmp / "dump" / "module_0001.jit_step.after_optimizations.txt").write_bytes(SMALL_HLO)
        os.symlink(target, tmp / "dump" / "module_0001.jit_step.after_optimizations-buffer-assignment.txt")
    return setup


def red_team_cases() -> list[Case]:
    out = []
    for name, source in USER_PROGRAMS.items():
        setup = _files(**{"prog.py": source})
        out.append(Case(f"program-{name}-stress", ["stress", "--quiet", "--out", "{tmp}/out", "--program",
                                                   "{tmp}/prog.py:make", "--seeds", "1", "--steps", "2"], setup,
                        tags={"program"}))
        if name.endswith("-at-import") or name.startswith(("make-", "init-", "step-returns-two")):
            out.append(Case(f"program-{name}-scan", ["scan", "--model", "--program", "{tmp}/prog.py:make"], setup,
                            tags={"program"}))
    out += [
        Case("program-builtins-exit-stress", ["stress", "--quiet", "--out", "{tmp}/out", "--program", "builtins:exit",
                                              "--steps", "1"], tags={"program"}),
        Case("program-os-system-stress", ["stress", "--quiet", "--out", "{tmp}/out", "--program", "os:system",
                                          "--steps", "1"], tags={"program"}),
        Case("program-os-system-scan", ["scan", "--model", "--program", "os:system"], tags={"program"}),
        # Outputs that would overwrite an input or a result.
        Case("report-plot-onto-its-input", ["report", "{tmp}/a", "--plot", "{tmp}/a/stress.jsonl"],
             _files(a__stress__jsonl=GOOD)),
        Case("report-plot-onto-its-input-force", ["report", "{tmp}/a", "--plot", "{tmp}/a/stress.jsonl", "--force"],
             _files(a__stress__jsonl=GOOD)),
        Case("report-plot-onto-a-file", ["report", "{tmp}/a", "--plot", "{tmp}/keep.png"],
             _files(a__stress__jsonl=GOOD, **{"keep.png": b"mine"})),
        Case("merge-plot-onto-its-input", ["merge", "{tmp}/a", "{tmp}/b", "--plot", "{tmp}/b/stress.jsonl"],
             _files(a__stress__jsonl=GOOD, b__stress__jsonl=GOOD)),
        Case("scan-save-hlo-onto-results", ["scan", "--model", "--save-hlo", "{tmp}/a/stress.jsonl", *TINY_ARGS],
             _files(a__stress__jsonl=GOOD)),
        Case("scan-save-hlo-onto-a-file", ["scan", "--model", "--save-hlo", "{tmp}/m.hlo", *TINY_ARGS],
             _files(**{"m.hlo": SMALL_HLO})),
        Case("scan-save-hlo-without-model", ["scan", "{tmp}/m.hlo", "--save-hlo", "{tmp}/new.hlo"],
             _files(**{"m.hlo": SMALL_HLO})),
        Case("stress-plot-onto-results", ["stress", "--quiet", "--out", "{tmp}/res", "--resume", *RUN_ARGS,
                                          "--plot", "{tmp}/res/stress.jsonl"], _files(res__stress__jsonl=GOOD)),
        Case("pr-out-is-a-file", ["pr", "--target", "xla", "--out", "{tmp}/notes.txt"],
             _files(**{"notes.txt": b"mine"})),
        # Strict readers.
        Case("results-schema-true-report", ["report", "{tmp}/res"],
             _files(res__stress__jsonl=_mutate_header(lambda h: h.__setitem__("schema", True)))),
        Case("results-block-seed-not-in-spec-report", ["report", "{tmp}/res"],
             _files(res__stress__jsonl=_mutate_block(lambda b: b.__setitem__("seed", 9)))),
        Case("results-block-past-steps-report", ["report", "{tmp}/res"],
             _files(res__stress__jsonl=lines([header(), block(0, 2), block(2, 4), block(4, 6)]))),
        Case("results-block-config-not-in-spec-report", ["report", "{tmp}/res"],
             _files(res__stress__jsonl=_mutate_block(lambda b: b["config"].__setitem__("mode", "sparse_only")))),
        Case("results-step-true-as-int-report", ["report", "{tmp}/res"],
             _files(res__stress__jsonl=_mutate_block(lambda b: b.__setitem__("start", True)))),
        # Reads that never end.
        Case("scan-buffers-link-to-dev-zero", ["scan", "{tmp}/dump"], _dump_with_buffers_linked_to("/dev/zero")),
        Case("scan-buffers-link-to-dev-urandom", ["scan", "{tmp}/dump"],
             _dump_with_buffers_linked_to("/dev/urandom")),
    ]
    return out

def all_cases() -> list[Case]:
    cases = (results_cases() + stress_cases() + scan_cases() + gradcheck_cases() + compare_cases() + report_cases()
             + series_cases() + bisect_cases() + bundle_cases() + cli_cases() + build_cases() + red_team_cases()
             + round4_cases() + round5_cases() + round6_cases())
    ids = [c.id for c in cases]
    assert len(ids) == len(set(ids)), "duplicate case ids"
    return cases


def tree_hashes(root: Path) -> dict[str, str]:
    """sha256 of every regular file under root (FIFOs and folders by kind), keyed by relative path."""
    import hashlib
    import stat

    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            rel = str(p.relative_to(root))
            st = p.lstat()
            if stat.S_ISREG(st.st_mode):
                out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = "dir"
            else:
                out[rel] = f"mode {stat.S_IFMT(st.st_mode):o}"
    return out


# --------------------------------------------------------------------------- round 4 (#34)
# The newest surfaces held to the promises of stress: the #35409 program's options, compile-only
# records and their folder, targets and the flags that go with them, start-up signals, the
# compiler's environment, bisect-passes' children, scan's reader, tools/publish_hlo.py,
# make tpu-sweep, bundle. Tagged "round4" and by class ("r4-options", ...): the census counts them
# per class (``--tag``).

TINY_35409 = ["--program-option", "scale=0.015625", "--program-option", "seq_scale=0.125",
              "--program-option", "layers=(1,2)"]
ONE_CONFIG = ["--modes", "full", "--remat", "on"]
# The environment a compile-only case runs in, so a synthetic record can say it was compiled in it
# (XLA_FLAGS as this process has it: the case's own process inherits it; a test suite's CPU split
# must stay, or a jax started by the case would have one device for the rest of the session).
COMPILE_ENV = {"LIBTPU_INIT_ARGS": "", "JAX_PLATFORMS": "cpu", "TPU_NAME": ""}


def compile_env() -> dict[str, str]:
    return {**COMPILE_ENV, "XLA_FLAGS": os.environ.get("XLA_FLAGS", "")}
TINY_CONFIG = {"mode": "full", "remat": True, "dtype": "f32", "vocab": 64, "d_model": 32, "layers": 1, "heads": 2,
               "seq": 8, "batch": 8, "devices": 1, "learning_rate": 0.001}


def _versions() -> dict[str, str]:
    from importlib import metadata

    return {d: metadata.version(d) for d in ("jax", "jaxlib")}


def compile_record(label: str = "full/remat=on/f32", **changes) -> dict:
    """A compile record of the tiny built-in as stress --compile-only --target host writes it (in
    COMPILE_ENV, with this environment's jax); ``changes`` replace top-level fields."""
    options = dict(TINY_CONFIG)
    mode, remat, _ = label.split("/")
    options.update(mode=mode, remat=remat == "remat=on")
    rec = {"kind": "compile", "schema": 1, "label": label, "program": "tied-embedding", "options": options,
           "target": "host", "device_kind": "cpu", "target_devices": 1, "versions": _versions(),
           "XLA_FLAGS": os.environ.get("XLA_FLAGS", ""), "env": compile_env(),
           "devices": 1, "protocol": "train", "compile_cpu_s": 2.5,
           "fingerprint": {"id": "0123456789abcdef", "instructions": 2498, "temp_size_in_bytes": 1,
                           "alias_size_in_bytes": 1, "donate_argnums": [0, 1]},
           "scan": {"backend": "cpu", "hazard": 0, "decisions": 0, "aliased": 4, "layout-preserving-miss": 0,
                    "compiler_alias": {}, "decision_fusions": [], "hazard_fusions": []}}
    rec.update(changes)
    return rec


def stem(label: str, target: str = "host") -> str:
    """The hlo/ name of a configuration's files (xla_harness.stress.compile_only.resume._slug)."""
    import hashlib
    import re

    text = f"{target}-{label}"
    return re.sub(r"[^A-Za-z0-9_.=-]+", "_", text)[:80] + "-" + hashlib.sha256(text.encode()).hexdigest()[:8]


def _json_check(fn) -> Callable[[Path, str], str | None]:
    """A check over the JSON document a command printed on stdout."""
    def check(tmp: Path, out: str) -> str | None:
        try:
            doc = json.loads(out)
        except ValueError:
            return f"stdout is not one JSON document: {out[:120]!r}"
        return fn(doc)
    return check


def _records_check(folder: str, labels: set[str]) -> Callable[[Path, str], str | None]:
    """compile.jsonl in ``folder`` holds whole lines only, one record per label in ``labels``."""
    def check(tmp: Path, out: str) -> str | None:
        data = (tmp / folder / "compile.jsonl").read_bytes()
        if not data.endswith(b"\n"):
            return "compile.jsonl does not end with a whole line"
        try:
            got = [json.loads(ln)["label"] for ln in data.splitlines() if ln.strip()]
        except (ValueError, KeyError, TypeError):
            return "compile.jsonl holds a line that is not a record"
        return None if sorted(got) == sorted(labels) else f"records {got}, expected one each of {sorted(labels)}"
    return check


def _options_cases() -> list[Case]:
    """Item 1: every option of the #35409 program checked by type and value (refused, never read as
    something else): through scan --model, stress, stress --compile-only and bundle."""
    bad = {
        "remat-off": "remat=off", "remat-maybe": "remat=maybe", "remat-zero": "remat=0",
        "remat-text-true": "remat='True'",
        "layers-float": "layers=(1.5,2)", "layers-reversed": "layers=(3,2)", "layers-zero": "layers=(0,2)",
        "layers-one": "layers=[1]", "layers-word": "layers=two",
        "mesh-negative": "mesh_shape=(-1,-1)", "mesh-one-axis": "mesh_shape=(2,)", "mesh-float": "mesh_shape=(1.0,1)",
        "embed-trailing-comma": "embed_spec=model,", "embed-one-axis": "embed_spec=model",
        "embed-twice": "embed_spec=model,model", "embed-unknown-axis": "embed_spec=x,y", "embed-number": "embed_spec=3",
        "scale-zero": "scale=0", "scale-two": "scale=2", "scale-nan": "scale=float('nan')", "scale-bool": "scale=True",
        "scale-word": "scale=small", "seq-scale-zero": "seq_scale=0", "seq-scale-big": "seq_scale=1.5",
        "lr-negative": "lr=-1", "lr-inf": "lr=1e999", "lr-word": "lr=fast",
        "donate-word": "donate=maybe", "donate-zero": "donate=0", "donate-text": "donate='False'",
        "jit-unknown": "jit=bogus", "jit-number": "jit=1", "specs-unknown": "specs=mine",
        "axis-types-unknown": "axis_types=manual", "dtype-f64": "dtype=f64", "mode-unknown": "mode=tied",
        "variant-unknown": "variant=bogus", "devices-zero": "devices=0", "devices-negative": "devices=-1",
        "devices-list-of-ints": "devices=[1,2]", "devices-float": "devices=1.5", "devices-bool": "devices=True",
        "unknown-key": "frobnicate=1",
    }
    out = []
    for name, option in bad.items():
        key = option.split("=", 1)[0]
        out.append(Case(f"r4-option-{name}-scan", ["scan", "--model", "issue-35409", *TINY_35409, "--program-option",
                                                   option], needle=key, tags={"round4", "r4-options"}, timeout=300))
    for name in ("remat-off", "layers-float", "mesh-negative", "embed-trailing-comma", "unknown-key"):
        option = bad[name]
        key = option.split("=", 1)[0]
        out.append(Case(f"r4-option-{name}-stress", ["stress", "--quiet", "--out", "{tmp}/o", "--program",
                                                     "issue-35409", *TINY_35409, "--program-option", option,
                                                     "--seeds", "1", "--steps", "1"], needle=key,
                        tags={"round4", "r4-options"}, timeout=300))
        out.append(Case(f"r4-option-{name}-compile-only", ["stress", "--compile-only", "--quiet", "--out", "{tmp}/o",
                                                           "--program", "issue-35409", *TINY_35409,
                                                           "--program-option", option], needle=key,
                        tags={"round4", "r4-options"}, timeout=300))
    out.append(Case("r4-option-twice-differing-scan", ["scan", "--model", "issue-35409", *TINY_35409,
                                                       "--program-option", "remat=True", "--program-option",
                                                       "remat=False"], needle="remat", tags={"round4", "r4-options"},
                    timeout=300))
    out.append(Case("r4-option-remat-off-bundle", ["bundle", "--out", "{tmp}/b.tar.gz", "--program", "issue-35409",
                                                   *TINY_35409, "--program-option", "remat=off", "--steps", "1"],
                    needle="remat", tags={"round4", "r4-options"}, timeout=300))
    return out


def _resume_cases() -> list[Case]:
    """Item 2: compile-only --resume continues only what was compiled from the same inputs, and never a
    folder of the other kind."""
    tags = {"round4", "r4-resume"}
    base = ["stress", "--compile-only", "--quiet", "--resume", "--out", "{tmp}/co", *ONE_CONFIG, *TINY_ARGS]
    rec = lines([compile_record()])
    differ = {
        "vocab": (["--vocab", "128"], COMPILE_ENV, rec, "vocab"),
        "d-model": (["--d-model", "64"], COMPILE_ENV, rec, "d_model"),
        "devices": (["--devices", "2"], COMPILE_ENV, rec, "devices"),
        "xla-flags": ([], {**COMPILE_ENV, "XLA_FLAGS": (os.environ.get("XLA_FLAGS", "")
                                                         + " --xla_cpu_enable_fast_math=false").strip()},
                      rec, "XLA_FLAGS"),
        "versions": ([], COMPILE_ENV, lines([compile_record(versions={"jax": "0.0.1", "jaxlib": "0.0.1"})]),
                     "versions.jax"),
        "protocol": (["--protocol", "frozen"], COMPILE_ENV, rec, "protocol"),
    }
    # the XLA_FLAGS case is tried in a child first (a flag the compiler might refuse): it spawns
    out = [Case(f"r4-resume-other-{name}", [*base, *extra], _files(co__compile__jsonl=data), env=env, needle=needle,
                tags=tags | ({"spawns"} if name == "xla-flags" else set()), timeout=300)
           for name, (extra, env, data, needle) in differ.items()]
    out += [
        Case("r4-resume-stress-on-compile-folder", ["stress", "--quiet", "--resume", "--out", "{tmp}/co", *RUN_ARGS],
             _files(co__compile__jsonl=rec), needle="compile-only records", tags=tags, timeout=300),
        Case("r4-new-stress-on-compile-folder", ["stress", "--quiet", "--out", "{tmp}/co", *RUN_ARGS],
             _files(co__compile__jsonl=rec), needle="compile-only records", tags=tags, timeout=300),
        Case("r4-resume-compile-only-on-stress-folder", [*base[:5], "{tmp}/res", *ONE_CONFIG, *TINY_ARGS],
             _files(res__stress__jsonl=GOOD), needle="stress results", tags=tags, timeout=300),
        Case("r4-resume-compile-only-without-out", ["stress", "--compile-only", "--quiet", "--resume", *ONE_CONFIG,
                                                    *TINY_ARGS], needle="--resume", tags=tags, timeout=300),
    ]
    return out


def _protect_cases() -> list[Case]:
    """Item 3: compile.jsonl, hlo/ and lock files are protected like stress results: one writer, every
    line validated, a torn tail repaired, never overwritten."""
    tags = {"round4", "r4-protect"}
    rec = lines([compile_record()])
    hlo = f"co__hlo__{stem('full/remat=on/f32')}.after_optimizations.txt"
    folder = {"a__stress__jsonl": GOOD, "co__compile__jsonl": rec, hlo: SMALL_HLO}
    out = [
        Case("r4-report-plot-onto-compile-jsonl", ["report", "{tmp}/a", "--plot", "{tmp}/co/compile.jsonl", "--force"],
             _files(**folder), needle="results file", tags=tags),
        Case("r4-report-plot-onto-compiled-hlo", ["report", "{tmp}/a", "--plot",
                                                  "{tmp}/co/hlo/" + hlo.split("__")[-1], "--force"],
             _files(**folder), needle="compiled module", tags=tags),
        Case("r4-report-plot-onto-stress-lock", ["report", "{tmp}/a", "--plot", "{tmp}/a/stress.jsonl.lock", "--force"],
             _files(a__stress__jsonl=GOOD, **{"a/stress.jsonl.lock": b""}), needle="lock", tags=tags),
        Case("r4-report-plot-onto-compile-lock", ["report", "{tmp}/a", "--plot", "{tmp}/co/compile.jsonl.lock",
                                                  "--force"], _files(**folder, **{"co/compile.jsonl.lock": b""}),
             needle="lock", tags=tags),
        Case("r4-report-plot-onto-checkpoint", ["report", "{tmp}/a", "--plot", "{tmp}/a/ckpt/x_seed1.npz", "--force"],
             _files(a__stress__jsonl=GOOD, **{"a/ckpt/x_seed1.npz": b"state"}), needle="checkpoint", tags=tags),
        Case("r4-scan-save-hlo-onto-compiled-hlo", ["scan", "--model", "--save-hlo",
                                                    "{tmp}/co/hlo/" + hlo.split("__")[-1], "--force", *TINY_ARGS],
             _files(**folder), needle="compiled module", tags=tags),
        Case("r4-scan-save-hlo-onto-compile-jsonl", ["scan", "--model", "--save-hlo", "{tmp}/co/compile.jsonl",
                                                     "--force", *TINY_ARGS], _files(**folder), needle="results file",
             tags=tags),
        Case("r4-compile-only-out-holds-its-hlo", ["stress", "--compile-only", "--quiet", "--out", "{tmp}/co",
                                                   *ONE_CONFIG, *TINY_ARGS], _files(**{hlo: SMALL_HLO}),
             env=COMPILE_ENV, needle="already exists", tags=tags, timeout=300),
        Case("r4-compile-only-resume-hlo-without-record", ["stress", "--compile-only", "--quiet", "--resume", "--out",
                                                           "{tmp}/co", *ONE_CONFIG, *TINY_ARGS],
             _files(co__compile__jsonl=lines([compile_record("sparse_only/remat=on/f32")]), **{hlo: SMALL_HLO}),
             env=COMPILE_ENV, needle="already exists", tags=tags, timeout=300),
        Case("r4-compile-only-second-writer", ["stress", "--compile-only", "--quiet", "--resume", "--out", "{tmp}/co",
                                               "--modes", "sparse_only", "--remat", "on", *TINY_ARGS],
             _files(co__compile__jsonl=rec, **{"co/compile.jsonl.lock": b""}), env=COMPILE_ENV,
             lock="{tmp}/co/compile.jsonl.lock", needle="another", tags=tags, timeout=300),
        Case("r4-compile-only-resume-repairs-torn-tail", ["stress", "--compile-only", "--quiet", "--resume", "--out",
                                                          "{tmp}/co", *ONE_CONFIG, *TINY_ARGS],
             _files(co__compile__jsonl=lines([compile_record("sparse_only/remat=on/f32")])
                    + b'{"kind": "compile", "la'),
             env=COMPILE_ENV, expect=0, tags=tags | {"compiles"}, timeout=300,
             check=_records_check("co", {"sparse_only/remat=on/f32", "full/remat=on/f32"})),
    ]
    bad_records = {
        "cpu-seconds-word": compile_record(compile_cpu_s="slow"),
        "label-number": {**compile_record(), "label": 3},
        "versions-list": compile_record(versions=["0.12"]),
        "hazard-word": {**compile_record(), "scan": {**compile_record()["scan"], "hazard": "many"}},
        "instructions-null": {**compile_record(), "fingerprint": {"id": "x", "instructions": None}},
        "compiler-alias-list": {**compile_record(), "scan": {**compile_record()["scan"], "compiler_alias": [1]}},
        "hlo-escapes": compile_record(hlo="../../etc/passwd"),
    }
    for name, bad in bad_records.items():
        data = lines([compile_record("sparse_only/remat=on/f32"), bad, compile_record("full/remat=off/f32")])
        out.append(Case(f"r4-compile-record-{name}-report", ["report", "{tmp}/co"], _files(co__compile__jsonl=data),
                        needle="compile.jsonl:2", tags=tags))
        out.append(Case(f"r4-compile-record-{name}-resume", ["stress", "--compile-only", "--quiet", "--resume", "--out",
                                                             "{tmp}/co", *ONE_CONFIG, *TINY_ARGS],
                        _files(co__compile__jsonl=data), env=COMPILE_ENV, needle="compile.jsonl:2", tags=tags,
                        timeout=300))
    return out


def _flag_cases() -> list[Case]:
    """Item 4: flags honoured or refused, never ignored: --devices with a program and a target,
    --program-option devices= against --devices, --protocol frozen with --compile-only, scan's model
    flags without --model."""
    tags = {"round4", "r4-flags"}
    co = ["stress", "--compile-only", "--quiet", "--json", "--program", "issue-35409", *TINY_35409]

    def devices_are(n):
        return _json_check(lambda doc: None if [c["devices"] for c in doc["configurations"]] == [n]
                           else f"compiled on {[c['devices'] for c in doc['configurations']]} device(s), asked for {n}")

    return [
        Case("r4-compile-only-devices-honoured", [*co, "--devices", "2"], expect=0, check=devices_are(2),
             tags=tags | {"compiles"}, timeout=300),
        Case("r4-compile-only-tpu-devices-honoured", [*co, "--target", "tpu:v6e:2x4", "--devices", "2"], expect=0,
             check=devices_are(2), tags=tags | {"compiles", "tpu"}, timeout=600),
        Case("r4-compile-only-devices-disagree", [*co, "--devices", "2", "--program-option", "devices=4"],
             needle="disagree", tags=tags),
        Case("r4-stress-devices-disagree", ["stress", "--quiet", "--out", "{tmp}/o", "--program", "issue-35409",
                                            *TINY_35409, "--devices", "2", "--program-option", "devices=1"],
             needle="disagree", tags=tags),
        Case("r4-scan-devices-disagree", ["scan", "--model", "issue-35409", *TINY_35409, "--devices", "2",
                                          "--program-option", "devices=4"], needle="disagree", tags=tags),
        Case("r4-compile-only-frozen-donates-nothing", ["stress", "--compile-only", "--quiet", "--json", "--protocol",
                                                        "frozen", *ONE_CONFIG, *TINY_ARGS], expect=0,
             check=_json_check(lambda doc: None if doc["configurations"][0]["fingerprint"]["donate_argnums"] == []
                               else "the frozen protocol's step was compiled with donation "
                                    f"{doc['configurations'][0]['fingerprint']['donate_argnums']}"),
             tags=tags | {"compiles"}, timeout=300),
        Case("r4-scan-file-with-devices", ["scan", "{tmp}/m.hlo", "--devices", "2"], _files(**{"m.hlo": SMALL_HLO}),
             needle="--devices", tags=tags),
        Case("r4-scan-file-with-program-option", ["scan", "{tmp}/m.hlo", "--program-option", "remat=False"],
             _files(**{"m.hlo": SMALL_HLO}), needle="--program-option", tags=tags),
        Case("r4-compile-only-resume-without-out", ["stress", "--compile-only", "--quiet", "--resume", *ONE_CONFIG,
                                                    *TINY_ARGS], needle="--out", tags=tags),
    ]


def _plot_cases() -> list[Case]:
    """Item 5: stress --plot checked before anything runs, never over a file without --force."""
    tags = {"round4", "r4-plot"}
    run = ["stress", "--quiet", "--out", "{tmp}/o", *RUN_ARGS]
    return [
        Case("r4-stress-plot-existing", [*run, "--plot", "{tmp}/keep.png"], _files(**{"keep.png": b"mine"}),
             needle="already exists", tags=tags, late=30),
        Case("r4-stress-plot-is-dir", [*run, "--plot", "{tmp}/d"], _files(d="/"), needle="folder", tags=tags, late=30),
        Case("r4-stress-plot-under-file", [*run, "--plot", "{tmp}/f/x.png"], _files(f=b"x"), needle="not a folder",
             tags=tags, late=30),
        Case("r4-stress-resume-plot-existing", ["stress", "--quiet", "--resume", "--out", "{tmp}/res", *RUN_ARGS,
                                                "--plot", "{tmp}/res/rates.png"],
             _files(res__stress__jsonl=GOOD, res__rates__png=b"earlier plot"), needle="already exists", tags=tags,
             late=30),
        Case("r4-stress-plot-onto-lock-force", [*run, "--plot", "{tmp}/res/stress.jsonl.lock", "--force"],
             _files(res__stress__jsonl=GOOD, **{"res/stress.jsonl.lock": b""}), needle="lock", tags=tags, late=30),
    ]


STRESS_TINY = ["stress", "--quiet", "--out", "{tmp}/o", "--modes", "full", "--remat", "on", "--seeds", "1", "--steps",
               "2", *TINY_ARGS]


def _signal_cases() -> list[Case]:
    """Item 6: SIGINT/SIGTERM from the first instruction on end the command with 130/143, no traceback,
    no ``error: internal:``, never swallowed. The delay counts from the harness's first instruction
    (its handlers installed: :func:`harness_started`), so a loaded machine's slow interpreter start
    does not move the signal into CPython's start-up; -1: pending from before the interpreter starts."""
    import signal as _signal

    tags = {"round4", "r4-signals"}
    out = []
    for sig, name in ((_signal.SIGINT, "sigint"), (_signal.SIGTERM, "sigterm")):
        for at in (-1, 0.05, 0.1, 0.15, 0.2, 0.3, 0.45, 0.7, 1.0):
            when = "pending" if at < 0 else f"{int(at * 1000)}ms"
            out.append(Case(f"r4-{name}-{when}-stress", STRESS_TINY, entry="process", expect=128 + sig,
                            signal=(sig, at), tags=tags, timeout=300))
        for cmd, argv in (("scan-model", ["scan", "--model", *TINY_ARGS]),
                          ("compile-only", ["stress", "--compile-only", "--quiet", *ONE_CONFIG, *TINY_ARGS]),
                          ("report", ["report", "{tmp}/a"]), ("version", ["--version"])):
            out.append(Case(f"r4-{name}-pending-{cmd}", argv, _files(a__stress__jsonl=GOOD), entry="process",
                            expect=128 + sig, signal=(sig, -1), tags=tags, timeout=300))
        for at in (0.2, 0.4):
            out.append(Case(f"r4-{name}-{int(at * 1000)}ms-scan-model", ["scan", "--model", *TINY_ARGS],
                            entry="process", expect=128 + sig, signal=(sig, at), tags=tags, timeout=300))
    return out


def _compiler_env_cases() -> list[Case]:
    """Item 7: a flag the compiler does not know, or a platform jax does not have, is one error line
    naming it (exit 2), never the compiler's exit 1 or an internal error."""
    tags = {"round4", "r4-compiler-env"}
    commands = {"stress": STRESS_TINY, "scan": ["scan", "--model", *TINY_ARGS],
                "compile-only": ["stress", "--compile-only", "--quiet", *ONE_CONFIG, *TINY_ARGS],
                "gradcheck": ["gradcheck", "--cases", "sqrt"],
                "bisect": ["bisect-passes", "--quiet", "--oracle", "hlo", "--out", "{tmp}/b", *TINY_ARGS]}
    out = []
    for cmd, argv in commands.items():
        out.append(Case(f"r4-xla-flags-unknown-{cmd}", argv, entry="process", env={"XLA_FLAGS": "--xla_bogus_flag=1"},
                        needle="--xla_bogus_flag", tags=tags, timeout=300))
        out.append(Case(f"r4-jax-platforms-bogus-{cmd}", argv, entry="process", env={"JAX_PLATFORMS": "bogus"},
                        needle="JAX_PLATFORMS", tags=tags, timeout=300))
    for name, value in (("JAX_DEFAULT_MATMUL_PRECISION", "bogus"), ("JAX_ENABLE_X64", "maybe")):  # round 5, item 14
        out.append(Case(f"r5-jax-env-{name.lower()}-stress", STRESS_TINY, entry="process", env={name: value},
                        needle=name, tags=tags | {"round5"}, timeout=300))
    out.append(Case("r4-xla-flags-unknown-among-good-scan", ["scan", "--model", *TINY_ARGS], entry="process",
                    env={"XLA_FLAGS": "--xla_cpu_enable_fast_math=false --xla_typo_flag=3"},
                    needle="--xla_typo_flag", tags=tags, timeout=300))
    for cmd, argv in (("scan", ["scan", "--model", "--target", "tpu:v6e:2x4", *TINY_ARGS]),
                      ("compile-only", ["stress", "--compile-only", "--quiet", "--target", "tpu:v6e:2x4", *ONE_CONFIG,
                                        *TINY_ARGS])):
        out.append(Case(f"r4-libtpu-args-unknown-{cmd}", argv, entry="process",
                        env={"LIBTPU_INIT_ARGS": "--xla_tpu_bogus_flag=1"}, needle="--xla_tpu_bogus_flag",
                        tags=tags | {"tpu"}, timeout=300))
    return out


def _number_cases() -> list[Case]:
    """Item 8: every numeric flag is a finite number in range, checked as the command line is read."""
    tags = {"round4", "r4-numbers"}
    run = ["stress", "--quiet", "--out", "{tmp}/o", *RUN_ARGS]
    flags = {
        "checkpoint-seconds-nan": ["--checkpoint-seconds", "nan"],
        "checkpoint-seconds-inf": ["--checkpoint-seconds", "inf"],
        "checkpoint-seconds-minus-inf": ["--checkpoint-seconds", "-inf"],
        "checkpoint-seconds-negative": ["--checkpoint-seconds", "-1"],
        "checkpoint-seconds-overflow": ["--checkpoint-seconds", "1e400"],
        "stop-grace-nan": ["--stop-grace", "nan"], "stop-grace-inf": ["--stop-grace", "inf"],
        "stop-grace-negative": ["--stop-grace", "-1"], "lr-overflow": ["--lr", "1e400"],
        "seeds-negative-in-list": ["--seeds", "1,-2"], "steps-huge-float": ["--steps", "1e3"],
    }
    out = [Case(f"r4-stress-{k}", [*run, *v], needle=v[0], tags=tags) for k, v in flags.items()]
    check = ["bundle", "--check", "{tmp}/b.tar.gz"]
    for k, v in {"timeout-nan": ["--timeout", "nan"], "timeout-inf": ["--timeout", "inf"],
                 "timeout-zero": ["--timeout", "0"], "timeout-negative": ["--timeout", "-5"],
                 "max-steps-negative": ["--max-steps", "-1"], "max-steps-word": ["--max-steps", "many"]}.items():
        out.append(Case(f"r4-bundle-check-{k}", [*check, *v], _files(**{"b.tar.gz": b"not checked"}), needle=v[0],
                        tags=tags))
    out += [
        Case("r4-bundle-seeds-negative", ["bundle", "--out", "{tmp}/o.tar.gz", *TINY_ARGS, "--seeds", "-1"],
             needle="--seeds", tags=tags),
        Case("r4-bundle-seeds-huge", ["bundle", "--out", "{tmp}/o.tar.gz", *TINY_ARGS, "--seeds", str(2**40)],
             needle="--seeds", tags=tags),
        Case("r4-compare-alpha-overflow", ["compare", "{tmp}/a", "{tmp}/b", "--alpha", "1e400"],
             _files(a__stress__jsonl=GOOD, b__stress__jsonl=GOOD), needle="--alpha", tags=tags),
        Case("r4-bisect-inject-rate-inf", ["bisect-passes", "--quiet", "--out", "{tmp}/b", *TINY_ARGS,
                                           "--inject-pass", "fusion", "--inject-rate", "inf"], needle="--inject-rate",
             tags=tags),
        Case("r4-bisect-baseline-steps-negative", ["bisect-passes", "--quiet", "--out", "{tmp}/b", *TINY_ARGS,
                                                   "--baseline-steps", "-1"], needle="--baseline-steps", tags=tags),
    ]
    return out


FAILING_FACTORY = "def make(**options):\n    raise ValueError('planted: this program cannot be built')\n"


def _bisect_cases() -> list[Case]:
    """Item 9: bisect-passes --target passes on why the program could not be listed (the probe's own
    error line), and starts nothing for input it can check itself."""
    tags = {"round4", "r4-bisect"}
    base = ["bisect-passes", "--quiet", "--oracle", "hlo", "--target", "tpu:v6e:2x4", "--out", "{tmp}/b"]
    return [
        Case("r4-bisect-target-missing-program", [*base, "--program", "{tmp}/nothere.py:make"], needle="no such file",
             tags=tags, timeout=300),
        Case("r4-bisect-target-bad-option", [*base, "--program", "issue-35409", *TINY_35409, "--program-option",
                                             "jit=bogus"], needle="jit", tags=tags, timeout=300),
        Case("r4-bisect-target-no-libtpu", [*base, *TINY_ARGS], env={"XLA_HARNESS_TARGET_COMPILERS": "{tmp}/none"},
             needle="libtpu", tags=tags | {"spawns"}, timeout=300),
        Case("r4-bisect-target-program-raises", [*base, "--program", "{tmp}/prog.py:make"],
             _files(**{"prog.py": FAILING_FACTORY}), needle="planted", tags=tags | {"spawns", "tpu"},
             timeout=300),  # the program is built in the probe, for the TPU's devices: libtpu is needed
    ]


BAD_HLO: dict[str, bytes] = {
    "layout-out-of-range": b"HloModule m\n\nENTRY e {\n  p = f32[2,3]{7,9} parameter(0)\n"
                           b"  ROOT n = f32[2,3]{1,0} negate(p)\n}\n",
    "layout-repeated": b"HloModule m\n\nENTRY e {\n  p = f32[2,3]{0,0} parameter(0)\n"
                       b"  ROOT n = f32[2,3]{1,0} negate(p)\n}\n",
    "layout-short": b"HloModule m\n\nENTRY e {\n  p = f32[2,3]{0} parameter(0)\n"
                    b"  ROOT n = f32[2,3]{1,0} negate(p)\n}\n",
    "transpose-out-of-range": b"HloModule m\n\nENTRY e {\n  p = f32[2,3]{1,0} parameter(0)\n"
                              b"  ROOT t = f32[3,2]{1,0} transpose(p), dimensions={5,9}\n}\n",
    "transpose-repeated": b"HloModule m\n\nENTRY e {\n  p = f32[2,3]{1,0} parameter(0)\n"
                          b"  ROOT t = f32[3,2]{1,0} transpose(p), dimensions={0,0}\n}\n",
    "transpose-wrong-result": b"HloModule m\n\nENTRY e {\n  p = f32[2,3]{1,0} parameter(0)\n"
                              b"  ROOT t = f32[2,3]{1,0} transpose(p), dimensions={1,0}\n}\n",
    "transpose-no-dimensions": b"HloModule m\n\nENTRY e {\n  p = f32[2,3]{1,0} parameter(0)\n"
                               b"  ROOT t = f32[3,2]{1,0} transpose(p)\n}\n",
    "fusion-without-calls": b"HloModule m\n\nENTRY e {\n  p = f32[4]{0} parameter(0)\n"
                            b"  ROOT f = f32[4]{0} fusion(p), kind=kLoop\n}\n",
    "constant-nesting": b"HloModule m\n\nENTRY e {\n  ROOT c = f32[2,2]{1,0} constant({1, 2, 3, 4})\n}\n",
    "constant-too-many": b"HloModule m\n\nENTRY e {\n  ROOT c = f32[2]{0} constant({1, 2, 3})\n}\n",
    "constant-too-few": b"HloModule m\n\nENTRY e {\n  ROOT c = f32[3]{0} constant({1, 2})\n}\n",
    "constant-scalar-as-list": b"HloModule m\n\nENTRY e {\n  ROOT c = f32[] constant({1})\n}\n",
    "constant-f16-range": b"HloModule m\n\nENTRY e {\n  ROOT c = f16[] constant(70000)\n}\n",
    "constant-bf16-nan-payload": b"HloModule m\n\nENTRY e {\n  ROOT c = bf16[] constant(nan(0x7fffff))\n}\n",
    "constant-f32-range": b"HloModule m\n\nENTRY e {\n  ROOT c = f32[] constant(1e39)\n}\n",
    "constant-s8-range": b"HloModule m\n\nENTRY e {\n  ROOT c = s8[] constant(300)\n}\n",
    "constant-u8-negative": b"HloModule m\n\nENTRY e {\n  ROOT c = u8[] constant(-1)\n}\n",
    "constant-int-as-float": b"HloModule m\n\nENTRY e {\n  ROOT c = s32[] constant(2.5)\n}\n",
    "constant-word": b"HloModule m\n\nENTRY e {\n  ROOT c = f32[] constant(hello)\n}\n",
    "opcode-unknown": b"HloModule m\n\nENTRY e {\n  p = f32[4]{0} parameter(0)\n"
                      b"  ROOT n = f32[4]{0} frobnicate(p)\n}\n",
    "async-done-no-operand": b"HloModule m\n\n%w (p: f32[4]) -> f32[4] {\n  p = f32[4]{0} parameter(0)\n"
                             b"  ROOT n = f32[4]{0} negate(p)\n}\n\nENTRY e {\n  p = f32[4]{0} parameter(0)\n"
                             b"  s = ((f32[4]{0}), f32[4]{0}, s32[]) call-start(p), to_apply=%w\n"
                             b"  ROOT d = f32[4]{0} call-done()\n}\n",
    "async-update-no-operand": b"HloModule m\n\n%w (p: f32[4]) -> f32[4] {\n  p = f32[4]{0} parameter(0)\n"
                               b"  ROOT n = f32[4]{0} negate(p)\n}\n\nENTRY e {\n  p = f32[4]{0} parameter(0)\n"
                               b"  s = ((f32[4]{0}), f32[4]{0}, s32[]) call-start(p), to_apply=%w\n"
                               b"  u = ((f32[4]{0}), f32[4]{0}, s32[]) call-update()\n"
                               b"  ROOT d = f32[4]{0} call-done(u)\n}\n",
}


# The committed hazard fixture with one thing XLA refuses planted where the scan reads it (as the
# issue found them: a layout the scanner indexed by, "could not be scanned (IndexError ...)"; a
# transpose that is no permutation, read and reported as a hazard, exit 1).
_FIXTURE = (Path(__file__).parent / "hlo" / "transpose_moves_data.hlo").read_bytes()
BAD_HLO["fixture-transpose-out-of-range"] = _FIXTURE.replace(b"%p0), dimensions={1,0}", b"%p0), dimensions={5,9}")
BAD_HLO["fixture-transpose-repeated"] = _FIXTURE.replace(b"%p0), dimensions={1,0}", b"%p0), dimensions={0,0}")
BAD_HLO["fixture-layout-out-of-range"] = _FIXTURE.replace(b"%t = f32[64,32]{1,0} transpose",
                                                          b"%t = f32[64,32]{7,9} transpose")
BAD_HLO["fixture-layout-of-parameter"] = _FIXTURE.replace(b"%p0 = f32[32,64]{1,0} parameter(0)",
                                                          b"%p0 = f32[32,64]{9,7} parameter(0)")


def _scan_cases() -> list[Case]:
    """Items 10 and 14: scan refuses what XLA refuses (one line naming FILE:LINE), and a folder's
    FIFOs and other files that are no regular file are refused one by one, never opened."""
    tags = {"round4", "r4-scan"}
    out = [Case(f"r4-scan-hlo-{name}", ["scan", "{tmp}/m.hlo"], _files(**{"m.hlo": text}), needle="m.hlo:",
                tags=tags) for name, text in BAD_HLO.items()]
    out.append(Case("r4-scan-stdin-is-a-folder", ["scan", "-"], _files(d="/"), entry="process", stdin="{tmp}/d",
                    tags=tags | {"python-refuses"}, timeout=300))
    dump = "d__module_0001.jit_step.after_optimizations.txt"
    ba = "d__module_0001.jit_step.after_optimizations-buffer-assignment.txt"
    values = "d__module_0001.jit_step.after_optimizations-buffer-assignment-values.txt"
    good_ba = (b"allocation 0: size 16, parameter 0, shape |f32[4]| at ShapeIndex {}:\n"
               b" value: <0 p @0> (size=16,offset=0): f32[4]{0}\n")
    fifo_layouts = {
        "values-file": {dump: SMALL_HLO, ba: good_ba, values: None},
        "buffer-assignment": {dump: SMALL_HLO, ba: None},
        "hlo-beside-a-dump": {dump: SMALL_HLO, "d__other.after_optimizations.txt": None},
        "hlo-in-subfolder": {"d__a.hlo": SMALL_HLO, "d__sub__b.hlo": None},
        "txt-beside-hlo-text": {"d__a.txt": SMALL_HLO, "d__b.txt": None},
    }
    for name, files in fifo_layouts.items():
        out.append(Case(f"r4-scan-dir-fifo-{name}", ["scan", "{tmp}/d"], _files(**files), needle="not a regular file",
                        tags={"round4", "r4-fifo"}, timeout=120))
    out.append(Case("r4-scan-dir-link-to-dev-zero-values", ["scan", "{tmp}/d"], _dump_with_values_linked("/dev/zero"),
                    needle="not a regular file", tags={"round4", "r4-fifo"}, timeout=120))
    return out


def _dump_with_values_linked(target: str) -> Callable[[Path], None]:
    def setup(tmp: Path) -> None:
        (tmp / "d").mkdir()
        (tmp / "d" / "module_0001.jit_step.after_optimizations.txt").write_bytes(SMALL_HLO)
        (tmp / "d" / "module_0001.jit_step.after_optimizations-buffer-assignment.txt").write_bytes(
            b"allocation 0: size 16, parameter 0, shape |f32[4]| at ShapeIndex {}:\n"
            b" value: <0 p @0> (size=16,offset=0): f32[4]{0}\n")
        os.symlink(target, tmp / "d" / "module_0001.jit_step.after_optimizations-buffer-assignment-values.txt")
    return setup


def _publish_cases() -> list[Case]:
    """Item 11: tools/publish_hlo.py keeps the CLI's promises on a user's own folders."""
    import gzip

    tags = {"round4", "r4-publish"}
    dump = "x.after_optimizations.txt"
    good = gzip.compress(SMALL_HLO, mtime=0)

    def link(name: str, target: str) -> Callable[[Path], None]:
        def setup(tmp: Path) -> None:
            (tmp / "d").mkdir()
            os.symlink(target, tmp / "d" / name)
        return setup

    return [
        Case("r4-publish-readme", ["{tmp}/README.md"], _files(**{"README.md": b"# notes\n"}), entry="publish",
             needle="not named like a compiler dump", tags=tags),
        Case("r4-publish-gz-exists", ["{tmp}/" + dump], _files(**{dump: SMALL_HLO, dump + ".gz": good}),
             entry="publish", needle="already exists", tags=tags),
        Case("r4-publish-fifo-in-folder", ["{tmp}/d"], _files(**{"d/" + dump: None}), entry="publish",
             needle="not a regular file", tags=tags, timeout=60),
        Case("r4-publish-fifo-given", ["{tmp}/" + dump], _files(**{dump: None}), entry="publish",
             needle="not a regular file", tags=tags, timeout=60),
        Case("r4-publish-binary", ["{tmp}/" + dump], _files(**{dump: bytes(range(256)) * 4}), entry="publish",
             needle="not UTF-8", tags=tags),
        Case("r4-publish-corrupt-gz", ["{tmp}/" + dump + ".gz"], _files(**{dump + ".gz": b"\x1f\x8b\x08\x00garbage"}),
             entry="publish", needle="gzip", tags=tags),
        Case("r4-publish-truncated-gz", ["{tmp}/" + dump + ".gz"], _files(**{dump + ".gz": good[:-12]}),
             entry="publish", needle="gzip", tags=tags),
        Case("r4-publish-not-gzip-at-all", ["{tmp}/" + dump + ".gz"], _files(**{dump + ".gz": SMALL_HLO}),
             entry="publish", needle="gzip", tags=tags),
        Case("r4-publish-gz-of-binary", ["{tmp}/" + dump + ".gz"],
             _files(**{dump + ".gz": gzip.compress(bytes(range(256)), mtime=0)}), entry="publish", needle="not UTF-8",
             tags=tags),
        Case("r4-publish-folder-named-like-a-dump", ["{tmp}/d"], _files(**{"d/" + dump: "/"}), entry="publish",
             needle="not a regular file", tags=tags),
        Case("r4-publish-link-to-dev-zero", ["{tmp}/d"], link(dump, "/dev/zero"), entry="publish",
             needle="not a regular file", tags=tags, timeout=60),
        Case("r4-publish-one-bad-among-good", ["{tmp}/d"],
             _files(**{"d/a.after_optimizations.txt": SMALL_HLO, "d/b.after_optimizations.txt": b"\xff\xfe"}),
             entry="publish", needle="not UTF-8", tags=tags),
        Case("r4-publish-missing", ["{tmp}/nothere"], entry="publish", needle="no such file", tags=tags),
        Case("r4-publish-nothing", [], entry="publish", needle="usage", tags=tags),
    ]


SWEEP_ENV = {"MATRIX_PINS": "0.12.0.1", "DEFAULT_JAX_PIN": "0.12.0.1", "TPU_TARGET": "host", "SWEEP_CELLS": "full:True",
             "MATRIX_OPTIONS": "scale=0.015625 seq_scale=0.125 layers=(1,2)", "SWEEP_OUT": "{tmp}/sweep"}


def _sweep_cases() -> list[Case]:
    """Item 12: make tpu-sweep checks every entry before it creates a folder or starts a compile."""
    tags = {"round4", "r4-sweep"}
    entries = {"later-bad-value": "jit=bare jit=bogus", "bad-value": "jit=bogus",
               "later-not-key-value": "jit=bare bogus", "bad-layers": "layers=(1.5,2)", "empty-value": "jit=",
               "empty": " "}
    out = [Case(f"r4-sweep-{name}", [], entry="sweep", env={**SWEEP_ENV, "SWEEP": sweep}, tags=tags, timeout=600)
           for name, sweep in entries.items()]
    out.append(Case("r4-sweep-bad-cell", [], entry="sweep", env={**SWEEP_ENV, "SWEEP": "jit=bare",
                                                                 "SWEEP_CELLS": "full:maybe"}, tags=tags, timeout=600))
    out.append(Case("r4-sweep-cell-not-mode-remat", [], entry="sweep", env={**SWEEP_ENV, "SWEEP": "jit=bare",
                                                                            "SWEEP_CELLS": "full"}, tags=tags,
                    timeout=600))
    return out


BISECT_LOG = b'{"kind": "task", "task": {"oracle": "hlo"}}\n{"kind": "probe", "disabled": [], "failing": true}\n'


def _bundle_cases() -> list[Case]:
    """Item 13: bundle checks its inputs and outputs before it compiles or runs anything, and never
    replaces a file (its .partial included)."""
    tags = {"round4", "r4-bundle"}
    base = ["bundle", "--out", "{tmp}/o.tar.gz", *TINY_ARGS, "--steps", "2"]
    return [
        Case("r4-bundle-bisect-empty-dir", [*base, "--bisect", "{tmp}/b"], _files(b="/"), needle="bisect.jsonl",
             late=10, tags=tags, timeout=300),
        Case("r4-bundle-bisect-not-a-log", [*base, "--bisect", "{tmp}/b"], _files(b__bisect__jsonl=b"my notes\n"),
             needle="bisect", late=10, tags=tags, timeout=300),
        Case("r4-bundle-bisect-log-is-fifo", [*base, "--bisect", "{tmp}/b"], _files(b__bisect__jsonl=None),
             needle="not a regular file", late=10, tags=tags, timeout=300),
        Case("r4-bundle-partial-exists", base, _files(**{"o.tar.gz.partial": b"an earlier attempt"}),
             needle="partial", late=10, tags=tags, timeout=300),
        Case("r4-bundle-out-not-tar-gz", ["bundle", "--out", "{tmp}/o.zip", *TINY_ARGS], needle=".tar.gz", late=10,
             tags=tags, timeout=300),
        Case("r4-bundle-dump-without-step", [*base, "--dump", "{tmp}/dump"], _files(dump="/"), needle="jit_step",
             late=10, tags=tags, timeout=300),
        Case("r4-bundle-out-under-file", ["bundle", "--out", "{tmp}/f/o.tar.gz", *TINY_ARGS], _files(f=b"x"),
             needle="not a folder", late=10, tags=tags, timeout=300),
        Case("r4-bundle-ok-bisect-log-but-partial", [*base, "--bisect", "{tmp}/b"],
             _files(b__bisect__jsonl=BISECT_LOG, **{"o.tar.gz.partial": b"x"}), needle="partial", late=10, tags=tags,
             timeout=300),
    ]


def round4_cases() -> list[Case]:
    return (_options_cases() + _resume_cases() + _protect_cases() + _flag_cases() + _plot_cases() + _signal_cases()
            + _compiler_env_cases() + _number_cases() + _bisect_cases() + _scan_cases() + _publish_cases()
            + _sweep_cases() + _bundle_cases())


# --------------------------------------------------------------------------- round 5 (#46)
# triage, report --html, the HLO reader's async sugar, targets, variants, the output folder and the
# autotune flag: each refused with one error line naming the cause, before anything is created.

QUICKSTART = "examples/quickstart/my_model.py:make"
AGU_HLO = """HloModule m, is_scheduled=true

ENTRY e {
  p = f32[4]{0} parameter(0)
  s = (f32[4]{0}, f32[8]{0}) all-gather-start(p), replica_groups={{0,1}}, dimensions={0}
  u = (f32[4]{0}, f32[8]{0}) all-gather-update(s)
  ROOT d = f32[8]{0} all-gather-done(u)
}
"""


def _link(name: str, target: str) -> Callable[[Path], None]:
    def setup(tmp: Path) -> None:
        (tmp / name).symlink_to(target.replace("{tmp}", str(tmp)))
    return setup


def _triage_cases() -> list[Case]:
    tags = {"round5", "r5-triage"}
    q = str(Path(__file__).resolve().parents[1] / QUICKSTART)
    out = [Case(f"r5-triage-{name}", ["triage", *argv, "--out", "{tmp}/t"], setup, needle=needle, tags=tags,
                timeout=120)
           for name, argv, setup, needle in (
               ("program-missing", ["--program", "/nonexistent.py:make"], _files(), "no such file"),
               ("program-empty", ["--program", ""], _files(), "not a built-in"),
               ("option-bogus", ["--program", q, "--program-option", "bogus=1"], _files(), "bogus"),
               ("option-no-key", ["--program", q, "--program-option", "=1"], _files(), "KEY=VALUE"),
               ("option-precision-low", ["--program", "issue-35409", "--program-option", "precision=low"], _files(),
                "precision"),
               ("rate-1e-300", ["--program", q, "--rate-of-interest", "1e-300"], _files(), "--rate-of-interest"),
               ("budget-1e308", ["--program", q, "--budget", "1e308"], _files(), "--budget"),
               ("hlo-garbage", ["--program", q, "--hlo", "{tmp}/g.txt"], _files(**{"g.txt": "not HLO\n"}), "g.txt"),
               ("hlo-gz", ["--program", q, "--hlo", "{tmp}/g.txt.gz"], _files(**{"g.txt.gz": b"\x1f\x8b\x08\x00"}),
                "gunzip"))]
    out.append(Case("r5-triage-out-empty", ["triage", "--program", q, "--out", ""], needle="--out", tags=tags))
    out.append(Case("r5-triage-resume-corrupt-spec", ["triage", "--program", q, "--out", "{tmp}/t", "--resume"],
                    _files(**{"t/stages": "/", "t/triage-spec.json": "{"}), needle="triage-spec.json", tags=tags))
    out.append(Case("r5-triage-resume-not-a-triage", ["triage", "--program", q, "--out", "{tmp}/t", "--resume"],
                    _files(**{"t/stages": "/", "t/mine.txt": "mine\n"}), needle="not a triage folder", tags=tags))
    return out


def _report_html_cases() -> list[Case]:
    tags = {"round5", "r5-report-html"}
    records = {"stages-list": {"kind": "triage", "stages": []},
               "stage-string": {"kind": "triage", "stages": {"t": "x"}},
               "verdict-empty": {"kind": "triage", "stages": {"hlo:1": {"ok": True, "verdict": {}}}},
               "rounds-int": {"kind": "triage", "stages": {"train": {"ok": True, "rounds": [5]}}},
               "spec-list": {"kind": "triage", "spec": []}}
    out = [Case(f"r5-report-html-{name}", ["report", "{tmp}/t", "--html"],
                _files(**{"t/triage.json": json.dumps(rec)}), needle="not a triage record", tags=tags)
           for name, rec in records.items()]
    out.append(Case("r5-report-html-fifo", ["report", "{tmp}/t", "--html"], _files(**{"t/triage.json": None}),
                    needle="FIFO", tags=tags))
    return out


def round5_cases() -> list[Case]:
    tags = {"round5"}
    return _triage_cases() + _report_html_cases() + [
        Case("r5-scan-all-gather-update", ["scan", "{tmp}/m.txt"], _files(**{"m.txt": AGU_HLO}),
             needle="all-gather-update", tags=tags),
        Case("r5-target-cuda-empty-topology", ["scan", "--model", "--target", "cuda:h200:", *TINY_ARGS],
             needle="empty GPU topology", tags=tags),
        Case("r5-target-cuda-too-many", ["scan", "--model", "--target", "cuda:h200:1x1x100000", *TINY_ARGS],
             needle="at most 16", tags=tags),
        Case("r5-variants-precision-low", [*STRESS_TINY, "--variants", "baseline,precision-low"],
             needle="precision-high", tags=tags),
        Case("r5-out-dangling-link", [*STRESS_TINY[:2], "--out", "{tmp}/o", *STRESS_TINY[4:]],
             _link("o", "{tmp}/nowhere"), needle="does not exist", tags=tags),
    ]


# --------------------------------------------------------------------------- round 6 (#56)
# A user's program that exits, hangs or prints; refusals that touch nothing; words that name the cause.

def _round6_program(body: str) -> Callable[[Path], None]:
    return _files(**{"prog.py": _PROGRAM_HEAD + "import os\nimport signal\n" + body})


EXITS_IN_BATCH = ("def make():\n    def batch(key, step):\n        if isinstance(step, int) and step == 1:\n"
                  "            os._exit(0)\n        return _batch(key, step)\n    return program(batch=batch)\n")
HANGS_IN_STEP = ("import time\nimport numpy as np\n"
                 "def _wait(step):\n    if int(step) == 3:\n        time.sleep(3600)\n    return np.float32(0)\n"
                 "def make():\n    def batch(key, step):\n"
                 "        return {'x': _batch(key, step), 's': jnp.int32(step)}\n"
                 "    def loss(p, b):\n        z = jax.experimental.io_callback(_wait, jax.ShapeDtypeStruct((), "
                 "jnp.float32), b['s'])\n        return _loss(p, b['x']) + z\n"
                 "    return program(batch=batch, step=step_from_loss(loss, OPT))\n")
PRINTS = ("print('hello from import')\n"
          "def make():\n    print('hello from make')\n    def step(p, o, b):\n"
          "        jax.debug.print('loss {}', _loss(p, b))\n        return _good_step(p, o, b)\n"
          "    return program(step=step)\n")
TYPE_ERROR_IN_STEP = ("def make():\n    def step(p, o, b):\n        raise TypeError('planted')\n"
                      "    return program(step=step)\n")
INTERRUPTS_IN_INIT = ("def make():\n    def init(key):\n        raise KeyboardInterrupt\n"
                      "    return program(init=init)\n")
PROGRAM_ARGS = ["--program", "{tmp}/prog.py:make"]


def _json_stdout(tmp: Path, out: str) -> str | None:
    try:
        json.loads(out)
    except ValueError:
        return f"stdout is not JSON: {out[:120]!r}"
    return None


def _commit_said(tmp: Path, out: str) -> str | None:
    records = [json.loads(line) for line in (tmp / "res" / "stress.jsonl").read_text().splitlines()]
    commits = {r.get("commit") for r in records if r.get("kind") == "block" and r.get("start", 0) >= 2}
    return None if commits == {"step"} else f"the resumed blocks record commit {commits}, not step"


def _half_run(tmp: Path) -> None:
    """A run of RUN_ARGS with --commit block (its default) cut after step 2, as an interrupted one is."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]  # a process of its own: jax never imported in a parent that forks
    subprocess.run([sys.executable, "-m", "xla_harness", "stress", "--quiet", "--out", str(tmp / "res"), *RUN_ARGS],
                   check=True, cwd=root, env={**os.environ, "PYTHONPATH": str(root)}, stdout=subprocess.DEVNULL)
    path = tmp / "res" / "stress.jsonl"
    kept = [line for line in path.read_text().splitlines(keepends=True)
            if json.loads(line).get("kind") != "block" or json.loads(line)["end"] <= 2]
    path.write_text("".join(kept))


def _large_gzip_dump(tmp: Path) -> None:
    import gzip

    (tmp / "dump").mkdir()
    text = b"%x = f32[8]{0} add(%a, %b)\n" * (5 << 23)  # 1.1 GB of text: over a second to decompress
    (tmp / "dump" / "module_0001.jit_step.after_optimizations.txt.gz").write_bytes(gzip.compress(text, 1))
    (tmp / "dump" / "module_0001.jit_step.after_optimizations-buffer-assignment.txt").write_bytes(b"")


MEMPLAN_DUMP = Path(__file__).resolve().parents[1] / "results/gpu/h100-2026-11-28/memory-plan/dump"
MEMPLAN_STEM = "module_0000.jit_stage.sm_9.0a_gpu_after_optimizations"
OTHER_BA = (Path(__file__).resolve().parents[1] / "results/cuda-aot/live-range"
            / "cuda_h100_1x1x8-issue-35409_scale=0.03125_-9aa73c1e.after_optimizations-buffer-assignment.txt.gz")


def _memplan_dump(edit: Callable[[str], str] | None = None, ba: Path | None = None) -> Callable[[Path], None]:
    """A small real XLA:GPU dump as m.txt with its buffer assignment beside it (edited, or another's)."""
    def setup(tmp: Path) -> None:
        import gzip

        (tmp / "m.txt").write_bytes(gzip.decompress((MEMPLAN_DUMP / f"{MEMPLAN_STEM}.txt.gz").read_bytes()))
        text = gzip.decompress((ba or MEMPLAN_DUMP / f"{MEMPLAN_STEM}-buffer-assignment.txt.gz").read_bytes()).decode()
        (tmp / "m-buffer-assignment.txt").write_text(edit(text) if edit else text)
    return setup


def _memcheck_cases() -> list[Case]:
    """The memcheck inputs of #55: files that are not one compile's, cut or malformed; not a file."""
    tags = {"round6", "r6-memcheck"}
    argv = ["memcheck", "{tmp}/m.txt"]
    return [
        Case("r6-memcheck-cut-buffer-assignment", argv, _memplan_dump(lambda t: t[:-9]), needle="cut short",
             tags=tags),
        Case("r6-memcheck-negative-size", argv, _memplan_dump(lambda t: t.replace("size=4,", "size=-4,", 1)),
             needle="negative size", tags=tags),
        Case("r6-memcheck-repeated-value-id", argv, _memplan_dump(lambda t: t.replace("<1 copy.1", "<0 copy.1")),
             needle="value id 0 is also", tags=tags),
        Case("r6-memcheck-bytes-past-allocation", argv,
             _memplan_dump(lambda t: t.replace("copy.1 @0> (size=4,offset=0)", "copy.1 @0> (size=4,offset=2)")),
             needle="past the end of allocation", tags=tags),
        Case("r6-memcheck-another-modules-buffer-assignment", argv, _memplan_dump(ba=OTHER_BA),
             needle="not one compile's", tags=tags),
        Case("r6-memcheck-dev-zero", ["memcheck", "/dev/zero"], needle="not a regular file or a folder", tags=tags),
        Case("r6-memcheck-fifo", ["memcheck", "{tmp}/f"], _files(f=None), needle="not a regular file or a folder",
             tags=tags),
    ]


def round6_cases() -> list[Case]:
    tags = {"round6", "compiles"}
    stress = ["stress", "--quiet", "--out", "{tmp}/o", *PROGRAM_ARGS, "--steps", "4", "--block", "2"]
    triage = ["triage", *PROGRAM_ARGS, "--out", "{tmp}/t", "--budget", "1"]
    return [
        Case("r6-stress-batch-os-exit", stress, _round6_program(EXITS_IN_BATCH), needle="os._exit(0)", tags=tags,
             timeout=120),
        Case("r6-triage-batch-os-exit", triage, _round6_program(EXITS_IN_BATCH), needle="os._exit(0)", tags=tags,
             timeout=150),
        Case("r6-triage-step-hangs", triage, _round6_program(HANGS_IN_STEP), needle="not within the budget",
             tags=tags | {"census-only"}, timeout=150, late=60 + 20),
        Case("r6-stress-json-program-prints", ["stress", "--json", "--out", "{tmp}/o", *PROGRAM_ARGS, "--steps", "2"],
             _round6_program(PRINTS), expect=0, check=_json_stdout, tags=tags, timeout=120),
        Case("r6-stress-resume-other-commit", ["stress", "--resume", "--quiet", "--out", "{tmp}/res", *RUN_ARGS,
                                               "--commit", "step"], _half_run, expect=0, check=_commit_said, tags=tags,
             timeout=120),
        Case("r6-bundle-other-programs-results", ["bundle", "--out", "{tmp}/o.tar.gz", *PROGRAM_ARGS, "--results",
                                                  "{tmp}/res"],
             _files(**{"prog.py": _PROGRAM_HEAD + "def make():\n    return program()\n",
                       "res/stress.jsonl": GOOD}), needle="holds results of --program", late=10, tags=tags,
             timeout=120),
        Case("r6-bundle-step-type-error", ["bundle", "--out", "{tmp}/o.tar.gz", *PROGRAM_ARGS, "--steps", "2"],
             _round6_program(TYPE_ERROR_IN_STEP), needle="raised TypeError: planted", tags=tags, timeout=120),
        Case("r6-stress-init-keyboard-interrupt", stress, _round6_program(INTERRUPTS_IN_INIT), entry="process",
             needle="KeyboardInterrupt", tags=tags, timeout=120),
        Case("r6-triage-hlo-missing", [*triage, "--hlo", "{tmp}/nothere.txt"], _round6_program(""),
             needle="no such file", tags=tags),
        Case("r6-bundle-check-folder", ["bundle", "--check", "{tmp}/d"], _files(d="/"), needle="a folder", tags=tags),
        *_memcheck_cases(),
        Case("r6-memcheck-sigint-in-gzip-read", ["memcheck", "{tmp}/dump"], _large_gzip_dump, entry="process",
             expect=130, signal=(2, 0.5), late=3, tags=tags, timeout=120),
    ]
