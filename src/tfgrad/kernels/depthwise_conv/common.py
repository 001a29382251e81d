"""What the depthwise kernels share: TF's rounding of the half types, the 4-term
multiply-add, the signed-zero tests, and the rings of input rows that the register-blocked
kernels read (docs/depthwise_conv.md, "How the kernels compute it")."""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic, overload

from ..._compile import inline
from ..._tf.depthwise import gap_turns_plus
from .._simd import (
    prefetch,
    vload,
    vload_dup2,
    vstore,
)

_HALF = np.float32(0.5)
NONE, F16, BF16 = 0, 1, 2


@intrinsic
def _bits(typingctx, x):
    """The bits of a float32 as uint32."""
    if x != types.float32:
        return None

    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], ir.IntType(32))

    return types.uint32(types.float32), codegen


@intrinsic
def _float(typingctx, u):
    """The float32 whose bits are the low 32 bits of the integer u."""
    if not isinstance(u, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        v = args[0]
        if u.bitwidth > 32:
            v = builder.trunc(v, ir.IntType(32))
        elif u.bitwidth < 32:
            v = builder.zext(v, ir.IntType(32))
        return builder.bitcast(v, ir.FloatType())

    return types.float32(u), codegen


@inline
def _round(v, mode):
    """v rounded to float16 (mode 1) or bfloat16 (mode 2), nearest-even, as float32."""
    f = np.float32(v)
    u = _bits(f)
    sign = u & np.uint32(0x80000000)
    a = u ^ sign
    if a > np.uint32(0x7F800000):  # NaN
        return f
    if mode == 2:
        a = (a + np.uint32(0x7FFF) + ((a >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)
        return _float(a | sign)
    if a < np.uint32(0x38800000):  # below 2**-14: float16 subnormals, multiples of 2**-24
        r = (_float(a) + _HALF) - _HALF  # the sum's ulp is 2**-24: rounds to nearest even
        return _float(_bits(r) | sign)
    a = (a + np.uint32(0xFFF) + ((a >> np.uint32(13)) & np.uint32(1))) & np.uint32(0xFFFFE000)
    if a > np.uint32(0x477FE000):  # beyond 65504
        a = np.uint32(0x7F800000)
    return _float(a | sign)


@inline
def _mac(o, a0, b0, a1, b1, a2, b2, a3, b3, nt, L):
    """o[e] = (((o[e] + a0*b0) + a1*b1) + a2*b2) + a3*b3 over e < L, for the first nt
    terms: each product rounded, then each sum, in term order, with the accumulator in a
    register across the terms."""
    if nt == 4:
        for e in range(L):
            v = o[e] + a0[e] * b0[e]
            v = v + a1[e] * b1[e]
            v = v + a2[e] * b2[e]
            o[e] = v + a3[e] * b3[e]
    elif nt == 3:
        for e in range(L):
            v = o[e] + a0[e] * b0[e]
            v = v + a1[e] * b1[e]
            o[e] = v + a2[e] * b2[e]
    elif nt == 2:
        for e in range(L):
            v = o[e] + a0[e] * b0[e]
            o[e] = v + a1[e] * b1[e]
    else:
        for e in range(L):
            o[e] = o[e] + a0[e] * b0[e]


@inline
def _round_all(v, mode):
    for e in range(v.size):
        v[e] = _round(v[e], mode)


@inline
def _tap_range(off, sw, W, ow):
    """[j0, j1): the output columns j whose pixel j*sw + off lies inside [0, W)."""
    j0 = min(ow, max(0, -(off // sw)))
    j1 = max(j0, min(ow, (W - 1 - off) // sw + 1))
    return j0, j1


# --------------------------------------------------------------------------------------
# Signed zeros. A tap TF computes as w * 0 (or, for a dilated convolution, a tap of
# TF's explicitly dilated filter: x * 0, g * 0) adds +-0, which changes an accumulator
# only when it is -0 (a sum that flushed or underflowed), turning it into +0. A kernel
# that skips such taps therefore returns TF's bits except that some of TF's +0 come out
# -0 (never the reverse: adding a zero cannot make a -0), so its -0 outputs are redone
# exactly by the element functions below: every real tap computed, each gap of inserted
# taps between two decided by _gap_turns_plus. The register-blocked
# kernels start the sums they test from ``vzeros_opaque``: LLVM assumes no FTZ, where a
# sum started from +0 is never -0, and folded the test away when they started from +0.
# --------------------------------------------------------------------------------------
@inline
def _negzero(v):
    return v == 0 and np.signbit(v)


def _int_view(a):  # pragma: no cover - overloaded below
    pass


@overload(_int_view, inline="always")
def _int_view_impl(a):
    it = np.int32 if a.dtype == types.float32 else np.int64
    return lambda a: a.ravel().view(it)


@inline
def _any_negzero(a):
    """Whether a (contiguous) holds a -0: its bits as signed integers are the least."""
    u = _int_view(a)
    if u.size == 0:
        return False
    m = u[0]
    for v in u:
        m = min(m, v)  # (a min reduction vectorises; a search loop does not)
    return m == np.iinfo(u.dtype).min


@inline
def _tap_step(acc, wv, v, mode):
    """acc + wv * v, rounded to T."""
    acc = acc + wv * v
    return acc if mode == NONE else _round(acc, mode)


# (The reference's own function, compiled into the cached redo kernels below. Numba keys
# their cache on this file alone: after editing gap_turns_plus, clear __pycache__.)
_gap_turns_plus = inline(gap_turns_plus)
_P = 4  # output pixels per register block


@inline
def _ring_rows(FH, dh):
    """Rows of a kernel's row ring (slot: row mod its size). The span of a filter's rows,
    (FH - 1) * dh + 1, keeps a row in place for the next output rows that need it; past
    8 * FH rows (a large dilation, which would size the ring by the dilation) the
    smallest prime p >= FH that does not divide dh, where one output row's FH rows still
    take distinct slots (p divides no t * dh, 0 < t < FH)."""
    span = (FH - 1) * dh + 1
    if span <= 8 * FH:
        return span
    p = FH
    while True:
        prime = p >= 2
        f = 2
        while prime and f * f <= p:
            prime = p % f != 0
            f += 1
        if prime and dh % p != 0:
            return p
        p += 1


@inline
def _row_offset(xf, n, ii, H, W, C, M, ring, tags):
    """Where input row (n, ii) starts in the kernel's source: in x itself when M = 1,
    else in its ring slot (ii mod the ring's rows), expanded there on first use with each
    channel repeated M times, so that a tap's lanes k*M + q are contiguous."""
    if M == 1:
        return (n * H + ii) * W * C
    s = ii % tags.size
    d0 = s * W * C * M
    if tags[s] != n * H + ii:
        # Unsigned indices and M = 2 spelled out: LLVM vectorises these loops (the
        # generic scalar loop cost as much as the convolution's arithmetic).
        u = np.uint64
        s0, dd, m = u((n * H + ii) * W * C), u(d0), u(M)
        if M == 2:
            for e in range(u(W * C)):
                v = xf[s0 + e]
                ring[dd + u(2) * e] = v
                ring[dd + u(2) * e + u(1)] = v
        else:
            for e in range(u(W * C)):
                v = xf[s0 + e]
                for q in range(m):
                    ring[dd + e * m + q] = v
        tags[s] = n * H + ii
    return d0


@inline
def _row_offset_blocked(xf, n, ii, H, W, C, M, NL, ring, tags):
    """_row_offset for M = 2 and C * M a multiple of the lanes, into a ring whose rows
    are blocked by channel vector: lane l of channel vector q at pixel p is at
    q * W * NL + p * NL + l. A sweep of one channel vector along a row then reads
    consecutive lines, which stay in L1 from one 4-pixel block to the next (in the
    pixel-major layout they are C * M values apart and the prefetchers miss them).
    M = 1 only reorders (BackpropInput's out_backprop rows, whose C holds C * M). No
    other M: expanded lane by lane (a division per lane) the ring costs more than the
    layout saves (the pixel-major ring's expansion loop vectorises)."""
    s = ii % tags.size
    CM = C * M
    d0 = s * W * CM
    if tags[s] != n * H + ii:
        u = np.uint64
        src, dd, nl, w, nq = u((n * H + ii) * W * C), u(d0), u(NL), u(W), u(CM // NL)
        if M == 1:
            for p in range(w):
                for q in range(nq):
                    vstore(ring, dd + (q * w + p) * nl, vload(xf, src + p * u(C) + q * nl))
        else:
            for p in range(w):
                for q in range(nq):
                    vstore(ring, dd + (q * w + p) * nl,
                           vload_dup2(xf, src + p * u(C) + q * (nl // u(2))))
        tags[s] = n * H + ii
    return d0


@inline
def _ring_row(xf, n, ii, H, W, C, M, NL, ring, tags, blocked):
    """Input row (n, ii)'s offset in the kernel's source: _row_offset_blocked when
    ``blocked`` (M = 2 on whole lane vectors), else _row_offset."""
    if blocked:
        return _row_offset_blocked(xf, n, ii, H, W, C, M, NL, ring, tags)
    return _row_offset(xf, n, ii, H, W, C, M, ring, tags)


@inline
def _prefetch_step(pn, parts):
    """Elements per part (whole 16-element steps) when pn elements' prefetches are
    spread over ``parts`` blocks of work."""
    return 16 * -(-pn // (16 * max(1, parts)))


@inline
def _prefetch_part(a, pa, pn, step):
    """Prefetch the next ``step`` of the pn elements left at a[pa:]; returns where the
    rest starts and how many are left."""
    for e in range(0, step, 16):
        if e < pn:
            prefetch(a, pa + e)
    return pa + step, pn - step
