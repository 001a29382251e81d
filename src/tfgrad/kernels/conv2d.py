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
from ._simd import (
    vfold1,
    vfold2,
    vfold4,
    vfold8,
    vlane,
    vload,
    vload_part,
    vstore,
    vstore_part,
    vzeros,
)
from .matmul import fma32, vadd, vfma, vfma_first


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
    FMA, the last K % 16 values of k as one FMA on their lanes. Sixteen rows at a time:
    their chains interleaved, their halving steps as vector adds of shuffled lanes
    (``vfold8`` .. ``vfold1``: the same adds, lane for lane); the rows past the last 16
    one at a time."""
    R, K = A.shape
    F = B.shape[0]
    K16 = K - K % 16
    T = K - K16
    Af = A.reshape(-1)
    Bf = B.reshape(-1)
    for f in prange(F):
        fz = ftz_enter()
        fk = f * K
        r = 0
        while r + 16 <= R:
            o = r * K
            v0 = vzeros(Af)
            v1, v2, v3, v4, v5, v6, v7 = v0, v0, v0, v0, v0, v0, v0
            v8, v9, v10, v11, v12, v13, v14, v15 = v0, v0, v0, v0, v0, v0, v0, v0
            for k0 in range(0, K16, 16):
                b = vload(Bf, fk + k0)
                q = o + k0
                v0 = vfma(vload(Af, q), b, v0)
                v1 = vfma(vload(Af, q + K), b, v1)
                v2 = vfma(vload(Af, q + 2 * K), b, v2)
                v3 = vfma(vload(Af, q + 3 * K), b, v3)
                v4 = vfma(vload(Af, q + 4 * K), b, v4)
                v5 = vfma(vload(Af, q + 5 * K), b, v5)
                v6 = vfma(vload(Af, q + 6 * K), b, v6)
                v7 = vfma(vload(Af, q + 7 * K), b, v7)
                v8 = vfma(vload(Af, q + 8 * K), b, v8)
                v9 = vfma(vload(Af, q + 9 * K), b, v9)
                v10 = vfma(vload(Af, q + 10 * K), b, v10)
                v11 = vfma(vload(Af, q + 11 * K), b, v11)
                v12 = vfma(vload(Af, q + 12 * K), b, v12)
                v13 = vfma(vload(Af, q + 13 * K), b, v13)
                v14 = vfma(vload(Af, q + 14 * K), b, v14)
                v15 = vfma(vload(Af, q + 15 * K), b, v15)
            if T > 0:  # the last K % 16 values of k: their lanes only
                b = vload_part(Bf, fk + K16, T)
                q = o + K16
                v0 = vfma_first(vload_part(Af, q, T), b, v0, T)
                v1 = vfma_first(vload_part(Af, q + K, T), b, v1, T)
                v2 = vfma_first(vload_part(Af, q + 2 * K, T), b, v2, T)
                v3 = vfma_first(vload_part(Af, q + 3 * K, T), b, v3, T)
                v4 = vfma_first(vload_part(Af, q + 4 * K, T), b, v4, T)
                v5 = vfma_first(vload_part(Af, q + 5 * K, T), b, v5, T)
                v6 = vfma_first(vload_part(Af, q + 6 * K, T), b, v6, T)
                v7 = vfma_first(vload_part(Af, q + 7 * K, T), b, v7, T)
                v8 = vfma_first(vload_part(Af, q + 8 * K, T), b, v8, T)
                v9 = vfma_first(vload_part(Af, q + 9 * K, T), b, v9, T)
                v10 = vfma_first(vload_part(Af, q + 10 * K, T), b, v10, T)
                v11 = vfma_first(vload_part(Af, q + 11 * K, T), b, v11, T)
                v12 = vfma_first(vload_part(Af, q + 12 * K, T), b, v12, T)
                v13 = vfma_first(vload_part(Af, q + 13 * K, T), b, v13, T)
                v14 = vfma_first(vload_part(Af, q + 14 * K, T), b, v14, T)
                v15 = vfma_first(vload_part(Af, q + 15 * K, T), b, v15, T)
            s = vfold1(vfold2(vfold4(vfold8(v0, v1), vfold8(v2, v3)),
                              vfold4(vfold8(v4, v5), vfold8(v6, v7))),
                       vfold2(vfold4(vfold8(v8, v9), vfold8(v10, v11)),
                              vfold4(vfold8(v12, v13), vfold8(v14, v15))))
            for i in range(16):
                C[r + i, f] = vlane(s, i)
            r += 16
        acc = np.empty(16, np.float32)
        while r < R:
            v = vzeros(Af)
            for k0 in range(0, K16, 16):
                v = vfma(vload(Af, r * K + k0), vload(Bf, fk + k0), v)
            vstore(acc, 0, v)
            for lane in range(T):
                acc[lane] = fma32(A[r, K16 + lane], B[f, K16 + lane], acc[lane])
            h = 8
            while h >= 1:
                for i in range(h):
                    acc[i] = acc[i] + acc[i + h]
                h //= 2
            C[r, f] = acc[0]
            r += 1
        ftz_exit(fz)


smalln = Twins(_smalln)
im2col = Twins(_im2col)
col2im = Twins(_col2im)
