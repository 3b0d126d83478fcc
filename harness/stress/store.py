"""JSONL result store: one line per finished step-block, appended with flush + fsync.

A results folder holds ``stress.jsonl`` (``stress.p<i>.jsonl`` for process i of a
multi-process run). The first line is a header with the run's spec; every later line is
a block of consecutive steps of one (config, seed). A line cut short by ``kill -9`` is
repaired on open (with a warning) and its steps are simply run again on ``--resume``.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import subprocess
import sys
import warnings
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import lru_cache
from importlib import metadata
from pathlib import Path

from harness.errors import HarnessError

ENV_VARS_RECORDED = ("XLA_FLAGS", "LIBTPU_INIT_ARGS", "JAX_PLATFORMS", "TPU_NAME")
PLUGIN_DISTRIBUTIONS = (
    "libtpu", "libtpu-nightly", "jax-cuda12-plugin", "jax-cuda12-pjrt",
    "jax-cuda13-plugin", "jax-cuda13-pjrt", "jax-rocm-plugin",
)


def _dist_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


@lru_cache(maxsize=1)
def repo_commit() -> str:
    """Git commit of this repository (with '+dirty' if it has local changes), or 'unknown'."""
    root = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                              text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return head + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def environment() -> dict:
    """Versions, backend and variables that decide what XLA compiles; recorded on every line."""
    import jax

    devices = jax.devices()
    try:
        import jaxlib

        jaxlib_version = getattr(jaxlib, "__version__", None) or _dist_version("jaxlib")
    except ImportError:
        jaxlib_version = None
    return {
        "jax": jax.__version__,
        "jaxlib": jaxlib_version,
        "plugins": {n: v for n in PLUGIN_DISTRIBUTIONS if (v := _dist_version(n))},
        "backend": jax.default_backend(),
        "device_kind": devices[0].device_kind,
        "device_count": jax.device_count(),
        "local_device_count": jax.local_device_count(),
        "process_index": jax.process_index(),
        "process_count": jax.process_count(),
        "env": {k: os.environ.get(k, "") for k in ENV_VARS_RECORDED},
        "host": socket.gethostname(),
        "python": platform.python_version(),
        "repo_commit": repo_commit(),
    }


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


@dataclass
class Loaded:
    """What a results file holds: its header and its complete block lines."""

    header: dict | None = None
    blocks: list[dict] = field(default_factory=list)
    repaired: bool = False


def _repair_tail(path: Path) -> bool:
    """Cut a trailing partial line (no final newline or not JSON). Returns True if cut."""
    data = path.read_bytes()
    if not data:
        return False
    keep = len(data)
    if not data.endswith(b"\n"):
        keep = data.rfind(b"\n") + 1
    else:
        last_start = data.rfind(b"\n", 0, len(data) - 1) + 1
        try:
            json.loads(data[last_start:])
        except ValueError:
            keep = last_start
    if keep == len(data):
        return False
    with open(path, "r+b") as fh:
        fh.truncate(keep)
        fh.flush()
        os.fsync(fh.fileno())
    return True


def load(path: Path, repair: bool = False) -> Loaded:
    """Read a results file. With ``repair``, a truncated last line is cut off (with a warning)."""
    path = Path(path)
    out = Loaded()
    if not path.exists():
        return out
    if repair and _repair_tail(path):
        out.repaired = True
        warnings.warn(f"{path}: removed a truncated last line (an interrupted write); "
                      "its steps will be run again", stacklevel=2)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise HarnessError(f"cannot read {path}: {exc.strerror}") from None
    lines = text.split("\n")
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            if lineno == len(lines) and not repair:
                continue  # a line still being written by a live run
            raise HarnessError(f"{path}:{lineno}: not a JSON line") from None
        if not isinstance(rec, dict) or rec.get("kind") not in ("header", "block"):
            raise HarnessError(f"{path}:{lineno}: not a harness results line")
        if rec["kind"] == "header":
            if out.header is None:
                out.header = rec
        else:
            out.blocks.append(rec)
    return out


class ResultStore:
    """Append-only JSONL writer; every append is flushed and fsynced before it returns."""

    def __init__(self, path: Path):
        self.path = Path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fh = open(self.path, "a", encoding="utf-8")
        except OSError as exc:
            raise HarnessError(f"cannot write results to {self.path}: {exc.strerror}") from None

    def append(self, record: dict) -> None:
        line = json.dumps(record, sort_keys=True, allow_nan=False)
        self._fh.write(line + "\n")
        self._fh.flush()
        os.fsync(self._fh.fileno())

    def close(self) -> None:
        self._fh.close()

    def __enter__(self) -> ResultStore:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def results_files(folder: Path) -> list[Path]:
    """The stress results files in a folder (one per process)."""
    folder = Path(folder)
    return sorted(p for p in folder.glob("stress*.jsonl") if p.is_file())


def check_writable(folder: Path) -> None:
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise HarnessError(f"cannot create output folder {folder}: {exc.strerror}") from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise HarnessError(f"output folder {folder} is not writable")


def flush_stdio() -> None:
    for s in (sys.stdout, sys.stderr):
        try:
            s.flush()
        except (OSError, ValueError):
            pass
