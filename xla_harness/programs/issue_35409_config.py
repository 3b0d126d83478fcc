"""The jax-ml/jax#35409 preset's configuration (:mod:`xla_harness.programs.issue_35409` is the
program): the report's sizes, each option's levels (modes, dtypes, spec sets, axis types, jit
placements), the partition-spec tables (:data:`REPORT_SPECS`, the report's; :data:`SPECS`, the
preset's earlier reading), :class:`PresetConfig` and :func:`scaled_config` (the report's sizes times
``scale``, rounded to what the heads and the mesh need), and :func:`parse_embed_spec` (W's spec).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from xla_harness.errors import HarnessError
from xla_harness.programs.precision import check_precision

MODES = ("full", "sparse_only", "dense_only")
DTYPES = ("f32", "bf16")

# The report's sizes.
USED_LAYERS, TOTAL_LAYERS = 6, 16
D_MODEL, FFN, HEADS, KV_HEADS, VOCAB = 2048, 8192, 16, 16, 100352
B1, T1, B2, T2 = 512, 32, 16, 1024
LR = 1e-6

SPEC_SETS = ("report", "ours")
AXIS_TYPES = ("auto", "explicit")
JIT_PLACEMENTS = ("step", "bare", "nested")
MESH_AXES = ("model", "data")
DEFAULT_EMBED_SPEC = ("model", "data")

# specs="report": the report's partition specs (axis names of the 2-D mesh). The report does not
# show the embedding's or the norms' specs: W ("model", "data") and replicated norms are guesses.
REPORT_SPECS = {
    "embed": ("model", "data"),
    "wq": ("model", "data"),  # (HEADS, hd, D): heads over "model", hd over "data", D whole
    "wk": ("model", "data"),
    "wv": ("model", "data"),
    "wo": ("data", "model"),  # (D, HEADS, hd)
    "wg": ("model", "data"),  # (FFN, D)
    "wu": ("model", "data"),
    "wd": ("data", "model"),  # (D, FFN)
    "norm1": (None,),
    "norm2": (None,),
    "final_norm": (None,),
}

# specs="ours": the preset's earlier specs (q/k/v with D over "data" instead of hd), kept so that
# results taken with them stay reproducible.
SPECS = {
    "embed": ("model", "data"),
    "wq": ("model", None, "data"),
    "wk": ("model", None, "data"),
    "wv": ("model", None, "data"),
    "wo": ("data", "model", None),
    "wg": ("model", "data"),
    "wu": ("model", "data"),
    "wd": ("data", "model"),
    "norm1": (None,),
    "norm2": (None,),
    "final_norm": (None,),
}

SPEC_TABLES = {"report": REPORT_SPECS, "ours": SPECS}


@dataclass(frozen=True)
class PresetConfig:
    mode: str = "full"
    remat: bool = True
    dtype: str = "f32"
    d_model: int = D_MODEL
    ffn: int = FFN
    vocab: int = VOCAB
    heads: int = HEADS
    kv_heads: int = KV_HEADS
    used_layers: int = USED_LAYERS
    total_layers: int = TOTAL_LAYERS
    batches: tuple[tuple[int, int], ...] = ((B1, T1), (B2, T2))
    lr: float = LR
    mesh_shape: tuple[int, int] = (1, 1)  # ("model", "data")
    variant: str = "baseline"
    specs: str = "report"  # a key of SPEC_TABLES
    axis_types: str = "auto"  # the mesh's axis types: "auto" or "explicit"
    embed_spec: tuple[str | None, str | None] = DEFAULT_EMBED_SPEC  # W[V, D]'s partition spec
    precision: str = "default"  # the dots' matmul precision (xla_harness.programs.precision)

    @property
    def head_dim(self) -> int:
        return self.d_model // self.heads

    def to_dict(self) -> dict:
        d = asdict(self)
        d["batches"] = [list(b) for b in self.batches]
        d["mesh_shape"] = list(self.mesh_shape)
        d["embed_spec"] = ",".join(a or "none" for a in self.embed_spec)
        return d


def parse_embed_spec(value) -> tuple[str | None, str | None]:
    """W's partition spec from ``"model,data"``-style text (``none`` for a whole dimension) or a
    pair; each mesh axis at most once. HarnessError otherwise."""
    parts = value.split(",") if isinstance(value, str) else value
    try:
        # "none" names a whole dimension; an empty part ("model,") names nothing and is refused
        axes = [None if a is None or str(a).strip().lower() == "none" else str(a).strip() for a in parts]
    except TypeError:
        axes = []
    if len(axes) != 2 or any(a is not None and a not in MESH_AXES for a in axes) \
            or (axes[0] is not None and axes[0] == axes[1]):
        raise HarnessError(f"embed_spec must name W's two dimensions with {', '.join(MESH_AXES)} or none, each "
                           f"axis once (e.g. \"model,data\", \"data,model\", \"model,none\"), got {value!r}")
    return axes[0], axes[1]


def _round_up(n: float, multiple: int) -> int:
    return max(multiple, int(math.ceil(n / multiple)) * multiple)


def scaled_config(scale: float = 1.0, *, mode: str = "full", remat: bool = True, dtype: str = "f32",
                  mesh_shape: tuple[int, int] = (1, 1), variant: str = "baseline", seq_scale: float = 1.0,
                  layers: tuple[int, int] = (USED_LAYERS, TOTAL_LAYERS), specs: str = "report",
                  axis_types: str = "auto", embed_spec=DEFAULT_EMBED_SPEC, precision: str = "default") -> PresetConfig:
    """The report's sizes times ``scale`` (D, FFN, V, batch), rounded so heads and mesh divide them
    (with ``specs="report"`` the head dim is split over "data", so D is a multiple of heads x data).
    ``seq_scale`` shrinks the sequence lengths and ``layers`` = (used, total) replaces the layer
    counts; both exist for quick tests and default to the report's values."""
    for label, value in (("scale", scale), ("seq_scale", seq_scale)):
        if not (isinstance(value, int | float) and 0 < value <= 1):
            raise HarnessError(f"{label} must be in (0, 1], got {value!r}")
    used, total = (int(x) for x in layers)
    if not 0 < used <= total:
        raise HarnessError(f"layers must be (used, total) with 0 < used <= total, got {layers!r}")
    if mode not in MODES:
        raise HarnessError(f"unknown mode {mode!r}; expected one of {', '.join(MODES)}")
    if dtype not in DTYPES:
        raise HarnessError(f"unknown dtype {dtype!r}; expected one of {', '.join(DTYPES)}")
    if specs not in SPEC_SETS:
        raise HarnessError(f"unknown specs {specs!r}; expected one of {', '.join(SPEC_SETS)}")
    if axis_types not in AXIS_TYPES:
        raise HarnessError(f"unknown axis_types {axis_types!r}; expected one of {', '.join(AXIS_TYPES)}")
    embed = parse_embed_spec(embed_spec)
    check_precision(precision)
    model, data = mesh_shape
    shard = math.lcm(model, data)
    d_multiple = math.lcm(HEADS * data if specs == "report" else HEADS, shard)
    d_model = _round_up(D_MODEL * scale, d_multiple)
    return PresetConfig(
        mode=mode, remat=remat, dtype=dtype, d_model=d_model,
        ffn=_round_up(FFN * scale, shard), vocab=_round_up(VOCAB * scale, shard),
        batches=((_round_up(B1 * scale, data), _round_up(T1 * seq_scale, 4)),
                 (_round_up(B2 * scale, data), _round_up(T2 * seq_scale, 4))),
        used_layers=used, total_layers=total, mesh_shape=(model, data), variant=variant, specs=specs,
        axis_types=axis_types, embed_spec=embed, precision=precision)
