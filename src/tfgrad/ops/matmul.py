"""MatMul: TF 2.21's CPU kernel (``matmul_op_impl.h``, BatchMatMul with is_legacy_matmul).

With the transposes applied, ``[M, K] x [K, N]``; TF takes one of two paths:

- ``min(M, K, N) > 1``: Eigen's ThreadPool tensor contraction (Eigen's m = N, n = M),
  whose blocks run in oneDNN's JIT sgemm: per output, FMA chains from +0 over consecutive
  k-ranges added in order, the ranges chosen by ``tfgrad._tf.contraction.plan`` (they
  depend on TF's thread count and the processor; docs/matmul.md);
- ``min(M, K, N) == 1``: Eigen Core's ``x * y`` (compiled without FMA: every product and
  every sum rounded): K == 1 exact products; a vector output a GEMV (row-major: 8 lanes
  of strided sums, a half packet, scalars; column-major: blocks of k); a 1 x 1 output
  Eigen's inner product; K + M + N < 20 a lazy coefficient product; a -0 sum +0 where
  TF sums into a zeroed output.

This module holds the checks and the NumPy reference (the spec; an exact float32 FMA by
round-to-odd in float64); the compiled contraction is ``tfgrad.kernels.matmul``, run by
``tfgrad.dispatch.matmul``.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any

import numpy as np

from .. import _config
from .._errors import InvalidArgumentError
from .._tf import contraction, onednn
from .._tf.cpuid import eigen_caches, onednn_isa
from .._tf.fpenv import flushed
from .._tf.onednn import add, fma
from .._validate import check_alloc, shape_str

F32 = np.float32
F64 = np.float64
PACKET = 8

@cache
def _dispatch() -> Any:
    from ..dispatch import matmul

    return matmul


def plan(m: int, k: int, n: int) -> contraction.Plan:
    """The contraction's plan for TF's [M, K] x [K, N] on this machine (Eigen's m = N)."""
    return contraction.plan(n, m, k, _config.tf_intra_op_threads(), *eigen_caches(),
                            onednn_isa())


def mul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """float32 a * b, flushed (Eigen Core's non-FMA products)."""
    with np.errstate(invalid="ignore", over="ignore"):
        return flushed(np.multiply(a, b, dtype=F32))


# --------------------------------------------------------------------------------------
# The reference
# --------------------------------------------------------------------------------------
def _chains(A: np.ndarray, B: np.ndarray, ranges: tuple[tuple[int, int], ...]
            ) -> np.ndarray:
    """Per output one FMA chain from +0 over each k-range (oneDNN's accumulators), the
    first chain stored as it is and the others added in order (a chain whose products
    all underflow is a flushed -0, which TF keeps)."""
    c = np.zeros((A.shape[0], B.shape[1]), F32)
    for i, (s, e) in enumerate(ranges):
        acc = np.zeros_like(c)
        for kk in range(s, e):
            acc = fma(A[:, kk:kk + 1], B[kk:kk + 1, :], acc)
        c = acc if i == 0 else add(c, acc)
    return c


def reference_contraction(A: np.ndarray, B: np.ndarray, p: contraction.Plan) -> np.ndarray:
    """Eigen's contraction with oneDNN's blocks: [M, K] x [K, N] (float32, flushed)."""
    M, N = A.shape[0], B.shape[1]
    bufs = []
    for sh in p.shards:
        c = _chains(A, B, sh.ranges)
        if sh.isa == "avx2":
            un, um = onednn.avx2_kinds(M, N, sh.nc, sh.mc, sh.trans_a)
            onednn.avx2_tiles(A, B, sh.ranges, un, um, c)
            for r0, r1, c0, c1 in onednn.copy_fixes(sh, un, um):
                c[r0:r1, c0:c1] = _chains(A[r0:r1], B[:, c0:c1], sh.copy_ranges)
        onednn.edges(A, B, sh.blocks, sh.gemv_m, sh.gemv_n, c)
        bufs.append(c.reshape(-1))
    return contraction.combine(bufs).reshape(M, N)


def _lanes_dot(A: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Eigen's row-major GEMV per row of A [R, K] with x [K] (mul then add): 8 lanes over
    the full packets, their predux ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)), then the last
    products one at a time. Rows go in groups of 8, 4 and 2; a last single row (R odd)
    sums a half packet of 4 after the full ones (predux (h0+h2)+(h1+h3)) before its
    scalars."""
    R, K = A.shape
    k8 = K - K % PACKET
    acc = np.zeros((R, PACKET), F32)
    for j in range(0, k8, PACKET):
        acc = add(acc, mul(A[:, j:j + PACKET], x[None, j:j + PACKET]))
    q = add(acc[:, :4], acc[:, 4:])
    res = add(add(q[:, 0], q[:, 2]), add(q[:, 1], q[:, 3]))
    tail = res[:R - R % 2], res[R - R % 2:]  # grouped rows, the single last row
    for jj in range(k8, K):
        tail = (add(tail[0], mul(A[:R - R % 2, jj], x[jj])), tail[1])
    last = tail[1]
    j = k8
    if R % 2 and K - j >= 4:
        h = mul(A[R - 1:, j:j + 4], x[None, j:j + 4])
        last = add(last, add(add(h[:, 0], h[:, 2]), add(h[:, 1], h[:, 3])))
        j += 4
    for jj in range(j, K):
        last = add(last, mul(A[R - 1:, jj], x[jj]))
    return np.concatenate([tail[0], last])


def _colmajor_gemv(A: np.ndarray, x: np.ndarray, stride: int) -> np.ndarray:
    """Eigen's column-major GEMV y = A x, A [R, K] stored by columns with outer stride
    ``stride``: k in blocks (all of K if K < 128, else 16, or 4 when the stride is 32000
    bytes or more), each block a mul-then-add chain from 0 per output, added to y."""
    R, K = A.shape
    block = K if K < 128 else (16 if stride * 4 < 32000 else 4)
    y = np.zeros(R, F32)
    for s in range(0, K, block):
        c = np.zeros(R, F32)
        for kk in range(s, min(K, s + block)):
            c = add(c, mul(A[:, kk], x[kk]))
        y = add(y, c)
    return y


def _inner_dot(u: np.ndarray, v: np.ndarray) -> np.float32:
    """Eigen's inner product of u*v, both contiguous (``inner_product_impl``, the GEMV's
    1 x 1 fallback): the first four packets start four accumulators, each later group of
    four adds one to each, the one to three packets past the last group add to the first
    ones; then p2 + p3, p1 + p2, p0 + p1, predux, and the last products one at a time."""
    K = u.size
    prod = mul(u, v)
    n = K // PACKET
    if n == 0:
        r = prod[0]
        for j in range(1, K):
            r = add(prod[j], r)
        return F32(r)
    quad = K - K % (4 * PACKET)
    acc = [prod[i * PACKET:(i + 1) * PACKET] for i in range(min(4, n))]
    if n >= 4:
        for j in range(4 * PACKET, quad, 4 * PACKET):
            acc = [add(acc[i], prod[j + i * PACKET:j + (i + 1) * PACKET]) for i in range(4)]
        for i in range(n - quad // PACKET):
            acc[i] = add(acc[i], prod[quad + i * PACKET:quad + (i + 1) * PACKET])
        acc[2] = add(acc[2], acc[3])
    if n >= 3:
        acc[1] = add(acc[1], acc[2])
    if n >= 2:
        acc[0] = add(acc[0], acc[1])
    q = add(acc[0][:4], acc[0][4:])
    r = add(add(q[0], q[2]), add(q[1], q[3]))
    for j in range(n * PACKET, K):
        r = add(prod[j], r)
    return F32(r)


def _sequential_dot(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Products summed left to right from the first (Eigen's lazy product, a strided
    side): u [R, K] and v [K, C] give [R, C]."""
    r = mul(u[:, :1], v[:1, :])
    for kk in range(1, u.shape[1]):
        r = add(r, mul(u[:, kk:kk + 1], v[kk:kk + 1, :]))
    return r


def reference_core(a: np.ndarray, b: np.ndarray, ta: bool, tb: bool) -> np.ndarray:
    """Eigen Core's ``x * y`` (min(M, K, N) == 1), no FMA; a, b as given (row-major).
    Where TF sums into a zeroed output (neither operand transposed; every GEMV and inner
    product, K + M + N >= 20) a -0 comes out +0 (``0 + r``, measured on TF)."""
    A = a.T if ta else a
    B = b.T if tb else b
    r = _core(A, B, ta, tb)
    if (not ta and not tb) or sum(A.shape) + B.shape[1] >= 20:
        r = add(F32(0), r)
    return r


def _core(A: np.ndarray, B: np.ndarray, ta: bool, tb: bool) -> np.ndarray:
    M, K = A.shape
    N = B.shape[1]
    if K == 1:
        return mul(A, B)
    if K + M + N < 20:
        # Lazy coefficient product: each output's products in k order (packets along a
        # contiguous output row and scalar coefficients alike), except a contiguous
        # row x contiguous column, which Eigen's redux vectorises (at most two packets
        # here: the inner product's order).
        if not ta and tb:
            return np.array([[_inner_dot(A[i], B[:, j]) for j in range(N)]
                             for i in range(M)], F32).reshape(M, N)
        return _sequential_dot(A, B)
    if M == 1 and N == 1:
        # The GEMV's inner product: vectorised only when both sides are contiguous at
        # compile time (a's row, b's row), else products summed left to right.
        if not ta and tb:
            return np.array([[_inner_dot(np.ascontiguousarray(A[0]),
                                         np.ascontiguousarray(B[:, 0]))]], F32)
        return _sequential_dot(A, B)
    if N == 1:  # y = A x
        if not ta:
            return _lanes_dot(A, B[:, 0]).reshape(M, 1)
        return _colmajor_gemv(A, B[:, 0], M).reshape(M, 1)
    # M == 1: y^T = B^T x^T
    if tb:
        return _lanes_dot(B.T, A[0]).reshape(1, N)
    return _colmajor_gemv(B.T, A[0], N).reshape(1, N)


def reference(a: np.ndarray, b: np.ndarray, ta: bool, tb: bool) -> np.ndarray:
    a, b = flushed(a), flushed(b)  # DAZ
    M, K = (a.shape[1], a.shape[0]) if ta else a.shape
    N = b.shape[0] if tb else b.shape[1]
    if M == 0 or N == 0 or K == 0:
        return np.zeros((M, N), F32)
    if min(M, K, N) == 1:
        return reference_core(a, b, ta, tb)
    A = a.T if ta else a
    B = b.T if tb else b
    return reference_contraction(A, B, plan(M, K, N))


# --------------------------------------------------------------------------------------
# The op
# --------------------------------------------------------------------------------------
def check(op: str, args: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """TF's MatMul checks (BaseBatchMatMulOp with is_legacy_matmul), in its order."""
    a, b = args["a"], args["b"]
    ta, tb = args["transpose_a"], args["transpose_b"]
    if a.ndim != b.ndim:
        raise InvalidArgumentError(
            f"In[0] and In[1] has different ndims: {shape_str(a.shape)} vs. "
            f"{shape_str(b.shape)}")
    if a.ndim != 2:
        raise InvalidArgumentError(f"In[0] and In[1] ndims must be == 2: {a.ndim}")
    ka = a.shape[0] if ta else a.shape[1]
    kb = b.shape[1] if tb else b.shape[0]
    if ka != kb:
        raise InvalidArgumentError(
            f"Matrix size-incompatible: In[0]: {shape_str(a.shape)}, In[1]: "
            f"{shape_str(b.shape)}")
    M = a.shape[1] if ta else a.shape[0]
    N = b.shape[0] if tb else b.shape[1]
    check_alloc(op, "product", (M, N), F32)
    return {"product": (M, N)}


def prepare(op: str, args: dict[str, Any]) -> Callable[[dict[str, Any]], Any]:
    """``check``, then the path TF takes for these shapes (fixed by the shapes alone)."""
    shapes = check(op, args)
    ta, tb = bool(args["transpose_a"]), bool(args["transpose_b"])
    M, N = shapes["product"]
    K = args["a"].shape[0] if ta else args["a"].shape[1]
    if M == 0 or N == 0 or K == 0:
        return lambda x: np.zeros((M, N), F32)
    if min(M, K, N) == 1:  # Eigen Core's vector paths: O(MK + KN), the reference runs them
        return lambda x: reference(x["a"], x["b"], ta, tb)

    def run(x: dict[str, Any]) -> np.ndarray:
        if _config.use_reference():
            return reference(x["a"], x["b"], ta, tb)
        # the plan reads TF's thread count on every call (it is not a property of the
        # signature); plan() is cached
        return _dispatch().matmul(x["a"], x["b"], ta, tb, plan(M, K, N))
    return run


def MatMul(*, a: np.ndarray, b: np.ndarray, transpose_a: bool, transpose_b: bool,
           grad_a: bool = False, grad_b: bool = False) -> np.ndarray:
    args = locals()
    return prepare("MatMul", args)(args)
