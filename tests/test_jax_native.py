"""tfgrad.jax's native implementation against the exact kernels, through the adapter.

Every case of the op table (tests/cases) runs through ``tfgrad.jax.raw_ops.<Op>`` under
``jax.jit`` and ``use_impl("native")`` (jax_enable_x64 on, for the float64 and int64
cases); each output must be within its family module's ``BOUNDS``
(``tfgrad.jax._native.<family>``: 0 is bit-identical) of ``tfgrad.raw_ops.<Op>``, and
have its dtype and shape. The family tests (tests/test_portable_*.py) measure the same
distances on the modules directly, with fresh random inputs; this one checks the wiring:
argument passing, attrs, shape inputs and output dtypes for every op and case, and the
fence around each op: inside a caller's jit (its inputs the caller's products, its outputs
added to) an op keeps the bits it has alone, with no FMA contracted across its boundary.
"""

from __future__ import annotations

import importlib
import importlib.util

import numpy as np
import pytest

jax = pytest.importorskip("jax", reason="JAX is not installed (pip install tfgrad[jax])")

import tfgrad  # noqa: E402
import tfgrad.jax as tj  # noqa: E402
from tests.cases import CASES  # noqa: E402
from tfgrad import _distance, _validate, raw_ops  # noqa: E402


def _native_module(family: str):
    name = f"tfgrad.jax._native.{family}"
    return importlib.import_module(name) if importlib.util.find_spec(name) else None


def _split(op: tfgrad.OpDef, kwargs: dict) -> tuple[dict, dict]:
    """(array operands in the op's dtypes, everything else) of a case's arguments. The
    adapter casts nothing, so inputs are converted as tfgrad's NumPy binding does."""
    bound = _validate.bind(op, kwargs)
    arrays = {i.name: bound[i.name] for i in op.inputs if not i.is_shape}
    rest = {k: v for k, v in kwargs.items() if k not in arrays}
    return arrays, rest


def check_outputs(op_name: str, got, want, bounds: dict, what: str = "") -> None:
    op = tfgrad.get_op_def(op_name)
    gots = got if isinstance(got, tuple) else (got,)
    wants = want if isinstance(want, tuple) else (want,)
    for o, g, w in zip(op.outputs, gots, wants):
        g, w = np.asarray(g), np.asarray(w)
        dt = _validate.dtype_name(w.dtype)
        assert (g.shape, g.dtype) == (w.shape, w.dtype), (what, o.name)
        bound = bounds[op_name][o.name][dt]
        if bound == 0:
            assert _distance.bit_identical(g, w), (what, o.name, _distance.distance(g, w))
        else:
            assert _distance.distance(g, w) <= bound, (what, o.name, _distance.distance(g, w))


@pytest.fixture(scope="module")
def x64():
    with jax.enable_x64(True):
        yield


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_native_matches_exact(case, x64):
    op = tfgrad.get_op_def(case.op)
    module = _native_module(op.family)
    if module is None:
        pytest.skip(f"no native implementation of {op.family} yet")
    kwargs = case.kwargs()
    arrays, rest = _split(op, kwargs)
    want = getattr(raw_ops, case.op)(**kwargs)
    with tj.use_impl("native"):
        got = jax.jit(lambda a: getattr(tj.raw_ops, case.op)(**a, **rest))(arrays)
    check_outputs(case.op, got, want, module.BOUNDS, case.id)


# --------------------------------------------------------------------------------------
# Across the op's boundary
# --------------------------------------------------------------------------------------
def _boundary_calls() -> dict[str, tuple[dict, tuple[str, ...]]]:
    """op -> (arguments, the inputs the caller computes as products). Ops whose output is
    a multiply (or one that LLVM moves past a select with a uniform condition) that a
    caller's add would contract with, or whose inputs feed an add: measured (jax 0.10.2,
    100,000 elements) without the fence, 16-37% of their elements differ."""
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((200, 250)) * 4).astype(np.float32)
    shape, c = (8, 25, 25, 16), 16

    def vec(lo: float, hi: float) -> np.ndarray:
        return rng.uniform(lo, hi, c).astype(np.float32)

    xb = (rng.standard_normal(shape) * 3 + 1).astype(np.float32)
    dy = rng.standard_normal(shape).astype(np.float32)
    bn = dict(epsilon=1e-3, data_format="NHWC", is_training=False)
    return {
        "FakeQuantWithMinMaxVars": (dict(inputs=x, min=np.float32(-2.3), max=np.float32(3.1),
                                         num_bits=8, narrow_range=False), ()),
        "FusedBatchNormV3": (dict(x=xb, scale=vec(-2, 2), offset=vec(-2, 2), mean=vec(-1, 1),
                                  variance=vec(0.5, 2), exponential_avg_factor=1.0, **bn),
                             ("scale", "offset", "mean", "variance")),
        "FusedBatchNormGradV3": (dict(y_backprop=dy, x=xb, scale=vec(-2, 2),
                                      reserve_space_1=vec(-1, 1), reserve_space_2=vec(0.5, 2),
                                      reserve_space_3=np.zeros(0, np.float32), **bn),
                                 ("y_backprop", "x", "scale", "reserve_space_1",
                                  "reserve_space_2")),
    }


def _across(op_name: str) -> tuple[list, list, list]:
    """The op inside a caller's jit (its ``products`` inputs computed there as a * b, every
    float32 output added to there), the same op jitted alone on the rounded products with
    the adds in NumPy, and the exact kernels on them with the adds in NumPy."""
    kwargs, products = _boundary_calls()[op_name]
    op = tfgrad.get_op_def(op_name)
    arrays, rest = _split(op, kwargs)
    rng = np.random.default_rng(11)
    factors = {}
    for n in products:
        a = rng.uniform(0.5, 2, arrays[n].shape).astype(np.float32)
        factors[n] = (a, (arrays[n] / a).astype(np.float32))
    rounded = dict(arrays, **{n: a * b for n, (a, b) in factors.items()})
    fn = getattr(tj.raw_ops, op_name)
    with tj.use_impl("native"):
        alone = [np.asarray(o) for o in jax.jit(lambda a: tuple(fn(**a, **rest)) if len(
            op.outputs) > 1 else (fn(**a, **rest),))(rounded)]
        zs = [rng.standard_normal(o.shape).astype(np.float32) if o.dtype == np.float32
              else None for o in alone]

        def caller(arrays: dict, factors: dict, zs: list) -> list:
            out = fn(**dict(arrays, **{n: a * b for n, (a, b) in factors.items()}), **rest)
            out = tuple(out) if len(op.outputs) > 1 else (out,)
            return [o if z is None else o + z for o, z in zip(out, zs)]

        inside = [np.asarray(o) for o in jax.jit(caller)(arrays, factors, zs)]
    exact = getattr(raw_ops, op_name)(**rounded, **rest)
    exact = exact if len(op.outputs) > 1 else (exact,)
    staged = [o if z is None else o + z for o, z in zip(alone, zs)]
    return inside, staged, [np.asarray(o) if z is None else np.asarray(o) + z
                            for o, z in zip(exact, zs)]


@pytest.mark.parametrize("op_name", sorted(_boundary_calls()))
def test_no_fma_across_the_op_boundary(op_name):
    """XLA:CPU contracts a multiply and an add into an FMA wherever they meet in one fused
    loop, across the op's boundary too (optimization barriers do not stop it: they are gone
    before fusion). The fence of tfgrad.jax._primitives keeps every bit: the op inside a
    caller's jit equals the op on the caller's rounded values, and (bound 0) the exact
    kernels."""
    inside, staged, exact = _across(op_name)
    bounds = _native_module(tfgrad.get_op_def(op_name).family).BOUNDS[op_name]
    for o, got, want, tf in zip(tfgrad.get_op_def(op_name).outputs, inside, staged, exact):
        assert _distance.bit_identical(got, want), (o.name, int((got != want).sum()))
        if bounds[o.name][_validate.dtype_name(tf.dtype)] == 0:
            assert _distance.bit_identical(got, tf), o.name


@pytest.mark.parametrize("op_name", sorted(_boundary_calls()))
def test_the_boundary_fence_is_needed(op_name, monkeypatch):
    """Without the selects XLA contracts across the op's boundary (so the test above can
    fail). If this fails, XLA no longer contracts there: the fence may be dropped."""
    from tfgrad.jax import _primitives

    monkeypatch.setattr(_primitives, "_rounded", lambda v: v)
    inside, staged, _ = _across(op_name)
    assert not all(_distance.bit_identical(g, w) for g, w in zip(inside, staged))


# --------------------------------------------------------------------------------------
# Division off the CPU
# --------------------------------------------------------------------------------------
def _floats(rng: np.random.Generator, n: int, lo: int = 1, hi: int = 254) -> np.ndarray:
    """float32 values of random sign and significand, biased exponents in [lo, hi]."""
    e = rng.integers(lo, hi + 1, n).astype(np.uint32)
    m = rng.integers(0, 1 << 23, n).astype(np.uint32)
    s = rng.integers(0, 2, n).astype(np.uint32)
    return ((s << 31) | (e << 23) | m).view(np.float32)


def test_integer_division_is_ieee():
    """XLA:GPU divides float32 with PTX's div.full.f32 (up to 2 ulps off); off the CPU,
    tfgrad.jax._native._ieee.div_rn divides the operands' bits as integers. That path, run
    here on the CPU, against IEEE's quotient (NumPy's): every normal quotient of normal
    operands the same bits (across the whole exponent range, quotients near each other's
    significands, exact quotients and ties, overflow to inf); anything else (zero, inf, NaN
    or denormal operands, denormal quotients) the backend's own quotient."""
    from tfgrad.jax._native import _ieee

    rng = np.random.default_rng(3)
    n = 1 << 18
    pairs = [(_floats(rng, n), _floats(rng, n)),
             (_floats(rng, n, 110, 140), _floats(rng, n, 110, 140))]
    a = _floats(rng, n, 120, 130)
    pairs.append((a, (a.view(np.uint32) ^ np.uint32(5 << 23)).view(np.float32)))  # same m
    m = rng.integers(1, 1 << 12, (2, n))
    pairs.append(((m[0] * m[1]).astype(np.float32), m[1].astype(np.float32)))  # exact
    pairs.append((np.float32(2 ** 25 + 1) * np.ones(n, np.float32), 2 * np.ones(n, np.float32)))
    big = np.finfo(np.float32).max
    special = np.array([0, -0.0, np.inf, -np.inf, np.nan, 1e-40, -1e-39, big, 1.0, 0.5,
                        np.finfo(np.float32).tiny, 3.0], np.float32)
    pairs.append(tuple(np.meshgrid(special, special)))
    divide = jax.jit(_ieee._integer_div)
    plain = jax.jit(lambda a, b: a / b)
    for a, b in pairs:
        a, b = a.ravel(), b.ravel()
        with np.errstate(all="ignore"):
            want = a / b
        got = np.asarray(divide(a, b))
        normal = ((np.abs(a) >= np.finfo(np.float32).tiny) & np.isfinite(a)
                  & (np.abs(b) >= np.finfo(np.float32).tiny) & np.isfinite(b)
                  & (np.abs(want) >= np.finfo(np.float32).tiny))
        assert normal.sum() > 0
        assert _distance.bit_identical(got[normal], want[normal])
        assert _distance.bit_identical(got[~normal], np.asarray(plain(a, b))[~normal])


def test_division_differentiates_as_division():
    """div_rn's derivatives are jax.numpy's: both operands, a constant divisor (no 0 * inf
    from a zero tangent), under vmap, and transposed (the linearised ops' gradients)."""
    from tfgrad.jax._native._ieee import div_rn

    a = jax.numpy.array([1.0, -2.0, 3.0, 0.0])
    b = jax.numpy.array([3.0, 7.0, 0.5, 0.0])
    got = jax.grad(lambda a, b: div_rn(a, b).sum(), argnums=(0, 1))(a, b)
    want = jax.grad(lambda a, b: (a / b).sum(), argnums=(0, 1))(a, b)
    for g, w in zip(got, want):
        assert _distance.bit_identical(np.asarray(g), np.asarray(w))
    const = jax.grad(lambda a: div_rn(a, jax.lax.stop_gradient(b)).sum())(a)
    assert _distance.bit_identical(np.asarray(const), np.asarray(1 / b))  # inf at 0, no NaN
    t = jax.linear_transpose(lambda t: jax.jvp(lambda a: div_rn(a, b), (a,), (t,))[1], a)
    assert _distance.bit_identical(np.asarray(t(jax.numpy.ones(4))[0]), np.asarray(1 / b))
    assert _distance.bit_identical(np.asarray(jax.vmap(div_rn)(a, b)), np.asarray(a / b))


# The ops whose native implementation divides in float32 (or a half type)
_DIVIDING = ("FakeQuantWithMinMaxVars", "FakeQuantWithMinMaxVarsGradient",
             "FakeQuantWithMinMaxVarsPerChannel", "FakeQuantWithMinMaxVarsPerChannelGradient",
             "FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3", "FusedBatchNormGrad",
             "FusedBatchNormGradV2", "FusedBatchNormGradV3", "AvgPool", "AvgPoolGrad", "Mean",
             "Rsqrt", "FractionalAvgPool", "FractionalAvgPoolGrad")


def _dividing_cases():
    """Every case of the two ops the first GPU check found off; six of each other op."""
    seen: dict[str, int] = {}
    for c in CASES:
        seen[c.op] = seen.get(c.op, 0) + 1
        if c.op in _DIVIDING and (seen[c.op] <= 6 or c.op in (
                "FakeQuantWithMinMaxVarsPerChannel", "FractionalAvgPool")):
            yield c


@pytest.mark.parametrize("case", list(_dividing_cases()), ids=lambda c: c.id)
def test_native_matches_exact_with_integer_division(case, x64, monkeypatch):
    """The ops that divide, with the integer division a GPU runs (forced here on the CPU):
    the same distances from the exact kernels as on the CPU (the first GPU check found
    FakeQuantWithMinMaxVarsPerChannel a quantization step off and FractionalAvgPool an ulp
    off with XLA:GPU's division)."""
    from tfgrad.jax._native import _ieee

    calls = []
    integer_div = _ieee._integer_div
    monkeypatch.setattr(_ieee, "FORCE_INTEGER_DIVISION", True)
    monkeypatch.setattr(_ieee, "_integer_div", lambda a, b: calls.append(1) or integer_div(a, b))
    test_native_matches_exact(case, None)
    # (a case may divide nothing in float32: an empty input, a float64 one)
    if case.op in ("FakeQuantWithMinMaxVars", "FakeQuantWithMinMaxVarsPerChannel"):
        assert calls
