"""The stress matrix a run measures (:class:`StressSpec`) and the program of each of its
configurations (:func:`build`)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from xla_harness.errors import HarnessError
from xla_harness.names import BUILTIN_PROGRAM, COMMITS, INJECT_KINDS, PROTOCOLS
from xla_harness.programs.interface import TrainProgram, load_program, program_factory
from xla_harness.programs.tied_embedding import DTYPES, MODES, ModelConfig
from xla_harness.programs.variants import parse_variant, variant_program
from xla_harness.stress.results import records


@dataclass(frozen=True)
class StressSpec:
    """A stress matrix: every configuration x every seed, ``steps`` calls each.

    With the built-in program the configurations are (mode x remat) of the tied-embedding
    model at the given sizes; any other ``program`` is one configuration built with
    ``program_options``. ``variants`` (workaround variants and compiler-flag sets of
    :mod:`xla_harness.programs.variants`, ``baseline`` first) multiply every configuration: each
    is compiled separately and its rows are compared with the baseline's.

    ``commit`` (train protocol): ``block`` feeds the step's outputs straight back, writes a row per step on
    the device and fetches them once per block of ``block`` steps (None: chosen from the observed cost and
    failure rate); ``step`` checks and commits every step. Both count a step by its first execution from a
    finite state and roll back a step whose new state is not finite. In the per-step protocols ``block`` is
    the number of steps per host sync (None: 10).
    """

    modes: tuple[str, ...] = MODES
    remats: tuple[bool, ...] = (True, False)
    seeds: tuple[int, ...] = (1, 2, 3, 4)
    steps: int = 20
    dtype: str = "f32"
    devices: int = 1
    inject_rate: float = 0.0
    inject: str = "nan"
    reference: bool = False
    reference_every: int = 1
    block: int | None = None
    learning_rate: float = 1e-3
    vocab: int = 256
    d_model: int = 64
    layers: int = 2
    heads: int = 4
    seq: int = 16
    batch: int = 8
    program: str = BUILTIN_PROGRAM
    program_options: tuple[tuple[str, object], ...] = ()
    protocol: str = "train"
    checkpoint_seconds: float = 300.0
    variants: tuple[str, ...] = ()
    commit: str = "block"

    def __post_init__(self) -> None:
        self._check_matrix()
        self._check_variants()
        for name in ("steps", "devices", "block", "reference_every"):
            if getattr(self, name) is not None and getattr(self, name) <= 0:
                raise HarnessError(f"{name} must be a positive integer, got {getattr(self, name)}")
        if not 0.0 <= self.inject_rate <= 1.0:
            raise HarnessError(f"inject-rate must be in [0, 1], got {self.inject_rate}")
        for name, value, allowed in (("injection", self.inject, INJECT_KINDS),
                                     ("protocol", self.protocol, PROTOCOLS), ("commit", self.commit, COMMITS)):
            if value not in allowed:
                raise HarnessError(f"unknown {name} {value!r}; expected one of {', '.join(allowed)}")
        if not (isinstance(self.checkpoint_seconds, int | float) and math.isfinite(self.checkpoint_seconds)
                and self.checkpoint_seconds >= 0):
            raise HarnessError(f"checkpoint-seconds must be a finite number of seconds >= 0, got "
                               f"{self.checkpoint_seconds!r}")
        if not (self.learning_rate > 0 and math.isfinite(self.learning_rate)):
            raise HarnessError(f"learning rate must be a positive finite number, got {self.learning_rate!r}")
        if self.program == BUILTIN_PROGRAM:
            for opts in self.configs():
                ModelConfig(**{k: v for k, v in opts.items() if k not in ("devices", "learning_rate", "variant")})
            if self.devices > 1 and (self.vocab % self.devices or self.batch % self.devices):
                raise HarnessError(f"with --devices {self.devices}, vocab ({self.vocab}) and batch "
                                   f"({self.batch}) must be divisible by {self.devices}")

    def _check_matrix(self) -> None:
        if not self.modes:
            raise HarnessError("no modes given")
        for m in self.modes:
            if m not in MODES:
                raise HarnessError(f"unknown mode {m!r}; expected one of {', '.join(MODES)}")
        if self.dtype not in DTYPES:
            raise HarnessError(f"unknown dtype {self.dtype!r}; expected one of {', '.join(DTYPES)}")
        if not self.remats:
            raise HarnessError("no remat setting given")
        if not self.seeds:
            raise HarnessError("no seeds given")
        if len(set(self.seeds)) != len(self.seeds):
            raise HarnessError("seeds must be distinct")
        if any(s < 0 or s >= 2**31 for s in self.seeds):
            raise HarnessError("seeds must be integers in [0, 2**31)")

    def _check_variants(self) -> None:
        if not self.variants:
            return
        if len(set(self.variants)) != len(self.variants):
            raise HarnessError("variants must be distinct")
        if self.variants[0] != "baseline":
            raise HarnessError("the variants list must start with baseline (every variant is compared with it), "
                               f"got {','.join(self.variants)}")
        parsed = [parse_variant(name) for name in self.variants]
        if "variant" in dict(self.program_options):
            raise HarnessError("--program-option variant=... and --variants exclude each other")
        if "precision" in dict(self.program_options) and any(p != "default" for _, p, _ in parsed):
            raise HarnessError("--program-option precision=... and a precision-... variant exclude each other")

    def configs(self) -> list[dict]:
        """The program options of every configuration of the matrix (with ``variant`` in a
        variants run: the name :func:`build` applies)."""
        if self.program != BUILTIN_PROGRAM:
            base = [dict(self.program_options)]
        else:
            base = [{"mode": m, "remat": r, "dtype": self.dtype, "vocab": self.vocab, "d_model": self.d_model,
                     "layers": self.layers, "heads": self.heads, "seq": self.seq, "batch": self.batch,
                     "devices": self.devices, "learning_rate": self.learning_rate}
                    for m in self.modes for r in self.remats]
        if not self.variants:
            return base
        return [{**c, "variant": v} for c in base for v in self.variants]

    def label(self, options: dict) -> str:
        """The row label of one configuration (the built-in's ``mode/remat=../dtype``)."""
        return records.label(options, self.program)

    def labels(self) -> list[str]:
        return [self.label(o) for o in self.configs()]

    def to_dict(self) -> dict:
        d = asdict(self)
        d["program_options"] = dict(self.program_options)
        if not self.variants:  # results written before variants existed keep their spec
            del d["variants"]
        return records.own_spec({k: list(v) if isinstance(v, tuple) else v for k, v in d.items()})

    @classmethod
    def from_dict(cls, d: dict) -> StressSpec:
        d = dict(d)
        d.pop("jax_config", None)  # recorded beside the options (provenance.with_jax_settings), not one of them
        d["program_options"] = tuple(sorted((d.get("program_options") or {}).items()))
        d = {k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}
        return cls(**d)


def build(spec: StressSpec, options: dict) -> TrainProgram:
    """The TrainProgram of one configuration (under its ``variant``, if it names one)."""
    if not spec.variants:
        return load_program(spec.program, **options)
    rest = {k: v for k, v in options.items() if k != "variant"}
    return variant_program(program_factory(spec.program), options["variant"], **rest)
