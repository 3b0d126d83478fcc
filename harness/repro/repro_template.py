"""Text of the repro.py put into repro bundles.

It loads the bundled program (``program/``: the program's own source and the few harness
files that define the TrainProgram interface, so the harness need not be installed), jits
the user's step exactly as the user does, checks each step's outputs in a separate jitted
function, rolls back parameters and optimizer state after a non-finite step, and prints
JSON: per seed, non-finite steps and every loss. Batches and initial states use the same
keys as ``xla-harness stress`` (train protocol), so the numbers match its results.
"""

REPRO = r'''#!/usr/bin/env python3
"""Standalone reproducer: the bundled training program, non-finite step counts.

    python repro.py [--json]          # uses config.json and program/ beside this file
Needs jax, numpy and what the program imports. Prints per seed: non-finite steps and losses.
"""
import json, sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "program"))

import jax
import jax.numpy as jnp
import numpy as np

from harness.programs.interface import load_program

CFG = json.loads((HERE / "config.json").read_text())
spec = CFG["program"]
if spec.partition(":")[0].endswith(".py"):
    spec = str(HERE / "program" / spec)
PROGRAM = load_program(spec, **CFG["options"])
STEP = jax.jit(PROGRAM.step, donate_argnums=tuple(PROGRAM.donate_argnums), **PROGRAM.jit_kwargs)


def floating(x):
    return jnp.issubdtype(x.dtype, jnp.floating)


@jax.jit
def check(new_p, new_o, aux):
    leaves = [x for x in jax.tree.leaves((new_p, new_o)) if floating(x)]
    ok = jnp.all(jnp.isfinite(aux["loss"]))
    for x in leaves:
        ok = ok & jnp.all(jnp.isfinite(x))
    return ok, jnp.asarray(aux["loss"], jnp.float32)


copy = jax.jit(lambda t: jax.tree.map(lambda x: x + jnp.zeros((), x.dtype) if floating(x) else x * 1, t))


def keys(seed, step):
    return jax.random.split(jax.random.fold_in(jax.random.key(seed), step))


def main():
    out = {"jax": jax.__version__, "backend": jax.default_backend(), "seeds": {}}
    for seed in CFG["seeds"]:
        p, o = PROGRAM.init(jax.random.key(seed))
        oks, losses = [], []
        for i in range(CFG["steps"]):
            backup = copy((p, o))
            batch = PROGRAM.batch(keys(np.uint32(seed), np.int32(i))[0], i)
            new_p, new_o, aux = STEP(p, o, batch)
            ok, loss = check(new_p, new_o, aux)
            good = bool(ok)
            p, o = (new_p, new_o) if good else backup
            oks.append(good)
            losses.append(float(loss))
        out["seeds"][str(seed)] = {"nonfinite": int(sum(not x for x in oks)),
                                   "losses": [x if np.isfinite(x) else None for x in losses]}
    if "--json" in sys.argv:
        print(json.dumps(out))
    else:
        for s, r in out["seeds"].items():
            print(f"seed {s}: {r['nonfinite']}/{CFG['steps']} non-finite steps")


if __name__ == "__main__":
    main()
'''
