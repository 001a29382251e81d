"""FractionalMaxPool, FractionalAvgPool and their gradients in jax.numpy / jax.lax.

Everything is jittable, on any backend, with ``jax_enable_x64`` on or off; the semantics are
those of :mod:`tfgrad.ops.fractional_pool` (TF 2.21's CPU kernels).

Pooling sequences (:func:`pooling_sequences`) are drawn in the graph, so the seeds may be
traced: TF's Philox4x32-10 in uint32 arithmetic (:mod:`.philox`), with TF's key =
(seed lo, seed hi) and counter = (block, 0, seed2 lo, seed2 hi); rows reserve their draws
first (ceil(draws / 4) blocks, even when they are not used), then columns.

- random: the counts k / k + 1 are shuffled by TF's sequential swaps with a modulo draw
  (``lax.fori_loop``); no loop runs when every count is equal (m divides n).
- pseudo-random: ``a_i = ceil(alpha * (i + u))`` with ``u = Uint64ToDouble(x0, x1) * max_u``
  is float64 arithmetic on a 52-bit draw ``M = (x0 & 0xfffff) << 32 | x1``. Each a_i is a
  non-decreasing step function of M (every rounding is monotone and max_u > 0), taking a
  few values (alpha * max_u <= 2); the host finds, in float64, the smallest M at which each step is
  reached (binary search over the 52 bits), and the graph counts the thresholds the drawn
  M passes by comparing (hi, lo) uint32 words. No float64 in the graph: the sequences equal
  tfgrad's (and TF's) for every seed, with x64 on or off.

Seeds (``seed``, ``seed2``): Python ints (any int64 / uint64 value, as TF's attrs), or
integer arrays (traced or not): int64 / uint64 scalars (x64 on), int32 scalars (sign-extended
to 64 bits, as an int64 attr holding the same value), uint32 scalars (high word 0), or
uint32 / int32 arrays of shape (2,) holding the (low, high) words of the 64-bit seed. Seeds
known at trace time (Python / NumPy integers) skip the in-graph generator: tfgrad's host
sequences (the same bits) become constants, and the windows fit the actual cells.

- ``deterministic=True`` with ``seed == seed2 == 0``: the process-wide seeds tfgrad's NumPy
  op uses for the same attrs (TF draws them once per cached kernel); a traced pair that is
  (0, 0) at run time selects them too.
- ``deterministic=False`` raises InvalidArgumentError: TF draws fresh OS seeds on every
  call, which a jitted function cannot do. Pass ``deterministic=True`` with explicit
  seeds, e.g. drawn from a ``jax.random`` key, traced.

Pooling: the forward ops gather each cell's taps in row-major order over a fixed window
(the largest cell the static shapes allow), masking the taps past the cell's clamped end,
so the max (``acc < v``: NaN never wins, the earlier of equal values stays) and the sum in
T (then ``/ count`` in T; integers truncate, sums wrap) are TF's, operation for operation.
The gradients take any sequences, traced too: each input element lies in at most two
cells per dimension (the cell starting at or before it, and in overlapping mode the one
before that), so they *gather*, in TF's (output row-major) order, the contributions of at
most four cells per element. AvgGrad adds ``double(g) / count`` in float64 and rounds once
(the float64 part runs under a local ``jax.enable_x64``, also when x64 is off); MaxGrad
finds each cell's first maximum (row-major, NaN never wins, as TF's replay) with segment
max / min reductions, one dimension after the other.

FractionalAvgPoolGrad is differentiable (``_gradients.LINEARISED``) through a
``jax.custom_jvp``: its tangent is the same spreading of the tangent of out_backprop (in
float64 where x64 is on, else in T), because JAX would transpose the float64 primal outside
its local ``enable_x64``.

TF's floating-point environment (FTZ and DAZ) is applied explicitly, as tfgrad's NumPy op
has it: denormal inputs read as zeros of their sign, denormal results become zeros. Two of
XLA's algebraic rewrites would change bits and are blocked with optimization barriers: a
division by a broadcast (or a constant) becomes a multiplication by the reciprocal, and
``0 + x`` becomes ``x`` (-0 where TF's +0 accumulators give +0). The barriers hold there
because the algebraic simplifier runs while they stand (XLA:CPU removes them before
fusion; tests/test_portable_fractional_pool.py checks both rewrites happen without them).
They would not stop LLVM's contraction of a multiply and an add into an FMA, which no
barrier does; none is needed: no float multiply feeds an add here (the sums add gathered
values or quotients, and the inputs and outputs pass through selects).

Values the gradients cannot check under ``jit``: the sequences (at least out + 1 values,
the first out + 1 strictly increasing within [0, input size]; only those are read) and
MaxGrad's ``orig_output`` (the max pooling of ``orig_input``) are checked as tfgrad's
NumPy ops check them, raising InvalidArgumentError, when the arguments are concrete;
traced, they are not checked, every index is clamped (nothing reads out of bounds), an
invalid sequence gives unspecified values, and MaxGrad routes each gradient to the element
TF's replay would pick (for a cell whose first element is NaN, where TF raises, that first
element).
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ..._errors import InvalidArgumentError
from ...ops import fractional_pool as _fp
from ._ieee import div_rn
from .philox import philox4x32_10

# op -> output -> dtype -> largest distance allowed from tfgrad's CPU kernels (0: bit-identical)
# Every output is bit-identical: the same operations in the same order, x86 FTZ / DAZ
# applied explicitly (measured over the case table, fresh inputs and denormal inputs).
BOUNDS: dict[str, dict[str, dict[str, float]]] = {
    op: {out: {dt: 0.0 for dt in ("float32", "float64", "int32", "int64")} for out in outs}
    for op, outs in (
        ("FractionalMaxPool", ("output", "row_pooling_sequence", "col_pooling_sequence")),
        ("FractionalAvgPool", ("output", "row_pooling_sequence", "col_pooling_sequence")),
        ("FractionalMaxPoolGrad", ("output",)),
        ("FractionalAvgPoolGrad", ("output",)),
    )
}

NOTES: dict[str, str] = {
    "FractionalMaxPool": "deterministic=False raises InvalidArgumentError (a jitted function "
                         "cannot draw fresh OS seeds per call): pass explicit, possibly "
                         "traced, seeds.",
    "FractionalAvgPool": "deterministic=False raises InvalidArgumentError (a jitted function "
                         "cannot draw fresh OS seeds per call): pass explicit, possibly "
                         "traced, seeds.",
    "FractionalMaxPoolGrad": "Traced arguments are not checked (the sequences' values, "
                             "orig_output against the replay): indices are clamped, and a "
                             "NaN-first cell, where TF raises, sends its gradient to that "
                             "first element.",
    "FractionalAvgPoolGrad": "Traced sequences are not checked (indices are clamped); the "
                             "float64 accumulation needs a backend with float64 (not TPU).",
}

_M32 = 0xFFFFFFFF
_M64 = (1 << 64) - 1


def _u32(v: int) -> jax.Array:
    return jnp.asarray(v & _M32, jnp.uint32)


def _seq_dtype() -> np.dtype:
    """int64 with x64 on, int32 otherwise (the values fit either)."""
    return np.dtype(jax.dtypes.canonicalize_dtype(np.int64))


def _is_traced(*arrays: Any) -> bool:
    return any(isinstance(a, jax.core.Tracer) for a in arrays)


# --------------------------------------------------------------------------------------
# Seeds
# --------------------------------------------------------------------------------------
def _is_static(seed: Any) -> bool:
    """A seed known at trace time: a Python or NumPy integer (or 0-d NumPy array)."""
    return (isinstance(seed, (int, np.integer)) and not isinstance(seed, bool)) or (
        isinstance(seed, np.ndarray) and seed.shape == () and seed.dtype.kind in "iu")


def _seed_words(seed: Any) -> tuple[jax.Array, jax.Array]:
    """The (low, high) uint32 words of a 64-bit seed (see the module docstring)."""
    if isinstance(seed, bool):
        raise TypeError("a seed must be an integer, got a bool")
    if _is_static(seed):
        s = int(seed) & _M64  # TF reinterprets the int64 attr as uint64
        return _u32(s), _u32(s >> 32)
    s = jnp.asarray(seed)
    if not jnp.issubdtype(s.dtype, jnp.integer):
        raise TypeError(f"a seed must be an integer array, got dtype {s.dtype}")
    if s.shape == (2,) and s.dtype.itemsize == 4:
        w = lax.bitcast_convert_type(s, jnp.uint32)
        return w[0], w[1]
    if s.shape != ():
        raise TypeError(f"a seed must be a scalar or a (low, high) pair, got shape {s.shape}")
    if s.dtype.itemsize == 8:
        u = lax.bitcast_convert_type(s, jnp.uint64)
        return (u & jnp.uint64(_M32)).astype(jnp.uint32), (u >> jnp.uint64(32)).astype(jnp.uint32)
    if s.dtype.itemsize == 4:
        lo = lax.bitcast_convert_type(s, jnp.uint32)
        neg = s < 0 if jnp.issubdtype(s.dtype, jnp.signedinteger) else jnp.asarray(False)
        return lo, jnp.where(neg, _u32(_M32), _u32(0))  # sign extension of an int32
    raise TypeError(f"a seed must be a 32- or 64-bit integer, got dtype {s.dtype}")


def _traced_seeds(op: str, dtype: Any, ratio: tuple[float, ...], pseudo_random: bool,
                  overlapping: bool, seed: Any, seed2: Any) -> tuple[jax.Array, ...]:
    """(seed lo, seed hi, seed2 lo, seed2 hi) for deterministic=True, with TF's (0, 0) rule
    applied at run time: a pair that is (0, 0) selects the NumPy op's process seeds."""
    zeros = _fp.seeds(op, np.dtype(dtype), ratio, pseudo_random, overlapping, True, 0, 0)
    words = (*_seed_words(seed), *_seed_words(seed2))
    subst = (*_seed_words(zeros[0]), *_seed_words(zeros[1]))
    both_zero = (words[0] | words[1] | words[2] | words[3]) == 0
    return tuple(jnp.where(both_zero, z, w) for z, w in zip(subst, words))


# --------------------------------------------------------------------------------------
# Pooling sequences
# --------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=256)
def _pseudo_table(n: int, m: int) -> tuple[np.ndarray, np.ndarray, int]:
    """For n -> m pseudo-random: a_i (i = 1 .. m-1) = base_i + #{d : M >= thr[d, i]}, where M
    is the 52-bit draw (thr = 2**52: never), and the largest gap a_{i+1} - a_i possible."""
    alpha = n / m
    k = n // m
    max_u = min((k + 2) / alpha - 1, (n + 1 - k) / alpha - (m - 1))  # as TF, in float64
    assert max_u > 0, (n, m, max_u)  # so a_i is non-decreasing in M
    i = np.arange(1, m, dtype=np.float64)

    def a(draw: np.ndarray) -> np.ndarray:  # TF's a_i, in float64 (NumPy: no contraction)
        u = draw.astype(np.float64) * 2.0**-52 * max_u  # Uint64ToDouble(..) - 1 is M / 2**52
        return np.ceil(alpha * (i + u)).astype(np.int64)

    base = a(np.zeros(m - 1, np.int64))
    top = a(np.full(m - 1, 2**52 - 1, np.int64))
    steps = int((top - base).max()) if m > 1 else 0
    thr = np.empty((steps, m - 1), np.int64)
    for d in range(1, steps + 1):  # smallest M with a_i(M) >= base_i + d
        lo, hi = np.zeros(m - 1, np.int64), np.full(m - 1, 2**52, np.int64)
        for _ in range(52):
            mid = (lo + hi) // 2
            up = a(mid) >= base + d
            lo, hi = np.where(up, lo, mid), np.where(up, mid, hi)
        thr[d - 1] = hi
    low = np.concatenate([[1], base, [n + 1]])
    high = np.concatenate([[1], top, [n + 1]])
    return base, thr, int((high[1:] - low[:-1]).max())


def _largest_gap(n: int, m: int, pseudo_random: bool) -> int:
    if pseudo_random:
        return _pseudo_table(n, m)[2]
    return n // m + (1 if n % m else 0)


def _draws(key: tuple[jax.Array, jax.Array], seed2: tuple[jax.Array, jax.Array],
           blocks: int) -> jax.Array:
    """The uint32 draws of Philox blocks 0 .. blocks-1 (lanes in order)."""
    assert blocks < 2**32  # the counter's low word never carries
    c0 = jnp.arange(blocks, dtype=jnp.uint32)
    zero = jnp.zeros_like(c0)
    lanes = philox4x32_10((c0, zero, seed2[0] + zero, seed2[1] + zero), key)
    return jnp.stack(lanes, axis=1).reshape(-1)


def _reserved(m: int, pseudo_random: bool) -> int:
    """Blocks one sequence reserves (ReserveSamples32: ceil(draws / 4))."""
    return 1 if pseudo_random else (m + 3) // 4


def _sequence(n: int, m: int, pseudo_random: bool, x: jax.Array) -> jax.Array:
    """TF's GeneratePoolingSequence for n -> m from its reserved draws ``x``: the
    cumulative sequence [0, .., n]."""
    dt = _seq_dtype()
    if pseudo_random:
        base, thr, _ = _pseudo_table(n, m)
        mh, ml = x[0] & _u32(0xFFFFF), x[1]  # the 52-bit draw as (high 20, low 32) words
        th = jnp.asarray((thr >> 32).astype(np.uint32))
        tl = jnp.asarray((thr & _M32).astype(np.uint32))
        passed = (mh > th) | ((mh == th) & (ml >= tl))  # M >= thr, word by word
        a = jnp.asarray(base, dt) + jnp.sum(passed, axis=0, dtype=dt)
        inner = a - 1  # seq_i = a_i - a_0, a_0 = 1
        return jnp.concatenate([jnp.zeros(1, dt), inner, jnp.full(1, n, dt)])
    k, r = divmod(n, m)
    diff = np.full(m, k, np.int32)
    diff[:r] += 1
    if r == 0:  # all counts equal: the swaps change nothing (the draws are still reserved)
        counts = jnp.asarray(diff, dt)
    else:
        def swap(i: jax.Array, d: jax.Array) -> jax.Array:  # RandomShuffle, modulo draw
            j = i + lax.rem(x[i], (m - i).astype(jnp.uint32)).astype(jnp.int32)
            di, dj = d[i], d[j]
            return d.at[i].set(dj).at[j].set(di)

        counts = lax.fori_loop(0, m - 1, swap, jnp.asarray(diff)).astype(dt)
    return jnp.concatenate([jnp.zeros(1, dt), jnp.cumsum(counts, dtype=dt)])


def _sequences(h: int, w: int, mr: int, mc: int, pseudo_random: bool,
               key: tuple[jax.Array, jax.Array],
               seed2: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
    """Rows first, then columns, from one generator (one Philox pass for both)."""
    br, bc = _reserved(mr, pseudo_random), _reserved(mc, pseudo_random)
    x = _draws(key, seed2, br + bc)
    return (_sequence(h, mr, pseudo_random, x[:4 * br]),
            _sequence(w, mc, pseudo_random, x[4 * br:]))


def pooling_sequences(shape: tuple[int, ...], pooling_ratio: tuple[float, ...],
                      pseudo_random: bool, seed: Any, seed2: Any) -> tuple[jax.Array, jax.Array]:
    """Row and column pooling sequences TF draws for an input of ``shape`` (NHWC, static)
    with these attrs and seeds (Python ints or, traced or not, integer arrays: see the
    module docstring), as int64 arrays (int32 with x64 off). The JAX counterpart of
    ``tfgrad.ops.fractional_pool.pooling_sequences``: a pure function of the seeds (no
    (0, 0) substitution)."""
    shape = tuple(int(d) for d in shape)
    _, h, w, _ = shape
    _, mr, mc, _ = _fp.output_shape(shape, tuple(pooling_ratio))
    return _sequences(h, w, mr, mc, pseudo_random, _seed_words(seed), _seed_words(seed2))


# --------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------
def _ftz(v: jax.Array) -> jax.Array:
    """x86 FTZ / DAZ: a denormal becomes a zero of its sign (floats only)."""
    if not jnp.issubdtype(v.dtype, jnp.floating):
        return v
    tiny = jnp.finfo(v.dtype).tiny
    return jnp.where(jnp.abs(v) < tiny, jnp.copysign(jnp.zeros_like(v), v), v)


def _div(a: jax.Array, b: jax.Array, rn: bool = True) -> jax.Array:
    """a / b, correctly rounded (div_rn, whose divisor depends on a: never the
    multiplication by a reciprocal that XLA's algebraic simplifier makes of a division by
    a broadcast or a constant). ``rn=False``: XLA's division, linear in a, for the tangent
    map, which JAX transposes; its full-size divisor behind an optimization barrier keeps
    the division (the barrier stands until after the simplifier has run; measured, jax
    0.10.2)."""
    if rn:
        return div_rn(a, b)
    return a / lax.optimization_barrier(jnp.broadcast_to(b, a.shape))


def _opaque(a: jax.Array) -> jax.Array:
    """``a`` hidden from XLA's algebraic simplifier, which rewrites ``0 + x`` to ``x`` (so
    +0 + -0 would give -0; TF's accumulators start at +0 and give +0)."""
    return lax.optimization_barrier(a)


def _lowest(dtype: Any) -> Any:
    """Eigen::NumTraits<T>::lowest() (float32: -3.4028235e38, not -inf)."""
    info = jnp.finfo(dtype) if jnp.issubdtype(dtype, jnp.floating) else jnp.iinfo(dtype)
    return info.min


def _cells(seq: jax.Array, m: int, n: int, overlapping: bool) -> tuple[jax.Array, jax.Array]:
    """Start and clamped inclusive end of each of the m cells (int32)."""
    s = seq.astype(jnp.int32)
    return s[:m], jnp.minimum(s[1:m + 1] - (0 if overlapping else 1), n - 1)


def _owners(starts: jax.Array, ends: jax.Array, n: int) -> tuple[tuple[jax.Array, jax.Array],
                                                                   ...]:
    """For each position 0..n-1 the (at most) two cells holding it, earlier cell first:
    (clamped cell index, holds) pairs. The later is the last cell starting at or before
    the position; the earlier is the one before (it holds the position only when cells
    overlap and the position is the later cell's start)."""
    m = starts.shape[0]
    pos = jnp.arange(n, dtype=jnp.int32)
    last = jnp.searchsorted(starts, pos, side="right").astype(jnp.int32) - 1
    out = []
    for c in (last - 1, last):
        ci = jnp.clip(c, 0, m - 1)
        out.append((ci, (c >= 0) & (starts[ci] <= pos) & (pos <= ends[ci])))
    return tuple(out)


def _gather2(a: jax.Array, r: jax.Array, c: jax.Array) -> jax.Array:
    """a[:, r][:, :, c] for an NHWC-like array (indices clamped into bounds)."""
    return jnp.take(jnp.take(a, r, axis=1, mode="clip"), c, axis=2, mode="clip")


def _check_sequences(op: str, rows: Any, cols: Any, h: int, w: int, mr: int, mc: int,
                     overlapping: bool) -> None:
    """The NumPy op's value checks of the sequences, when they are concrete."""
    if _is_traced(rows, cols):
        return
    r, c = np.asarray(rows), np.asarray(cols)
    _fp.check_gradient_sequences(op, r, c, h, w, mr, mc, overlapping)


# --------------------------------------------------------------------------------------
# Forward ops
# --------------------------------------------------------------------------------------
def _taps(seq: jax.Array, m: int, n: int, overlapping: bool,
          k: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Tap rows of a fixed window of k per cell: (clamped index [m, k], in cell [m, k],
    cell size [m])."""
    s, e = _cells(seq, m, n, overlapping)
    t = s[:, None] + jnp.arange(k, dtype=jnp.int32)[None, :]
    return jnp.minimum(t, n - 1), t <= e[:, None], e - s + 1


def _forward(op: str, value: Any, pooling_ratio: tuple[float, ...], pseudo_random: bool,
             overlapping: bool, deterministic: bool, seed: Any,
             seed2: Any) -> tuple[jax.Array, jax.Array, jax.Array]:
    if not deterministic:
        raise InvalidArgumentError(
            f"{op}: deterministic=False is not supported by the native JAX implementation: "
            "TF draws fresh random seeds on every call, which a jitted function cannot do. "
            "Pass deterministic=True with explicit seed and seed2 (they may be traced "
            "integer arrays, e.g. drawn from a jax.random key)")
    x = jnp.asarray(value)
    shape = tuple(int(d) for d in x.shape)
    _, h, w, _ = shape
    _, mr, mc, _ = _fp.output_shape(shape, tuple(pooling_ratio))
    ratio = tuple(pooling_ratio)
    if _is_static(seed) and _is_static(seed2):
        # Known seeds: tfgrad's own host sequences (TF's bits, and its seeds rule for
        # (0, 0)) as constants; the windows fit the actual cells.
        s1, s2 = _fp.seeds(op, np.dtype(x.dtype), ratio, pseudo_random, overlapping, True,
                           int(seed), int(seed2))
        r_np, c_np = _fp.pooling_sequences(shape, ratio, pseudo_random, s1, s2)
        rows, cols = jnp.asarray(r_np, _seq_dtype()), jnp.asarray(c_np, _seq_dtype())
        kh, kw = (int(np.max(e - b)) + 1
                  for b, e in (_fp.cell_bounds(r_np, mr, h, overlapping),
                               _fp.cell_bounds(c_np, mc, w, overlapping)))
    else:
        k0, k1, s2lo, s2hi = _traced_seeds(op, x.dtype, ratio, pseudo_random, overlapping,
                                           seed, seed2)
        rows, cols = _sequences(h, w, mr, mc, pseudo_random, (k0, k1), (s2lo, s2hi))
        kh = min(_largest_gap(h, mr, pseudo_random) + overlapping, h)
        kw = min(_largest_gap(w, mc, pseudo_random) + overlapping, w)
    ri, rv, rn = _taps(rows, mr, h, overlapping, kh)
    ci, cv, cn = _taps(cols, mc, w, overlapping, kw)
    is_max = op == "FractionalMaxPool"
    xf = _ftz(x)  # DAZ; TF's max instruction also returns a denormal as a zero

    def tap(t: jax.Array, acc: jax.Array) -> jax.Array:  # taps in row-major order
        a, b = t // kw, t % kw
        v = _gather2(xf, ri[:, a], ci[:, b])
        ok = (rv[:, a][:, None] & cv[:, b][None, :])[None, :, :, None]
        if is_max:
            return jnp.where(ok & (acc < v), v, acc)  # NaN never wins; ties keep the first
        return jnp.where(ok, _ftz(acc + v), acc)  # the sum in T, row-major; ints wrap

    init = _opaque(jnp.full((shape[0], mr, mc, shape[3]), _lowest(x.dtype) if is_max else 0,
                            x.dtype))
    out = lax.fori_loop(0, kh * kw, tap, init)
    if not is_max:
        count = (rn[:, None] * cn[None, :]).astype(x.dtype)[None, :, :, None]
        if jnp.issubdtype(x.dtype, jnp.floating):
            out = _ftz(_div(out, count))
        else:
            out = lax.div(out, jnp.broadcast_to(count, out.shape))  # C++: toward zero
    return out, rows, cols


def FractionalMaxPool(value: Any, pooling_ratio: tuple[float, ...], pseudo_random: bool,
                      overlapping: bool, deterministic: bool, seed: Any,
                      seed2: Any) -> tuple[jax.Array, jax.Array, jax.Array]:
    return _forward("FractionalMaxPool", value, pooling_ratio, pseudo_random, overlapping,
                    deterministic, seed, seed2)


def FractionalAvgPool(value: Any, pooling_ratio: tuple[float, ...], pseudo_random: bool,
                      overlapping: bool, deterministic: bool, seed: Any,
                      seed2: Any) -> tuple[jax.Array, jax.Array, jax.Array]:
    return _forward("FractionalAvgPool", value, pooling_ratio, pseudo_random, overlapping,
                    deterministic, seed, seed2)


# --------------------------------------------------------------------------------------
# Gradients
# --------------------------------------------------------------------------------------
def _same(v: jax.Array) -> jax.Array:
    return v


def _spread(g: jax.Array, rows: jax.Array, cols: jax.Array, h: int, w: int,
            overlapping: bool, acc_dtype: Any, ftz: bool = True) -> jax.Array:
    """Each input element's sum, in ``acc_dtype`` from +0 in output row-major order, of
    g / count over the (at most 4) cells holding it (``ftz``: flushing denormals and
    dividing with div_rn, which the tangent map leaves out: JAX transposes it, so it must
    be linear in g)."""
    _, mr, mc, _ = g.shape
    rs, re = _cells(rows, mr, h, overlapping)
    cs, ce = _cells(cols, mc, w, overlapping)
    count = ((re - rs + 1)[:, None] * (ce - cs + 1)[None, :]).astype(acc_dtype)
    fl = _ftz if ftz else _same
    share = fl(_div(fl(g).astype(acc_dtype), count[None, :, :, None], rn=ftz))
    acc = _opaque(jnp.zeros((g.shape[0], h, w, g.shape[3]), acc_dtype))  # +0.0, as TF's
    col_owners = _owners(cs, ce, w)
    for r, r_ok in _owners(rs, re, h):  # the (at most 4) cells in output row-major order
        for c, c_ok in col_owners:
            ok = (r_ok[:, None] & c_ok[None, :])[None, :, :, None]
            acc = jnp.where(ok, fl(acc + _gather2(share, r, c)), acc)
    return acc


def _avg_grad_exact(shape: tuple[int, ...], g: jax.Array, rows: jax.Array, cols: jax.Array,
                    overlapping: bool) -> jax.Array:
    """TF's float64 accumulation (under a local enable_x64, also when x64 is off), rounded
    once to T."""
    dt = g.dtype
    with jax.enable_x64(True):
        acc = _spread(g, rows, cols, shape[1], shape[2], overlapping, jnp.float64)
        if jnp.issubdtype(dt, jnp.floating):
            out = acc.astype(dt)
            if dt == jnp.float32:  # x86 FTZ flushes what rounds to a denormal *before*
                # the exponent is bounded: below tiny - 2**-151 (ties go to tiny)
                flush = jnp.abs(acc) < float(np.finfo(np.float32).tiny) * (1 - 2.0**-25)
                out = jnp.where(flush, jnp.copysign(jnp.zeros_like(out), out), out)
            return out
        bits = jnp.iinfo(dt).bits
        lo, hi = -(2.0 ** (bits - 1)), 2.0 ** (bits - 1)
        ok = (acc >= lo) & (acc < hi)
        # static_cast<T>(double) truncates; out of range, x86 gives T's minimum
        return jnp.where(ok, jnp.trunc(jnp.where(ok, acc, 0.0)), lo).astype(dt)


@functools.partial(jax.custom_jvp, nondiff_argnums=(0, 4))
def _avg_grad_float(shape: tuple[int, ...], g: jax.Array, rows: jax.Array, cols: jax.Array,
                    overlapping: bool) -> jax.Array:
    return _avg_grad_exact(shape, g, rows, cols, overlapping)


@_avg_grad_float.defjvp
def _avg_grad_float_jvp(shape: tuple[int, ...], overlapping: bool, primals: tuple,
                        tangents: tuple) -> tuple[jax.Array, jax.Array]:
    # Linear in g: the tangent is the same spreading of dg, in float64 where x64 is on,
    # else in T (the float64 of the primal lives under a local enable_x64, which JAX's
    # transposition, run later, would not see).
    g, rows, cols = primals
    acc = jnp.float64 if jax.config.jax_enable_x64 else g.dtype
    dg = _spread(tangents[0], rows, cols, shape[1], shape[2], overlapping, acc, ftz=False)
    return _avg_grad_float(shape, g, rows, cols, overlapping), dg.astype(g.dtype)


def FractionalAvgPoolGrad(orig_input_tensor_shape: tuple[int, ...], out_backprop: Any,
                          row_pooling_sequence: Any, col_pooling_sequence: Any,
                          overlapping: bool) -> jax.Array:
    op = "FractionalAvgPoolGrad"
    shape = tuple(int(d) for d in orig_input_tensor_shape)
    g = jnp.asarray(out_backprop)
    _, mr, mc, _ = g.shape
    _check_sequences(op, row_pooling_sequence, col_pooling_sequence, shape[1], shape[2], mr,
                     mc, overlapping)
    rows, cols = jnp.asarray(row_pooling_sequence), jnp.asarray(col_pooling_sequence)
    if jnp.issubdtype(g.dtype, jnp.floating):  # differentiable (_gradients.LINEARISED)
        return _avg_grad_float(shape, g, rows, cols, overlapping)
    return _avg_grad_exact(shape, g, rows, cols, overlapping)


def _first_max(v: jax.Array, starts: jax.Array, ends: jax.Array, n: int,
               axis: int) -> tuple[jax.Array, jax.Array]:
    """Per cell along ``axis`` (size n -> m): the max of v (no NaNs in v) and the first
    position holding it. A cell is a segment [start, next start) plus, where cells
    overlap, the next start itself (its clamped end)."""
    m = starts.shape[0]
    pos = jnp.arange(n, dtype=jnp.int32)
    seg = jnp.searchsorted(starts, pos, side="right").astype(jnp.int32) - 1
    own = (seg >= 0) & (pos <= ends[jnp.clip(seg, 0, m - 1)])
    seg = jnp.where(own, seg, m)  # m: positions no cell starts at or before (or past its end)
    vt = jnp.moveaxis(v, axis, 0)
    mx = jax.ops.segment_max(vt, seg, num_segments=m + 1)
    bshape = (n,) + (1,) * (vt.ndim - 1)
    hit = vt == mx[seg]
    first = jax.ops.segment_min(jnp.where(hit, pos.reshape(bshape), n), seg,
                                num_segments=m + 1)
    mx, first = mx[:m], first[:m]
    # Overlapping cells also hold their end, the next cell's start: it wins only if greater.
    extra = ends >= jnp.concatenate([starts[1:], jnp.full(1, n, jnp.int32)])
    e = jnp.clip(ends, 0, n - 1)
    ve = vt[e]
    mshape = (m,) + (1,) * (vt.ndim - 1)
    better = extra.reshape(mshape) & (ve > mx)
    mx = jnp.where(better, ve, mx)
    first = jnp.where(better, e.reshape(mshape), first)
    return jnp.moveaxis(mx, 0, axis), jnp.moveaxis(first, 0, axis)


def FractionalMaxPoolGrad(orig_input: Any, orig_output: Any, out_backprop: Any,
                          row_pooling_sequence: Any, col_pooling_sequence: Any,
                          overlapping: bool) -> jax.Array:
    op = "FractionalMaxPoolGrad"
    x, y, g = jnp.asarray(orig_input), jnp.asarray(orig_output), jnp.asarray(out_backprop)
    nb, h, w, c = x.shape
    _, mr, mc, _ = y.shape
    _check_sequences(op, row_pooling_sequence, col_pooling_sequence, h, w, mr, mc,
                     overlapping)
    rs, re = _cells(jnp.asarray(row_pooling_sequence), mr, h, overlapping)
    cs, ce = _cells(jnp.asarray(col_pooling_sequence), mc, w, overlapping)
    is_float = jnp.issubdtype(x.dtype, jnp.floating)
    xf = _ftz(x)  # TF's replay compares under DAZ
    xn = jnp.where(jnp.isnan(xf), -jnp.inf, xf) if is_float else xf  # NaN never wins
    m1, i1 = _first_max(xn, cs, ce, w, axis=2)  # per row and column cell
    best, i2 = _first_max(m1, rs, re, h, axis=1)  # per cell: first row attaining the max
    arg = i2 * w + jnp.take_along_axis(i1, i2, axis=1)  # flat h * w + w of the first max
    if is_float:  # TF's replay starts at the first element: a NaN there stays
        nan_first = jnp.isnan(_gather2(xf, rs, cs))
        arg = jnp.where(nan_first, (rs[:, None] * w + cs[None, :])[None, :, :, None], arg)
        best = jnp.where(nan_first, jnp.nan, best)
    if not _is_traced(x, y, row_pooling_sequence, col_pooling_sequence) and not bool(
            jnp.all(best == _ftz(y))):
        raise _fp.max_grad_mismatch(op)
    gf = _ftz(g)  # DAZ on the added gradients
    flat = (jnp.arange(h, dtype=jnp.int32)[:, None] * w
            + jnp.arange(w, dtype=jnp.int32)[None, :])[None, :, :, None]
    out = _opaque(jnp.zeros(x.shape, x.dtype))  # +0, as TF's setZero
    col_owners = _owners(cs, ce, w)
    for r, r_ok in _owners(rs, re, h):  # cells in output row-major order, as TF adds them
        for cc, c_ok in col_owners:
            hit = (r_ok[:, None] & c_ok[None, :])[None, :, :, None] & (
                _gather2(arg, r, cc) == flat)
            out = jnp.where(hit, _ftz(out + _gather2(gf, r, cc)), out)
    return out
