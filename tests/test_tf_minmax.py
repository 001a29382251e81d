"""TF's Min / Max reductions as tfmot's range quantizers call them (tfgrad._tf.minmax):
which zero of a +0 / -0 tie and which NaN TF returns, against TF live; NumPy's min / max
everywhere else. The quantizers' compiled pass (tfgrad.dispatch.minmax.batch_range) gives
the model's bits, and leaves to it only what the order decides."""

from __future__ import annotations

import numpy as np
import pytest

from tfgrad._config import tf_intra_op_threads
from tfgrad._tf import minmax
from tfgrad.dispatch import minmax as dminmax
from tfgrad.testing import oracle

F32 = np.float32


def bits(a):
    return np.asarray(a, F32).view(np.uint32)


def _nan(k: int, negative: bool) -> np.float32:
    return np.uint32((0xFFC00000 if negative else 0x7FC00000) | (k + 1)).view(F32)


def _case(rng, shape, is_max, kind):
    """Values whose extreme is a zero of either sign, or NaNs of distinct bits."""
    n = int(np.prod(shape))
    if kind == "zeros":  # +0 and -0 at a random mix
        p = rng.choice([1 / n, 0.05, 0.5, 0.95, 1 - 1 / n])
        x = np.where(rng.random(n) < p, F32(-0.0), F32(0.0)).astype(F32)
    elif kind == "ties":  # a few zeros among values past them
        x = np.full(n, -1.0 if is_max else 1.0, F32)
        pos = rng.choice(n, int(rng.integers(1, min(n, 6) + 1)), replace=False)
        x[pos] = np.where(rng.random(pos.size) < 0.5, -0.0, 0.0)
    else:  # NaNs with distinct payloads and signs
        x = rng.choice(np.array([0.0, -0.0, 1.0, -1.0], F32), n)
        for j, at in enumerate(rng.choice(n, int(rng.integers(1, min(n, 5) + 1)),
                                          replace=False)):
            x[at] = _nan(j, rng.random() < 0.5)
    return x.reshape(shape)


def test_values_are_numpys_where_no_zero_or_nan_decides():
    rng = np.random.default_rng(0)
    for shape in [(7,), (32, 10), (32, 2, 2, 144), (3, 3, 16, 1), (8, 1, 1, 33)]:
        x = rng.standard_normal(shape).astype(F32)
        for per_axis in (False, True):
            lo, hi = minmax.batch_range(x, per_axis)
            axes = tuple(range(x.ndim - 1)) if per_axis else None
            assert np.array_equal(bits(lo), bits(x.min(axis=axes)))
            assert np.array_equal(bits(hi), bits(x.max(axis=axes)))
    x = np.zeros((4, 3), F32)
    x[0, 1] = -0.0
    lo, hi = minmax.batch_range(x, True)  # (values equal NumPy's, whatever the zero)
    assert np.array_equal(lo, x.min(axis=0)) and np.array_equal(hi, x.max(axis=0))


def test_shards_follow_eigens_cost_model():
    """One shard up to 108387 values, two from 108388 on two threads (TF measured)."""
    from tfgrad._tf.eigen import num_threads

    assert num_threads(108387, minmax._COST, 2) == 1
    assert num_threads(108388, minmax._COST, 2) == 2
    assert num_threads(160000, minmax._COST, 4) == 3


@pytest.mark.skipif(oracle.tensorflow() is None, reason="TensorFlow is not installed")
def test_batch_ranges_are_tfs_bits():
    """Zero ties and NaNs through every path: the packet accumulators and their lanes,
    the scalar tail, the shards (TF's default threads), the per-channel packet channels
    (interleaved rows from 16 on) and scalar channels, the shapes TF merges."""
    tf = oracle.tensorflow()
    rng = np.random.default_rng(11)
    threads = tf_intra_op_threads()
    shapes = [((n,), False) for n in (1, 7, 8, 9, 31, 32, 33, 63, 100, 1000)]
    shapes += [((32, 2, 2, 144), False), ((32, 10), False), ((32, 1, 1, 1280), False),
               ((15, 13), True), ((16, 13), True), ((17, 7), True), ((32, 2, 2, 24), True),
               ((3, 3, 16, 1), True), ((1280, 10), True), ((32, 1, 1, 1280), True)]
    if threads == 2:
        shapes += [((108387,), False), ((108388,), False), ((32, 16, 16, 48), False)]
    checked = 0
    for shape, per_axis in shapes:
        axes = list(range(len(shape) - 1)) if per_axis else None
        for kind in ("zeros", "ties", "nans"):
            for _ in range(2 if np.prod(shape) > 10000 else 12):
                for is_max in (False, True):
                    x = _case(rng, shape, is_max, kind)
                    want = (tf.math.reduce_max if is_max else tf.math.reduce_min)(
                        x, axis=axes).numpy()
                    for f in (minmax.batch_range, dminmax.batch_range):
                        got = f(x, per_axis)[int(is_max)]
                        assert np.array_equal(bits(got).reshape(-1),
                                              bits(want).reshape(-1)), (
                            f.__module__, shape, per_axis, kind, is_max)
                    checked += 1
    assert checked > 900
    # nothing to reduce (a batch of 0): the reducers' initial values, +inf and -inf
    for shape, per_axis in (((0,), False), ((0, 4), False), ((0, 3), True),
                            ((0, 2, 2, 3), True), ((0, 1), True)):
        x = np.zeros(shape, F32)
        axes = list(range(len(shape) - 1)) if per_axis else None
        for is_max in (False, True):
            want = (tf.math.reduce_max if is_max else tf.math.reduce_min)(x, axis=axes).numpy()
            for f in (minmax.batch_range, dminmax.batch_range, minmax.numpy_batch_range):
                got = f(x, per_axis)[int(is_max)]
                assert np.array_equal(bits(got).reshape(-1), bits(want).reshape(-1)), (
                    f.__name__, shape, per_axis, is_max)


def _mixed(rng, shape, kind):
    n = int(np.prod(shape))
    if kind == 0:
        x = rng.standard_normal(n)
    elif kind == 1:  # +0 / -0 only
        x = np.where(rng.random(n) < rng.random(), -0.0, 0.0)
    elif kind == 2:  # zeros and infinities among ones
        x = rng.choice(np.array([0.0, -0.0, 1.0, -1.0, np.inf, -np.inf]), n)
    elif kind == 3:  # a ReLU's output: +0 the minimum
        x = np.maximum(rng.standard_normal(n), 0.0)
    else:  # NaNs of either sign among zeros and ones
        x = rng.choice(np.array([0.0, -0.0, 1.0, -1.0]), n)
        for j in range(int(rng.integers(0, 3)) if n else 0):
            x[rng.integers(n)] = _nan(j, rng.random() < 0.5)
    return np.asarray(x, F32).reshape(shape)


def test_compiled_ranges_are_the_models_bits():
    """Every shape path of the quantizers' batch range (per tensor, per channel with the
    four-row passes and their remainder, one channel, one row, rank 1 and 0, empty) on
    values where the order decides and where it does not: the model's bits, dtypes and
    shapes."""
    rng = np.random.default_rng(5)
    shapes = [(), (1,), (7,), (40,), (0,), (2, 1), (5, 3), (4, 8), (33, 8), (100, 17),
              (1, 6), (3, 3, 16, 1), (32, 2, 2, 144), (8, 1, 1, 33), (0, 4)]
    for shape in shapes:
        for kind in range(5):
            for _ in range(8):
                x = _mixed(rng, shape, kind)
                for per_axis in (False, True):
                    want = minmax.batch_range(x, per_axis)
                    got = dminmax.batch_range(x, per_axis)
                    for g, w in zip(got, want):
                        assert type(g) is np.ndarray and type(w) is np.ndarray
                        assert g.dtype == w.dtype and g.shape == w.shape, (shape, per_axis)
                        assert np.array_equal(bits(g), bits(w)), (shape, per_axis, kind, x)
    # a strided input (a channel-first view), read as its values
    x = _mixed(rng, (4, 6, 10), 2).transpose(2, 0, 1)
    for per_axis in (False, True):
        for g, w in zip(dminmax.batch_range(x, per_axis), minmax.batch_range(x, per_axis)):
            assert np.array_equal(bits(g), bits(w))


def test_compiled_ranges_ask_the_model_only_where_the_order_decides(monkeypatch):
    """A ReLU's output (+0 its minimum, no -0) and values without zeros or NaNs are decided
    by the compiled pass; a +0 / -0 tie or a NaN goes to the model."""
    rng = np.random.default_rng(6)
    calls = []
    real = (minmax.batch_range, minmax.reduce_rows)
    monkeypatch.setattr(minmax, "batch_range", lambda *a: calls.append(a) or real[0](*a))
    monkeypatch.setattr(minmax, "reduce_rows", lambda *a: calls.append(a) or real[1](*a))
    for shape in [(32, 4, 4, 24), (9, 16), (3, 3, 8, 1)]:
        for per_axis in (False, True):
            dminmax.batch_range(np.maximum(rng.standard_normal(shape), 0).astype(F32), per_axis)
            dminmax.batch_range(rng.standard_normal(shape).astype(F32), per_axis)
    assert calls == []
    x = np.zeros((32, 8), F32)
    x[3, 2], x[7, 2] = -0.0, 1.0
    lo, hi = dminmax.batch_range(x, True)  # the minimum of channel 2 is a tie, not its max
    assert len(calls) == 1 and bits(lo)[2] == bits(real[1](x, False))[2]
    x = rng.standard_normal((32, 8)).astype(F32)
    x[5, 1] = np.nan
    dminmax.batch_range(x, False)
    assert len(calls) == 2
