"""Eigen's ``pexp_float`` on a whole vector of float32 lanes, for the Softmax and
SparseSoftmaxCrossEntropyWithLogits kernels.

``vpexp`` emits the packet operations of Eigen's ``pexp`` (``tfgrad._tf.expf.pexp``, the
NumPy model; ``tfgrad.kernels.softmax_xent._pexp``, one lane) lane by lane in LLVM IR:
every product and sum rounded on its own (no FMA: Numba emits no contraction flags), the
floor as ``llvm.floor``, and ``ldexp(y, m)`` exact: ``y`` (in [0.7, 1.5], 24 bits) times
``2**m`` built from its exponent bits. The product is exact wherever it is a normal
float32, so it equals the model's float64 product rounded once; below the normal range it
is +0 (TF's FTZ, explicit here so that no result depends on MXCSR; ``m <= -127`` scales
by +0), above it inf (``m = 128``: ``(y * 2**127) * 2``). NaN lanes give their input and
lanes below Eigen's lower bound +0 (computed from the bound), through selects, so the
vector has no branches.
Checked on all 2**32 float32 inputs under FTZ / DAZ: the scalar model's bits on every one
(``tests/test_softmax_pexp.py`` checks a sample of them).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from .._tf.expf import C1, C2, EXP_HI, EXP_LO, HALF, LOG2EF, ONE, P2, P3, P4, P5, P6
from ._simd import Vec

_FLT_MIN = float(np.finfo(np.float32).tiny)


def _vec_f32(v) -> bool:  # type: ignore[no-untyped-def]
    return isinstance(v, Vec) and v.dtype.bitwidth == 32


@intrinsic
def vpexp(typingctx, a):  # type: ignore[no-untyped-def]
    """Eigen's pexp_float per lane (non-FMA AVX build), with TF's FTZ."""
    if not _vec_f32(a):
        return None

    def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
        n = a.lanes
        ft = ir.VectorType(ir.FloatType(), n)
        it = ir.VectorType(ir.IntType(32), n)
        bd = builder

        def f(v):  # type: ignore[no-untyped-def]
            return ir.Constant(ft, [float(v)] * n)

        def i(v):  # type: ignore[no-untyped-def]
            return ir.Constant(it, [int(v)] * n)

        def madd(x, y, z):  # type: ignore[no-untyped-def]
            return bd.fadd(bd.fmul(x, y), z)

        floor = cgutils.get_or_insert_function(bd.module, ir.FunctionType(ft, [ft]),
                                               f"llvm.floor.v{n}f32")
        fabs = cgutils.get_or_insert_function(bd.module, ir.FunctionType(ft, [ft]),
                                              f"llvm.fabs.v{n}f32")
        x0 = args[0]
        isnan = bd.fcmp_unordered("uno", x0, x0)
        x = bd.select(bd.fcmp_ordered(">", x0, f(EXP_HI)), f(EXP_HI), x0)  # pmin(x, hi)
        # below Eigen's bound (+0 there): from the bound itself m = -150, scaled by +0
        x = bd.select(bd.fcmp_ordered("<", x0, f(EXP_LO)), f(EXP_LO), x)
        x = bd.select(isnan, f(0.0), x)  # (NaN lanes give x0, below)
        m = bd.call(floor, [madd(x, f(LOG2EF), f(HALF))])
        r = madd(m, f(C1), x)
        r = madd(m, f(C2), r)
        r2 = bd.fmul(r, r)
        p_even = madd(r2, f(P6), f(P4))
        p_odd = madd(r2, f(P5), f(P3))
        p_even = madd(r2, p_even, f(P2))
        p_low = bd.fadd(r, f(ONE))
        y = madd(r, p_odd, p_even)
        y = madd(r2, y, p_low)
        # ldexp(y, m), m in [-150, 128]
        mi = bd.fptosi(m, it)
        mc = bd.select(bd.icmp_signed(">", mi, i(127)), i(127), mi)
        mc = bd.select(bd.icmp_signed("<", mc, i(-127)), i(-127), mc)
        scale = bd.bitcast(bd.shl(bd.add(mc, i(127)), i(23)), ft)  # m <= -127: +0
        s = bd.fmul(y, scale)
        s = bd.select(bd.icmp_signed("==", mi, i(128)), bd.fmul(s, f(2.0)), s)
        s = bd.select(bd.fcmp_ordered("<", bd.call(fabs, [s]), f(_FLT_MIN)), f(0.0), s)
        # (Eigen's final pmax(ldexp(y, m), x) never picks x on a number: checked on
        # every float32, so it is left out)
        return bd.select(isnan, x0, s)

    return a(a), codegen


@intrinsic
def vgt(typingctx, a, b):  # type: ignore[no-untyped-def]
    """a where a > b, else b, per lane (``maxps(a, b)``'s rule: b when either is NaN)."""
    if not (_vec_f32(a) and b == a):
        return None

    def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
        return builder.select(builder.fcmp_ordered(">", args[0], args[1]), args[0], args[1])

    return a(a, b), codegen


@intrinsic
def vany_nan(typingctx, a):  # type: ignore[no-untyped-def]
    """True if any lane of a is NaN."""
    if not _vec_f32(a):
        return None

    def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
        ne = builder.fcmp_unordered("uno", args[0], args[0])
        bits = builder.bitcast(ne, ir.IntType(a.lanes))
        return builder.icmp_unsigned("!=", bits, ir.IntType(a.lanes)(0))

    return types.boolean(a), codegen


__all__ = ["vany_nan", "vgt", "vpexp"]
