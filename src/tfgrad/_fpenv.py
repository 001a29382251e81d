"""TF's floating-point environment: denormals flushed to zero (FTZ and DAZ).

TF runs its CPU kernels with the MXCSR bits FTZ (a denormal result becomes a zero of its
sign) and DAZ (a denormal operand reads as zero) set, in its pool threads and around
every op (``port::ScopedFlushDenormal``). The depthwise convolutions therefore give 0,
not a denormal, for ``[1e-20] * [1e-20]`` in float32, and read a 1e-39 input as 0.
``flush_denormals()`` sets the same bits around a block on the calling thread and puts
them back after, so the NumPy references and the Numba kernels compute TF's bits without
changing the caller's floating-point environment. MXCSR governs SSE / AVX arithmetic
(float32 and float64; the half types are computed in float32).

x86-64 only: elsewhere the block runs in the default environment (no flushing) and
denormal results can differ from TF's.
"""

from __future__ import annotations

import contextlib
import platform
import threading
from collections.abc import Iterator
from typing import Any

_FTZ_DAZ = 0x8040  # MXCSR bit 15 (flush to zero) and bit 6 (denormals are zero)
X86 = platform.machine().lower() in ("x86_64", "amd64")

_LOCK = threading.Lock()
_FNS: tuple[Any, Any] | None = None


def _functions() -> tuple[Any, Any]:
    """Numba functions reading and writing this thread's MXCSR (compiled on first use)."""
    global _FNS
    if _FNS is not None:  # (every op call comes here: no lock once compiled)
        return _FNS
    with _LOCK:
        if _FNS is None:
            from llvmlite import ir
            from numba import njit, types
            from numba.core import cgutils
            from numba.extending import intrinsic

            i8p, i32 = ir.IntType(8).as_pointer(), ir.IntType(32)

            def _csr(builder, name, slot):  # type: ignore[no-untyped-def]
                fn = cgutils.get_or_insert_function(
                    builder.module, ir.FunctionType(ir.VoidType(), [i8p]), name)
                builder.call(fn, [builder.bitcast(slot, i8p)])

            @intrinsic
            def _stmxcsr(typingctx):  # type: ignore[no-untyped-def]
                def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
                    slot = cgutils.alloca_once(builder, i32)
                    _csr(builder, "llvm.x86.sse.stmxcsr", slot)
                    return builder.zext(builder.load(slot), ir.IntType(64))

                return types.int64(), codegen

            @intrinsic
            def _ldmxcsr(typingctx, v):  # type: ignore[no-untyped-def]
                def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
                    slot = cgutils.alloca_once(builder, i32)
                    builder.store(builder.trunc(args[0], i32), slot)
                    _csr(builder, "llvm.x86.sse.ldmxcsr", slot)
                    return context.get_dummy_value()

                return types.none(types.int64), codegen

            @njit(cache=True)
            def get() -> int:  # pragma: no cover - compiled
                return _stmxcsr()

            @njit(cache=True)
            def put(v: int) -> None:  # pragma: no cover - compiled
                _ldmxcsr(v)

            _FNS = (get, put)
    return _FNS


def flush_this_thread() -> None:
    """Set FTZ and DAZ on this thread for good (for tfgrad's own pool threads)."""
    if X86:
        get, put = _functions()
        put(get() | _FTZ_DAZ)


@contextlib.contextmanager
def flush_denormals() -> Iterator[None]:
    """Run the block with FTZ and DAZ set on this thread, as TF runs its kernels."""
    if not X86:
        yield
        return
    get, put = _functions()
    old = get()
    put(old | _FTZ_DAZ)
    try:
        yield
    finally:
        put(old)
