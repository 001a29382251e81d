"""The portable torch and native JAX fractional pooling against tfgrad's exact CPU kernels.

Every case of ``tfgrad/testing/cases/fractional_pool.py`` runs through
``tfgrad.torch._portable.fractional_pool`` (torch, CPU; plus two fresh draws of the case)
and ``tfgrad.jax._native.fractional_pool`` (JAX, CPU, jitted with traced seeds; plus two
fresh draws of values and seeds on the case's shapes, reusing the compilation); every
output must lie within the module's BOUNDS of ``tfgrad.raw_ops`` (all 0: bit-identical).
JAX runs the float32 / int32 cases with ``jax_enable_x64`` off (its default: uint32 seed
pairs, int32 sequences) and the float64 / int64 ones with it on (int64 seeds).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from tests.cases.fractional_pool import CASES, ERROR_CASES
from tfgrad import InvalidArgumentError, _shapes, raw_ops
from tfgrad._distance import bit_identical, distance
from tfgrad._opdefs import get_op_def
from tfgrad.ops import fractional_pool as fp

FRESH = (101, 102)  # fresh random inputs per case, on the case's shapes
FORWARD = ("FractionalMaxPool", "FractionalAvgPool")
GRAD_OP = {"FractionalMaxPool": "FractionalMaxPoolGrad",
           "FractionalAvgPool": "FractionalAvgPoolGrad"}


def _torch() -> Any:
    return pytest.importorskip("torch")


def _jax() -> Any:
    return pytest.importorskip("jax")


def _impl(framework: str) -> Any:
    if framework == "torch":
        _torch()
        from tfgrad.torch._portable import fractional_pool as mod
    else:
        _jax()
        from tfgrad.jax._native import fractional_pool as mod
    return mod


def _within(got: np.ndarray, want: np.ndarray, bound: float) -> bool:
    if bound == 0:
        return bit_identical(got, want)
    return distance(got, want) <= bound


def _expected(op: str, kw: dict[str, Any]) -> tuple[np.ndarray, ...]:
    out = getattr(raw_ops, op)(**kw)
    return tuple(out) if isinstance(out, tuple) else (out,)


def _check(framework: str, op: str, got: tuple, want: tuple, what: str) -> None:
    bounds = _impl(framework).BOUNDS[op]
    for o, g, w in zip(get_op_def(op).outputs, got, want):
        g = np.asarray(g)
        if w.dtype.kind == "i" and g.dtype != w.dtype:  # JAX without x64: int32 sequences
            assert g.dtype == np.int32 and w.dtype == np.int64, (what, o.name, g.dtype)
            assert np.array_equal(g, w), f"{what}: {o.name} {g} != {w}"
            continue
        bound = bounds[o.name][w.dtype.name]
        assert _within(g, w, bound), (
            f"{what}: {o.name} ({w.dtype}) at distance {distance(g, w)} > {bound}")


def _fresh(case: Any, seed: int) -> dict[str, Any]:
    """Fresh values on the base case's shapes, sequences and pooling ratio (so a jitted
    function is reused): the forward ops take the fresh draw's value and seeds; the
    gradients permute their values (MaxGrad's orig_output recomputed)."""
    base = case.kwargs()
    if case.op in FORWARD:
        new = case.kwargs(seed)
        return dict(new, pooling_ratio=base["pooling_ratio"])
    rng = np.random.default_rng(seed)
    kw = dict(base)

    def shuffle(a: np.ndarray) -> np.ndarray:
        return rng.permutation(a.reshape(-1)).reshape(a.shape)

    kw["out_backprop"] = shuffle(base["out_backprop"])
    if case.op == "FractionalMaxPoolGrad":
        x = kw["orig_input"] = shuffle(base["orig_input"])
        rows, cols, y = kw["row_pooling_sequence"], kw["col_pooling_sequence"], kw["orig_output"]
        rs, re = fp.cell_bounds(rows, y.shape[1], x.shape[1], kw["overlapping"])
        cs, ce = fp.cell_bounds(cols, y.shape[2], x.shape[2], kw["overlapping"])
        kw["orig_output"] = fp._max_pool_reference(x, rs, re, cs, ce)
    return kw


# --------------------------------------------------------------------------------------
# torch
# --------------------------------------------------------------------------------------
def _torch_run(op: str, kw: dict[str, Any]) -> tuple[np.ndarray, ...]:
    torch = _torch()
    mod = _impl("torch")
    v, _ = _shapes.bind_and_infer(op, kw)
    args = {}
    for i in get_op_def(op).inputs:
        a = v[i.name]
        args[i.name] = tuple(int(d) for d in a) if i.is_shape else torch.from_numpy(np.array(a))
    args.update({a.name: v[a.name] for a in get_op_def(op).attrs})
    out = getattr(mod, op)(**args)
    return tuple(o.numpy() for o in (out if isinstance(out, tuple) else (out,)))


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_torch_matches_exact_kernels(case: Any) -> None:
    for seed in (None, *FRESH):
        kw = case.kwargs(seed)
        _check("torch", case.op, _torch_run(case.op, kw), _expected(case.op, kw),
               f"{case.id} seed {seed}")


def _value_errors() -> list[Any]:
    """Error cases that pass the shape checks (the adapters run those): value checks."""
    out = []
    for e in ERROR_CASES:
        if e.op in FORWARD:
            continue
        try:
            _shapes.infer(e.op, e.kwargs())
        except (InvalidArgumentError, TypeError):
            continue
        out.append(e)
    return out


@pytest.mark.parametrize("err", _value_errors(), ids=lambda e: e.id)
def test_torch_raises_as_numpy_op(err: Any) -> None:
    with pytest.raises(err.error, match=err.match):
        _torch_run(err.op, err.kwargs())


# --------------------------------------------------------------------------------------
# JAX
# --------------------------------------------------------------------------------------
_JIT: dict[tuple, Callable[..., Any]] = {}


def _x64_for(kw: dict[str, Any]) -> bool:
    arrays = [np.asarray(v) for k, v in kw.items()
              if k in ("value", "out_backprop", "orig_input")]
    return any(a.dtype in (np.float64, np.int64) for a in arrays)


def _jax_seed(s: int, x64: bool) -> Any:
    """A traced seed: int64 with x64, else the (low, high) uint32 words."""
    if x64:
        return np.int64(s)
    u = s & ((1 << 64) - 1)
    return np.array([u & 0xFFFFFFFF, u >> 32], np.uint32)


def _jax_run(op: str, kw: dict[str, Any], x64: bool | None = None,
             static_seeds: bool = False) -> tuple[np.ndarray, ...]:
    """The native JAX op, jitted (one compilation per shapes and static attrs), with the
    arrays and (unless ``static_seeds``) the forward's seeds as traced arguments."""
    jax = _jax()
    mod = _impl("jax")
    x64 = _x64_for(kw) if x64 is None else x64
    v, _ = _shapes.bind_and_infer(op, kw)
    od = get_op_def(op)
    arrays = {i.name: np.asarray(v[i.name]) for i in od.inputs if not i.is_shape}
    static = {i.name: tuple(int(d) for d in v[i.name]) for i in od.inputs if i.is_shape}
    static.update({a.name: v[a.name] for a in od.attrs
                   if static_seeds or a.name not in ("seed", "seed2")})
    if op in FORWARD and not static_seeds:
        arrays["seed"], arrays["seed2"] = (_jax_seed(v[k], x64) for k in ("seed", "seed2"))
    if not x64:
        arrays = {k: a.astype(np.int32) if a.dtype == np.int64 and "sequence" in k else a
                  for k, a in arrays.items()}
    key = (op, x64, tuple(sorted(static.items())),
           tuple((k, a.shape, a.dtype.str) for k, a in sorted(arrays.items())))
    with jax.enable_x64(x64):
        if key not in _JIT:
            fn = getattr(mod, op)
            _JIT[key] = jax.jit(lambda arrays, static=static, fn=fn: fn(**arrays, **static))
        out = _JIT[key](arrays)
        out = out if isinstance(out, tuple) else (out,)
        return tuple(np.asarray(o) for o in out)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_jax_matches_exact_kernels(case: Any) -> None:
    for seed in (None, *FRESH):
        kw = case.kwargs() if seed is None else _fresh(case, seed)
        _check("jax", case.op, _jax_run(case.op, kw), _expected(case.op, kw),
               f"{case.id} seed {seed}")


@pytest.mark.parametrize("err", _value_errors(), ids=lambda e: e.id)
def test_jax_raises_as_numpy_op_when_concrete(err: Any) -> None:
    jax = _jax()
    mod = _impl("jax")
    kw = err.kwargs()
    v, _ = _shapes.bind_and_infer(err.op, kw)
    od = get_op_def(err.op)
    args = {i.name: tuple(int(d) for d in v[i.name]) if i.is_shape else v[i.name]
            for i in od.inputs}
    args.update({a.name: v[a.name] for a in od.attrs})
    with jax.enable_x64(True), pytest.raises(err.error, match=err.match):
        getattr(mod, err.op)(**args)


def _seed_shapes() -> list[tuple[tuple[int, int], tuple[float, float], bool]]:
    """Input sizes and ratios for the sequence tests: divisible and not, m = 1, ratios
    near integers and large, long sequences."""
    out = []
    for hw, ratio in (((9, 11), (1.44, 1.73)), ((8, 8), (2.0, 2.0)), ((5, 7), (5.0, 1.0)),
                      ((10, 10), (10 / 3, 1.1)), ((13, 40), (4.3, 2.999)),
                      ((200, 131), (1.37, 2.5))):
        for pseudo in (False, True):
            out.append((hw, (float(np.float32(ratio[0])), float(np.float32(ratio[1]))),
                        pseudo))
    return out


@pytest.mark.parametrize("x64", [False, True], ids=["x32", "x64"])
def test_jax_sequences_equal_tfgrad_for_many_seeds(x64: bool) -> None:
    """The in-graph Philox sequences (traced seeds, jitted once per shape) against
    tfgrad's for seeds of every kind: 64-bit of either sign, small, zero halves."""
    jax = _jax()
    mod = _impl("jax")
    rng = np.random.default_rng(5)
    seeds = [(int(a), int(b)) for a, b in rng.integers(-(2**63), 2**63, (24, 2), np.int64)]
    seeds += [(int(a), int(b)) for a, b in rng.integers(0, 1000, (8, 2))]
    seeds += [(0, 1), (1, 0), (-1, -1), (2**63 - 1, -(2**63)), (2**32, 2**32 - 1)]
    shapes = _seed_shapes() if not x64 else _seed_shapes()[:4]  # (x64: the seeds' words)
    with jax.enable_x64(x64):
        for hw, ratio, pseudo in shapes:
            shape = (1, *hw, 1)
            pr = (1.0, *ratio, 1.0)
            f = jax.jit(lambda a, b, shape=shape, pr=pr, pseudo=pseudo:
                        mod.pooling_sequences(shape, pr, pseudo, a, b))
            for s, s2 in seeds:
                rows, cols = f(_jax_seed(s, x64), _jax_seed(s2, x64))
                want = fp.pooling_sequences(shape, pr, pseudo, s, s2)
                for got, w in zip((rows, cols), want):
                    assert np.asarray(got).dtype == (np.int64 if x64 else np.int32)
                    assert np.array_equal(np.asarray(got), w), (hw, ratio, pseudo, s, s2)


def test_jax_seed_forms_agree() -> None:
    """Python ints, int64 / int32 / uint32 scalars and (low, high) pairs name the same
    64-bit seeds (an int32 is sign-extended, as TF's int64 attr holding it)."""
    jax = _jax()
    jnp = jax.numpy
    mod = _impl("jax")
    shape, pr = (1, 9, 11, 1), (1.0, 1.44, 1.73, 1.0)
    f = jax.jit(lambda a, b: mod.pooling_sequences(shape, pr, False, a, b))
    for s, s2 in ((-5, 7), (3, -(2**31)), (2**31 - 1, 0)):
        want = fp.pooling_sequences(shape, pr, False, s, s2)
        got = [mod.pooling_sequences(shape, pr, False, s, s2),  # static
               f(jnp.int32(s), jnp.int32(s2)), f(_jax_seed(s, False), _jax_seed(s2, False))]
        if s >= 0 and s2 >= 0:
            got.append(f(jnp.uint32(s), jnp.uint32(s2)))
        with jax.enable_x64(True):
            got.append(mod.pooling_sequences(shape, pr, False, jnp.int64(s), jnp.int64(s2)))
        for seqs in got:
            assert all(np.array_equal(np.asarray(g), w) for g, w in zip(seqs, want)), (s, s2)


@pytest.mark.parametrize("op", FORWARD)
def test_jax_zero_seeds_are_the_numpy_ops_process_seeds(op: str) -> None:
    """deterministic=True with seed == seed2 == 0 (Python ints, or traced zeros) uses the
    seeds tfgrad's NumPy op drew for the same attrs (TF: once per cached kernel)."""
    jax = _jax()
    mod = _impl("jax")
    x = np.random.default_rng(0).standard_normal((1, 9, 11, 2)).astype(np.float32)
    ratio = tuple(float(np.float32(r)) for r in (1.0, 1.44, 1.73, 1.0))  # as bound
    attrs = dict(pooling_ratio=ratio, pseudo_random=False, overlapping=True,
                 deterministic=True)
    want = _expected(op, dict(attrs, value=x, seed=0, seed2=0))
    f = jax.jit(lambda v, a, b: getattr(mod, op)(value=v, seed=a, seed2=b, **attrs))
    zero = np.zeros(2, np.uint32)
    for got in (f(x, zero, zero), getattr(mod, op)(value=x, seed=0, seed2=0, **attrs)):
        for g, w in zip(got, want):
            assert np.array_equal(np.asarray(g), w)


@pytest.mark.parametrize("op", FORWARD)
def test_jax_nondeterministic_raises(op: str) -> None:
    _jax()
    mod = _impl("jax")
    with pytest.raises(InvalidArgumentError, match="deterministic=True"):
        getattr(mod, op)(value=np.zeros((1, 4, 4, 1), np.float32),
                         pooling_ratio=(1.0, 1.5, 1.5, 1.0), pseudo_random=False,
                         overlapping=False, deterministic=False, seed=0, seed2=0)


def test_jax_traced_invalid_arguments_stay_in_bounds() -> None:
    """Under jit nothing can raise: invalid sequences and a NaN-first cell (which the
    NumPy op rejects) still give finite, in-bounds results."""
    jax = _jax()
    mod = _impl("jax")
    x = np.array([np.nan, 1, 3, 2], np.float32).reshape(1, 2, 2, 1)
    y = np.full((1, 1, 1, 1), 3, np.float32)
    g = np.ones((1, 1, 1, 1), np.float32)
    seq = np.array([0, 2], np.int32)
    out = jax.jit(lambda x, y, g, s: mod.FractionalMaxPoolGrad(
        orig_input=x, orig_output=y, out_backprop=g, row_pooling_sequence=s,
        col_pooling_sequence=s, overlapping=False))(x, y, g, seq)
    assert np.asarray(out).reshape(-1).tolist() == [1, 0, 0, 0]  # TF's replay: the first
    bad = np.array([3, -7, 99], np.int32)
    for op, kw in (("FractionalAvgPoolGrad", dict(orig_input_tensor_shape=(1, 3, 3, 1))),
                   ("FractionalMaxPoolGrad", dict(orig_input=np.ones((1, 3, 3, 1), np.float32),
                                                  orig_output=np.ones((1, 2, 2, 1),
                                                                      np.float32)))):
        f = jax.jit(lambda g, s, op=op, kw=kw: getattr(mod, op)(
            out_backprop=g, row_pooling_sequence=s, col_pooling_sequence=s,
            overlapping=True, **kw))
        assert np.isfinite(np.asarray(f(np.ones((1, 2, 2, 1), np.float32), bad))).all()


# --------------------------------------------------------------------------------------
# Both frameworks
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize("framework", ["torch", "jax"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_denormals_as_exact_kernels(framework: str, dtype: Any) -> None:
    """Inputs and gradients in and around the denormal range (FTZ / DAZ), forward then
    both gradients with the forward's sequences, bit-identical (zeros' signs included)."""
    def run(op: str, kw: dict[str, Any]) -> tuple[np.ndarray, ...]:
        if framework == "torch":
            return _torch_run(op, kw)
        return _jax_run(op, kw, static_seeds=True)  # (the traced ones: the case tests)

    rng = np.random.default_rng(3)
    tiny = float(np.finfo(dtype).tiny)
    for scale in (tiny / 4, tiny * 4):
        x = (rng.standard_normal((2, 9, 11, 3)) * scale).astype(dtype)
        x[0, 0, :3, 0] = [tiny * 1.5, -tiny, tiny * 0.5]  # sums cancelling to denormals
        for op in FORWARD:
            for ov in (False, True):
                kw = dict(value=x, pooling_ratio=[1.0, 1.44, 1.73, 1.0], pseudo_random=True,
                          overlapping=ov, deterministic=True, seed=7, seed2=3)
                want = _expected(op, kw)
                _check(framework, op, run(op, kw), want, f"{op} {scale}")
                g = (rng.standard_normal(want[0].shape) * scale).astype(dtype)
                g.reshape(-1)[:3] = [tiny * 1.5, -tiny * 3, tiny]  # shares near tiny
                seqs = dict(row_pooling_sequence=want[1], col_pooling_sequence=want[2],
                            overlapping=ov)
                gop = GRAD_OP[op]
                gkw = (dict(orig_input_tensor_shape=np.array(x.shape, np.int64),
                            out_backprop=g, **seqs) if op == "FractionalAvgPool" else
                       dict(orig_input=x, orig_output=want[0], out_backprop=g, **seqs))
                _check(framework, gop, run(gop, gkw), _expected(gop, gkw), f"{gop} {scale}")


def test_avg_grad_float32_flush_follows_x86_rounding() -> None:
    """AvgGrad's float64 -> float32 rounding flushes as x86 FTZ does (tininess after
    rounding with an unbounded exponent): a sum in [tiny - 2**-150, tiny - 2**-151) rounds
    to tiny without FTZ, but TF gives 0. Input column 2 lies in both overlapping column
    cells ([0, 2], count 3, then [2, 2], count 1): its sum is g0 / 3 + g1."""
    tiny = np.finfo(np.float32).tiny
    # (g0, g1) per channel: two whose sum lands in that window (found by search), then
    # one whose sum is tiny itself
    pairs = [(7.3864e-38, -1.286639e-38), (9.2271244e-38, -1.9002138e-38),
             (3 * float(tiny), 0.0)]
    g = np.array(pairs, np.float32).T.reshape(1, 1, 2, 3).copy()
    kw = dict(orig_input_tensor_shape=np.array([1, 1, 3, 3], np.int64), out_backprop=g,
              row_pooling_sequence=np.array([0, 1], np.int64),
              col_pooling_sequence=np.array([0, 2, 3], np.int64), overlapping=True)
    want = _expected("FractionalAvgPoolGrad", kw)
    sums = g[0, 0, 0].astype(np.float64) / 3 + g[0, 0, 1].astype(np.float64)
    assert (sums[:2].astype(np.float32) == tiny).all()  # rounding alone gives tiny
    assert (want[0][0, 0, 2, :2] == 0).all() and want[0][0, 0, 2, 2] == tiny
    for framework, run in (("torch", _torch_run), ("jax", _jax_run)):
        with contextlib.suppress(pytest.skip.Exception):
            _impl(framework)
            _check(framework, "FractionalAvgPoolGrad", run("FractionalAvgPoolGrad", kw),
                   want, framework)


@pytest.mark.parametrize("framework", ["torch", "jax"])
@pytest.mark.parametrize("overlapping", [False, True])
def test_avg_grad_is_linear_with_the_averaging_adjoint(framework: str,
                                                       overlapping: bool) -> None:
    """FractionalAvgPoolGrad is in _gradients.LINEARISED: its framework derivative with
    respect to out_backprop is the average of the cotangent over each cell."""
    rng = np.random.default_rng(1)
    shape = (2, 9, 11, 3)
    rows, cols = fp.pooling_sequences(shape, (1.0, 1.44, 1.73, 1.0), True, 4, 5)
    g = rng.standard_normal((2, rows.size - 1, cols.size - 1, 3))
    u = rng.standard_normal(shape)
    rs, re = fp.cell_bounds(rows, rows.size - 1, shape[1], overlapping)
    cs, ce = fp.cell_bounds(cols, cols.size - 1, shape[2], overlapping)
    want = np.zeros(g.shape)
    for i in range(rs.size):
        for j in range(cs.size):
            cell = u[:, rs[i]:re[i] + 1, cs[j]:ce[j] + 1, :]
            want[:, i, j, :] = cell.sum(axis=(1, 2)) / cell[0, :, :, 0].size
    mod = _impl(framework)
    for dt, tol in ((np.float64, 1e-13), (np.float32, 1e-6)):
        if framework == "torch":
            torch = _torch()
            gt = torch.tensor(g.astype(dt), requires_grad=True)
            out = mod.FractionalAvgPoolGrad(shape, gt, torch.from_numpy(rows),
                                            torch.from_numpy(cols), overlapping)
            (got,) = torch.autograd.grad(out, gt, torch.from_numpy(u.astype(dt)))
            got = got.numpy()
        else:
            jax = _jax()
            with jax.enable_x64(dt == np.float64):
                def f(g: Any) -> Any:
                    return mod.FractionalAvgPoolGrad(shape, g, rows.astype(np.int32),
                                                     cols.astype(np.int32), overlapping)

                _, vjp = jax.vjp(jax.jit(f), g.astype(dt))
                got = np.asarray(vjp(u.astype(dt))[0])
        assert got.dtype == dt
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol * 10)


def test_torch_nondeterministic_draws_valid_fresh_sequences() -> None:
    torch = _torch()
    mod = _impl("torch")
    x = torch.from_numpy(np.random.default_rng(2).standard_normal((1, 30, 30, 2)))
    seqs = set()
    for _ in range(4):
        out, rows, cols = mod.FractionalMaxPool(
            value=x, pooling_ratio=(1.0, 1.44, 1.73, 1.0), pseudo_random=False,
            overlapping=False, deterministic=False, seed=0, seed2=0)
        r, c = rows.numpy(), cols.numpy()
        seqs.add((tuple(r), tuple(c)))
        rs, re = fp.cell_bounds(r, r.size - 1, 30, False)
        cs, ce = fp.cell_bounds(c, c.size - 1, 30, False)
        assert bit_identical(out.numpy(), fp._max_pool_reference(x.numpy(), rs, re, cs, ce))
    assert len(seqs) > 1


def test_bounds_are_tight() -> None:
    """A result one step off (one ulp, or a sequence value off by one) fails the check."""
    for framework in ("torch", "jax"):
        with contextlib.suppress(pytest.skip.Exception):
            _impl(framework)
            case = next(c for c in CASES if c.op == "FractionalAvgPool")
            want = _expected(case.op, case.kwargs())
            off = np.array(want[0])
            off.reshape(-1)[0] = np.nextafter(off.reshape(-1)[0], np.inf)
            with pytest.raises(AssertionError):
                _check(framework, case.op, (off, *want[1:]), want, "mutant")
            seq = np.array(want[1])
            seq[1] += 1
            with pytest.raises(AssertionError):
                _check(framework, case.op, (want[0], seq, want[2]), want, "mutant")


def test_jax_xla_rewrite_guards_are_needed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The optimization barriers of ``_div`` and ``_opaque`` hold against XLA's algebraic
    simplifier, which runs before XLA:CPU removes them: a division by a broadcast (or a
    constant: static seeds) would become a multiplication by the reciprocal, ``0 + x``
    would become ``x`` (a -0 gradient would stay -0 where TF's +0 accumulators give +0).
    With them the ops are bit-identical to the exact kernels, without them not. (Barriers
    do not stop LLVM's FMA contraction, but no float multiply feeds an add here.)"""
    mod = _impl("jax")
    rng = np.random.default_rng(9)
    x = rng.standard_normal((2, 30, 40, 3)).astype(np.float32)
    fwd = dict(value=x, pooling_ratio=[1.0, 1.44, 1.73, 1.0], pseudo_random=False,
               overlapping=True, deterministic=True, seed=7, seed2=3)
    avg, mx = _expected("FractionalAvgPool", fwd), _expected("FractionalMaxPool", fwd)
    g = np.full(avg[0].shape, -0.0, np.float32)  # every share and sum a -0
    calls = (
        ("FractionalAvgPool", fwd, {"_div": lambda a, b: a / b}),
        ("FractionalAvgPoolGrad", dict(orig_input_tensor_shape=np.array(x.shape, np.int64),
                                       out_backprop=g, row_pooling_sequence=avg[1],
                                       col_pooling_sequence=avg[2], overlapping=True),
         {"_opaque": lambda a: a}),
        ("FractionalMaxPoolGrad", dict(orig_input=x, orig_output=mx[0], out_backprop=g,
                                       row_pooling_sequence=mx[1],
                                       col_pooling_sequence=mx[2], overlapping=True),
         {"_opaque": lambda a: a}),
    )
    for op, kw, mutant in calls:
        want = _expected(op, kw)[0]
        _JIT.clear()
        assert bit_identical(_jax_run(op, kw, static_seeds=True)[0], want), op
        with monkeypatch.context() as m:
            for name, fn in mutant.items():
                m.setattr(mod, name, fn)
            _JIT.clear()
            assert not bit_identical(_jax_run(op, kw, static_seeds=True)[0], want), (
                f"{op}: XLA no longer rewrites without {sorted(mutant)}")
        _JIT.clear()
