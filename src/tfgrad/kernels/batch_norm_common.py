"""What the batch-norm kernels of both directions share (``tfgrad.kernels.batch_norm``
and ``batch_norm_grad``): the block sizes, the NCHW row spans and elementwise span, and the
vector elementwise pass of NHWC with C a multiple of 16 (``ROWS_VEC``)."""

from __future__ import annotations

from numba import prange, uint64

from .._compile import Twins, inline
from .._tf.mxcsr import ftz_enter, ftz_exit
from ._simd import prefetch, vadd, vfull, vload, vmul, vput, vstore, vstore_nt, vsub

SLOT = 256  # most channels per NHWC column-sum block (buffer slot size)
ROWS = 128  # NHWC row block of the elementwise passes


# --------------------------------------------------------------------------------------
# NHWC with C a multiple of 16: explicit float32 x 16 vectors (kernels._simd), up to four
# channel vectors (64 channels) per block with every accumulator in a register. The sums
# are the same per-lane additions in the same order as the scalar kernels' (one lane per
# channel), so the results are the same bits; what changes is the memory traffic:
# - the sums prefetch PF rows ahead into L2 (a block reads 256 of every C*4 bytes, a
#   strided pattern the hardware prefetcher alone follows at a fraction of the streaming
#   bandwidth);
# - y / x_backprop go out with non-temporal stores when large (no read for ownership,
#   and x stays in the last-level cache instead of being evicted by the output).
# --------------------------------------------------------------------------------------
L = 16  # float32 lanes of a _simd vector
PF = 16  # rows prefetched ahead by the column sums
VEC_BLOCK = 4 * L  # most channels per block: four vectors of accumulators


@inline
def prefetch_row(x, i, nv):  # type: ignore[no-untyped-def]
    for v in range(nv):
        prefetch(x, i + uint64(v * L))


@inline
def image_span(j, stop, C, S, c):  # type: ignore[no-untyped-def]
    """The rows [j, stop) have in their first image n = j // S: channel c's flat offset
    there and the positions [s, e) they cover (rows j = n*S + s of flat [N, C, S])."""
    n = j // S
    s = j - n * S
    return (n * C + c) * S, s, min(S, s + (stop - j))


@inline
def span(kind, dy, x, out, s, e, a, b, c, m, stream):  # type: ignore[no-untyped-def]
    """The elementwise pass over one contiguous NCHW span out[s:e] with one channel's
    scalars: kind 0 y = (x - a) * b + c, kind 1 dx = a * ((dy - c) - (x - m) * b), kind 2
    dx = dy * a. Whole vectors from the first index that is a multiple of L (out is
    64-byte aligned when ``stream``: non-temporal stores there), single values around."""
    va, vb, vc, vm = vfull(x, a), vfull(x, b), vfull(x, c), vfull(x, m)
    v0 = min(e, -(-s // L) * L)
    v1 = v0 + (e - v0) // L * L
    for i in range(s, v0):
        out[i] = _span1(kind, dy[i], x[i], a, b, c, m)
    for i in range(v0, v1, L):
        q = uint64(i)
        if kind == 0:
            v = vadd(vmul(vsub(vload(x, q), va), vb), vc)
        elif kind == 1:
            v = vmul(va, vsub(vsub(vload(dy, q), vc), vmul(vsub(vload(x, q), vm), vb)))
        else:
            v = vmul(vload(dy, q), va)
        if stream:
            vstore_nt(out, q, v)
        else:
            vstore(out, q, v)
    for i in range(v1, e):
        out[i] = _span1(kind, dy[i], x[i], a, b, c, m)


@inline
def _span1(kind, g, v, a, b, c, m):  # type: ignore[no-untyped-def]
    if kind == 0:
        return (v - a) * b + c
    if kind == 1:
        return a * ((g - c) - (v - m) * b)
    return g * a


def _make_rows_vec(grad: bool, stream: bool):  # type: ignore[no-untyped-def]
    """The elementwise pass on flat [R, C], C % 16 == 0, in parallel over row blocks:
    y = (x - a) * b + c (forward) or dx = a * ((dy - c) - (x - m) * b) (training
    gradient; with frozen statistics dx is written by the sums pass). a, b, c, m carry
    4 * L slack entries. With ``stream`` the output (64-byte aligned) is written with
    non-temporal stores."""

    def rows(dy, x, R, C, a, b, c, m, out):  # type: ignore[no-untyped-def]
        nblk = (R + ROWS - 1) // ROWS
        for blk in prange(nblk):
            fz = ftz_enter()
            for j in range(blk * ROWS, min(R, blk * ROWS + ROWS)):
                base = uint64(j) * uint64(C)
                for t in range(0, C, L):
                    q = uint64(t)
                    i = base + q
                    if not grad:
                        vput(out, i, vadd(vmul(vsub(vload(x, i), vload(a, q)), vload(b, q)),
                                          vload(c, q)), stream)
                    else:
                        xc = vmul(vsub(vload(x, i), vload(m, q)), vload(b, q))
                        vput(out, i, vmul(vload(a, q), vsub(vsub(vload(dy, i), vload(c, q)),
                                                            xc)), stream)
            ftz_exit(fz)

    return Twins(rows)


ROWS_VEC = {(g, s): _make_rows_vec(g, s) for g in (False, True) for s in (False, True)}
"""The vector elementwise pass by (gradient, streamed stores)."""
