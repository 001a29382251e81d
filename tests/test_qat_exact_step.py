"""The whole training step, exact: a tfmot QAT model loaded by tfgrad.torch.qat trains as in
TF 2.21 (TF_ENABLE_ONEDNN_OPTS=0) bit for bit, every kernel of the step being TF's (issue
#43): step-0 outputs, every variable after every step, and the losses of 20 steps, with
TF's loss (the mean of SparseSoftmaxCrossEntropyWithLogits) and tf_keras' SGD.

The models: depthwise_chain (depthwise convolutions, batch norm, ReLU/ReLU6, Add,
Concatenate, MaxPooling2D, Dense), MobileNetV2 returning logits (Conv2D 1x1 and 3x3
stride 2, depthwise convolutions, batch norm, ReLU6, Add, ZeroPadding2D, global average
pooling, Dense), cnn (SAME average pooling, Dense + 2-D batch norm, a softmax output),
separable (SeparableConv2D, VALID average pooling) and mlp (Reshape, Dense, a Softmax
layer): every rewrite pattern of tfmot's default registry that tfgrad loads.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests import oracle

torch = pytest.importorskip("torch")
pytest.importorskip("h5py")
pytest.importorskip("tf_keras")
pytest.importorskip("tensorflow_model_optimization")

import tfgrad.torch.qat as tq  # noqa: E402
from tfgrad.testing import qat as models  # noqa: E402

LR = 0.05
MODELS = {"depthwise_chain": (3, 20), "mobilenet_v2_logits": (3, 20), "cnn": (3, 20),
          "separable": (3, 20), "mlp": (3, 20)}
"""model -> (steps whose every variable is compared, steps whose losses are compared)"""


def _labels(model, xs: list[np.ndarray], seed: int = 11) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    classes = int(model.output_shape[-1])
    return [rng.integers(0, classes, len(x)).astype(np.int32) for x in xs]


def _assert_tfs(got: list, ref: list, names: dict, full: int) -> None:
    """Step-0 outputs, every variable after each of the first ``full`` steps, and every
    step's loss: TF's bits."""
    np.testing.assert_array_equal(got[0]["y"], ref[0]["y"], strict=True)
    for step in range(full):
        tfw = models.named_like(names, ref[step]["weights"])
        port = models.by_name(got[step]["weights"])
        assert set(tfw) == set(port)
        differ = sorted(n for n in tfw if not np.array_equal(port[n], tfw[n]))
        assert not differ, f"step {step + 1}: {len(differ)} of {len(tfw)} differ: {differ[:8]}"
    np.testing.assert_array_equal(np.array([g["loss"] for g in got]),
                                  np.array([r["loss"] for r in ref]), strict=True)


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    folder = str(tmp_path_factory.mktemp("qat_exact"))
    return {name: models.tfmot_qat(name, folder)[1] for name in MODELS}


@pytest.mark.live
@pytest.mark.parametrize("name", list(MODELS))
@oracle.onednn_modelled
def test_whole_step_is_tfs(saved: dict, name: str) -> None:
    full, losses = MODELS[name]
    k = models.load_tf(saved[name])
    m = tq.load_keras(saved[name])
    xs, _ = models.batches(k, losses, 4)
    labels = _labels(k, xs)
    ref = models.tf_xent_steps(k, xs, labels, LR)
    got = models.torch_xent_steps(m, xs, labels, LR)
    _assert_tfs(got, ref, m.keras_weights(), full)


# --- JAX: the same step under jax.jit ----------------------------------------------------
#
# tfgrad.jax.qat (exact=True, the default) runs each Keras layer on tfgrad.jax's ops; with
# use_impl("exact") each is a host callback into TF's kernels, and what XLA computes itself
# between them is: adds (Add layers, the sum of a tensor's gradients from its two
# consumers: commutative, exact), pads, concatenations, reshapes, max pooling and its
# gradient, the range arithmetic (fenced in jax/qat.py), and the update. The update is
# tf_keras' SGD, ``var + (-grad * lr)``: the product passes through jq._times, or XLA's
# CPU compiler contracts it with the add into an FMA.
#
# The loss's gradient: SparseSoftmaxCrossEntropyWithLogits is linearised
# (_gradients.LINEARISED), and its native code takes the op's own outputs
# (``primal_outputs``): jax.grad multiplies the incoming gradient by the exact op's
# backprop, TF's bits, as TF's gradient function does (test_jax_grad_of_xent_is_tfs).
# Before, the native backprop was used (an ulp off TF's in 130 of 640 entries), and one ulp
# in a logit's gradient flipped straight-through masks upstream: MobileNetV2 154 of 654
# variables off after step 1, 436 after step 2.
#
# use_impl("native") (XLA's code for every op; plain jax.grad), measured (jax 0.10.2, 2
# cores, AVX-512): the step-0 outputs and loss bit-identical on both models;
# depthwise_chain 5 of 51 variables differ after step 1 (relative 3.4e-8), at most 17
# after 20 steps (1.4e-7), losses equal but step 20's (2.4e-7); MobileNetV2 165 of 654
# after step 1 (2.8e-6), then the fog (437 of 654 and 0.067 on the loss after step 2,
# as TF's oneDNN build departs from its Eigen build, docs/qat.md).

NATIVE_STEPS = 20
"""depthwise_chain's native steps held to NATIVE_W (MobileNetV2's native step compiles for
~40 s and is in the fog from step 2: measured, not run here)"""
NATIVE_W = 1e-6
"""native: variables' distance from TF's, relative to max(1, |w|) (measured at most 1.4e-7
over the 20 steps, with room for other CPUs); losses within 1e-6 (measured 2.4e-7)"""


@pytest.fixture(scope="module")
def tf_runs(saved: dict) -> dict:
    """TF's 20 steps per model, computed once for the JAX tests (a fresh load each)."""
    runs = {}
    for name, (_, losses) in MODELS.items():
        k = models.load_tf(saved[name])
        xs, _ = models.batches(k, losses, 4)
        labels = _labels(k, xs)
        runs[name] = (xs, labels, models.tf_xent_steps(k, xs, labels, LR))
    return runs


def _jax_xent_steps(m: object, xs: list, labels: list, impl: str) -> list:
    """models.tf_xent_steps in one jitted JAX step: TF's loss on tfgrad.jax's ops, its
    gradient (jax.grad), tf_keras' SGD update."""
    import jax
    import jax.numpy as jnp

    import tfgrad.jax as tj
    import tfgrad.jax.qat as jq
    from tfgrad.jax import raw_ops as raw

    lr = jnp.float32(LR)

    def loss_fn(params: dict, state: dict, x: object, t: object) -> tuple:
        y, new = m.apply({"params": params, "state": state}, x, training=True)
        loss = raw.Mean(input=raw.SparseSoftmaxCrossEntropyWithLogits(
            features=y, labels=t).loss, axis=[0])
        return loss, (y, new["state"])

    @jax.jit
    def step(params: dict, state: dict, x: object, t: object) -> tuple:
        (loss, (y, state)), g = jax.value_and_grad(loss_fn, has_aux=True)(
            params, state, x, t)
        # tf_keras' SGD: var + (-grad * lr), the product rounded before the add
        params = jax.tree.map(lambda p, d: p + jq._times(-d, lr), params, g)
        return params, state, loss, y

    out = []
    with tj.use_impl(impl):
        params, state = m.variables["params"], m.variables["state"]
        for x, t in zip(xs, labels):
            params, state, loss, y = step(params, state, x, t)
            out.append({"loss": np.asarray(loss), "y": np.asarray(y),
                        "weights": m.keras_weights({"params": params, "state": state})})
    return out


@pytest.mark.live
@pytest.mark.parametrize("name", list(MODELS))
@oracle.onednn_modelled
def test_jax_whole_step_is_tfs(saved: dict, tf_runs: dict, name: str) -> None:
    """tfgrad.jax.qat, jitted, use_impl("exact"), plain jax.grad: step-0 outputs, every
    variable after every step compared, and 20 losses, bit for bit."""
    pytest.importorskip("jax")
    import tfgrad.jax.qat as jq

    full, _ = MODELS[name]
    xs, labels, ref = tf_runs[name]
    m = jq.load_keras(saved[name])
    got = _jax_xent_steps(m, xs, labels, "exact")
    _assert_tfs(got, ref, m.keras_weights(), full)


def _xent_case() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Logits, labels and TF's gradient of the mean loss: backprop / batch (tfgrad's
    backprop is TF's bits; TF's _MeanGrad divides by 64, exactly)."""
    import tfgrad

    rng = np.random.default_rng(0)
    y = (rng.standard_normal((64, 10)) * 2).astype(np.float32)
    t = rng.integers(0, 10, 64).astype(np.int32)
    want = tfgrad.raw_ops.SparseSoftmaxCrossEntropyWithLogits(
        features=y, labels=t).backprop * np.float32(1 / 64)
    return y, t, want


def test_jax_grad_of_xent_is_tfs() -> None:
    """jax.grad of mean(sparse_softmax_cross_entropy_with_logits) under use_impl("exact"):
    TF's gradient, the op's own backprop / batch (the native backprop, XLA's exp in the
    row sums, is an ulp off in 130 of these 640 entries)."""
    jax = pytest.importorskip("jax")
    import tfgrad.jax as tj
    from tfgrad.jax import raw_ops as raw

    y, t, want = _xent_case()
    with tj.use_impl("exact"):
        got = jax.jit(jax.grad(lambda y: raw.Mean(
            input=raw.SparseSoftmaxCrossEntropyWithLogits(features=y, labels=t).loss,
            axis=[0])))(y)
    np.testing.assert_array_equal(np.asarray(got), want)


@pytest.mark.live
def test_jax_native_step_distances(saved: dict, tf_runs: dict) -> None:
    """use_impl("native"), plain jax.grad, depthwise_chain: every variable and loss of 20
    steps within NATIVE_W of TF's (no fog on this model: its distances stay ~1e-7)."""
    pytest.importorskip("jax")
    import tfgrad.jax.qat as jq

    name = "depthwise_chain"
    xs, labels, ref = tf_runs[name]
    m = jq.load_keras(saved[name])
    got = _jax_xent_steps(m, xs[:NATIVE_STEPS], labels[:NATIVE_STEPS], "native")
    names = m.keras_weights()
    for step in range(NATIVE_STEPS):
        tfw = models.named_like(names, ref[step]["weights"])
        jxw = models.by_name(got[step]["weights"])
        for n, v in tfw.items():
            scale = max(1.0, float(np.abs(v).max()))
            assert np.abs(jxw[n].astype(np.float64) - v).max() <= NATIVE_W * scale, (
                step + 1, n)
        assert abs(float(got[step]["loss"]) - float(ref[step]["loss"])) <= 1e-6, step + 1


def test_jax_sgd_update_is_not_contracted() -> None:
    """tf_keras' ``var + (-grad * lr)`` under jit: XLA's CPU compiler contracts the plain
    expression into an FMA (measured in the whole step: 5 of 51 depthwise_chain variables
    and 131 of 654 MobileNetV2 variables off after step 1, MobileNetV2 in the fog from
    step 3); with the product through jq._times every bit is float32's two roundings."""
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    import tfgrad.jax.qat as jq

    rng = np.random.default_rng(0)
    p = rng.standard_normal(100_000).astype(np.float32)
    g = rng.standard_normal(100_000).astype(np.float32)
    lr = np.float32(LR)
    want = p + (-g * lr)
    got = jax.jit(lambda p, g: p + jq._times(-g, jnp.float32(LR)))(p, g)
    np.testing.assert_array_equal(np.asarray(got), want)
    plain = jax.jit(lambda p, g: p + (-g * jnp.float32(LR)))(p, g)
    assert (np.asarray(plain) != want).any(), "XLA no longer contracts: the fence may go"


@pytest.mark.live
@pytest.mark.parametrize("name", ["depthwise_chain", "cnn"])
def test_a_batch_of_none_steps_as_tf(saved: dict, name: str) -> None:
    """A training step on a batch of 0 (a data shard left empty) runs, fused and layer by
    layer: TF's output shape, and every range variable after it TF's bits (TF's extremes
    of nothing, +inf and -inf, through tfmot's min(., 0) / max(., 0)). (TF's own step
    leaves NaN moving statistics and reads uninitialised memory into some weights' updates
    there: those are not compared.)"""
    k = models.load_tf(saved[name])
    xs, cs = models.batches(k, 1, 0)
    ref = models.tf_steps(k, xs, cs, LR)
    for fused in (True, False):
        m = tq.load_keras(saved[name])
        m.fused = fused and m.fused
        got = models.torch_steps(m, xs, cs, LR)
        assert got[0]["y"].shape == ref[0]["y"].shape
        n, differ = models.ranges_differ(m, got[0], ref[0])
        assert n > 4 and not differ, (fused, differ[:8])
