"""Explicit SIMD vectors for Numba kernels: a float32 x 16 / float64 x 8 value type and
the few operations the register-blocked kernels need.

LLVM does not derive register blocking from plain Numba loops: with several output
pixels' accumulators in one loop body it keeps each in memory behind runtime alias
checks. A value of vector type lives in a register, so a kernel can hold several
accumulators across all of a filter's taps. ``vmuladd`` rounds the product and then the
sum (no FMA contraction: Numba emits no fast-math flags), as Eigen's non-FMA ``pmadd``.

The loads and stores are unchecked and unaligned: callers keep ``i + lanes <= size``.
"""

from __future__ import annotations

import math

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic, models, register_model

from .._compile import inline, jit


class Vec(types.Type):
    """A SIMD vector of ``lanes`` values of ``dtype`` (a Numba float type)."""

    def __init__(self, dtype: types.Float, lanes: int) -> None:
        self.dtype = dtype
        self.lanes = lanes
        super().__init__(name=f"Vec({dtype} x {lanes})")


_LANES = {types.float32: 16, types.float64: 8}  # one 512-bit register
_VEC = {t: Vec(t, n) for t, n in _LANES.items()}


def _host_has_avx512() -> bool:
    try:
        from llvmlite import binding

        return bool(binding.get_host_cpu_features().get("avx512f", False))
    except Exception:  # (a host whose features LLVM cannot read)
        return False


HOST_AVX512 = _host_has_avx512()
"""Whether a vector is one hardware register (32 of them) or, on AVX2, two (of 16):
register-blocked kernels size their blocks by it. Only speed depends on it."""


def _llvm_type(vt: Vec) -> ir.VectorType:
    return ir.VectorType(ir.FloatType() if vt.dtype == types.float32 else ir.DoubleType(),
                         vt.lanes)


@register_model(Vec)
class _VecModel(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):  # type: ignore[no-untyped-def]
        super().__init__(dmm, fe_type, _llvm_type(fe_type))


def _vec_of(arr) -> Vec | None:  # type: ignore[no-untyped-def]
    if isinstance(arr, types.Array) and arr.dtype in _VEC:
        return _VEC[arr.dtype]
    return None


def _pointer(context, builder, aty, arr, idx, vt):  # type: ignore[no-untyped-def]
    data = context.make_array(aty)(context, builder, arr).data
    return builder.bitcast(builder.gep(data, [idx]), _llvm_type(vt).as_pointer())


@intrinsic
def nlanes(typingctx, arr):  # type: ignore[no-untyped-def]
    """The number of lanes of arr's vector type (a compile-time constant)."""
    vt = _vec_of(arr)
    if vt is None:
        return None

    def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
        return context.get_constant(types.intp, vt.lanes)

    return types.intp(arr), codegen


@intrinsic
def vzeros(typingctx, arr):  # type: ignore[no-untyped-def]
    """A vector of +0 of arr's dtype."""
    vt = _vec_of(arr)
    if vt is None:
        return None

    def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
        return ir.Constant(_llvm_type(vt), [0.0] * vt.lanes)

    return vt(arr), codegen


def _splat(builder, vt, s):  # type: ignore[no-untyped-def]
    v = ir.Constant(_llvm_type(vt), ir.Undefined)
    for k in range(vt.lanes):
        v = builder.insert_element(v, s, ir.IntType(32)(k))
    return v


def _opaque_zero(builder, ft):  # type: ignore[no-untyped-def]
    """+0 of float type ft through an empty inline asm: the optimizer cannot know its
    value, so it cannot prove that sums started from it are never -0 (true without
    FTZ, which LLVM assumes; false under TF's FTZ, where a sum flushes to -0)."""
    ity = ir.IntType(32 if ft == types.float32 else 64)
    bits = builder.asm(ir.FunctionType(ity, [ity]), "", "=r,0", [ity(0)], side_effect=False)
    return builder.bitcast(bits, ir.FloatType() if ft == types.float32 else ir.DoubleType())


@intrinsic
def zero_opaque(typingctx, arr):  # type: ignore[no-untyped-def]
    """+0 of arr's dtype that the optimizer cannot see through (see _opaque_zero)."""
    vt = _vec_of(arr)
    if vt is None:
        return None

    def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
        return _opaque_zero(builder, vt.dtype)

    return vt.dtype(arr), codegen


@intrinsic
def vzeros_opaque(typingctx, arr):  # type: ignore[no-untyped-def]
    """vzeros that the optimizer cannot see through: start a sum whose -0 a kernel
    tests for (vhas_negzero) from it."""
    vt = _vec_of(arr)
    if vt is None:
        return None

    def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
        return _splat(builder, vt, _opaque_zero(builder, vt.dtype))

    return vt(arr), codegen


def _load(context, builder, aty, arr, i, vt):  # type: ignore[no-untyped-def]
    return builder.load(_pointer(context, builder, aty, arr, i, vt),
                        align=vt.dtype.bitwidth // 8)


@intrinsic
def vload(typingctx, arr, i):  # type: ignore[no-untyped-def]
    """arr.flat[i:i + lanes] (arr C-contiguous and one-dimensional)."""
    vt = _vec_of(arr)
    if vt is None or not isinstance(i, types.Integer):
        return None

    def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
        return _load(context, builder, sig.args[0], args[0], args[1], vt)

    return vt(arr, i), codegen


@intrinsic
def vload_dup2(typingctx, arr, i):  # type: ignore[no-untyped-def]
    """arr.flat[i:i + lanes // 2] with every value repeated twice (lanes 2k and 2k + 1
    hold arr.flat[i + k])."""
    vt = _vec_of(arr)
    if vt is None or not isinstance(i, types.Integer):
        return None
    half = Vec(vt.dtype, vt.lanes // 2)

    def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
        h = builder.load(_pointer(context, builder, sig.args[0], args[0], args[1], half),
                         align=vt.dtype.bitwidth // 8)
        mask = ir.Constant(ir.VectorType(ir.IntType(32), vt.lanes),
                           [k // 2 for k in range(vt.lanes)])
        return builder.shuffle_vector(h, h, mask)

    return vt(arr, i), codegen


@intrinsic
def vpairsum(typingctx, a, b):  # type: ignore[no-untyped-def]
    """(0 + x[2k]) + x[2k + 1] in lane k, x being a's lanes then b's: neighbouring lanes
    summed in pairs as TF sums a multiplier of 2 (from +0, so -0 + -0 gives +0)."""
    if not (isinstance(a, Vec) and b == a):
        return None

    def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
        n = a.lanes
        idx = ir.VectorType(ir.IntType(32), n)
        even = builder.shuffle_vector(args[0], args[1], ir.Constant(idx, list(range(0, 2 * n, 2))))
        odd = builder.shuffle_vector(args[0], args[1], ir.Constant(idx, list(range(1, 2 * n, 2))))
        zero = ir.Constant(_llvm_type(a), [0.0] * n)
        return builder.fadd(builder.fadd(zero, even), odd)

    return a(a, b), codegen


@intrinsic
def vstore(typingctx, arr, i, v):  # type: ignore[no-untyped-def]
    """arr.flat[i:i + lanes] = v."""
    vt = _vec_of(arr)
    if vt is None or v != vt or not isinstance(i, types.Integer):
        return None

    def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
        builder.store(args[2], _pointer(context, builder, sig.args[0], args[0], args[1], vt),
                      align=vt.dtype.bitwidth // 8)
        return context.get_dummy_value()

    return types.none(arr, i, v), codegen


def _first_lanes(builder, lanes, n):  # type: ignore[no-untyped-def]
    """The mask <lane < n> (n an i64)."""
    i64 = ir.IntType(64)
    vt = ir.VectorType(i64, lanes)
    splat = builder.insert_element(ir.Constant(vt, ir.Undefined), n, ir.IntType(32)(0))
    splat = builder.shuffle_vector(splat, splat,
                                   ir.Constant(ir.VectorType(ir.IntType(32), lanes), [0] * lanes))
    return builder.icmp_unsigned("<", ir.Constant(vt, list(range(lanes))), splat)


def _masked(vt: Vec, what: str) -> str:
    return f"llvm.masked.{what}.v{vt.lanes}f{vt.dtype.bitwidth}.p0"


@intrinsic
def vload_part(typingctx, arr, i, n):  # type: ignore[no-untyped-def]
    """arr.flat[i:i + n] in the first n lanes (0 < n <= lanes), +0 in the others; nothing
    past i + n is read (a masked load): the channels past the last whole vector."""
    vt = _vec_of(arr)
    if vt is None or not isinstance(i, types.Integer) or not isinstance(n, types.Integer):
        return None

    def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
        lt = _llvm_type(vt)
        ptr = _pointer(context, builder, sig.args[0], args[0], args[1], vt)
        mask = _first_lanes(builder, vt.lanes,
                            context.cast(builder, args[2], sig.args[2], types.int64))
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(lt, [ptr.type, ir.IntType(32), mask.type, lt]),
            _masked(vt, "load"))
        return builder.call(fn, [ptr, ir.IntType(32)(vt.dtype.bitwidth // 8), mask,
                                 ir.Constant(lt, [0.0] * vt.lanes)])

    return vt(arr, i, n), codegen


@intrinsic
def vstore_part(typingctx, arr, i, v, n):  # type: ignore[no-untyped-def]
    """arr.flat[i:i + n] = v's first n lanes (a masked store; nothing else is written)."""
    vt = _vec_of(arr)
    if (vt is None or v != vt or not isinstance(i, types.Integer)
            or not isinstance(n, types.Integer)):
        return None

    def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
        lt = _llvm_type(vt)
        ptr = _pointer(context, builder, sig.args[0], args[0], args[1], vt)
        mask = _first_lanes(builder, vt.lanes,
                            context.cast(builder, args[3], sig.args[3], types.int64))
        fn = cgutils.get_or_insert_function(
            builder.module,
            ir.FunctionType(ir.VoidType(), [lt, ptr.type, ir.IntType(32), mask.type]),
            _masked(vt, "store"))
        builder.call(fn, [args[2], ptr, ir.IntType(32)(vt.dtype.bitwidth // 8), mask])
        return context.get_dummy_value()

    return types.none(arr, i, v, n), codegen


@intrinsic
def vstore_nt(typingctx, arr, i, v):  # type: ignore[no-untyped-def]
    """vstore that bypasses the caches (a non-temporal store): the output is written
    without first being read for ownership. arr.flat[i] must be 64-byte aligned."""
    vt = _vec_of(arr)
    if vt is None or v != vt or not isinstance(i, types.Integer):
        return None

    def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
        st = builder.store(args[2], _pointer(context, builder, sig.args[0], args[0], args[1],
                                             vt), align=64)
        st.set_metadata("nontemporal", builder.module.add_metadata([ir.IntType(32)(1)]))
        return context.get_dummy_value()

    return types.none(arr, i, v), codegen


# Eight float32 lanes (one AVX2 register) across eight channels of a channel-major
# (NCHW) array: lane k of a vector belongs to channel k, whose values lie ``stride``
# apart. The loads below read eight rows of eight values and transpose them in registers.
VEC8 = Vec(types.float32, 8)


def _f32_array(arr) -> bool:  # type: ignore[no-untyped-def]
    return isinstance(arr, types.Array) and arr.dtype == types.float32


def _load8(context, builder, aty, arr, idx):  # type: ignore[no-untyped-def]
    return builder.load(_pointer(context, builder, aty, arr, idx, VEC8), align=4)


def _shuffle(builder, a, b, mask):  # type: ignore[no-untyped-def]
    return builder.shuffle_vector(a, b, ir.Constant(ir.VectorType(ir.IntType(32), 8), mask))


@intrinsic
def vfull8(typingctx, arr, value):  # type: ignore[no-untyped-def]
    """Eight float32 copies of value (arr: any float32 array, for typing only)."""
    if not _f32_array(arr) or not isinstance(value, (types.Float, types.Integer)):
        return None

    def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
        return _splat(builder, VEC8, context.cast(builder, args[1], sig.args[1],
                                                  types.float32))

    return VEC8(arr, value), codegen


@intrinsic
def vload8(typingctx, arr, i):  # type: ignore[no-untyped-def]
    """arr.flat[i:i + 8] of a float32 array (C-contiguous, one-dimensional)."""
    if not _f32_array(arr) or not isinstance(i, types.Integer):
        return None

    def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
        return _load8(context, builder, sig.args[0], args[0], args[1])

    return VEC8(arr, i), codegen


@intrinsic
def vstore8(typingctx, arr, i, v):  # type: ignore[no-untyped-def]
    """arr.flat[i:i + 8] = v (float32 x 8)."""
    if not _f32_array(arr) or not isinstance(i, types.Integer) or v != VEC8:
        return None

    def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
        builder.store(args[2], _pointer(context, builder, sig.args[0], args[0], args[1], VEC8),
                      align=4)
        return context.get_dummy_value()

    return types.none(arr, i, v), codegen


@intrinsic
def vgather8(typingctx, arr, i, stride):  # type: ignore[no-untyped-def]
    """Lane k = arr.flat[i + k * stride], k < 8 (eight scalar loads)."""
    if not (_f32_array(arr) and isinstance(i, types.Integer)
            and isinstance(stride, types.Integer)):
        return None

    def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
        data = context.make_array(sig.args[0])(context, builder, args[0]).data
        idx = context.cast(builder, args[1], sig.args[1], types.int64)
        st = context.cast(builder, args[2], sig.args[2], types.int64)
        v = ir.Constant(_llvm_type(VEC8), ir.Undefined)
        for k in range(8):
            p = builder.gep(data, [builder.add(idx, builder.mul(st, ir.IntType(64)(k)))])
            v = builder.insert_element(v, builder.load(p, align=4), ir.IntType(32)(k))
        return v

    return VEC8(arr, i, stride), codegen


@intrinsic
def vload8_t(typingctx, arr, i, stride):  # type: ignore[no-untyped-def]
    """Eight vectors: vector r has lane k = arr.flat[i + k * stride + r] (r, k < 8).

    Eight contiguous loads of eight values, transposed with the usual unpack / shuffle /
    128-bit permute sequence (24 shuffles)."""
    if not (_f32_array(arr) and isinstance(i, types.Integer)
            and isinstance(stride, types.Integer)):
        return None
    tup = types.UniTuple(VEC8, 8)

    def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
        idx = context.cast(builder, args[1], sig.args[1], types.int64)
        st = context.cast(builder, args[2], sig.args[2], types.int64)
        rows = [_load8(context, builder, sig.args[0], args[0],
                       builder.add(idx, builder.mul(st, ir.IntType(64)(k)))) for k in range(8)]
        t = []
        for k in range(0, 8, 2):  # unpcklps / unpckhps within 128-bit halves
            t.append(_shuffle(builder, rows[k], rows[k + 1], [0, 8, 1, 9, 4, 12, 5, 13]))
            t.append(_shuffle(builder, rows[k], rows[k + 1], [2, 10, 3, 11, 6, 14, 7, 15]))
        u = []
        for k in (0, 4):  # shufps: pairs of pairs
            for h in (0, 1):
                a, b = t[k + h], t[k + 2 + h]
                u.append(_shuffle(builder, a, b, [0, 1, 8, 9, 4, 5, 12, 13]))
                u.append(_shuffle(builder, a, b, [2, 3, 10, 11, 6, 7, 14, 15]))
        # u[0..3]: rows 0-3 of channels 0-3 / 4-7 split by 128-bit half; u[4..7]: the
        # same for channels 4-7. Column r of the result: low or high halves joined.
        out = []
        for r in range(8):
            h = r // 4
            a, b = u[r % 4], u[4 + r % 4]
            mask = [0, 1, 2, 3, 8, 9, 10, 11] if h == 0 else [4, 5, 6, 7, 12, 13, 14, 15]
            out.append(_shuffle(builder, a, b, mask))
        return context.make_tuple(builder, tup, out)

    return tup(arr, i, stride), codegen


@intrinsic
def vlane(typingctx, v, k):  # type: ignore[no-untyped-def]
    """Lane k of a vector."""
    if not isinstance(v, Vec) or not isinstance(k, types.Integer):
        return None

    def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
        return builder.extract_element(args[0], args[1])

    return v.dtype(v, k), codegen


STREAM_MIN_BYTES = 4 << 20
"""Outputs this big are written with non-temporal stores: they would mostly leave the
caches before use anyway, and skipping the read-for-ownership saves a third of a
copy-like op's memory traffic."""


def _address(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]  # (a.ctypes would build a ctypes object)


@jit
def _bytes_address(a):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
    return a.ctypes.data  # (a compiled call: ~0.25 us, against ~1.5 for _address)


def aligned_empty(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """An uninitialised C-contiguous array on a 64-byte boundary (vstore_nt needs it)."""
    nbytes = math.prod(shape) * dtype.itemsize
    buf = np.empty(nbytes + 64, np.uint8)
    off = -_bytes_address(buf) % 64
    return buf[off:off + nbytes].view(dtype).reshape(shape)


@inline
def aligned_scratch(n, like):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
    """Compiled code's aligned_empty: n uninitialised values of like's dtype (1-D, C
    layout) on a 64-byte boundary. A kernel's scratch rows read by whole vectors must
    start on one: off it every vector load spans two cache lines, and a kernel's speed
    would depend on where the allocator put its scratch."""
    k = 64 // like.itemsize
    raw = np.empty(n + k, like.dtype)
    off = (-(raw.ctypes.data // like.itemsize)) % k
    return raw[off:off + n]


def stream_output(shape: tuple[int, ...], dtype: np.dtype,
                  min_bytes: int = STREAM_MIN_BYTES) -> tuple[np.ndarray, bool]:
    """An uninitialised output and whether kernels should write it with vstore_nt: only
    outputs of min_bytes or more whose last axis is whole 64-byte lines (so that every
    vector a kernel stores at a multiple of the lane count is line-aligned)."""
    dtype = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    if not (shape and shape[-1] * dtype.itemsize % 64 == 0 and nbytes >= min_bytes):
        return np.empty(shape, dtype), False
    out = aligned_empty(shape, dtype)
    assert _address(out) % 64 == 0  # a misaligned movnt faults
    return out, True


@inline
def vput(arr, i, v, stream):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
    """vstore, or vstore_nt when ``stream``: a constant of the calling kernel (a factory's
    argument), so each compiled variant keeps only its own store.

    Kernel factories pass such flags as plain values and call module-level helpers;
    a kernel must never close over a Numba function: Numba keys its on-disk cache on
    the pickled closure, and a dispatcher pickles with a fresh uuid in every process,
    so the kernel would be compiled again by every process (tests pin this)."""
    if stream:
        vstore_nt(arr, i, v)
    else:
        vstore(arr, i, v)


@intrinsic
def vfull(typingctx, arr, value):  # type: ignore[no-untyped-def]
    """A vector of ``value`` (converted to arr's dtype) in every lane."""
    vt = _vec_of(arr)
    if vt is None or not isinstance(value, (types.Float, types.Integer)):
        return None

    def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
        return _splat(builder, vt, context.cast(builder, args[1], sig.args[1], vt.dtype))

    return vt(arr, value), codegen


def _binary(name, doc, emit):  # type: ignore[no-untyped-def]
    def typer(typingctx, a, b):  # type: ignore[no-untyped-def]
        if not (isinstance(a, Vec) and b == a):
            return None

        def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
            return emit(builder, args[0], args[1])

        return a(a, b), codegen

    typer.__name__ = typer.__qualname__ = name
    typer.__doc__ = doc
    return intrinsic(typer)


vadd = _binary("vadd", "a + b per lane.", lambda bd, a, b: bd.fadd(a, b))
vsub = _binary("vsub", "a - b per lane.", lambda bd, a, b: bd.fsub(a, b))
vmul = _binary("vmul", "a * b per lane (rounded; never fused with a later add).",
               lambda bd, a, b: bd.fmul(a, b))
vdiv = _binary("vdiv", "a / b per lane.", lambda bd, a, b: bd.fdiv(a, b))
vmax_keep = _binary(
    "vmax_keep", "b where a < b, else a, per lane: a running maximum that a NaN never "
    "replaces and that keeps the earlier of equal values (-0 vs +0), as TF's pooling "
    "comparisons.", lambda bd, a, b: bd.select(bd.fcmp_ordered("<", a, b), b, a))


@intrinsic
def flush_denormal(typingctx, a):  # type: ignore[no-untyped-def]
    """a with a denormal (per lane) replaced by the zero of its sign, whatever MXCSR
    says: what an x86 max instruction returns under DAZ (TF's max pooling)."""
    if isinstance(a, Vec):
        ft, lanes = a.dtype, a.lanes
    elif a in (types.float32, types.float64):
        ft, lanes = a, 0
    else:
        return None

    def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
        f32 = ft == types.float32
        fty = ir.FloatType() if f32 else ir.DoubleType()
        ity = ir.IntType(32 if f32 else 64)
        tiny = fty(float(np.finfo(np.float32 if f32 else np.float64).tiny))
        sign = ity(1 << (31 if f32 else 63))
        if lanes:
            fty, ity = ir.VectorType(fty, lanes), ir.VectorType(ity, lanes)
            tiny, sign = ir.Constant(fty, [tiny] * lanes), ir.Constant(ity, [sign] * lanes)
        fabs = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(fty, [fty]),
            f"llvm.fabs.{f'v{lanes}' if lanes else ''}{'f32' if f32 else 'f64'}")
        small = builder.fcmp_ordered("<", builder.call(fabs, [args[0]]), tiny)
        zero = builder.bitcast(builder.and_(builder.bitcast(args[0], ity), sign), fty)
        return builder.select(small, zero, args[0])

    return a(a), codegen


def _ternary_select(name, doc, pred):  # type: ignore[no-untyped-def]
    def typer(typingctx, a, b, x, y):  # type: ignore[no-untyped-def]
        if not (isinstance(a, Vec) and b == a and x == a and y == a):
            return None

        def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
            return builder.select(pred(builder, args[0], args[1]), args[2], args[3])

        return a(a, b, x, y), codegen

    typer.__name__ = typer.__qualname__ = name
    typer.__doc__ = doc
    return intrinsic(typer)


vwhere_lt = _ternary_select("vwhere_lt", "x where a < b, else y, per lane (false for NaN).",
                            lambda bd, a, b: bd.fcmp_ordered("<", a, b))
vwhere_eq = _ternary_select("vwhere_eq", "x where a == b, else y, per lane (false for NaN).",
                            lambda bd, a, b: bd.fcmp_ordered("==", a, b))
vwhere_le = _ternary_select("vwhere_le", "x where a <= b, else y, per lane (false for NaN).",
                            lambda bd, a, b: bd.fcmp_ordered("<=", a, b))


def _fold(h: int):  # type: ignore[no-untyped-def]
    def typer(typingctx, a, b):  # type: ignore[no-untyped-def]
        if not (isinstance(a, Vec) and b == a and a.lanes >= 2 * h):
            return None

        def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
            n, seg = a.lanes, 2 * h
            idx = ir.VectorType(ir.IntType(32), n)
            lo = [j * seg + i for j in range(2 * n // seg) for i in range(h)]
            hi = [j * seg + h + i for j in range(2 * n // seg) for i in range(h)]
            x = builder.shuffle_vector(args[0], args[1], ir.Constant(idx, lo))
            y = builder.shuffle_vector(args[0], args[1], ir.Constant(idx, hi))
            return builder.fadd(x, y)

        return a(a, b), codegen

    typer.__name__ = typer.__qualname__ = f"vfold{h}"
    typer.__doc__ = (
        f"One halving step of {h} lanes for the segments of a then b: a and b hold "
        f"segments of {2 * h} lanes each (one sum each); lane l < {h} of every segment "
        f"plus lane l + {h}, the segments' halves kept in order (a's, then b's), so "
        "that four steps (8, 4, 2, 1) halve 16 vectors' lanes into one vector, lane i "
        "the i-th vector's sum, with the adds of a lane-by-lane halving.")
    return intrinsic(typer)


vfold8 = _fold(8)
vfold4 = _fold(4)
vfold2 = _fold(2)
vfold1 = _fold(1)


@intrinsic
def vany_ne(typingctx, a, b):  # type: ignore[no-untyped-def]
    """True if a != b in any lane (a NaN lane counts as unequal)."""
    if not (isinstance(a, Vec) and b == a):
        return None

    def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
        ne = builder.fcmp_unordered("!=", args[0], args[1])
        bits = builder.bitcast(ne, ir.IntType(a.lanes))
        return builder.icmp_unsigned("!=", bits, ir.IntType(a.lanes)(0))

    return types.boolean(a, b), codegen


def _min_bits(bd, a, b):  # type: ignore[no-untyped-def]
    ity = ir.VectorType(ir.IntType(32 if a.type.element == ir.FloatType() else 64),
                        a.type.count)
    ia, ib = bd.bitcast(a, ity), bd.bitcast(b, ity)
    return bd.bitcast(bd.select(bd.icmp_signed("<", ib, ia), ib, ia), a.type)


vmin_bits = _binary(
    "vmin_bits", "The lane-wise minimum of a's and b's bits read as signed integers (in "
    "a's type): -0's bits, the sign bit alone, are the least of all, so a running minimum "
    "over the vectors a kernel stores tells whether any lane was -0 (vhas_negzero).",
    _min_bits)


@intrinsic
def vhas_negzero(typingctx, a):  # type: ignore[no-untyped-def]
    """True if any lane of a is -0 (its bits are the sign bit alone)."""
    if not isinstance(a, Vec):
        return None

    def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
        w = 32 if a.dtype == types.float32 else 64
        ity = ir.VectorType(ir.IntType(w), a.lanes)
        eq = builder.icmp_signed("==", builder.bitcast(args[0], ity),
                                 ir.Constant(ity, [1 << (w - 1)] * a.lanes))
        bits = builder.bitcast(eq, ir.IntType(a.lanes))
        return builder.icmp_unsigned("!=", bits, ir.IntType(a.lanes)(0))

    return types.boolean(a), codegen


@intrinsic
def vmuladd(typingctx, acc, a, b):  # type: ignore[no-untyped-def]
    """acc + a * b per lane: the product rounded, then the sum."""
    if not (isinstance(acc, Vec) and a == acc and b == acc):
        return None

    def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
        return builder.fadd(args[0], builder.fmul(args[1], args[2]))

    return acc(acc, a, b), codegen


@intrinsic
def vmuladd4(typingctx, v0, v1, v2, v3, w, x0, x1, x2, x3):  # type: ignore[no-untyped-def]
    """(v0 + w * x0, ..., v3 + w * x3): four vmuladds with one operand in common (one
    call in Numba's IR, where four compiled slowly in every inlined copy)."""
    if not isinstance(v0, Vec) or any(t != v0 for t in (v1, v2, v3, w, x0, x1, x2, x3)):
        return None
    tup = types.UniTuple(v0, 4)

    def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
        v, wv, x = args[:4], args[4], args[5:]
        return context.make_tuple(builder, tup, [builder.fadd(v[k], builder.fmul(wv, x[k]))
                                                 for k in range(4)])

    return tup(v0, v1, v2, v3, w, x0, x1, x2, x3), codegen


def _load_or_zero(context, builder, aty, arr, check, j, n, i, vt):  # type: ignore[no-untyped-def]
    if not check:
        return _load(context, builder, aty, arr, i, vt)
    # (the branches of Numba's ``0 <= j < n``: the same CFG as the helper it replaces)
    with builder.if_else(builder.icmp_signed("<=", j.type(0), j)) as (then, otherwise):
        with then:
            c_in, b1 = builder.icmp_signed("<", j, n), builder.block
        with otherwise:
            b2 = builder.block
    inside = builder.phi(ir.IntType(1))
    inside.add_incoming(c_in, b1)
    inside.add_incoming(ir.IntType(1)(0), b2)
    with builder.if_else(inside) as (then, otherwise):
        with then:
            v_in, b_in = _load(context, builder, aty, arr, i, vt), builder.block
        with otherwise:
            b_out = builder.block
    phi = builder.phi(_llvm_type(vt))
    phi.add_incoming(v_in, b_in)
    phi.add_incoming(ir.Constant(_llvm_type(vt), [0.0] * vt.lanes), b_out)
    return phi


def _loads4(context, builder, aty, arr, chk, j, n, i, s, vt):  # type: ignore[no-untyped-def]
    vals = []
    for k in range(4):  # (i + k * step, j + k: the helper's arithmetic)
        jk = builder.add(j, j.type(k)) if k and chk else j
        ik = builder.add(i, builder.mul(i.type(k), s) if k > 1 else s) if k else i
        vals.append(_load_or_zero(context, builder, aty, arr, chk, jk, n, ik, vt))
    return vals


@intrinsic
def vload4(typingctx, arr, i, step):  # type: ignore[no-untyped-def]
    """(vload(arr, i + k * step) for k < 4): the loads of four pixels of a row."""
    vt = _vec_of(arr)
    if vt is None or not all(isinstance(t, types.Integer) for t in (i, step)):
        return None
    tup = types.UniTuple(vt, 4)

    def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
        i_, s_ = (context.cast(builder, a, t, types.intp) for a, t in zip(args[1:], sig.args[1:]))
        vals = _loads4(context, builder, sig.args[0], args[0], False, None, None, i_, s_, vt)
        return context.make_tuple(builder, tup, vals)

    return tup(arr, i, step), codegen


@intrinsic
def vload4_chk(typingctx, arr, check, j, n, i, step):  # type: ignore[no-untyped-def]
    """vload4(arr, i, step), each load +0 where ``check`` (a literal bool) and column
    j + k is outside [0, n): four pixels of a row, those off its ends reading as zeros
    (never loaded)."""
    vt = _vec_of(arr)
    if (vt is None or not isinstance(check, types.BooleanLiteral)
            or not all(isinstance(t, types.Integer) for t in (j, n, i, step))):
        return None
    tup = types.UniTuple(vt, 4)
    chk = check.literal_value

    def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
        j_, n_, i_, s_ = (context.cast(builder, a, t, types.intp)
                          for a, t in zip(args[2:], sig.args[2:]))
        vals = _loads4(context, builder, sig.args[0], args[0], chk, j_, n_, i_, s_, vt)
        return context.make_tuple(builder, tup, vals)

    return tup(arr, check, j, n, i, step), codegen


@intrinsic
def vload_chk(typingctx, arr, check, j, n, i):  # type: ignore[no-untyped-def]
    """vload(arr, i), or +0 where ``check`` (a literal bool) and j is outside [0, n)."""
    vt = _vec_of(arr)
    if (vt is None or not isinstance(check, types.BooleanLiteral)
            or not all(isinstance(t, types.Integer) for t in (j, n, i))):
        return None
    chk = check.literal_value

    def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
        j_, n_, i_ = (context.cast(builder, a, t, types.intp)
                      for a, t in zip(args[2:], sig.args[2:]))
        return _load_or_zero(context, builder, sig.args[0], args[0], chk, j_, n_, i_, vt)

    return vt(arr, check, j, n, i), codegen


@intrinsic
def prefetch(typingctx, arr, i):  # type: ignore[no-untyped-def]
    """Hint the cache line holding arr.flat[i] into L2 (``prefetcht1``; never faults, any
    i). Not into L1 (``prefetcht0``): the kernels prefetch a row of work ahead, and lines
    brought into L1 that early evict the lines in use (measured: benchmarks/RESULTS.md)."""
    if not isinstance(arr, types.Array) or not isinstance(i, types.Integer):
        return None

    def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
        data = context.make_array(sig.args[0])(context, builder, args[0]).data
        p = builder.bitcast(builder.gep(data, [args[1]]), ir.IntType(8).as_pointer())
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [p.type, i32, i32, i32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0")
        builder.call(fn, [p, i32(0), i32(2), i32(1)])  # read, locality 2 (L2), data
        return context.get_dummy_value()

    return types.none(arr, i), codegen


__all__ = ["Vec", "flush_denormal", "nlanes", "prefetch", "vadd", "vany_ne", "vdiv", "vfull",
           "vhas_negzero", "vload", "vload4", "vload4_chk", "vload_chk", "vload_dup2",
           "vload_part", "vmax_keep", "vmin_bits", "vmul", "vmuladd", "vmuladd4", "vput",
           "vstore", "vstore_nt", "vstore_part", "vsub", "vwhere_eq", "vwhere_lt", "vzeros",
           "vzeros_opaque", "zero_opaque"]
