"""Fake quantization: FakeQuantWithMinMax{Args,Vars,VarsPerChannel} and their gradients.

Bit-exact with TensorFlow 2.21's CPU kernels (``fake_quant_ops_functor.h``): float32 with one
rounding per operation, the range nudged so that 0.0 falls on the grid, and dmin / dmax
summed in Eigen's reduction order with TF's thread split (``tfgrad._tf.eigen``). This
module holds the ops' checks and the NumPy reference (the spec); the fused kernels are in
``tfgrad.kernels.fake_quant``, run by ``tfgrad.dispatch.fake_quant``.
The TF behaviours reproduced, the differences from TF and the tests that pin them:
docs/fake_quant.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache, cached_property, lru_cache
from typing import Any

import numpy as np

from .. import _config
from .._errors import InvalidArgumentError
from .._tf.eigen import num_threads, sharded_sum
from .._tf.fpenv import flushed
from .._validate import check_alloc, shape_str

F32 = np.float32
FLT_MIN = F32(2.0**-126)
_HALF = F32(0.5)
_ZERO = F32(0.0)

# Eigen's cost per value of the reduced expression, in its cost model's cycles, measured
# on TF 2.21 (the thread count at which each size starts to shard): sum(g * (x < c ? 1 :
# 0)) over a flat tensor (Vars) and over a chip of a matrix (PerChannel).
COST_FLAT = 67 / 16
COST_CHIP = 75 / 16


@cache
def _dispatch() -> Any:
    """``tfgrad.dispatch.fake_quant``, imported on first use (an import statement in the
    functions cost ~0.5 us a call)."""
    from ..dispatch import fake_quant

    return fake_quant


# --------------------------------------------------------------------------------------
# Denormal flushing (TF's kernels run with FTZ and DAZ set)
# --------------------------------------------------------------------------------------
def ftz(a: np.ndarray) -> np.ndarray:
    """Flush denormals to zero, keeping the sign, as the FTZ/DAZ CPU modes do."""
    return flushed(np.asarray(a, F32))


def _fmt(v: float) -> str:
    """A float32 as TF 2.21's error messages print it: %g, 6 significant digits, even where
    they do not round-trip (123456.7 prints as 123457, checked against TF)."""
    return f"{v:g}"


# --------------------------------------------------------------------------------------
# The nudged range (shared by the reference and the kernels; O(channels))
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Nudged:
    """Per-channel quantization parameters, float32 arrays of one shape ([] or [d])."""

    nmin: np.ndarray
    nmax: np.ndarray
    scale: np.ndarray
    inv: np.ndarray
    qz: np.ndarray
    """floor(-nmin * inv + 0.5): the grid index of 0.0."""
    zero: np.ndarray
    """Where min == max == 0 (Vars/PerChannel output zeros and pass gradients through)."""

    @cached_property
    def zero_channels(self) -> tuple[int, ...]:
        """The indices where ``zero`` (computed once: the nudge is cached per range)."""
        return tuple(np.flatnonzero(self.zero).tolist())

    def as_channel(self) -> Nudged:
        """A one-range Nudged as a single channel (shape [1])."""
        return Nudged(*(np.reshape(a, (1,)) for a in (
            self.nmin, self.nmax, self.scale, self.inv, self.qz, self.zero)))


def nudge(mn: np.ndarray, mx: np.ndarray, num_bits: int, narrow_range: bool) -> Nudged:
    """TF's ``Nudge`` (float32, FTZ) on arrays of min/max values.

    Cached on the values: the same ranges come back call after call (a QAT step's
    forward and gradient; an inference run). The reference's arrays are read-only since
    calls share them; the kernels' (compiled) stay writable, as Numba compiles read-only
    arrays apart, and nothing writes to them.
    """
    mn = np.asarray(mn, F32)
    mx = np.asarray(mx, F32)
    if not _config.use_reference():
        key = (mn.tobytes(), mx.tobytes(), mn.shape, num_bits, narrow_range)
        p = _NUDGED.get(key)
        if p is None:
            if len(_NUDGED) >= 256:
                _NUDGED.clear()
            p = _NUDGED[key] = Nudged(*_dispatch().nudge(mn, mx, num_bits, narrow_range))
        return p
    return _nudge_cached(mn.tobytes(), mx.tobytes(), mn.shape, num_bits, narrow_range)


_NUDGED: dict[tuple, Nudged] = {}


@lru_cache(maxsize=256)
def _nudge_cached(mn: bytes, mx: bytes, shape: tuple[int, ...], num_bits: int,
                  narrow_range: bool) -> Nudged:
    p = _nudge(np.frombuffer(mn, F32).reshape(shape), np.frombuffer(mx, F32).reshape(shape),
               num_bits, narrow_range)
    arrays = [np.array(a) for a in (p.nmin, p.nmax, p.scale, p.inv, p.qz, p.zero)]
    for a in arrays:
        a.flags.writeable = False
    return Nudged(*arrays)


def _nudge(mn: np.ndarray, mx: np.ndarray, num_bits: int, narrow_range: bool) -> Nudged:
    qmin = F32(1 if narrow_range else 0)
    qmax = F32((1 << num_bits) - 1)
    mn, mx = ftz(mn), ftz(mx)
    with np.errstate(all="ignore"):
        span = F32(qmax - qmin)
        width = ftz(mx - mn)
        scale = ftz(width / span)
        inv = ftz(span / width)  # not 1 / scale: TF recomputes it for precision
        zf = ftz(qmin - ftz(mn / scale))
        # std::round (half away from zero) of zf >= 0, exact in float64; a NaN zero
        # point becomes 0 (x86's float -> int conversion of NaN, truncated to uint16).
        rounded = np.floor(np.where(np.isnan(zf), 0.0, zf).astype(np.float64) + 0.5)
        zp = np.where(zf < qmin, qmin, np.where(zf > qmax, qmax, rounded)).astype(F32)
        nmin = ftz((qmin - zp) * scale)
        nmax = ftz((qmax - zp) * scale)
        qz = np.floor(ftz(ftz(-nmin * inv) + _HALF)).astype(F32)
    return Nudged(nmin, nmax, scale, inv, qz, (mn == 0) & (mx == 0))


# --------------------------------------------------------------------------------------
# The NumPy reference (the readable specification)
# --------------------------------------------------------------------------------------
def _ref_quantize(x: np.ndarray, p: Nudged, divide: bool) -> np.ndarray:
    """Forward on x (channels last, broadcasting against the parameters)."""
    x = ftz(x)
    with np.errstate(all="ignore"):
        c = np.where(p.nmax < x, p.nmax, x)  # Eigen's cwiseMin(nmax): std::min, keeps NaN
        c = np.where(c < p.nmin, p.nmin, c).astype(F32)  # cwiseMax(nmin)
        shifted = ftz(c - p.nmin)
        t = ftz(shifted / p.scale) if divide else ftz(shifted * p.inv)
        r = np.floor(ftz(ftz(t - p.qz) + _HALF))
        out = ftz(r * p.scale)
    return np.where(p.zero, _ZERO, out).astype(F32)


def _ref_grad(g: np.ndarray, x: np.ndarray, p: Nudged, cost: float
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Gradients on [N, d] data (p of shape [d]): dx, and the per-channel sums (TF's
    thread pool splits each sum in ``shards`` blocks by its cost model)."""
    gf, xf = ftz(g), ftz(x)
    one = F32(1.0)
    with np.errstate(invalid="ignore"):
        inside = np.where((xf >= p.nmin) & (xf <= p.nmax), one, _ZERO)
        below = np.where(xf < p.nmin, one, _ZERO)
        above = np.where(xf > p.nmax, one, _ZERO)
        dx = ftz(gf * inside)
        to_min = ftz(gf * below)
        to_max = ftz(gf * above)
    n, d = x.shape
    shards = num_threads(n, cost, _config.tf_intra_op_threads())
    dmin = np.array([sharded_sum(to_min[:, c].copy(), shards) for c in range(d)], F32)
    dmax = np.array([sharded_sum(to_max[:, c].copy(), shards) for c in range(d)], F32)
    # min == max == 0: TF copies the gradient (no arithmetic, so no flushing).
    dx = np.where(p.zero, g, dx).astype(F32)
    dmin = np.where(p.zero, _ZERO, dmin).astype(F32)
    dmax = np.where(p.zero, _ZERO, dmax).astype(F32)
    return dx, dmin, dmax


# --------------------------------------------------------------------------------------
# Checks
# --------------------------------------------------------------------------------------
def _ftz_attr(v: float) -> float:
    return math.copysign(0.0, v) if abs(v) < FLT_MIN else v


def _args_range(mn: float, mx: float) -> tuple[F32, F32]:
    return F32(_ftz_attr(mn)), F32(_ftz_attr(mx))  # TF reads float attrs with FTZ on


def _check_args_range(op: str, mn: float, mx: float) -> None:
    fmn, fmx = _args_range(mn, mx)
    if not fmn < fmx:  # (NaN bounds fail too)
        raise InvalidArgumentError(
            f"{op}: min has to be smaller than max, was: {_fmt(float(fmn))} >= "
            f"{_fmt(float(fmx))}")


def _check_same_shape(op: str, gradients: np.ndarray, inputs: np.ndarray) -> None:
    if gradients.shape != inputs.shape:
        raise InvalidArgumentError(
            f"{op}: gradient and input must be the same size, got gradients "
            f"{shape_str(gradients.shape)} and inputs {shape_str(inputs.shape)}")


def _check_rank(op: str, name: str, a: np.ndarray, rank: int) -> None:
    if a.ndim != rank:
        raise InvalidArgumentError(f"{op}: `{name}` must be rank {rank} but is rank {a.ndim}")


def _check_channels(op: str, inputs: np.ndarray, mn: np.ndarray, mx: np.ndarray) -> int:
    _check_rank(op, "min", mn, 1)
    _check_rank(op, "max", mx, 1)
    # TF's kernel reads input.dim_size(-1) unchecked and aborts the process on rank 0;
    # the words are those of TF's shape function (graph mode).
    if inputs.ndim < 1:
        raise InvalidArgumentError(
            f"{op}: Shape must be at least rank 1 but is rank 0 for 'inputs' (the channels "
            "are its last dimension)")
    d = inputs.shape[-1]
    if mn.shape[0] != d:
        raise InvalidArgumentError(f"{op}: min has incorrect size, expected {d} was {mn.shape[0]}")
    if mx.shape[0] != d:
        raise InvalidArgumentError(f"{op}: max has incorrect size, expected {d} was {mx.shape[0]}")
    return d


def _bits(num_bits: int) -> int:
    # The op table restricts num_bits to [2, 16]; keep the kernel's own guard (TF's).
    if not (2 <= num_bits <= 16):
        raise InvalidArgumentError("num_bits must be between 2 and 16, inclusive")
    return num_bits


# --------------------------------------------------------------------------------------
# Reference or kernels
# --------------------------------------------------------------------------------------
def _quantize(x: np.ndarray, p: Nudged, divide: bool) -> np.ndarray:
    if _config.use_reference():
        return _ref_quantize(x, p, divide)
    D = _dispatch()
    return D.quantize(x, p, divide)


def _gradient(g: np.ndarray, x: np.ndarray, p: Nudged
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """dx (shape of x) and the sums (shape of p) for scalar or per-channel ranges."""
    per_channel = p.nmin.ndim == 1
    if per_channel and x.shape[-1] == 0:  # no channels: empty outputs
        return np.empty(x.shape, F32), np.empty(0, F32), np.empty(0, F32)
    cost = COST_CHIP if per_channel else COST_FLAT
    if _config.use_reference():  # a scalar range is one channel of flat data
        d = x.shape[-1] if per_channel else 1
        dx, dmin, dmax = _ref_grad(g.reshape(-1, d), x.reshape(-1, d),
                                   p if per_channel else p.as_channel(), cost)
        dx = dx.reshape(x.shape)
        return (dx, dmin, dmax) if per_channel else (dx, dmin[0], dmax[0])
    D = _dispatch()
    return D.gradient(g, x, p, cost)


def _elementwise_grad(g: np.ndarray, x: np.ndarray, p: Nudged) -> np.ndarray:
    if _config.use_reference():
        return _ref_grad(g.reshape(-1, 1), x.reshape(-1, 1), p.as_channel(),
                         COST_FLAT)[0].reshape(x.shape)
    D = _dispatch()
    return D.mask_gradient(g, x, p)


# --------------------------------------------------------------------------------------
# The ops
# --------------------------------------------------------------------------------------
def check(op: str, args: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Every check of ``op``'s arguments that needs only their shapes, dtypes and attrs, in
    TF's order (array inputs may be shape-only placeholders; see :mod:`tfgrad._shapes`).
    Every output's shape follows the op table's rule, so none is returned."""
    inputs, mn, mx = args["inputs"], args["min"], args["max"]
    check_alloc(op, "output", inputs.shape, F32)
    grad = op.endswith("Gradient")
    if op.startswith("FakeQuantWithMinMaxArgs"):
        _check_args_range(op, mn, mx)
        if grad and args["gradients"].shape != inputs.shape:
            raise InvalidArgumentError(
                f"Inputs to operation {op} of type {op} must have the same size and shape.  "
                f"Input 0: {shape_str(args['gradients'].shape)} != input 1: "
                f"{shape_str(inputs.shape)}")
    elif op.startswith("FakeQuantWithMinMaxVarsPerChannel"):
        if grad:
            _check_rank(op, "min", mn, 1)
            _check_rank(op, "max", mx, 1)
            _check_same_shape(op, args["gradients"], inputs)
        _check_channels(op, inputs, mn, mx)
    else:
        _check_rank(op, "min", mn, 0)
        _check_rank(op, "max", mx, 0)
        if grad:
            _check_same_shape(op, args["gradients"], inputs)
    _bits(args["num_bits"])
    return {}


def prepare(op: str, args: dict[str, Any]) -> Callable[[dict[str, Any]], Any]:
    """``check`` and what follows from the attrs alone (Args' nudged range); returns the
    rest of the op, a function of the arguments (``tfgrad._api`` keeps it per signature)."""
    check(op, args)
    bits, narrow = args["num_bits"], args["narrow_range"]
    if op == "FakeQuantWithMinMaxArgs":
        p = nudge(*_args_range(args["min"], args["max"]), bits, narrow)
        return lambda a: _quantize(a["inputs"], p, divide=False)
    if op == "FakeQuantWithMinMaxArgsGradient":
        p = nudge(*_args_range(args["min"], args["max"]), bits, narrow)
        return lambda a: _elementwise_grad(a["gradients"], a["inputs"], p)
    if op == "FakeQuantWithMinMaxVars":
        return lambda a: _quantize(a["inputs"], nudge(a["min"], a["max"], bits, narrow),
                                   divide=True)
    if op == "FakeQuantWithMinMaxVarsGradient":
        def vars_gradient(a: dict[str, Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
            dx, dmin, dmax = _gradient(a["gradients"], a["inputs"],
                                       nudge(a["min"], a["max"], bits, narrow))
            return dx, np.asarray(dmin, F32).reshape(()), np.asarray(dmax, F32).reshape(())
        return vars_gradient
    if op == "FakeQuantWithMinMaxVarsPerChannel":
        return lambda a: _quantize(a["inputs"], nudge(a["min"], a["max"], bits, narrow),
                                   divide=False)
    assert op == "FakeQuantWithMinMaxVarsPerChannelGradient", op
    return lambda a: _gradient(a["gradients"], a["inputs"],
                               nudge(a["min"], a["max"], bits, narrow))


def FakeQuantWithMinMaxArgs(*, inputs: np.ndarray, min: float, max: float, num_bits: int,
                            narrow_range: bool) -> np.ndarray:
    args = locals()
    return prepare("FakeQuantWithMinMaxArgs", args)(args)


def FakeQuantWithMinMaxArgsGradient(*, gradients: np.ndarray, inputs: np.ndarray, min: float,
                                    max: float, num_bits: int, narrow_range: bool
                                    ) -> np.ndarray:
    args = locals()
    return prepare("FakeQuantWithMinMaxArgsGradient", args)(args)


def FakeQuantWithMinMaxVars(*, inputs: np.ndarray, min: np.ndarray, max: np.ndarray,
                            num_bits: int, narrow_range: bool) -> np.ndarray:
    args = locals()
    return prepare("FakeQuantWithMinMaxVars", args)(args)


def FakeQuantWithMinMaxVarsGradient(*, gradients: np.ndarray, inputs: np.ndarray,
                                    min: np.ndarray, max: np.ndarray, num_bits: int,
                                    narrow_range: bool
                                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    args = locals()
    return prepare("FakeQuantWithMinMaxVarsGradient", args)(args)


def FakeQuantWithMinMaxVarsPerChannel(*, inputs: np.ndarray, min: np.ndarray,
                                      max: np.ndarray, num_bits: int, narrow_range: bool
                                      ) -> np.ndarray:
    args = locals()
    return prepare("FakeQuantWithMinMaxVarsPerChannel", args)(args)


def FakeQuantWithMinMaxVarsPerChannelGradient(*, gradients: np.ndarray, inputs: np.ndarray,
                                              min: np.ndarray, max: np.ndarray, num_bits: int,
                                              narrow_range: bool
                                              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    args = locals()
    return prepare("FakeQuantWithMinMaxVarsPerChannelGradient", args)(args)
