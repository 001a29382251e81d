"""TF's floating-point environment: denormals flushed to zero (FTZ and DAZ).

TF runs its CPU kernels with the MXCSR bits FTZ (a denormal result becomes a zero of its
sign) and DAZ (a denormal operand reads as zero) set, in its pool threads and around
every op (``port::ScopedFlushDenormal``). Its kernels therefore give 0, not a
denormal, for ``1e-20 * 1e-20`` in float32, and read a 1e-39 input as 0; the depthwise,
batch-norm and fractional-pooling ops (fake quant flushes with explicit bit operations)
run under ``flush_denormals()``.
``flush_denormals()`` sets the same bits around a block on the calling thread and puts
them back after, so the NumPy references and the Numba kernels compute TF's bits without
changing the caller's floating-point environment. Numba's ``prange`` worker threads are
not the caller's: a parallel kernel sets the bits in its loop body and puts them back at
the end of it (``tfgrad._tf.mxcsr.ftz_enter`` / ``ftz_exit``). MXCSR governs SSE / AVX
arithmetic (float32 and float64; the half types are computed in float32).

x86-64 only: elsewhere the block runs in the default environment (no flushing) and
denormal results can differ from TF's.

(Numba is imported on the first flushed block, not with this module: the ops modules
import it, and importing them must stay cheap.)
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .._config import X86

# The compiled MXCSR access (tfgrad._tf.mxcsr), loaded with Numba on the first use.
_FTZ_DAZ = 0
_GET: Callable[[], int] | None = None
_PUT: Callable[[int], None] | None = None


def _load() -> None:
    """Import the compiled MXCSR access and start Numba's workers (once)."""
    global _FTZ_DAZ, _GET, _PUT
    from .._compile import start_workers
    from .mxcsr import FTZ_DAZ, mxcsr_get, mxcsr_put

    start_workers()  # before any flushed block: new threads inherit the bits
    _FTZ_DAZ, _GET, _PUT = FTZ_DAZ, mxcsr_get, mxcsr_put


def flush_this_thread() -> None:
    """Set FTZ and DAZ on this thread for good (for tfgrad's own pool threads)."""
    if X86:
        if _PUT is None:
            _load()
        _PUT(_GET() | _FTZ_DAZ)  # type: ignore[misc]


class flush_denormals:  # (lower case: used as a function, ``with flush_denormals():``)
    """Run the block with FTZ and DAZ set on this thread, as TF runs its kernels.

    (A class, not a ``contextlib`` generator: every op enters one, and the generator's
    machinery costs more than the block it guards on a small op.)"""

    __slots__ = ("old",)

    def __enter__(self) -> None:
        if X86:
            if _PUT is None:
                _load()
            self.old = _GET()  # type: ignore[misc]
            _PUT(self.old | _FTZ_DAZ)  # type: ignore[misc]

    def __exit__(self, *exc: object) -> None:
        if X86:
            _PUT(self.old)  # type: ignore[misc]


def flushed(a: np.ndarray) -> np.ndarray:
    """``a`` with its denormals replaced by zeros of their sign, whatever MXCSR says: what
    TF's flushed arithmetic leaves where NumPy would copy a value (a maximum) or where a
    reference models the flush explicitly (fake quant)."""
    a = np.asarray(a)
    return np.where(np.abs(a) < np.finfo(a.dtype).tiny, np.copysign(a.dtype.type(0), a), a)
