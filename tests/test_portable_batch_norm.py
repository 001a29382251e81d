"""The portable torch and native JAX batch norm against tfgrad's exact kernels.

Every case of tfgrad/testing/cases/batch_norm.py, with its own inputs and fresh ones, runs through
``tfgrad.torch._portable.batch_norm`` (CPU) and ``tfgrad.jax._native.batch_norm`` (CPU,
jitted); each output must lie within the module's BOUNDS of ``tfgrad.raw_ops``, and within
a tight bound where no output cancels to rounding noise. The gradient ops' own derivatives
(LINEARISED: TF's ``_FusedBatchNormGradGrad``) must agree with TF's composite
``_BatchNormGrad`` in torch (``tfgrad.torch._composite``).
"""

from __future__ import annotations

import functools
import zlib
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from tests import portable
from tests.cases import Case
from tests.cases import batch_norm as cases
from tfgrad import _distance, raw_ops
from tfgrad._opdefs import get_op_def

SEEDS = (None, 1001, 1002)  # the case's own inputs, then fresh ones
# Cases where an output is rounding noise: R = 2 (x_backprop) and C = 1 (the sums of one
# channel, which may cancel); elsewhere every output is within TIGHT.
CANCELLING = {"FusedBatchNormGradV3/R2", "FusedBatchNormGradV3/C1"}
TIGHT = {"float32": 16, "float16": 1, "bfloat16": 1}


def _runner(framework: str) -> Any:
    return portable.runner(framework, "batch_norm")


@pytest.fixture(params=["torch", "jax"])
def impl(request: pytest.FixtureRequest) -> Any:
    return _runner(request.param)


def _violations(impl: Any, case: Case, seeds: tuple = SEEDS) -> list[str]:
    """What lies outside BOUNDS (and outside TIGHT, unless the case cancels)."""
    names = [o.name for o in get_op_def(case.op).outputs]
    bad = []
    for seed in seeds:
        kwargs = case.kwargs(seed)
        got = impl(case.op, *portable.split(case.op, kwargs))
        want = tuple(np.asarray(o) for o in getattr(raw_ops, case.op)(**kwargs))
        for name, a, e in zip(names, got, want, strict=True):
            dtype = str(e.dtype)
            bound = impl.mod.BOUNDS[case.op][name][dtype]
            if case.id not in CANCELLING:
                bound = min(bound, TIGHT[dtype])
            if bound == 0 and not _distance.bit_identical(a, e):
                bad.append(f"seed {seed}: {name} not bit-identical")
            elif bound and not _distance.distance(a, e) <= bound:
                bad.append(f"seed {seed}: {name} {_distance.distance(a, e)} > {bound}")
    return bad


@pytest.mark.parametrize("case", cases.CASES, ids=lambda c: c.id)
def test_within_bounds(impl: Any, case: Case) -> None:
    assert not _violations(impl, case)


@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_bounds_declared(framework: str) -> None:
    """Every output of every op has a bound for each dtype it comes in."""
    mod = _runner(framework).mod
    for op in {c.op for c in cases.CASES}:
        d = get_op_def(op)
        assert sorted(mod.BOUNDS[op]) == sorted(o.name for o in d.outputs), op
        assert set(mod.BOUNDS[op][d.outputs[0].name]) == set(d.type_attr("T").allowed), op


def test_inaccurate_rsqrt_is_caught(impl: Any) -> None:
    """An rsqrt 64 float32 ulps off (the tight bound's reach) fails the case table."""
    saved = impl.mod._rsqrt
    impl.mod._rsqrt = lambda v: saved(v) * np.float32(1 + 2.0**-17)
    if hasattr(impl, "jitted"):
        impl.jitted.clear()
    try:
        for op in ("FusedBatchNormV3", "FusedBatchNormGradV3"):
            case = next(c for c in cases.CASES if c.op == op and c.name.startswith("float32_NHWC"))
            assert _violations(impl, case, (None,)), op
    finally:
        impl.mod._rsqrt = saved
        if hasattr(impl, "jitted"):
            impl.jitted.clear()


# --------------------------------------------------------------------------------------
# Second derivatives (the gradient ops differentiated by the framework's autodiff)
# --------------------------------------------------------------------------------------
_SHAPES = {"NHWC": (2, 3, 5, 11), "NCHW": (2, 11, 3, 5), "NDHWC": (2, 2, 3, 2, 7),
           "NCDHW": (2, 7, 2, 3, 2)}
SECOND_ORDER = 8  # distance from the composite's (float32 rounding of both; max seen 3)


def _second_order_inputs(data_format: str, dtype: Any, training: bool
                         ) -> tuple[dict[str, np.ndarray], dict[str, Any], tuple]:
    rng = np.random.default_rng(zlib.crc32(f"{data_format}{np.dtype(dtype)}{training}".encode()))
    shape = _SHAPES[data_format]
    c = shape[1] if data_format.startswith("NC") else shape[-1]
    axes = tuple(d for d in range(len(shape)) if d != (1 if data_format.startswith("NC")
                                                       else len(shape) - 1))
    x = (rng.standard_normal(shape) * 2 + 0.5).astype(dtype)
    if training:  # the forward's batch statistics
        x32 = x.astype(np.float64)
        mean, var = x32.mean(axes).astype(np.float32), x32.var(axes).astype(np.float32)
    else:
        mean = rng.standard_normal(c).astype(np.float32)
        var = (rng.random(c) + 0.25).astype(np.float32)
    arrays = dict(y_backprop=rng.standard_normal(shape).astype(dtype), x=x,
                  scale=rng.standard_normal(c).astype(np.float32), reserve_space_1=mean,
                  reserve_space_2=var, reserve_space_3=np.zeros(0, np.float32))
    attrs = dict(epsilon=1e-3, data_format=data_format, is_training=training)
    cots = (rng.standard_normal(shape).astype(dtype), rng.standard_normal(c).astype(np.float32),
            rng.standard_normal(c).astype(np.float32))
    return arrays, attrs, cots


def _composite_vjp(arrays: dict[str, np.ndarray], attrs: dict[str, Any], cots: tuple
                   ) -> tuple[np.ndarray, ...]:
    """The vjp of TF's _BatchNormGrad (what _FusedBatchNormGradGrad returns)."""
    t = _runner("torch")
    torch = t.torch
    try:
        from tfgrad.torch._composite import _bn_grad_composite
    except ImportError:  # (before the torch adapter's split into modules)
        from tfgrad.torch import _bn_grad_composite  # type: ignore[attr-defined,no-redef]
    leaves = [t.tensor(arrays[k]).requires_grad_() for k in ("y_backprop", "x", "scale")]
    outs = _bn_grad_composite(*leaves, t.tensor(arrays["reserve_space_1"]),
                              t.tensor(arrays["reserve_space_2"]), attrs["epsilon"],
                              attrs["data_format"], attrs["is_training"])
    return tuple(t.array(g) for g in torch.autograd.grad(outs, leaves,
                                                         [t.tensor(c) for c in cots]))


def _portable_vjp(framework: str, arrays: dict[str, np.ndarray], attrs: dict[str, Any],
                  cots: tuple) -> tuple[np.ndarray, ...]:
    impl = _runner(framework)
    fn = functools.partial(impl.mod.FusedBatchNormGradV3, **attrs)
    diff = ("y_backprop", "x", "scale")
    rest = {k: v for k, v in arrays.items() if k not in diff}
    if framework == "torch":
        torch = impl.torch
        leaves = [impl.tensor(arrays[k]).requires_grad_() for k in diff]
        outs = fn(**dict(zip(diff, leaves)), **{k: impl.tensor(v) for k, v in rest.items()})
        grads = torch.autograd.grad(outs[:3], leaves, [impl.tensor(c) for c in cots])
        return tuple(impl.array(g) for g in grads)
    jax = impl.jax

    @jax.jit
    def vjp(primals: tuple, cotangents: tuple) -> tuple:
        _, pullback = jax.vjp(lambda *p: fn(**dict(zip(diff, p)), **rest)[:3], *primals)
        return pullback(cotangents)

    return tuple(np.asarray(g) for g in vjp(tuple(arrays[k] for k in diff), cots))


_SECOND_ORDER_CONFIGS = [(fmt, np.float32, training) for fmt in _SHAPES
                         for training in (True, False)] + [
    ("NHWC", np.float16, True), ("NCHW", ml_dtypes.bfloat16, False)]


@pytest.mark.parametrize("framework", ["torch", "jax"])
@pytest.mark.parametrize("config", _SECOND_ORDER_CONFIGS,
                         ids=lambda c: f"{c[0]}-{np.dtype(c[1]).name}-{'train' * c[2] or 'infer'}")
def test_second_derivative_matches_composite(framework: str, config: tuple) -> None:
    _runner("torch")  # the composite is in torch
    arrays, attrs, cots = _second_order_inputs(*config)
    want = _composite_vjp(arrays, attrs, cots)
    got = _portable_vjp(framework, arrays, attrs, cots)
    for name, a, e in zip(("y_backprop", "x", "scale"), got, want, strict=True):
        assert _distance.distance(a, e) <= SECOND_ORDER, name


@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_second_derivative_needs_the_batch_statistics(framework: str) -> None:
    """Training: TF's composite differentiates the batch mean and variance it recomputes
    from x; with the saved statistics held constant the derivative to x is far off."""
    impl = _runner(framework)
    _runner("torch")
    arrays, attrs, cots = _second_order_inputs("NHWC", np.float32, True)
    want = _composite_vjp(arrays, attrs, cots)
    saved = impl.mod._with_batch_stats
    impl.mod._with_batch_stats = lambda mean, var, *rest: (mean, var)
    try:
        got = _portable_vjp(framework, arrays, attrs, cots)
    finally:
        impl.mod._with_batch_stats = saved
    assert _distance.distance(got[1], want[1]) > 1000 * SECOND_ORDER


@pytest.mark.parametrize("per_channel", [4096, 65536])
def test_large_sums_within_scaled_bounds(impl: Any, per_channel: int) -> None:
    """A real layer sums thousands of values per channel (MobileNetV2 at batch 32: 8,192),
    far more than the case table's 162: outputs that sum over the batch stay within their
    bound scaled by the square root of the count (``SUM_OUTPUTS``, ``_distance.sum_bound``),
    the others within BOUNDS."""
    rng = np.random.default_rng(per_channel)
    c = 16
    x = (rng.standard_normal((per_channel, c)) * 3 + 1).astype(np.float32)
    x = x.reshape(4, per_channel // 256, 64, c)
    fwd = {"x": x, "scale": rng.standard_normal(c).astype(np.float32),
           "offset": rng.standard_normal(c).astype(np.float32),
           "mean": np.zeros(0, np.float32), "variance": np.zeros(0, np.float32),
           "is_training": True}
    want = raw_ops.FusedBatchNormV3(**fwd)
    grad = {"y_backprop": rng.standard_normal(x.shape).astype(np.float32), "x": x,
            "scale": fwd["scale"], "reserve_space_1": want[3], "reserve_space_2": want[4],
            "reserve_space_3": want[5], "is_training": True}
    bad = []
    for op, kwargs, exact in (("FusedBatchNormV3", fwd, want),
                              ("FusedBatchNormGradV3", grad, raw_ops.FusedBatchNormGradV3(**grad))):
        got = impl(op, *portable.split(op, kwargs))
        for o, a, e in zip(get_op_def(op).outputs, got, exact, strict=True):
            bound = impl.mod.BOUNDS[op][o.name]["float32"]
            if o.name in impl.mod.SUM_OUTPUTS:
                bound = _distance.sum_bound(bound, per_channel, impl.mod.BOUNDS_COUNT)
            d = _distance.distance(np.asarray(a), np.asarray(e))
            if bound == 0 and not _distance.bit_identical(np.asarray(a), np.asarray(e)):
                bad.append(f"{op} {o.name} not bit-identical")
            elif bound and not d <= bound:
                bad.append(f"{op} {o.name}: {d} > {bound}")
    assert not bad
