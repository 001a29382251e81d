"""The portable torch and native JAX depthwise convolution against tfgrad's exact kernels.

Every case of tests/cases/depthwise_conv.py, with its own inputs and fresh ones, runs
through ``tfgrad.torch._portable.depthwise_conv`` (CPU) and
``tfgrad.jax._native.depthwise_conv`` (CPU, jitted); each output must lie within the
module's BOUNDS of ``tfgrad.raw_ops`` (NaN and inf positions exact). The sums are also
held elementwise to a bound that does not depend on cancellation: a few units of
rounding of the sum of their terms' magnitudes (which catches an error in a small
element that the output-wide ulps would hide). The other formulations (the gather for
huge geometry; JAX's convolutions, which accelerators run) are checked on the cases
that exercise them, and mutants (padding off by one, channels or dilations mixed up,
the padding's NaNs dropped) must fail.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import tfgrad
from tests import portable
from tests.cases import Case
from tests.cases import depthwise_conv as cases
from tfgrad import _distance, raw_ops

FWD, BI, BF = cases.FWD, cases.BI, cases.BF
OPS = (FWD, BI, BF)
DTYPES = ("float32", "float64", "float16", "bfloat16")
SEEDS = (None, 1001, 1002)  # the case's own inputs, then fresh ones
UNIT = {"float64": 2.0**-53, "float32": 2.0**-24, "float16": 2.0**-11, "bfloat16": 2.0**-8}
TERMS = 8  # measured: |got - want| <= 5.3 u sum|terms| over the cases and 8 seeds


def _runner(framework: str) -> Any:
    return portable.runner(framework, "depthwise_conv")


@pytest.fixture(params=["torch", "jax"])
def impl(request: pytest.FixtureRequest) -> Any:
    return _runner(request.param)


_patched, _split = portable.patched, portable.split


def _terms(op: str, kwargs: dict[str, Any]) -> np.ndarray:
    """sum(|terms|) of each output element: the op on the inputs' magnitudes, float64."""
    mags = {k: np.abs(v.astype(np.float64)) if isinstance(v, np.ndarray) and
            v.dtype.kind in "fV" else v for k, v in kwargs.items()}
    with tfgrad.use_impl("reference"):  # (the same bits as the kernels)
        return getattr(raw_ops, op)(**mags)


def _violations(mod: Any, op: str, kwargs: dict[str, Any], got: np.ndarray,
                want: np.ndarray) -> list[str]:
    """What lies outside the bounds (BOUNDS, and TERMS units of the terms' rounding)."""
    bound = mod.BOUNDS[op]["output"][str(want.dtype)]
    d = _distance.distance(got, want)
    if not (_distance.bit_identical(got, want) if bound == 0 else d <= bound):
        return [f"distance {d} > {bound}"]
    terms = _terms(op, kwargs)
    with np.errstate(invalid="ignore"):
        diff = np.abs(got.astype(np.float64) - want.astype(np.float64))
    ok = np.isfinite(diff) & np.isfinite(terms)
    limit = TERMS * UNIT[str(want.dtype)] * terms[ok]
    if (diff[ok] > limit).any():
        return [f"{(diff[ok] / limit * TERMS).max():.3g} u sum|terms| > {TERMS}"]
    return []


def _run_case(impl: Any, case: Case, seeds: tuple = SEEDS, **change: Any) -> list[str]:
    """Violations of ``case`` over ``seeds``; ``change`` replaces attrs in the
    implementation's call only (a mutant's arguments)."""
    return portable.run_case(impl, case, seeds, lambda kw, arrays, attrs, got, want:
                             _violations(impl.mod, case.op, kw, got[0], want[0]),
                             split=_split, change=change)


def _cases(*names: str, ops: tuple[str, ...] = OPS) -> list[Case]:
    """The cases whose name (without the dtype) is among ``names``."""
    return [c for c in cases.CASES if c.name.split("/")[0] in names and c.op in ops]


# --------------------------------------------------------------------------------------
# The case table
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize("case", cases.CASES, ids=lambda c: c.id)
def test_within_bounds(impl: Any, case: Case) -> None:
    assert not _run_case(impl, case)


_GATHER = ("same_3x3", "explicit_3x2_s2_m3", "m9_same", "m17_s2", "batch5_4x4",
           "nchw_same_s2_m2", "dilation_3x2_valid_m2", "dilation2_s2_explicit",
           "nchw_dilation2_m3", "inf_filter", "inf_filter_m9", "inf_grad_4x4",
           "explicit_s3_large_pads")


@pytest.mark.parametrize("case", _cases(*_GATHER), ids=lambda c: c.id)
def test_gather_within_bounds(impl: Any, case: Case) -> None:
    """The formulation for huge geometry, forced on ordinary cases."""
    with _patched(impl, use_grouped_conv=lambda *a: False):
        assert not _run_case(impl, case, (None,))


_CONV = ("same_3x3", "valid_5x5_s2_m2", "explicit_3x2_s2_m3", "same_odd_pad_s2", "m8_7x7",
         "m17_s2", "batch6_3x3", "nchw_same_s2_m2", "nchw_explicit", "dilation2_same",
         "dilation_3x2_valid_m2", "dilation2_s2_explicit", "nchw_dilation2_m3", "inf_filter",
         "inf_filter_m9", "inf_grad_3x3", "explicit_s3_large_pads", "stride4_gt_filter_2x2")


@pytest.mark.parametrize("case", _cases(*_CONV), ids=lambda c: c.id)
def test_jax_convolutions_within_bounds(case: Case) -> None:
    """XLA's grouped convolutions, which JAX runs off the CPU (XLA:CPU gets the tap-by-tap
    slices), checked here on the CPU."""
    jx = _runner("jax")
    with _patched(jx, _CPU_SLICES=False):
        assert not _run_case(jx, case, (None,))


def _huge_calls() -> Iterator[tuple[str, str, dict[str, Any]]]:
    """Dilations and explicit paddings far beyond the input (the gather's territory)."""
    rng = np.random.default_rng(5)
    for C, M in ((3, 1), (4, 2)):
        x = rng.standard_normal((2, 2, 5, C)).astype(np.float32)
        w = rng.standard_normal((3, 3, C, M)).astype(np.float32)
        w[0, 1, 0, 0] = np.inf  # (a tap that only ever reads the padding: NaN there)
        g = rng.standard_normal((2, 2, 5, C * M)).astype(np.float32)
        g[1, 1, 3, 0] = np.inf
        for d in (10**12, 6 * 10**12, 2**31, 2**62 - 1):
            a = {"strides": [1, 1, 1, 1], "padding": "SAME", "dilations": [1, d, 1, 1]}
            yield FWD, f"C{C} M{M} d{d}", {"input": x, "filter": w, **a}
            yield BI, f"C{C} M{M} d{d}", {"input_sizes": np.array(x.shape, np.int32),
                                          "filter": w, "out_backprop": g, **a}
            yield BF, f"C{C} M{M} d{d}", {"input": x, "filter_sizes":
                                          np.array(w.shape, np.int32), "out_backprop": g, **a}
    x = rng.standard_normal((1, 5, 4, 2)).astype(np.float32)
    w = rng.standard_normal((3, 2, 2, 1)).astype(np.float32)
    for pads, s in (((10**12, 10**12, 1, 0), 10**12), ((10**12, 0, 0, 0), 10**12 + 7),
                    ((10**15, 3, 2, 2), 3 * 10**14)):
        a = {"strides": [1, s, s, 1], "padding": "EXPLICIT",
             "explicit_paddings": [0, 0, *pads, 0, 0]}
        with tfgrad.use_impl("reference"):
            y = raw_ops.DepthwiseConv2dNative(input=x, filter=w, **a)
        g = rng.standard_normal(y.shape).astype(np.float32)
        yield FWD, f"pads {pads}", {"input": x, "filter": w, **a}
        yield BI, f"pads {pads}", {"input_sizes": np.array(x.shape, np.int32), "filter": w,
                                   "out_backprop": g, **a}
        yield BF, f"pads {pads}", {"input": x, "filter_sizes": np.array(w.shape, np.int32),
                                   "out_backprop": g, **a}
    a = {"strides": [1, 1, 1, 1], "padding": "EXPLICIT",  # every tap in the padding
         "explicit_paddings": [0, 0, 2, 1, 0, 0, 0, 0]}
    yield FWD, "empty rows", {"input": np.zeros((1, 0, 3, 2), np.float32), "filter": w, **a}


def _huge_violations(impl: Any) -> dict[str, list[str]]:
    bad: dict[str, list[str]] = {op: [] for op in OPS}
    for op, name, kwargs in _huge_calls():
        arrays, static = _split(op, kwargs)
        (got,) = impl(op, arrays, static)
        with tfgrad.use_impl("reference"):  # (the kernels' forward takes memory in
            want = np.asarray(getattr(raw_ops, op)(**kwargs))  # proportion to a stride)
        bad[op] += [f"{name}: {b}" for b in _violations(impl.mod, op, kwargs, got, want)]
    return bad


def test_huge_geometry_within_bounds(impl: Any) -> None:
    """The NumPy op takes dilations like 10**12 in bounded memory; so must these."""
    assert not any(_huge_violations(impl).values())


def test_empty_sums_are_zeros(impl: Any) -> None:
    """Where TF leaves the output uninitialised (BackpropFilter with batch 0,
    BackpropInput with multiplier 0) the exact kernels return zeros: so do these."""
    a = {"strides": (1, 1, 1, 1), "padding": "SAME", "explicit_paddings": (),
         "data_format": "NHWC", "dilations": (1, 1, 1, 1)}
    (dw,) = impl(BF, {"input": np.zeros((0, 4, 5, 2), np.float16),
                   "out_backprop": np.zeros((0, 4, 5, 2), np.float16)},
              {"filter_sizes": (3, 3, 2, 1), **a})
    assert dw.shape == (3, 3, 2, 1) and dw.dtype == np.float16 and not dw.any()
    (dx,) = impl(BI, {"filter": np.ones((2, 2, 2, 0), np.float32),
                   "out_backprop": np.ones((1, 3, 3, 0), np.float32)},
              {"input_sizes": (1, 3, 3, 2), **a})
    assert dx.shape == (1, 3, 3, 2) and dx.dtype == np.float32 and not dx.any()


# --------------------------------------------------------------------------------------
# The bounds matter
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_bounds_declared(framework: str) -> None:
    """Every op and dtype has a bound, small enough that one tap's worth of error (O(1)
    relative to the output) is far outside it."""
    mod = _runner(framework).mod
    for op in OPS:
        assert sorted(mod.BOUNDS[op]) == ["output"]
        assert sorted(mod.BOUNDS[op]["output"]) == sorted(DTYPES)
        for dt, b in mod.BOUNDS[op]["output"].items():
            assert 0 < b <= 64, (op, dt, b)
    assert set(mod.NOTES) <= set(OPS)


def _shift_padding(axes: Any) -> Any:
    """axes() with the padding before one larger: every window one row / column up."""
    def mutant(*args: Any, **kwargs: Any) -> Any:
        return tuple(dataclasses.replace(ax, p=ax.p + 1) for ax in axes(*args, **kwargs))
    return mutant


def test_padding_off_by_one_fails(impl: Any) -> None:
    """SAME's odd pad put before instead of after (the window one row up) is caught."""
    with _patched(impl, axes=_shift_padding(impl.mod.axes)):
        for case in _cases("same_odd_pad_2x2"):
            assert _run_case(impl, case, (None,)), case.id


def test_dilations_ignored_fails(impl: Any) -> None:
    """TF's CPU backprops ignore dilations; the bounds tell that result from tfgrad's."""
    for case in _cases("dilation2_same", ops=(BI, BF)):
        assert _run_case(impl, case, (None,), dilations=(1, 1, 1, 1)), case.id


def test_channel_order_matters(impl: Any) -> None:
    """Output channel k * M + q (not q * C + k): the transposed order is caught."""
    case = _cases("explicit_3x2_s2_m3", ops=(FWD,))[0]
    kwargs = case.kwargs()
    arrays, static = _split(FWD, kwargs)
    (got,) = impl(FWD, arrays, static)
    C, M = kwargs["filter"].shape[2:]
    mixed = got.reshape(*got.shape[:3], C, M).swapaxes(3, 4).reshape(got.shape)
    want = np.asarray(raw_ops.DepthwiseConv2dNative(**kwargs))
    assert not _violations(impl.mod, FWD, kwargs, got, want)
    assert _violations(impl.mod, FWD, kwargs, mixed, want)


def test_padding_nans_needed(impl: Any) -> None:
    """Without the mask, an inf factor of a tap over the padding (a missed BackpropInput
    tap; g * 0 in BackpropFilter) would not always give TF's NaN: each op has a case
    that tells (where the backend does not compute the padding's products itself)."""
    with _patched(impl, _with_nans=lambda y, *a: y):
        caught = {op for op, bad in _huge_violations(impl).items() if bad}
        caught |= {c.op for c in _cases("inf_filter", "inf_filter_m9", "inf_grad_3x3")
                   if _run_case(impl, c, (None,))}
    assert caught == set(OPS)
