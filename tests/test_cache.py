"""Numba's on-disk cache serves every later process: a kernel is compiled once per machine.

This broke silently once. Numba keys a cached function on its pickled closure, and a
Numba function pickles with a fresh uuid in every process: the fractional-pooling and
batch-norm elementwise kernels closed over small ``@njit`` helpers, so every new process
compiled them again (~35 s), ``cache=True`` notwithstanding.
"""

from __future__ import annotations

import gc
import importlib
import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest
from numba.core.caching import NullCache
from numba.core.registry import CPUDispatcher

import tfgrad.kernels
from tfgrad.kernels import depthwise_conv

for _m in pkgutil.iter_modules(tfgrad.kernels.__path__):  # (every kernel module, for the
    importlib.import_module(f"tfgrad.kernels.{_m.name}")  # scan of live dispatchers below)

ROOT = Path(__file__).resolve().parent.parent

_RUN_TABLE = """
from tests.cases import CASES
import tfgrad
for c in CASES:
    getattr(tfgrad.raw_ops, c.op)(**c.kwargs())
"""


def _run_table() -> list[str]:
    """Every case of the op-case table in a new process; the cache entries it wrote."""
    env = dict(os.environ, NUMBA_DEBUG_CACHE="1",
               PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    p = subprocess.run([sys.executable, "-c", _RUN_TABLE], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-4000:]
    return [line for line in p.stdout.splitlines() if "data saved" in line]


def test_a_second_process_compiles_nothing():
    _run_table()  # compiles whatever this machine has not cached yet
    assert _run_table() == []


# (the scan of every live object trips torch's deprecated-attribute warning when torch is loaded)
@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_cached_kernels_close_over_plain_values_only():
    """The cause above, for every cached kernel (the depthwise variants are built on
    first use: all of them are built here, which compiles nothing)."""
    for v in depthwise_conv.VARIANTS:
        depthwise_conv.kernel(v)
    import tfgrad.kernels.minmax  # noqa: F401  (the QAT batch ranges: no raw op imports it)

    plain = (bool, int, float, str, type(None))
    # (type(), not isinstance(): a dead weakref.proxy among the objects raises there)
    kernels = [d for d in gc.get_objects() if issubclass(type(d), CPUDispatcher)
               and d.__module__.startswith("tfgrad") and not isinstance(d._cache, NullCache)]
    assert {d.__module__ for d in kernels} == {
        f"tfgrad.kernels.{f}" for f in ("fake_quant", "batch_norm", "batch_norm_grad",
                                        "batch_norm_common", "depthwise_conv.forward",
                                        "depthwise_conv.backprop_input",
                                        "depthwise_conv.backprop_filter", "fractional_pool",
                                        "_pool", "matmul", "conv2d", "reduction",
                                        "softmax_xent", "activation", "bias_add", "softmax",
                                        "max_pool", "cwise", "avg_pool", "minmax",
                                        "batch_norm_vectors",
                                        "_simd")} | {
        "tfgrad._compile", "tfgrad._tf.mxcsr", "tfgrad._tf.rsqrt", "tfgrad._tf.rcp"}
    for d in kernels:
        cells = [c.cell_contents for c in d.py_func.__closure__ or ()]
        assert all(isinstance(v, plain) for v in cells), (d.py_func.__qualname__, cells)
