"""tfgrad._shapes: output shapes and dtypes without computing, for every case of the table.

The framework adapters' fake tensors and the portable implementations' argument checks
rest on it: it must give the op's own output shapes and dtypes, and raise what the op
raises wherever the error does not depend on input values.
"""

from __future__ import annotations

import numpy as np
import pytest

import tfgrad
from tests.cases import CASES, ERROR_CASES
from tfgrad import _shapes
from tfgrad._validate import dtype_name


def _placeholders(op_name: str, kwargs: dict) -> dict:
    """Array inputs replaced by shape-only placeholders (shape inputs keep their values)."""
    op = tfgrad.get_op_def(op_name)
    out = dict(kwargs)
    for i in op.inputs:
        v = kwargs.get(i.name)
        if isinstance(v, np.ndarray) and not i.is_shape:
            out[i.name] = _shapes.placeholder(v.shape, v.dtype)
    return out


def _with_defaults(op_name: str, kwargs: dict) -> dict:
    op = tfgrad.get_op_def(op_name)
    return {**{a.name: a.default for a in op.attrs if a.default is not tfgrad._opdefs.REQUIRED},
            **kwargs}


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_infer_gives_the_op_outputs(case):
    kwargs = case.kwargs()
    got = _shapes.infer(case.op, _with_defaults(case.op, _placeholders(case.op, kwargs)))
    out = getattr(tfgrad.raw_ops, case.op)(**kwargs)
    outs = out if isinstance(out, tuple) else (out,)
    assert got == tuple((np.shape(o), dtype_name(np.asarray(o).dtype)) for o in outs)


@pytest.mark.parametrize("case", ERROR_CASES, ids=lambda c: c.id)
def test_infer_raises_what_the_op_raises(case):
    # A check of values (pooling sequences, ...) is the op's alone; every other one raises
    # the same error from shapes alone.
    kwargs = case.kwargs()
    try:
        _shapes.infer(case.op, _with_defaults(case.op, _placeholders(case.op, kwargs)))
    except (tfgrad.InvalidArgumentError, TypeError) as e:
        with pytest.raises(type(e)) as info:
            getattr(tfgrad.raw_ops, case.op)(**kwargs)
        assert str(info.value) == str(e)
    else:
        with pytest.raises(case.error):
            getattr(tfgrad.raw_ops, case.op)(**kwargs)
