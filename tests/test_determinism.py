"""Determinism: every op gives the same bits whatever the thread count and the layout.

- ``NUMBA_NUM_THREADS=1`` and ``=2``: a subprocess for each computes every case of the
  op-case table (tests/cases CASES) plus a larger input per op (``LARGE``, big enough
  for the kernels' parallel loops and reductions to split work), with the fused kernels;
  the outputs must be bit-identical (NaNs where NaNs are, their payload bits aside).
- Memory layout: Fortran order, strided and reversed (negative-stride) views of the same
  values give the same bits as C order (each case with one layout, in turn; the
  FakeQuant and BatchNorm LARGE inputs, whose kernels use the layout most, with two).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tfgrad
from tests.cases import CASES
from tfgrad import testing

ROOT = Path(__file__).resolve().parent.parent

LARGE: dict[str, Callable[[], dict[str, Any]]] = {
    op: make for m in testing.load()[0].values() for op, make in m.LARGE.items()}
"""A larger input per op, from its family's module (``tfgrad.testing.cases``)."""


def test_every_op_has_a_large_input():
    assert sorted(LARGE) == sorted(tfgrad._opdefs.OPS)


def implemented(op: str) -> bool:
    fam = tfgrad.get_op_def(op).family
    return (ROOT / "src" / "tfgrad" / "ops" / f"{fam}.py").exists()


def all_calls() -> list[tuple[str, str, Callable[[], dict[str, Any]]]]:
    """(id, op, make kwargs) for every case of the table and every LARGE input."""
    calls = [(c.id, c.op, c.kwargs) for c in CASES]
    calls += [(f"{op}/LARGE", op, make) for op, make in LARGE.items() if implemented(op)]
    return calls


def outputs(op: str, kwargs: dict[str, Any]) -> tuple[np.ndarray, ...]:
    out = getattr(tfgrad.raw_ops, op)(**kwargs)
    return tuple(out) if isinstance(out, tuple) else (out,)


def dump(path: str) -> None:
    """Write every call's outputs to ``path`` (an .npz), keyed ``<id>#<output index>``."""
    res = {}
    for cid, op, make in all_calls():
        for i, o in enumerate(outputs(op, make())):
            o = np.array(o)
            if o.dtype.kind == "f" or o.dtype.name == "bfloat16":
                # NaN positions count, not their bits: which operand's NaN an add returns
                # is LLVM's choice and differs between a kernel's serial and parallel
                # builds (docs/exactness.md)
                o[np.isnan(o)] = np.nan
            res[f"{cid}#{i}"] = np.ascontiguousarray(o).view(np.uint8).ravel()
    np.savez(path, **res)


def _run_dump(threads: int, path: Path) -> None:
    env = dict(os.environ, NUMBA_NUM_THREADS=str(threads),
               PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    code = f"from tests.test_determinism import dump; dump({str(path)!r})"
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=900)
    assert p.returncode == 0, f"NUMBA_NUM_THREADS={threads} run failed:\n{p.stderr[-4000:]}"


def test_same_bits_for_1_and_2_threads(tmp_path):
    one, two = tmp_path / "t1.npz", tmp_path / "t2.npz"
    _run_dump(1, one)
    _run_dump(2, two)
    a, b = np.load(one), np.load(two)
    assert sorted(a.files) == sorted(b.files)
    differ = [k for k in a.files if not np.array_equal(a[k], b[k])]
    assert not differ, f"outputs depend on the thread count: {differ[:10]}"


# --------------------------------------------------------------------------------------
# Layouts
# --------------------------------------------------------------------------------------
def _relayout(kwargs: dict[str, Any], how: str) -> dict[str, Any]:
    out = {}
    for k, v in kwargs.items():
        if not isinstance(v, np.ndarray) or v.ndim == 0 or v.size < 2:
            out[k] = v
            continue
        if how == "F":
            a = np.asfortranarray(v)
        elif how == "reversed":  # negative strides on every axis
            a = np.ascontiguousarray(v[(slice(None, None, -1),) * v.ndim])
            a = a[(slice(None, None, -1),) * v.ndim]
        else:  # strided along every axis
            big = np.zeros(tuple(2 * d for d in v.shape), v.dtype)
            big[(slice(None, None, 2),) * v.ndim] = v
            a = big[(slice(None, None, 2),) * v.ndim]
        a.flags.writeable = False
        out[k] = a
    return out


_LAYOUTS = ("F", "reversed", "strided")
_LAYOUT_CALLS = [pytest.param(c.op, c.kwargs, _LAYOUTS[i % 3], id=f"{c.id}-{_LAYOUTS[i % 3]}")
                 for i, c in enumerate(CASES)]
_LAYOUT_CALLS += [pytest.param(op, m, how, id=f"{op}/LARGE-{how}")
                  for op, m in LARGE.items() for how in ("F", "reversed")
                  if op.startswith("FakeQuant") or op in ("FusedBatchNormV3",
                                                           "FusedBatchNormGradV3")]


@pytest.mark.parametrize("op,make,how", _LAYOUT_CALLS)
def test_layouts_give_same_bits(op, make, how):
    """Each case with one of the layouts (in turn), against C-ordered inputs."""
    if not implemented(op):
        pytest.skip("family not implemented")
    kwargs = make()
    base = outputs(op, kwargs)
    got = outputs(op, _relayout(kwargs, how))
    for i, (g, e) in enumerate(zip(got, base)):
        assert g.shape == e.shape and g.dtype == e.dtype, (how, i)
        assert np.ascontiguousarray(g).tobytes() == np.ascontiguousarray(e).tobytes(), (
            f"{op}: output {i} differs for {how} inputs")


if __name__ == "__main__":
    dump(sys.argv[1])
