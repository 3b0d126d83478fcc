"""What every stage of the jaxlib build gets: the run's settings and state (:class:`Ctx`,
with this checkout's :data:`REPO` and the defaults) and the :class:`Runner` that runs a
stage's commands into its log, or prints them in a dry run."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from xla_harness.errors import HarnessError
from xla_harness.runtime import subproc
from xla_harness.runtime.resources import source_checkout
from xla_harness.upstream.jaxlib_plan import jax_tag

REPO = source_checkout() or Path.cwd()  # this checkout (the pipeline installs it editable), else the cwd
DEFAULT_JAX = "0.12.0.1"
JAX_REPO = "https://github.com/jax-ml/jax.git"
XLA_TARBALL = "https://github.com/openxla/xla/archive/{commit}.tar.gz"
MIN_FREE_GB = 40  # a jaxlib build with its bazel caches; CUDA needs more (see --min-free-gb)
COMMAND_TIMEOUT_S = 12 * 3600  # one command of a stage (a cold jaxlib build takes hours); see --command-timeout
TIMED_OUT = 124  # the exit status a timed-out command reports with check=False (as timeout(1) does)


@dataclass
class Ctx:
    work: Path
    jax_version: str
    series: str = "default"
    cuda: bool = False
    cuda_major: str = "12"
    python: str = sys.executable
    jax_repo: str = JAX_REPO
    xla_url: str = XLA_TARBALL
    dry_run: bool = False
    min_free_gb: float = MIN_FREE_GB
    venv: Path = REPO / ".venv-patched"
    results: Path = REPO / "results" / "patched"
    harness_tests: tuple[str, ...] = ("tests/hlo/test_hlo.py", "tests/stress/test_stress.py")
    stress_steps: int = 10
    command_timeout_s: float = COMMAND_TIMEOUT_S
    state: dict = field(default_factory=dict)  # outputs of earlier stages

    @property
    def tag(self) -> str:
        return jax_tag(self.jax_version)

    def log(self, stage: str) -> Path:
        return self.work / "logs" / f"{stage}.log"

    def stamp(self, stage: str) -> Path:
        return self.work / "stamps" / f"{stage}.json"

    def out(self, key: str, placeholder: str) -> str:
        return str(self.state.get(key, placeholder))


class Runner:
    """Runs argv lists with output to a stage log; in dry-run prints them instead."""

    def __init__(self, ctx: Ctx):
        self.ctx = ctx

    def __call__(self, argv: list[str], cwd: Path | None, stage: str, env: dict | None = None,
                 what: str = "", check: bool = True) -> int:
        """Run ``argv``; returns its exit status (0 in a dry run). With ``check`` a failure raises.
        The command runs in its own process group; after ``ctx.command_timeout_s`` the group is killed:
        with ``check`` that is a HarnessError naming the command, without it exit status 124."""
        shown = " ".join(_quote(a) for a in argv)
        env = env or {}
        if env:
            shown = "env " + " ".join(f"{k}={_quote(v)}" if v else f"-u {k}" for k, v in env.items()) + " " + shown
        if self.ctx.dry_run:
            print(f"  [{stage}] (cd {cwd or '.'} && {shown})")
            return 0
        log = self.ctx.log(stage)
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "a", encoding="utf-8") as fh:
            fh.write(f"$ (cd {cwd} && {shown})\n")
            fh.flush()
            try:
                full = {**os.environ, **env}
                for k in [k for k, v in env.items() if not v]:  # an empty value means: unset it
                    full.pop(k)
                code = subproc.run(argv, cwd=cwd, stdout=fh, stderr=subprocess.STDOUT, env=full,
                                   timeout=self.ctx.command_timeout_s, what=f"{stage}: {what or argv[0]}").returncode
            except FileNotFoundError:
                raise HarnessError(f"{stage}: {argv[0]} not found") from None
            except subproc.ChildTimeout as exc:
                fh.write(f"{exc}\n")
                if check:
                    raise HarnessError(f"{exc}; see {log} (--command-timeout to allow longer)") from None
                code = TIMED_OUT
        if code != 0 and check:
            raise HarnessError(f"{stage}: {what or argv[0]} failed (exit {code}); see {log}")
        return code


def _quote(a: str) -> str:
    return a if re.fullmatch(r"[\w@%+=:,./\-]+", a) else "'" + a.replace("'", "'\\''") + "'"
