"""The portable torch and native JAX fake quantization against tfgrad's exact kernels.

Every case of tfgrad/testing/cases/fake_quant.py, with its own inputs and fresh ones, runs through
``tfgrad.torch._portable.fake_quant`` (CPU) and ``tfgrad.jax._native.fake_quant`` (CPU,
jitted); each output must lie within the module's BOUNDS of ``tfgrad.raw_ops`` (0:
bit-identical). The min/max gradient sums, summed in another order than Eigen's, are also
held to a bound that does not depend on cancellation: a few units of float32 rounding of
the sum of their terms' magnitudes.
"""

from __future__ import annotations

import importlib
from typing import Any

import numpy as np
import pytest

from tests import portable
from tests.cases import Case
from tests.cases import fake_quant as cases
from tfgrad import _distance
from tfgrad._opdefs import get_op_def
from tfgrad.ops import fake_quant as fq

SEEDS = (None, 1001, 1002)  # the case's own inputs, then fresh ones
U = 2.0**-24  # float32 unit roundoff
SUM_ROUNDING = 4  # measured: at most 2.4 U * sum(|terms|) (torch, JAX; the cases, 40+ seeds)


def _runner(framework: str) -> Any:
    return portable.runner(framework, "fake_quant")


@pytest.fixture(params=["torch", "jax"])
def impl(request: pytest.FixtureRequest) -> Any:
    return _runner(request.param)


_split, _exact = portable.split, portable.exact


# --------------------------------------------------------------------------------------
# The checks
# --------------------------------------------------------------------------------------
def _sum_terms(op: str, arrays: dict[str, np.ndarray], attrs: dict[str, Any]
               ) -> tuple[np.ndarray, np.ndarray]:
    """sum(|terms|) of backprop_wrt_min and ..._max (per channel for PerChannel)."""
    x, g = fq.ftz(arrays["inputs"]), fq.ftz(arrays["gradients"])
    p = fq.nudge(arrays["min"], arrays["max"], attrs["num_bits"], attrs["narrow_range"])
    d = x.shape[-1] if "PerChannel" in op else 1
    x, g = x.reshape(-1, d) if d else x.reshape(0, 0), g.reshape(-1, d) if d else g.reshape(0, 0)
    with np.errstate(invalid="ignore"):
        below = np.abs(np.where(x < p.nmin, g, 0)).astype(np.float64).sum(0)
        above = np.abs(np.where(x > p.nmax, g, 0)).astype(np.float64).sum(0)
    return below.reshape(p.nmin.shape), above.reshape(p.nmax.shape)


def _violations(mod: Any, op: str, arrays: dict[str, np.ndarray], attrs: dict[str, Any],
                got: tuple[np.ndarray, ...], want: tuple[np.ndarray, ...]) -> list[str]:
    """What lies outside the bounds (BOUNDS, and the sums' rounding bound)."""
    bad = []
    names = [o.name for o in get_op_def(op).outputs]
    for name, a, e in zip(names, got, want, strict=True):
        bound = mod.BOUNDS[op][name][str(e.dtype)]
        ok = _distance.bit_identical(a, e) if bound == 0 else _distance.distance(a, e) <= bound
        if not ok:
            bad.append(f"{name}: distance {_distance.distance(a, e)} > {bound}")
    if op.startswith("FakeQuantWithMinMaxVars") and op.endswith("Gradient"):
        for name, terms, a, e in zip(names[1:], _sum_terms(op, arrays, attrs), got[1:],
                                     want[1:], strict=True):
            with np.errstate(invalid="ignore"):
                diff = np.abs(a.astype(np.float64) - e.astype(np.float64))
            finite = np.isfinite(diff)
            if (diff[finite] > SUM_ROUNDING * U * terms[finite]).any():
                bad.append(f"{name}: {diff.max()} > {SUM_ROUNDING} U sum|terms|")
    return bad


def _run_case(impl: Any, case: Case, seeds: tuple = SEEDS) -> list[str]:
    return portable.run_case(impl, case, seeds, lambda kw, arrays, attrs, got, want:
                             _violations(impl.mod, case.op, arrays, attrs, got, want),
                             split=_split, exact=_exact)


@pytest.mark.parametrize("case", cases.CASES, ids=lambda c: c.id)
def test_within_bounds(impl: Any, case: Case) -> None:
    assert not _run_case(impl, case)


# --------------------------------------------------------------------------------------
# The bounds matter
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_bounds_declared(framework: str) -> None:
    """Every output of every op has a bound; the forward and input gradients are exact."""
    pytest.importorskip(framework)
    mod = importlib.import_module(
        f"tfgrad.{'torch._portable' if framework == 'torch' else 'jax._native'}.fake_quant")
    for op in {c.op for c in cases.CASES}:
        outs = [o.name for o in get_op_def(op).outputs]
        assert sorted(mod.BOUNDS[op]) == sorted(outs)
        assert mod.BOUNDS[op][outs[0]] == {"float32": 0}, op


def _case(op: str, name: str) -> Case:
    return next(c for c in cases.CASES if c.op == op and c.name == name)


def test_one_step_off_fails(impl: Any) -> None:
    """A result one grid step, one mask element or one summed term off is caught."""
    op = "FakeQuantWithMinMaxVarsPerChannelGradient"
    kwargs = _case(op, "rank2").kwargs()
    arrays, attrs = _split(op, kwargs)
    want = _exact(op, kwargs)
    got = impl(op, arrays, attrs)
    assert not _violations(impl.mod, op, arrays, attrs, got, want)
    g, x = arrays["gradients"], arrays["inputs"]
    p = fq.nudge(arrays["min"], arrays["max"], attrs["num_bits"], attrs["narrow_range"])
    inside = np.argwhere((x >= p.nmin) & (x <= p.nmax) & (np.abs(g) > 1e-30))[0]
    dx = got[0].copy()
    dx[tuple(inside)] = 0  # one element dropped from the mask
    assert _violations(impl.mod, op, arrays, attrs, (dx,) + got[1:], want)
    below = np.argwhere((x < p.nmin) & (np.abs(g) > 1e-30))[0]
    dmin = got[1].copy()
    dmin[below[-1]] -= g[tuple(below)]  # one term left out of the sum
    assert _violations(impl.mod, op, arrays, attrs, (got[0], dmin, got[2]), want)

    fwd = "FakeQuantWithMinMaxVarsPerChannel"
    kwargs = _case(fwd, "rank2").kwargs()
    arrays, attrs = _split(fwd, kwargs)
    out = impl(fwd, arrays, attrs)[0].copy()
    p = fq.nudge(arrays["min"], arrays["max"], attrs["num_bits"], attrs["narrow_range"])
    out[0, 7] += p.scale[7]  # one grid step
    assert _violations(impl.mod, fwd, arrays, attrs, (out,), _exact(fwd, kwargs))


def _detected(impl: Any, mutant: dict[str, Any], ops: tuple[str, ...]) -> bool:
    """Whether the case table catches the module with some helpers replaced."""
    saved = {k: getattr(impl.mod, k) for k in mutant}
    try:
        for k, v in mutant.items():
            setattr(impl.mod, k, v)
        if hasattr(impl, "jitted"):
            impl.jitted.clear()
        return any(_run_case(impl, c, (None,)) for c in cases.CASES if c.op in ops)
    finally:
        for k, v in saved.items():
            setattr(impl.mod, k, v)
        if hasattr(impl, "jitted"):
            impl.jitted.clear()


def test_ftz_is_needed() -> None:
    """Without flushing denormals (TF's FTZ / DAZ) the case table sees a difference. (Not
    for JAX on the CPU: XLA:CPU runs with FTZ / DAZ itself.)"""
    assert _detected(_runner("torch"), {"_ftz": lambda v: v},
                     ("FakeQuantWithMinMaxArgsGradient", "FakeQuantWithMinMaxVars"))


def test_xla_rounding_guards_are_needed() -> None:
    """XLA contracts multiply-adds into FMAs, reassociates constants and divides by a
    constant as a multiplication: without the guards the forward loses bit-identity."""
    runner = _runner("jax")
    for mutant, op in (({"_r": lambda v: v}, "FakeQuantWithMinMaxArgs"),
                       ({"_div": lambda a, b: a / b}, "FakeQuantWithMinMaxVars")):
        assert _detected(runner, mutant, (op,)), mutant




@pytest.mark.parametrize("op", ["FakeQuantWithMinMaxVars", "FakeQuantWithMinMaxVarsPerChannel"])
def test_constant_ranges_under_jit(op: str) -> None:
    """min/max that XLA folds into constants (closed over by the caller's jit) keep the
    bits: no division turns into a multiplication by a reciprocal."""
    jax = pytest.importorskip("jax")
    mod = _runner("jax").mod
    names = {"default", "bits5_narrow", "positive_range", "min_above_max", "zero_range",
             "rank2", "rank4", "many_channels"}
    for case in (c for c in cases.CASES if c.op == op and c.name in names):
        kwargs = case.kwargs()
        arrays, attrs = _split(op, kwargs)
        fn = jax.jit(lambda x, a=arrays, at=attrs: getattr(mod, op)(
            inputs=x, min=a["min"], max=a["max"], **at))
        assert _distance.bit_identical(np.asarray(fn(arrays["inputs"])),
                                       _exact(op, kwargs)[0]), case.id
