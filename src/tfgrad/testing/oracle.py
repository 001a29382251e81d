"""Running TensorFlow 2.21 as the oracle, and comparing outputs bit for bit or in ulps.

TensorFlow is imported on first use (``tensorflow()``), not with this module; the tests
and ``tfgrad conformance`` use it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Collection
from typing import Any

import numpy as np

# TF's reference CPU kernels (Eigen) are selected only if this is set before TF loads;
# the default oneDNN build computes batch norm and depthwise conv with other numerics.
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

_TF: Any = None


def tensorflow() -> Any | None:
    """The TensorFlow module, or None when it is not installed."""
    global _TF
    if _TF is None:
        try:
            import tensorflow as tf
        except ImportError:
            _TF = False
        else:
            _TF = tf
    return _TF or None


def run_tf(op: str, kwargs: dict[str, Any]) -> Any:
    """Run ``tf.raw_ops.<op>(**kwargs)``; return numpy outputs (a tuple if several)."""
    tf = tensorflow()
    assert tf is not None
    # NumPy scalar inputs as 0-d arrays: eager TF caches its constants from Python
    # floats (a numpy.float64 is one) by value, and -0.0 == 0.0 found a +0.0 made earlier
    from .. import get_op_def

    try:
        inputs = {i.name for i in get_op_def(op).inputs}
    except KeyError:  # (a TF op of a case's tf_call that tfgrad has not)
        inputs = set()
    kwargs = {k: np.asarray(v) if k in inputs and isinstance(v, np.generic) else v
              for k, v in kwargs.items()}
    with tf.device("/CPU:0"):
        out = getattr(tf.raw_ops, op)(**kwargs)
    if isinstance(out, (list, tuple)):
        return tuple(np.asarray(o.numpy()) for o in out)
    return np.asarray(out.numpy())


def expected(case: Any, kwargs: dict[str, Any]) -> tuple[np.ndarray, ...]:
    """TF's outputs for one case of the op-case table (:mod:`tfgrad.testing.cases`)."""
    if case.tf_call is None:
        return as_tuple(run_tf(case.op, kwargs))
    op, kw = case.tf_call(kwargs)
    out = run_tf(op, kw)
    return as_tuple(case.tf_outputs(out) if case.tf_outputs else out)


def tf_error_types() -> tuple[type[Exception], ...]:
    tf = tensorflow()
    return (tf.errors.OpError, ValueError, TypeError)


def tf_error_class(name: str) -> type[BaseException]:
    """``tf.errors.<name>``, or the Python built-in of that name (TF's binding raises
    TypeError for an attr of the wrong type)."""
    import builtins

    tf = tensorflow()
    cls = getattr(tf.errors, name, None) or getattr(builtins, name)
    assert isinstance(cls, type) and issubclass(cls, BaseException), name
    return cls


def tf_message(error: BaseException) -> str:
    """TF's own words: without the eager wrapper's ``{{function_node ...}}`` prefix and
    ``[Op:Name] name:`` suffix (kept as TF spaces them)."""
    message = str(error).strip()
    message = re.sub(r"^\{\{function_node [^}]*\}\}\s*", "", message)
    return re.sub(r"\s*\[Op:\w+\]( name:.*)?$", "", message, flags=re.S)


def as_tuple(out: Any) -> tuple[np.ndarray, ...]:
    return tuple(out) if isinstance(out, tuple) else (out,)


def _ordered(a: np.ndarray) -> np.ndarray:
    """Map floats to integers whose order and differences are the float ulp order."""
    bits = {2: np.int16, 4: np.int32, 8: np.int64}[a.dtype.itemsize]
    i = a.view(bits).astype(np.int64)
    big = np.int64(1) << (8 * a.dtype.itemsize - 1)
    return np.where(i < 0, -(i + big), i)  # -0.0 and +0.0 both map to 0


def ulp_distance(actual: np.ndarray, expected: np.ndarray) -> np.ndarray:
    """Elementwise distance in units in the last place (0 where both are NaN)."""
    a = np.ascontiguousarray(actual)
    e = np.ascontiguousarray(expected)
    both_nan = np.isnan(a.astype(np.float64)) & np.isnan(e.astype(np.float64))
    d = np.abs(_ordered(a) - _ordered(e))
    return np.where(both_nan, 0, d)


def assert_same(actual: Any, expected: Any, *, what: str = "", ulps: int = 0) -> None:
    """Same dtype, shape and values: bit-identical (NaNs match any NaN, -0.0 == +0.0 only
    when ulps > 0), or within ``ulps`` float ulps. (NaN payloads are not compared: where
    two NaNs meet, TF's x86 add returns the incoming operand's, and LLVM does not keep
    the operand order of a compiled add; see the README.)"""
    actual = np.asarray(actual)
    expected = np.asarray(expected)
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} != {expected.dtype}"
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    if actual.size == 0:
        return
    if actual.dtype.kind in "iub":
        bad = actual != expected
        assert not bad.any(), (f"{what}: {bad.sum()} of {actual.size} differ; first at "
                               f"{np.argwhere(bad)[0]}: {actual[bad][0]} vs {expected[bad][0]}")
        return
    if ulps == 0:
        a = np.ascontiguousarray(actual)
        e = np.ascontiguousarray(expected)
        bits = {2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize]
        nan = np.isnan(a.astype(np.float64)) & np.isnan(e.astype(np.float64))
        bad = (a.view(bits) != e.view(bits)) & ~nan
    else:
        bad = ulp_distance(actual, expected) > ulps
    if bad.any():
        idx = tuple(np.argwhere(bad)[0])
        raise AssertionError(
            f"{what}: {int(bad.sum())} of {actual.size} elements differ beyond {ulps} ulp; "
            f"first at {idx}: {actual[idx]!r} vs expected {expected[idx]!r} "
            f"(max ulp distance {int(ulp_distance(actual, expected).max())})"
        )


def assert_outputs(op: str, actual: Any, expected: Any, ulps: dict[str, int] | None = None,
                   what: str = "", skip: Collection[str] = ()) -> None:
    """assert_same for each output, by TF's output names; those in ``skip`` not compared."""
    import tfgrad

    names = [o.name for o in tfgrad.get_op_def(op).outputs]
    a, e = as_tuple(actual), as_tuple(expected)
    assert len(a) == len(e) == len(names), f"{what}: {len(a)} outputs vs {len(e)}"
    for n, x, y in zip(names, a, e):
        if n not in skip:
            assert_same(x, y, what=f"{what} {op}.{n}", ulps=(ulps or {}).get(n, 0))
