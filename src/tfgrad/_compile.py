"""How tfgrad compiles its kernels and how many threads each call gets: the one policy.

Compiling: every kernel is ``numba.njit`` with :data:`OPTIONS`:

- ``cache=True``: compiled once per machine, then loaded from Numba's on-disk cache. Numba
  keys that cache on the pickled closure of the function, and a Numba function pickles
  with a fresh uuid in every process: a kernel must not close over one (a factory hands
  its flags to the kernel as plain values; ``tests/test_cache.py`` checks this);
- NumPy's error model: no zero-divisor check is emitted (TF's division gives inf / NaN);
- never fastmath: it would let LLVM reorder, contract (FMA) and flush the float operations
  whose order and rounding are TF's.

Helpers are inlined into their callers (:func:`inline`). A kernel worth threading is one
``prange`` function compiled twice (:class:`Twins`): with ``parallel=True``, and as a
serial twin where ``prange`` is ``range``.

Threading: :func:`launch` runs a kernel's serial twin when the call is small for its
family (:data:`POLICY`: waking threads costs more than the work), when it has fewer than
two independent parts, or when Numba has one thread; otherwise the parallel kernel, on
``numba.get_num_threads()`` threads. :func:`threads` is the same choice as a thread count,
for kernels run on tfgrad's own pool (``kernels._pool.run``). No result depends on the
choice: every kernel computes each output in the same order on any number of threads.

Each threshold holds at the cost of a parallel region it was measured with
(``Threading.wake_us``): ~2 us where the team spins between regions (torch's OpenMP
runtime keeps it so), ~45 us where it sleeps on this project's VM (``OMP_WAIT_POLICY=
PASSIVE``, which tfgrad gives Numba's runtime: :func:`wait_passively`; the host has
to run a sleeping virtual CPU again). :func:`launch` scales a threshold by the cost it
measures once, at the first kernel call, over that one (:func:`wake_us`): the work a
region must carry grows with what waking the threads costs.
"""

from __future__ import annotations

import functools
import os
import threading
import time
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numba
import numpy as np

OPTIONS: dict[str, Any] = {"cache": True, "error_model": "numpy"}
"""The options of every compiled kernel (never ``fastmath``)."""


def jit(fn: Callable[..., Any] | None = None, *, parallel: bool = False,
        nogil: bool = False) -> Any:
    """``numba.njit`` with :data:`OPTIONS` (as ``@jit`` or ``@jit(parallel=True)``)."""
    opts = dict(OPTIONS)
    if parallel:
        opts["parallel"] = True
    if nogil:
        opts["nogil"] = True
    return numba.njit(**opts) if fn is None else numba.njit(**opts)(fn)


def kernel_array(a: np.ndarray, dtype: Any = None) -> np.ndarray:
    """``a`` as kernels take an input: C-contiguous, writable (Numba compiles a read-only
    array as another type: one array type per dtype keeps the specialisations down; the
    kernels never write their inputs) and of ``dtype`` (default: its own); ``a`` itself
    where it already is, else a copy."""
    dt = a.dtype if dtype is None else np.dtype(dtype)
    if a.dtype == dt and a.flags.c_contiguous and a.flags.writeable:
        return a
    return np.require(a, dt, ("C", "W"))


def inline(fn: Callable[..., Any] | None = None, *, force: bool = False) -> Any:
    """A helper compiled into each caller: Numba copies its IR at every call site, or
    with ``force`` LLVM's always-inline does (deep nests of Numba-inlined helpers compile
    slowly; the bits are the same either way)."""
    opts: dict[str, Any] = {"error_model": OPTIONS["error_model"]}
    if force:
        opts["forceinline"] = True
    else:
        opts["inline"] = "always"
    return numba.njit(**opts) if fn is None else numba.njit(**opts)(fn)


class Twins:
    """One ``prange`` kernel compiled twice, each on its first call: ``parallel`` (on
    Numba's threads) and ``serial`` (on the calling thread). ``launch`` picks one.

    The serial twin is a renamed copy of the function: Numba's cache holds one entry
    per qualified name and does not key on the parallel flag."""

    __slots__ = ("parallel", "py_func", "serial")

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.py_func = fn
        self.parallel = jit(fn, parallel=True)
        twin = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__ + "_serial",
                                  fn.__defaults__, fn.__closure__)
        twin.__qualname__ = fn.__qualname__ + "_serial"
        twin.__doc__ = fn.__doc__
        self.serial = jit(twin)


@dataclass(frozen=True)
class Threading:
    """How one family's calls use threads."""

    parallel_min: int
    """Work (elements; multiply-adds for depthwise convolution) from which a call is
    threaded; smaller calls run on the calling thread alone."""
    chunk: int = 0
    """``prange`` iterations a thread takes at a time (``numba.set_parallel_chunksize``);
    0: Numba's static split into equal parts."""
    wake_us: float = 2.0
    """What a parallel region cost (an empty one: its team woken and joined, in
    microseconds) where ``parallel_min`` was measured; :func:`launch` scales the
    threshold by :func:`wake_us` over this, never below it."""


POLICY: dict[str, Threading] = {
    "fake_quant": Threading(1 << 15),
    # one iteration at a time: a thread that is descheduled holds the others up less
    "batch_norm": Threading(1 << 16, chunk=1),
    # tfgrad's own pool (kernels._pool.launch): one compiled kernel for any thread count
    "fractional_pool": Threading(1 << 16),
    # tfgrad's own pool (kernels._pool.run), whose threads claim chunks as they come free
    "depthwise_conv": Threading(1 << 20),
    # <activation>
    # elementwise on bits: memory-bound, threads pay from a few hundred KiB
    "activation": Threading(1 << 16),
    # </activation>
    # <bias_add>
    "bias_add": Threading(1 << 16),
    # </bias_add>
    # <matmul>
    # multiply-adds; blocks of (K-shard, 64 rows, 256 columns) are independent (measured
    # with sleeping threads: below ~4M multiply-adds waking the second costs more than
    # it saves)
    "matmul": Threading(1 << 22, wake_us=45.0),
    # </matmul>
    # <conv2d>
    # im2col / col2im: data movement (col2im one image per task); the contractions run
    # under the matmul family's policy (measured with sleeping threads: a 3x3 filter's
    # patches of 64K values gain from the second thread)
    "conv2d": Threading(1 << 18, wake_us=45.0),
    # </conv2d>
    # <reduction>
    # each output summed by one thread; tasks are row / column blocks or shards (tfgrad's
    # pool: kernels._pool.launch)
    "reduction": Threading(1 << 16),
    # </reduction>
    # <softmax_xent>
    # rows in blocks of 16, each in TF's order
    "softmax_xent": Threading(1 << 14),
    # </softmax_xent>
    # <softmax>
    # rows in blocks of 16, each in TF's order
    "softmax": Threading(1 << 14),
    # </softmax>
    # <max_pool>
    # compares and selects; each output row (forward) or image (gradient) on one
    # thread, one at a time: a descheduled thread holds the other up less
    "max_pool": Threading(1 << 16, chunk=1),
    # </max_pool>
    # <cwise>
    # elementwise arithmetic, memory-bound: threads pay from a few hundred KiB
    "cwise": Threading(1 << 16),
    # </cwise>
    # <avg_pool>
    # window additions (input cells read + output cells times window cells); one task per
    # (image, row) of the output or of dx, claimed in chunks from tfgrad's pool
    # (kernels._pool.launch): under load a descheduled thread holds the others up less
    "avg_pool": Threading(1 << 16),
    # </avg_pool>
}
"""Each family's threading, by the family's name (``OpDef.family``)."""


def wait_passively() -> None:
    """Have the OpenMP runtime Numba loads with its threading layer wait passively between
    parallel regions: ``OMP_WAIT_POLICY=PASSIVE`` in the environment while that layer loads
    (the runtime reads it then), and the environment as it was straight after.

    By default the runtime's threads spin after each region, which slows a busy machine
    far more than waking a sleeping team costs. Only that moment: left in the environment,
    the setting also slowed a torch imported later (its own runtime) and every child
    process (benchmarks/RESULTS.md). A user's ``OMP_WAIT_POLICY`` wins; a runtime already
    loaded (torch's, whose ``GOMP_parallel`` Numba's layer then calls) keeps its own
    policy."""
    from numba.np.ufunc import parallel

    launch = getattr(parallel, "_launch_threads", None)
    if launch is None or getattr(parallel, "_is_initialized", True):
        return

    def launch_passively() -> None:
        # every path into Numba's threads (a parallel kernel's first call, compile or
        # cache load; numba.get_num_threads) looks this name up in the module when called
        parallel._launch_threads = launch
        if parallel._is_initialized or "OMP_WAIT_POLICY" in os.environ:
            launch()
            return
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
        try:
            launch()
        finally:
            if os.environ.get("OMP_WAIT_POLICY") == "PASSIVE":
                del os.environ["OMP_WAIT_POLICY"]

    parallel._launch_threads = launch_passively


wait_passively()  # (here: every kernel module imports this one, and import tfgrad no Numba)


_GET_NUM_THREADS: Callable[[], int] | None = None


def num_threads() -> int:
    """``numba.get_num_threads()`` (this thread's setting) without the check that Numba's
    threads are launched on every call, which is slow with the caches cold after an op:
    the check runs once, then the threading layer's own getter is called."""
    global _GET_NUM_THREADS
    if _GET_NUM_THREADS is None:
        numba.get_num_threads()  # (launches the threads)
        from numba.np.ufunc import parallel

        _GET_NUM_THREADS = getattr(parallel, "_get_num_threads", numba.get_num_threads)
    return _GET_NUM_THREADS()


def threads(family: str, work: int, units: int = 2) -> int:
    """The threads a call of ``family`` gets: 1 when ``work`` is under the family's
    ``parallel_min`` or the call has fewer than two independent parts (``units``: channel
    blocks, row blocks, tasks), else :func:`num_threads`. For tfgrad's own pool, whose
    caller works while a pool thread wakes: the threshold unscaled (:func:`wake_us`)."""
    if work < POLICY[family].parallel_min or units < 2:
        return 1
    return num_threads()


def wake_us() -> float:
    """What one parallel region costs on this machine, in microseconds:
    ``TFGRAD_WAKE_US`` where set, else measured once when the workers start (the median
    of a few empty regions, each after the team went back to its wait; 0 with one
    thread). :func:`launch` threads a call from the family's ``parallel_min`` times
    ``wake_us() / Threading.wake_us`` (never less than ``parallel_min``). tfgrad's own
    pool (``kernels._pool``) does not wait for its threads to wake and keeps the
    thresholds as they are."""
    start_workers()
    return _WAKE_US


def launch(family: str, kernel: Twins, work: int, *args: Any, units: int = 2) -> Any:
    """``kernel(*args)``: its serial twin or its parallel form, as :func:`threads` says,
    the threshold scaled by what waking the threads costs here (:func:`wake_us`)."""
    policy = POLICY[family]
    if work < policy.parallel_min or units < 2 or num_threads() < 2:
        return kernel.serial(*args)
    if not _WORKERS_STARTED:  # (the wake cost is measured then: an op that never
        start_workers()  # entered a flushed block, fake quant's, would see 0 before)
    if work * policy.wake_us < policy.parallel_min * _WAKE_US:
        return kernel.serial(*args)
    chunk = policy.chunk
    if not chunk:
        return kernel.parallel(*args)
    old = numba.get_parallel_chunksize()
    numba.set_parallel_chunksize(chunk)
    try:
        return kernel.parallel(*args)
    finally:
        numba.set_parallel_chunksize(old)


def launcher(family: str, kernel: Twins, work: int, units: int = 2) -> Callable[..., Any]:
    """:func:`launch` of ``kernel`` on calls of this size, for a caller that keeps it per
    signature: the serial twin itself where the size alone makes every call serial (under
    the family's ``parallel_min``, or fewer than two parts), else ``launch`` bound to
    ``(family, kernel, work, units)``, which decides per call."""
    if work < POLICY[family].parallel_min or units < 2:
        return kernel.serial
    return functools.partial(launch, family, kernel, work, units=units)


@jit(parallel=True)
def _touch(n: int) -> int:  # pragma: no cover - compiled
    s = 0
    for i in numba.prange(n):
        s += i
    return s


_WORKERS_STARTED = False
_WORKERS_LOCK = threading.Lock()
_WAKE_US = 0.0


def _measure_wake(n: int, samples: int = 7) -> float:
    """The median cost of an empty region on ``n`` threads, each run 50 us after the
    last (the team back in its wait), in microseconds."""
    ts = []
    for _ in range(samples):
        end = time.perf_counter() + 50e-6
        while time.perf_counter() < end:
            pass
        t0 = time.perf_counter()
        _touch(2 * n)
        ts.append(time.perf_counter() - t0)
    return sorted(ts)[samples // 2] * 1e6


def _wake_from_env() -> float | None:
    v = os.environ.get("TFGRAD_WAKE_US")
    if v is None or not v.strip():
        return None
    try:
        us = float(v)
    except ValueError:
        raise ValueError(f"TFGRAD_WAKE_US must be a number of microseconds, got {v!r}"
                         ) from None
    if not us >= 0.0 or us == float("inf"):
        raise ValueError(f"TFGRAD_WAKE_US must be a finite number >= 0, got {v!r}")
    return us


def start_workers() -> None:
    """Start all of Numba's worker threads (once per process). A new thread takes the
    floating-point environment (MXCSR) of the thread that starts it: workers started
    inside a flushed block (``tfgrad._tf.fpenv``) would keep FTZ / DAZ for good."""
    global _WORKERS_STARTED, _WAKE_US
    if _WORKERS_STARTED:  # (every op call comes here: no lock once done)
        return
    with _WORKERS_LOCK:  # one launch, even when the first ops come from several threads
        if _WORKERS_STARTED:
            return
        given = _wake_from_env()
        mask = numba.get_num_threads()
        n = numba.config.NUMBA_NUM_THREADS
        numba.set_num_threads(n)  # the whole pool
        try:
            _touch(4 * n)
            wake = given if given is not None else _measure_wake(n) if n > 1 else 0.0
        finally:
            numba.set_num_threads(mask)
        _WAKE_US = wake
        _WORKERS_STARTED = True
