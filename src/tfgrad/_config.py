"""Process-wide switches: which implementation runs (kernel or reference); what the
machine is (x86 or not, TF's thread count, the processor's name)."""

from __future__ import annotations

import contextlib
import contextvars
import os
import platform
from collections.abc import Iterator

X86 = platform.machine().lower() in ("x86_64", "amd64")
"""Whether this is an x86-64 processor (MXCSR, ``rsqrtps``, ``pause``)."""

_IMPL: contextvars.ContextVar[str] = contextvars.ContextVar("tfgrad_impl", default="kernel")


def impl() -> str:
    """Return ``"kernel"`` (fused Numba kernels, the default) or ``"reference"``."""
    return _IMPL.get()


@contextlib.contextmanager
def use_impl(name: str) -> Iterator[None]:
    """Run the ops inside the block with the given implementation.

    ``"reference"`` selects the plain NumPy specification of each op (slow, readable);
    ``"kernel"`` the fused Numba kernels. Both give the same bits; tests hold them equal.
    """
    if name not in ("kernel", "reference"):
        raise ValueError(f"implementation must be 'kernel' or 'reference', got {name!r}")
    token = _IMPL.set(name)
    try:
        yield
    finally:
        _IMPL.reset(token)


def use_reference() -> bool:
    return _IMPL.get() == "reference"


def tf_intra_op_threads() -> int:
    """The intra-op thread count TF 2.21 would use on this machine.

    A few of TF's sums split their work by this count (fake-quant gradient sums, batch-norm
    gradient column sums on large inputs); tfgrad reproduces the split TF would make.
    ``TFGRAD_TF_INTRA_OP_THREADS`` sets it; else TF's own ``TF_NUM_INTRAOP_THREADS``; else the
    number of CPUs this process may run on (TF's default). tfgrad's own results never depend
    on its own thread count.
    """
    env = _ENV if _ENV is not None else os.environ
    for var in _THREAD_VARS:
        v = env.get(var)
        if v is not None:
            v = v.decode() if type(v) is bytes else v
            if v.strip().isdigit() and int(v) > 0:
                return int(v)
    global _SCHEDULABLE
    if _SCHEDULABLE is None:  # (read once, as TF sizes its pool once; a syscall a call)
        try:
            _SCHEDULABLE = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            _SCHEDULABLE = os.cpu_count() or 1
    return _SCHEDULABLE


_SCHEDULABLE: int | None = None
# os.environ's own dict (kept current by os.environ), read without its per-key encoding
_ENV = getattr(os.environ, "_data", None)
_THREAD_VARS = tuple(os.environ.encodekey(v) if _ENV is not None else v  # type: ignore[attr-defined]
                     for v in ("TFGRAD_TF_INTRA_OP_THREADS", "TF_NUM_INTRAOP_THREADS"))


def cpu_name() -> str:
    """The processor's model name (/proc/cpuinfo; else what ``platform`` knows)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


_MALLOC_VARS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_",
                "MALLOC_MMAP_MAX_")
MALLOC_TUNED = False
"""Whether :func:`tune_malloc` set glibc's thresholds in this process."""


def tune_malloc() -> bool:
    """Start glibc's malloc at the thresholds it otherwise grows into: blocks under 32 MiB
    from its heap, and free memory at the heap's top kept up to 64 MiB.

    glibc begins at 128 KiB and 256 KiB and raises them only as blocks of that size are
    freed; until then (and in some processes for good) a training step's arrays, freed
    at its end, go back to the system and the next step faults their pages in again: a
    QAT MobileNetV2 step took ~3,000 page faults and ~10% longer (benchmarks/RESULTS.md).
    Not set where the user set malloc's own variables (``MALLOC_*_``, ``GLIBC_TUNABLES``)
    or ``TFGRAD_MALLOC=0``; glibc only. Returns whether it set them."""
    global MALLOC_TUNED
    env = os.environ
    if (env.get("TFGRAD_MALLOC", "1").strip() == "0" or any(v in env for v in _MALLOC_VARS)
            or "glibc.malloc." in env.get("GLIBC_TUNABLES", "")):
        return False
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        import ctypes

        mallopt = ctypes.CDLL(None).mallopt
        mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
        # M_MMAP_THRESHOLD (-3) and M_TRIM_THRESHOLD (-1) at glibc's own ceilings on 64-bit
        MALLOC_TUNED = bool(mallopt(-3, 32 << 20)) and bool(mallopt(-1, 64 << 20))
    except (OSError, AttributeError):
        return False
    return MALLOC_TUNED
