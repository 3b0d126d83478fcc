"""Run gradcheck cases: modes eager, jit, vjp, jvp; oracles analytic, float64 central finite
differences, J^T consistency; verdicts OK / NaN / WRONG / NONDET.

The gradient in each mode is the JAX adapter's (``frameworks/jax_adapter.gradient``); this module
holds the oracles, the comparison and the verdict table."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

import jax
import jax.numpy as jnp
import numpy as np

from xla_harness.errors import HarnessError
from xla_harness.gradcheck.cases import REGISTRY, Case
from xla_harness.gradcheck.frameworks.jax_adapter import MODES, bind, gradient
from xla_harness.jaxcompat import enable_x64
from xla_harness.table import format_rows

RTOL, ATOL = 2e-3, 1e-5  # float32 gradients vs float64 references
FD_STEP = 1e-6


def finite_differences(case: Case, x: np.ndarray) -> np.ndarray:
    with enable_x64():
        F = jax.vmap(bind(case))
        xs = jnp.asarray(x, jnp.float64)
        h = jnp.asarray(FD_STEP * np.maximum(np.abs(x), 1e-3))  # relative step, float64
        return np.asarray((F(xs + h) - F(xs - h)) / (2 * h))


def transpose_consistency(case: Case, x: np.ndarray, seed: int = 0) -> float:
    """| <u, J v> - <J^T u, v> | relative to their size, in float64."""
    if not case.reverse:
        return 0.0
    rng = np.random.default_rng(seed)
    u, v = rng.normal(size=x.shape), rng.normal(size=x.shape)
    with enable_x64():
        F = jax.vmap(bind(case))
        xs = jnp.asarray(x, jnp.float64)
        jv = np.asarray(jax.jvp(F, (xs,), (jnp.asarray(v),))[1])
        jtu = np.asarray(jax.vjp(F, xs)[1](jnp.asarray(u))[0])
    a, b = float(np.dot(u, jv)), float(np.dot(jtu, v))
    if not (np.isfinite(a) and np.isfinite(b)):
        return float("nan")
    return abs(a - b) / max(1.0, abs(a), abs(b))


@dataclass
class Verdict:
    case: str
    kind: str
    mode: str
    status: str  # OK | NaN | WRONG | NONDET | SKIP
    got: list = field(default_factory=list)
    want: list = field(default_factory=list)
    detail: str = ""


def compare(got: np.ndarray, want: np.ndarray, mask: np.ndarray) -> tuple[str, str]:
    if not np.all(np.isfinite(got[mask])):
        return "NaN", "non-finite gradient where a finite one is expected"
    if not np.allclose(got[mask], want[mask], rtol=RTOL, atol=ATOL):
        return "WRONG", "differs from the reference"
    return "OK", ""


def check_case(case: Case, modes: tuple[str, ...] = MODES) -> list[Verdict]:
    x = np.asarray(case.points, np.float64)
    out: list[Verdict] = []
    fd = finite_differences(case, x)
    smooth = np.asarray(case.smooth if case.smooth else (True,) * len(x))
    want = np.asarray(case.expected, np.float64) if case.expected is not None else fd
    mask = np.ones(len(x), bool) if case.expected is not None else smooth
    for mode in modes:
        if mode in ("eager", "jit", "vjp") and not case.reverse:
            out.append(Verdict(case.name, case.kind, mode, "SKIP", detail="reverse mode not defined"))
            continue
        try:
            got = gradient(case, mode, x)
        except Exception as exc:  # a failing transformation is a finding, not a crash
            out.append(Verdict(case.name, case.kind, mode, "WRONG", detail=f"raised {type(exc).__name__}: {exc}"[:200]))
            continue
        status, detail = compare(got, want, mask)
        if status == "OK" and case.expected is not None and np.any(smooth):
            fd_status, _ = compare(got, fd, smooth)  # the analytic answer must agree with FD too
            if fd_status != "OK":
                status, detail = fd_status, "differs from finite differences"
        out.append(Verdict(case.name, case.kind, mode, status, got.tolist(), want.tolist(), detail))
    if case.second_order is not None and case.reverse:
        xs = jnp.asarray(x, jnp.float32)
        got2 = np.asarray(jax.vmap(jax.grad(jax.grad(bind(case))))(xs))
        status, detail = compare(got2, np.asarray(case.second_order), np.ones(len(x), bool))
        out.append(Verdict(case.name, case.kind, "grad2", status, got2.tolist(), list(case.second_order), detail))
    err = transpose_consistency(case, x[smooth]) if np.any(smooth) else 0.0
    if not (err <= 1e-9):
        out.append(Verdict(case.name, case.kind, "J^T", "WRONG" if np.isfinite(err) else "NaN",
                           detail=f"<u, Jv> vs <J^T u, v> relative difference {err:.2e}"))
    return out


def check_determinism() -> list[Verdict]:
    """Bitwise repeatability of a jitted step and of jax.random; scatter-add with duplicate
    indices is reported NONDET (allowed on GPU), not as a bug."""
    out = []
    step = jax.jit(lambda w, x: jnp.tanh(x @ w).sum(0) @ w.T)
    k1, k2 = jax.random.split(jax.random.key(0))
    w, x = jax.random.normal(k1, (64, 64)), jax.random.normal(k2, (32, 64))
    a, b = np.asarray(step(w, x)), np.asarray(step(w, x))
    out.append(Verdict("jit_step_twice", "determinism", "jit", "OK" if np.array_equal(a, b) else "NONDET"))
    r1 = np.asarray(jax.random.normal(jax.random.key(42), (8,)))
    r2 = np.asarray(jax.random.normal(jax.random.key(42), (8,)))
    out.append(Verdict("random_key_reproducible", "determinism", "eager",
                       "OK" if np.array_equal(r1, r2) else "WRONG"))
    idx = jnp.asarray(np.random.default_rng(0).integers(0, 4, 4096))
    vals = jax.random.normal(jax.random.key(1), (4096,))
    scat = jax.jit(lambda v: jnp.zeros(4).at[idx].add(v))
    runs = [np.asarray(scat(vals)) for _ in range(5)]
    same = all(np.array_equal(runs[0], r) for r in runs[1:])
    out.append(Verdict("scatter_add_duplicates", "determinism", "jit", "OK" if same else "NONDET",
                       detail="" if same else "results differ between runs (expected on GPU)"))
    return out


def select(names: list[str] | None) -> list[Case]:
    """The cases named (exact names or prefixes), all when ``names`` is empty."""
    if not names:
        return list(REGISTRY)
    unknown = [n for n in names if not any(c.name.startswith(n) for c in REGISTRY)]
    if unknown:
        raise HarnessError(f"unknown gradcheck case {unknown[0]!r} (see xla-harness gradcheck --list)")
    return [c for c in REGISTRY if any(c.name.startswith(n) for n in names)]


def run(names: list[str] | None = None, modes: tuple[str, ...] = MODES, determinism: bool = True) -> list[Verdict]:
    for m in modes:
        if m not in MODES:
            raise HarnessError(f"unknown mode {m!r}; expected one of {', '.join(MODES)}")
    cases = select(names)
    if not any(c.reverse or m not in ("eager", "jit", "vjp") for c in cases for m in modes):
        # every cell would be SKIP: a run that checks nothing is not a pass
        raise HarnessError(f"nothing to check: the cases selected ({', '.join(c.name for c in cases)}) define "
                           f"no gradient in mode {', '.join(modes)} (forward-only cases run in jvp alone)")
    out = []
    for c in cases:
        out.extend(check_case(c, modes))
    if determinism and not names:
        out.extend(check_determinism())
    return out


def table(verdicts: list[Verdict]) -> str:
    """case x mode -> status, one row per case."""
    rows: dict[str, dict[str, str]] = {}
    cols: list[str] = []
    for v in verdicts:
        rows.setdefault(v.case, {})[v.mode] = v.status
        if v.mode not in cols:
            cols.append(v.mode)
    text = format_rows([[c, *(rows[c].get(m, "") for m in cols)] for c in rows], header=["case", *cols])
    bad = [v for v in verdicts if v.status in ("NaN", "WRONG")]
    text.append(f"{len(rows)} cases, {len(bad)} failing checks, "
                f"{sum(v.status == 'NONDET' for v in verdicts)} nondeterministic")
    return "\n".join(text)


def to_json(verdicts: list[Verdict]) -> str:
    return json.dumps({"jax": jax.__version__, "backend": jax.default_backend(),
                       "verdicts": [asdict(v) for v in verdicts]}, indent=2)
