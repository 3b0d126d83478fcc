"""One bisection probe in a fresh process: ``python -m harness.repro.probe '<json task>'``.

Task keys: action ("passes" | "probe"), program ("tied-embedding" | "small"), model sizes,
oracle ("hlo" | "stress"), property, disabled (list), steps, seed, inject ([pass, rate]).
Prints one JSON line. A compiler crash ends this process, not the bisection.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import tempfile
from pathlib import Path


def _lowered(task: dict):
    import jax
    import jax.numpy as jnp
    import numpy as np

    if task.get("program") == "small":
        f = jax.jit(lambda w, x: jnp.tanh(w * 2.0 + 1.0).sum() + (x @ w).sum() + jnp.exp(w).max())
        return f.lower(jnp.ones((64, 32)), jnp.ones((4, 64))), None
    from harness.stress.runner import StressSpec, build_program

    spec = StressSpec(**task["spec"])
    prog = build_program(spec.configs()[0], spec)
    p, o = prog.init(task.get("seed", 1))
    return prog.step.lower(p, o, np.uint32(task.get("seed", 1)), np.int32(0)), (prog, spec, p, o)


def main() -> int:
    from harness.repro.bisect import compile_options, count_property, passes_from_dump

    task = json.loads(sys.argv[1])
    disabled = frozenset(task.get("disabled", []))
    if task["action"] == "passes":
        lowered, _ = _lowered(task)
        with tempfile.TemporaryDirectory(prefix="xla-harness-passes-") as d:
            lowered.compile(compiler_options={"xla_dump_to": d, "xla_dump_hlo_pass_re": ".*"})
            print(json.dumps({"passes": passes_from_dump([p.name for p in Path(d).iterdir()])}))
        return 0
    if task.get("oracle", "hlo") == "hlo":
        lowered, _ = _lowered(task)
        n = count_property(lowered.compile(compiler_options=compile_options(disabled)).as_text(), task["property"])
        print(json.dumps({"failing": n > 0, "detail": f"{n} x {task['property']}"}))
        return 0
    # Stress oracle: train until a non-finite update or the step budget.
    import jax
    import numpy as np

    from harness.stress.runner import StressSpec, build_program

    spec = StressSpec(**task["spec"])
    inject = task.get("inject")
    if inject:
        spec = dataclasses.replace(spec, inject_nan_rate=inject[1] if inject[0] not in disabled else 0.0)
    prog = build_program(spec.configs()[0], spec)
    seed = task.get("seed", 1)
    p, o = prog.init(seed)
    step = prog.step.lower(p, o, np.uint32(seed), np.int32(0)).compile(compiler_options=compile_options(disabled))
    steps = int(task["steps"])
    bad = 0
    for s in range(steps):
        p, o, fl = step(p, o, np.uint32(seed), np.int32(s))
        if not bool(jax.device_get(fl.loss_ok & fl.grads_ok.all() & fl.updates_ok.all())):
            bad += 1
            if not task.get("count"):
                print(json.dumps({"failing": True, "detail": f"non-finite at step {s} (of up to {steps})"}))
                return 0
    print(json.dumps({"failing": bad > 0, "nonfinite": bad, "steps": steps,
                      "detail": f"{bad} non-finite in {steps} steps"}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
