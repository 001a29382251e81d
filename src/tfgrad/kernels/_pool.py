"""Threads for kernels that take their tasks in chunks (depthwise convolution, fractional
pooling, reduction, average pooling).

``launch(family, kernel, work, *args, units=...)`` runs a kernel whose task loop starts
with ``tasks`` (it publishes its task count): ``tfgrad._compile.launch``'s counterpart for
``Twins``, one compiled function for any thread count.

``run(kernel, ntasks, threads, *args)`` calls ``kernel(*args, ctl, size, ntasks)`` on
the calling thread and on ``threads - 1`` pool threads at once. Each call takes chunks
of ``size`` tasks with ``claim`` (an atomic add on ``ctl[0]``) until none is left, and
counts the tasks of each chunk it finishes in ``ctl[1]``; the caller returns once
``ctl[1]`` reaches ``ntasks``. So a thread that does not get a CPU simply takes no chunk,
and the caller waits for chunks, never for a thread (Numba's parallel loops split the
work statically and end on a barrier, which on a loaded machine waits for a descheduled
thread). No result depends on which thread takes which chunk.

Why the chunks are claimed in compiled code rather than handed out from Python: on a VM
a sleeping thread is slow to wake (the host has to run its virtual CPU again), and every
chunk would go back through the GIL. Here the caller works while a pool thread wakes, the
pool thread joins when it can, and the caller spins (without the GIL, ``pause`` between
looks) up to ``WAIT_US`` for the other threads' last chunks before it sleeps; not when
there are more threads than CPUs, where a spinning thread takes the CPU another one needs.

The pool threads themselves sleep as soon as an op is done: spinning for the next op made
back-to-back ops no faster and took a CPU from the next Numba-parallel op's threads (as
Numba's OpenMP threads spinning after every kernel would: see ``tfgrad/__init__.py``).
Measurements: benchmarks/RESULTS.md.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from .._compile import POLICY, inline, jit, num_threads
from .._config import X86
from .._tf.fpenv import flush_this_thread

WAIT_US = 300.0
"""How long the calling thread spins for the other threads' last chunks (a few chunks'
time on the depthwise ops) before it sleeps."""


def _int64_slot(context, builder, sig, args):  # type: ignore[no-untyped-def]
    aty = sig.args[0]
    ary = context.make_array(aty)(context, builder, args[0])
    return cgutils.get_item_pointer(context, builder, aty, ary, [args[1]])


def _is_int64_array(arr) -> bool:  # type: ignore[no-untyped-def]
    return isinstance(arr, types.Array) and arr.dtype == types.int64


@intrinsic
def _atomic_add(typingctx, arr, i, v):  # type: ignore[no-untyped-def]
    """arr[i] += v as one atomic step (int64); returns the value before."""
    if not _is_int64_array(arr):
        return None

    def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
        val = context.cast(builder, args[2], sig.args[2], types.int64)
        return builder.atomic_rmw("add", _int64_slot(context, builder, sig, args), val,
                                  "seq_cst")

    return types.int64(arr, i, v), codegen


@intrinsic
def _load_acquire(typingctx, arr, i):  # type: ignore[no-untyped-def]
    """arr[i] (int64), read from memory every time: another thread writes it."""
    if not _is_int64_array(arr):
        return None

    def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
        return builder.load_atomic(_int64_slot(context, builder, sig, args), "acquire", 8)

    return types.int64(arr, i), codegen


@intrinsic
def _pause(typingctx):  # type: ignore[no-untyped-def]
    """x86 ``pause``, the spin-wait hint (nothing elsewhere)."""

    def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
        if X86:
            fn = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(ir.VoidType(), []), "llvm.x86.sse2.pause")
            builder.call(fn, [])
        return context.get_dummy_value()

    return types.none(), codegen


@intrinsic
def _cycles(typingctx):  # type: ignore[no-untyped-def]
    """The cycle counter (the TSC on x86; 0 where LLVM has none)."""

    def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.IntType(64), []), "llvm.readcyclecounter")
        return builder.call(fn, [])

    return types.int64(), codegen


@inline
def claim(ctl, size, ntasks, cur):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
    """Count this thread's last chunk, tasks [cur[0], cur[1]), as done in ctl[1]; claim
    the next one into cur (ctl[0] counts the chunks claimed); whether there was one.
    A kernel's task loop: ``while claim(ctl, size, ntasks, cur): for t in range(cur[0],
    cur[1]): ...`` with ``cur`` zeroed first."""
    if cur[1] > cur[0]:
        _atomic_add(ctl, 1, cur[1] - cur[0])
    t0 = _atomic_add(ctl, 0, 1) * size
    cur[0] = t0
    cur[1] = min(ntasks, t0 + size) if t0 < ntasks else t0
    return t0 < ntasks


@inline
def tasks(ctl, ntasks, nthreads):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
    """Start a kernel run by :func:`launch`: publish its task count (every thread computes
    the same) in ctl[2] for the caller's wait; return the chunk size, 8 chunks a thread
    (as :func:`run`), and ``claim``'s cursor. The task loop: ``size, cur = tasks(ctl,
    ntasks, nthreads)``, then ``while claim(ctl, size, ntasks, cur): for t in
    range(cur[0], cur[1]): ...``."""
    ctl[2] = ntasks
    cur = np.zeros(2, np.int64)
    if nthreads <= 1:  # (this thread's own ctl, reused: start it again)
        ctl[0] = 0
        ctl[1] = 0
        return max(1, ntasks), cur
    if ntasks <= 1:
        return 1, cur
    return -(-ntasks // min(ntasks, 8 * nthreads)), cur


@jit(nogil=True)
def _spin(ctl, i, target, ticks):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
    """Spin while ctl[i] < target, for at most ``ticks`` of the cycle counter; whether
    ctl[i] got there."""
    t0 = _cycles()
    while _load_acquire(ctl, i) < target:
        _pause()
        if _cycles() - t0 > ticks:
            return False
    return True


@jit
def _cycles_now():  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
    return _cycles()


def _ticks_per_us() -> float:
    c0, t0 = _cycles_now(), time.perf_counter()
    time.sleep(0.002)
    c1, t1 = _cycles_now(), time.perf_counter()
    return max(0.0, (c1 - c0) / ((t1 - t0) * 1e6))


def _cpus() -> int:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # (not on every platform)
        return os.cpu_count() or 1


class _Job:
    """One op's call, as the pool threads run it; its own list of their exceptions."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn = fn
        self.errors: list[BaseException] = []


class _Pool:
    def __init__(self, n: int) -> None:
        self.n = n
        self.pid = os.getpid()
        # (more threads than CPUs: no spinning, a spinning thread would take the CPU
        # another one needs)
        self.wait_ticks = int(WAIT_US * _ticks_per_us()) if n + 1 <= _cpus() else 0
        self.posted = 0  # jobs posted (read and written under cv)
        self.job: _Job | None = None
        self.cv = threading.Condition()
        self.busy = threading.Lock()  # one op at a time on the pool
        self.stopped = False
        for k in range(n):
            threading.Thread(target=self._serve, name=f"tfgrad-dwconv-{k}",
                             daemon=True).start()

    def _serve(self) -> None:
        flush_this_thread()  # TF's flushed-denormal environment, once (see _tf.fpenv)
        seen = 0
        while True:
            with self.cv:
                while self.posted == seen and not self.stopped:
                    self.cv.wait()
                if self.stopped:
                    return
                seen, job = self.posted, self.job
            assert job is not None
            try:
                job.fn()
            except BaseException as e:  # (e.g. a compilation error): re-raised by run
                job.errors.append(e)
            with self.cv:
                self.cv.notify_all()

    def run(self, fn: Callable[[], Any], ctl: np.ndarray, ntasks: int | None) -> None:
        """fn() here and on the pool's threads; returns when ctl[1] reaches ntasks (None:
        the count the kernel published in ctl[2], known once this thread's call is done)."""
        job = _Job(fn)
        with self.cv:
            self.job = job
            self.posted += 1
            self.cv.notify_all()
        fn()
        if ntasks is None:
            ntasks = int(ctl[2])
        if not _spin(ctl, 1, ntasks, self.wait_ticks):
            with self.cv:
                while ctl[1] < ntasks and not job.errors:
                    self.cv.wait()
        if job.errors:
            raise job.errors[0]

    def stop(self) -> None:
        with self.cv:
            self.stopped = True
            self.posted += 1
            self.cv.notify_all()


_POOL: _Pool | None = None
_POOL_LOCK = threading.Lock()


def _pool(n: int) -> _Pool:
    """The pool of n threads (a new one after a fork, whose child has no threads)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None or _POOL.n != n or _POOL.pid != os.getpid():
            if _POOL is not None and _POOL.pid == os.getpid():
                _POOL.stop()
            _POOL = _Pool(n)
        return _POOL


def run(kernel, ntasks: int, threads: int, *args) -> None:  # type: ignore[no-untyped-def]
    """kernel(*args, ctl, size, ntasks) over the tasks [0, ntasks) on ``threads``
    threads, this one included, in 8 chunks a thread (the last chunk to finish decides
    the op's time: fewer chunks leave a longer tail, many more cost more than they save)."""
    ctl = np.zeros(2, np.int64)
    nchunks = min(ntasks, 8 * threads) if threads > 1 else 1
    if nchunks <= 1:
        kernel(*args, ctl, max(1, ntasks), ntasks)
        return
    size = -(-ntasks // nchunks)
    # (a kernel not compiled yet is compiled by the first thread to call it; the others
    # wait on Numba's compiler lock, then run it)
    pool = _pool(threads - 1)
    if not pool.busy.acquire(blocking=False):  # another thread's op has the pool
        kernel(*args, ctl, size, ntasks)
        return
    try:
        pool.run(lambda: kernel(*args, ctl, size, ntasks), ctl, ntasks)
    finally:
        pool.busy.release()


def launch(family: str, kernel, work: int, *args, units: int = 2) -> None:  # type: ignore[no-untyped-def]  # noqa: E501
    """``kernel(*args, ctl, nthreads)``, a kernel whose task loop starts with :func:`tasks`,
    on as many threads as ``tfgrad._compile.threads(family, work, units)`` gives (the
    calling thread alone for a small call), all running one compiled function: the
    task-pool counterpart of ``tfgrad._compile.launch`` and its parallel / serial twins."""
    policy = POLICY[family]
    if work < policy.parallel_min or units < 2 or (n := num_threads()) < 2:  # (threads())
        kernel(*args, _own_ctl(), 1)
        return
    pool = _pool(n - 1)
    if not pool.busy.acquire(blocking=False):  # another thread's op has the pool
        kernel(*args, _own_ctl(), 1)
        return
    ctl = np.zeros(3, np.int64)
    try:
        pool.run(lambda: kernel(*args, ctl, n), ctl, None)
    finally:
        pool.busy.release()


def serial(kernel, *args) -> None:  # type: ignore[no-untyped-def]
    """``kernel(*args)`` (a :func:`launch` kernel) on the calling thread alone."""
    kernel(*args, _own_ctl(), 1)


_LOCAL = threading.local()


def _own_ctl() -> np.ndarray:
    """This thread's ctl for kernels it runs alone (``tasks`` zeroes it; a new array
    per call cost a microsecond of a small op's time)."""
    try:
        return _LOCAL.ctl  # type: ignore[no-any-return]
    except AttributeError:
        _LOCAL.ctl = np.zeros(3, np.int64)
        return _LOCAL.ctl  # type: ignore[no-any-return]
