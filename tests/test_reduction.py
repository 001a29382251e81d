"""Sum / Mean tests beyond the generic conformance tests (docs/reduction.md lists the TF
behaviours and points here).

- each of TF's paths (copy, full, inner, outer, middle, zero-two, transpose) against TF
  live, with data where the alternative order would give other bits;
- the full reduction's thread split (TF's cost model on 2 threads: 108388 values);
- GlobalAveragePooling2D's Mean at MobileNet's size, a loss mean, large sums;
- TF's gradients (_SumGrad / _MeanGrad) through tfgrad.torch and tfgrad.jax;
- kernel == reference on hypothesis-generated shapes and axes.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tfgrad
from tests import oracle
from tests.cases.reduction import values
from tfgrad import _config, raw_ops
from tfgrad._tf import eigen
from tfgrad.ops import reduction as red

F32 = np.float32


def both(op: str, **kw):
    """Kernel result, after checking that the reference gives the same bits."""
    with tfgrad.use_impl("kernel"):
        k = getattr(raw_ops, op)(**kw)
    with tfgrad.use_impl("reference"):
        r = getattr(raw_ops, op)(**kw)
    oracle.assert_outputs(op, k, r, what="kernel vs reference")
    return k


def check_tf(op: str, got, **kw) -> None:
    if oracle.tensorflow() is not None:
        oracle.assert_outputs(op, got, oracle.run_tf(op, kw), what="vs live TF")


def rand(shape, seed=0) -> np.ndarray:
    return values(np.random.default_rng(seed), shape, special=False)


def bits(a) -> bytes:
    return np.asarray(a, F32).tobytes()


# --------------------------------------------------------------------------------------
# The plan (ReductionHelper::Simplify and the case analysis)
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape,axes,kind,dims", [
    ((2, 1, 3, 1, 5), (1, 4), "inner", (6, 5)),  # TF's example: [6, 5] along 1
    ((5, 1, 3), (1,), "copy", (15,)),
    ((1, 6), (0,), "copy", (6,)),
    ((1, 1), (0, 1), "copy", ()),
    ((32, 7, 7, 1280), (1, 2), "middle", (32, 49, 1280)),
    ((8, 5, 5, 16), (0, 1, 2), "outer", (200, 16)),
    ((32,), (0,), "full", (32,)),
    ((3, 4, 5), (0, 2), "zero_two", (3, 4, 5)),
    ((2, 3, 4, 5), (1, 3), "transpose", (2, 3, 4, 5)),
    ((0, 3), (0,), "identity", (0, 3)),
    ((3, 0), (0,), "empty", (3, 0)),
])
def test_plan(shape, axes, kind, dims):
    p = red.make_plan("Sum", shape, axes, False)
    assert (p.kind, p.dims) == (kind, dims)


# --------------------------------------------------------------------------------------
# Paths against TF, where another order gives other bits
# --------------------------------------------------------------------------------------
def _differs(a: np.ndarray, b: np.ndarray) -> bool:
    return bits(a) != bits(b)


def test_outer_lanes_from_16_rows():
    """[r, c] along rows: the first 8 * (c // 8) columns in 4 lanes of rows once r >= 16
    (InnerMostDimPreserver), the other columns sequentially; r = 15 all sequential."""
    seen = False
    for seed in range(20):
        for r in (15, 16, 23):
            x = rand((r, 11), seed)
            got = both("Sum", input=x, axis=[0])
            check_tf("Sum", got, input=x, axis=[0])
            seq = red._seq_sum(red.ftz(x))
            assert bits(got[8:]) == bits(seq[8:])  # the columns past the last packet
            if r == 15:
                assert bits(got) == bits(seq)
            seen |= r >= 16 and _differs(got[:8], seq[:8])
    assert seen, "no input where the lanes change the sum"


def test_middle_packets_stay_in_a_row():
    """[a, b, c] along b: a packet of the flat output [a * c] that crosses a row end is
    computed value by value (sequentially); one inside a row in lanes."""
    seen = False
    for seed in range(10):
        x = rand((3, 20, 11), seed)
        got = both("Mean", input=x, axis=[1])
        check_tf("Mean", got, input=x, axis=[1])
        seq = red.ftz(red._seq_sum(red.ftz(x).transpose(1, 0, 2)) / F32(20)).reshape(-1)
        flat = got.reshape(-1)
        mask = red._dispatch()._packets(3, 11)
        assert bits(flat[~mask]) == bits(seq[~mask])
        seen |= _differs(flat[mask], seq[mask])
    assert seen


def test_zero_two_loops_last_axis_outermost():
    """[a, b, c] along a and c: for k in c, for i in a (GenericDimReducer), not row-major."""
    seen = False
    for seed in range(10):
        x = rand((6, 3, 7), seed)
        got = both("Sum", input=x, axis=[0, 2])
        check_tf("Sum", got, input=x, axis=[0, 2])
        row_major = red._seq_sum(red.ftz(x).transpose(0, 2, 1).reshape(-1, 3))
        seen |= _differs(got, row_major)
    assert seen


def test_inner_rows_are_trees_from_their_flat_index():
    """Rows longer than a leaf (8192) split at packet boundaries of the whole tensor."""
    x = rand((3, 8197), 3)
    got = both("Sum", input=x, axis=[1])
    check_tf("Sum", got, input=x, axis=[1])
    assert bits(got) == bits(np.array([eigen.full_sum(red.ftz(r), i * 8197)
                                       for i, r in enumerate(x)], F32))


def test_copy_keeps_negative_zero_and_denormals():
    """Nothing to reduce (a size-1 axis): TF returns the input itself, unflushed."""
    x = np.array([[-0.0], [1e-40], [3.0]], F32)
    for op in ("Sum", "Mean"):
        got = both(op, input=x, axis=[1])
        assert bits(got) == bits(x.reshape(3))
        check_tf(op, got, input=x, axis=[1])


def test_scalar_axis():
    """A 0-d axis (and one of rank 2: TF reads axis.flat) reduces that dimension."""
    x = rand((6, 10), 5)
    for axis in (np.int32(0), np.array([[0]], np.int64)):
        got = both("Sum", input=x, axis=axis)
        check_tf("Sum", got, input=x, axis=axis)
        assert bits(got) == bits(both("Sum", input=x, axis=[0]))


def test_sum_starts_from_positive_zero():
    x = np.array([-0.0, -0.0], F32)
    got = both("Sum", input=x, axis=[0])
    assert bits(got) == bits(F32(0.0))
    check_tf("Sum", got, input=x, axis=[0])


def test_empty_input():
    """An empty input with a non-empty output: 0 for Sum, NaN for Mean (TF's identity)."""
    x = np.zeros((0, 3), F32)
    assert bits(both("Sum", input=x, axis=[0])) == bits(np.zeros(3, F32))
    assert np.isnan(both("Mean", input=x, axis=[0])).all()
    check_tf("Mean", both("Mean", input=x, axis=[0]), input=x, axis=[0])


def test_mean_divides_by_the_count():
    """Mean = sum / float32(count), one division (not a multiplication by 1 / count)."""
    seen = False
    for seed in range(20):
        x = rand((5, 49), seed)
        got = both("Mean", input=x, axis=[1])
        s = both("Sum", input=x, axis=[1])
        assert bits(got) == bits(red.ftz(s / F32(49)))
        seen |= _differs(got, s * (F32(1) / F32(49)))
        check_tf("Mean", got, input=x, axis=[1])
    assert seen


def test_denormal_inputs_and_results_flush():
    x = np.array([1e-40, 2e-40, 3e-40], F32)
    assert bits(both("Sum", input=x, axis=[0])) == bits(F32(0))
    y = np.full(4, 1e-38, F32)
    got = both("Mean", input=np.array([4e-38, 0, 0, 0], F32), axis=[0])
    assert bits(got) == bits(F32(0))  # 1e-38 is denormal: flushed (FTZ)
    check_tf("Mean", got, input=np.array([4e-38, 0, 0, 0], F32), axis=[0])
    check_tf("Sum", both("Sum", input=y, axis=[0]), input=y, axis=[0])


# --------------------------------------------------------------------------------------
# Thread split of the full reduction, large sums, training-step shapes
# --------------------------------------------------------------------------------------
def test_full_reduction_threshold():
    """TF's cost model: 31/16 cycles a value (4 bytes at 11/64, SumReducer's default
    functor cost 10 over 8 lanes); on 2 threads two shards from 108388 values."""
    assert eigen.num_threads(108387, red.COST_SUM, 2) == 1
    assert eigen.num_threads(108388, red.COST_SUM, 2) == 2


@pytest.mark.skipif(_config.tf_intra_op_threads() != 2, reason="pinned on 2 TF threads")
@pytest.mark.parametrize("n", [108387, 108388, 300001])
def test_large_full_sums_live(n):
    """Around and above the split: the shards' bits (differ from one tree for this data)."""
    x = rand((n,), n)
    got = both("Sum", input=x, axis=[0])
    check_tf("Sum", got, input=x, axis=[0])
    one = eigen.full_sum(red.ftz(x))
    if n >= 108388:
        assert bits(got) == bits(eigen.sharded_sum(red.ftz(x), 2))
    else:
        assert bits(got) == bits(one)


def test_global_average_pooling_mobilenet():
    """Keras' GlobalAveragePooling2D on MobileNet's last feature map."""
    x = rand((32, 7, 7, 1280), 7)
    got = both("Mean", input=x, axis=[1, 2])
    check_tf("Mean", got, input=x, axis=[1, 2])


@pytest.mark.parametrize("n", [16, 32])
def test_loss_mean(n):
    x = np.abs(rand((n,), n))
    got = both("Mean", input=x, axis=[0])
    check_tf("Mean", got, input=x, axis=[0])


# --------------------------------------------------------------------------------------
# Gradients: TF's _SumGrad / _MeanGrad
# --------------------------------------------------------------------------------------
def _tf_grad(op: str, x: np.ndarray, axis, keep: bool, g: np.ndarray) -> np.ndarray:
    tf = oracle.tensorflow()
    xt = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(xt)
        y = getattr(tf.raw_ops, op)(input=xt, axis=axis, keep_dims=keep)
    return tape.gradient(y, xt, output_gradients=tf.constant(g)).numpy()


@pytest.mark.live
@pytest.mark.parametrize("op", ["Sum", "Mean"])
@pytest.mark.parametrize("shape,axis,keep", [((4, 7, 7, 6), [1, 2], False), ((32,), [0], False),
                                             ((3, 5), [-1], True), ((2, 3, 4), [0, 2], False)])
def test_gradients_match_tf(op, shape, axis, keep):
    if oracle.tensorflow() is None:
        pytest.skip("TF not installed")
    torch = pytest.importorskip("torch")
    import jax

    import tfgrad.jax.raw_ops as jr
    import tfgrad.torch as tt

    x = rand(shape, 1)
    out_shape = red.make_plan(op, shape, tuple(axis), keep).out_shape
    g = rand(out_shape, 2) if out_shape else F32(rand((1,), 2)[0])
    want = _tf_grad(op, x, axis, keep, np.asarray(g, F32))
    fn = getattr(tt, op.lower())
    xt = torch.from_numpy(x.copy()).requires_grad_()
    y = fn(xt, axis, keep_dims=keep)
    (mine,) = torch.autograd.grad(y, xt, torch.from_numpy(np.asarray(g, F32)))
    assert bits(mine.numpy()) == bits(want)
    jf = getattr(jr, op)
    _, vjp = jax.vjp(lambda a: jf(input=a, axis=axis, keep_dims=keep), x)
    (jg,) = vjp(np.asarray(g, F32))
    assert bits(np.asarray(jg)) == bits(want)


# --------------------------------------------------------------------------------------
# Kernel == reference on generated shapes
# --------------------------------------------------------------------------------------
@st.composite
def _shape_axes(draw):
    rank = draw(st.integers(1, 5))
    shape = tuple(draw(st.lists(st.integers(1, 9), min_size=rank, max_size=rank)))
    axes = draw(st.lists(st.integers(-rank, rank - 1), unique_by=lambda a: a % rank,
                         max_size=rank))
    return shape, axes, draw(st.booleans()), draw(st.integers(0, 2**31))


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(_shape_axes())
def test_kernel_equals_reference(args):
    shape, axes, keep, seed = args
    x = rand(shape, seed)
    for op in ("Sum", "Mean"):
        both(op, input=x, axis=np.array(axes, np.int32), keep_dims=keep)
