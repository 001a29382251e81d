"""Family tests for FusedBatchNorm{,V2,V3} and FusedBatchNormGrad{,V2,V3}.

Pinned TF 2.21 behaviours (values worked out by hand from the definitions, or compared with
TF live), properties (kernel == reference on generated shapes), finite-difference checks of
the gradient against the forward in float64, thread-count determinism, and TF's
thread-dependent summation order (live, in subprocesses).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tfgrad
from tests import oracle
from tfgrad._config import tf_intra_op_threads
from tfgrad._tf import eigen
from tfgrad.ops import batch_norm as bn

raw = tfgrad.raw_ops
F32 = np.float32
E = np.zeros(0, F32)
ROOT = Path(__file__).resolve().parents[1]

# x of shape (2, 1, 2, 2) NHWC: channel 0 = [1, 3, 2, 8], channel 1 = [2, 5, 2, 0].
X = np.array([1, 2, 3, 5, 2, 2, 8, 0], F32).reshape(2, 1, 2, 2)
SCALE = np.array([1, 2], F32)
OFFSET = np.array([0.5, -1], F32)


def _bits_equal(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(
        np.ascontiguousarray(a).view(np.uint8), np.ascontiguousarray(b).view(np.uint8))


# --------------------------------------------------------------------------------------
# Pinned behaviours
# --------------------------------------------------------------------------------------
def test_bessel_correction_only_in_batch_variance():
    r = raw.FusedBatchNormV3(x=X, scale=SCALE, offset=OFFSET, mean=E, variance=E,
                             epsilon=0.0, is_training=True)
    # By hand: means 3.5 and 2.25; biased variances 29/4 and 12.75/4.
    np.testing.assert_array_equal(r.batch_mean, F32([3.5, 2.25]))
    np.testing.assert_array_equal(r.reserve_space_1, F32([3.5, 2.25]))
    np.testing.assert_array_equal(r.reserve_space_2, F32([7.25, 3.1875]))
    adj = F32(4) / F32(3)
    np.testing.assert_array_equal(r.batch_variance, F32([7.25, 3.1875]) * adj)
    assert r.reserve_space_3.shape == () and r.reserve_space_3 == 0
    # y is normalised with the biased variance (C=2 < 8: exact 1/sqrt).
    expect = (X[..., 0] - F32(3.5)) * (F32(1) / np.sqrt(F32(7.25)) * F32(1)) + F32(0.5)
    np.testing.assert_array_equal(r.y[..., 0], expect)


def test_exponential_avg_factor_uses_unbiased_variance():
    m, v = np.array([10, 20], F32), np.array([4, 9], F32)
    r = raw.FusedBatchNormV3(x=X, scale=SCALE, offset=OFFSET, mean=m, variance=v,
                             epsilon=0.0, exponential_avg_factor=0.25, is_training=True)
    f, adj = F32(0.25), F32(4) / F32(3)
    np.testing.assert_array_equal(r.batch_mean, (F32(1) - f) * m + f * F32([3.5, 2.25]))
    np.testing.assert_array_equal(r.batch_variance,
                                  (F32(1) - f) * v + (f * adj) * F32([7.25, 3.1875]))
    np.testing.assert_allclose(r.batch_mean, [8.375, 15.5625])  # by hand
    # factor 0 returns the inputs unchanged; y still uses the batch statistics.
    r0 = raw.FusedBatchNormV3(x=X, scale=SCALE, offset=OFFSET, mean=m, variance=v,
                              epsilon=0.0, exponential_avg_factor=0.0, is_training=True)
    np.testing.assert_array_equal(r0.batch_mean, m)
    np.testing.assert_array_equal(r0.batch_variance, v)
    np.testing.assert_array_equal(r0.y, r.y)


def test_mean_variance_ignored_when_factor_is_one():
    r1 = raw.FusedBatchNormV3(x=X, scale=SCALE, offset=OFFSET, mean=E, variance=E)
    r2 = raw.FusedBatchNormV3(x=X, scale=SCALE, offset=OFFSET, mean=np.ones(7, F32),
                              variance=np.ones(3, F32))
    for a, b in zip(r1, r2):
        assert _bits_equal(a, b)


def test_single_row_gives_offset_and_zero_variance():
    r = raw.FusedBatchNormV3(x=X[:1, :, :1], scale=SCALE, offset=OFFSET, mean=E, variance=E,
                             epsilon=0.001, is_training=True)
    np.testing.assert_array_equal(r.y.reshape(-1), OFFSET)
    np.testing.assert_array_equal(r.batch_variance, F32([0, 0]))  # Bessel factor 1, not 1/0


def test_epsilon_zero_constant_channel_is_nan():
    r = raw.FusedBatchNormV3(x=np.ones((1, 2, 2, 2), F32), scale=SCALE, offset=OFFSET,
                             mean=E, variance=E, epsilon=0.0)
    assert np.isnan(r.y).all()  # 0 * inf


def test_negative_epsilon_is_not_clamped():
    m, v = np.zeros(2, F32), np.array([4, 9], F32)
    r = raw.FusedBatchNormV3(x=X, scale=SCALE, offset=OFFSET, mean=m, variance=v,
                             epsilon=-5.0, is_training=False)
    assert np.isnan(r.y[..., 0]).all() and np.isfinite(r.y[..., 1]).all()  # 4-5 < 0 <= 9-5


def test_inference_reserve_spaces_are_copies_and_stats_pass_through():
    m, v = np.array([10, 20], F32), np.array([4, 9], F32)
    r = raw.FusedBatchNormV3(x=X, scale=SCALE, offset=OFFSET, mean=m, variance=v,
                             exponential_avg_factor=0.3, is_training=False)
    for out in (r.batch_mean, r.reserve_space_1):
        np.testing.assert_array_equal(out, m)
    for out in (r.batch_variance, r.reserve_space_2):
        np.testing.assert_array_equal(out, v)
    r.batch_mean[0] = 99  # outputs are fresh arrays
    assert m[0] == 10


@pytest.mark.parametrize("fmt", ["NHWC", "NCHW"])
@pytest.mark.parametrize("training", [True, False])
def test_vectors_as_given_or_copied_same_bits(fmt, training):
    """The kernels read scale, offset, mean and variance where they are given (writable
    C-contiguous float32 vectors) and copies of any other (read-only, strided): the same
    bits either way, and the inputs unchanged."""
    rng = np.random.default_rng(7)
    for c in (16, 5):  # (whole lane vectors: the vector kernels; 5: the scalar ones)
        shape = (3, 4, 5, c) if fmt == "NHWC" else (3, c, 4, 5)
        x = rng.standard_normal(shape).astype(F32)
        dy = rng.standard_normal(shape).astype(F32)
        vecs = [rng.standard_normal(c).astype(F32) for _ in range(3)]
        vecs.append((rng.random(c) + 0.5).astype(F32))  # variance
        kept = [v.copy() for v in vecs]

        def variants(v):
            ro = v.copy()
            ro.flags.writeable = False
            strided = np.repeat(v, 2)[::2]
            return v, ro, strided

        outs = []
        for k in range(3):
            sc, off, m, var = (variants(v)[k] for v in vecs)
            f = raw.FusedBatchNormV3(x=x, scale=sc, offset=off, mean=m, variance=var,
                                     exponential_avg_factor=0.3, data_format=fmt,
                                     is_training=training)
            g = raw.FusedBatchNormGradV3(y_backprop=dy, x=x, scale=sc,
                                         reserve_space_1=f.reserve_space_1 if training else m,
                                         reserve_space_2=f.reserve_space_2 if training else var,
                                         reserve_space_3=f.reserve_space_3, data_format=fmt,
                                         is_training=training)
            outs.append([*f[:5], *g[:3]])
        for other in outs[1:]:
            for a, b in zip(outs[0], other):
                assert np.array_equal(a.view(np.uint32), b.view(np.uint32))
        for v, k in zip(vecs, kept):
            assert np.array_equal(v, k)


@pytest.mark.parametrize("training", [True, False])
def test_empty_batch(training):
    x = np.zeros((0, 2, 2, 3), F32)
    r = raw.FusedBatchNormV3(x=x, scale=np.ones(3, F32), offset=np.ones(3, F32),
                             mean=np.ones(3, F32), variance=np.ones(3, F32),
                             is_training=training)
    assert r.y.shape == x.shape
    assert np.isnan(r.batch_mean).all() and np.isnan(r.batch_variance).all()  # TF: NaN
    np.testing.assert_array_equal(r.reserve_space_1, np.zeros(3, F32))  # TF: uninitialised
    g = raw.FusedBatchNormGradV3(y_backprop=x, x=x, scale=np.ones(3, F32),
                                 reserve_space_1=np.ones(3, F32),
                                 reserve_space_2=np.ones(3, F32), reserve_space_3=E,
                                 is_training=training, data_format="NHWC")
    np.testing.assert_array_equal(g.scale_backprop, np.zeros(3, F32))
    np.testing.assert_array_equal(g.offset_backprop, np.zeros(3, F32))


@pytest.mark.parametrize("impl", ["kernel", "reference"])
@pytest.mark.parametrize("fmt, shape", [("NDHWC", (0, 1, 1, 1, 6)), ("NDHWC", (1, 1, 1, 18, 0)),
                                        ("NCDHW", (0, 6, 1, 2, 3))])
def test_empty_5d_grad_keeps_x_shape(impl, fmt, shape):
    # TF returns x_backprop in its 4-D working shape here (an early return before the 5-D
    # shape is restored); tfgrad keeps x's shape (see the module docstring).
    c = shape[-1] if fmt == "NDHWC" else shape[1]
    x = np.zeros(shape, F32)
    kw = dict(y_backprop=x, x=x, scale=np.ones(c, F32), reserve_space_1=np.zeros(c, F32),
              reserve_space_2=np.ones(c, F32), reserve_space_3=E, data_format=fmt)
    with tfgrad.use_impl(impl):
        g = raw.FusedBatchNormGradV3(**kw)
    assert g.x_backprop.shape == shape
    np.testing.assert_array_equal(g.scale_backprop, np.zeros(c, F32))
    if oracle.tensorflow() is not None:
        want = oracle.run_tf("FusedBatchNormGradV3", kw)
        assert np.asarray(want[0]).ndim == 4 and np.asarray(want[0]).size == 0


@pytest.mark.live
def test_bfloat16_nan_signs_differ_from_tf_packets():
    # epsilon -5 makes rsqrt(var + eps) an invalid operation: -NaN (x86's default NaN)
    # in every element. TF's cast to bfloat16 makes it +NaN in the whole packet of 8 and
    # keeps -NaN in the tail; tfgrad keeps the sign everywhere (module docstring).
    kw = dict(x=np.ones((1, 1, 1, 9), ml_dtypes.bfloat16), scale=np.ones(9, F32),
              offset=np.zeros(9, F32), mean=np.zeros(9, F32), variance=np.ones(9, F32),
              epsilon=-5.0, is_training=False)
    want = np.asarray(oracle.run_tf("FusedBatchNormV3", kw)[0]).reshape(-1)
    got = raw.FusedBatchNormV3(**kw).y.reshape(-1)
    assert np.isnan(want.astype(F32)).all() and np.isnan(got.astype(F32)).all()
    assert not np.signbit(want[:8].astype(F32)).any() and np.signbit(want[8].astype(F32))
    assert np.signbit(got.astype(F32)).all()


def test_grad_placeholder_outputs_have_shape_zero():
    g = raw.FusedBatchNormGradV3(y_backprop=X, x=X, scale=SCALE, reserve_space_1=SCALE,
                                 reserve_space_2=SCALE, reserve_space_3=np.ones((3, 3), F32))
    assert g.reserve_space_4.shape == (0,) and g.reserve_space_5.shape == (0,)
    g1 = raw.FusedBatchNormGrad(y_backprop=X, x=X, scale=SCALE, reserve_space_1=SCALE,
                                reserve_space_2=SCALE)
    assert g1.reserve_space_3.shape == (0,) and g1.reserve_space_4.shape == (0,)


@pytest.mark.parametrize("impl", ["kernel", "reference"])
def test_inference_grad_nchw_is_transposed_nhwc(impl):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 3, 4, 5)).astype(F32)
    dy = rng.standard_normal((2, 3, 4, 5)).astype(F32)
    kw = dict(scale=rng.standard_normal(5).astype(F32), reserve_space_1=np.zeros(5, F32),
              reserve_space_2=np.ones(5, F32), reserve_space_3=E, is_training=False)
    with tfgrad.use_impl(impl):
        a = raw.FusedBatchNormGradV3(y_backprop=dy, x=x, **kw)
        b = raw.FusedBatchNormGradV3(y_backprop=np.moveaxis(dy, -1, 1),
                                     x=np.moveaxis(x, -1, 1), data_format="NCHW", **kw)
    assert _bits_equal(np.ascontiguousarray(np.moveaxis(b.x_backprop, 1, -1)), a.x_backprop)
    assert _bits_equal(a.scale_backprop, b.scale_backprop)


def test_rsqrt_approximation_applies_to_full_packets_only():
    # The same variances as channels 0..7 of C=8 (one full packet: vrsqrtps + Newton) and of
    # C=7 (all tail: exact 1/sqrt) give different y for some values.
    v = np.linspace(0.3, 3.0, 64, dtype=F32)
    exact = F32(1) / np.sqrt(v + F32(1e-3))
    approx = bn.eigen_rsqrt(v + F32(1e-3))
    assert (approx != exact).any() and np.abs(approx / exact - 1).max() < 1e-6
    tail = bn.eigen_rsqrt((v + F32(1e-3))[:7])
    np.testing.assert_array_equal(tail, exact[:7])
    # Tiles: in [C] = 4100 split as 4050 + 50, channels 4048, 4049 (tile tail) are exact.
    w = np.resize(v + F32(1e-3), 4100)
    t = bn.eigen_rsqrt(w, 4050)
    ex = F32(1) / np.sqrt(w)
    assert _bits_equal(t[4048:4050], ex[4048:4050])
    assert _bits_equal(t[4050:4098], bn.eigen_rsqrt(w[4050:4098]))


def test_processor_dependent_outputs_are_the_rsqrt_ones():
    # The outputs the fixtures keep per rsqrt signature: y of the forward ops, x_backprop
    # and scale_backprop of the gradients, in some of each op's fixtures and only those.
    from tests import fixture_store
    from tfgrad.testing.cases import batch_norm as cases

    fixtures = fixture_store.load("batch_norm")
    for name in cases.FWD + cases.GRAD:
        want = {"x_backprop", "scale_backprop"} if "Grad" in name else {"y"}
        sets = [cases.processor_dependent(c, fixtures[c.id][0])
                for c in cases.CASES if c.op == name]
        assert want in sets and all(s in (set(), want) for s in sets), name


@pytest.mark.live
def test_rsqrt_special_values_match_tf():
    # var + eps in {0, tiny, subnormal, huge, inf}: the Newton step's NaN falls back to y0.
    v = np.array([0, 1e-45, 1e-40, 1e-30, 3e38, np.inf, 1, 2], F32)
    kw = dict(x=np.zeros((1, 1, 1, 8), F32), scale=np.ones(8, F32), offset=np.zeros(8, F32),
              mean=-np.ones(8, F32), variance=v, epsilon=0.0, is_training=False)
    got, expected = raw.FusedBatchNormV3(**kw), oracle.run_tf("FusedBatchNormV3", kw)
    oracle.assert_same(got.y, expected[0], what="y")
    # the grad (frozen statistics) evaluates the same rsqrt
    gkw = dict(y_backprop=np.ones((1, 1, 1, 8), F32), x=kw["x"], scale=kw["scale"],
               reserve_space_1=kw["mean"], reserve_space_2=v, reserve_space_3=E,
               epsilon=0.0, is_training=False)
    oracle.assert_outputs("FusedBatchNormGradV3", raw.FusedBatchNormGradV3(**gkw),
                          oracle.run_tf("FusedBatchNormGradV3", gkw), what="grad")


@pytest.mark.live
def test_half_types_live():
    rng = np.random.default_rng(5)
    for dt in (np.float16, ml_dtypes.bfloat16):
        x = (rng.standard_normal((2, 5, 5, 17)) * 4 + 2).astype(dt)
        kw = dict(x=x, scale=rng.standard_normal(17).astype(F32),
                  offset=rng.standard_normal(17).astype(F32), mean=E, variance=E)
        got = raw.FusedBatchNormV3(**kw)
        oracle.assert_outputs("FusedBatchNormV3", got, oracle.run_tf("FusedBatchNormV3", kw))


# --------------------------------------------------------------------------------------
# Denormals (TF's FTZ / DAZ) and the signs of flushed zeros
# --------------------------------------------------------------------------------------
# shapes that take each kernel: the single-threaded twins, the NHWC vector kernels
# (C % 16 == 0), the NHWC scalar-loop kernels and NCHW, the last three threaded
_FTZ_CASES = [((1, 2, 2, 8), "NHWC"), ((2, 32, 32, 32), "NHWC"), ((2, 32, 32, 35), "NHWC"),
              ((2, 35, 32, 32), "NCHW")]


def _channel_axis(fmt):
    return -1 if fmt == "NHWC" else 1


@pytest.mark.parametrize("impl", ["kernel", "reference"])
@pytest.mark.parametrize("shape, fmt", _FTZ_CASES)
def test_denormals_flush_to_zero_as_tf(impl, shape, fmt):
    """TF runs its kernels with FTZ and DAZ set (tfgrad._tf.fpenv), Numba's worker threads
    included here: a denormal input reads as 0 and a denormal result becomes 0."""
    c = shape[_channel_axis(fmt)]
    ones, zeros = np.ones(c, F32), np.zeros(c, F32)
    sub = np.full(shape, 1e-39, F32)  # denormal
    with tfgrad.use_impl(impl):
        # frozen statistics: y = (x - 0) * rsqrt(1) + 0 with x read as 0
        y = raw.FusedBatchNormV3(x=sub, scale=ones, offset=zeros, mean=zeros, variance=ones,
                                 epsilon=0.0, data_format=fmt, is_training=False).y
        assert not y.any()
        # batch statistics: x = +-a (mean 0), a*a = 1e-40 flushes, so the variance is 0
        a = np.where(np.indices(shape).sum(0) % 2 == 0, F32(1e-20), F32(-1e-20))
        r = raw.FusedBatchNormV3(x=a, scale=ones, offset=zeros, mean=E, variance=E,
                                 epsilon=1.0, data_format=fmt, is_training=True)
        assert not r.reserve_space_2.any() and not r.batch_variance.any()
        # the gradient of a denormal y_backprop: every sum and x_backprop read it as 0
        for training in (True, False):
            g = raw.FusedBatchNormGradV3(y_backprop=sub, x=a, scale=ones,
                                         reserve_space_1=zeros, reserve_space_2=ones,
                                         reserve_space_3=E, epsilon=0.0, data_format=fmt,
                                         is_training=training)
            assert not g.x_backprop.any() and not g.offset_backprop.any()
            assert not g.scale_backprop.any()
    assert F32(1e-20) * F32(1e-20) != 0 and sub[0, 0, 0, 0] * F32(1) != 0  # not flushed here


# A column whose sum flushes to -0: ((0 + a) + b) + c = -1.6e-40 in exact arithmetic.
_MINUS_ZERO_COLUMN = F32([-1.9727995e-38, 8.756155e-38, -6.799314e-38])


@pytest.mark.parametrize("impl", ["kernel", "reference"])
@pytest.mark.parametrize("c, threads, sign", [(8, 1, -1), (8, 2, -1), (32, 1, -1),
                                              (32, 2, +1), (100, 2, -1)])
def test_grad_sum_flushed_to_minus_zero(impl, c, threads, sign, monkeypatch):
    """TF's ReduceOuterDimensions adds its partial sums to the first one. On 2 threads
    with C = 32 it makes two blocks but (little work) runs them in one call: all rows
    land in the first and the untouched second, +0, is added after, so the flushed -0
    becomes +0. One block (C = 8, or one thread) or C > 32 * threads keeps -0."""
    monkeypatch.setenv("TFGRAD_TF_INTRA_OP_THREADS", str(threads))
    assert eigen.redux_plan(3, c, 4, threads) == (3, False, c == 32 and threads == 2)
    dy = np.zeros((1, 1, 3, c), F32)
    dy[0, 0, :, 0] = _MINUS_ZERO_COLUMN
    with tfgrad.use_impl(impl):
        for training in (True, False):
            g = raw.FusedBatchNormGradV3(y_backprop=dy, x=np.zeros_like(dy),
                                         scale=np.ones(c, F32), reserve_space_1=np.zeros(c, F32),
                                         reserve_space_2=np.ones(c, F32), reserve_space_3=E,
                                         is_training=training)
            ob = g.offset_backprop[0]
            assert ob == 0 and np.signbit(ob) == (sign < 0), (training, ob)


@pytest.mark.parametrize("impl", ["kernel", "reference"])
def test_forward_mean_flushed_to_minus_zero(impl):
    # Eigen's column sum starts from +0 and never adds +0 after: the mean stays -0.
    x = np.zeros((1, 1, 3, 8), F32)
    x[0, 0, :, 0] = _MINUS_ZERO_COLUMN
    with tfgrad.use_impl(impl):
        r = raw.FusedBatchNormV3(x=x, scale=np.ones(8, F32), offset=np.zeros(8, F32),
                                 mean=E, variance=E, is_training=True)
    assert r.batch_mean[0] == 0 and np.signbit(r.batch_mean[0])


@pytest.mark.parametrize("fmt", ["NHWC", "NCHW"])
@pytest.mark.parametrize("rows, at", [(3, [0, 1, 2]), (20, [0, 4, 8]), (21, [1, 5, 20]),
                                      (23, [20, 21, 22])])
def test_forward_flushed_sums_kernel_equals_reference(fmt, rows, at):
    # A channel whose sum flushes to -0 in one of Eigen's four accumulators (rows j % 4)
    # or in the rows after them: the sign that survives the combine is the reference's.
    x = np.zeros((1, 1, rows, 8), F32)
    x[0, 0, at, 0] = _MINUS_ZERO_COLUMN
    if fmt == "NCHW":
        x = np.ascontiguousarray(np.moveaxis(x, -1, 1))
    kw = dict(x=x, scale=np.ones(8, F32), offset=np.zeros(8, F32), mean=E, variance=E,
              is_training=True, data_format=fmt)
    kern = raw.FusedBatchNormV3(**kw)
    with tfgrad.use_impl("reference"):
        ref = raw.FusedBatchNormV3(**kw)
    oracle.assert_outputs("FusedBatchNormV3", kern, ref, what=f"{fmt} {rows} rows")
    assert kern.batch_mean[0] == 0


@pytest.mark.live
def test_live_tf_flushed_zeros_and_thread_split():
    # The pinned cases above, against TF on this machine (its own thread count).
    threads = tf_intra_op_threads()
    for c in (8, 32, 100):
        dy = np.zeros((1, 1, 3, c), F32)
        dy[0, 0, :, 0] = _MINUS_ZERO_COLUMN
        for training in (True, False):
            kw = dict(y_backprop=dy, x=np.zeros_like(dy), scale=np.ones(c, F32),
                      reserve_space_1=np.zeros(c, F32), reserve_space_2=np.ones(c, F32),
                      reserve_space_3=E, is_training=training)
            want = oracle.run_tf("FusedBatchNormGradV3", kw)
            assert np.signbit(want[2][0]) != eigen.redux_plan(3, c, 4, threads)[2]
            for impl in ("kernel", "reference"):
                with tfgrad.use_impl(impl):
                    oracle.assert_outputs("FusedBatchNormGradV3",
                                          raw.FusedBatchNormGradV3(**kw), want, what=impl)


def _tiny(rng, shape, dt):
    """Values spread over the float32 denormal range and just above it (half types:
    float16 values around its own underflow, as the float32 ones would overflow it)."""
    a = rng.standard_normal(shape).astype(F32)
    if dt == np.float16:
        return (a * F32(1e-7)).astype(dt)
    mag = F32(10.0) ** rng.uniform(-45, -36, shape).astype(F32)
    return np.where(rng.random(shape) < 0.5, a * mag, a * F32(1e-37)).astype(dt)


@pytest.mark.live
@pytest.mark.parametrize("dt", [F32, np.float16, ml_dtypes.bfloat16])
def test_live_tf_denormal_inputs(dt):
    """Inputs, scales and statistics in and around the denormal range, every kernel
    path: bit-identical to TF, zeros' signs included."""
    rng = np.random.default_rng(11)
    for shape, fmt in _FTZ_CASES + [((1, 3, 3, 128), "NHWC"), ((2, 3, 4, 64), "NCHW")]:
        c = shape[_channel_axis(fmt)]
        x, dy = _tiny(rng, shape, dt), _tiny(rng, shape, dt)
        vec = [_tiny(rng, c, F32) for _ in range(3)]
        var = np.abs(_tiny(rng, c, F32))
        for training in (True, False):
            for eps in (1e-3, 1e-40):
                fkw = dict(x=x, scale=vec[0], offset=vec[1], mean=vec[2], variance=var,
                           epsilon=eps, exponential_avg_factor=0.5, data_format=fmt,
                           is_training=training)
                f = oracle.run_tf("FusedBatchNormV3", fkw)
                rs = (f[3], f[4]) if training else (vec[2], var)
                gkw = dict(y_backprop=dy, x=x, scale=vec[0], reserve_space_1=rs[0],
                           reserve_space_2=rs[1], reserve_space_3=E, epsilon=eps,
                           data_format=fmt, is_training=training)
                # (TF's CPU kernel has no NCHW gradient with frozen statistics)
                g = oracle.run_tf("FusedBatchNormGradV3", gkw) if training or \
                    fmt == "NHWC" else None
                for impl in ("kernel", "reference"):
                    with tfgrad.use_impl(impl):
                        got = raw.FusedBatchNormV3(**fkw)
                        what = f"{impl} {shape} {fmt} {training} {eps}"
                        for i in range(3 + 2 * training):  # reserve spaces: training only
                            oracle.assert_same(got[i], f[i], what=f"{what} out {i}")
                        if g is not None:
                            oracle.assert_outputs("FusedBatchNormGradV3",
                                                  raw.FusedBatchNormGradV3(**gkw), g,
                                                  what=what)


# --------------------------------------------------------------------------------------
# Properties: kernel == reference
# --------------------------------------------------------------------------------------
@st.composite
def _bn_inputs(draw):
    n = draw(st.integers(1, 3))
    h = draw(st.integers(1, 6))
    w = draw(st.integers(1, 6))
    c = draw(st.integers(1, 20))
    five = draw(st.booleans())
    fmt = draw(st.sampled_from(["NHWC", "NCHW"]))
    dt = draw(st.sampled_from([np.float32, np.float16, ml_dtypes.bfloat16]))
    training = draw(st.booleans())
    seed = draw(st.integers(0, 2**32 - 1))
    return n, h, w, c, five, fmt, dt, training, seed


@settings(max_examples=30, deadline=None)
@given(_bn_inputs())
def test_kernel_equals_reference(params):
    n, h, w, c, five, fmt, dt, training, seed = params
    rng = np.random.default_rng(seed)
    shape = (n, 2, h, w, c) if five else (n, h, w, c)
    x = (rng.standard_normal(shape) * 3 + 1).astype(dt)
    dy = rng.standard_normal(shape).astype(dt)
    if fmt == "NCHW":
        x, dy = np.moveaxis(x, -1, 1), np.moveaxis(dy, -1, 1)
    fmt = fmt if not five else {"NHWC": "NDHWC", "NCHW": "NCDHW"}[fmt]
    vec = [rng.standard_normal(c).astype(F32) for _ in range(3)]
    var = (rng.random(c) + 0.1).astype(F32)
    fkw = dict(x=x, scale=vec[0], offset=vec[1], mean=vec[2], variance=var, epsilon=1e-3,
               exponential_avg_factor=0.5, data_format=fmt, is_training=training)
    gkw = dict(y_backprop=dy, x=x, scale=vec[0], reserve_space_1=vec[2], reserve_space_2=var,
               reserve_space_3=E, epsilon=1e-3, data_format=fmt, is_training=training)
    for op, kw in (("FusedBatchNormV3", fkw), ("FusedBatchNormGradV3", gkw)):
        kern = getattr(raw, op)(**kw)
        with tfgrad.use_impl("reference"):
            ref = getattr(raw, op)(**kw)
        oracle.assert_outputs(op, kern, ref, what="kernel vs reference")


@pytest.mark.parametrize("fmt", ["NHWC", "NCHW"])
@pytest.mark.parametrize("training", [True, False])
def test_parallel_kernels_equal_reference(fmt, training):
    # Above the size where the kernels switch from their single-threaded twins.
    shape = (3, 20, 20, 70) if fmt == "NHWC" else (3, 70, 20, 20)
    _kernel_vs_reference(shape, 7, training, fmt, specials=False)


def _kernel_vs_reference(shape, seed, training, fmt="NHWC", specials=True):
    """FusedBatchNormV3 and its gradient, kernel against NumPy reference, bit for bit."""
    rng = np.random.default_rng(seed)
    c = shape[-1] if fmt == "NHWC" else shape[1]
    x = (rng.standard_normal(shape) * 2 + 1).astype(F32)
    dy = rng.standard_normal(shape).astype(F32)
    # specials reach every lane position: NaN, +-inf, -0 and denormals (read as +-0)
    # must travel as TF's do
    if specials:
        flat = x.reshape(-1)
        flat[rng.integers(0, flat.size, 5)] = [np.nan, np.inf, -0.0, 1e-39, -1e-39]
    vec = [rng.standard_normal(c).astype(F32) for _ in range(3)]
    var = (rng.random(c) + 0.1).astype(F32)
    calls = [("FusedBatchNormV3", dict(x=x, scale=vec[0], offset=vec[1], mean=vec[2],
                                       variance=var, exponential_avg_factor=0.5,
                                       data_format=fmt, is_training=training)),
             ("FusedBatchNormGradV3", dict(y_backprop=dy, x=x, scale=vec[0],
                                           reserve_space_1=vec[2], reserve_space_2=var,
                                           reserve_space_3=E, data_format=fmt,
                                           is_training=training))]
    for op, kw in calls:
        kern = getattr(raw, op)(**kw)
        with tfgrad.use_impl("reference"):
            ref = getattr(raw, op)(**kw)
        oracle.assert_outputs(op, kern, ref, what=f"kernel vs reference {shape} {fmt}")


@settings(max_examples=25, deadline=None)
@given(rows=st.sampled_from([1, 3, 15, 16, 17, 19, 64, 299, 1001, 4099]),
       vectors=st.integers(1, 9), training=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_nhwc_vector_kernels_equal_reference(rows, vectors, training, seed):
    # C a multiple of 16 takes the register-blocked NHWC kernels: blocks of one to four
    # channel vectors, the four-accumulator order from 16 rows, prefetch near the end,
    # the threaded kernels from 65536 elements.
    _kernel_vs_reference((1, rows, 1, 16 * vectors), seed, training)


@pytest.mark.parametrize("vectors", [1, 3, 5, 7])
def test_nhwc_stats_every_block_width(vectors):
    # The training forward's statistics run a variant compiled for each block width of
    # one to four channel vectors (kernels.batch_norm._stats_block); on two threads
    # these C make blocks of 1, 2 + 1, 3 + 2 and 4 + 3 vectors, threaded (>= 65536
    # elements).
    _kernel_vs_reference((1, 4099, 1, 16 * vectors), vectors, True)


@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("fmt, shape", [("NHWC", (2, 64, 66, 128)),
                                        ("NCHW", (2, 64, 90, 91))])
def test_streaming_outputs(fmt, shape, training):
    # Outputs of 4 MiB or more are written with non-temporal stores; NCHW spans of
    # H*W = 8190 values start and end off the vector grid (single values around).
    _kernel_vs_reference(shape, 3, training, fmt)


@pytest.mark.parametrize("training", [True, False])
def test_nchw_grad_sums_with_tf_thread_split_mid_image(training, monkeypatch):
    # TF's two-thread order sums the rows in two blocks; here the second starts inside
    # an image, off any 16-position boundary (the NCHW kernels walk rows image by image).
    monkeypatch.setenv("TFGRAD_TF_INTRA_OP_THREADS", "2")
    rows = eigen.redux_plan(3 * 90 * 91, 16, 4, 2)[0]
    assert rows < 3 * 90 * 91 and rows % (90 * 91) % 16 != 0
    _kernel_vs_reference((3, 16, 90, 91), 5, training, "NCHW")


def test_eight_lane_loads():
    # _simd's channel-major loads: vector r of vload8_t has lane k = a[i + k*stride + r]
    # (eight rows transposed in registers), vgather8 lane k = a[i + k*stride] (with
    # stride 1: eight contiguous values).
    import numba

    from tfgrad.kernels._simd import vgather8, vlane, vload8_t

    @numba.njit
    def lanes(a, i, stride, out):  # pragma: no cover - compiled
        v0, v1, v2, v3, v4, v5, v6, v7 = vload8_t(a, i, stride)
        g, c = vgather8(a, i, stride), vgather8(a, i, 1)
        for k in range(8):
            out[0, k], out[1, k], out[2, k], out[3, k] = (vlane(v0, k), vlane(v1, k),
                                                          vlane(v2, k), vlane(v3, k))
            out[4, k], out[5, k], out[6, k], out[7, k] = (vlane(v4, k), vlane(v5, k),
                                                          vlane(v6, k), vlane(v7, k))
            out[8, k], out[9, k] = vlane(g, k), vlane(c, k)

    a = np.random.default_rng(0).standard_normal(400).astype(F32)
    for i, stride in ((0, 8), (3, 37), (5, 49)):
        out = np.zeros((10, 8), F32)
        lanes(a, i, stride, out)
        rows = np.array([[a[i + k * stride + r] for k in range(8)] for r in range(8)])
        np.testing.assert_array_equal(out[:8], rows)
        np.testing.assert_array_equal(out[8], rows[0])
        np.testing.assert_array_equal(out[9], a[i:i + 8])


@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("threads", [1, 4, 8])
@pytest.mark.parametrize("shape", [(2, 8, 40, 41), (2, 21, 7, 9), (3, 13, 90, 91),
                                   (6, 24, 50, 51), (1, 16, 3, 5), (2, 5, 9, 11)])
def test_nchw_sums_eight_channels_per_vector(shape, threads, training, monkeypatch):
    # The NCHW forward's statistics and the gradient's sums take eight channels at once,
    # a vector lane each, over eight positions transposed in registers; positions that
    # do not make a whole eight inside one image (and one of TF's row blocks, or from a
    # row j = 0 mod 4 for Eigen's four accumulators) go one at a time, and a last group
    # of fewer than eight channels (C = 21, 13) reuses the lanes of the last eight, whose
    # forward order differs below 8*(C//8). On 4 or 8 TF threads the third and fourth shapes
    # have gradient row blocks of 6143 / 3072 and 3825 / 1913 rows: boundaries inside
    # images, off the grid of eight. (1, 16, 3, 5) has 15 rows: no four accumulators;
    # C = 5 is too few channels for a vector.
    monkeypatch.setenv("TFGRAD_TF_INTRA_OP_THREADS", str(threads))
    _kernel_vs_reference(shape, threads, training, "NCHW")


# --------------------------------------------------------------------------------------
# Finite differences: the gradient against the forward, in float64
# --------------------------------------------------------------------------------------
def _loss64(x, scale, offset, dy, eps, mean=None, var=None):
    """sum(dy * y) with y the batch norm of x computed in float64 (NHWC)."""
    x2 = x.reshape(-1, x.shape[-1])
    if mean is None:
        m = x2.mean(axis=0)
        v = ((x2 - m) ** 2).mean(axis=0)
    else:
        m, v = mean, var
    y = (x2 - m) / np.sqrt(v + eps) * scale + offset
    return float((y * dy.reshape(y.shape)).sum())


@pytest.mark.parametrize("training", [True, False])
def test_grad_matches_central_differences(training):
    rng = np.random.default_rng(11)
    shape, eps = (2, 2, 3, 3), 1e-3
    x = (rng.standard_normal(shape) * 2 + 1).astype(F32)
    dy = rng.standard_normal(shape).astype(F32)
    scale = rng.standard_normal(3).astype(F32)
    offset = rng.standard_normal(3).astype(F32)
    pm, pv = rng.standard_normal(3).astype(F32), (rng.random(3) + 0.5).astype(F32)
    x64, dy64 = x.astype(np.float64), dy.astype(np.float64)
    if training:
        fwd = raw.FusedBatchNormV3(x=x, scale=scale, offset=offset, mean=E, variance=E,
                                   epsilon=eps)
        mean, var = fwd.reserve_space_1, fwd.reserve_space_2
        stats = {}
    else:
        mean, var = pm, pv
        stats = dict(mean=pm.astype(np.float64), var=pv.astype(np.float64))
    g = raw.FusedBatchNormGradV3(y_backprop=dy, x=x, scale=scale, reserve_space_1=mean,
                                 reserve_space_2=var, reserve_space_3=E, epsilon=eps,
                                 is_training=training)
    h = 1e-6

    def num_grad(which: str, arr: np.ndarray) -> np.ndarray:
        out = np.zeros(arr.shape)
        for i in np.ndindex(arr.shape):
            up, dn = arr.copy(), arr.copy()
            up[i] += h
            dn[i] -= h
            args = dict(x=x64, scale=scale.astype(np.float64),
                        offset=offset.astype(np.float64))
            args[which] = up
            lu = _loss64(args["x"], args["scale"], args["offset"], dy64, eps, **stats)
            args[which] = dn
            ld = _loss64(args["x"], args["scale"], args["offset"], dy64, eps, **stats)
            out[i] = (lu - ld) / (2 * h)
        return out

    tol = dict(rtol=2e-4, atol=2e-4)
    np.testing.assert_allclose(g.x_backprop, num_grad("x", x64), **tol)
    np.testing.assert_allclose(g.scale_backprop, num_grad("scale", scale.astype(np.float64)),
                               **tol)
    np.testing.assert_allclose(g.offset_backprop,
                               num_grad("offset", offset.astype(np.float64)), **tol)


# --------------------------------------------------------------------------------------
# Determinism and TF's thread-dependent order
# --------------------------------------------------------------------------------------
_DETERMINISM = textwrap.dedent("""
    import hashlib, sys
    import numpy as np
    import tfgrad
    rng = np.random.default_rng(0)
    h = hashlib.sha256()
    for fmt, shape in (("NHWC", (4, 16, 16, 70)), ("NCHW", (4, 70, 16, 16)),
                       ("NHWC", (4, 16, 16, 80))):  # C % 16 == 0: the vector kernels
        x = rng.standard_normal(shape).astype(np.float32)
        dy = rng.standard_normal(shape).astype(np.float32)
        c = shape[-1] if fmt == "NHWC" else shape[1]
        s = rng.standard_normal(c).astype(np.float32)
        f = tfgrad.raw_ops.FusedBatchNormV3(x=x, scale=s, offset=s, mean=s, variance=s * s,
                                            exponential_avg_factor=0.5, data_format=fmt)
        g = tfgrad.raw_ops.FusedBatchNormGradV3(y_backprop=dy, x=x, scale=s,
                                                reserve_space_1=f[3], reserve_space_2=f[4],
                                                reserve_space_3=f[5], data_format=fmt)
        for a in list(f) + list(g):
            h.update(np.ascontiguousarray(a).tobytes())
    print(h.hexdigest())
""")


def test_results_do_not_depend_on_numba_thread_count():
    digests = []
    for threads in ("1", "2"):
        env = dict(os.environ, NUMBA_NUM_THREADS=threads)
        out = subprocess.run([sys.executable, "-c", _DETERMINISM], env=env, cwd=ROOT,
                             capture_output=True, text=True, check=True)
        digests.append(out.stdout.strip())
    assert digests[0] == digests[1]


_TF_THREADS = textwrap.dedent("""
    import os, sys
    os.environ["TF_ENABLE_ONEDNN_OPTS"] = "0"
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
    import numpy as np
    import tensorflow as tf
    tf.config.threading.set_intra_op_parallelism_threads(int(sys.argv[1]))
    data = np.load(sys.argv[2])
    cases = sorted({k.split("_", 1)[0] for k in data.files})
    out = {}
    for c in cases:
        kw = {k.split("_", 1)[1]: data[k] for k in data.files if k.split("_", 1)[0] == c}
        r = tf.raw_ops.FusedBatchNormGradV3(**kw, is_training=True)
        out.update({f"{c}_{i}": o.numpy() for i, o in enumerate(r[:3])})
    np.savez(sys.argv[3], **out)
""")


def _tf_grads_on_threads(threads: int, cases: list[dict], tmp_path: Path) -> list[tuple]:
    """TF's FusedBatchNormGradV3 (is_training) outputs for each case, in a process whose
    intra-op pool has ``threads`` threads (TF sets it once per process)."""
    np.savez(tmp_path / "in.npz", **{f"c{i}_{k}": v for i, kw in enumerate(cases)
                                     for k, v in kw.items()})
    subprocess.run([sys.executable, "-c", _TF_THREADS, str(threads), str(tmp_path / "in.npz"),
                    str(tmp_path / "out.npz")], check=True, capture_output=True, timeout=300)
    out = np.load(tmp_path / "out.npz")
    return [tuple(out[f"c{i}_{j}"] for j in range(3)) for i in range(len(cases))]


def _grad_kw(dy: np.ndarray, x: np.ndarray, c: int, rng: np.random.Generator) -> dict:
    return dict(y_backprop=dy, x=x, scale=rng.standard_normal(c).astype(F32),
                reserve_space_1=np.zeros(c, F32), reserve_space_2=np.ones(c, F32),
                reserve_space_3=E)


@pytest.mark.live
@pytest.mark.slow
@pytest.mark.parametrize("threads", [1, 2, 3, 16, 64])
def test_tf_thread_split_of_grad_sums(threads, tmp_path, monkeypatch):
    """TF splits the grad's column sums into row blocks on several threads when C <= 32 *
    threads and the input is large (from 11 threads running several blocks in one call);
    TFGRAD_TF_INTRA_OP_THREADS selects the count."""
    rng = np.random.default_rng(2)
    shape = (2, 100, 100, 8)  # 160k elements: TF's cost model uses 2 threads or more
    kw = _grad_kw(rng.standard_normal(shape).astype(F32), rng.standard_normal(shape).astype(F32),
                  8, rng)
    (expected,) = _tf_grads_on_threads(threads, [kw], tmp_path)
    monkeypatch.setenv("TFGRAD_TF_INTRA_OP_THREADS", str(threads))
    assert eigen.redux_plan(20000, 8, 4, threads) == {  # see test_redux_blocks_many_threads
        1: (20000, False, False), 2: (10000, False, False), 3: (6667, False, False),
        16: (2500, True, True), 64: (2817, True, False)}[threads]
    for impl in ("kernel", "reference"):
        with tfgrad.use_impl(impl):
            got = raw.FusedBatchNormGradV3(**kw)
        for i in range(3):
            assert _bits_equal(got[i], expected[i]), (impl, i)


# (threads, R, C, rows of TF's blocks, calls of several blocks, +0 added after the last
# partial sum), worked out in test_redux_blocks_many_threads: 8 calls of 2 blocks; 8 calls
# of 9 blocks, the last one block 63 alone; separate blocks and block 63 past the last
# row; separate blocks (11 and 3 threads).
_SPLITS = [(16, 20000, 8, 1250, True, True), (64, 20000, 8, 313, True, False),
           (64, 2000, 384, 32, False, True), (11, 20000, 8, 1819, False, False),
           (3, 20000, 8, 6667, False, False)]


def _split_probe(r: int, c: int, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """dy of shape (1, 1, r, c) whose column sums show how TF groups its row blocks:

    - column 0: 2**24 at row 0 and 1.0 at the next block's first two rows: blocks summed in
      one call give 2**24 (each 1 rounds away), separate blocks 2**24 + 2 (1 + 1 first);
    - column 1: -0 with the triple that flushes to -0 at every block's start, so every
      partial sum is -0 and the total is +0 where TF adds an untouched (+0) buffer after
      a -0 total (the later blocks of a call, or a block past the last row);
    - column 2: -1.97e-38 at row 0, 8.76e-38 and -6.80e-38 at the last block's start, -0
      elsewhere: the last partial sum brings the total to -1.6e-40, flushed to -0, which
      stays -0 unless TF adds an untouched buffer after the last partial sum."""
    dy = np.zeros((r, c), F32)
    dy[[0, rows, rows + 1], 0] = [2.0**24, 1.0, 1.0]
    dy[:, 1:3] = -0.0
    for s in range(0, r - 2, rows):
        dy[s:s + 3, 1] = _MINUS_ZERO_COLUMN
    last = rows * ((r - 1) // rows)
    dy[[0, last, last + 1], 2] = _MINUS_ZERO_COLUMN
    return dy.reshape(1, 1, r, c), np.zeros((1, 1, r, c), F32)


def _check_split_sums(ob: np.ndarray, grouped: bool, zero_after: bool) -> None:
    assert ob[0] == (2.0**24 if grouped else 2.0**24 + 2)
    assert ob[1] == 0 and np.signbit(ob[1]) != (grouped or zero_after)
    assert ob[2] == 0 and np.signbit(ob[2]) != zero_after


@pytest.mark.parametrize("impl", ["kernel", "reference"])
@pytest.mark.parametrize("fmt", ["NHWC", "NCHW"])
@pytest.mark.parametrize("threads, r, c, rows, grouped, zero_after", _SPLITS)
def test_grouped_blocks_order_and_zero_signs(threads, r, c, rows, grouped, zero_after, fmt,
                                             impl, monkeypatch):
    monkeypatch.setenv("TFGRAD_TF_INTRA_OP_THREADS", str(threads))
    assert eigen.redux_blocks(r, c, 4, threads)[1] == rows
    dy, x = _split_probe(r, c, rows)
    if fmt == "NCHW":
        dy, x = (np.ascontiguousarray(np.moveaxis(a, -1, 1)) for a in (dy, x))
    kw = _grad_kw(dy, x, c, np.random.default_rng(0))
    with tfgrad.use_impl(impl):
        for training in (True, False):
            g = raw.FusedBatchNormGradV3(**kw, data_format=fmt, is_training=training)
            _check_split_sums(g.offset_backprop, grouped, zero_after)


@pytest.mark.live
@pytest.mark.parametrize("threads", [16, 64])
def test_live_tf_grouped_blocks(threads, tmp_path, monkeypatch):
    """The probes above against TF on 16 and 64 intra-op threads (more than this
    machine's cores: TF's split depends on its pool size only)."""
    splits = [s for s in _SPLITS if s[0] == threads]
    cases = [_grad_kw(*_split_probe(r, c, rows), c, np.random.default_rng(0))
             for _, r, c, rows, _, _ in splits]
    monkeypatch.setenv("TFGRAD_TF_INTRA_OP_THREADS", str(threads))
    for split, kw, want in zip(splits, cases, _tf_grads_on_threads(threads, cases, tmp_path)):
        _check_split_sums(want[2], *split[4:])
        for impl in ("kernel", "reference"):
            with tfgrad.use_impl(impl):
                got = raw.FusedBatchNormGradV3(**kw)
            for i in range(3):
                assert _bits_equal(got[i], want[i]), (impl, split, i)


def test_redux_plan_model():
    # One block (rows in sequence) for one thread, wide C, or little work.
    assert eigen.redux_plan(10**6, 3, 4, 1)[0] == 10**6
    assert eigen.redux_plan(10**6, 65, 4, 2)[0] == 10**6  # C > 32 * threads
    assert eigen.redux_plan(1000, 8, 4, 2)[0] == 1000  # below Eigen's parallel cost
    assert eigen.redux_plan(10**5, 8, 4, 2)[0] == 50000
    assert eigen.redux_plan(10**5, 8, 4, 4)[0] == 25000
    # Two blocks that Eigen's cost model runs in one call: TF adds the empty second (+0).
    assert eigen.redux_plan(1000, 8, 4, 2) == (1000, False, True)
    assert eigen.redux_plan(10**5, 8, 4, 2) == (50000, False, False)
    assert eigen.redux_plan(10**6, 65, 4, 2) == (10**6, False, False)
    assert eigen.redux_plan(1000, 8, 4, 1) == (1000, False, False)
    assert eigen.redux_plan(3, 24, 4, 2) == (3, False, False)  # too little work for two blocks
    json.dumps(tf_intra_op_threads())  # an int


def test_redux_blocks_many_threads():
    # R = 20000, C = 8, float32: min_rows = ceil(2000 / 8) = 250, so nb = min(20000,
    # ceil(160000 / 250) = 640, T) = T blocks of ceil(20000 / T) rows, each costing
    # rows * 8 * (4 * 11/64 + 1) cycles. Eigen's numThreads(nb, cost) =
    # int((nb * cost - 1e5) / 1e5 + 0.9) is 2 for all three (nb * cost ~ 270k), so
    # parallelFor takes CalculateParallelForBlock's block: max(ceil(nb / (4T)) = 1,
    # int(40000 / cost)), coarsened up to twice that only while the efficiency
    # count / (ceil(count / T) * T) does not fall by more than 0.01.
    # T = 3: 6667 rows, cost 90004.5 -> int(0.44) = 0: block 1, separate calls.
    assert eigen.redux_blocks(20000, 8, 4, 3) == (3, 6667, 1)
    assert eigen.redux_plan(20000, 8, 4, 3) == (6667, False, False)
    # T = 16: 1250 rows, cost 16875 -> int(2.37) = 2: 8 calls of 2 blocks (efficiency
    # 8/16; blocks of 3 give 6/16 and of 4 give 4/16, both lower). Every call leaves
    # its second buffer untouched: +0 after every partial sum, the last included.
    assert eigen.redux_blocks(20000, 8, 4, 16) == (16, 1250, 2)
    assert eigen.redux_plan(20000, 8, 4, 16) == (2500, True, True)
    # T = 64: 313 rows, cost 4225.5 -> int(9.47) = 9 (count 8, efficiency 8/64; 10 gives
    # 7/64 < 8/64 - 0.01, ..., 22 > 18 = 2 * 9 stops): calls of 9 blocks = 2817 rows,
    # the 8th call is block 63 alone (rows 19719..19999), so nothing follows the last sum.
    assert eigen.redux_blocks(20000, 8, 4, 64) == (64, 313, 9)
    assert eigen.redux_plan(20000, 8, 4, 64) == (2817, True, False)
    # R = 2000, C = 384, T = 64: min_rows = 6, nb = 64 blocks of ceil(2000 / 64) = 32
    # rows; 63 * 32 >= 2000 leaves block 63 empty. cost = 32 * 384 * 1.6875 = 20736,
    # int(40000 / 20736) = 1: separate calls, and TF adds the empty block's +0 last.
    assert eigen.redux_blocks(2000, 384, 4, 64) == (64, 32, 1)
    assert eigen.redux_plan(2000, 384, 4, 64) == (32, False, True)
    # Half-precision dy (offset_backprop, 2-byte loads) is cheaper: R = 20000, C = 8 on
    # 11 threads: cost = 1819 * 8 * (2 * 11/64 + 1) = 19554.25 -> int(2.05) = 2 (6 calls:
    # efficiency 6/11 > 4/11), the 6th call block 10 alone; float32 (cost 24556.5): 1.
    assert eigen.redux_blocks(20000, 8, 2, 11) == (11, 1819, 2)
    assert eigen.redux_plan(20000, 8, 2, 11) == (3638, True, False)
    assert eigen.redux_blocks(20000, 8, 4, 11) == (11, 1819, 1)
    # C > 32 * T: TF splits the columns, every column summed in sequence.
    assert eigen.redux_blocks(10**5, 2049, 4, 64) == (1, 10**5, 1)
    assert eigen.redux_blocks(10**5, 2048, 4, 64)[0] == 64


def test_parallel_for_block_model():
    # One call of everything when Eigen's cost model wants one thread: 3 items of
    # 30000 cycles give int((90000 - 1e5) / 1e5 + 0.9) = int(0.8) -> 1.
    assert eigen.num_threads(3, 30000.0, 8) == 1
    assert eigen.parallel_for_block(3, 30000.0, 8) == 3
    assert eigen.num_threads(3, 40000.0, 8) == 1  # int(1.1)
    assert eigen.num_threads(3, 80000.0, 8) == 2  # int(2.3)
    assert eigen.parallel_for_block(3, 80000.0, 8) == 1  # int(40000 / 80000) = 0 -> 1
    # Several items a call needs int(40000 / cost) >= 2, i.e. cost <= 20000, while
    # n * cost >= 2.1e5 for two threads: n >= 11 items, so at most 10 threads never
    # group (n <= threads here, so ceil(n / (4T)) = 1 and the efficiency n / T cannot
    # be kept by coarser blocks for T < 100).
    for threads in range(2, 11):
        for n in range(2, threads + 1):
            for cost in (1500.0, 5000.0, 20000.0, 20001.0, 40000.0, 10**6):
                assert eigen.parallel_for_block(n, cost, threads) in (1, n)
    assert eigen.parallel_for_block(11, 20000.0, 11) == 2  # int((220000 - 1e5)/1e5 + .9) = 2
    # With 100+ threads the efficiency steps (1/T) are under 0.01 and coarsening is taken:
    # n = 200, cost 3999: block int(10.0025) = 10, count 20 (efficiency 20/200); block 11
    # gives count 19, 0.095 + 0.01 >= 0.1: taken; 12 gives 17, 0.085 + 0.01 < 0.1; ...;
    # ceil(200 / 9) = 23 > 2 * 10 stops.
    assert eigen.parallel_for_block(200, 3999.0, 200) == 11
