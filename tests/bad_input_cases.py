"""Generated bad-input cases for every subcommand and build/build_jaxlib.py.

Each case is an argv (``{tmp}`` is replaced by the case's own folder) and a setup that
writes the files the argv names. Every case must end with exit 2, exactly one ``error:``
line on stderr, no traceback and no file that existed before changed. Used by
tests/test_bad_input.py and by tools/bad_input_census.py (which counts outcomes).
"""

from __future__ import annotations

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
    entry: str = "cli"  # "cli": xla_harness.cli.main; "build": build/build_jaxlib.py
    needs_nonroot: bool = False
    tags: set[str] = field(default_factory=set)

    def args(self, tmp: Path) -> list[str]:
        return [a.replace("{tmp}", str(tmp)) for a in self.argv]


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
}


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
        Case("stress-resume-fifo-results", ["stress", "--resume", "--quiet", "--out", "{tmp}/res", *RUN_ARGS],
             _files(res__stress__jsonl=None)),
        Case("stress-plot-is-dir", ["stress", "--quiet", "--out", "{tmp}/o", "--plot", "{tmp}/d", "--steps", "0"],
             _files(d="/")),
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
    return out


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
             + series_cases() + bisect_cases() + bundle_cases() + cli_cases() + build_cases() + red_team_cases())
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
