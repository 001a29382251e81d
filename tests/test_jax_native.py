"""tfgrad.jax's native implementation against the exact kernels, through the adapter.

Every case of the op table (tests/cases) runs through ``tfgrad.jax.raw_ops.<Op>`` under
``jax.jit`` and ``use_impl("native")`` (jax_enable_x64 on, for the float64 and int64
cases); each output must be within its family module's ``BOUNDS``
(``tfgrad.jax._native.<family>``: 0 is bit-identical) of ``tfgrad.raw_ops.<Op>``, and
have its dtype and shape. The family tests (tests/test_portable_*.py) measure the same
distances on the modules directly, with fresh random inputs; this one checks the wiring:
argument passing, attrs, shape inputs and output dtypes for every op and case.
"""

from __future__ import annotations

import importlib
import importlib.util

import numpy as np
import pytest

jax = pytest.importorskip("jax", reason="JAX is not installed (pip install tfgrad[jax])")

import tfgrad  # noqa: E402
import tfgrad.jax as tj  # noqa: E402
from tests.cases import CASES  # noqa: E402
from tfgrad import _distance, _validate, raw_ops  # noqa: E402


def _native_module(family: str):
    name = f"tfgrad.jax._native.{family}"
    return importlib.import_module(name) if importlib.util.find_spec(name) else None


def _split(op: tfgrad.OpDef, kwargs: dict) -> tuple[dict, dict]:
    """(array operands in the op's dtypes, everything else) of a case's arguments. The
    adapter casts nothing, so inputs are converted as tfgrad's NumPy binding does."""
    bound = _validate.bind(op, kwargs)
    arrays = {i.name: bound[i.name] for i in op.inputs if not i.is_shape}
    rest = {k: v for k, v in kwargs.items() if k not in arrays}
    return arrays, rest


def check_outputs(op_name: str, got, want, bounds: dict, what: str = "") -> None:
    op = tfgrad.get_op_def(op_name)
    gots = got if isinstance(got, tuple) else (got,)
    wants = want if isinstance(want, tuple) else (want,)
    for o, g, w in zip(op.outputs, gots, wants):
        g, w = np.asarray(g), np.asarray(w)
        dt = _validate.dtype_name(w.dtype)
        assert (g.shape, g.dtype) == (w.shape, w.dtype), (what, o.name)
        bound = bounds[op_name][o.name][dt]
        if bound == 0:
            assert _distance.bit_identical(g, w), (what, o.name, _distance.distance(g, w))
        else:
            assert _distance.distance(g, w) <= bound, (what, o.name, _distance.distance(g, w))


@pytest.fixture(scope="module")
def x64():
    with jax.enable_x64(True):
        yield


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_native_matches_exact(case, x64):
    op = tfgrad.get_op_def(case.op)
    module = _native_module(op.family)
    if module is None:
        pytest.skip(f"no native implementation of {op.family} yet")
    kwargs = case.kwargs()
    arrays, rest = _split(op, kwargs)
    want = getattr(raw_ops, case.op)(**kwargs)
    with tj.use_impl("native"):
        got = jax.jit(lambda a: getattr(tj.raw_ops, case.op)(**a, **rest))(arrays)
    check_outputs(case.op, got, want, module.BOUNDS, case.id)
