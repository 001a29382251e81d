"""Numba kernels for AvgPool and AvgPoolGrad, float and double (the spec:
tfgrad.ops.avg_pool and docs/avg_pool.md).

Both gather: one task per (image, row) of the output (AvgPool) or of dx (AvgPoolGrad),
each element summed by one thread in TF's order, so results do not depend on the thread
count. The channels are the innermost loop (NHWC), which LLVM vectorises without
reordering any sum: each lane is one channel's chain of additions. Every task sets TF's
FTZ / DAZ on its thread (``ftz_enter``); never fastmath, so ``a + b * c`` stays a rounded
product and a rounded sum, and ``x / count`` a division, as TF's.

- ``forward``: an output starts at +0 and adds its window's cells in row-major order
  (TF scatters each input cell into the outputs whose windows hold it, in row-major
  order: per output, the same order), then divides by ``counts[i, j]``;
- ``grad``: a dx cell starts at +0 and adds ``grad[i, j] * coeff[i, j]`` (the product
  rounded first) over the outputs (i, j) whose windows hold it, in row-major order (TF's
  scatter, output by output).
"""

from __future__ import annotations

import numpy as np

from .._compile import jit
from .._tf.mxcsr import ftz_enter, ftz_exit
from ._pool import claim, tasks

# Flat arrays and unsigned offsets: Numba adds a negative-index wraparound to every signed
# index it cannot prove >= 0, which keeps LLVM from vectorising the channel loops.
_U = np.uint64


def _forward(x, out, counts, N, H, W, C, OH, OW, KH, KW, SH, SW, PT, PL, ctl,
             nthreads):  # pragma: no cover - compiled
    """x [N*H*W*C], out [N*OH*OW*C], counts [OH*OW] (flat, C order)."""
    ntasks = N * OH
    size, cur = tasks(ctl, ntasks, nthreads)
    while claim(ctl, size, ntasks, cur):
        for t in range(cur[0], cur[1]):
            fz = ftz_enter()
            n = t // OH
            i = t - n * OH
            r0 = i * SH - PT
            r1 = min(r0 + KH, H)
            r0 = max(r0, 0)
            for j in range(OW):
                c0 = j * SW - PL
                c1 = min(c0 + KW, W)
                c0 = max(c0, 0)
                ob = _U(((n * OH + i) * OW + j) * C)
                for ch in range(C):
                    out[ob + _U(ch)] = 0
                for r in range(r0, r1):
                    for c in range(c0, c1):
                        xb = _U(((n * H + r) * W + c) * C)
                        for ch in range(C):
                            out[ob + _U(ch)] += x[xb + _U(ch)]
                d = counts[_U(i * OW + j)]
                for ch in range(C):
                    out[ob + _U(ch)] = out[ob + _U(ch)] / d
            ftz_exit(fz)


def _grad(g, dx, coeff, N, H, W, C, OH, OW, KH, KW, SH, SW, PT, PL, ctl,
          nthreads):  # pragma: no cover - compiled
    """g [N*OH*OW*C], dx [N*H*W*C], coeff [OH*OW] (flat, C order)."""
    ntasks = N * H
    size, cur = tasks(ctl, ntasks, nthreads)
    while claim(ctl, size, ntasks, cur):
        for t in range(cur[0], cur[1]):
            fz = ftz_enter()
            n = t // H
            p = t - n * H
            # the outputs i whose windows [i*SH - PT, i*SH - PT + KH) hold row p
            hp = p + PT
            i0 = 0 if hp < KH else (hp - KH) // SH + 1
            i1 = min(hp // SH + 1, OH)
            for q in range(W):
                wq = q + PL
                j0 = 0 if wq < KW else (wq - KW) // SW + 1
                j1 = min(wq // SW + 1, OW)
                ob = _U(((n * H + p) * W + q) * C)
                for ch in range(C):
                    dx[ob + _U(ch)] = 0
                for i in range(i0, i1):
                    for j in range(j0, j1):
                        gb = _U(((n * OH + i) * OW + j) * C)
                        k = coeff[_U(i * OW + j)]
                        for ch in range(C):
                            dx[ob + _U(ch)] += g[gb + _U(ch)] * k
            ftz_exit(fz)


forward = jit(nogil=True)(_forward)
grad = jit(nogil=True)(_grad)
