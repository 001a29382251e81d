"""MatMul on the compiled contraction (``tfgrad.kernels.matmul``): A read in place
(transposed or not), B copied to rows of a multiple of 16 columns where it is not already,
one kernel launch per K-shard of TF's plan, Eigen's one-wide edge blocks recomputed in
oneDNN's GEMV order, the shards combined in Eigen's order."""

from __future__ import annotations

import numpy as np

from .._compile import launch
from .._tf.contraction import Plan, combine
from .._tf.fpenv import flush_denormals
from .._tf.onednn import edges
from ..kernels import matmul as k

F32 = np.float32
_FAMILY = "matmul"


def _padded(x: np.ndarray, cols: int) -> np.ndarray:
    """x [K, N] C-contiguous with ``cols`` >= N columns, zeros past N (copied if needed)."""
    if x.shape[1] == cols and x.flags.c_contiguous:
        return x
    out = np.empty((x.shape[0], cols), F32)
    k.pad_columns(x, out)
    return out


def matmul(a: np.ndarray, b: np.ndarray, ta: bool, tb: bool, p: Plan) -> np.ndarray:
    """The contraction path (min(M, K, N) > 1) with TF's plan ``p``."""
    A = a.T if ta else a  # read in place, any strides
    K = A.shape[1]
    M, N = A.shape[0], (b.shape[0] if tb else b.shape[1])
    Mp, Np = -(-M // 4) * 4, -(-N // 16) * 16
    B = _padded(b.T if tb else b, Np).reshape(-1)
    work = M * N * K
    units = (Mp // 4) * -(-Np // 32)
    bufs = []
    for sh in p.shards:
        r = np.array(sh.ranges, np.int64).reshape(-1, 2)
        C = np.empty((Mp, Np), F32)
        # (the kernel sets FTZ / DAZ itself: DAZ reads denormal inputs as 0)
        launch(_FAMILY, k.contract, work, A, B, Np, r, C.reshape(-1), units=units)
        c = C if (Mp, Np) == (M, N) else np.ascontiguousarray(C[:M, :N])
        if sh.gemv_m or sh.gemv_n:  # Eigen's one-wide edge blocks: oneDNN's GEMVs
            with flush_denormals():
                edges(A, B.reshape(K, Np)[:, :N], sh.blocks, sh.gemv_m, sh.gemv_n, c)
        bufs.append(c.reshape(-1))
    out = bufs[0] if len(bufs) == 1 else combine(bufs)
    return out.reshape(M, N)
