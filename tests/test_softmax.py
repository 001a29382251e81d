"""Softmax tests beyond the generic conformance tests (docs/softmax.md lists the TF
behaviours and points here).

- which values take which exp (TF's tiled exp assignment: per block of 6956 values) and
  which rows take the approximate reciprocal (rcpps + Newton, rows in packets of 8);
- multiply by the reciprocal, not a division; non-finite logits; ranks;
- TF's gradient (_SoftmaxGrad) through tfgrad.torch against TF's tape live, bit for bit;
- kernel == reference on random shapes.
"""

from __future__ import annotations

import numpy as np
import pytest

import tfgrad
from tests import oracle
from tests.cases.softmax import logits
from tfgrad import raw_ops
from tfgrad._tf import rcp
from tfgrad.ops import softmax as sm

F32 = np.float32
OP = "Softmax"


def both(x: np.ndarray) -> np.ndarray:
    with tfgrad.use_impl("kernel"):
        k = raw_ops.Softmax(logits=x)
    with tfgrad.use_impl("reference"):
        r = raw_ops.Softmax(logits=x)
    oracle.assert_outputs(OP, k, r, what="kernel vs reference")
    return k


def check_tf(got: np.ndarray, x: np.ndarray) -> None:
    if oracle.tensorflow() is not None:
        oracle.assert_outputs(OP, got, oracle.run_tf(OP, {"logits": x}), what="vs live TF")


def bits(a: np.ndarray) -> bytes:
    return np.asarray(a, F32).tobytes()


@pytest.mark.parametrize("shape", [(9,), (13, 7), (64, 100), (2, 3, 17), (700, 10),
                                   (1, 7000), (3, 14000), (20, 700)])
def test_live_shapes(shape):
    """Single block, blocks of whole rows, rows split into blocks; rcp rows and exact."""
    rng = np.random.default_rng(sum(shape))
    for scale in (0.1, 3.0, 30.0):
        x = logits(rng, shape, scale)
        check_tf(both(x), x)


def test_packet_mask_blocks():
    """TF's exp: packets in each block but its last len % 8 values."""
    m = sm.packet_mask(2, 8200)  # pieces [0, 6956), [6956, 8200) of each row
    tails = np.nonzero(~m)[0]
    assert list(tails) == [6952, 6953, 6954, 6955, 8196, 8197, 8198, 8199,
                           8200 + 6952, 8200 + 6953, 8200 + 6954, 8200 + 6955,
                           16396, 16397, 16398, 16399]
    m = sm.packet_mask(1000, 7)  # blocks of ceil(6956 / 7) = 994 rows (6958 values), 6 rows
    assert list(np.nonzero(~m)[0]) == [6952, 6953, 6954, 6955, 6956, 6957, 6998, 6999]
    assert sm.packet_mask(3, 5).tolist() == [True] * 8 + [False] * 7


def test_reciprocal_rows_are_approximate():
    """Rows in packets of 8 take rcpps + one Newton step, which is off the exact 1 / s for
    some sums (and TF with it), the last rows % 8 the exact division."""
    s = np.random.default_rng(0).uniform(1, 100, 4000).astype(F32)
    approx = rcp.preciprocal(s)
    exact = (F32(1) / s).astype(F32)
    assert (approx != exact).any()
    assert np.abs(approx.view(np.int32) - exact.view(np.int32)).max() <= 3


def test_multiply_by_reciprocal():
    """softmax = e * (1 / sum), not e / sum: the two differ on some values, TF is the
    first (the reference computes the multiply; checked live)."""
    x = logits(np.random.default_rng(3), (7, 500))  # 7 rows: all exact reciprocals
    got = both(x)
    check_tf(got, x)
    from tfgrad._tf.eigen import full_sum
    from tfgrad._tf.expf import expf, pexp
    from tfgrad._tf.fpenv import flushed

    flat = flushed(x - x.max(1, keepdims=True)).reshape(-1)
    e = np.where(sm.packet_mask(7, 500), pexp(flat), expf(flat)).astype(F32).reshape(7, 500)
    s = np.array([full_sum(e[i], i * 500) for i in range(7)], F32)
    assert bits(got) == bits(e * (F32(1) / s)[:, None])
    assert bits(got) != bits(e / s[:, None])


def test_nonfinite_rows():
    """NaN or +inf in a row, or a row of -inf: the whole row is NaN; -inf alone: 0."""
    x = np.array([[np.nan, 1, 2], [np.inf, 1, 2], [-np.inf] * 3, [-np.inf, 0, 1],
                  [1e-40, -1e-40, 0]], F32)
    y = both(x)
    assert np.isnan(y[:3]).all() and y[3, 0] == 0 and not np.isnan(y[3:]).any()
    assert (y[4] == F32(1) / F32(3)).all()  # (denormals flushed: three zeros)
    check_tf(y, x)


def test_empty_and_rank1():
    assert both(np.zeros((0, 4), F32)).shape == (0, 4)
    assert raw_ops.Softmax(logits=np.zeros((3, 0), F32)).shape == (3, 0)
    x = logits(np.random.default_rng(1), (37,))
    check_tf(both(x), x)


@pytest.mark.parametrize("seed", range(4))
def test_kernel_is_reference_random(seed):
    rng = np.random.default_rng(seed)
    shape = tuple(int(v) for v in rng.integers(1, 40, int(rng.integers(1, 4))))
    x = logits(rng, shape, float(rng.choice([0.01, 1.0, 50.0])), special=True)
    both(x)


def _tf_grad(x: np.ndarray, g: np.ndarray) -> np.ndarray:
    tf = oracle.tensorflow()
    xt = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(xt)
        y = tf.nn.softmax(xt)
    return tape.gradient(y, xt, output_gradients=tf.constant(g)).numpy()


@pytest.mark.parametrize("shape", [(32, 10), (13, 7), (2, 3, 17), (2, 8200)])
def test_torch_gradient_is_tf_tape(shape):
    """TF's _SoftmaxGrad (Mul, Sum, Sub, Mul) through tfgrad.torch on CPU: TF's bits."""
    torch = pytest.importorskip("torch")
    if oracle.tensorflow() is None:
        pytest.skip("TF not installed")
    import tfgrad.torch as tt

    rng = np.random.default_rng(len(shape))
    x = logits(rng, shape)
    g = rng.standard_normal(shape).astype(F32)
    xx = torch.from_numpy(x).requires_grad_()
    (got,) = torch.autograd.grad(tt.softmax(xx), xx, torch.from_numpy(g))
    assert bits(got.numpy()) == bits(_tf_grad(x, g))


def test_torch_second_order_runs():
    torch = pytest.importorskip("torch")
    import tfgrad.torch as tt

    xx = torch.from_numpy(logits(np.random.default_rng(0), (2, 9))).requires_grad_()
    y = tt.softmax(xx)
    (g1,) = torch.autograd.grad(y, xx, torch.arange(18.0).reshape(2, 9), create_graph=True)
    (g2,) = torch.autograd.grad(g1.sum(), xx)
    assert g2.shape == (2, 9) and torch.isfinite(g2).all()


def _composite(y: np.ndarray, g: np.ndarray) -> np.ndarray:
    """TF's _SoftmaxGrad on tfgrad's NumPy ops: (g - Sum(g * y, -1, keep_dims)) * y."""
    s = raw_ops.Sum(input=g * y, axis=[y.ndim - 1], keep_dims=True)
    return (g - s) * y


@pytest.mark.parametrize("shape", [(32, 10), (13, 7), (2, 3, 17), (2, 8200)])
def test_jax_exact_gradient_is_tf_tape(shape):
    """Reverse mode on JAX's exact path is TF's _SoftmaxGrad composite on tfgrad's Sum
    (the linearisation's transpose), eager and under jit; forward mode still works."""
    jax = pytest.importorskip("jax")
    import tfgrad.jax as tj

    rng = np.random.default_rng(len(shape) + 7)
    x = logits(rng, shape)
    g = rng.standard_normal(shape).astype(F32)
    y = raw_ops.Softmax(logits=x)
    want = _tf_grad(x, g) if oracle.tensorflow() is not None else _composite(y, g)
    assert bits(_composite(y, g)) == bits(want)
    with tj.use_impl("exact"):
        _, vjp = jax.vjp(tj.softmax, x)
        assert bits(np.asarray(vjp(g)[0])) == bits(want)
        jitted = jax.jit(lambda v, c: jax.vjp(tj.softmax, v)[1](c)[0])
        assert bits(np.asarray(jitted(x, g))) == bits(want)
        _, tangent = jax.jvp(tj.softmax, (x,), (g,))  # (the Jacobian is symmetric)
    assert np.allclose(np.asarray(tangent), want, rtol=1e-5, atol=1e-6)


def test_jax_native_gradient_near_tf():
    """The native path differentiates through XLA's exp: close to TF, not TF's bits."""
    jax = pytest.importorskip("jax")
    import tfgrad.jax as tj

    x = logits(np.random.default_rng(2), (8, 10))
    g = np.random.default_rng(3).standard_normal((8, 10)).astype(F32)
    with tj.use_impl("native"):
        _, vjp = jax.vjp(tj.softmax, x)
        (got,) = vjp(g)
        (second,) = jax.grad(lambda v: jax.vjp(tj.softmax, v)[1](g)[0].sum())(x)[None]
    want = _tf_grad(x, g) if oracle.tensorflow() is not None else np.asarray(got)
    assert np.allclose(np.asarray(got), want, rtol=1e-5, atol=1e-6)
    assert np.isfinite(np.asarray(second)).all()


@pytest.mark.live
@oracle.onednn_modelled
def test_qat_mlp_trains_as_tf(tmp_path):
    """tfgrad.torch.qat's exact path on the mlp model (Dense + Softmax layer, ending in a
    softmax): every variable after 2 steps is TF-Eigen's."""
    pytest.importorskip("torch")
    pytest.importorskip("h5py")
    pytest.importorskip("tf_keras")
    pytest.importorskip("tensorflow_model_optimization")
    if oracle.tensorflow() is None:
        pytest.skip("TF not installed")
    import tfgrad.torch.qat as tq
    from tfgrad.testing import qat as models

    path = models.tfmot_qat("mlp", str(tmp_path))[1]
    k, m = models.load_tf(path), tq.load_keras(path)
    xs, cs = models.batches(k, 2, 4)
    ref = models.tf_steps(k, xs, cs, 0.05)
    got = models.torch_steps(m, xs, cs, 0.05)
    assert bits(got[0]["y"]) == bits(ref[0]["y"])
    names = m.keras_weights()
    for step in range(2):
        tfw = models.named_like(names, ref[step]["weights"])
        ptw = models.by_name(got[step]["weights"])
        assert set(tfw) == set(ptw)
        assert not [n for n in tfw if bits(ptw[n]) != bits(tfw[n])], step
