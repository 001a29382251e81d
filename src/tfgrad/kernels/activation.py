"""Numba kernels for Relu, Relu6 and their gradients (the spec: tfgrad.ops.activation and
docs/activation.md).

Every kernel works on the values' bit patterns (unsigned integers of the float's width):
TF's results are always one of the input's bits, a zero, six or a NaN, chosen by
comparisons that DAZ makes read denormals as zeros, so integer selects reproduce them on
any floating-point environment and vectorize. The constants of the float type
(``tfgrad._tf.relu.Format``) come in as arguments of the array's unsigned type; the
position kind (packet body or scalar tail), Relu6 and DAZ are the variant's closure values,
so that LLVM compiles each variant's loop without branches.

The entry points are ``Twins`` (``tfgrad._compile``) over chunks of ``CHUNK`` values;
``tfgrad.dispatch.activation`` launches them serial or parallel, and runs the few
scalar-tail values (fewer than a packet) through the tail variants.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import prange

from .._compile import Twins, inline

CHUNK = 1 << 15  # values per parallel chunk
# Hot loops index with unsigned integers: Numba adds a negative-index wraparound to every
# signed index it cannot prove >= 0, which stops LLVM from vectorizing the loop.
_U = np.uint64


@inline
def _relu(u, kind, relu6, daz, zero, sign, low, normal, inf, six):
    # (bitwise & | on the conditions, not and / or: no branches, so LLVM vectorizes)
    mag = u & low
    neg = (u & sign) != zero
    big = mag >= normal if daz else mag != zero  # not read as a zero
    if kind == 0:  # packet body: maxps(x, 0)
        out = u if (big & (not neg)) else zero
        if relu6:
            out = min(out, six)  # (out is +0 or positive here)
    else:
        if kind == 1:  # compare and select: x < 0 ? 0 : x
            out = zero if (neg & big) else u
        else:  # maxps(0, x): x flushed
            out = zero if (neg & big) else (u if big else u & sign)
        if relu6:
            out = six if (((out & sign) == zero) & (out > six)) else out
    return u if mag > inf else out


@inline
def _grad(g, f, nan_mode, relu6, daz, zero, sign, low, normal, inf, quiet, six):
    fmag = f & low
    gmag = g & low
    fbig = fmag >= normal if daz else fmag != zero
    pos = ((f & sign) == zero) & (fmag <= inf) & fbig
    if relu6:
        pos = pos & (fmag < six)
    gs = g & sign
    canon = inf | quiet
    # g * 1: g (flushed); g * 0: a zero of g's sign, inf * 0 the default NaN
    kept = (g if gmag >= normal else gs) if daz else g
    default_nan = canon if nan_mode == 2 else sign | canon
    out = kept if pos else (default_nan if gmag == inf else gs)
    # a NaN gradient: quietened, or converted by bfloat16's way back
    if nan_mode == 0:
        nan = g | quiet
    elif nan_mode == 1:
        nan = gs | canon
    else:
        nan = canon
    return nan if gmag > inf else out


def _make_forward(kind: int, relu6: bool, daz: bool) -> Any:
    """out[i] = Relu(6) of x[i] for values of one position kind."""
    def kernel(x, out, zero, sign, low, normal, inf, six):  # pragma: no cover - compiled
        n = x.size
        for c in prange((n + CHUNK - 1) // CHUNK):
            a = c * CHUNK
            b = min(n, a + CHUNK)
            for j in range(b - a):
                i = _U(a + j)
                out[i] = _relu(x[i], kind, relu6, daz, zero, sign, low, normal, inf, six)
    return Twins(kernel)


def _make_backward(nan_mode: int, relu6: bool, daz: bool) -> Any:
    """out[i] = gradients[i] * mask(features[i]) for values of one NaN mode."""
    def kernel(g, f, out, zero, sign, low, normal, inf, quiet, six
               ):  # pragma: no cover - compiled
        n = f.size
        for c in prange((n + CHUNK - 1) // CHUNK):
            a = c * CHUNK
            b = min(n, a + CHUNK)
            for j in range(b - a):
                i = _U(a + j)
                out[i] = _grad(g[i], f[i], nan_mode, relu6, daz, zero, sign, low, normal,
                               inf, quiet, six)
    return Twins(kernel)


# Every variant, built at import (compiled on first use): (kind or NaN mode, relu6, daz).
_FLAGS = [(m, r, d) for m in (0, 1, 2) for r in (False, True) for d in (False, True)]
_FORWARD = {f: _make_forward(*f) for f in _FLAGS}
_BACKWARD = {f: _make_backward(*f) for f in _FLAGS}


def forward(kind: int, relu6: bool, daz: bool) -> Any:
    """The forward kernel for values of one position kind."""
    return _FORWARD[kind, relu6, daz]


def backward(nan_mode: int, relu6: bool, daz: bool) -> Any:
    """The gradient kernel for values of one NaN mode."""
    return _BACKWARD[nan_mode, relu6, daz]
