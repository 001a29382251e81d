"""SparseSoftmaxCrossEntropyWithLogits tests beyond the generic conformance tests
(docs/softmax_xent.md lists the TF behaviours and points here).

- Eigen's pexp (AVX, no FMA) and the C library's expf, against TF's Exp live;
- which values take which exp (per leaf of a row's sum; the flat backprop's tail);
- non-finite logits; TF's gradient (grad_loss * backprop) through tfgrad.torch and
  tfgrad.jax against TF's tape live;
- kernel == reference on hypothesis-generated shapes.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tfgrad
from tests import oracle
from tests.cases.softmax_xent import logits
from tfgrad import raw_ops
from tfgrad._tf import expf as E
from tfgrad.ops import softmax_xent as sx

F32 = np.float32
OP = "SparseSoftmaxCrossEntropyWithLogits"


def both(**kw):
    with tfgrad.use_impl("kernel"):
        k = raw_ops.SparseSoftmaxCrossEntropyWithLogits(**kw)
    with tfgrad.use_impl("reference"):
        r = raw_ops.SparseSoftmaxCrossEntropyWithLogits(**kw)
    oracle.assert_outputs(OP, k, r, what="kernel vs reference")
    return k


def check_tf(got, **kw) -> None:
    if oracle.tensorflow() is not None:
        oracle.assert_outputs(OP, got, oracle.run_tf(OP, kw), what="vs live TF")


def bits(a) -> bytes:
    return np.asarray(a, F32).tobytes()


def _exp_inputs(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = np.concatenate([-rng.exponential(3, n // 2), -rng.uniform(0, 110, n - n // 2)])
    return x.astype(F32)


@pytest.mark.live
def test_pexp_is_tf_packet_exp():
    """Eigen's pexp without FMA: TF's Exp on whole packets (8 | n)."""
    tf = oracle.tensorflow()
    if tf is None:
        pytest.skip("TF not installed")
    x = _exp_inputs(40000)
    want = tf.raw_ops.Exp(x=x).numpy()
    assert bits(E.pexp(x)) == bits(want)


@pytest.mark.live
def test_scalar_tail_is_libc_expf():
    """The last n % 8 values of TF's Exp go through std::exp: the C library's expf."""
    tf = oracle.tensorflow()
    if tf is None:
        pytest.skip("TF not installed")
    for seed in range(5):
        x = _exp_inputs(4007, seed)
        want = tf.raw_ops.Exp(x=x).numpy()[-7:]
        assert bits(E.expf(x[-7:])) == bits(want)


def test_glibc_expf_transcription():
    """The portable implementations' expf (glibc's algorithm in float64) is the C
    library's on every tested value."""
    x = _exp_inputs(20000, 3)
    assert bits(E._f(E.glibc_expf(x))) == bits(E.expf(x))


def test_exp_paths_differ_somewhere():
    """pexp and expf give other bits for some inputs, so the choice matters."""
    x = _exp_inputs(4000, 1)
    assert bits(E.pexp(x)) != bits(E.expf(x))


@pytest.mark.parametrize("b,c", [(32, 10), (3, 9), (5, 7), (2, 8200), (3, 1001)])
def test_live_shapes(b, c):
    rng = np.random.default_rng(b * c)
    for scale in (0.1, 3.0, 30.0):
        kw = dict(features=logits(rng, b, c, scale), labels=rng.integers(0, c, b))
        check_tf(both(**kw), **kw)


def test_nonfinite_rows():
    """NaN or +inf: the whole row is NaN; -inf: probability 0, loss inf at the label."""
    x = np.array([[np.nan, 1, 2], [np.inf, 1, 2], [-np.inf, 2, 3], [1, 2, 3]], F32)
    lab = np.array([1, 1, 0, 2], np.int32)
    loss, bp = both(features=x, labels=lab)
    assert np.isnan(loss[:2]).all() and np.isnan(bp[:2]).all()
    assert loss[2] == np.inf and bp[2, 0] == -1.0
    check_tf((loss, bp), features=x, labels=lab)


def test_empty_batch():
    loss, bp = both(features=np.zeros((0, 4), F32), labels=np.zeros(0, np.int64))
    assert loss.shape == (0,) and bp.shape == (0, 4)


def _tf_grad(x, lab, gl, gb=None):
    tf = oracle.tensorflow()
    xt = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(xt)
        loss, bp = tf.raw_ops.SparseSoftmaxCrossEntropyWithLogits(features=xt, labels=lab)
    if gb is None:
        return tape.gradient(loss, xt, output_gradients=tf.constant(gl)).numpy()
    return tape.gradient([loss, bp], xt, output_gradients=[tf.constant(gl),
                                                          tf.constant(gb)]).numpy()


@pytest.mark.live
@pytest.mark.parametrize("b,c", [(32, 10), (5, 13), (2, 1001)])
def test_gradient_matches_tf(b, c):
    """TF's _SparseSoftmaxCrossEntropyWithLogitsGrad: grad_loss[:, None] * backprop."""
    if oracle.tensorflow() is None:
        pytest.skip("TF not installed")
    torch = pytest.importorskip("torch")
    import jax

    import tfgrad.jax.raw_ops as jr
    import tfgrad.torch as tt

    rng = np.random.default_rng(c)
    x = logits(rng, b, c)
    lab = rng.integers(0, c, b).astype(np.int32)
    gl = rng.standard_normal(b).astype(F32)
    want = _tf_grad(x, lab, gl)
    xt = torch.from_numpy(x.copy()).requires_grad_()
    loss, _ = tt.sparse_softmax_cross_entropy_with_logits(xt, torch.from_numpy(lab))
    (mine,) = torch.autograd.grad(loss, xt, torch.from_numpy(gl))
    assert bits(mine.numpy()) == bits(want)
    if (b, c) != (32, 10):  # (JAX compiles for seconds a shape)
        return
    # JAX: the exact implementation's forward; the vjp through the native backprop,
    # exact where XLA's exp does not stand in for expf (BOUNDS)
    _, vjp = jax.vjp(lambda a: jr.SparseSoftmaxCrossEntropyWithLogits(
        features=a, labels=lab)[0], x)
    (jg,) = vjp(gl)
    assert np.abs(np.asarray(jg) - want).max() <= 4 * np.spacing(np.abs(want).max())


@pytest.mark.live
def test_second_order_part_close_to_tf():
    """An incoming gradient of backprop adds the softmax's Jacobian (TF's Softmax op and
    batched MatMul; here torch's softmax): close, not bit-identical."""
    if oracle.tensorflow() is None:
        pytest.skip("TF not installed")
    torch = pytest.importorskip("torch")
    import tfgrad.torch as tt

    rng = np.random.default_rng(0)
    x, lab = logits(rng, 4, 6), rng.integers(0, 6, 4).astype(np.int32)
    gl, gb = rng.standard_normal(4).astype(F32), rng.standard_normal((4, 6)).astype(F32)
    want = _tf_grad(x, lab, gl, gb)
    xt = torch.from_numpy(x.copy()).requires_grad_()
    loss, bp = tt.sparse_softmax_cross_entropy_with_logits(xt, torch.from_numpy(lab))
    (mine,) = torch.autograd.grad([loss, bp], xt, [torch.from_numpy(gl), torch.from_numpy(gb)])
    np.testing.assert_allclose(mine.numpy(), want, rtol=1e-5, atol=1e-6)


@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.integers(1, 9), st.integers(1, 40), st.floats(0.01, 50), st.integers(0, 2**31))
def test_kernel_equals_reference(b, c, scale, seed):
    rng = np.random.default_rng(seed)
    both(features=logits(rng, b, c, scale, special=True), labels=rng.integers(0, c, b))


def test_labels_checked_before_computing():
    with pytest.raises(tfgrad.InvalidArgumentError, match="Label values: 2 0"):
        sx.SparseSoftmaxCrossEntropyWithLogits(features=np.ones((2, 2), F32),
                                               labels=np.array([2, 0]))
