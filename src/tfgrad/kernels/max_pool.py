"""Numba kernels for MaxPool and MaxPoolGrad (the spec: tfgrad.ops.max_pool and
docs/max_pool.md).

Both work on flat C-contiguous NHWC arrays, one output pixel's channels at a time: the
forward with explicit 512-bit vectors (``_simd``) whose running maxima stay in registers
across the window, the gradient with the channel loop innermost (LLVM vectorizes its
compares and selects). TF's DAZ and FTZ are explicit (a denormal becomes a zero of its
sign), so the bits do not depend on the floating-point environment. The forward runs
over rows of output pixels, the gradient over images (its sums cross pixels, never
images): every output is computed by one thread in TF's order, so the bits do not
depend on the thread count.
"""

from __future__ import annotations

import numpy as np
from numba import prange

from .._compile import Twins, inline
from ._simd import flush_denormal, nlanes, vfull, vload, vmax_keep, vstore

# Hot loops index with unsigned integers: Numba adds a negative-index wraparound to every
# signed index it cannot prove >= 0, which stops LLVM from vectorizing the loop.
_U = np.uint64


@inline
def _flush(v, tiny, zero):
    # DAZ / FTZ: a denormal reads (and is written) as a zero of its sign (``tiny`` and
    # ``zero`` come in as the array's type: no conversions in the vector loops)
    return v * zero if abs(v) < tiny else v


@inline
def _span(o, s, p, k, n):
    """The input rows (columns) [lo, hi) of output o's window, clipped to the input."""
    start = o * s - p
    return max(start, 0), min(start + k, n)


@inline
def _tap(a, xf, k):
    # Eigen's cwiseMax under DAZ: (a < x) ? x : a on x read with denormals as zeros
    return vmax_keep(a, flush_denormal(vload(xf, k)))


def _forward(x, out, N, H, W, C, KH, KW, sh, sw, OH, OW, pt, pl, lowest, tiny, zero):
    """Register-blocked: an output pixel's running maxima for four channel vectors stay
    in registers across its window, then one vector, then one value at a time (each
    lane repeats TF's comparisons in TF's order: any blocking gives TF's bits)."""
    L = nlanes(x)
    C4 = C - C % (4 * L)
    C1 = C - C % L
    for row in prange(N * OH):
        n = row // OH
        oh = row - n * OH
        h0, h1 = _span(oh, sh, pt, KH, H)
        init = vfull(x, lowest)
        for ow in range(OW):
            w0, w1 = _span(ow, sw, pl, KW, W)
            o = ((row * OW) + ow) * C
            k0 = ((n * H + h0) * W + w0) * C
            for c in range(0, C4, 4 * L):
                a0 = a1 = a2 = a3 = init
                kr = k0 + c
                for _ in range(h1 - h0):
                    k = kr
                    for _ in range(w1 - w0):
                        a0 = _tap(a0, x, k)
                        a1 = _tap(a1, x, k + L)
                        a2 = _tap(a2, x, k + 2 * L)
                        a3 = _tap(a3, x, k + 3 * L)
                        k += C
                    kr += W * C
                vstore(out, o + c, a0)
                vstore(out, o + c + L, a1)
                vstore(out, o + c + 2 * L, a2)
                vstore(out, o + c + 3 * L, a3)
            for c in range(C4, C1, L):
                a0 = init
                kr = k0 + c
                for _ in range(h1 - h0):
                    k = kr
                    for _ in range(w1 - w0):
                        a0 = _tap(a0, x, k)
                        k += C
                    kr += W * C
                vstore(out, o + c, a0)
            for c in range(C1, C):
                m = lowest
                for h in range(h0, h1):
                    for w in range(w0, w1):
                        v = _flush(x[_U(((n * H + h) * W + w) * C + c)], tiny, zero)
                        m = v if m < v else m
                out[_U(o + c)] = m


forward = Twins(_forward)


def _grad(x, g, out, m, a, N, H, W, C, KH, KW, sh, sw, OH, OW, pt, pl, tiny, zero):
    """``m``, ``a``: scratch [N, C] (each image's window maxima and argmaxes)."""
    for n in prange(N):
        base = _U(n * H * W * C)
        for i in range(H * W * C):
            out[base + _U(i)] = zero
        mb = _U(n * C)
        for oh in range(OH):
            h0, h1 = _span(oh, sh, pt, KH, H)
            for ow in range(OW):
                w0, w1 = _span(ow, sw, pl, KW, W)
                # The argmax: the window's first element, then each x with max < x
                first = _U(((n * H + h0) * W + w0) * C)
                for c in range(C):
                    m[mb + _U(c)] = _flush(x[first + _U(c)], tiny, zero)
                    a[mb + _U(c)] = (h0 * W + w0) * C + c
                for h in range(h0, h1):
                    for w in range(w0, w1):
                        if h == h0 and w == w0:
                            continue
                        i = _U(((n * H + h) * W + w) * C)
                        at = (h * W + w) * C
                        for c in range(C):
                            v = _flush(x[i + _U(c)], tiny, zero)
                            take = m[mb + _U(c)] < v
                            m[mb + _U(c)] = v if take else m[mb + _U(c)]
                            a[mb + _U(c)] = at + c if take else a[mb + _U(c)]
                # TF's += in the output's order, each addition flushed
                gi = _U(((n * OH + oh) * OW + ow) * C)
                for c in range(C):
                    j = base + _U(a[mb + _U(c)])
                    out[j] = _flush(out[j] + _flush(g[gi + _U(c)], tiny, zero), tiny, zero)


grad = Twins(_grad)
