"""Image patches for Conv2D and its backprops: im2col (TF's Im2col / Eigen's image
patches) and Col2im (TF's scatter-add into a zeroed dx), whose float32 adds run in TF's
order (oh, ow, kh, kw, c) per image; and oneDNN's gemm_smalln_tn, the contraction of
Conv2DBackpropInput's sharded path when OH*OW < 16 (16 FMA lanes over k mod 16, halved).
"""

from __future__ import annotations

import numpy as np
from numba import prange

from .._compile import Twins
from .._tf.mxcsr import ftz_enter, ftz_exit
from ._simd import vload, vload_part, vstore, vstore_part, vzeros
from .matmul import fma32, vadd, vfma


def _im2col(x, KH, KW, OH, OW, sh, sw, dh, dw, pt, pl, t0, cols):  # type: ignore[no-untyped-def]  # pragma: no cover  # noqa: E501
    """cols [rows*OW, KH*KW*C]: the patches of output rows t0 .. t0 + rows - 1 (row t:
    image t // OH, oh = t % OH) of x [n, H, W, C], in (image, oh, ow) order, K in
    (kh, kw, c) order, zeros for the padding taps. One task per output row; an undilated
    filter row inside the image is one contiguous run of KW*C values."""
    n, H, W, C = x.shape
    xf = x.reshape(-1)
    run = KW * C
    for u in prange(cols.shape[0] // OW):
        t = t0 + u
        b = t // OH
        i = t % OH
        for j in range(OW):
            p = u * OW + j
            c0 = j * sw - pl
            inside = dw == 1 and c0 >= 0 and c0 + KW <= W
            for kh in range(KH):
                r = i * sh - pt + kh * dh
                k = kh * run
                if r < 0 or r >= H:
                    for q in range(run):
                        cols[p, k + q] = np.float32(0.0)
                elif inside:
                    base = ((b * H + r) * W + c0) * C
                    for q in range(run):
                        cols[p, k + q] = xf[base + q]
                else:
                    for kw in range(KW):
                        c = c0 + kw * dw
                        if 0 <= c < W:
                            base = ((b * H + r) * W + c) * C
                            for ch in range(C):
                                cols[p, k + ch] = xf[base + ch]
                        else:
                            for ch in range(C):
                                cols[p, k + ch] = np.float32(0.0)
                        k += C


def _col2im(col, KH, KW, OH, OW, sh, sw, pt, pl, dx):  # type: ignore[no-untyped-def]  # pragma: no cover  # noqa: E501
    """dx [n, H, W, C] (zeroed) += col [n*OH*OW, KH*KW*C], each image in
    TF's Col2im order; images are independent (one per iteration). A filter row inside
    the image is one run of KW*C adds into distinct values of dx (so in any order)."""
    n, H, W, C = dx.shape
    F = col.shape[1]
    run = KW * C
    colf = col.reshape(-1)
    dxf = dx.reshape(-1)
    for b in prange(n):
        fz = ftz_enter()
        for i in range(OH):
            for j in range(OW):
                p = ((b * OH + i) * OW + j) * F
                c0 = j * sw - pl
                inside = c0 >= 0 and c0 + KW <= W
                for kh in range(KH):
                    r = i * sh - pt + kh
                    if r < 0 or r >= H:
                        continue
                    k = p + kh * run
                    if inside:
                        base = ((b * H + r) * W + c0) * C
                        if run <= 16:  # one masked vector add (distinct values of dx)
                            vstore_part(dxf, base, vadd(vload_part(dxf, base, run),
                                                        vload_part(colf, k, run)), run)
                        else:
                            for q in range(run):
                                dxf[base + q] += colf[k + q]
                    else:
                        for kw in range(KW):
                            c = c0 + kw
                            if 0 <= c < W:
                                base = ((b * H + r) * W + c) * C
                                for ch in range(C):
                                    dxf[base + ch] += colf[k + kw * C + ch]
        ftz_exit(fz)


def _smalln(A, B, C):  # type: ignore[no-untyped-def]  # pragma: no cover
    """C [R, F] = A [R, K] x B [F, K]^T (both C-contiguous) as oneDNN's gemm_smalln_tn:
    per output, lane l of 16 a FMA chain from +0 over k = l (mod 16), then lanes l + 8,
    l + 4, l + 2, l + 1 added in halving steps. The full 16-wide steps run as one vector
    FMA; the last K % 16 values of k go to their lanes one by one."""
    R, K = A.shape
    F = B.shape[0]
    K16 = K - K % 16
    Af = A.reshape(-1)
    Bf = B.reshape(-1)
    for f in prange(F):
        fz = ftz_enter()
        acc = np.empty(16, np.float32)
        for r in range(R):
            v = vzeros(Af)
            for k0 in range(0, K16, 16):
                v = vfma(vload(Af, r * K + k0), vload(Bf, f * K + k0), v)
            vstore(acc, 0, v)
            for lane in range(K - K16):
                acc[lane] = fma32(A[r, K16 + lane], B[f, K16 + lane], acc[lane])
            h = 8
            while h >= 1:
                for i in range(h):
                    acc[i] = acc[i] + acc[i + h]
                h //= 2
            C[r, f] = acc[0]
        ftz_exit(fz)


smalln = Twins(_smalln)
im2col = Twins(_im2col)
col2im = Twins(_col2im)
