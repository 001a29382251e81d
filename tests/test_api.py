"""The public API built from the op table: names, signatures, argument validation."""

from __future__ import annotations

import inspect
from itertools import product

import numpy as np
import pytest

import tfgrad
from tfgrad import _gradients, _validate
from tfgrad._opdefs import OPS, get_op_def, snake_case

ALL = sorted(OPS)


def test_every_op_is_exposed_both_ways():
    for name, op in OPS.items():
        raw = getattr(tfgrad.raw_ops, name)
        snake = getattr(tfgrad, op.snake_name)
        assert raw.op_def is op and snake.op_def is op and raw.OP_NAME == name
        assert op.summary in raw.__doc__ and op.summary in snake.__doc__
    assert sorted(tfgrad.raw_ops.__all__) == ALL


@pytest.mark.parametrize("op_name,snake", [
    ("FakeQuantWithMinMaxVarsPerChannelGradient",
     "fake_quant_with_min_max_vars_per_channel_gradient"),
    ("FusedBatchNormV3", "fused_batch_norm_v3"),
    ("FusedBatchNormGradV2", "fused_batch_norm_grad_v2"),
    ("DepthwiseConv2dNativeBackpropInput", "depthwise_conv2d_native_backprop_input"),
    ("FractionalAvgPoolGrad", "fractional_avg_pool_grad"),
])
def test_snake_case(op_name, snake):
    assert snake_case(op_name) == snake
    assert get_op_def(snake) is get_op_def(op_name)


def test_unknown_op():
    with pytest.raises(KeyError, match="no op named"):
        get_op_def("Conv3D")


def test_raw_ops_are_keyword_only():
    with pytest.raises(TypeError, match="keyword"):
        tfgrad.raw_ops.FakeQuantWithMinMaxArgs(np.zeros(3, np.float32))


def test_missing_and_unknown_arguments_are_type_errors():
    with pytest.raises(TypeError, match=r"FakeQuantWithMinMaxVars\(\): missing .* 'max'"):
        tfgrad.raw_ops.FakeQuantWithMinMaxVars(inputs=np.zeros(3, np.float32), min=0.0)
    with pytest.raises(TypeError, match="unexpected keyword argument 'nbits'; its arguments: "
                                        "inputs, min, max, num_bits"):
        tfgrad.raw_ops.FakeQuantWithMinMaxArgs(inputs=np.zeros(3, np.float32), nbits=8)
    # a misspelt input is named as such, not reported as the input it should have been
    with pytest.raises(TypeError, match="depthwise_conv2d_native.* unexpected .* 'filtr'"):
        tfgrad.depthwise_conv2d_native(np.zeros((1, 3, 3, 1), np.float32),
                                       filtr=np.zeros((1, 1, 1, 1), np.float32),
                                       strides=[1, 1, 1, 1], padding="SAME")
    with pytest.raises(TypeError, match="strides"):
        tfgrad.raw_ops.DepthwiseConv2dNative(
            input=np.zeros((1, 3, 3, 1), np.float32), filter=np.zeros((1, 1, 1, 1), np.float32),
            padding="SAME")


@pytest.mark.parametrize("kwargs,error,match", [
    (dict(num_bits=8.0), TypeError, "attr 'num_bits' must be an int"),
    (dict(num_bits=True), TypeError, "attr 'num_bits' must be an int"),
    (dict(num_bits=17), tfgrad.InvalidArgumentError, "between 2 and 16, inclusive, got 17"),
    (dict(num_bits=1), tfgrad.InvalidArgumentError, "between 2 and 16, inclusive, got 1"),
    (dict(narrow_range=1), TypeError, "attr 'narrow_range' must be a bool"),
    (dict(min="0"), TypeError, "attr 'min' must be a float"),
])
def test_attr_validation(kwargs, error, match):
    with pytest.raises(error, match=match):
        tfgrad.raw_ops.FakeQuantWithMinMaxArgs(inputs=np.zeros(3, np.float32), **kwargs)


def test_none_attr_means_the_default_as_in_tf():
    x = np.linspace(-8, 8, 33, dtype=np.float32)
    want = tfgrad.raw_ops.FakeQuantWithMinMaxArgs(inputs=x)
    got = tfgrad.raw_ops.FakeQuantWithMinMaxArgs(inputs=x, min=None, max=None, num_bits=None,
                                                 narrow_range=None)
    assert got.tobytes() == want.tobytes()
    with pytest.raises(TypeError, match="strides"):  # no default: still required
        tfgrad.raw_ops.DepthwiseConv2dNative(
            input=np.zeros((1, 3, 3, 1), np.float32), filter=np.zeros((1, 1, 1, 1), np.float32),
            strides=None, padding="SAME")


def test_string_attr_allowed_values():
    with pytest.raises(tfgrad.InvalidArgumentError,
                       match=r"Value for attr 'data_format' of \"NWHC\" is not in the list of "
                             r"allowed values: \"NHWC\", \"NCHW\""):
        tfgrad.raw_ops.FusedBatchNorm(
            x=np.zeros((1, 1, 1, 1), np.float32), scale=[1.0], offset=[0.0], mean=[0.0],
            variance=[1.0], data_format="NWHC")


def test_list_attr_min_length():
    with pytest.raises(tfgrad.InvalidArgumentError,
                       match="Length for attr 'pooling_ratio' of 3 must be at least minimum 4"):
        tfgrad.raw_ops.FractionalAvgPool(value=np.zeros((1, 4, 4, 1), np.float32),
                                         pooling_ratio=[1.0, 2.0, 1.0])


def test_float_attrs_are_float32_like_tf():
    op = get_op_def("FakeQuantWithMinMaxArgs")
    assert _validate.check_attr(op, op.attr("min"), 0.1) == float(np.float32(0.1))


def test_dtype_errors_are_type_errors():
    # (and TF's InvalidArgumentError, with TF's words)
    with pytest.raises(tfgrad.errors.InvalidDtypeError,
                       match="Value for attr 'T' of double is not in the list of allowed values: "
                             "half, bfloat16, float .*float64, expected one of float16, "
                             "bfloat16, float32"):
        tfgrad.raw_ops.FusedBatchNormV3(
            x=np.zeros((1, 1, 1, 1)), scale=[1.0], offset=[0.0], mean=[0.0], variance=[1.0])
    with pytest.raises(TypeError, match="must share one dtype"):
        tfgrad.raw_ops.DepthwiseConv2dNative(
            input=np.zeros((1, 3, 3, 1), np.float32), filter=np.zeros((1, 1, 1, 1)),
            strides=[1, 1, 1, 1], padding="SAME")
    with pytest.raises(TypeError, match="must have dtype float32, got int64"):
        tfgrad.raw_ops.FakeQuantWithMinMaxArgs(inputs=np.zeros(3, np.int64))
    with pytest.raises(TypeError, match="must be numeric"):
        tfgrad.raw_ops.FakeQuantWithMinMaxArgs(inputs=["a", "b"])
    with pytest.raises(TypeError, match="numeric"):
        tfgrad.raw_ops.FakeQuantWithMinMaxArgs(inputs=[True, False])


def test_ragged_lists_are_rejected():
    with pytest.raises(tfgrad.InvalidArgumentError, match="rectangular"):
        tfgrad.raw_ops.FakeQuantWithMinMaxArgs(inputs=[[1.0, 2.0], [3.0]])


def test_python_inputs_follow_the_array_dtype():
    op = get_op_def("DepthwiseConv2dNativeBackpropInput")
    arrays, types = _validate.bind_inputs(op, dict(
        input_sizes=[1, 3, 3, 1], filter=np.zeros((1, 1, 1, 1), np.float64),
        out_backprop=[[[[0.0]]]]))
    assert types == {"T": "float64"}
    assert arrays["out_backprop"].dtype == np.float64
    assert arrays["input_sizes"].dtype == np.int32


def test_float64_to_float32_input_is_converted_as_tf_does():
    op = get_op_def("FakeQuantWithMinMaxArgs")
    arrays, _ = _validate.bind_inputs(op, dict(inputs=np.array([0.1, 0.2])))
    assert arrays["inputs"].dtype == np.float32


def test_int_values_out_of_range_for_int32():
    op = get_op_def("DepthwiseConv2dNativeBackpropInput")
    with pytest.raises(tfgrad.InvalidArgumentError, match="outside the range of int32"):
        _validate.bind_inputs(op, dict(
            input_sizes=np.array([1, 2**40, 3, 1]), filter=np.zeros((1, 1, 1, 1), np.float32),
            out_backprop=np.zeros((1, 1, 1, 1), np.float32)))


def test_check_alloc_overflow_and_limit(monkeypatch):
    with pytest.raises(tfgrad.InvalidArgumentError, match="int64"):
        _validate.check_alloc("Op", "output", [2**40, 2**40], np.float32)
    monkeypatch.setenv("TFGRAD_MAX_BYTES", "1000")
    with pytest.raises(tfgrad.ResourceLimitError, match="more than the 1000 bytes"):
        _validate.check_alloc("Op", "output", [1000], np.float32)
    assert _validate.check_alloc("Op", "output", [10], np.float32) == (10,)


@pytest.mark.live
@pytest.mark.parametrize("name", ALL)
def test_signatures_match_tensorflow(name):
    """Same keyword names, order and defaults as tf.raw_ops and TF's generated wrappers."""
    from tests.oracle import tensorflow

    tf = tensorflow()
    ours = inspect.signature(getattr(tfgrad.raw_ops, name)).parameters
    theirs = inspect.signature(getattr(tf.raw_ops, name)).parameters
    assert list(ours) == list(theirs)
    for p in ours:
        assert ours[p].default == theirs[p].default, p
    snake = get_op_def(name).snake_name
    from tensorflow.python.ops import gen_array_ops, gen_math_ops, gen_nn_ops

    gen = next(getattr(m, n) for n in (snake, "_" + snake)
               for m in (gen_array_ops, gen_nn_ops, gen_math_ops)
               if hasattr(m, n))  # TF hides some wrappers (_fused_batch_norm, _sum)
    gen_params = inspect.signature(gen).parameters
    ours = inspect.signature(getattr(tfgrad, snake)).parameters
    assert list(ours) == list(gen_params)
    for p in ours:
        assert ours[p].default == gen_params[p].default, p


@pytest.mark.live
@pytest.mark.parametrize("name", [n for n in ALL if len(OPS[n].outputs) > 1])
def test_output_names_match_tensorflow(name):
    from tests.oracle import tensorflow

    tf = tensorflow()
    from tensorflow.python.ops import gen_array_ops, gen_nn_ops

    mod = gen_array_ops if hasattr(gen_array_ops, name) else gen_nn_ops
    tf_tuple = getattr(mod, "_" + name + "Output")
    assert tuple(tf_tuple._fields) == tuple(o.name for o in OPS[name].outputs)
    assert tf is not None


def test_type_stubs_are_current():
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    r = subprocess.run([sys.executable, str(root / "tools/make_stubs.py"), "--check"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_check_alloc_reads_available_memory_only_for_large_allocations(monkeypatch):
    calls = []

    def tiny_limit() -> int:
        calls.append(1)
        return 1 << 20

    monkeypatch.delenv("TFGRAD_MAX_BYTES", raising=False)
    monkeypatch.setattr(_validate, "memory_limit_bytes", tiny_limit)
    # Small: no /proc/meminfo read on every op call (it cost ~0.1 ms per output).
    assert _validate.check_alloc("Op", "output", (1024, 1024), np.float32) == (1024, 1024)
    assert calls == []
    # Large: checked against the available memory.
    with pytest.raises(tfgrad.ResourceLimitError, match="more than"):
        _validate.check_alloc("Op", "output", (8192, 4096), np.float32)
    assert calls == [1]
    # TFGRAD_MAX_BYTES applies to every size.
    monkeypatch.undo()
    monkeypatch.setenv("TFGRAD_MAX_BYTES", "1024")
    with pytest.raises(tfgrad.ResourceLimitError):
        _validate.check_alloc("Op", "output", (1024,), np.float32)


# --------------------------------------------------------------------------------------
# The signature cache (tfgrad._api): a repeated signature skips only what it proves
# --------------------------------------------------------------------------------------
def test_repeated_signature_gives_the_same_bits_and_leaves_inputs_alone():
    from tfgrad import _api

    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 3, 2)).astype(np.float32)
    w = rng.standard_normal((3, 3, 2, 2)).astype(np.float32)
    x.flags.writeable = False
    before = x.copy()
    kw = dict(input=x, filter=w, strides=[1, 1, 1, 1], padding="SAME")
    _api._CACHE.clear()
    first = tfgrad.raw_ops.DepthwiseConv2dNative(**kw)
    assert len(_api._CACHE) == 1
    for _ in range(3):
        again = tfgrad.raw_ops.DepthwiseConv2dNative(**kw)
        assert again.tobytes() == first.tobytes() and again is not first
    np.testing.assert_array_equal(x, before)
    q = tfgrad.raw_ops.FakeQuantWithMinMaxArgs(inputs=x, min=-1.0, max=1.0)
    assert tfgrad.raw_ops.FakeQuantWithMinMaxArgs(inputs=x, min=-1.0, max=1.0).tobytes() == \
        q.tobytes()
    # another range, another signature
    assert not np.array_equal(tfgrad.raw_ops.FakeQuantWithMinMaxArgs(inputs=x, min=-0.5,
                                                                      max=0.5), q)


def test_repeated_signature_still_checks_attr_types_and_values():
    x = np.linspace(-1, 1, 8, dtype=np.float32)
    for _ in range(2):
        tfgrad.raw_ops.FakeQuantWithMinMaxArgs(inputs=x, min=-6.0, max=6.0, num_bits=8)
    # values equal to the cached ones, of the wrong types: 8.0 is not 8, True is not 1.0
    with pytest.raises(TypeError, match="num_bits"):
        tfgrad.raw_ops.FakeQuantWithMinMaxArgs(inputs=x, min=-6.0, max=6.0, num_bits=8.0)
    tfgrad.raw_ops.FakeQuantWithMinMaxArgs(inputs=x, min=1.0, max=6.0)
    with pytest.raises(TypeError, match="min"):
        tfgrad.raw_ops.FakeQuantWithMinMaxArgs(inputs=x, min=True, max=6.0)
    with pytest.raises(tfgrad.InvalidArgumentError, match="min has to be smaller than max"):
        tfgrad.raw_ops.FakeQuantWithMinMaxArgs(inputs=x, min=6.0, max=6.0)
    # -0.0 and 0.0 are equal keys to a dict, not to the op: both keep their own sign
    for lo in (0.0, -0.0, 0.0):
        tfgrad.raw_ops.FakeQuantWithMinMaxArgs(inputs=x, min=lo, max=1.0)
    xs = np.zeros((1, 3, 3, 1), np.float32)
    w = np.ones((1, 1, 1, 1), np.float32)
    for _ in range(2):
        tfgrad.raw_ops.DepthwiseConv2dNative(input=xs, filter=w, strides=[1, 1, 1, 1],
                                             padding="VALID")
    with pytest.raises(TypeError, match="strides"):
        tfgrad.raw_ops.DepthwiseConv2dNative(input=xs, filter=w, strides=[1, 1.0, 1, 1],
                                             padding="VALID")
    # a shape input's values are part of the signature
    g = np.ones((1, 3, 3, 1), np.float32)
    for sizes in ([1, 3, 3, 1], np.array([1, 3, 3, 1], np.int32)):
        for _ in range(2):
            tfgrad.raw_ops.DepthwiseConv2dNativeBackpropInput(
                input_sizes=sizes, filter=w, out_backprop=g, strides=[1, 1, 1, 1],
                padding="VALID")
    with pytest.raises(tfgrad.InvalidArgumentError, match="Number of rows"):
        tfgrad.raw_ops.DepthwiseConv2dNativeBackpropInput(
            input_sizes=[1, 4, 3, 1], filter=w, out_backprop=g, strides=[1, 1, 1, 1],
            padding="VALID")


def test_seeds_stay_out_of_the_signature():
    # A layer draws new seeds every step: one signature for them all, each call run with
    # its own seeds (the bits of an uncached call), and a seed still checked every call.
    from tfgrad import _api

    x = np.random.default_rng(0).standard_normal((2, 9, 9, 3)).astype(np.float32)
    kw = dict(value=x, pooling_ratio=[1, 1.5, 1.5, 1], deterministic=True)
    _api._CACHE.clear()
    outs = [tfgrad.raw_ops.FractionalMaxPool(**kw, seed=s, seed2=s + 7) for s in range(1, 7)]
    assert len(_api._CACHE) == 1
    _api._CACHE.clear()
    for s, out in zip(range(1, 7), outs):
        _api._CACHE.clear()  # (each call uncached: bound and checked in full)
        want = tfgrad.raw_ops.FractionalMaxPool(**kw, seed=s, seed2=s + 7)
        for a, b in zip(out, want):
            assert a.tobytes() == b.tobytes()
    assert len({o.row_pooling_sequence.tobytes() for o in outs}) > 1
    tfgrad.raw_ops.FractionalMaxPool(**kw, seed=1, seed2=2)
    with pytest.raises(tfgrad.InvalidArgumentError, match="int64"):
        tfgrad.raw_ops.FractionalMaxPool(**kw, seed=2**63, seed2=2)
    with pytest.raises(TypeError, match="seed2"):
        tfgrad.raw_ops.FractionalMaxPool(**kw, seed=1, seed2=2.0)


def test_repeated_signature_still_runs_the_value_checks():
    shape = np.array([1, 4, 4, 1], np.int64)
    g = np.ones((1, 2, 2, 1), np.float32)
    rows = np.array([0, 2, 4], np.int64)
    for _ in range(2):
        tfgrad.raw_ops.FractionalAvgPoolGrad(orig_input_tensor_shape=shape, out_backprop=g,
                                             row_pooling_sequence=rows,
                                             col_pooling_sequence=rows)
    with pytest.raises(tfgrad.InvalidArgumentError):
        tfgrad.raw_ops.FractionalAvgPoolGrad(orig_input_tensor_shape=shape, out_backprop=g,
                                             row_pooling_sequence=np.array([0, 3, 2], np.int64),
                                             col_pooling_sequence=rows)


def test_repeated_signature_rereads_the_memory_limit(monkeypatch):
    x = np.ones(1000, np.float32)
    for _ in range(2):
        tfgrad.raw_ops.FakeQuantWithMinMaxArgs(inputs=x)
    monkeypatch.setenv("TFGRAD_MAX_BYTES", "1000")
    with pytest.raises(tfgrad.ResourceLimitError, match="more than the 1000 bytes"):
        tfgrad.raw_ops.FakeQuantWithMinMaxArgs(inputs=x)
    monkeypatch.delenv("TFGRAD_MAX_BYTES")
    # checks that read the available memory are never cached
    x = np.ones(1001, np.float32)  # (a new signature)
    calls = []
    monkeypatch.setattr(_validate, "_ALWAYS_ALLOWED", 0)
    monkeypatch.setattr(_validate, "memory_limit_bytes", lambda: calls.append(1) or 1 << 40)
    for n in (1, 2, 3):
        tfgrad.raw_ops.FakeQuantWithMinMaxArgs(inputs=x)
        assert len(calls) == n
    monkeypatch.setattr(_validate, "memory_limit_bytes", lambda: 100)
    with pytest.raises(tfgrad.ResourceLimitError):
        tfgrad.raw_ops.FakeQuantWithMinMaxArgs(inputs=x)


def test_converted_inputs_are_not_cached_and_still_convert():
    from tfgrad import _api

    _api._CACHE.clear()
    x64 = np.linspace(-1, 1, 8)
    a = tfgrad.raw_ops.FakeQuantWithMinMaxArgs(inputs=x64)
    b = tfgrad.raw_ops.FakeQuantWithMinMaxArgs(inputs=list(x64))
    assert a.dtype == b.dtype == np.float32 and a.tobytes() == b.tobytes()
    assert len(_api._CACHE) == 0


@pytest.mark.parametrize("op_name", sorted(_gradients.GRADIENTS))
def test_gradient_steps_resolve_the_table(op_name):
    """_gradients.steps (what every adapter's backward runs) names, for each value of the
    attrs that choose the calls, the table's calls with positions that point at the
    names the table gives, and the gradient op's attrs: fixed, else the forward's."""
    op = OPS[op_name]
    ins, outs = [i.name for i in op.inputs], [o.name for o in op.outputs]
    table = _gradients.GRADIENTS[op_name]
    when = sorted({k for c in table for k in c.when})
    values = {k: sorted({c.when[k] for c in table if k in c.when}, key=repr) for k in when}
    for combo in product(*(values[k] for k in when)):
        attrs = {a.name: ("A", a.name) for a in op.attrs} | dict(zip(when, combo))
        steps = _gradients.steps(op_name, attrs)
        assert [s.op for s in steps] == [c.op for c in _gradients.calls(op_name, attrs)]
        assert steps is _gradients.steps(op_name, attrs)  # (worked out once)
        for step, c in zip(steps, _gradients.calls(op_name, attrs)):
            assert [(a, k, n) for a, k, n, _ in step.sources] == [
                (a, f.kind, f.name) for a, f in c.args.items()]
            for _, kind, name, pos in step.sources:
                assert (outs if kind in ("grad", "output") else ins)[pos] == name
            grad_outs = [o.name for o in OPS[c.op].outputs]
            assert [(k, ins[p], grad_outs[r]) for k, p, r in step.gives] == [
                (k, k, o) for k, o in c.gives.items()]
            assert step.call_attrs(attrs) == {
                a.name: c.fixed.get(a.name, attrs.get(a.name)) for a in OPS[c.op].attrs}
