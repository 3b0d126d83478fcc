"""One bisection probe in a fresh process: ``python -m xla_harness.repro.probe '<json task>'``.

Task keys: action ("passes" | "probe"), program ("small" or a --program spec), options (its
keyword options), oracle ("hlo" | "stress"), property, disabled (list), steps, seed,
inject ([pass, rate]). Prints one JSON line. A compiler crash ends this process, not the bisection.
"""

from __future__ import annotations

import json
import sys
import tempfile
from dataclasses import replace
from pathlib import Path


def _harnessed(task: dict, inject_rate: float = 0.0):
    from xla_harness.stress.device.inject import step_keys
    from xla_harness.stress.runner import initial_state, prepare
    from xla_harness.stress.spec import StressSpec

    spec = StressSpec(program=task["program"], program_options=tuple(sorted(task.get("options", {}).items())),
                      seeds=(task.get("seed", 1),), steps=max(1, int(task.get("steps", 1))),
                      inject_rate=inject_rate, block=1, commit="step")  # stops at the first bad step
    h = prepare(spec, dict(task.get("options", {})))
    state = initial_state(h, task.get("seed", 1))
    batch = h.program.batch(step_keys(task.get("seed", 1), 0)[0], 0)
    return h, state, h.jitted.lower(state.params, state.opt_state, batch)


def _target_lowered(task: dict, target):
    """The task's step lowered for an ahead-of-time target (abstract state on its devices)."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import SingleDeviceSharding

    from xla_harness.stress.compile_only.run import build_for_target
    from xla_harness.stress.spec import StressSpec
    from xla_harness.targets.compile import lower_step
    from xla_harness.targets.devices import target_devices

    devices = target_devices(target)
    if task.get("program") == "small":
        f = jax.jit(lambda w, x: jnp.tanh(w * 2.0 + 1.0).sum() + (x @ w).sum() + jnp.exp(w).max())
        one = SingleDeviceSharding(devices[0])
        return f.lower(jax.ShapeDtypeStruct((64, 32), jnp.float32, sharding=one),
                       jax.ShapeDtypeStruct((4, 64), jnp.float32, sharding=one))
    options = dict(task.get("options", {}))
    spec = StressSpec(program=task["program"], program_options=tuple(sorted(options.items())))
    program = build_for_target(spec, options, devices, target)
    return lower_step(program, target, devices, task["program"])


def _lowered(task: dict):
    import jax
    import jax.numpy as jnp

    from xla_harness.targets import parse_target

    target = parse_target(task.get("target", "host"))
    if not target.is_host:
        return _target_lowered(task, target)
    if task.get("program") == "small":
        f = jax.jit(lambda w, x: jnp.tanh(w * 2.0 + 1.0).sum() + (x @ w).sum() + jnp.exp(w).max())
        return f.lower(jnp.ones((64, 32)), jnp.ones((4, 64)))
    return _harnessed(task)[2]


def main() -> int:
    from xla_harness.targets import parse_target
    from xla_harness.targets.devices import prepare_environment

    task = json.loads(sys.argv[1])
    prepare_environment(parse_target(task.get("target", "host")))  # before jax is imported

    from xla_harness.repro.bisect import compile_options, count_property, passes_from_dump
    from xla_harness.stress.runner import run_config
    disabled = frozenset(task.get("disabled", []))
    if task["action"] == "passes":
        with tempfile.TemporaryDirectory(prefix="xla-harness-passes-") as d:
            _lowered(task).compile(compiler_options={"xla_dump_to": d, "xla_dump_hlo_pass_re": ".*"})
            print(json.dumps({"passes": passes_from_dump([p.name for p in Path(d).iterdir()])}))
        return 0
    if task.get("oracle", "hlo") == "hlo":
        n = count_property(_lowered(task).compile(compiler_options=compile_options(disabled)).as_text(),
                           task["property"])
        print(json.dumps({"failing": n > 0, "detail": f"{n} x {task['property']}"}))
        return 0
    # Stress oracle: the user's step compiled with the passes disabled, checked outside, until a
    # non-finite step or the step budget. A planted fault (test oracle) fires while its pass is enabled.
    inject = task.get("inject")
    rate = inject[1] if inject and inject[0] not in disabled else 0.0
    h, state, lowered = _harnessed(task, rate)
    h = replace(h, step=lowered.compile(compiler_options=compile_options(disabled)))
    steps = int(task["steps"])
    bad = 0
    for block in run_config(h, task.get("seed", 1), state, steps=steps):
        for r in block.records:
            if not r.finite:
                bad += 1
                if not task.get("count"):
                    print(json.dumps({"failing": True, "detail": f"non-finite at step {r.step} (of up to {steps})"}))
                    return 0
    print(json.dumps({"failing": bad > 0, "nonfinite": bad, "steps": steps,
                      "detail": f"{bad} non-finite in {steps} steps"}))
    return 0


def guarded_main() -> int:
    """:func:`main`, with a refusal (a program, option or target that is wrong) as one ``error:`` line and
    exit 2, which the bisection passes on; anything else (a compiler crash) ends the process as it will."""
    from xla_harness.errors import HarnessError

    try:
        return main()
    except HarnessError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2


if __name__ == "__main__":
    raise SystemExit(guarded_main())
