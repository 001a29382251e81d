"""Fake quantization in torch tensor ops, on any device: TF 2.21's FakeQuantWithMinMax{Args,
Vars,VarsPerChannel} and their gradients.

The formulas of :mod:`tfgrad.ops.fake_quant`'s NumPy reference (the spec; TF's behaviours:
docs/fake_quant.md), one torch op per float32 operation of TF's kernel, so that every value
is rounded exactly as TF rounds it: plain elementwise ops (no addcmul-style fused ops),
divisions of a tensor by a tensor (CUDA divides by a host scalar as a multiplication by its
reciprocal), ``torch.where`` for TF's ``std::min`` / ``std::max`` clamp (``torch.clamp``
orders min and max the other way, which matters when min > max) and TF's round-half-up
``floor(v + 0.5)``.

- Args: min and max are attrs, so the range is nudged on the host (float32 NumPy,
  :func:`tfgrad.ops.fake_quant.nudge`); Vars and PerChannel nudge their min/max tensors on
  their device with tensor ops, the zero point rounded half away from zero (std::round)
  without float64.
- Denormals: TF runs its kernels with FTZ and DAZ. Flushing inputs, gradients, min/max,
  the nudging steps and ``c - nudged_min`` reproduces every result of that (the grid index
  ``t`` needs none: a denormal ``t`` rounds to the same grid point as 0, and the output
  ``r * scale`` with a flushed scale is never denormal).
- The forward and ``backprops(_wrt_input)`` are bit-identical to the exact kernels.
- ``backprop_wrt_min/max`` are ``torch.sum``: float32 sums in torch's order, not Eigen's
  tree (nor TF's thread split), and partial sums are not flushed (see BOUNDS).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from ...ops import fake_quant as _fq

_F32 = torch.float32
_TINY = float(np.finfo(np.float32).tiny)  # smallest normal float32

# Largest distance from the exact kernels (tfgrad._distance), op -> output -> dtype.
BOUNDS: dict[str, dict[str, dict[str, float]]] = {
    "FakeQuantWithMinMaxArgs": {"outputs": {"float32": 0}},
    "FakeQuantWithMinMaxArgsGradient": {"backprops": {"float32": 0}},
    "FakeQuantWithMinMaxVars": {"outputs": {"float32": 0}},
    # The sums (torch's order, not Eigen's tree) are within 2.4 U * sum(|terms|) (U = 2**-24),
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
    "FakeQuantWithMinMaxVarsGradient": "backprop_wrt_min/max are summed in torch's order, "
    "not Eigen's reduction tree nor TF's thread-count-dependent split.",
    "FakeQuantWithMinMaxVarsPerChannelGradient": "backprop_wrt_min/max are summed in torch's "
    "order, not Eigen's reduction tree nor TF's thread-count-dependent split.",
}


class _Range(NamedTuple):
    """The nudged range: Python floats (Args) or float32 tensors of min's shape."""

    nmin: float | torch.Tensor
    nmax: float | torch.Tensor
    scale: float | torch.Tensor
    inv: float | torch.Tensor
    qz: float | torch.Tensor
    zero: torch.Tensor | None
    """min == max == 0 (Vars, PerChannel): zeros out, gradients passed through."""


def _ftz(v: torch.Tensor) -> torch.Tensor:
    """Denormals to zeros of their sign (TF's FTZ / DAZ); NaN and inf unchanged."""
    return torch.where(v.abs() < _TINY, v * 0.0, v)


def _host_range(mn: float, mx: float, num_bits: int, narrow_range: bool) -> _Range:
    p = _fq.nudge(np.float32(mn), np.float32(mx), num_bits, narrow_range)
    return _Range(float(p.nmin), float(p.nmax), float(p.scale), float(p.inv), float(p.qz),
                  None)


def _device_range(mn: torch.Tensor, mx: torch.Tensor, num_bits: int,
                  narrow_range: bool) -> _Range:
    """TF's Nudge on float32 tensors, every step flushed (FTZ) as TF computes it."""
    qmin = 1.0 if narrow_range else 0.0
    qmax = float((1 << num_bits) - 1)
    mn, mx = _ftz(mn), _ftz(mx)
    span = torch.full_like(mn, qmax - qmin)
    width = _ftz(mx - mn)
    scale = _ftz(width / span)
    inv = _ftz(span / width)  # not 1 / scale: TF computes it separately
    zf = _ftz(qmin - _ftz(mn / scale))
    # std::round (half away from zero) of zf, which is >= qmin >= 0 where it is used.
    whole = torch.trunc(zf)
    rounded = whole + ((zf - whole) >= 0.5).to(_F32)
    rounded = torch.where(torch.isnan(zf), 0.0, rounded)  # x86's uint16 cast of NaN: 0
    zp = torch.where(zf < qmin, qmin, torch.where(zf > qmax, qmax, rounded))
    nmin = _ftz((qmin - zp) * scale)
    nmax = _ftz((qmax - zp) * scale)
    qz = torch.floor(_ftz(_ftz(-nmin * inv) + 0.5))
    return _Range(nmin, nmax, scale, inv, qz, (mn == 0) & (mx == 0))


def _quantize(x: torch.Tensor, p: _Range, divide: bool) -> torch.Tensor:
    x = _ftz(x)
    c = torch.where(x > p.nmax, p.nmax, x)  # std::min(x, nmax): a NaN x stays NaN
    c = torch.where(c < p.nmin, p.nmin, c)
    shifted = _ftz(c - p.nmin)
    t = shifted / p.scale if divide else shifted * p.inv  # Vars divides (scale is a tensor)
    out = torch.floor((t - p.qz) + 0.5) * p.scale
    return out if p.zero is None else torch.where(p.zero, 0.0, out)


def _masked(g: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
    """TF's ``g * mask`` with a 1.0 / 0.0 mask: g * 0.0 is -0.0 or NaN where g is negative
    or not finite."""
    return torch.where(cond, g, g * 0.0)


def _input_backprop(g: torch.Tensor, x: torch.Tensor, p: _Range
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dx, and the values summed into dmin and dmax."""
    g, x = _ftz(g), _ftz(x)
    dx = _masked(g, (x >= p.nmin) & (x <= p.nmax))
    return dx, _masked(g, x < p.nmin), _masked(g, x > p.nmax)


def _pass_through(g: torch.Tensor, dx: torch.Tensor, dmin: torch.Tensor, dmax: torch.Tensor,
                  zero: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    # min == max == 0: TF copies the gradient (unflushed) and returns zero sums.
    return (torch.where(zero, g, dx), torch.where(zero, 0.0, dmin),
            torch.where(zero, 0.0, dmax))


# --------------------------------------------------------------------------------------
# The ops
# --------------------------------------------------------------------------------------
def FakeQuantWithMinMaxArgs(*, inputs: torch.Tensor, min: float, max: float, num_bits: int,
                            narrow_range: bool) -> torch.Tensor:
    return _quantize(inputs, _host_range(min, max, num_bits, narrow_range), divide=False)


def FakeQuantWithMinMaxArgsGradient(*, gradients: torch.Tensor, inputs: torch.Tensor,
                                    min: float, max: float, num_bits: int,
                                    narrow_range: bool) -> torch.Tensor:
    return _input_backprop(gradients, inputs,
                           _host_range(min, max, num_bits, narrow_range))[0]


def FakeQuantWithMinMaxVars(*, inputs: torch.Tensor, min: torch.Tensor, max: torch.Tensor,
                            num_bits: int, narrow_range: bool) -> torch.Tensor:
    return _quantize(inputs, _device_range(min, max, num_bits, narrow_range), divide=True)


def FakeQuantWithMinMaxVarsGradient(*, gradients: torch.Tensor, inputs: torch.Tensor,
                                    min: torch.Tensor, max: torch.Tensor, num_bits: int,
                                    narrow_range: bool
                                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    p = _device_range(min, max, num_bits, narrow_range)
    dx, to_min, to_max = _input_backprop(gradients, inputs, p)
    assert p.zero is not None
    return _pass_through(gradients, dx, to_min.sum(), to_max.sum(), p.zero)


def FakeQuantWithMinMaxVarsPerChannel(*, inputs: torch.Tensor, min: torch.Tensor,
                                      max: torch.Tensor, num_bits: int, narrow_range: bool
                                      ) -> torch.Tensor:
    # Channels are the last dimension: min/max of shape [d] broadcast against it.
    return _quantize(inputs, _device_range(min, max, num_bits, narrow_range), divide=False)


def FakeQuantWithMinMaxVarsPerChannelGradient(
    *, gradients: torch.Tensor, inputs: torch.Tensor, min: torch.Tensor, max: torch.Tensor,
    num_bits: int, narrow_range: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    p = _device_range(min, max, num_bits, narrow_range)
    dx, to_min, to_max = _input_backprop(gradients, inputs, p)
    d = inputs.shape[-1]
    rows = inputs.numel() // d if d else 0

    def colsum(v: torch.Tensor) -> torch.Tensor:
        return v.reshape(rows, d).sum(0)

    assert p.zero is not None
    return _pass_through(gradients, dx, colsum(to_min), colsum(to_max), p.zero)
