"""Numba kernels for BiasAdd and BiasAddGrad's column sums (the spec: tfgrad.ops.bias_add
and docs/bias_add.md).

TF's FTZ / DAZ: every parallel loop body sets the MXCSR bits on its thread
(``ftz_enter`` / ``ftz_exit``), so the plain additions flush as TF's do and vectorize; the
NaN-choosing helper (``_sum``, for the rare NaN columns) flushes explicitly. The column sums follow
``ReduceOuterDimensions`` (``tfgrad._tf.eigen.redux_blocks``): a task is (TF's call, block
of channels); each adds its rows in sequence into its own buffer, so the order of every
addition is fixed by the shape and TF's thread count, never by ours.
"""

from __future__ import annotations

import numpy as np
from numba import prange

from .._compile import Twins, inline, jit
from .._tf.mxcsr import ftz_enter, ftz_exit

WIDTH = 64  # channels per task of the column sums
_U = np.uint64  # unsigned indices: no wraparound checks, so loops vectorize


@inline
def _ftz(v, tiny):
    # FTZ / DAZ: a denormal becomes a zero of its sign; NaN and inf pass.
    return v if abs(v) >= tiny else v * 0


@inline
def _sum(a, b, tiny):
    # a + b (b flushed) as x86 adds: a NaN result is a's, else b's NaN (selects only, so
    # that the loop vectorizes).
    s = _ftz(a + b, tiny)
    return s if s == s else (a + a if a != a else (b + b if b != b else s))


@inline
def _add(x, b):
    # x + b under FTZ / DAZ (MXCSR); which NaN: x's (quietened) if x is one, else b's
    # (x86's first operand; LLVM may swap the operands of the add itself)
    s = x + b
    return s if s == s else (x + x if x != x else (b + b if b != b else s))


def _bias_rows(x, bias, out, tiny):  # pragma: no cover - compiled
    """NHWC: x, out [R, C]."""
    r, c = x.shape
    chunk = 256
    for t in prange((r + chunk - 1) // chunk):
        fz = ftz_enter()
        for i in range(t * chunk, min(r, (t + 1) * chunk)):
            for j in range(c):
                out[i, j] = _add(x[i, j], bias[j])
        ftz_exit(fz)


def _bias_planes(x, bias, out, tiny):  # pragma: no cover - compiled
    """NCHW: x, out [B, C, HW]."""
    b, c, hw = x.shape
    for t in prange(b * c):
        fz = ftz_enter()
        k = t // c
        ch = t % c
        v = bias[ch]
        for j in range(hw):
            out[k, ch, j] = _add(x[k, ch, j], v)
        ftz_exit(fz)


def _column_sums(x, c, rows, per_call, buffers, tiny):  # pragma: no cover - compiled
    """buffers[s] += rows [s * rows, (s + per_call) * rows) of x (flat [R, c]), in
    sequence, for every call s of TF's parallelFor (buffers start at +0). A NaN sum may
    carry the wrong NaN (LLVM may swap the operands of the vectorized add): dispatch
    redoes those columns with ``column_sum_nan``."""
    r = x.size // c
    nb = buffers.shape[0]
    ncalls = (nb + per_call - 1) // per_call
    nchunks = (c + WIDTH - 1) // WIDTH
    for t in prange(ncalls * nchunks):
        s = (t // nchunks) * per_call
        c0 = (t % nchunks) * WIDTH
        w = min(c, c0 + WIDTH) - c0
        fz = ftz_enter()  # TF's FTZ / DAZ by the hardware: the plain add vectorizes
        acc = np.zeros(WIDTH, x.dtype)
        for i in range(s * rows, min(r, (s + per_call) * rows)):
            base = _U(i * c + c0)
            for j in range(w):
                acc[j] = acc[j] + x[base + _U(j)]
        for j in range(w):
            buffers[s, c0 + j] = acc[j]
        ftz_exit(fz)


@jit
def column_sum_nan(x, c, j, r0, r1, tiny):  # pragma: no cover - compiled
    """Column j's sum over rows [r0, r1) with x86's choice of NaN at every addition."""
    acc = x.dtype.type(0)
    for i in range(r0, r1):
        acc = _sum(acc, _ftz(x[i * c + j], tiny), tiny)
    return acc


bias_rows = Twins(_bias_rows)
bias_planes = Twins(_bias_planes)
column_sums = Twins(_column_sums)
