"""SquaredDifference, Rsqrt, RsqrtGrad: TF 2.21's behaviours pinned (docs/cwise.md).

1. Rsqrt: Eigen's approximate prsqrt (rsqrtps + one Newton step) on full packets of 8,
   the exact 1 / sqrt on the last size % 8 values; float64 exact everywhere; DAZ (a
   denormal gives inf of its sign); half types: the tail rounds sqrt to the type first;
2. RsqrtGrad: the packet form mul_no_nan(-0.5 * y * y, mul_no_nan(y, dy)) in the body,
   (dy == 0 ? 0 : (-0.5 * (dy * y)) * (y * y)) in the tail: a flushed y * dy gives +0 in
   the body and a signed zero in the tail; float64's packet is 4;
3. SquaredDifference: two roundings, FTZ; broadcasting by TF's rules; bfloat16 NaN results
   canonical (0x7fc0) in packets and signed in the tail;
4. the gradient table: Rsqrt's gradient is RsqrtGrad on its output, SquaredDifference's is
   TF's (2 * grad) * (x - y) summed over the broadcast axes: the batch statistics of a
   2-D Keras batch normalization (tf.nn.moments, rsqrt(variance + epsilon)) and their
   gradient through tfgrad.torch match TF's eager tape bit for bit;
5. large tensors live, and the same bits on 1 or 2 Numba threads.
"""

from __future__ import annotations

import ml_dtypes
import numba
import numpy as np
import pytest

import tfgrad
from tests import oracle
from tfgrad import raw_ops
from tfgrad._tf.rsqrt import HAVE_HW_RSQRT, eigen_rsqrt

F32 = np.float32
BF16 = ml_dtypes.bfloat16


def run(op: str, impl: str = "kernel", **kw):
    with tfgrad.use_impl(impl):
        return getattr(raw_ops, op)(**kw)


def both(op: str, **kw) -> np.ndarray:
    """Kernel result, after checking the reference and (where installed) TF live, bit
    for bit (NaN payloads too)."""
    k = run(op, "kernel", **kw)
    r = run(op, "reference", **kw)
    assert k.tobytes() == r.tobytes(), "kernel vs reference"
    if oracle.tensorflow() is not None:
        t = oracle.run_tf(op, kw)
        t = t[0] if isinstance(t, tuple) else t
        assert k.tobytes() == np.asarray(t).tobytes(), "vs live TF"
    return k


def test_rsqrt_packet_body_and_exact_tail():
    rng = np.random.default_rng(0)
    x = np.exp(rng.uniform(-80, 80, 1003)).astype(F32)
    y = both("Rsqrt", x=x)
    exact = (F32(1) / np.sqrt(x)).astype(F32)
    assert (y[1000:] == exact[1000:]).all()  # scalar tail: 1 / sqrt
    body = eigen_rsqrt(x[:1000])  # rsqrtps + Newton on every value
    assert (y[:1000] == body).all()
    if HAVE_HW_RSQRT:  # the approximation is visible in the body
        assert (y[:1000] != exact[:1000]).any()
    # 3e38 in the body and in the tail of the same call
    v = np.full(9, 3e38, F32)
    out = both("Rsqrt", x=v)
    assert out[8] == F32(1) / np.sqrt(F32(3e38))
    assert out[0] == eigen_rsqrt(v[:8])[0]


def test_rsqrt_daz_and_specials():
    x = np.array([0.0, -0.0, 1e-40, -1e-40, -1.0, np.inf, -np.inf, 4.0, 0.25], F32)
    for n in (9, 16):  # in the tail / in the body
        xs = np.resize(x, n)
        y = both("Rsqrt", x=xs)
        assert y[0] == np.inf and y[1] == -np.inf and y[2] == np.inf and y[3] == -np.inf
        assert np.isnan(y[4]) and y[5] == 0 and np.isnan(y[6])
    assert both("Rsqrt", x=np.full(5, 4.0))[0] == 0.5  # float64: exact everywhere


def test_rsqrt_half_types_round_sqrt_in_the_tail():
    for dt, bits in ((np.float16, np.arange(1, 0x7C00, dtype=np.uint16)),
                     (BF16, np.arange(0x80, 0x7F80, 7, dtype=np.uint16))):
        x = bits.view(dt)
        x = x[: x.size - x.size % 8]
        body = both("Rsqrt", x=x)
        tail = np.concatenate([both("Rsqrt", x=x[i:i + 7]) for i in range(0, 7 * 300, 7)])
        xf = x.astype(F32)
        once = (F32(1) / np.sqrt(xf)).astype(dt)  # one rounding of the float32 result
        twice = (F32(1) / np.sqrt(xf).astype(dt).astype(F32)).astype(dt)
        assert (tail == twice[:tail.size]).all()
        assert (tail != once[:tail.size]).any()  # the double rounding shows
        assert (body.astype(F32) - once.astype(F32) == 0).mean() > 0.99


def test_rsqrt_grad_body_and_tail():
    # y * dy underflows (FTZ): +0 in the packet body (mul_no_nan), -0.5 * (+-0) * y^2 in
    # the tail; dy == 0 gives +0 everywhere, even with y = inf or NaN
    y = np.array([1e-20, 1e20, 2.0 ** -63, -1e-20, 3, np.nan, 1, 0], F32)
    dy = np.array([1e-20, 1e-30, 2.0 ** -64, 1e-20, -0.0, 0, np.nan, np.inf], F32)
    body = both("RsqrtGrad", y=y, dy=dy).view(np.uint32)
    tail = both("RsqrtGrad", y=np.concatenate([y, y[:7]]),
                dy=np.concatenate([dy, dy[:7]])).view(np.uint32)[8:]
    assert [hex(v) for v in body] == ["0x0", "0xff800000", "0x0", "0x0", "0x0", "0x0",
                                      "0x7fc00000", "0xffc00000"]
    assert [hex(v) for v in tail] == ["0x80000000", "0xff800000", "0x80000000", "0x0", "0x0",
                                      "0x0", "0x7fc00000"]


def test_rsqrt_grad_float64_packets_of_four_and_shapes():
    y = np.full(7, 1e-160)
    dy = np.full(7, 1e-160)
    z = both("RsqrtGrad", y=y, dy=dy)  # y * dy underflows: +0 body, -0 tail
    assert list(np.signbit(z)) == [False] * 4 + [True] * 3
    # same number of values, other shapes: shaped like y (TF's SimpleBinaryOp)
    assert both("RsqrtGrad", y=np.ones((2, 3), F32), dy=np.ones((3, 2), F32)).shape == (2, 3)


def test_squared_difference_flushes_and_broadcasts():
    x = np.array([[1e-20, 3.0, 1e-40, np.inf]], F32)
    y = np.array([0.0, 1.0, 0.0, np.inf], F32)
    z = both("SquaredDifference", x=x, y=y)
    assert z[0, 0] == 0 and z[0, 1] == 4 and z[0, 2] == 0 and np.isnan(z[0, 3])
    assert both("SquaredDifference", x=np.ones((3, 1), F32), y=np.ones((1, 4), F32)).shape \
        == (3, 4)
    # bfloat16 NaN: canonical in packets, signed (inf - inf: -NaN) in the tail
    inf = np.full(17, np.inf, BF16)
    bits = both("SquaredDifference", x=inf, y=inf).view(np.uint16)
    assert list(bits) == [0x7FC0] * 16 + [0xFFC0]


def test_squared_difference_broadcast_patterns_match_expanded():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((40, 33)).astype(F32)
    for y in (x.mean(0, keepdims=True), x[0], x[:, :1], np.float32(0.5) * np.ones((), F32)):
        want = run("SquaredDifference", "reference", x=x, y=y)
        assert run("SquaredDifference", x=x, y=y).tobytes() == want.tobytes()
        assert run("SquaredDifference", x=y, y=x).tobytes() == run(
            "SquaredDifference", "reference", x=y, y=x).tobytes()


def test_moments_rsqrt_gradient_matches_tf_tape():
    """The batch statistics of a 2-D Keras batch normalization and their gradient, as TF's
    eager tape runs them: Mean, SquaredDifference(x, stop_gradient(mean)), Mean, AddV2,
    Rsqrt; back: RsqrtGrad, Mean's broadcast / N, (2 * g) * (x - mean)."""
    torch = pytest.importorskip("torch")
    tf = oracle.tensorflow()
    if tf is None:
        pytest.skip("TensorFlow is not installed")
    import tfgrad.torch as T

    rng = np.random.default_rng(4)
    for n, c in ((32, 12), (7, 9), (100, 30)):
        x = (rng.standard_normal((n, c)) * rng.uniform(0.1, 10, c) + rng.uniform(-5, 5, c))
        x = x.astype(F32)
        g = rng.standard_normal(c).astype(F32)
        eps = F32(1e-3)
        xt = torch.tensor(x, requires_grad=True)
        mean = T.mean(xt, [0], keep_dims=True)
        var = T.mean(T.squared_difference(xt, mean.detach()), [0], keep_dims=True)
        inv = T.rsqrt(var.reshape(-1) + torch.tensor(eps))
        (dx,) = torch.autograd.grad(inv, (xt,), torch.tensor(g))
        xv = tf.constant(x)
        with tf.GradientTape() as tape:
            tape.watch(xv)
            _, v = tf.nn.moments(xv, [0], keepdims=True)
            it = tf.math.rsqrt(tf.squeeze(v) + eps)
        oracle.assert_same(inv.detach().numpy(), it.numpy(), what="rsqrt(var + eps)")
        want = tape.gradient(it, xv, output_gradients=tf.constant(g))
        oracle.assert_same(dx.numpy(), want.numpy(), what=f"dx [{n}, {c}]")


@pytest.mark.live
def test_large_live_and_threads():
    if oracle.tensorflow() is None:
        pytest.skip("TensorFlow is not installed")
    rng = np.random.default_rng(5)
    n = 1_000_003
    x = np.exp(rng.uniform(-20, 20, n)).astype(F32)
    y = rng.standard_normal(n).astype(F32)
    calls = (("Rsqrt", dict(x=x)), ("RsqrtGrad", dict(y=x, dy=y)),
             ("SquaredDifference", dict(x=x[:1009 * 991].reshape(1009, 991),
                                        y=y[:991].reshape(1, 991))))
    for op, kw in calls:
        want = oracle.run_tf(op, kw)
        old = numba.get_num_threads()
        try:
            for t in sorted({1, numba.config.NUMBA_NUM_THREADS}):
                numba.set_num_threads(t)
                oracle.assert_outputs(op, run(op, **kw), want, what=f"{t} threads")
        finally:
            numba.set_num_threads(old)
