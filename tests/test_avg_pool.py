"""AvgPool and AvgPoolGrad: TF 2.21's behaviours pinned (docs/avg_pool.md).

1. each output is its window's cells added in row-major order from +0 (a window of -0s
   gives +0), divided by the count of cells, padding excluded (SAME's corners);
2. the count is a sum of ones in T: bfloat16 stops at 256, half at 2048;
3. AvgPoolGrad's coefficient is T(1.0 / cells) and each product is rounded before it is
   added (no FMA), the outputs' contributions in row-major order;
4. denormals flushed (FTZ / DAZ), half's not;
5. TF 2.21 does not check AvgPoolGrad's grad shape or ksize: tfgrad refuses them;
6. kernel == reference == TF on random geometries, the gradient is AvgPool's adjoint,
   the gradient table follows TF's (_AvgPoolGrad, _AvgPoolGradGrad), and the bits do not
   depend on the Numba thread count.
"""

from __future__ import annotations

import ml_dtypes
import numba
import numpy as np
import pytest

import tfgrad
from tests import oracle
from tfgrad import _gradients, raw_ops

F32 = np.float32
BF16 = ml_dtypes.bfloat16


def run(op: str, impl: str = "kernel", **kw):
    with tfgrad.use_impl(impl):
        return getattr(raw_ops, op)(**kw)


def both(op: str, **kw) -> np.ndarray:
    """Kernel result, after checking the reference and (where installed) TF live."""
    k = run(op, "kernel", **kw)
    oracle.assert_outputs(op, k, run(op, "reference", **kw), what="kernel vs reference")
    if oracle.tensorflow() is not None:
        oracle.assert_outputs(op, k, oracle.run_tf(op, kw), what="vs live TF")
    return k


def _bits(a: np.ndarray) -> np.ndarray:
    return np.asarray(a).view({2: np.uint16, 4: np.uint32, 8: np.uint64}[a.itemsize])


def pool(x, k, s, padding):
    return both("AvgPool", value=x, ksize=[1, *k, 1], strides=[1, *s, 1], padding=padding)


def pool_grad(shape, g, k, s, padding):
    return both("AvgPoolGrad", orig_input_shape=np.array(shape, np.int32), grad=g,
                ksize=[1, *k, 1], strides=[1, *s, 1], padding=padding)


# 1 --------------------------------------------------------------------------------------
def test_window_of_negative_zeros_is_positive_zero():
    x = np.full((1, 2, 2, 3), -0.0, F32)
    y = pool(x, (2, 2), (2, 2), "VALID")
    assert _bits(y).tolist() == [[[[0, 0, 0]]]]


def test_same_padding_is_not_counted():
    x = np.arange(1, 10, dtype=F32).reshape(1, 3, 3, 1)
    y = pool(x, (3, 3), (1, 1), "SAME")[0, :, :, 0]
    assert y[0, 0] == F32((1 + 2 + 4 + 5) / F32(4))  # the corner: 4 cells
    assert y[1, 1] == F32(45) / F32(9)


def test_row_major_order():
    # 1e8 + 1 - 1e8 + ... : the order of the additions shows in the rounding
    x = np.array([1e8, 1.0, -1e8, 1.0], F32).reshape(1, 2, 2, 1)
    y = pool(x, (2, 2), (2, 2), "VALID")
    assert y.item() == F32(F32(F32(F32(1e8) + F32(1)) - F32(1e8)) + F32(1)) / F32(4)


# 2 --------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype,side,cap", [(BF16, 17, 256), (np.float16, 46, 2048)])
def test_half_type_counts_saturate(dtype, side, cap):
    x = np.zeros((1, side, side, 1), dtype)
    x[0, 0, 0, 0] = 2
    y = pool(x, (side, side), (1, 1), "VALID")
    assert side * side > cap
    assert y.item() == dtype(2 / cap)  # not 2 / side**2


# 3 --------------------------------------------------------------------------------------
def test_grad_products_rounded_before_the_sum():
    rng = np.random.default_rng(3)
    g = rng.standard_normal((1, 4, 4, 64)).astype(F32)
    dx = pool_grad((1, 4, 4, 64), g, (3, 3), (1, 1), "SAME")
    # cell (1, 1): outputs (0..2, 0..2) in row-major order, coefficients 1/4, 1/6, 1/9
    co = np.array([[1 / 4, 1 / 6, 1 / 6], [1 / 6, 1 / 9, 1 / 9], [1 / 6, 1 / 9, 1 / 9]])
    rounded = np.zeros(64, F32)
    fused = np.zeros(64, F32)
    for i in range(3):
        for j in range(3):
            c = F32(co[i, j])
            rounded = rounded + g[0, i, j] * c
            fused = (fused.astype(np.float64) + g[0, i, j].astype(np.float64) * c).astype(F32)
    assert (_bits(dx[0, 1, 1]) == _bits(rounded)).all()
    assert (_bits(dx[0, 1, 1]) != _bits(fused)).any()  # the input tells them apart


def test_grad_coefficient_is_rounded_reciprocal():
    v = next(F32(v) for v in range(1, 100) if F32(v) * F32(1 / 9) != F32(v) / F32(9))
    dx = pool_grad((1, 3, 3, 1), np.full((1, 1, 1, 1), v, F32), (3, 3), (3, 3), "VALID")
    assert (dx == v * F32(1 / 9)).all()  # a product by the reciprocal, not a division


# 4 --------------------------------------------------------------------------------------
def test_denormals_flushed_float32_not_half():
    den = np.finfo(F32).smallest_subnormal
    x = np.array([den, den, 1.0, -1.0], F32).reshape(1, 2, 2, 1)
    assert pool(x, (1, 2), (1, 2), "VALID")[0, 0, 0, 0] == 0  # DAZ
    h = np.array([2**-24, 2**-24, 0, 0], np.float16).reshape(1, 2, 2, 1)
    assert pool(h, (1, 2), (1, 2), "VALID")[0, 0, 0, 0] == np.float16(2**-24)


# 5 --------------------------------------------------------------------------------------
def test_unchecked_grad_shape_refused():
    with pytest.raises(tfgrad.InvalidArgumentError, match="Expected grad shape"):
        raw_ops.AvgPoolGrad(orig_input_shape=[1, 4, 4, 2], grad=np.zeros((1, 2, 2, 3), F32),
                            ksize=[1, 2, 2, 1], strides=[1, 2, 2, 1], padding="VALID")


def test_empty_output_skips_the_window_checks():
    # TF returns the empty gradient before looking at the window or the grad's shape
    out = raw_ops.AvgPoolGrad(orig_input_shape=[0, 4, 4, 2], grad=np.zeros((1, 2, 2, 2), F32),
                              ksize=[1, 2, 2, 1], strides=[1, 0, 2, 1], padding="VALID")
    assert out.shape == (0, 4, 4, 2)


# 6 --------------------------------------------------------------------------------------
def test_random_geometries():
    rng = np.random.default_rng(7)
    for _ in range(12):
        shape = (int(rng.integers(1, 3)), int(rng.integers(1, 9)), int(rng.integers(1, 9)),
                 int(rng.integers(1, 6)))
        k = (int(rng.integers(1, 5)), int(rng.integers(1, 5)))
        s = (int(rng.integers(1, 4)), int(rng.integers(1, 4)))
        padding = str(rng.choice(["SAME", "VALID"]))
        x = (rng.standard_normal(shape) * 100).astype(F32)
        y = pool(x, k, s, padding)
        pool_grad(shape, rng.standard_normal(y.shape).astype(F32), k, s, padding)


def test_grad_is_the_adjoint():
    rng = np.random.default_rng(11)
    x = rng.standard_normal((2, 7, 6, 3))
    g = rng.standard_normal((2, 4, 3, 3))
    kw = dict(ksize=[1, 3, 3, 1], strides=[1, 2, 2, 1], padding="SAME")
    y = raw_ops.AvgPool(value=x, **kw)
    dx = raw_ops.AvgPoolGrad(orig_input_shape=[2, 7, 6, 3], grad=g, **kw)
    assert np.isclose((y * g).sum(), (x * dx).sum(), rtol=1e-12)


def test_gradient_table():
    (c,) = _gradients.calls("AvgPool", {})
    assert c.op == "AvgPoolGrad" and c.args["orig_input_shape"].kind == "shape"
    (cc,) = _gradients.calls("AvgPoolGrad", {})
    assert cc.op == "AvgPool" and cc.gives == {"grad": "output"}


def test_thread_counts_same_bits():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((4, 28, 28, 32)).astype(F32)
    kw = dict(ksize=[1, 3, 3, 1], strides=[1, 2, 2, 1], padding="SAME")
    g = rng.standard_normal((4, 14, 14, 32)).astype(F32)
    outs = []
    old = numba.get_num_threads()
    try:
        for t in sorted({1, numba.config.NUMBA_NUM_THREADS}):
            numba.set_num_threads(t)
            outs.append((raw_ops.AvgPool(value=x, **kw),
                         raw_ops.AvgPoolGrad(orig_input_shape=x.shape, grad=g, **kw)))
    finally:
        numba.set_num_threads(old)
    for a, b in zip(outs[0], outs[-1]):
        assert (_bits(a) == _bits(b)).all()
