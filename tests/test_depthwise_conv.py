"""Depthwise convolution: adjoint identities, pinned TF behaviours, properties, threads.

The generic tests (tests/test_conformance.py) run the case table in
tfgrad/testing/cases/depthwise_conv.py against TF's fixtures and live TF.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tfgrad
from tests import oracle
from tfgrad import _compile
from tfgrad._tf.depthwise import window
from tfgrad.dispatch import depthwise_conv as K
from tfgrad.kernels import _pool
from tfgrad.kernels import depthwise_conv as KV
from tfgrad.kernels._simd import HOST_AVX512
from tfgrad.kernels.depthwise_conv import Variant

raw = tfgrad.raw_ops
FWD = raw.DepthwiseConv2dNative
BI = raw.DepthwiseConv2dNativeBackpropInput
BF = raw.DepthwiseConv2dNativeBackpropFilter


# --------------------------------------------------------------------------------------
# Random problems over the whole attr space
# --------------------------------------------------------------------------------------
@st.composite
def problems(draw, max_hw: int = 9):  # type: ignore[no-untyped-def]
    """(x, w, g shapes in data_format order, attrs) for a valid convolution."""
    N = draw(st.integers(1, 3))  # three images: a batch-order sum beyond one addition
    C = draw(st.integers(1, 3))
    M = draw(st.sampled_from([1, 2, 3, 8, 9]))
    fh, fw = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    s = draw(st.integers(1, 3))
    dh, dw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    padding = draw(st.sampled_from(["SAME", "VALID", "EXPLICIT"]))
    pads = tuple(draw(st.integers(0, 3)) for _ in range(4)) if padding == "EXPLICIT" else None
    nchw = draw(st.booleans())
    H = draw(st.integers((fh - 1) * dh + 1, max_hw + (fh - 1) * dh))
    W = draw(st.integers((fw - 1) * dw + 1, max_hw + (fw - 1) * dw))
    oh, _ = window("", H, fh, s, dh, padding, pads[:2] if pads else (0, 0))
    ow, _ = window("", W, fw, s, dw, padding, pads[2:] if pads else (0, 0))
    attrs: dict = {"padding": padding}
    if nchw:
        attrs.update(strides=[1, 1, s, s], dilations=[1, 1, dh, dw], data_format="NCHW")
        if pads:
            attrs["explicit_paddings"] = [0, 0, 0, 0, *pads]
        xs, gs = (N, C, H, W), (N, C * M, oh, ow)
    else:
        attrs.update(strides=[1, s, s, 1], dilations=[1, dh, dw, 1])
        if pads:
            attrs["explicit_paddings"] = [0, 0, *pads, 0, 0]
        xs, gs = (N, H, W, C), (N, oh, ow, C * M)
    return xs, (fh, fw, C, M), gs, attrs


def _arrays(rng: np.random.Generator, xs, ws, gs, dt=np.float64):  # type: ignore[no-untyped-def]
    return tuple(rng.standard_normal(s).astype(dt) for s in (xs, ws, gs))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems(), st.integers(0, 2**32 - 1))
def test_backprops_are_exact_adjoints(prob, seed):
    """<BI(w, g), x> == <g, fwd(x, w)> == <BF(x, g), w> for every attr combination
    (NCHW, dilations, strides, explicit padding, multipliers), in float64."""
    xs, ws, gs, attrs = prob
    x, w, g = _arrays(np.random.default_rng(seed), xs, ws, gs)
    y = FWD(input=x, filter=w, **attrs)
    assert y.shape == g.shape
    dx = BI(input_sizes=np.array(xs, np.int32), filter=w, out_backprop=g, **attrs)
    dw = BF(input=x, filter_sizes=np.array(ws, np.int32), out_backprop=g, **attrs)
    lhs = float(np.vdot(g, y))
    scale = float(np.vdot(np.abs(g), np.abs(y))) + 1.0
    assert abs(float(np.vdot(dx, x)) - lhs) <= 1e-12 * scale
    assert abs(float(np.vdot(dw, w)) - lhs) <= 1e-12 * scale


def _three_ops(x, w, g, attrs):  # type: ignore[no-untyped-def]
    """(op, kwargs) of the three ops on one convolution."""
    return [(FWD, {"input": x, "filter": w, **attrs}),
            (BI, {"input_sizes": np.array(x.shape, np.int32), "filter": w, "out_backprop": g,
                  **attrs}),
            (BF, {"input": x, "filter_sizes": np.array(w.shape, np.int32), "out_backprop": g,
                  **attrs})]


def _kernel_equals_reference(x, w, g, attrs, what):  # type: ignore[no-untyped-def]
    """All three ops, kernel against the NumPy reference, bit for bit."""
    for fn, kw in _three_ops(x, w, g, attrs):
        with tfgrad.use_impl("kernel"):
            a = fn(**kw)
        with tfgrad.use_impl("reference"):
            b = fn(**kw)
        oracle.assert_same(a, b, what=f"{fn.__name__} {what}")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems(max_hw=7), st.sampled_from(["float32", "float64", "float16", "bfloat16"]),
       st.integers(0, 2**32 - 1))
def test_kernel_equals_reference(prob, dtype, seed):
    xs, ws, gs, attrs = prob
    dt = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
    x, w, g = _arrays(np.random.default_rng(seed), xs, ws, gs, dt)
    _kernel_equals_reference(x, w, g, attrs, f"{dtype} {attrs}")



@st.composite
def blocked_problems(draw):  # type: ignore[no-untyped-def]
    """Problems for the register-blocked kernels: their filter sizes, lane counts that
    leave a partial vector, rows wide enough for 4-pixel blocks beside border pixels; N up
    to 3 so that BackpropFilter's per-image kernel (N >= thread count) runs too."""
    f = draw(st.sampled_from(sorted({k[0] for k in KV.SIZES})))
    C = draw(st.one_of(st.integers(1, 40), st.sampled_from([8, 16, 32])))  # whole lines
    M = draw(st.sampled_from([1, 1, 2, 3]))
    s, d = draw(st.integers(1, 3)), draw(st.integers(1, 2))
    padding = draw(st.sampled_from(["SAME", "VALID", "EXPLICIT"]))
    pads = [draw(st.integers(0, 4)) for _ in range(4)]
    H = draw(st.integers((f - 1) * d + 1, (f - 1) * d + 6))
    W = draw(st.integers((f - 1) * d + 1, (f - 1) * d + 24))
    attrs: dict = {"padding": padding, "strides": [1, s, s, 1], "dilations": [1, d, d, 1]}
    if padding == "EXPLICIT":
        attrs["explicit_paddings"] = [0, 0, *pads, 0, 0]
    return (draw(st.integers(1, 3)), H, W, C), (f, f, C, M), attrs


@settings(max_examples=50, deadline=None, suppress_health_check=list(HealthCheck))
@given(blocked_problems(), st.sampled_from(["float32", "float64"]), st.booleans(),
       st.booleans(), st.integers(0, 2**32 - 1))
def test_register_blocked_kernels_equal_reference(monkeypatch, prob, dtype, special, stream,
                                                  seed):
    """The register-blocked forward / BackpropInput / BackpropFilter (filter sizes in
    _VEC_SIZES; 7x7 takes BackpropFilter's three-filter-row groups 3 + 3 + 1) against
    the NumPy reference, bit for bit, with inf / NaN / -0 sprinkled in when `special`,
    and the forward / BackpropInput outputs written with non-temporal stores when
    `stream` (whole-line pixels only)."""
    xs, ws, attrs = prob
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(xs).astype(dtype)
    w = rng.standard_normal(ws).astype(dtype)
    if special:
        for a in (x, w):
            idx = rng.integers(0, a.size, 3)
            a.flat[idx] = rng.choice([np.inf, -np.inf, np.nan, -0.0], 3)
    y = FWD(input=x, filter=w, **attrs)
    g = rng.standard_normal(y.shape).astype(dtype)
    if special:
        g.flat[rng.integers(0, g.size, 2)] = rng.choice([np.inf, np.nan, -0.0], 2)
    # stream: every output of whole-line pixels goes out with non-temporal stores.
    monkeypatch.setattr(K, "_STREAM_MIN_BYTES", 0 if stream else 1 << 62)
    _kernel_equals_reference(x, w, g, attrs, f"{dtype} {xs} {ws} {attrs} stream={stream}")


@pytest.mark.parametrize("dtype, C, M", [("float32", 32, 1), ("float32", 16, 2), ("float64", 16, 1),
                                         ("float64", 8, 2)])
@pytest.mark.parametrize("f, s, d, padding", [(3, 2, 1, "SAME"), (3, 1, 1, "SAME"),
                                              (3, 2, 2, "VALID"), (2, 3, 1, "EXPLICIT"),
                                              (1, 2, 1, "VALID")])
def test_backprop_filter_lane_vector_pairs_equal_reference(dtype, C, M, f, s, d, padding):
    """Pixels of exactly two lane vectors (C * M = 32 float32 / 16 float64): on AVX-512
    BackpropFilter's register kernel sweeps both in one pass (_filter_cols ``two``), the
    border columns and padding taps included; the same bits as the reference, inf / NaN
    / -0 among the inputs."""
    rng = np.random.default_rng(C * M * f + s)
    attrs = {"padding": padding, "strides": [1, s, s, 1], "dilations": [1, d, d, 1]}
    if padding == "EXPLICIT":
        attrs["explicit_paddings"] = [0, 0, 1, 2, 2, 1, 0, 0]
    x = rng.standard_normal((3, 13, 21, C)).astype(dtype)
    x.flat[rng.integers(0, x.size, 4)] = [np.inf, -np.inf, np.nan, -0.0]
    w = np.ones((f, f, C, M), dtype)
    with tfgrad.use_impl("reference"):
        g = rng.standard_normal(FWD(input=x, filter=w, **attrs).shape).astype(dtype)
    g.flat[rng.integers(0, g.size, 2)] = [np.nan, -0.0]
    kw = {"input": x, "filter_sizes": np.array(w.shape, np.int32), "out_backprop": g}
    out = {}
    for impl in ("kernel", "reference"):
        with tfgrad.use_impl(impl):
            out[impl] = BF(**kw, **attrs)
    oracle.assert_same(out["kernel"], out["reference"], what=f"{dtype} C={C} M={M} {attrs}")
    assert Variant("backprop_filter", f, f, pair=KV.filter_pairs(f)) in KV._BUILT


@pytest.mark.parametrize("dtype, C, M", [("float32", 8, 2), ("float64", 4, 2), ("float32", 16, 3),
                                         ("float64", 2, 4), ("float32", 12, 4),
                                         ("float32", 16, 2), ("float64", 8, 2),
                                         ("float32", 24, 2)])
@pytest.mark.parametrize("f, s, d, padding", [(5, 1, 1, "VALID"), (5, 1, 1, "SAME"),
                                              (5, 2, 1, "SAME"), (3, 1, 1, "SAME"),
                                              (3, 2, 1, "SAME"), (3, 1, 2, "SAME"),
                                              (2, 3, 2, "VALID")])
def test_blocked_ring_equals_reference(monkeypatch, dtype, C, M, f, s, d, padding):
    """With M > 1 and whole lane vectors (C * M a multiple of 16 float32 / 8 float64
    lanes) BackpropInput reads its out_backprop rows, and with M = 2 the forward and
    BackpropFilter their input rows (duplicated with vload_dup2), from a ring blocked by
    lane vector (_row_offset_blocked; other M: the pixel-major ring); BackpropInput's
    blocks with M = 2 on an even number of lane vectors (AVX-512) take two at a time and
    sum the multiplier pairs into the output themselves (vpairsum), its last pixels
    through the per-lane scratch: the same bits as the reference, borders, strides,
    dilations and flushed -0 sums included, streamed or not."""
    rng = np.random.default_rng(C * M + f)
    attrs = {"padding": padding, "strides": [1, s, s, 1], "dilations": [1, d, d, 1]}
    xs = (2, 11, 23, C)
    for cancelling in (False, True):  # (True: sums that flush to -0, see _cancelling)
        if cancelling:
            x, w = _cancelling(rng, xs, dtype), _cancelling(rng, (f, f, C, M), dtype, filt=True)
        else:
            x = rng.standard_normal(xs).astype(dtype)
            w = rng.standard_normal((f, f, C, M)).astype(dtype)
        what = f"{dtype} C={C} M={M} {attrs} cancelling={cancelling}"
        with tfgrad.use_impl("reference"):
            b = FWD(input=x, filter=w, **attrs)
        for stream in (0, 1 << 62):
            monkeypatch.setattr(K, "_STREAM_MIN_BYTES", stream)
            with tfgrad.use_impl("kernel"):
                a = FWD(input=x, filter=w, **attrs)
            oracle.assert_same(a, b, what=f"forward {what} stream={stream}")
        rg = np.random.default_rng(C * M + f + 1)
        g = _cancelling(rg, a.shape, dtype) if cancelling else rg.standard_normal(
            a.shape).astype(dtype)
        with tfgrad.use_impl("reference"):
            bi = BI(input_sizes=list(xs), filter=w, out_backprop=g, **attrs)
            bf = BF(input=x, filter_sizes=list(w.shape), out_backprop=g, **attrs)
        for stream in (0, 1 << 62):  # (M = 2: the pair blocks stream their stores)
            monkeypatch.setattr(K, "_STREAM_MIN_BYTES", stream)
            with tfgrad.use_impl("kernel"):
                out = BI(input_sizes=list(xs), filter=w, out_backprop=g, **attrs)
            oracle.assert_same(out, bi, what=f"backprop_input {what} stream={stream}")
            # (AVX-512: the kernel with pair code, whose blocks pair where M = 2 and C * M
            # is whole pairs of lane vectors; only those stream)
            pair = HOST_AVX512 and M == 2 and C * np.dtype(dtype).itemsize % 64 == 0
            assert Variant("backprop_input", f, f, blocked=True, pstream=pair and stream == 0,
                           pair=HOST_AVX512) in KV._BUILT
        with tfgrad.use_impl("kernel"):
            oracle.assert_same(BF(input=x, filter_sizes=list(w.shape), out_backprop=g, **attrs),
                               bf, what="backprop_filter " + what)
        if cancelling:  # (the flushed sums are exercised)
            assert (np.signbit(a) & (a == 0)).any()
            assert (out == 0).any()


@pytest.mark.parametrize("dtype, C", [("float32", 8), ("float64", 4), ("float32", 24)])
@pytest.mark.parametrize("strides, dilations, padding", [
    ([1, 1, 1, 1], [1, 2, 1, 1], "SAME"), ([1, 2, 2, 1], [1, 3, 1, 1], "VALID"),
    ([1, 1, 1, 1], [1, 1, 1, 1], "EXPLICIT")])
def test_backprop_filter_five_rows_equal_reference(dtype, C, strides, dilations, padding):
    """5x5 with M = 2 on whole lane vectors: BackpropFilter sweeps all five filter rows at
    once on AVX-512 where they are all inside (NRI), three and two elsewhere, with the
    ring's strides as constants where dilation across is 1 (_filter_sweep_blocked):
    dilated and strided rows, the padding rows and columns, inf / NaN / -0 among the
    inputs, the same bits as the reference."""
    rng = np.random.default_rng(C + dilations[1])
    attrs = {"padding": padding, "strides": strides, "dilations": dilations}
    if padding == "EXPLICIT":
        attrs["explicit_paddings"] = [0, 0, 3, 1, 2, 4, 0, 0]
    x = rng.standard_normal((2, 19, 13, C)).astype(dtype)
    x.flat[rng.integers(0, x.size, 4)] = [np.inf, -np.inf, np.nan, -0.0]
    w = np.ones((5, 5, C, 2), dtype)
    with tfgrad.use_impl("reference"):
        g = rng.standard_normal(FWD(input=x, filter=w, **attrs).shape).astype(dtype)
        b = BF(input=x, filter_sizes=list(w.shape), out_backprop=g, **attrs)
    with tfgrad.use_impl("kernel"):
        a = BF(input=x, filter_sizes=list(w.shape), out_backprop=g, **attrs)
    oracle.assert_same(a, b, what=f"{dtype} C={C} {attrs}")
    assert Variant("backprop_filter", 5, 5) in KV._BUILT


@pytest.mark.parametrize("dtype, C", [("float32", 16), ("float64", 8), ("float32", 48)])
def test_streamed_outputs(monkeypatch, dtype, C):
    """Outputs of whole-line pixels at or above _STREAM_MIN_BYTES take the non-temporal
    variants of the forward and BackpropInput kernels (64-byte aligned), same bits."""
    monkeypatch.setattr(K, "_STREAM_MIN_BYTES", 0)
    rng = np.random.default_rng(C)
    x = rng.standard_normal((2, 9, 13, C)).astype(dtype)
    w = rng.standard_normal((3, 3, C, 1)).astype(dtype)
    g = rng.standard_normal((2, 9, 13, C)).astype(dtype)
    _kernel_equals_reference(x, w, g, {"padding": "SAME", "strides": [1, 1, 1, 1]}, dtype)
    assert Variant("forward", 3, 3, stream=True) in KV._BUILT
    assert Variant("backprop_input", 3, 3, stream=True) in KV._BUILT
    with tfgrad.use_impl("kernel"):
        assert FWD(input=x, filter=w, padding="SAME", strides=[1, 1, 1, 1]).ctypes.data % 64 == 0


@pytest.mark.parametrize("dt", [np.float32, np.float64])
def test_checked_loads_and_four_multiply_adds(dt):
    # The blocks' intrinsics: vload4's tuple k is the lanes at i + k*step; vload4_chk's
    # the same, +0 (not loaded) with check where column j + k is outside [0, n);
    # vmuladd4 is v + w * x per lane, the product rounded first.
    import numba

    from tfgrad.kernels._simd import vlane, vload4, vload4_chk, vload_chk, vmuladd4

    @numba.njit
    def lanes(a, i, j, n, step, out):  # pragma: no cover - compiled
        c0, c1, c2, c3 = vload4_chk(a, True, j, n, i, step)
        u0, u1, u2, u3 = vload4_chk(a, False, j, n, i, step)
        one = vload_chk(a, True, j, n, i)
        m0, m1, m2, m3 = vmuladd4(c0, c1, c2, c3, one, u0, u1, u2, u3)
        p0, p1, p2, p3 = vload4(a, i, step)
        for k in range(out.shape[1]):
            out[0, k], out[1, k], out[2, k], out[3, k] = (vlane(c0, k), vlane(c1, k),
                                                          vlane(c2, k), vlane(c3, k))
            out[4, k], out[5, k], out[6, k], out[7, k] = (vlane(u0, k), vlane(u1, k),
                                                          vlane(u2, k), vlane(u3, k))
            out[8, k], out[9, k], out[10, k], out[11, k] = (vlane(m0, k), vlane(m1, k),
                                                            vlane(m2, k), vlane(m3, k))
            out[12, k] = vlane(one, k)
            out[13, k], out[14, k], out[15, k], out[16, k] = (vlane(p0, k), vlane(p1, k),
                                                              vlane(p2, k), vlane(p3, k))

    L = 64 // np.dtype(dt).itemsize
    a = np.random.default_rng(0).standard_normal(12 * L).astype(dt)
    a[3] = -0.0
    for j, n in ((-2, 5), (0, 4), (1, 3), (3, 3), (-9, 9)):
        i, step = 2, 2 * L
        out = np.full((17, L), np.nan, dt)
        lanes(a, i, j, n, step, out)
        rows = [a[i + k * step:i + k * step + L] for k in range(4)]
        checked = [r if 0 <= j + k < n else np.zeros(L, dt) for k, r in enumerate(rows)]
        np.testing.assert_array_equal(out[4:8], rows)
        assert out[13:17].tobytes() == np.array(rows).tobytes()
        assert out[:4].tobytes() == np.array(checked).tobytes()
        one = checked[0]
        assert out[12].tobytes() == one.tobytes()
        want = [c + one * r for c, r in zip(checked, rows)]
        assert out[8:12].tobytes() == np.array(want).tobytes()


def test_finite_difference_gradients():
    """BackpropInput / BackpropFilter are the gradients of sum(g * forward) (float64)."""
    rng = np.random.default_rng(0)
    attrs = {"strides": [1, 1, 2, 2], "padding": "SAME", "data_format": "NCHW",
             "dilations": [1, 1, 2, 1]}
    x = rng.standard_normal((1, 2, 6, 5))
    w = rng.standard_normal((2, 3, 2, 2))
    g = rng.standard_normal(FWD(input=x, filter=w, **attrs).shape)
    dx = BI(input_sizes=list(x.shape), filter=w, out_backprop=g, **attrs)
    dw = BF(input=x, filter_sizes=list(w.shape), out_backprop=g, **attrs)

    def loss(xx, ww):  # type: ignore[no-untyped-def]
        return float(np.sum(g * FWD(input=xx, filter=ww, **attrs)))

    eps = 1e-6
    for arr, grad, which in ((x, dx, 0), (w, dw, 1)):
        for idx in [tuple(rng.integers(0, n) for n in arr.shape) for _ in range(6)]:
            e = np.zeros_like(arr)
            e[idx] = eps
            args_p = (x + e, w) if which == 0 else (x, w + e)
            args_m = (x - e, w) if which == 0 else (x, w - e)
            num = (loss(*args_p) - loss(*args_m)) / (2 * eps)
            assert abs(num - grad[idx]) <= 1e-6 * (1 + abs(num))


# --------------------------------------------------------------------------------------
# Pinned TF behaviours (values from TF 2.21, or by hand from the definition)
# --------------------------------------------------------------------------------------
def test_same_odd_padding_goes_after():
    x = np.arange(16, dtype=np.float32).reshape(1, 4, 4, 1)
    y = FWD(input=x, filter=np.ones((2, 2, 1, 1), np.float32), strides=[1, 1, 1, 1],
            padding="SAME")
    assert y[0, 0, 0, 0] == 0 + 1 + 4 + 5  # no pad before: the extra row / col is after
    x = np.arange(36, dtype=np.float32).reshape(1, 6, 6, 1)
    y = FWD(input=x, filter=np.ones((3, 3, 1, 1), np.float32), strides=[1, 2, 2, 1],
            padding="SAME")
    assert y[0, 0, 0, 0] == 0 + 1 + 2 + 6 + 7 + 8 + 12 + 13 + 14  # 63


def test_half_rounds_after_every_tap():
    x = np.array([2048, 1, 1, 1], np.float16).reshape(1, 1, 4, 1)
    y = FWD(input=x, filter=np.ones((1, 4, 1, 1), np.float16), strides=[1, 1, 1, 1],
            padding="VALID")
    assert y.dtype == np.float16 and float(y[0, 0, 0, 0]) == 2048.0  # not 2051 -> 2052


@pytest.mark.parametrize("impl", ["kernel", "reference"])
@pytest.mark.parametrize("dt", [np.float32, np.float64])
def test_denormals_flush_to_zero_as_tf(impl, dt):
    """TF runs its kernels with FTZ and DAZ set (tfgrad._tf.fpenv): a denormal product
    becomes 0, a denormal input reads as 0; the caller's environment is left alone."""
    tiny = dt(1e-20 if dt == np.float32 else 1e-160)  # tiny * tiny is denormal
    sub = dt(1e-39 if dt == np.float32 else 1e-310)  # a denormal input
    kw = {"strides": [1, 1, 1, 1], "padding": "SAME"}
    with tfgrad.use_impl(impl):
        for x, w in ((tiny, tiny), (sub, dt(1e5))):
            xa, wa = np.full((1, 3, 3, 2), x), np.full((3, 3, 2, 1), w)
            ga = xa
            assert not FWD(input=xa, filter=wa, **kw).any()
            assert not BI(input_sizes=[1, 3, 3, 2], filter=wa, out_backprop=ga, **kw).any()
            assert not BF(input=xa, filter_sizes=[3, 3, 2, 1], out_backprop=np.full(
                (1, 3, 3, 2), w), **kw).any()
    assert tiny * tiny != 0 and sub * dt(1e5) != 0  # (not flushed out here)


@pytest.mark.parametrize("impl", ["kernel", "reference"])
def test_half_backprop_input_missed_taps_turn_minus_zero_to_plus(impl):
    """A float16 product that underflows makes the accumulator -0; TF then computes the
    taps that reach no out_backprop value as w * 0, and w >= 0 adds +0: +0, not -0."""
    w = np.array([-0.001777, 1, 1], np.float16).reshape(1, 3, 1, 1)
    g = np.full((1, 1, 1, 1), 4.6e-6, np.float16)
    assert np.signbit(np.float16(g[0, 0, 0, 0] * w[0, 0, 0, 0]))  # underflows to -0
    with tfgrad.use_impl(impl):
        dx = BI(input_sizes=[1, 1, 3, 1], filter=w, out_backprop=g, strides=[1, 3, 3, 1],
                padding="VALID")
    assert dx[0, 0, 0, 0] == 0 and not np.signbit(dx[0, 0, 0, 0])


@pytest.mark.parametrize("impl", ["kernel", "reference"])
@pytest.mark.parametrize("dt", [np.float32, np.float64])
def test_backprop_input_flushed_minus_zero_turns_plus_at_a_missed_tap(impl, dt):
    """Pixel 4 meets taps 0, 2, 4 (out_backprop 2, 1, 0); taps 1 and 3 miss. After tap 2
    the sum a - b is denormal and flushes to -0; TF's tap 3 adds 1 * 0 = +0, so the sum
    is +0 and its tap 4 (-1 * 0 = -0) leaves +0. A kernel that skipped the missed taps
    would return -0 (it does not: its -0 elements are redone with every tap)."""
    a, b = (dt(1.5e-38), dt(1.6e-38)) if dt == np.float32 else (2.5e-308, 2.6e-308)
    assert dt(a) - dt(b) != 0 and abs(dt(a) - dt(b)) < np.finfo(dt).tiny
    w = np.array([a, 1, -b, 1, -1], dt).reshape(1, 5, 1, 1)
    g = np.array([0, 1, 1], dt).reshape(1, 1, 3, 1)
    kw = {"input_sizes": np.array([1, 1, 9, 1], np.int32), "filter": w, "out_backprop": g,
          "strides": [1, 2, 2, 1], "padding": "VALID"}
    with tfgrad.use_impl(impl):
        dx = BI(**kw)
    assert dx[0, 0, 4, 0] == 0 and not np.signbit(dx[0, 0, 4, 0])
    if oracle.tensorflow() is not None:
        oracle.assert_same(dx, oracle.run_tf(BI.OP_NAME, kw))


@pytest.mark.parametrize("impl", ["kernel", "reference"])
@pytest.mark.parametrize("dt", [np.float32, np.float64])
def test_dilated_forward_inserted_zero_turns_minus_zero_plus(impl, dt):
    """3x3 filter, dilation 2 (TF's explicit filter is 5x5). On the middle row, x = [a,
    1, -b, 1, 0]: a - b flushes to -0, then the inserted tap over x = 1 adds 1 * 0 = +0,
    so TF's sum stays +0 (the later real taps add w * 0 = -0). Skipping the inserted
    taps gives -0; the kernel must detect that -0 and redo the element."""
    a, b = (dt(1.5e-38), dt(1.6e-38)) if dt == np.float32 else (2.5e-308, 2.6e-308)
    C = 16
    x = np.zeros((1, 5, 5, C), dt)
    x[0, 2] = np.array([a, 1, -b, 1, 0], dt)[:, None]
    w = np.repeat(np.array([[1, 1, 1], [1, 1, -1], [-1, -1, -1]], dt)[:, :, None, None], C,
                  axis=2)
    kw = {"input": x, "filter": w, "strides": [1, 1, 1, 1], "padding": "VALID",
          "dilations": [1, 2, 2, 1]}
    with tfgrad.use_impl(impl):
        y = FWD(**kw)
    assert y.shape == (1, 1, 1, C) and not y.any() and not np.signbit(y).any()
    if oracle.tensorflow() is not None:
        from tests.cases.depthwise_conv import _nhwc_call

        oracle.assert_same(y, oracle.run_tf(*_nhwc_call(FWD.OP_NAME, kw, False, (2, 2),
                                                        w.shape)))


@pytest.mark.parametrize("impl", ["kernel", "reference"])
@pytest.mark.parametrize("dt", [np.float32, np.float64])
def test_height_dilated_forward_inserted_row_turns_minus_zero_plus(impl, dt):
    """3x3 filter, dilation 2 in height only (TF's explicit filter is 5x3), a row of 6
    outputs (the stride-1 register blocks slide along it). Output pixel 0: row 0 gives
    a * 1 + (-b) * 1, which flushes to -0, then 0 * -1 = -0; the inserted row over
    x = 1 adds 1 * 0 = +0, so TF's sum is +0 and stays +0 (the real rows below add
    0 * -1 = -0). Skipping the inserted rows gives -0: the sliding blocks must mark the
    row for the redo as the other dilated paths do (a live campaign found them not
    doing it)."""
    a, b = (dt(1.5e-38), dt(1.6e-38)) if dt == np.float32 else (2.5e-308, 2.6e-308)
    C = 16
    x = np.zeros((1, 5, 8, C), dt)
    x[0, 0, :3] = np.array([a, -b, 0], dt)[:, None]
    x[0, 1, :3] = 1
    w = np.repeat(np.array([[1, 1, -1], [-1, -1, -1], [-1, -1, -1]], dt)[:, :, None, None], C,
                  axis=2)
    kw = {"input": x, "filter": w, "strides": [1, 1, 1, 1], "padding": "VALID",
          "dilations": [1, 2, 1, 1]}
    with tfgrad.use_impl(impl):
        y = FWD(**kw)
    assert y.shape == (1, 1, 6, C)
    assert not y[0, 0, 0].any() and not np.signbit(y[0, 0, 0]).any()
    if oracle.tensorflow() is not None:
        from tests.cases.depthwise_conv import _nhwc_call

        oracle.assert_same(y, oracle.run_tf(*_nhwc_call(FWD.OP_NAME, kw, False, (2, 1),
                                                        w.shape)))


# Values whose sums cancel into the denormal range (they flush to +-0), with zeros of
# both signs: every path's signed zeros are exercised. (Half types: around their
# underflow, where a sum rounds to a zero of its sign.)
_TINY = {np.dtype(np.float32): 1e-38, np.dtype(np.float64): 1e-307,
         np.dtype(np.float16): 6e-8, np.dtype(ml_dtypes.bfloat16): 1e-38}


def _cancelling(rng: np.random.Generator, shape, dt, filt: bool = False):  # type: ignore[no-untyped-def]
    if filt:
        return rng.choice(np.array([1, -1, 2, -0.5, 0.0, -0.0]), shape).astype(dt)
    vals = np.array([1.5, -1.6, 1.6, -1.5, 3.0, 0.0, -0.0]) * _TINY[np.dtype(dt)]
    return rng.choice(vals, shape).astype(dt)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems(max_hw=7), st.sampled_from(["float32", "float64", "float16", "bfloat16"]),
       st.integers(0, 2**32 - 1))
def test_signed_zeros_kernel_equals_reference(prob, dtype, seed):
    """Inputs that flush or underflow to zeros of either sign, over the whole attr space
    (dilations included: the reference adds the dilated filter's inserted zeros)."""
    xs, ws, gs, attrs = prob
    dt = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
    rng = np.random.default_rng(seed)
    x, w, g = _cancelling(rng, xs, dt), _cancelling(rng, ws, dt, True), _cancelling(rng, gs, dt)
    _kernel_equals_reference(x, w, g, attrs, f"{dtype} {attrs}")


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(blocked_problems(), st.sampled_from(["float32", "float64"]), st.booleans(),
       st.integers(0, 2**32 - 1))
def test_signed_zeros_register_blocked_equal_reference(monkeypatch, prob, dtype, stream, seed):
    """The register-blocked kernels' -0 tracking (vmin_bits over the stored vectors) and
    the redone rows, streamed or not, against the reference."""
    xs, ws, attrs = prob
    rng = np.random.default_rng(seed)
    x, w = _cancelling(rng, xs, dtype), _cancelling(rng, ws, dtype, True)
    g = _cancelling(rng, FWD(input=x, filter=w, **attrs).shape, dtype)
    monkeypatch.setattr(K, "_STREAM_MIN_BYTES", 0 if stream else 1 << 62)
    _kernel_equals_reference(x, w, g, attrs, f"{dtype} {xs} {ws} {attrs} stream={stream}")


@pytest.mark.live
@pytest.mark.parametrize("dt", [np.float32, np.float64, np.float16, ml_dtypes.bfloat16])
@pytest.mark.parametrize("f, C, M, s, d", [
    (3, 16, 1, 2, 1),  # register-blocked BackpropInput, 4-pixel blocks and border pixels
    (3, 5, 3, 1, 1),   # lanes past the last vector; multiplier reduction
    (5, 3, 9, 2, 1),   # an 8-lane packet in the multiplier reduction
    (4, 8, 1, 3, 1),   # no register kernel: the run kernel
    (3, 16, 1, 1, 2),  # dilated: TF computes it with the filter dilated explicitly
    (2, 3, 2, 2, 3),
    (2, 16, 1, 1, (2, 1)),  # dilated in height only: the stride-1 sliding blocks
    (3, 32, 2, 1, (3, 1)),
    (3, 16, 1, 1, (1, 2)),
])
def test_live_tf_signed_zeros(dt, f, C, M, s, d):
    """Cancelling tiny inputs against TF 2.21, every bit and every zero's sign, for the
    three ops, kernel and reference (dilated cases: TF's explicitly dilated filter)."""
    from tests.cases.depthwise_conv import _nhwc_call

    dh, dw = d if isinstance(d, tuple) else (d, d)
    rng = np.random.default_rng(f * 1000 + C * 10 + M)
    for padding in ("SAME", "VALID"):
        x = _cancelling(rng, (2, 11, 13, C), dt)
        w = _cancelling(rng, (f, f, C, M), dt, True)
        attrs = {"strides": [1, s, s, 1], "padding": padding, "dilations": [1, dh, dw, 1]}
        g = _cancelling(rng, FWD(input=x, filter=w, **attrs).shape, dt)
        for fn, kw in _three_ops(x, w, g, attrs):
            want = oracle.run_tf(*_nhwc_call(fn.OP_NAME, kw, False, (dh, dw), w.shape))
            if fn is BF:
                want = want[::dh, ::dw]
            for impl in ("kernel", "reference"):
                with tfgrad.use_impl(impl):
                    oracle.assert_same(fn(**kw), want, what=f"{impl} {fn.OP_NAME} {padding}")


@pytest.mark.live
@pytest.mark.parametrize("dt", [np.float32, np.float64, np.float16, ml_dtypes.bfloat16])
def test_live_tf_denormals_and_signed_zeros(dt):
    """Products around the denormal boundary (half types: around their underflow), with
    strides that leave most taps missing: bit-identical to TF, zeros' signs included."""
    rng = np.random.default_rng(7)
    scale = {np.float32: 1e-19, np.float64: 1e-154, np.float16: 1.2e-4,
             ml_dtypes.bfloat16: 1e-19}[dt]
    for s, padding, fh in ((1, "SAME", 3), (2, "SAME", 3), (3, "VALID", 3), (2, "VALID", 5)):
        x = (rng.standard_normal((2, 12, 12, 16)) * scale).astype(dt)
        w = (rng.standard_normal((fh, fh, 16, 1)) * scale).astype(dt)
        kw = {"strides": [1, s, s, 1], "padding": padding}
        y = oracle.run_tf(FWD.OP_NAME, {"input": x, "filter": w, **kw})
        g = (rng.standard_normal(y.shape) * scale).astype(dt)
        for impl in ("kernel", "reference"):
            with tfgrad.use_impl(impl):
                oracle.assert_same(FWD(input=x, filter=w, **kw), y)
                bi = {"input_sizes": np.array(x.shape, np.int32), "filter": w,
                      "out_backprop": g, **kw}
                oracle.assert_same(BI(**bi), oracle.run_tf(BI.OP_NAME, bi))
                bf = {"input": x, "filter_sizes": np.array(w.shape, np.int32),
                      "out_backprop": g, **kw}
                oracle.assert_same(BF(**bf), oracle.run_tf(BF.OP_NAME, bf))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(1, 3), st.integers(1, 3), st.integers(4, 9), st.integers(1, 9),
       st.integers(1, 3), st.sampled_from(["SAME", "VALID"]),
       st.sampled_from(["float32", "float64", "float16", "bfloat16"]), st.integers(0, 2**32 - 1))
def test_wide_dilations_equal_the_explicitly_dilated_filter(fh, fw, dh, dw, s, padding, dtype,
                                                             seed):
    """Dilations wider than the live-TF tests take (4-9), on inputs that cancel into
    signed zeros: kernel and reference equal tfgrad's undilated kernel run with the
    filter dilated explicitly (TF's definition), where every inserted zero is a real tap.
    The dilated paths instead decide from each gap between real taps whether an inserted
    zero turns a -0 sum into +0 (ops.depthwise_conv.gap_turns_plus)."""
    from tests.cases.depthwise_conv import _nhwc_call

    dt = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
    rng = np.random.default_rng(seed)
    H, W = (fh - 1) * dh + 1 + int(rng.integers(0, 4)), (fw - 1) * dw + 1 + int(rng.integers(0, 4))
    x, w = _cancelling(rng, (2, H, W, 2), dt), _cancelling(rng, (fh, fw, 2, 2), dt, True)
    attrs = {"strides": [1, s, s, 1], "padding": padding, "dilations": [1, dh, dw, 1]}
    g = _cancelling(rng, FWD(input=x, filter=w, **attrs).shape, dt)
    for fn, kw in _three_ops(x, w, g, attrs):
        op, ekw = _nhwc_call(fn.OP_NAME, kw, False, (dh, dw), w.shape)
        want = getattr(raw, op)(**ekw)
        if fn is BF:
            want = want[::dh, ::dw]
        for impl in ("kernel", "reference"):
            with tfgrad.use_impl(impl):
                oracle.assert_same(fn(**kw), want, what=f"{impl} {fn.OP_NAME} {dtype}")


@pytest.mark.parametrize("impl", ["kernel", "reference"])
@pytest.mark.parametrize("M, C", [(1, 3), (2, 16)])  # (2, 16): the multiplier rings, blocked
def test_huge_dilation_is_computed_in_time_and_memory(impl, M, C):
    """A dilation beyond the input (here 10**12, SAME) leaves each real tap's row inside
    or in the padding exactly as a dilation of H + 2 does, and every gap between them
    reaches the padding: the results must be the same. Before, the -0 redo walked every
    inserted tap (10**12 of them: a hang) and the multiplier rings held (fh - 1) *
    dilation + 1 rows (out of memory); the reference padded x by the dilation."""
    rng = np.random.default_rng(3)
    x = _cancelling(rng, (2, 2, 5, C), np.float32)
    x[0, :, :2] = np.array([-2e-38, 1.5e-38], np.float32)[:, None]  # a sum that flushes to -0
    w = _cancelling(rng, (3, 3, C, M), np.float32, True)
    w[2] = -1  # (the padding rows after it add 0 * -1 = -0: TF's sum stays -0 until a gap)
    out = {}
    for d in (10**12, 6 * 10**12, 4):  # (6 * 10**12: 3 and 5 divide it, a 7-row ring)
        attrs = {"strides": [1, 1, 1, 1], "padding": "SAME", "dilations": [1, d, 1, 1]}
        g = _cancelling(np.random.default_rng(4), (2, 2, 5, C * M), np.float32)
        with tfgrad.use_impl(impl):
            out[d] = [fn(**kw) for fn, kw in _three_ops(x, w, g, attrs)]
    for d in (10**12, 6 * 10**12):
        for a, b in zip(out[d], out[4]):
            oracle.assert_same(a, b, what=f"dilation {d}")


@pytest.mark.parametrize("fn", [FWD, BI, BF])
def test_effective_filter_size_beyond_int64_is_rejected(fn):
    x, w = np.ones((1, 4, 4, 1), np.float32), np.ones((3, 3, 1, 1), np.float32)
    attrs = {"strides": [1, 1, 1, 1], "padding": "SAME", "dilations": [1, 2**62, 1, 1]}
    kw = dict(_three_ops(x, w, x, attrs))[fn]
    with pytest.raises(tfgrad.InvalidArgumentError, match="does not fit in int64"):
        fn(**kw)
    kw["dilations"] = [1, 2**62 - 1, 1, 1]  # (3 - 1) * d + 1 = 2**63 - 1 fits
    assert fn(**kw).shape == (x.shape if fn is BI else w.shape if fn is BF else x.shape)


def test_inf_filter_over_padding_is_nan():
    y = FWD(input=np.ones((1, 1, 1, 1), np.float32),
            filter=np.array([np.inf, 1, 1], np.float32).reshape(1, 3, 1, 1),
            strides=[1, 1, 1, 1], padding="SAME")
    assert np.isnan(y[0, 0, 0, 0])  # the padding tap computes 0 * inf


def test_valid_truncating_division_gives_empty_output():
    y = FWD(input=np.ones((1, 1, 1, 1), np.float32), filter=np.ones((4, 4, 1, 1), np.float32),
            strides=[1, 2, 2, 1], padding="VALID")
    assert y.shape == (1, 0, 0, 1)  # (1 - 4 + 2) / 2 truncates to 0: no error


@pytest.mark.parametrize("impl", ["kernel", "reference"])
def test_backprop_filter_with_nothing_to_sum_is_zeros(impl):
    """TF returns uninitialised memory here (batch 0, or an empty out_backprop)."""
    with tfgrad.use_impl(impl):
        dw = BF(input=np.zeros((0, 4, 5, 2), np.float32), filter_sizes=[3, 3, 2, 1],
                out_backprop=np.zeros((0, 4, 5, 2), np.float32), strides=[1, 1, 1, 1],
                padding="SAME")
        assert dw.shape == (3, 3, 2, 1) and not dw.any()
        dw = BF(input=np.ones((1, 2, 2, 1), np.float16), filter_sizes=[3, 3, 1, 2],
                out_backprop=np.zeros((1, 0, 0, 2), np.float16), strides=[1, 1, 1, 1],
                padding="VALID")
        assert dw.shape == (3, 3, 1, 2) and dw.dtype == np.float16 and not dw.any()


def test_backprop_input_multiplier0_is_zeros():
    """TF leaves this output uninitialised (no lane writes it); the empty sum is 0."""
    for impl in ("kernel", "reference"):
        with tfgrad.use_impl(impl):
            dx = BI(input_sizes=[1, 3, 3, 2], filter=np.ones((2, 2, 2, 0), np.float32),
                    out_backprop=np.ones((1, 3, 3, 0), np.float32), strides=[1, 1, 1, 1],
                    padding="SAME")
        assert dx.shape == (1, 3, 3, 2) and not dx.any()


def test_dilated_backprops_differ_from_tf_eigen_bug():
    """tfgrad's dilated gradients are the true ones (they equal the explicitly dilated
    filter's); TF's Eigen backprops would return the dilation-1 result instead."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, 7, 7, 2))
    w = rng.standard_normal((3, 3, 2, 1))
    g = rng.standard_normal((1, 7, 7, 2))
    kw = {"strides": [1, 1, 1, 1], "padding": "SAME"}
    wd = np.zeros((5, 5, 2, 1))
    wd[::2, ::2] = w
    dx = BI(input_sizes=[1, 7, 7, 2], filter=w, out_backprop=g, dilations=[1, 2, 2, 1], **kw)
    oracle.assert_same(dx, BI(input_sizes=[1, 7, 7, 2], filter=wd, out_backprop=g, **kw))
    assert not np.array_equal(dx, BI(input_sizes=[1, 7, 7, 2], filter=w, out_backprop=g, **kw))
    dw = BF(input=x, filter_sizes=[3, 3, 2, 1], out_backprop=g, dilations=[1, 2, 2, 1], **kw)
    oracle.assert_same(dw, BF(input=x, filter_sizes=[5, 5, 2, 1], out_backprop=g,
                              **kw)[::2, ::2])


@pytest.mark.live
def test_live_tf_backprops_ignore_dilations():
    """The TF bug tfgrad does not reproduce (semantics.md §3)."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((3, 3, 2, 1)).astype(np.float32)
    g = rng.standard_normal((1, 7, 7, 2)).astype(np.float32)
    kw = {"input_sizes": np.array([1, 7, 7, 2], np.int32), "filter": w, "out_backprop": g,
          "strides": [1, 1, 1, 1], "padding": "SAME"}
    tf_dil = oracle.run_tf(BI.OP_NAME, {**kw, "dilations": [1, 2, 2, 1]})
    oracle.assert_same(tf_dil, oracle.run_tf(BI.OP_NAME, kw))
    assert not np.array_equal(BI(**kw, dilations=[1, 2, 2, 1]), tf_dil)


@pytest.mark.live
def test_live_tf_default_build_aborts_on_a_dilation_beyond_int32():
    """Pins what the module docstring records: with oneDNN on, TF 2.21 kills the whole
    process on a dilation of 2**31 (a CHECK in its oneDNN layout pass, which reads
    dilations as int32). tfgrad computes the convolution."""
    code = ("import numpy as np, tensorflow as tf\n"
            "tf.raw_ops.DepthwiseConv2dNative(input=np.ones((1, 2, 2, 1), np.float32), "
            "filter=np.ones((2, 1, 1, 1), np.float32), strides=[1, 1, 1, 1], "
            "padding='SAME', dilations=[1, 2**31, 1, 1])\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=600, env={**os.environ, "TF_ENABLE_ONEDNN_OPTS": "1"})
    assert r.returncode != 0 and "out of range for an int32" in r.stderr, r.stderr[-2000:]
    x = np.arange(4, dtype=np.float32).reshape(1, 2, 2, 1)
    y = FWD(input=x, filter=np.array([1, 2, 3], np.float32).reshape(3, 1, 1, 1),
            strides=[1, 1, 1, 1], padding="SAME", dilations=[1, 2**31, 1, 1])
    oracle.assert_same(y, 2 * x)  # SAME pads 2**31 rows before: rows 0 and 2 of the
    # filter fall in the padding, row 1 on the output's own row


def test_input_sizes_int64_accepted():
    w = np.ones((2, 2, 1, 1), np.float32)
    g = np.ones((1, 2, 2, 1), np.float32)
    a = BI(input_sizes=np.array([1, 2, 2, 1], np.int64), filter=w, out_backprop=g,
           strides=[1, 1, 1, 1], padding="SAME")
    b = BI(input_sizes=[1, 2, 2, 1], filter=w, out_backprop=g, strides=[1, 1, 1, 1],
           padding="SAME")
    oracle.assert_same(a, b)


def test_memory_limit(monkeypatch):
    monkeypatch.setenv("TFGRAD_MAX_BYTES", "1000")
    with pytest.raises(tfgrad.ResourceLimitError):
        BI(input_sizes=[1, 20, 20, 1], filter=np.ones((1, 1, 1, 1), np.float32),
           out_backprop=np.ones((1, 20, 20, 1), np.float32), strides=[1, 1, 1, 1],
           padding="VALID")


def test_memory_limit_counts_working_arrays(monkeypatch):
    """The per-image filter gradients (N times the filter: TF's batch-order sum) and the
    float32 copies of half inputs are checked, not only the outputs."""
    x = np.zeros((1000, 1, 1, 8), np.float32)
    monkeypatch.setenv("TFGRAD_MAX_BYTES", str(3 * 3 * 8 * 4 * 999))  # one image short
    with pytest.raises(tfgrad.ResourceLimitError, match="per-image filter gradients"):
        BF(input=x, filter_sizes=[3, 3, 8, 1], out_backprop=x, strides=[1, 1, 1, 1],
           padding="SAME")
    monkeypatch.setenv("TFGRAD_MAX_BYTES", str(3 * 3 * 8 * 4 * 1000))
    assert BF(input=x, filter_sizes=[3, 3, 8, 1], out_backprop=x, strides=[1, 1, 1, 1],
              padding="SAME").shape == (3, 3, 8, 1)
    xh = np.zeros((1, 50, 50, 2), np.float16)
    monkeypatch.setenv("TFGRAD_MAX_BYTES", str(xh.nbytes + 10))  # the output fits
    with pytest.raises(tfgrad.ResourceLimitError, match="float32 working copy of input"):
        FWD(input=xh, filter=np.ones((1, 1, 2, 1), np.float16), strides=[1, 1, 1, 1],
            padding="SAME")


# --------------------------------------------------------------------------------------
# Thread-count independence
# --------------------------------------------------------------------------------------
_THREAD_SCRIPT = """
import hashlib, numpy as np, tfgrad
from tfgrad import _compile
_compile.POLICY["depthwise_conv"] = _compile.Threading(0)  # small ops on every thread too
raw = tfgrad.raw_ops
h = hashlib.sha256()
rng = np.random.default_rng(0)
for dt, M, s in [(np.float32, 1, 1), (np.float32, 9, 2), (np.float16, 3, 2), (np.float64, 2, 1)]:
    x = rng.standard_normal((3, 17, 15, 5)).astype(dt)
    w = rng.standard_normal((3, 3, 5, M)).astype(dt)
    kw = dict(strides=[1, s, s, 1], padding="SAME", dilations=[1, 1, 2, 1])
    y = raw.DepthwiseConv2dNative(input=x, filter=w, **kw)
    g = rng.standard_normal(y.shape).astype(dt)
    for a in (y, raw.DepthwiseConv2dNativeBackpropInput(input_sizes=x.shape, filter=w,
                                                         out_backprop=g, **kw),
              raw.DepthwiseConv2dNativeBackpropFilter(input=x, filter_sizes=w.shape,
                                                      out_backprop=g, **kw)):
        h.update(np.ascontiguousarray(a).tobytes())
print(h.hexdigest())
"""


def test_results_do_not_depend_on_thread_count():
    digests = []
    for n in ("1", "2"):
        env = dict(os.environ, NUMBA_NUM_THREADS=n)
        out = subprocess.run([sys.executable, "-c", _THREAD_SCRIPT], env=env, check=True,
                             capture_output=True, text=True)
        digests.append(out.stdout.strip())
    assert digests[0] == digests[1]
    assert len(digests[0]) == len(hashlib.sha256().hexdigest())


def _chunk_kernel(seen: list[tuple[int, int]]):
    """A Python kernel for _run: records the chunks it claims; "fail" raises in task 5."""

    def kernel(tag, ctl, size, ntasks):
        cur = np.zeros(2, np.int64)
        while _pool.claim(ctl, size, ntasks, cur):
            seen.append((int(cur[0]), int(cur[1])))
            if tag == "fail" and cur[0] <= 5 < cur[1]:
                raise ValueError("task 5")

    return kernel


_MIN = _compile.POLICY["depthwise_conv"].parallel_min


def test_run_covers_every_task_once(monkeypatch):
    """_run: each task in exactly one chunk, on the pool or (small work) inline, and a
    kernel's exception comes back to the caller."""
    seen: list[tuple[int, int]] = []
    kernel = _chunk_kernel(seen)
    K._run(kernel, 37, _MIN - 1, "ok")
    assert seen == [(0, 37)]
    monkeypatch.setattr(K, "_threads", lambda work: 3)
    for _ in range(20):  # (the pool threads join at different points)
        seen.clear()
        K._run(kernel, 37, _MIN, "ok")
        tasks = sorted(t for t0, t1 in seen for t in range(t0, t1))
        assert tasks == list(range(37)) and len(seen) > 2
    with pytest.raises(ValueError, match="task 5"):
        K._run(kernel, 37, _MIN, "fail")
    seen.clear()
    K._run(kernel, 37, _MIN, "ok")  # the pool still serves the next op
    assert sorted(t for t0, t1 in seen for t in range(t0, t1)) == list(range(37))


def test_pool_threads_that_sleep_give_the_same_bits(monkeypatch):
    """With no spinning (the caller asleep while the pool threads finish) and while
    another op holds the pool (this one then runs on the caller alone), the ops give the
    bits the calling thread alone gives."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 21, 19, 32), dtype=np.float32)
    w = rng.standard_normal((3, 3, 32, 2), dtype=np.float32)
    kw = dict(strides=[1, 2, 2, 1], padding="SAME")
    monkeypatch.setitem(_compile.POLICY, "depthwise_conv", _compile.Threading(0))
    monkeypatch.setattr(K, "_threads", lambda work: 1)
    want = tfgrad.raw_ops.DepthwiseConv2dNative(input=x, filter=w, **kw)
    monkeypatch.setattr(K, "_threads", lambda work: 2)
    pool = _pool._pool(1)
    monkeypatch.setattr(pool, "wait_ticks", 0)
    for _ in range(5):
        np.testing.assert_array_equal(
            tfgrad.raw_ops.DepthwiseConv2dNative(input=x, filter=w, **kw), want)
    with pool.busy:  # the pool is another op's: this one runs on the caller alone
        np.testing.assert_array_equal(
            tfgrad.raw_ops.DepthwiseConv2dNative(input=x, filter=w, **kw), want)


def test_pool_spins_only_with_a_cpu_for_each_thread(monkeypatch):
    """With more threads than CPUs the caller would spin on a CPU a pool thread needs."""
    monkeypatch.setattr(_pool, "_cpus", lambda: 2)
    spinning, oversubscribed = _pool._Pool(1), _pool._Pool(3)
    for p in (spinning, oversubscribed):
        p.stop()
    assert spinning.wait_ticks > 0 and oversubscribed.wait_ticks == 0


def test_huge_strides_with_one_output_need_no_memory():
    # A stride never moves a window that has one output: it must not size a working row
    # either (a stride of 10**9 asked for gigabytes, and failed where memory is capped).
    code = r"""
import resource, numpy as np, tfgrad
resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))
rng = np.random.default_rng(0)
for dt in (np.float32, np.float64):
    for m in (1, 2):
        x = rng.standard_normal((1, 5, 4, 8)).astype(dt)
        w = rng.standard_normal((3, 2, 8, m)).astype(dt)
        for s in (10**9, 2**62):
            kw = dict(strides=[1, s, s, 1], padding="VALID")
            got = tfgrad.depthwise_conv2d_native(x, w, **kw)
            with tfgrad.use_impl("reference"):
                want = tfgrad.depthwise_conv2d_native(x, w, **kw)
            assert got.tobytes() == want.tobytes()
print("ok")
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr[-2000:]


# --------------------------------------------------------------------------------------
# The variant table
# --------------------------------------------------------------------------------------
def test_warmup_inputs_select_every_variant(monkeypatch):
    """Each of warmup's variant inputs selects its register-blocked kernel of
    ``VARIANTS`` (so that ``tfgrad warmup`` compiles the whole table), and every variant
    has inputs in float32 and float64. Only the selection runs here: no kernel."""
    from tfgrad.testing.cases.depthwise_conv import VARIANT_WARMUP

    chosen: list[Variant] = []
    monkeypatch.setattr(K, "kernel", lambda v: chosen.append(v) or "kernel")
    monkeypatch.setattr(K, "_VECS", {})  # (each selection, not the memo of earlier ones)
    monkeypatch.setattr(K, "_run", lambda *args: None)
    rng = np.random.default_rng(0)
    for v, warm in VARIANT_WARMUP:
        chosen.clear()
        K._VECS.clear()
        getattr(tfgrad.raw_ops, warm.op)(**warm.make(rng))
        assert chosen == [v], warm.name
    assert sorted(map(repr, (v for v, _ in VARIANT_WARMUP))) == sorted(
        map(repr, (v for v in KV.VARIANTS for _ in range(2))))


def test_variant_table_refuses_an_undeclared_variant():
    with pytest.raises(KeyError, match="no register-blocked depthwise kernel"):
        KV.kernel(Variant("forward", 4, 4))


def test_streamed_variants_share_one_compiled_kernel():
    """The store flags (``stream``, ``pstream``) are run-time arguments: a streamed variant
    and its plain twin are one compiled kernel (one compile each in warmup), and every
    variant differing in anything else is another."""
    plain = {}
    for v in KV.VARIANTS:
        key = Variant(v.op, v.fh, v.fw, blocked=v.blocked, pair=v.pair)
        plain.setdefault(key, []).append(KV.kernel(v))
    for key, kernels in plain.items():
        assert all(k is kernels[0] for k in kernels), key
    assert len({id(ks[0]) for ks in plain.values()}) == len(plain)
    assert any(v.stream for v in KV.VARIANTS) and len(plain) < len(KV.VARIANTS)
