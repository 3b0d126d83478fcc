"""The shapes XLA infers for instructions written without one (tuple, get-tuple-element,
elementwise, transpose, pad, concatenate, real/imag, dot, one-input reduce, reduce-window,
convolution, sort, call, conditional, ...), and the shapes XLA's parser builds for
send/recv/outfeed and their ``-done`` ops from their operands. Ops not followed here are
refused rather than guessed.
"""

from __future__ import annotations

import re
from typing import TypedDict

from xla_harness.hlo.ir import Computation, Instruction, split_ref
from xla_harness.hlo.shapes import Shape

_CALL_RE = re.compile(r"(?<![\w.\-])(calls|to_apply|body|condition|true_computation|false_computation|"
                      r"branch_computations|called_computations|select|scatter)=\s*(\{[^}]*\}|%?[^\s,{}]+)")

SAME_SHAPE_OPCODES = {"abs", "add", "atan2", "cbrt", "ceil", "clamp", "copy", "cosine", "divide", "exponential",
                      "exponential-minus-one", "floor", "log", "log-plus-one", "logistic", "maximum", "minimum",
                      "multiply", "negate", "power", "remainder", "round-nearest-afz", "round-nearest-even",
                      "rsqrt", "sign", "sine", "sqrt", "subtract", "tanh", "and", "or", "xor", "not",
                      "shift-left", "shift-right-arithmetic", "shift-right-logical", "add-dependency"}


def infer_shape(opcode: str, operands: list[str], attr_text: str, defined: dict[str, Instruction],
                 comps: dict[str, Computation]) -> Shape:
    """The shape XLA infers for an instruction written without one (the ops the scanner
    follows; others are refused rather than guessed)."""
    def of(ref: str) -> Shape:
        base, index = split_ref(ref)
        if base not in defined:
            raise ValueError(f"undefined operand {base!r}")
        return defined[base].shape.subshape(index)

    if opcode == "tuple":
        return Shape("tuple", tuple_shapes=tuple(of(o) for o in operands))
    by_operand = {"while": 0, "select": 1, "compare": 0}
    if opcode in by_operand and len(operands) > by_operand[opcode]:
        s = of(operands[by_operand[opcode]])
        return Shape("pred", s.dims) if opcode == "compare" else s
    if opcode == "get-tuple-element" and len(operands) == 1:
        m = re.search(r"\bindex=(\d+)", attr_text)
        if m:
            return of(operands[0]).subshape((int(m.group(1)),))
    if opcode in SAME_SHAPE_OPCODES and operands:
        return of(operands[0])
    if opcode == "after-all":
        return Shape("token")
    inferred = _INFERRED.get(opcode)
    if inferred is not None and operands:
        return inferred([of(o) for o in operands], attr_text)
    if opcode in ("call", "conditional"):  # the (first) called computation's result
        first = {m.group(1): m.group(2) for m in _CALL_RE.finditer(attr_text)}
        name = first.get("to_apply") or first.get("true_computation") or first.get("branch_computations", "")
        callee = comps.get(name.strip("{}").split(",")[0].strip().lstrip("%"))
        if callee is not None:
            return callee.root.shape
    raise ValueError(f"a {opcode} written without a shape is not supported here")


SHAPE_BUILT_BY_XLA = {"send", "recv", "send-done", "recv-done", "outfeed"}
_TOKEN = Shape("token")


def built_shape(opcode: str, operands: list[str], written: Shape, defined: dict[str, Instruction]) -> Shape:
    """The shape XLA's parser gives send/recv/outfeed and their -done ops, built from the
    operands whatever the text says (a wrong operand count is left to the checks after)."""
    sources = [defined.get(split_ref(o)[0]) for o in operands]
    if None in sources or len(operands) != {"send": 2, "outfeed": 2}.get(opcode, 1):
        return written
    source = sources[0]
    assert source is not None  # None in sources returned above
    first = source.shape.subshape(split_ref(operands[0])[1])
    if opcode == "send":
        return Shape("tuple", tuple_shapes=(first, Shape("u32"), _TOKEN))
    if opcode == "recv":
        if not written.is_tuple or not written.tuple_shapes:
            raise ValueError("recv must have a non-empty tuple shape")
        return Shape("tuple", tuple_shapes=(written.tuple_shapes[0], Shape("u32"), _TOKEN))
    if opcode == "recv-done":
        if not first.is_tuple or not first.tuple_shapes:
            raise ValueError("recv-done takes a recv (a tuple-shaped operand)")
        return Shape("tuple", tuple_shapes=(first.tuple_shapes[0], _TOKEN))
    return _TOKEN  # send-done, outfeed


def _padded(operand: Shape, attr_text: str) -> Shape:
    """XLA's inferred pad shape: each dim grows by low + high + interior * (size - 1)."""
    m = re.search(r"\bpadding=([\d_x\-]+)", attr_text)
    specs = m.group(1).split("x") if m else []
    if operand.is_tuple or len(specs) != len(operand.dims):
        raise ValueError("pad without a shape needs padding=... for each of its operand's dims")
    dims = []
    for d, spec in zip(operand.dims, specs, strict=True):
        lo, hi, interior = ([int(x) for x in spec.split("_")] + [0])[:3]
        dims.append(lo + hi + d + max(d - 1, 0) * interior)
    return Shape(operand.element_type, tuple(dims))


def _concatenated(shapes: list[Shape], attr_text: str) -> Shape:
    """XLA's inferred concatenate shape: the operands' sizes summed along ``dimensions``."""
    m = re.search(r"\bdimensions=\{\s*(\d+)\s*\}", attr_text)
    first = shapes[0]
    k = int(m.group(1)) if m else -1
    if first.is_tuple or not 0 <= k < len(first.dims) or any(len(s.dims) != len(first.dims) for s in shapes):
        raise ValueError("concatenate without a shape needs dimensions={k} and operands of one rank")
    dims = list(first.dims)
    dims[k] = sum(s.dims[k] for s in shapes)
    return Shape(first.element_type, tuple(dims))


def _transposed(operand: Shape, attr_text: str) -> Shape:
    """XLA's inferred transpose shape: dims permuted, the layout permuted along (a bitcast)."""
    m = re.search(r"\bdimensions=\{([\d,\s]*)\}", attr_text)
    perm = tuple(int(x) for x in m.group(1).split(",") if x.strip()) if m else ()
    if operand.is_tuple or sorted(perm) != list(range(len(operand.dims))):
        raise ValueError("transpose without a shape needs dimensions={...} permuting its operand's dims")
    inverse = {d: i for i, d in enumerate(perm)}  # an operand printed without a layout has the default one
    m2m = tuple(inverse[d] for d in operand.layout_or_default())
    return Shape(operand.element_type, tuple(operand.dims[d] for d in perm), m2m, None, operand.layout_extra)


def _real_part(shapes: list[Shape], attr_text: str) -> Shape:
    s = shapes[0]
    real = {"c64": "f32", "c128": "f64"}.get(s.element_type, s.element_type)
    return Shape(real, s.dims, s.minor_to_major, None, s.layout_extra)


def _attr_ints(attr_text: str, key: str) -> list[int]:
    m = re.search(rf"(?<![\w.\-]){key}=\{{([\d,\s]*)\}}", attr_text)
    return [int(x) for x in m.group(1).split(",") if x.strip()] if m else []


_WIDER_FLOAT = {frozenset(("f32", "bf16")): "f32", frozenset(("f32", "f16")): "f32",
                frozenset(("f64", "f32")): "f64"}


def _dot_shape(shapes: list[Shape], attr_text: str) -> Shape:
    """XLA's inferred dot shape: batch dims, then lhs and rhs free dims; the wider element type."""
    if len(shapes) != 2 or shapes[0].is_tuple or shapes[1].is_tuple:
        raise ValueError("dot without a shape needs two array operands")
    lhs, rhs = shapes
    lb, lc = _attr_ints(attr_text, "lhs_batch_dims"), _attr_ints(attr_text, "lhs_contracting_dims")
    rb, rc = _attr_ints(attr_text, "rhs_batch_dims"), _attr_ints(attr_text, "rhs_contracting_dims")
    if any(d >= len(lhs.dims) for d in lb + lc) or any(d >= len(rhs.dims) for d in rb + rc) or len(lb) != len(rb):
        raise ValueError("dot dimension numbers out of range")
    etype = lhs.element_type if lhs.element_type == rhs.element_type else \
        _WIDER_FLOAT.get(frozenset((lhs.element_type, rhs.element_type)))
    if etype is None:
        raise ValueError(f"a dot of {lhs.element_type} and {rhs.element_type} written without a shape "
                         "is not supported here")
    dims = [lhs.dims[d] for d in lb]
    dims += [n for d, n in enumerate(lhs.dims) if d not in lb and d not in lc]
    dims += [n for d, n in enumerate(rhs.dims) if d not in rb and d not in rc]
    return Shape(etype, tuple(dims))


def _reduce_shape(shapes: list[Shape], attr_text: str) -> Shape:
    """XLA's inferred shape of a one-input reduce: the reduced dims dropped, the init's type."""
    if len(shapes) != 2 or shapes[0].is_tuple:
        raise ValueError("a reduce of several inputs written without a shape is not supported here")
    dropped = set(_attr_ints(attr_text, "dimensions"))
    return Shape(shapes[1].element_type, tuple(n for d, n in enumerate(shapes[0].dims) if d not in dropped))


_WINDOW_FIELDS = {"size": "size", "stride": "stride", "pad": "pad", "lhs_dilate": "base_dilation",
                  "rhs_dilate": "window_dilation", "rhs_reversal": "reversal"}


class _WindowDim(TypedDict):
    size: int
    stride: int
    pad: tuple[int, int]  # (low, high)
    base_dilation: int
    window_dilation: int


def _window(attr_text: str, rank: int) -> list[_WindowDim]:
    """``window={size=2x3 stride=1x2 pad=1_1x0_0 lhs_dilate=.. rhs_dilate=..}`` per dimension,
    XLA's defaults (stride and dilations 1, padding 0) where a field is not written."""
    m = re.search(r"(?<![\w.\-])window=\{([^{}]*)\}", attr_text)
    fields: dict[str, list[str]] = {}
    for part in (m.group(1).split() if m else []):
        key, eq, value = part.partition("=")
        if not eq or key not in _WINDOW_FIELDS:
            raise ValueError(f"bad window field {part!r}")
        fields[_WINDOW_FIELDS[key]] = value.split("x")
    if "size" not in fields or any(len(v) != rank for v in fields.values()):
        raise ValueError(f"window needs size=... with {rank} dimension(s), each field as many")
    dims: list[_WindowDim] = []
    for i in range(rank):
        lo, _, hi = fields.get("pad", ["0_0"] * rank)[i].partition("_")
        dims.append({"size": int(fields["size"][i]), "stride": int(fields.get("stride", ["1"] * rank)[i]),
                     "pad": (int(lo), int(hi or "0")),
                     "base_dilation": int(fields.get("base_dilation", ["1"] * rank)[i]),
                     "window_dilation": int(fields.get("window_dilation", ["1"] * rank)[i])})
    if any(d["stride"] < 1 or d["base_dilation"] < 1 or d["window_dilation"] < 1 or d["size"] < 0 for d in dims):
        raise ValueError("window strides and dilations must be >= 1")
    return dims


def _windowed(bounds: tuple[int, ...], window: list[_WindowDim]) -> tuple[int, ...]:
    """XLA's InferWindowOutputShape: each bound base-dilated and padded, then strided by the
    dilated window."""
    out = []
    for bound, w in zip(bounds, window, strict=True):
        dilated = (bound - 1) * w["base_dilation"] + 1 if bound else 0
        padded = w["pad"][0] + dilated + w["pad"][1]
        size = (w["size"] - 1) * w["window_dilation"] + 1 if w["size"] else 0
        out.append(0 if size > padded else (padded - size) // w["stride"] + 1)
    return tuple(out)


def _reduce_window_shape(shapes: list[Shape], attr_text: str) -> Shape:
    """XLA's inferred reduce-window shape: each input windowed, the init values' types."""
    n = len(shapes) // 2
    if len(shapes) % 2 or n < 1 or any(s.is_tuple for s in shapes):
        raise ValueError("reduce-window takes N array inputs and N init values")
    window = _window(attr_text, len(shapes[0].dims))
    outs = [Shape(init.element_type, _windowed(s.dims, window)) for s, init in zip(shapes[:n], shapes[n:],
                                                                                   strict=True)]
    return outs[0] if n == 1 else Shape("tuple", tuple_shapes=tuple(outs))


def _dim_labels(attr_text: str) -> tuple[str, str, str]:
    m = re.search(r"(?<![\w.\-])dim_labels=([0-9a-z]+)_([0-9a-z]+)->([0-9a-z]+)", attr_text)
    if m is None:
        raise ValueError("convolution without a shape needs dim_labels=..._...->...")
    return m.group(1), m.group(2), m.group(3)


def _convolution_shape(shapes: list[Shape], attr_text: str) -> Shape:
    """XLA's inferred convolution shape (InferConvolveShape): the batch divided by the batch
    group count, the kernel's output features, the spatial dims windowed."""
    if len(shapes) != 2 or shapes[0].is_tuple or shapes[1].is_tuple:
        raise ValueError("convolution without a shape needs two array operands")
    lhs, rhs = shapes
    lhs_labels, rhs_labels, out_labels = _dim_labels(attr_text)
    rank = len(lhs.dims)
    if not (len(lhs_labels) == len(rhs_labels) == len(out_labels) == rank == len(rhs.dims)) or any(
            sorted(labels) != sorted("".join(map(str, range(rank - 2))) + letters)
            for labels, letters in ((lhs_labels, "bf"), (rhs_labels, "io"), (out_labels, "bf"))):
        raise ValueError(f"dim_labels {lhs_labels}_{rhs_labels}->{out_labels} do not fit rank {rank}")
    window = _window(attr_text, rank - 2)
    spatial = _windowed(tuple(lhs.dims[lhs_labels.index(str(k))] for k in range(rank - 2)), window)
    groups = re.search(r"(?<![\w.\-])batch_group_count=(\d+)", attr_text)
    batch = lhs.dims[lhs_labels.index("b")] // (int(groups.group(1)) if groups else 1)
    etype = lhs.element_type if lhs.element_type == rhs.element_type else \
        _WIDER_FLOAT.get(frozenset((lhs.element_type, rhs.element_type)))
    if etype is None:
        raise ValueError(f"a convolution of {lhs.element_type} and {rhs.element_type} written without a shape "
                         "is not supported here")
    dims = [batch if c == "b" else rhs.dims[rhs_labels.index("o")] if c == "f" else spatial[int(c)]
            for c in out_labels]
    return Shape(etype, tuple(dims))


def _sort_shape(shapes: list[Shape], attr_text: str) -> Shape:
    """XLA's inferred sort shape: the operand's, a tuple of them for several."""
    return shapes[0] if len(shapes) == 1 else Shape("tuple", tuple_shapes=tuple(shapes))


_INFERRED = {"dot": _dot_shape, "reduce": _reduce_shape, "reduce-window": _reduce_window_shape,
             "convolution": _convolution_shape, "sort": _sort_shape,
             "transpose": lambda shapes, attrs: _transposed(shapes[0], attrs),
             "pad": lambda shapes, attrs: _padded(shapes[0], attrs),
             "concatenate": _concatenated, "real": _real_part, "imag": _real_part}
