"""Repro bundles: everything upstream needs to see a failure, in one tar.gz.

Contents: ``env.json`` (versions, device kinds, topology, XLA_*/LIBTPU_*/JAX_*/TPU_*
variables only), ``config.json``, ``hlo/`` (optimized HLO and buffer assignment of the
training step, from a dump), ``findings.json`` (the scanner on that HLO), ``stress/``
(the results and table), ``bisect.jsonl`` when given, ``repro.py`` (standalone, jax and
numpy only) with ``expected.json`` (its output when the bundle was made), ``README.md``.
``check`` re-runs repro.py and compares with expected.json.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from harness.errors import HarnessError
from harness.repro.repro_template import REPRO

ENV_PREFIXES = ("XLA_", "LIBTPU_", "JAX_", "TPU_")


def bundle_env() -> dict:
    from harness.stress import store as results

    env = results.environment()
    import jax

    env["env"] = {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES)}
    env["devices"] = [{"id": d.id, "kind": d.device_kind, "process": d.process_index,
                       "coords": list(getattr(d, "coords", []) or [])} for d in jax.devices()]
    return env


def dump_files(dump: Path) -> tuple[Path, Path]:
    """(optimized HLO, buffer assignment) of the training step in a dump folder."""
    if not dump.is_dir():
        raise HarnessError(f"dump folder {dump} does not exist")
    hlos = sorted(p for p in dump.glob("*jit_step*after_optimizations.txt"))
    if not hlos:
        raise HarnessError(f"{dump}: missing *jit_step*after_optimizations.txt (dump with "
                           "XLA_FLAGS='--xla_dump_to=DIR --xla_dump_hlo_as_text')")
    hlo = hlos[-1]
    ba = hlo.with_name(hlo.name[:-len(".txt")] + "-buffer-assignment.txt")
    if not ba.is_file():
        raise HarnessError(f"{dump}: missing {ba.name} (the buffer assignment of {hlo.name})")
    return hlo, ba


def make_bundle(out: Path, cfg, seeds: tuple[int, ...], steps: int, learning_rate: float = 1e-3,
                dump: Path | None = None, results_dir: Path | None = None, bisect_dir: Path | None = None,
                python: str = sys.executable) -> Path:
    import numpy as np

    from harness.hlo.parser import parse_file
    from harness.hlo.scan import module_json, scan_module
    from harness.stress import report
    from harness.stress.runner import StressSpec, build_program, run_matrix

    if not str(out).endswith(".tar.gz"):
        raise HarnessError(f"--out must end in .tar.gz, got {out}")
    with tempfile.TemporaryDirectory(prefix="xla-harness-bundle-") as tmp:
        root = Path(tmp) / "bundle"
        (root / "hlo").mkdir(parents=True)
        spec = StressSpec(modes=(cfg.mode,), remats=(cfg.remat,), seeds=seeds, steps=steps, dtype=cfg.dtype,
                          learning_rate=learning_rate, vocab=cfg.vocab, d_model=cfg.d_model, layers=cfg.layers,
                          heads=cfg.heads, seq=cfg.seq, batch=cfg.batch)
        if dump is None:  # compile the step once with a dump of its optimized HLO
            dump = Path(tmp) / "dump"
            prog = build_program(cfg, spec)
            p, o = prog.init(seeds[0])
            prog.step.lower(p, o, np.uint32(seeds[0]), np.int32(0)).compile(
                compiler_options={"xla_dump_to": str(dump), "xla_dump_hlo_as_text": True})
        hlo, ba = dump_files(Path(dump))
        shutil.copy(hlo, root / "hlo" / hlo.name)
        shutil.copy(ba, root / "hlo" / ba.name)
        mod = parse_file(hlo)
        (root / "findings.json").write_text(json.dumps({"modules": [module_json(mod, scan_module(mod))]}, indent=2))
        (root / "env.json").write_text(json.dumps(bundle_env(), indent=2, default=str))
        (root / "config.json").write_text(json.dumps({"model": cfg.to_dict(), "seeds": list(seeds), "steps": steps,
                                                      "learning_rate": learning_rate}, indent=2))
        stress_dir = root / "stress"
        if results_dir is not None:
            shutil.copytree(results_dir, stress_dir, ignore=shutil.ignore_patterns("ckpt"))
        else:
            run_matrix(spec, stress_dir, progress=False)
            shutil.rmtree(stress_dir / "ckpt", ignore_errors=True)
        (stress_dir / "table.txt").write_text(report.format_table(report.load_table([stress_dir])) + "\n")
        if bisect_dir is not None:
            src = Path(bisect_dir) / "bisect.jsonl"
            if not src.is_file():
                raise HarnessError(f"{bisect_dir}: missing bisect.jsonl")
            shutil.copy(src, root / "bisect.jsonl")
        (root / "repro.py").write_text(REPRO)
        (root / "expected.json").write_text(run_repro(root, python))
        (root / "README.md").write_text(
            "# Repro bundle\n\n`python repro.py` (needs jax and numpy) trains the tied-embedding model of "
            "`config.json` and counts non-finite updates; `expected.json` is what it printed when the bundle "
            "was made, `env.json` where. `hlo/` holds the optimized HLO and buffer assignment of the step, "
            "`findings.json` the scanner's view of it, `stress/` the harness's stress results, and "
            "`bisect.jsonl` (if present) the pass bisection. `xla-harness bundle --check FILE` re-runs "
            "and compares.\n")
        out.parent.mkdir(parents=True, exist_ok=True)
        partial = out.with_name(out.name + ".partial")
        with tarfile.open(partial, "w:gz") as tf:
            tf.add(root, arcname="bundle")
        partial.replace(out)
    return out


def run_repro(root: Path, python: str = sys.executable, timeout: float = 1800) -> str:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    res = subprocess.run([python, str(root / "repro.py"), "--json"], capture_output=True, text=True,
                         timeout=timeout, env=env, cwd=root)
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("{")]
    if res.returncode != 0 or not lines:
        last = (res.stderr.strip().splitlines() or ["no output"])[-1]
        raise HarnessError(f"repro.py failed: {last}")
    return lines[-1] + "\n"


def check_bundle(path: Path, python: str = sys.executable) -> tuple[bool, list[str]]:
    """Re-run repro.py from the bundle; compare with expected.json. (same, lines)."""
    if not path.is_file():
        raise HarnessError(f"{path}: no such bundle")
    with tempfile.TemporaryDirectory(prefix="xla-harness-check-") as tmp:
        try:
            with tarfile.open(path) as tf:
                tf.extractall(tmp, filter="data")
        except (tarfile.TarError, OSError) as exc:
            raise HarnessError(f"{path}: not a readable bundle ({exc})") from None
        root = Path(tmp) / "bundle"
        for need in ("repro.py", "config.json", "expected.json"):
            if not (root / need).is_file():
                raise HarnessError(f"{path}: bundle lacks {need}")
        expected = json.loads((root / "expected.json").read_text())
        got = json.loads(run_repro(root, python))
    lines, same = [], True
    for seed, want in expected["seeds"].items():
        have = got["seeds"].get(seed)
        if have is None:
            lines.append(f"seed {seed}: missing from the re-run")
            same = False
            continue
        diff = max((abs(a - b) / max(1.0, abs(b)) for a, b in zip(have["losses"], want["losses"], strict=True)
                    if a is not None and b is not None), default=0.0)
        ok = have["nonfinite"] == want["nonfinite"] and diff <= 1e-5
        same &= ok
        lines.append(f"seed {seed}: non-finite {have['nonfinite']} (bundle: {want['nonfinite']}), "
                     f"max relative loss difference {diff:.2e} -> {'same' if ok else 'DIFFERENT'}")
    lines.append(f"bundle made with jax {expected['jax']} on {expected['backend']}; re-run with jax "
                 f"{got['jax']} on {got['backend']}")
    return same, lines
