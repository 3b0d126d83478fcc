#!/usr/bin/env python3
"""Standalone reproducer for a user's training program: non-finite step counts.

    python repro.py [--json] [--config FILE]     # default: config.json beside this file

Loads the bundled program (``program/`` beside the config: the program's own source and the
few harness files that define the TrainProgram interface, so the harness need not be
installed), jits the user's step exactly as the user does (its donation, its jit options),
checks each step's outputs in a separate jitted function, rolls parameters and optimizer
state back after a non-finite step, and prints per seed the non-finite steps and every loss.
Batches and initial states use the keys of ``xla-harness stress`` (train protocol).

This file is a module of xla-harness (xla_harness/repro/standalone_program.py), copied verbatim
into bundles of user programs as repro.py. Needs jax, numpy and what the program imports.
"""

import json
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np


def _floating(x):
    return jnp.issubdtype(x.dtype, jnp.floating)


@jax.jit
def _check(new_p, new_o, aux):
    ok = jnp.all(jnp.isfinite(aux["loss"]))
    for x in jax.tree.leaves((new_p, new_o)):
        if _floating(x):
            ok = ok & jnp.all(jnp.isfinite(x))
    return ok, jnp.asarray(aux["loss"], jnp.float32)


_copy = jax.jit(lambda t: jax.tree.map(lambda x: x + jnp.zeros((), x.dtype) if _floating(x) else x * 1, t))


@jax.jit
def _keys(seed, step):
    return jax.random.split(jax.random.fold_in(jax.random.key(seed), step))


def bundled_spec(spec: str, source: Path, builtins: dict) -> str:
    """The --program spec of the bundled source: a built-in whose module file lies under ``source``,
    or FILE.py:NAME with FILE.py in ``source``, as a path. Anything else (a module of this machine,
    a path out of the folder) ends the run: only the bundled program is run."""
    if spec in builtins:
        module = builtins[spec].partition(":")[0]
        if module.startswith("xla_harness.programs.") and (source / (module.replace(".", "/") + ".py")).is_file():
            return spec
    else:
        file, sep, attr = spec.partition(":")
        if (sep and file.endswith(".py") and file == Path(file).name and attr.isidentifier()
                and (source / file).is_file()):
            return f"{source / file}:{attr}"
    raise SystemExit(f"repro.py: config.json program {spec!r} is not a program bundled in {source}")


def load(cfg: dict, folder: Path):
    """The configured TrainProgram, imported from ``folder/program`` and nowhere else."""
    source = (folder / "program").resolve()
    sys.path.insert(0, str(source))
    from xla_harness.programs import interface

    if not Path(interface.__file__).resolve().is_relative_to(source):
        raise SystemExit(f"repro.py: the TrainProgram interface did not load from {source}")
    return interface.load_program(bundled_spec(cfg["program"], source, interface.BUILTINS), **cfg["options"])


def run(cfg: dict, folder: Path) -> dict:
    program = load(cfg, folder)
    step = jax.jit(program.step, donate_argnums=tuple(program.donate_argnums), **program.jit_kwargs)
    seeds: dict[str, dict] = {}
    out = {"jax": jax.__version__, "backend": jax.default_backend(), "seeds": seeds}
    for seed in cfg["seeds"]:
        p, o = program.init(jax.random.key(seed))
        nonfinite, losses = 0, []
        for i in range(cfg["steps"]):
            backup = _copy((p, o))  # outside the step: the step's own buffers are donated as in training
            batch = program.batch(_keys(np.uint32(seed), np.int32(i))[0], i)
            new_p, new_o, aux = step(p, o, batch)
            ok, loss = _check(new_p, new_o, aux)
            if bool(ok):
                p, o = new_p, new_o
            else:  # roll back: the previous state is kept, so one event counts once
                p, o = backup
                nonfinite += 1
            losses.append(float(loss))
        seeds[str(seed)] = {"nonfinite": nonfinite, "losses": losses}
    return out


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    path = Path(__file__).parent / "config.json"
    if "--config" in argv:
        path = Path(argv[argv.index("--config") + 1])
    cfg = json.loads(path.read_text())
    out = run(cfg, path.resolve().parent)
    if "--json" in argv:
        print(json.dumps(out))
    else:
        for s, r in out["seeds"].items():
            print(f"seed {s}: {r['nonfinite']}/{cfg['steps']} non-finite steps")


if __name__ == "__main__":
    main()
