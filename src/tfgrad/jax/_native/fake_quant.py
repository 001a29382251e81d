"""Fake quantization in jax.numpy, jittable on any backend: TF 2.21's FakeQuantWithMinMax{Args,
Vars,VarsPerChannel} and their gradients.

The formulas of :mod:`tfgrad.ops.fake_quant`'s NumPy reference (the spec; TF's behaviours:
docs/fake_quant.md), one operation per float32 rounding of TF's kernel. XLA does not keep
that by itself: it contracts a multiply and a following add into an FMA (measured on CPU),
reassociates constants (``(t - 3) + 0.5`` becomes ``t - 2.5``; Args' nudged range is
constant) and divides by a constant as a multiplication by its reciprocal. :func:`_r` and
:func:`_div` put a select XLA and LLVM cannot see through where that would change a
rounding; :func:`_div` divides with ``_ieee.div_rn`` (XLA:GPU's own float32 division is up
to 2 ulps off, a quantization step here).

- Args: min and max are attrs, so the range is nudged on the host (float32 NumPy,
  :func:`tfgrad.ops.fake_quant.nudge`); Vars and PerChannel nudge their min/max arrays in
  the graph, the zero point rounded half away from zero (std::round) without float64.
- Denormals: TF runs its kernels with FTZ and DAZ (so does XLA:CPU, but not every
  backend). Flushing inputs, gradients, min/max, the nudging steps and ``c - nudged_min``
  explicitly reproduces every result of that on any backend.
- The forward and ``backprops(_wrt_input)`` are bit-identical to the exact kernels.
- ``backprop_wrt_min/max`` are ``jnp.sum``: float32 sums in XLA's order, not Eigen's
  tree (nor TF's thread split), partial sums not flushed (see BOUNDS).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax.numpy as jnp
import numpy as np

from ...ops import fake_quant as _fq
from ._ieee import div_rn

_F32 = jnp.float32
_TINY = np.float32(np.finfo(np.float32).tiny)  # smallest normal float32
_HALF = np.float32(0.5)
_NAN = np.float32(np.nan)

# Largest distance from the exact kernels (tfgrad._distance), op -> output -> dtype.
BOUNDS: dict[str, dict[str, dict[str, float]]] = {
    "FakeQuantWithMinMaxArgs": {"outputs": {"float32": 0}},
    "FakeQuantWithMinMaxArgsGradient": {"backprops": {"float32": 0}},
    "FakeQuantWithMinMaxVars": {"outputs": {"float32": 0}},
    # The sums (XLA's order, not Eigen's tree) are within 2.4 U * sum(|terms|) (U = 2**-24),
    # which is up to thousands of ulps of a sum whose terms cancel.
    "FakeQuantWithMinMaxVarsGradient": {"backprops_wrt_input": {"float32": 0},
                                        "backprop_wrt_min": {"float32": 8192},
                                        "backprop_wrt_max": {"float32": 8192}},
    "FakeQuantWithMinMaxVarsPerChannel": {"outputs": {"float32": 0}},
    "FakeQuantWithMinMaxVarsPerChannelGradient": {"backprops_wrt_input": {"float32": 0},
                                                  "backprop_wrt_min": {"float32": 8192},
                                                  "backprop_wrt_max": {"float32": 8192}},
}

NOTES: dict[str, str] = {
    "FakeQuantWithMinMaxVarsGradient": "backprop_wrt_min/max are summed in XLA's order, "
    "not Eigen's reduction tree nor TF's thread-count-dependent split.",
    "FakeQuantWithMinMaxVarsPerChannelGradient": "backprop_wrt_min/max are summed in XLA's "
    "order, not Eigen's reduction tree nor TF's thread-count-dependent split.",
}

Array = Any  # a jax.Array (or anything jnp.asarray takes)


def _r(v: Array) -> Array:
    """``v`` as computed, rounded once: a select XLA and LLVM cannot fold keeps a multiply
    out of the next add (no FMA) and constants from being reassociated across it."""
    return jnp.where(jnp.isnan(v), _NAN, v)


def _div(a: Array, b: Array) -> Array:
    """``a / b`` rounded once (div_rn: never a reciprocal of a nudged range folded from
    constant min/max), ``b`` kept from being reassociated with constants (:func:`_r`)."""
    return div_rn(a, _r(b))


def _ftz(v: Array) -> Array:
    """Denormals to zeros of their sign (TF's FTZ / DAZ); NaN and inf unchanged."""
    return jnp.where(jnp.abs(v) < _TINY, v * np.float32(0), v)


class _Range(NamedTuple):
    """The nudged range: float32 scalars (Args, host) or arrays of min's shape."""

    nmin: Array
    nmax: Array
    scale: Array
    inv: Array
    qz: Array
    zero: Array | None
    """min == max == 0 (Vars, PerChannel): zeros out, gradients passed through."""


def _host_range(mn: float, mx: float, num_bits: int, narrow_range: bool) -> _Range:
    p = _fq.nudge(np.float32(mn), np.float32(mx), num_bits, narrow_range)
    return _Range(np.float32(p.nmin), np.float32(p.nmax), np.float32(p.scale),
                  np.float32(p.inv), np.float32(p.qz), None)


def _device_range(mn: Array, mx: Array, num_bits: int, narrow_range: bool) -> _Range:
    """TF's Nudge on float32 arrays, every step flushed (FTZ) as TF computes it."""
    qmin = np.float32(1 if narrow_range else 0)
    qmax = np.float32((1 << num_bits) - 1)
    mn, mx = _ftz(jnp.asarray(mn, _F32)), _ftz(jnp.asarray(mx, _F32))
    span = qmax - qmin
    width = _ftz(mx - mn)
    scale = _ftz(_div(width, span))
    inv = _ftz(_div(jnp.full_like(width, span), width))  # not 1 / scale: TF computes it
    zf = _ftz(qmin - _ftz(_div(mn, scale)))
    # std::round (half away from zero) of zf, which is >= qmin >= 0 where it is used.
    whole = jnp.trunc(zf)
    rounded = whole + (_r(zf - whole) >= _HALF).astype(_F32)
    rounded = jnp.where(jnp.isnan(zf), np.float32(0), rounded)  # x86's uint16 cast of NaN
    zp = jnp.where(zf < qmin, qmin, jnp.where(zf > qmax, qmax, rounded))
    nmin = _r(_ftz(_r(qmin - zp) * scale))
    nmax = _r(_ftz(_r(qmax - zp) * scale))
    qz = jnp.floor(_ftz(_r(_ftz(-nmin * inv)) + _HALF))
    return _Range(nmin, nmax, scale, inv, qz, (mn == 0) & (mx == 0))


def _quantize(x: Array, p: _Range, divide: bool) -> Array:
    x = _ftz(jnp.asarray(x, _F32))
    c = jnp.where(x > p.nmax, p.nmax, x)  # std::min(x, nmax): a NaN x stays NaN
    c = jnp.where(c < p.nmin, p.nmin, c)
    shifted = _r(_ftz(c - p.nmin))
    t = _r(_div(shifted, p.scale) if divide else shifted * p.inv)  # Vars divides
    out = jnp.floor(_r(t - p.qz) + _HALF) * p.scale
    return out if p.zero is None else jnp.where(p.zero, np.float32(0), out)


def _masked(g: Array, cond: Array) -> Array:
    """TF's ``g * mask`` with a 1.0 / 0.0 mask: g * 0.0 is -0.0 or NaN where g is negative
    or not finite (XLA turns a product with a converted mask into a select of 0.0)."""
    return jnp.where(cond, g, g * np.float32(0))


def _input_backprop(g: Array, x: Array, p: _Range) -> tuple[Array, Array, Array]:
    """dx, and the values summed into dmin and dmax."""
    g, x = _ftz(jnp.asarray(g, _F32)), _ftz(jnp.asarray(x, _F32))
    dx = _masked(g, (x >= p.nmin) & (x <= p.nmax))
    return dx, _masked(g, x < p.nmin), _masked(g, x > p.nmax)


def _pass_through(g: Array, dx: Array, dmin: Array, dmax: Array, zero: Array
                  ) -> tuple[Array, Array, Array]:
    # min == max == 0: TF copies the gradient (unflushed) and returns zero sums.
    z = np.float32(0)
    return (jnp.where(zero, jnp.asarray(g, _F32), dx), jnp.where(zero, z, dmin),
            jnp.where(zero, z, dmax))


# --------------------------------------------------------------------------------------
# The ops
# --------------------------------------------------------------------------------------
def FakeQuantWithMinMaxArgs(*, inputs: Array, min: float, max: float, num_bits: int,
                            narrow_range: bool) -> Array:
    return _quantize(inputs, _host_range(min, max, num_bits, narrow_range), divide=False)


def FakeQuantWithMinMaxArgsGradient(*, gradients: Array, inputs: Array, min: float,
                                    max: float, num_bits: int, narrow_range: bool) -> Array:
    return _input_backprop(gradients, inputs,
                           _host_range(min, max, num_bits, narrow_range))[0]


def FakeQuantWithMinMaxVars(*, inputs: Array, min: Array, max: Array, num_bits: int,
                            narrow_range: bool) -> Array:
    return _quantize(inputs, _device_range(min, max, num_bits, narrow_range), divide=True)


def FakeQuantWithMinMaxVarsGradient(*, gradients: Array, inputs: Array, min: Array,
                                    max: Array, num_bits: int, narrow_range: bool
                                    ) -> tuple[Array, Array, Array]:
    p = _device_range(min, max, num_bits, narrow_range)
    dx, to_min, to_max = _input_backprop(gradients, inputs, p)
    assert p.zero is not None
    return _pass_through(gradients, dx, jnp.sum(to_min), jnp.sum(to_max), p.zero)


def FakeQuantWithMinMaxVarsPerChannel(*, inputs: Array, min: Array, max: Array,
                                      num_bits: int, narrow_range: bool) -> Array:
    # Channels are the last dimension: min/max of shape [d] broadcast against it.
    return _quantize(inputs, _device_range(min, max, num_bits, narrow_range), divide=False)


def FakeQuantWithMinMaxVarsPerChannelGradient(*, gradients: Array, inputs: Array, min: Array,
                                              max: Array, num_bits: int, narrow_range: bool
                                              ) -> tuple[Array, Array, Array]:
    p = _device_range(min, max, num_bits, narrow_range)
    dx, to_min, to_max = _input_backprop(gradients, inputs, p)
    rows = tuple(range(dx.ndim - 1))  # every axis but the channels
    assert p.zero is not None
    return _pass_through(gradients, dx, jnp.sum(to_min, axis=rows), jnp.sum(to_max, axis=rows),
                         p.zero)
