"""MXCSR, the control register of x86 SSE / AVX arithmetic, read and written from
compiled code: a parallel kernel's loop body runs with TF's FTZ and DAZ on Numba's worker
thread (``ftz_enter``) and leaves that thread as it found it (``ftz_exit``); see
``tfgrad._tf.fpenv``. Elsewhere than x86 the functions do nothing."""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from .._compile import inline, jit
from .._config import X86

FTZ_DAZ = 0x8040
"""MXCSR bit 15 (flush to zero) and bit 6 (denormals are zero)."""


def _mxcsr_call(builder, name, slot):  # type: ignore[no-untyped-def]
    i8p = ir.IntType(8).as_pointer()
    fn = cgutils.get_or_insert_function(builder.module,
                                        ir.FunctionType(ir.VoidType(), [i8p]), name)
    builder.call(fn, [builder.bitcast(slot, i8p)])


@intrinsic
def _stmxcsr(typingctx):  # type: ignore[no-untyped-def]
    def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
        slot = cgutils.alloca_once(builder, ir.IntType(32))
        _mxcsr_call(builder, "llvm.x86.sse.stmxcsr", slot)
        return builder.zext(builder.load(slot), ir.IntType(64))

    return types.int64(), codegen


@intrinsic
def _ldmxcsr(typingctx, v):  # type: ignore[no-untyped-def]
    def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
        slot = cgutils.alloca_once(builder, ir.IntType(32))
        builder.store(builder.trunc(args[0], ir.IntType(32)), slot)
        _mxcsr_call(builder, "llvm.x86.sse.ldmxcsr", slot)
        return context.get_dummy_value()

    return types.none(types.int64), codegen


if X86:

    @inline
    def ftz_enter():  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
        """Set FTZ and DAZ on this thread; returns the MXCSR to give ftz_exit."""
        old = _stmxcsr()
        _ldmxcsr(old | FTZ_DAZ)
        return old

    @inline
    def ftz_exit(old):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
        _ldmxcsr(old)

    @jit
    def mxcsr_get() -> int:  # pragma: no cover - compiled
        return _stmxcsr()

    @jit
    def mxcsr_put(v: int) -> None:  # pragma: no cover - compiled
        _ldmxcsr(v)

else:  # pragma: no cover - elsewhere the default environment (see tfgrad._tf.fpenv)

    @inline
    def ftz_enter():  # type: ignore[no-untyped-def]
        return 0

    @inline
    def ftz_exit(old):  # type: ignore[no-untyped-def]
        pass

    mxcsr_get = mxcsr_put = None  # type: ignore[assignment]
