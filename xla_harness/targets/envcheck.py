"""The compiler's settings from the environment, tried before the command starts jax.

``XLA_FLAGS``, ``LIBTPU_INIT_ARGS`` and ``JAX_PLATFORMS`` are read by XLA, libtpu and jax when the
first backend starts. A flag XLA does not know ends the process from C++ (``F... Unknown flag in
XLA_FLAGS: --xla_bogus=1``, exit 1: the code that means "a problem was found"), libtpu's the same way
(``ERROR: Unknown command line flag 'xla_bogus'``), and an unknown platform is a RuntimeError from
deep inside jax. None of that can be caught in the process it ends, so when any of the three is set
and no backend has started here yet, a child process starts the backend (and the target's compiler)
the way the command would, and what it died of becomes one ``error:`` line naming the variable and
the flag (exit 2). The child costs one jax start (about a second), only when one of them holds
something the compiler could refuse (:func:`needs_trying`).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

from xla_harness.errors import HarnessError
from xla_harness.targets.spec import Target

VARIABLES = ("XLA_FLAGS", "LIBTPU_INIT_ARGS", "JAX_PLATFORMS")
PROBE_TIMEOUT_S = 300.0
_checked: set[tuple] = set()

# What the child runs: the command's own start-up, then the backend and the target's devices.
_PROBE = """
import sys
from xla_harness.errors import HarnessError
from xla_harness.targets import parse_target
from xla_harness.targets.devices import pin_cpu_without_accelerators, prepare_environment, target_devices
target = parse_target(sys.argv[1])
pin_cpu_without_accelerators()
prepare_environment(target)
import jax
try:
    jax.devices()
except RuntimeError as exc:
    sys.stderr.write("xla-harness-probe: backend: " + (str(exc).strip().splitlines() or [""])[0] + "\\n")
    raise SystemExit(3)
if not target.is_host:
    try:
        target_devices(target)
    except HarnessError:
        pass  # not the environment's doing: the command says it itself
"""

_XLA_UNKNOWN = re.compile(r"Unknown flags? in (XLA_FLAGS|LIBTPU_INIT_ARGS): *(.+)")
_LIBTPU_UNKNOWN = re.compile(r"Unknown command line flag '([^']+)'")


# What the harness itself puts in XLA_FLAGS (and a test suite's CPU split): known to start.
_OWN_FLAGS = re.compile(r"--xla_force_host_platform_device_count=\d+"
                        r'|--xla_gpu_load_autotune_results_from=(?:"[^"]*"|\S+)')


def needs_trying(given: dict[str, str]) -> bool:
    """Whether the variables hold anything the compiler could refuse: JAX_PLATFORMS other than cpu,
    any LIBTPU_INIT_ARGS, XLA_FLAGS beyond the flags the harness sets itself."""
    if given.get("JAX_PLATFORMS", "").strip() not in ("", "cpu") or given.get("LIBTPU_INIT_ARGS", "").strip():
        return True
    return any(not _OWN_FLAGS.fullmatch(tok) for tok in given.get("XLA_FLAGS", "").split())


def _backends_started() -> bool:
    bridge = sys.modules.get("jax._src.xla_bridge")
    return bool(getattr(bridge, "_backends", None))


def _where(flag: str, given: dict[str, str]) -> str:
    """The variable that holds ``flag`` (a name without its dashes)."""
    for var in ("LIBTPU_INIT_ARGS", "XLA_FLAGS"):
        if re.search(rf"(^|\s)--?{re.escape(flag)}(=|\s|$)", given.get(var, "")):
            return var
    return "XLA_FLAGS or LIBTPU_INIT_ARGS"


def explain(stderr: str, returncode: int, given: dict[str, str]) -> str:
    """The one sentence for a child that could not start the compiler with ``given``."""
    m = _XLA_UNKNOWN.search(stderr)
    if m:
        flag = m.group(2).strip()
        return (f"{m.group(1)}: XLA does not know the flag {flag} (it refuses to start with it); correct or "
                "remove it")
    m = _LIBTPU_UNKNOWN.search(stderr)
    if m:
        flag = m.group(1)
        return f"{_where(flag, given)}: libtpu does not know the flag --{flag} (it refuses to start with it); " \
               "correct or remove it"
    m = re.search(r"xla-harness-probe: backend: (.+)", stderr)
    if m:
        shown = given.get("JAX_PLATFORMS", "")
        return f"JAX_PLATFORMS={shown}: jax cannot start that backend ({m.group(1).strip()[:300]})"
    lines = [ln for ln in stderr.strip().splitlines() if ln.strip()]
    last = lines[-1].strip()[:300] if lines else f"exit {returncode}"
    set_vars = ", ".join(f"{k}={v}" for k, v in given.items() if v)
    return f"the compiler did not start with {set_vars}: {last}"


def check_compiler_environment(target: Target) -> None:
    """Start the backend and ``target``'s compiler in a child with this environment's ``XLA_FLAGS``,
    ``LIBTPU_INIT_ARGS`` and ``JAX_PLATFORMS``; HarnessError with what it died of. Nothing when none is
    set, when a backend already started in this process (the variables were read then) or when the same
    settings were tried before."""
    given = {k: os.environ.get(k, "") for k in VARIABLES}
    if not needs_trying(given) or _backends_started():
        return
    key = (tuple(sorted(given.items())), target.text)
    if key in _checked:
        return
    from xla_harness.runtime import subproc
    from xla_harness.runtime.resources import import_root

    env = {**os.environ, "PYTHONPATH": str(import_root()) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    try:
        done = subproc.run([sys.executable, "-c", _PROBE, target.text], capture_output=True, text=True,
                           timeout=PROBE_TIMEOUT_S, env=env, stdin=subprocess.DEVNULL,
                           what="the compiler start-up check")
    except subproc.ChildTimeout:
        return  # a start-up that takes this long says nothing about the flags; the command goes on
    if done.returncode != 0:
        raise HarnessError(explain(done.stderr or "", done.returncode, given))
    _checked.add(key)
