"""Hypothesis strategies and the robustness property shared by the fuzz and advisory tests.

Every raw op gets a strategy that draws *mostly plausible* calls (shapes that fit
together, attrs in range) and then mutates them: a wrong dimension, a zero or huge
dimension, an extreme integer, a NaN/Inf value, a bad attr, an unsupported dtype. Each
array is then laid out at random: C order, Fortran order, strided, reversed, read-only,
broadcast (stride 0, so huge logical shapes cost no memory) or a Python list.

An example is an :class:`Example` of small picklable specs; ``build()`` turns it into the
keyword arguments. The fuzz worker pickles the spec before each call, so a crash names
the op and can be replayed (``tools/fuzz_long.py --replay``).

The property (:func:`check_call`): the call returns outputs of the documented shapes and
dtypes, or raises ``InvalidArgumentError`` / a deliberate ``TypeError``; nothing else,
and the inputs are never modified, and no output shares memory with an input.
"""

from __future__ import annotations

import copy
import linecache
import math
import os
import traceback
from dataclasses import dataclass, field
from typing import Any

import ml_dtypes
import numpy as np
from hypothesis import strategies as st

import tfgrad
from tfgrad import _validate
from tfgrad._opdefs import OPS, OpDef

BF16 = np.dtype(ml_dtypes.bfloat16)
ALL_OPS = sorted(OPS)

_SPECIAL_FLOATS = (np.nan, np.inf, -np.inf, -0.0, 0.0, 3.0e38, -3.0e38, 1e-45, 65504.0, 1e30)
_EXTREME_INTS = (0, -1, 1, 2, -(2**31), 2**31 - 1, 2**62, -(2**62), 2**63 - 1, 65536, 2**40)
_BAD_DTYPES = (np.int8, np.uint8, np.complex64, np.bool_, np.float16, np.uint16, np.int16)


# --------------------------------------------------------------------------------------
# Array specs
# --------------------------------------------------------------------------------------
@dataclass
class Arr:
    """A small C-contiguous array plus how to present it to the op."""

    data: np.ndarray
    layout: str = "C"  # C | F | strided | reversed | list | scalar
    readonly: bool = True

    def build(self) -> Any:
        a = self.data
        if self.layout == "list":
            return a.tolist()
        if self.layout == "scalar" and a.ndim == 0:
            return a.item()
        if self.layout == "F":
            a = np.asfortranarray(a)
        elif self.layout == "strided" and a.ndim >= 1 and a.size:
            big = np.zeros(a.shape[:-1] + (3 * a.shape[-1],), a.dtype)
            big[..., ::3] = a
            a = big[..., ::3]
        elif self.layout == "reversed" and a.ndim >= 1 and a.size:
            a = np.ascontiguousarray(a[::-1])[::-1]
        else:
            a = a.copy()
        if self.readonly and isinstance(a, np.ndarray):
            a.flags.writeable = False
        return a

    def describe(self) -> str:
        return f"{self.data.dtype}{list(self.data.shape)}:{self.layout}"


@dataclass
class Broadcast:
    """``np.broadcast_to(value, shape)``: any logical size, one element of memory."""

    value: float
    shape: tuple[int, ...]
    dtype: Any

    def build(self) -> np.ndarray:
        return np.broadcast_to(np.asarray(self.value).astype(self.dtype), self.shape)

    def describe(self) -> str:
        return f"{np.dtype(self.dtype)}{list(self.shape)}:broadcast({self.value})"


@dataclass
class Example:
    op: str
    inputs: dict[str, Any]  # name -> Arr | Broadcast | raw Python value
    attrs: dict[str, Any] = field(default_factory=dict)
    mutation: str = "none"

    def build(self) -> dict[str, Any]:
        kw = {k: (v.build() if isinstance(v, (Arr, Broadcast)) else copy.deepcopy(v))
              for k, v in self.inputs.items()}
        kw.update(copy.deepcopy(self.attrs))
        return kw

    def describe(self) -> str:
        ins = ", ".join(f"{k}={v.describe() if isinstance(v, (Arr, Broadcast)) else v!r}"
                        for k, v in self.inputs.items())
        return f"{self.op}({ins}, attrs={self.attrs!r}) [mutation: {self.mutation}]"


# --------------------------------------------------------------------------------------
# The property
# --------------------------------------------------------------------------------------
class PropertyViolation(AssertionError):
    pass


def _snapshot(kwargs: dict[str, Any]) -> dict[str, Any]:
    snap = {}
    for k, v in kwargs.items():
        if isinstance(v, np.ndarray):
            snap[k] = (v.shape, v.dtype, v.strides, np.array(v, copy=True) if v.size < 2**20
                       else None)
        else:
            snap[k] = copy.deepcopy(v)
    return snap


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes()


def _check_unchanged(op: str, kwargs: dict[str, Any], snap: dict[str, Any]) -> None:
    for k, v in kwargs.items():
        s = snap[k]
        if isinstance(v, np.ndarray):
            shape, dtype, strides, copy_ = s
            if v.shape != shape or v.dtype != dtype or v.strides != strides:
                raise PropertyViolation(f"{op}: input {k!r} changed shape/dtype/strides")
            if copy_ is not None and not _same_bits(v, copy_):
                raise PropertyViolation(f"{op}: input {k!r} was modified in place")
        elif isinstance(v, (list, tuple)) and v != s and not _nan_equal(v, s):
            raise PropertyViolation(f"{op}: argument {k!r} (a Python list) was modified")


def _nan_equal(a: Any, b: Any) -> bool:
    try:
        return np.array_equal(np.asarray(a, dtype=object).astype(float),
                              np.asarray(b, dtype=object).astype(float), equal_nan=True)
    except (ValueError, TypeError):
        return False


def deliberate(exc: BaseException) -> bool:
    """Whether a TypeError was raised on purpose (a ``raise`` statement in Python code),
    rather than by an operation that failed inside the implementation."""
    tb = exc.__traceback__
    last = None
    while tb is not None:
        last = tb
        tb = tb.tb_next
    if last is None:
        return False
    line = linecache.getline(last.tb_frame.f_code.co_filename, last.tb_lineno).strip()
    return line.startswith("raise ")


def expected_outputs(op_name: str, kwargs: dict[str, Any]) -> list[tuple[tuple[int, ...], Any]]:
    """The documented (shape, dtype) of each output of a call that succeeded."""
    op = OPS[op_name]
    arrays, types = _validate.bind_inputs(op, {i.name: kwargs[i.name] for i in op.inputs})
    attrs = {a.name: kwargs.get(a.name, a.default) for a in op.attrs}

    def dt(o: Any) -> np.dtype:
        return _validate.DTYPES[o.dtype or types[o.type_attr]]

    shapes = _output_shapes(op, arrays, attrs)
    return [(tuple(int(d) for d in s), dt(o)) for s, o in zip(shapes, op.outputs)]


def _channel_axis(fmt: str, ndim: int) -> int:
    return 1 if fmt in ("NCHW", "NCDHW") else ndim - 1


def _conv_out(n: int, f: int, s: int, d: int, pad: str, pb: int, pa: int) -> int:
    # An empty filter has effective size 0 whatever the dilation (TF's CPU kernel rejects
    # dilation > 1, so its formula's -1 for f=0, d=2 defines nothing tfgrad must match).
    fe = (f - 1) * d + 1 if f > 0 else 0
    if pad == "SAME":
        return -(-n // s)
    num = n + (pb + pa if pad == "EXPLICIT" else 0) - fe + s
    return int(math.trunc(num / s)) if abs(num) < 2**52 else num // s


def _output_shapes(op: OpDef, a: dict[str, np.ndarray], attrs: dict[str, Any]) -> list[Any]:
    name = op.name
    if name.startswith("FakeQuant"):
        x = a["inputs"].shape
        if name.endswith("VarsGradient"):
            return [x, (), ()]
        if name.endswith("PerChannelGradient"):
            return [x, (x[-1],), (x[-1],)]
        return [x]
    if name.startswith("FusedBatchNorm"):
        x = a["x"].shape
        c = x[_channel_axis(attrs["data_format"], len(x))]
        if "Grad" in name:
            return [x, (c,), (c,), (0,), (0,)]
        extra = [()] if name.endswith("V3") else []
        return [x, (c,), (c,), (c,), (c,)] + extra
    if name == "DepthwiseConv2dNative":
        x, f = a["input"].shape, a["filter"].shape
        nchw = attrs["data_format"] == "NCHW"
        h, w = (x[2], x[3]) if nchw else (x[1], x[2])
        st_, dl = attrs["strides"], attrs["dilations"]
        sh, sw = (st_[2], st_[3]) if nchw else (st_[1], st_[2])
        dh, dw = (dl[2], dl[3]) if nchw else (dl[1], dl[2])
        ep = list(attrs["explicit_paddings"]) or [0] * 8
        ph = ep[4:6] if nchw else ep[2:4]
        pw = ep[6:8] if nchw else ep[4:6]
        oh = _conv_out(h, f[0], sh, dh, attrs["padding"], *ph)
        ow = _conv_out(w, f[1], sw, dw, attrs["padding"], *pw)
        oc = f[2] * f[3]
        return [(x[0], oc, oh, ow) if nchw else (x[0], oh, ow, oc)]
    if name == "DepthwiseConv2dNativeBackpropInput":
        return [_shape_vector(name, a["input_sizes"])]
    if name == "DepthwiseConv2dNativeBackpropFilter":
        return [_shape_vector(name, a["filter_sizes"])]
    if name in ("FractionalAvgPool", "FractionalMaxPool"):
        v = a["value"].shape
        r = attrs["pooling_ratio"]
        o = [int(math.floor(np.float32(n) / np.float32(q))) for n, q in zip(v, r)]
        return [tuple(o), (o[1] + 1,), (o[2] + 1,)]
    if name == "FractionalAvgPoolGrad":
        return [_shape_vector(name, a["orig_input_tensor_shape"])]
    if name == "FractionalMaxPoolGrad":
        return [a["orig_input"].shape]
    if name == "MatMul":
        x, y = a["a"].shape, a["b"].shape
        return [(x[1] if attrs["transpose_a"] else x[0], y[0] if attrs["transpose_b"] else y[1])]
    if name == "Conv2D":
        x, f = a["input"].shape, a["filter"].shape
        ep = list(attrs["explicit_paddings"]) or [0] * 8
        return [(x[0], _conv_out(x[1], f[0], attrs["strides"][1], attrs["dilations"][1],
                                 attrs["padding"], *ep[2:4]),
                 _conv_out(x[2], f[1], attrs["strides"][2], attrs["dilations"][2],
                           attrs["padding"], *ep[4:6]), f[3])]
    if name == "Conv2DBackpropInput":
        v = a["input_sizes"]
        if v.ndim == 1 and v.size == 2:  # [H, W]: TF takes batch and depth from the others
            return [(a["out_backprop"].shape[0], int(v[0]), int(v[1]), a["filter"].shape[2])]
        return [_shape_vector(name, v)]
    if name == "Conv2DBackpropFilter":
        return [_shape_vector(name, a["filter_sizes"])]
    if name in ("Relu", "Relu6", "ReluGrad", "Relu6Grad"):
        return [a["features"].shape]
    if name in ("BiasAdd", "Identity"):
        return [a["value" if name == "BiasAdd" else "input"].shape]
    if name == "BiasAddGrad":
        g = a["out_backprop"].shape
        return [(g[_channel_axis(attrs["data_format"], len(g))],)]
    if name in ("Sum", "Mean"):
        from tfgrad.ops.reduction import make_plan

        axes = tuple(int(v) for v in np.asarray(a["axis"]).reshape(-1))
        return [make_plan(name, a["input"].shape, axes, attrs.get("keep_dims", False)).out_shape]
    if name == "SparseSoftmaxCrossEntropyWithLogits":
        return [a["features"].shape[:1], a["features"].shape]
    if name == "Softmax":
        return [a["logits"].shape]
    if name == "AvgPool":  # (a window ksize <= 0 or stride <= 0 never gets here)
        x, k, st_ = a["value"].shape, attrs["ksize"], attrs["strides"]
        return [(x[0], *(_conv_out(x[i], k[i], st_[i], 1, attrs["padding"], 0, 0)
                         for i in (1, 2)), x[3])]
    if name == "AvgPoolGrad":
        return [_shape_vector(name, a["orig_input_shape"])]
    if name == "MaxPool":
        x, k, st_ = a["input"].shape, attrs["ksize"], attrs["strides"]
        ep = list(attrs["explicit_paddings"]) or [0] * 8
        return [(x[0], *(_conv_out(x[i], k[i], st_[i], 1, attrs["padding"], *ep[2 * i:2 * i + 2])
                         for i in (1, 2)), x[3])]
    if name == "MaxPoolGrad":
        return [a["orig_input"].shape]
    if name in ("Rsqrt", "RsqrtGrad"):
        return [a["x" if name == "Rsqrt" else "y"].shape]
    if name == "SquaredDifference":  # numpy's broadcast rules are TF's BCast's
        return [np.broadcast_shapes(a["x"].shape, a["y"].shape)]
    raise KeyError(name)


def _shape_vector(op: str, v: np.ndarray) -> tuple[int, ...]:
    if v.ndim != 1 or v.size != 4:
        raise PropertyViolation(f"{op}: accepted a shape input of shape {v.shape}")
    return tuple(int(d) for d in v)


def _as_tuple(out: Any) -> tuple[Any, ...]:
    return tuple(out) if isinstance(out, tuple) else (out,)


def check_call(op_name: str, kwargs: dict[str, Any]) -> str:
    """Run one call and check the property; return "ok" or "error:<Type>".

    Raises PropertyViolation (or lets an unexpected exception through) on a violation.
    """
    snap = _snapshot(kwargs)
    fn = getattr(tfgrad.raw_ops, op_name)
    try:
        with np.errstate(all="ignore"):
            out = fn(**kwargs)
    except tfgrad.InvalidArgumentError as e:
        if not str(e):
            raise PropertyViolation(f"{op_name}: InvalidArgumentError without a message") from e
        _check_unchanged(op_name, kwargs, snap)
        return f"error:{type(e).__name__}"
    except TypeError as e:
        if not deliberate(e):
            raise PropertyViolation(
                f"{op_name}: TypeError raised by a failing operation, not a check: {e}\n"
                + "".join(traceback.format_exception(e)[-3:])) from e
        _check_unchanged(op_name, kwargs, snap)
        return "error:TypeError"
    _check_unchanged(op_name, kwargs, snap)
    outs = _as_tuple(out)
    want = expected_outputs(op_name, kwargs)
    if len(outs) != len(want):
        raise PropertyViolation(f"{op_name}: {len(outs)} outputs, expected {len(want)}")
    ins = [v for v in kwargs.values() if isinstance(v, np.ndarray)]
    for i, (o, (shape, dtype)) in enumerate(zip(outs, want)):
        oname = OPS[op_name].outputs[i].name
        if not isinstance(o, np.ndarray):
            raise PropertyViolation(f"{op_name}: output {oname} is a {type(o).__name__}")
        if o.shape != shape or o.dtype != dtype:
            raise PropertyViolation(
                f"{op_name}: output {oname} has shape {o.shape} dtype {o.dtype}, documented "
                f"{shape} {dtype}")
        for v in ins:
            if o.size and v.size and np.may_share_memory(o, v) and np.shares_memory(o, v):
                raise PropertyViolation(f"{op_name}: output {oname} shares memory with an input")
    return "ok"


# --------------------------------------------------------------------------------------
# Strategies
# --------------------------------------------------------------------------------------
def _rng(draw: Any) -> np.random.Generator:
    return np.random.default_rng(draw(st.integers(0, 2**32 - 1)))


def _values(rng: np.random.Generator, shape: tuple[int, ...], dtype: Any,
            specials: bool, lo: float = -4.0, hi: float = 4.0) -> np.ndarray:
    dtype = np.dtype(dtype)
    n = math.prod(shape)
    if dtype.kind in "iu":
        a = rng.integers(-20, 20, size=n)
        if specials and n and rng.random() < 0.3:
            info = np.iinfo(dtype)
            k = rng.integers(1, n + 1)
            a[rng.integers(0, n, size=k)] = rng.choice([info.min, info.max, 0], size=k)
        return a.astype(dtype).reshape(shape)
    a = rng.uniform(lo, hi, size=n)
    if rng.random() < 0.3:
        a = np.round(a * 4) / 4  # ties: exercise rounding and argmax tie-breaks
    if specials and n and rng.random() < 0.4:
        k = rng.integers(1, min(n, 4) + 1)
        a[rng.integers(0, n, size=k)] = rng.choice(_SPECIAL_FLOATS, size=k)
    with np.errstate(over="ignore"):
        return a.astype(dtype).reshape(shape)


def _layout(draw: Any, rng: np.random.Generator, data: np.ndarray,
            allow_list: bool = True) -> Arr:
    choices = ["C", "C", "F", "strided", "reversed"]
    if allow_list and data.size <= 64 and data.dtype != BF16:
        choices.append("list")
    if data.ndim == 0:
        choices.append("scalar")
    return Arr(data, layout=str(rng.choice(choices)), readonly=bool(rng.random() < 0.7))


def _float_t(rng: np.random.Generator, allowed: tuple[str, ...]) -> np.dtype:
    return _validate.DTYPES[str(rng.choice(allowed))]


def _dims(rng: np.random.Generator, n: int, hi: int = 5, zero_p: float = 0.08) -> list[int]:
    return [0 if rng.random() < zero_p else int(rng.integers(1, hi + 1)) for _ in range(n)]


# ---- FakeQuant ------------------------------------------------------------------------
def _fake_quant(draw: Any, op: OpDef, rng: np.random.Generator, sp: bool) -> Example:
    per_channel = "PerChannel" in op.name
    rank = int(rng.integers(1 if per_channel else 0, 5))
    shape = tuple(_dims(rng, rank, 6))
    ins: dict[str, Any] = {}
    if "Gradient" in op.name:
        ins["gradients"] = _layout(draw, rng, _values(rng, shape, np.float32, sp))
    ins["inputs"] = _layout(draw, rng, _values(rng, shape, np.float32, sp, -8, 8))
    attrs: dict[str, Any] = {"num_bits": int(rng.integers(2, 17)),
                             "narrow_range": bool(rng.random() < 0.5)}
    if "Args" in op.name:
        lo = float(np.float32(rng.uniform(-8, 2)))
        attrs["min"], attrs["max"] = lo, float(np.float32(lo + rng.uniform(0.01, 10)))
    else:
        mshape = (shape[-1],) if per_channel else ()
        lo = _values(rng, mshape, np.float32, sp, -6, 1)
        hi = (lo + rng.uniform(0.0, 8, size=mshape)).astype(np.float32)
        if rng.random() < 0.1:
            hi = lo.copy()  # min == max (0 == 0 is a special case)
        ins["min"] = _layout(draw, rng, lo)
        ins["max"] = _layout(draw, rng, hi)
    return Example(op.name, ins, attrs)


# ---- FusedBatchNorm -------------------------------------------------------------------
def _batch_norm(draw: Any, op: OpDef, rng: np.random.Generator, sp: bool) -> Example:
    v3 = op.name.endswith("V3")
    fmts = op.attr("data_format").allowed
    fmt = str(rng.choice(fmts))
    rank = 5 if fmt in ("NDHWC", "NCDHW") else 4
    shape = tuple(_dims(rng, rank, 5, zero_p=0.05))
    c = shape[_channel_axis(fmt, rank)]
    t = _float_t(rng, op.type_attr("T").allowed)
    is_training = bool(rng.random() < 0.6)
    attrs: dict[str, Any] = {"epsilon": float(rng.choice([1e-4, 1e-3, 0.0, -1e-3, 0.5])),
                             "data_format": fmt, "is_training": is_training}
    ins: dict[str, Any] = {}
    if "Grad" in op.name:
        ins["y_backprop"] = _layout(draw, rng, _values(rng, shape, t, sp))
        ins["x"] = _layout(draw, rng, _values(rng, shape, t, sp))
        ins["scale"] = _layout(draw, rng, _values(rng, (c,), np.float32, sp))
        ins["reserve_space_1"] = _layout(draw, rng, _values(rng, (c,), np.float32, sp))
        ins["reserve_space_2"] = _layout(
            draw, rng, np.abs(_values(rng, (c,), np.float32, sp)))
        if v3:
            rs3 = (c,) if rng.random() < 0.5 else (0,)
            ins["reserve_space_3"] = _layout(draw, rng, _values(rng, rs3, np.float32, sp))
    else:
        attrs["exponential_avg_factor"] = float(rng.choice([1.0, 1.0, 0.25, 0.0, 2.0]))
        ins["x"] = _layout(draw, rng, _values(rng, shape, t, sp))
        ins["scale"] = _layout(draw, rng, _values(rng, (c,), np.float32, sp))
        ins["offset"] = _layout(draw, rng, _values(rng, (c,), np.float32, sp))
        stats = (0,) if is_training and rng.random() < 0.4 else (c,)
        ins["mean"] = _layout(draw, rng, _values(rng, stats, np.float32, sp))
        ins["variance"] = _layout(draw, rng, np.abs(_values(rng, stats, np.float32, sp)))
    return Example(op.name, ins, attrs)


# ---- Depthwise ------------------------------------------------------------------------
def _depthwise(draw: Any, op: OpDef, rng: np.random.Generator, sp: bool) -> Example:
    t = _float_t(rng, op.type_attr("T").allowed)
    fmt = "NCHW" if rng.random() < 0.25 else "NHWC"
    n, h, w = _dims(rng, 1, 3, 0.05)[0], *_dims(rng, 2, 7, 0.05)
    c, m = _dims(rng, 2, 3, 0.05)
    fh, fw = _dims(rng, 2, 3, 0.03)
    s = int(rng.integers(1, 4))
    sh, sw = (s, s) if rng.random() < 0.85 else (s, int(rng.integers(1, 4)))
    d = int(rng.integers(1, 3)) if rng.random() < 0.3 else 1
    if rng.random() < 0.03:  # far beyond the input: gaps between taps in the padding
        d = int(rng.choice([10**9, 2**40, 2**62 - 1]))
    padding = str(rng.choice(["SAME", "VALID", "EXPLICIT"]))
    pads = [int(p) for p in rng.integers(0, 3, size=4)]
    if fmt == "NHWC":
        strides, dil = [1, sh, sw, 1], [1, d, d, 1]
        ep = [0, 0, pads[0], pads[1], pads[2], pads[3], 0, 0]
        xshape = (n, h, w, c)
    else:
        strides, dil = [1, 1, sh, sw], [1, 1, d, d]
        ep = [0, 0, 0, 0, pads[0], pads[1], pads[2], pads[3]]
        xshape = (n, c, h, w)
    attrs: dict[str, Any] = {"strides": strides, "padding": padding, "data_format": fmt,
                             "dilations": dil,
                             "explicit_paddings": ep if padding == "EXPLICIT" else []}
    fshape = (fh, fw, c, m)
    oh = max(_conv_out(h, fh, sh, d, padding, pads[0], pads[1]), 0)
    ow = max(_conv_out(w, fw, sw, d, padding, pads[2], pads[3]), 0)
    oshape = (n, oh, ow, c * m) if fmt == "NHWC" else (n, c * m, oh, ow)
    ins: dict[str, Any] = {}
    if op.name == "DepthwiseConv2dNative":
        ins["input"] = _layout(draw, rng, _values(rng, xshape, t, sp))
        ins["filter"] = _layout(draw, rng, _values(rng, fshape, t, sp))
    elif op.name == "DepthwiseConv2dNativeBackpropInput":
        ins["input_sizes"] = _layout(draw, rng, np.array(xshape, np.int32))
        ins["filter"] = _layout(draw, rng, _values(rng, fshape, t, sp))
        ins["out_backprop"] = _layout(draw, rng, _values(rng, oshape, t, sp))
    else:
        ins["input"] = _layout(draw, rng, _values(rng, xshape, t, sp))
        ins["filter_sizes"] = _layout(draw, rng, np.array(fshape, np.int32))
        ins["out_backprop"] = _layout(draw, rng, _values(rng, oshape, t, sp))
    return Example(op.name, ins, attrs)


# ---- Fractional pooling ---------------------------------------------------------------
def _sequence(rng: np.random.Generator, n: int, m: int) -> np.ndarray:
    """A pooling sequence [0, ..., n] of m cells (sizes as even as the op's)."""
    if m <= 0:
        return np.zeros(1, np.int64)
    k, r = divmod(n, m)
    diff = np.array([k + 1] * r + [k] * (m - r), np.int64)
    rng.shuffle(diff)
    return np.concatenate([[0], np.cumsum(diff)]).astype(np.int64)


def _frac_max(x: np.ndarray, rows: np.ndarray, cols: np.ndarray, overlap: bool) -> np.ndarray:
    n, h, w, c = x.shape
    out = np.empty((n, len(rows) - 1, len(cols) - 1, c), x.dtype)
    lowest = np.finfo(x.dtype).min if x.dtype.kind == "f" else np.iinfo(x.dtype).min
    for i in range(len(rows) - 1):
        r1 = min(rows[i + 1] if overlap else rows[i + 1] - 1, h - 1)
        for j in range(len(cols) - 1):
            c1 = min(cols[j + 1] if overlap else cols[j + 1] - 1, w - 1)
            cell = x[:, rows[i]:r1 + 1, cols[j]:c1 + 1, :].reshape(n, -1, c)
            acc = np.full((n, c), lowest, x.dtype)
            for k in range(cell.shape[1]):
                acc = np.where(acc < cell[:, k], cell[:, k], acc)
            out[:, i, j] = acc
    return out


def _fractional(draw: Any, op: OpDef, rng: np.random.Generator, sp: bool) -> Example:
    t = _validate.DTYPES[str(rng.choice(op.type_attr("T").allowed))]
    n, c = _dims(rng, 2, 3, 0.03)
    h, w = _dims(rng, 2, 9, 0.03)
    overlap = bool(rng.random() < 0.5)
    if op.name in ("FractionalAvgPool", "FractionalMaxPool"):
        ratio = [1.0, float(rng.uniform(1.0, 3.0)), float(rng.uniform(1.0, 3.0)), 1.0]
        if rng.random() < 0.2:
            ratio[1] = float(rng.choice([1.0, 1.5, 2.0, 1.0000001]))
        det = bool(rng.random() < 0.7)
        seeds = ([int(rng.integers(-(2**40), 2**40)) for _ in range(2)] if det
                 else [0, 0])
        attrs = {"pooling_ratio": ratio, "pseudo_random": bool(rng.random() < 0.5),
                 "overlapping": overlap, "deterministic": det,
                 "seed": seeds[0], "seed2": seeds[1]}
        value = _values(rng, (n, h, w, c), t, sp, -9, 9)
        return Example(op.name, {"value": _layout(draw, rng, value)}, attrs)
    oh = int(rng.integers(1, h + 1)) if h else 0
    ow = int(rng.integers(1, w + 1)) if w else 0
    rows, cols = _sequence(rng, h, oh), _sequence(rng, w, ow)
    ins: dict[str, Any] = {}
    if op.name == "FractionalAvgPoolGrad":
        ins["orig_input_tensor_shape"] = _layout(draw, rng, np.array([n, h, w, c], np.int64))
        ins["out_backprop"] = _layout(draw, rng, _values(rng, (n, oh, ow, c), t, sp))
    else:
        x = _values(rng, (n, h, w, c), t, sp and rng.random() < 0.3, -9, 9)
        ins["orig_input"] = _layout(draw, rng, x)
        ins["orig_output"] = _layout(draw, rng, _frac_max(x, rows, cols, overlap)
                                     if x.size and oh and ow else
                                     np.zeros((n, oh, ow, c), t))
        ins["out_backprop"] = _layout(draw, rng, _values(rng, (n, oh, ow, c), t, sp))
    ins["row_pooling_sequence"] = _layout(draw, rng, rows)
    ins["col_pooling_sequence"] = _layout(draw, rng, cols)
    return Example(op.name, ins, {"overlapping": overlap})


_BUILDERS = {"fake_quant": _fake_quant, "batch_norm": _batch_norm,
             "depthwise_conv": _depthwise, "fractional_pool": _fractional}


# ---- MatMul ---------------------------------------------------------------------------
def _matmul(draw: Any, op: OpDef, rng: np.random.Generator, sp: bool) -> Example:
    m, k, n = _dims(rng, 3, 40, 0.05)
    ta, tb = bool(rng.random() < 0.5), bool(rng.random() < 0.5)
    t = _float_t(rng, op.type_attr("T").allowed)
    ins = {"a": _layout(draw, rng, _values(rng, (k, m) if ta else (m, k), t, sp)),
           "b": _layout(draw, rng, _values(rng, (n, k) if tb else (k, n), t, sp))}
    return Example(op.name, ins, {"transpose_a": ta, "transpose_b": tb})


_BUILDERS["matmul"] = _matmul


# ---- Conv2D ---------------------------------------------------------------------------
def _conv2d(draw: Any, op: OpDef, rng: np.random.Generator, sp: bool) -> Example:
    n, h, w = _dims(rng, 1, 3, 0.05)[0], *_dims(rng, 2, 7, 0.05)
    c, o = _dims(rng, 2, 5, 0.05)
    fh, fw = _dims(rng, 2, 3, 0.03)
    s = int(rng.integers(1, 4))
    sh, sw = (s, s) if rng.random() < 0.8 else (s, int(rng.integers(1, 4)))
    d = 1
    if op.name == "Conv2D" and rng.random() < 0.3:
        d = int(rng.integers(1, 3)) if rng.random() < 0.9 else int(
            rng.choice([10**9, 2**31 - 1, 2**40]))  # (TF reads dilations as int32)
    padding = str(rng.choice(["SAME", "VALID", "EXPLICIT"]))
    pads = [int(p) for p in rng.integers(0, 3, size=4)]
    attrs: dict[str, Any] = {"strides": [1, sh, sw, 1], "padding": padding,
                             "dilations": [1, d, d, 1],
                             "explicit_paddings": [0, 0, *pads, 0, 0]
                             if padding == "EXPLICIT" else []}
    xshape, fshape = (n, h, w, c), (fh, fw, c, o)
    oh = max(_conv_out(h, fh, sh, d, padding, pads[0], pads[1]), 0)
    ow = max(_conv_out(w, fw, sw, d, padding, pads[2], pads[3]), 0)
    t = np.dtype(np.float32)
    ins: dict[str, Any] = {}
    if op.name == "Conv2D":
        ins["input"] = _layout(draw, rng, _values(rng, xshape, t, sp))
        ins["filter"] = _layout(draw, rng, _values(rng, fshape, t, sp))
    elif op.name == "Conv2DBackpropInput":
        ins["input_sizes"] = _layout(draw, rng, np.array(xshape, np.int32))
        ins["filter"] = _layout(draw, rng, _values(rng, fshape, t, sp))
        ins["out_backprop"] = _layout(draw, rng, _values(rng, (n, oh, ow, o), t, sp))
    else:
        ins["input"] = _layout(draw, rng, _values(rng, xshape, t, sp))
        ins["filter_sizes"] = _layout(draw, rng, np.array(fshape, np.int32))
        ins["out_backprop"] = _layout(draw, rng, _values(rng, (n, oh, ow, o), t, sp))
    return Example(op.name, ins, attrs)


_BUILDERS["conv2d"] = _conv2d


# ---- Activations and bias addition ------------------------------------------------------
def _activation(draw: Any, op: OpDef, rng: np.random.Generator, sp: bool) -> Example:
    shape = tuple(_dims(rng, int(rng.integers(0, 4)), 20, 0.05))
    t = _float_t(rng, op.type_attr("T").allowed)
    ins = {"features": _layout(draw, rng, _values(rng, shape, t, sp))}
    if op.name.endswith("Grad"):
        ins["gradients"] = _layout(draw, rng, _values(rng, shape, t, sp))
    return Example(op.name, ins, {})


def _bias_add(draw: Any, op: OpDef, rng: np.random.Generator, sp: bool) -> Example:
    t = _float_t(rng, op.type_attr("T").allowed)
    shape = tuple(_dims(rng, int(rng.integers(2, 5)), 12, 0.05))
    if op.name == "Identity":
        return Example(op.name, {"input": _layout(draw, rng, _values(rng, shape, t, sp))}, {})
    fmt = str(rng.choice(["NHWC", "NCHW"]))
    if op.name == "BiasAddGrad":
        return Example(op.name, {"out_backprop": _layout(draw, rng, _values(rng, shape, t, sp))},
                       {"data_format": fmt})
    c = shape[1] if fmt == "NCHW" else shape[-1]
    ins = {"value": _layout(draw, rng, _values(rng, shape, t, sp)),
           "bias": _layout(draw, rng, _values(rng, (c,), t, sp))}
    return Example(op.name, ins, {"data_format": fmt})


_BUILDERS["activation"] = _activation
_BUILDERS["bias_add"] = _bias_add


def _reduction(draw: Any, op: OpDef, rng: np.random.Generator, sp: bool) -> Example:
    shape = tuple(_dims(rng, int(rng.integers(0, 5)), 7, 0.05))
    rank = len(shape)
    k = int(rng.integers(0, rank + 1))
    axes = [int(v) for v in rng.permutation(rank)[:k]] if rank else []
    axes = [v - rank if rng.random() < 0.3 else v for v in axes]
    dt = np.int64 if rng.random() < 0.3 else np.int32
    ins = {"input": _layout(draw, rng, _values(rng, shape, np.float32, sp)),
           "axis": _layout(draw, rng, np.array(axes, dt))}
    return Example(op.name, ins, {"keep_dims": bool(rng.random() < 0.3)})


def _softmax_xent(draw: Any, op: OpDef, rng: np.random.Generator, sp: bool) -> Example:
    b, c = _dims(rng, 2, 12, 0.05)
    dt = np.int64 if rng.random() < 0.3 else np.int32
    labels = rng.integers(0, max(c, 1), b).astype(dt)
    ins = {"features": _layout(draw, rng, _values(rng, (b, c), np.float32, sp, -30, 30)),
           "labels": _layout(draw, rng, labels)}
    return Example(op.name, ins, {})


_BUILDERS["reduction"] = _reduction
_BUILDERS["softmax_xent"] = _softmax_xent


def _softmax(draw: Any, op: OpDef, rng: np.random.Generator, sp: bool) -> Example:
    shape = tuple(_dims(rng, int(rng.integers(1, 4)), 12, 0.05))
    return Example(op.name, {"logits": _layout(draw, rng, _values(rng, shape, np.float32, sp,
                                                                    -30, 30))}, {})


_BUILDERS["softmax"] = _softmax


def _max_pool(draw: Any, op: OpDef, rng: np.random.Generator, sp: bool) -> Example:
    t = _float_t(rng, op.type_attr("T").allowed)
    shape = (*_dims(rng, 1, 3), *_dims(rng, 2, 7, 0.03), *_dims(rng, 1, 5))
    k = [int(v) for v in rng.integers(1, 4, 2)]
    s = [int(v) for v in rng.integers(1, 3, 2)]
    padding = str(rng.choice(["SAME", "VALID", "EXPLICIT"]))
    pads = [0, 0, *(int(rng.integers(0, k[i // 2])) for i in range(4)), 0, 0]
    attrs = {"ksize": [1, *k, 1], "strides": [1, *s, 1], "padding": padding,
             "explicit_paddings": pads if padding == "EXPLICIT" else []}
    x = _values(rng, shape, t, sp)
    if op.name == "MaxPool":
        return Example(op.name, {"input": _layout(draw, rng, x)}, attrs)
    try:  # (the gradient's shapes from the forward; a bad geometry keeps a wrong one)
        y = tfgrad.raw_ops.MaxPool(input=x, **attrs).shape
    except tfgrad.InvalidArgumentError:
        y = shape
    ins = {"orig_input": _layout(draw, rng, x),
           "orig_output": _layout(draw, rng, _values(rng, y, t, sp)),
           "grad": _layout(draw, rng, _values(rng, y, t, sp))}
    return Example(op.name, ins, attrs)


_BUILDERS["max_pool"] = _max_pool


def _avg_pool(draw: Any, op: OpDef, rng: np.random.Generator, sp: bool) -> Example:
    t = _float_t(rng, op.type_attr("T").allowed)
    shape = (*_dims(rng, 1, 3), *_dims(rng, 2, 7, 0.03), *_dims(rng, 1, 5))
    k = [int(v) for v in rng.integers(1, 4, 2)]
    s = [int(v) for v in rng.integers(1, 3, 2)]
    attrs = {"ksize": [1, *k, 1], "strides": [1, *s, 1],
             "padding": str(rng.choice(["SAME", "VALID"]))}
    x = _values(rng, shape, t, sp)
    if op.name == "AvgPool":
        return Example(op.name, {"value": _layout(draw, rng, x)}, attrs)
    try:  # (the gradient's shape from the forward; a bad geometry keeps a wrong one)
        y = tfgrad.raw_ops.AvgPool(value=x, **attrs).shape
    except tfgrad.InvalidArgumentError:
        y = shape
    return Example(op.name, {"orig_input_shape": _layout(draw, rng, np.array(shape, np.int32)),
                             "grad": _layout(draw, rng, _values(rng, y, t, sp))}, attrs)


_BUILDERS["avg_pool"] = _avg_pool


def _cwise(draw: Any, op: OpDef, rng: np.random.Generator, sp: bool) -> Example:
    t = _float_t(rng, op.type_attr("T").allowed)
    shape = tuple(_dims(rng, int(rng.integers(0, 4)), 20, 0.05))
    if op.name == "Rsqrt":
        return Example(op.name, {"x": _layout(draw, rng, _values(rng, shape, t, sp, 0, 8))}, {})
    if op.name == "RsqrtGrad":
        return Example(op.name, {"y": _layout(draw, rng, _values(rng, shape, t, sp)),
                                 "dy": _layout(draw, rng, _values(rng, shape, t, sp))}, {})
    # SquaredDifference: y broadcast against x (a suffix of x's shape with some dims 1)
    ys = [1 if rng.random() < 0.3 else d for d in shape[int(rng.integers(0, len(shape) + 1)):]]
    return Example(op.name, {"x": _layout(draw, rng, _values(rng, shape, t, sp)),
                             "y": _layout(draw, rng, _values(rng, tuple(ys), t, sp))}, {})


_BUILDERS["cwise"] = _cwise


# ---- Mutations ------------------------------------------------------------------------
def _arrays(ex: Example) -> list[str]:
    return [k for k, v in ex.inputs.items() if isinstance(v, Arr)]


def _mutate_shape(rng: np.random.Generator, ex: Example) -> str:
    names = _arrays(ex)
    if not names:
        return "none"
    k = str(rng.choice(names))
    a = ex.inputs[k].data
    shape = list(a.shape)
    how = rng.integers(0, 4)
    if how == 0 and shape:
        shape[rng.integers(0, len(shape))] = int(rng.integers(0, 7))
    elif how == 1:
        shape.insert(int(rng.integers(0, len(shape) + 1)), int(rng.integers(0, 3)))
    elif how == 2 and shape:
        shape.pop(int(rng.integers(0, len(shape))))
    else:
        shape = [int(d) for d in rng.integers(0, 4, size=rng.integers(0, 6))]
    n = math.prod(shape)
    flat = a.ravel()
    data = (np.resize(flat, n) if flat.size else np.zeros(n, a.dtype)).reshape(shape)
    ex.inputs[k] = Arr(data, ex.inputs[k].layout, ex.inputs[k].readonly)
    return f"shape of {k} -> {shape}"


def _mutate_int_values(rng: np.random.Generator, ex: Example) -> str:
    names = [k for k in _arrays(ex) if ex.inputs[k].data.dtype.kind in "iu"]
    if not names:
        return _mutate_shape(rng, ex)
    k = str(rng.choice(names))
    a = ex.inputs[k].data.astype(np.int64).copy()
    if a.size:
        idx = rng.integers(0, a.size)
        a.flat[idx] = int(rng.choice(_EXTREME_INTS))
    dtype = ex.inputs[k].data.dtype
    if np.iinfo(dtype).max < 2**62 and (np.abs(a) > np.iinfo(dtype).max).any():
        dtype = np.dtype(np.int64)  # keep the value; the op must cope with int64 input
    ex.inputs[k] = Arr(a.astype(dtype), ex.inputs[k].layout, True)
    return f"values of {k} -> {a.ravel().tolist()[:8]}"


def _mutate_attr(rng: np.random.Generator, ex: Example) -> str:
    op = OPS[ex.op]
    if not op.attrs:  # (an op without attrs: nothing to mutate)
        return "none"
    a = op.attrs[int(rng.integers(0, len(op.attrs)))]
    r = rng.random()
    if a.type == "int":
        v: Any = int(rng.choice(_EXTREME_INTS + (3, 17, 1)))
    elif a.type == "float":
        v = float(rng.choice(_SPECIAL_FLOATS + (0.5, 1.0, -1.0, 1e-7)))
    elif a.type == "bool":
        v = not ex.attrs.get(a.name, a.default)
    elif a.type == "string":
        v = str(rng.choice(["SAME", "VALID", "EXPLICIT", "NHWC", "NCHW", "NDHWC", "", "nhwc",
                            "NCDHW"]))
    elif a.type == "list(int)":
        base = list(ex.attrs.get(a.name, a.default) or [1, 1, 1, 1])
        if r < 0.3:
            v = [int(x) for x in rng.choice(_EXTREME_INTS, size=rng.integers(0, 9))]
        else:
            v = base[:]
            if v:
                v[int(rng.integers(0, len(v)))] = int(rng.choice(_EXTREME_INTS + (3, 2)))
            if rng.random() < 0.3:
                v = v + [1] * int(rng.integers(1, 5))
    else:  # list(float)
        base = list(ex.attrs.get(a.name, [1.0, 1.5, 1.5, 1.0]))
        v = base[:]
        v[int(rng.integers(0, len(v)))] = float(
            rng.choice(_SPECIAL_FLOATS + (0.5, 1.0, 1e9, 0.99999)))
        if rng.random() < 0.2:
            v = v[: int(rng.integers(0, len(v) + 2))] + [1.0] * int(rng.integers(0, 2))
    if r > 0.95:  # wrong type altogether
        v = str(v) if a.type != "string" else 4
    ex.attrs[a.name] = v
    return f"attr {a.name} -> {v!r}"


def _mutate_dtype(rng: np.random.Generator, ex: Example) -> str:
    if not _arrays(ex):
        return "none"
    k = str(rng.choice(_arrays(ex)))
    arr = ex.inputs[k]
    dt = np.dtype(rng.choice(_BAD_DTYPES + (np.float64, np.int32, np.int64, np.float32)))
    with np.errstate(all="ignore"):
        data = arr.data.astype(np.float64).astype(dt)
    ex.inputs[k] = Arr(data, "C" if arr.layout == "list" else arr.layout, arr.readonly)
    return f"dtype of {k} -> {dt}"


def _mutate_huge(rng: np.random.Generator, ex: Example) -> str:
    """A broadcast input of huge logical size, or an empty one with huge other dims."""
    if not _arrays(ex):
        return "none"
    k = str(rng.choice(_arrays(ex)))
    a = ex.inputs[k].data
    if a.ndim == 0:
        return _mutate_shape(rng, ex)
    shape = list(a.shape)
    i = int(rng.integers(0, len(shape)))
    if rng.random() < 0.5:
        shape[i] = int(rng.choice([2**20, 2**31, 2**33]))
        if math.prod(shape) * a.dtype.itemsize >= 2**62:
            shape[i] = 2**20
        ex.inputs[k] = Broadcast(float(a.ravel()[0]) if a.size else 1.0, tuple(shape), a.dtype)
        return f"{k} broadcast to {shape}"
    if len(shape) < 2:
        return _mutate_shape(rng, ex)
    j = (i + 1 + int(rng.integers(0, len(shape) - 1))) % len(shape)
    shape[i] = int(rng.choice([2**31, 2**40]))
    shape[j] = 0
    ex.inputs[k] = Broadcast(0.0, tuple(shape), a.dtype)
    return f"{k} empty with shape {shape}"


_MUTATIONS = ((0.45, None), (0.15, _mutate_shape), (0.12, _mutate_int_values),
              (0.15, _mutate_attr), (0.05, _mutate_dtype), (0.08, _mutate_huge))
# TFGRAD_FUZZ_SKIP=huge,dtype leaves mutations out (e.g. to look past a known finding).
_SKIP = {f"_mutate_{m}" for m in os.environ.get("TFGRAD_FUZZ_SKIP", "").split(",") if m}


@st.composite
def examples(draw: Any, op_name: str) -> Example:
    """A (possibly mutated) call of ``raw_ops.<op_name>``."""
    op = OPS[op_name]
    rng = _rng(draw)
    specials = bool(rng.random() < 0.3)
    ex = _BUILDERS[op.family](draw, op, rng, specials)
    u, acc = rng.random(), 0.0
    for p, fn in _MUTATIONS:
        acc += p
        if u < acc:
            if fn is not None and fn.__name__ not in _SKIP:
                ex.mutation = fn(rng, ex)
                second = _MUTATIONS[int(rng.integers(1, 6))][1]
                if rng.random() < 0.25 and second.__name__ not in _SKIP:  # two at once
                    ex.mutation += "; " + second(rng, ex)
            break
    return ex
