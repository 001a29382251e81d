"""Eigen's float32 reciprocal on AVX packets: the processor's ``rcpps`` refined by one
Newton step (``generic_reciprocal_newton_step``, EIGEN_FAST_MATH), without FMA.

``x = rcpps(a)`` (about 12 bits; Intel's and AMD's tables differ, and TF's bits with
them: this module calls the instruction of the processor it runs on), then
``e = 1 - a * x`` and ``x + x * e``, each product and sum rounded to float32; where
``e`` is NaN (a is 0 or inf) the estimate ``x`` itself. TF's ``Softmax`` takes
``sum.inverse()`` through it for the rows in packets of 8 (tfgrad.ops.softmax).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

F32 = np.float32


@intrinsic
def rcpps(typingctx, x):  # type: ignore[no-untyped-def]
    """The processor's ``rcpps`` on one float32 (lane 0 of an SSE register)."""
    sig = types.float32(types.float32)

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        v4 = ir.VectorType(ir.FloatType(), 4)
        vec = builder.insert_element(ir.Constant(v4, ir.Undefined), args[0],
                                     ir.Constant(ir.IntType(32), 0))
        fn = builder.module.declare_intrinsic("llvm.x86.sse.rcp.ps",
                                              fnty=ir.FunctionType(v4, [v4]))
        return builder.extract_element(builder.call(fn, [vec]),
                                       ir.Constant(ir.IntType(32), 0))

    return sig, codegen


@njit(cache=True)
def _rcpps_array(a):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
    out = np.empty_like(a)
    for i in range(a.size):
        out[i] = rcpps(a[i])
    return out


def preciprocal(a: np.ndarray) -> np.ndarray:
    """Eigen's ``preciprocal<Packet8f>`` value by value (the NumPy model)."""
    a = np.ascontiguousarray(a, F32).reshape(-1)
    x = _rcpps_array(a)
    with np.errstate(all="ignore"):
        e = (F32(1) - (a * x).astype(F32)).astype(F32)
        r = ((x * e).astype(F32) + x).astype(F32)
    return np.where(e == e, r, x)
