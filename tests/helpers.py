"""Small shared settings for the tests: a tiny model that compiles in about a second, a user's
program file the harness has never seen, and `git am` of a PR bundle's mbox onto a patch's
pre-images."""

import subprocess
from pathlib import Path

TINY = dict(vocab=64, d_model=32, layers=1, heads=2, seq=8, batch=8)
TINY_ARGS = ["--vocab", "64", "--d-model", "32", "--layers", "1", "--heads", "2", "--seq", "8",
             "--batch", "8"]

# A user's program the harness has never seen: its own model, optimizer and a NaN planted by
# its own randomness (a "poison" draw in its batch). `make` plants it at rate `poison` and takes
# no variant; `make_variants` takes variant=: its baseline plants it at rate 0.4, any other
# program variant (as "barrier", standing for a workaround) removes it.
FOREIGN_PROGRAM = '''
import jax
import jax.numpy as jnp
import optax

from xla_harness.programs.interface import TrainProgram, step_from_loss


def make(width=8, poison=0.25):
    opt = optax.sgd(0.1)

    def init(key):
        params = {"w": jax.random.normal(key, (4, width)), "v": jnp.zeros((width,))}
        return params, opt.init(params)

    def batch(key, step):
        kx, kp = jax.random.split(key)
        return {"x": jax.random.normal(kx, (16, 4)), "poison": jax.random.uniform(kp) < poison}

    def loss(params, b):
        y = jnp.tanh(b["x"] @ params["w"]) @ params["v"]
        return jnp.mean((y - 1.0) ** 2) + jnp.where(b["poison"], jnp.nan, 0.0)

    return TrainProgram(name="foreign", init=init, batch=batch, step=step_from_loss(loss, opt),
                        options={"width": width})


def make_variants(width=8, variant="baseline"):
    return make(width, poison=0.4 if variant == "baseline" else 0.0)
'''


def git_am(patch_text: str, mbox: Path, repo: Path) -> subprocess.CompletedProcess:
    """`git am` the mbox onto a fresh repository holding the pre-images of ``patch_text``."""
    from xla_harness.upstream.patchfile import preimage_tree

    preimage_tree(patch_text, repo)
    ident = ["-c", "user.email=t@t", "-c", "user.name=t"]
    for argv in (["init", "-q"], ["add", "-A"], [*ident, "commit", "-qm", "base"]):
        subprocess.run(["git", *argv], cwd=repo, check=True)
    return subprocess.run(["git", *ident, "am", str(mbox)], cwd=repo, capture_output=True, text=True)


def process_gone(pid: int, limit: float = 10.0) -> bool:
    """Whether ``pid`` is dead, or a zombie left for its parent or init to reap, within ``limit`` s."""
    import os
    import time

    deadline = time.monotonic() + limit
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except FileNotFoundError:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)  # polling a pid, not timing anything


def grandchild_pid(pidfile: Path, limit: float = 30.0) -> int:
    """The pid a planted child's grandchild wrote to ``pidfile`` (waited for up to ``limit`` seconds)."""
    import time

    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        text = pidfile.read_text().strip() if pidfile.exists() else ""
        if text:
            return int(text)
        time.sleep(0.05)
    raise AssertionError("the planted child never wrote its grandchild's pid")


def planted_child(pidfile: Path, ignore_term: bool) -> list[str]:
    """sh starting a grandchild that sleeps forever, writing its pid, then sleeping itself."""
    grandchild = "(trap '' TERM; exec sleep 1000)" if ignore_term else "sleep 1000"
    return ["sh", "-c", f"{grandchild} & echo $! > {pidfile}; sleep 1000"]
