"""``tfgrad warmup``: compile every Numba kernel a later call can select, into the on-disk cache.

tfgrad's kernels are compiled lazily, on the first call that selects each variant, and
cached on disk (``cache=True``), so a first call in a fresh environment pays the
compilation and later processes load the machine code. A kernel variant is chosen at run
time from the dtypes, the attrs, the sizes (small problems take single-threaded twins;
large outputs non-temporal stores), the filter size and even the values (a non-finite
depthwise filter). Rather than restate those rules, this command runs the inputs of the
family registry (:mod:`tfgrad.testing`), family by family:

- every case of the family's table (``CASES``);
- every benchmark shape (``BENCHES``), at its smoke size and its full size, in each
  dtype the op takes;
- the family's ``WARMUP`` inputs (the other dtypes and attrs at sizes that take the
  threaded kernels).

After it, no case and no benchmark shape compiles anything (tests/test_warmup.py).
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from .. import testing
from ..testing import FAMILIES

Call = tuple[str, str, Callable[[], dict[str, Any]]]
"""(op, label, a function returning its keyword arguments)."""

MAX_JOBS = 8
"""``--jobs``' default at most: each process holds Numba and LLVM (up to ~1.3 GB while
compiling)."""


COMPILE_SECONDS: dict[str, float] = {
    "DepthwiseConv2dNativeBackpropInput": 160, "DepthwiseConv2dNativeBackpropFilter": 116,
    "DepthwiseConv2dNative": 80, "fractional_pool": 48, "batch_norm": 37, "conv2d": 27,
    "activation": 24, "fake_quant": 21, "reduction": 20, "softmax_xent": 14, "max_pool": 12,
    "softmax": 10}
"""Roughly what each unit of ``--jobs`` (a family, or an op of a family split by its
``WARMUP_GROUPS``) compiles, CPU seconds in a fresh cache (2-core AVX2 EPYC; the rest
under 10): the longest start first, so that no long unit starts last (the order only)."""


def _expected_cost(unit: tuple[str, list[str] | None]) -> float:
    family, ops = unit
    if ops is not None and len(ops) == 1 and ops[0] in COMPILE_SECONDS:
        return COMPILE_SECONDS[ops[0]]
    return COMPILE_SECONDS.get(family, 0.0)


def default_jobs() -> int:
    """The CPUs this process may run on (its affinity mask, not the machine's count), at
    most :data:`MAX_JOBS`: compiling is CPU-bound, one process per CPU."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # (not on every platform)
        n = os.cpu_count() or 1
    return max(1, min(MAX_JOBS, n))


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "warmup", help="compile every kernel now (cached on disk for later processes)",
        description="Run every op on the inputs of the family registry (every case, every "
        "benchmark shape in every dtype, and the families' warmup inputs) so that Numba "
        "compiles (or loads from its on-disk cache) every kernel variant they select. Run "
        "once after installing; later processes start without compilation.")
    p.add_argument("--op", action="append", metavar="NAME", help="only this op (repeatable)")
    p.add_argument("--family", action="append", choices=FAMILIES,
                   help="only this family (repeatable)")
    p.add_argument("--small", action="store_true",
                   help="tiny inputs only: the cases, the benchmarks' smoke sizes and the "
                   "small warmup inputs (compiles only the kernels used below ~2**16 elements)")
    p.add_argument("--reference", action="store_true",
                   help="run the NumPy reference on the tiny inputs instead (checks it runs; "
                   "compiles nothing)")
    p.add_argument("-j", "--jobs", type=int, default=None, metavar="N",
                   help="warm the families (depthwise: each op) in N processes at once "
                   f"(default: the CPUs this process may use, at most {MAX_JOBS})")
    p.add_argument("-q", "--quiet", action="store_true", help="print only the summary")
    return p


def _retyped(op: str, kwargs: dict[str, Any], dtype: str) -> dict[str, Any]:
    """``kwargs`` with the inputs typed by the op's first type attr cast to ``dtype``."""
    from .._opdefs import OPS
    from .._validate import DTYPES

    attr = OPS[op].type_attrs[0].name
    typed = {i.name for i in OPS[op].inputs if i.type_attr == attr}
    return {k: v.astype(DTYPES[dtype]) if k in typed else v for k, v in kwargs.items()}


def _bench_calls(bench: Any, small: bool) -> list[Call]:
    from .._opdefs import OPS

    op = OPS[bench.name]
    dtypes = op.type_attrs[0].allowed if op.type_attrs else ("",)
    out: list[Call] = []
    for smoke in (True,) if small else (True, False):
        for dt in dtypes:
            def make(smoke: bool = smoke, dt: str = dt) -> dict[str, Any]:
                kw = bench.make(np.random.default_rng(0), smoke)
                return _retyped(bench.name, kw, dt) if dt else kw

            out.append((bench.name, f"bench {bench.shape}{' (smoke size)' if smoke else ''}"
                        + (f", in {dt}" if dt else ""), make))
    return out


def calls(module: Any, ops: list[str] | None = None, small: bool = False) -> list[Call]:
    """The warm-up calls of one family module: its cases, its benchmark shapes in every
    dtype (smoke size only when ``small``) and its WARMUP inputs (the small ones only)."""
    rng = np.random.default_rng(0)
    out: list[Call] = [(c.op, f"case {c.name}", c.kwargs) for c in module.CASES]
    for b in module.BENCHES:
        out += _bench_calls(b, small)
    out += [(w.op, w.name, lambda w=w: w.make(rng)) for w in getattr(module, "WARMUP", ())
            if not (small and w.large)]
    return [c for c in out if not ops or c[0] in ops]


def warm_family(family: str, ops: list[str] | None, small: bool, impl: str,
                quiet: bool, stream: bool = True) -> tuple[int, list[str], list[str]]:
    """Run one family's calls: (calls made, output lines, failures). Lines are printed as
    they come when ``stream``, else returned (a worker process of ``--jobs``)."""
    import tfgrad

    todo = calls(testing.family(family), ops, small)
    lines: list[str] = []
    failed: list[str] = []
    with tfgrad.use_impl(impl):
        for op, label, make in todo:
            t0 = time.perf_counter()
            try:
                getattr(tfgrad.raw_ops, op)(**make())
            except Exception as e:  # report every failure, keep going
                failed.append(f"{op} [{label}]: {type(e).__name__}: {e}")
                status = f"FAILED: {type(e).__name__}: {e}"
            else:
                status = "ok"
            if not quiet:
                line = f"{op:<44} {label:<56} {time.perf_counter() - t0:7.2f} s  {status}"
                if stream:
                    print(line, flush=True)
                else:
                    lines.append(line)
    return len(todo), lines, failed


def warm_qat(quiet: bool) -> None:
    """The kernels of tfgrad.qat's quantizers that no raw op runs: the batch ranges
    (``tfgrad.dispatch.minmax.batch_range``, per tensor and per channel)."""
    from ..dispatch.minmax import batch_range

    t0 = time.perf_counter()
    x = np.random.default_rng(0).standard_normal((8, 8)).astype(np.float32)
    fixed = x.copy()
    fixed.flags.writeable = False  # (JAX's arrays: Numba compiles read-only ones apart)
    for a in (x, fixed):
        for per_axis in (False, True):
            batch_range(a, per_axis)
    if not quiet:
        print(f"{'(tfgrad.qat)':<44} {'batch ranges':<56} "
              f"{time.perf_counter() - t0:7.2f} s  ok", flush=True)


def units(families: list[str], ops: list[str] | None) -> list[tuple[str, list[str] | None]]:
    """What ``--jobs`` hands its processes: (family, its ops or None for all of them), a
    family split by its ``WARMUP_GROUPS`` (ops whose kernels share no compiled function)."""
    out: list[tuple[str, list[str] | None]] = []
    for f in families:
        groups = getattr(testing.family(f), "WARMUP_GROUPS", None)
        if not groups:
            out.append((f, ops))
            continue
        for g in groups:
            chosen = [o for o in g if not ops or o in ops]
            if chosen:
                out.append((f, chosen))
    return out


def cache_location() -> str:
    import numba

    import tfgrad

    if numba.config.CACHE_DIR:
        return str(numba.config.CACHE_DIR)
    kernels = os.path.join(os.path.dirname(tfgrad.__file__), "kernels")
    if os.access(kernels, os.W_OK):
        return os.path.join(kernels, "__pycache__")
    return "numba's user cache directory (e.g. ~/.cache/numba; set NUMBA_CACHE_DIR to choose)"


def run(args: argparse.Namespace) -> int:
    import tfgrad

    from ._common import CLIError

    ops = None
    if args.op:
        try:
            ops = [tfgrad.get_op_def(o).name for o in args.op]
        except KeyError as e:
            raise CLIError(e.args[0]) from None
    families = [f for f in args.family or FAMILIES
                if not ops or any(tfgrad.OPS[o].family == f for o in ops)]
    impl = "reference" if args.reference else "kernel"
    small = args.small or args.reference  # (the references are slow on the large inputs)
    n_calls, failed = 0, []
    t_all = time.perf_counter()
    todo = units(families, ops)
    qat = impl == "kernel" and not args.family and not ops  # (the whole library only)
    jobs = default_jobs() if args.jobs is None else args.jobs
    if jobs < 1:
        raise CLIError(f"--jobs must be at least 1, not {jobs}")
    if jobs > 1 and len(todo) > 1:
        # One unit per process: Numba's cache index of a function is rewritten whole by
        # each process that adds to it, so no two processes may compile the same function.
        import concurrent.futures
        import multiprocessing

        # The longest first (then those with the most inputs): a long unit started last
        # would run alone at the end.
        todo.sort(key=lambda u: (-_expected_cost(u),
                                 -len(calls(testing.family(u[0]), u[1], small))))
        with concurrent.futures.ProcessPoolExecutor(
                min(jobs, len(todo)), mp_context=multiprocessing.get_context("spawn")) as pool:
            futures = [pool.submit(warm_family, f, unit_ops, small, impl, args.quiet, False)
                       for f, unit_ops in todo]
            if qat:  # (meanwhile, here: functions no family's process compiles)
                warm_qat(args.quiet)
            for fut in concurrent.futures.as_completed(futures):
                n, lines, fails = fut.result()
                n_calls += n
                failed += fails
                for line in lines:
                    print(line, flush=True)
    else:
        for f in families:
            n, _, fails = warm_family(f, ops, small, impl, args.quiet)
            n_calls += n
            failed += fails
        if qat:
            warm_qat(args.quiet)
    total = time.perf_counter() - t_all
    print(f"warmup: {n_calls} calls in {total:.1f} s ({impl}); {len(failed)} failed")
    if not args.reference:
        print(f"Numba cache: {cache_location()}")
    for f in failed:
        print("  " + f)
    return 1 if failed else 0
