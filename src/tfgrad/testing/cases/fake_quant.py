"""Op cases for the fake-quant family (see tfgrad/testing/cases/__init__.py).

Inputs mix random values around the range with the values where TF's arithmetic is
delicate: the nudged ends, grid points and half-way points, +-0, denormals, +-inf, NaN.
Gradients carry float16-precision mantissas with spread exponents, so that float32 sums
round (and the summation order shows) while the fixture file stays compressible.

Reduced columns stay shorter than 44800 values in the fixtures: beyond that TF's thread
pool splits the sums by its thread count (tests/test_fake_quant.py covers that live).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from tfgrad import InvalidArgumentError as IAE
from tfgrad._opdefs import OPS
from tfgrad.ops.fake_quant import nudge

from ..harness import Bench, array_bytes, torch_module
from . import Case, ErrorCase, Warmup

F32 = np.float32
_OPS = {
    "args": "FakeQuantWithMinMaxArgs",
    "args_grad": "FakeQuantWithMinMaxArgsGradient",
    "vars": "FakeQuantWithMinMaxVars",
    "vars_grad": "FakeQuantWithMinMaxVarsGradient",
    "pc": "FakeQuantWithMinMaxVarsPerChannel",
    "pc_grad": "FakeQuantWithMinMaxVarsPerChannelGradient",
}
_DENORMAL = F32(1e-40)


def values(rng: np.random.Generator, shape: tuple[int, ...], lo: float, hi: float,
           num_bits: int = 8, narrow: bool = False, special: bool = True) -> np.ndarray:
    """float32 values in and around [lo, hi], with grid and half-way points and specials."""
    n = int(np.prod(shape))
    lo64, hi64 = float(lo), float(hi)
    if not (np.isfinite(lo64) and np.isfinite(hi64)) or lo64 >= hi64:
        lo64, hi64 = -3.0, 3.0
    width = hi64 - lo64
    x = rng.uniform(lo64 - 0.3 * width, hi64 + 0.3 * width, n)
    steps = (1 << num_bits) - 1 - int(narrow)
    scale = width / steps
    k = rng.integers(-2, steps + 3, n)
    pick = rng.random(n)
    x = np.where(pick < 0.2, lo64 + k * scale, x)           # (near) grid points
    x = np.where((pick >= 0.2) & (pick < 0.4), lo64 + (k + 0.5) * scale, x)  # half-way
    with np.errstate(over="ignore"):
        x = x.astype(F32)
    if special and n >= 12:
        idx = rng.choice(n, 12, replace=False)
        x[idx] = np.array([lo, hi, np.nextafter(F32(lo), F32(-np.inf)),
                           np.nextafter(F32(hi), F32(np.inf)), 0.0, -0.0, _DENORMAL, -_DENORMAL,
                           np.inf, -np.inf, np.nan, lo64 + width / 2], F32)
    return x.reshape(shape)


def gradients(rng: np.random.Generator, shape: tuple[int, ...], special: bool = True
              ) -> np.ndarray:
    """Random gradients: float16 mantissas times 2**[-8, 8), a few specials."""
    n = int(np.prod(shape))
    g = rng.standard_normal(n).astype(np.float16).astype(F32)
    g *= np.exp2(rng.integers(-8, 8, n)).astype(F32)
    if special and n >= 40:
        idx = rng.choice(n, 4, replace=False)
        g[idx] = np.array([-0.0, _DENORMAL, -_DENORMAL, -1.5e-38], F32)
    return g.reshape(shape)


# --------------------------------------------------------------------------------------
# Builders
# --------------------------------------------------------------------------------------
_CASES: list[Case] = []


def _add(kind: str, name: str, make: Callable[[np.random.Generator], dict[str, Any]],
         **kw: Any) -> None:
    _CASES.append(Case(_OPS[kind], name, make, **kw))


def _args(name: str, shape: tuple[int, ...], lo: float, hi: float, nb: int = 8,
          narrow: bool = False, dtype: Any = F32) -> None:
    def fwd(rng: np.random.Generator) -> dict[str, Any]:
        return dict(inputs=values(rng, shape, lo, hi, nb, narrow).astype(dtype), min=lo,
                    max=hi, num_bits=nb, narrow_range=narrow)

    def grad(rng: np.random.Generator) -> dict[str, Any]:
        return dict(gradients=gradients(rng, shape).astype(dtype),
                    inputs=values(rng, shape, lo, hi, nb, narrow).astype(dtype),
                    min=lo, max=hi, num_bits=nb, narrow_range=narrow)

    _add("args", name, fwd)
    _add("args_grad", name, grad)


def _vars(name: str, shape: tuple[int, ...], lo: float, hi: float, nb: int = 8,
          narrow: bool = False, fwd_too: bool = True) -> None:
    def fwd(rng: np.random.Generator) -> dict[str, Any]:
        return dict(inputs=values(rng, shape, lo, hi, nb, narrow), min=np.array(lo, F32),
                    max=np.array(hi, F32), num_bits=nb, narrow_range=narrow)

    def grad(rng: np.random.Generator) -> dict[str, Any]:
        return dict(gradients=gradients(rng, shape), inputs=values(rng, shape, lo, hi, nb, narrow),
                    min=np.array(lo, F32), max=np.array(hi, F32), num_bits=nb,
                    narrow_range=narrow)

    if fwd_too:
        _add("vars", name, fwd)
    _add("vars_grad", name, grad)


def _channel_ranges(rng: np.random.Generator, d: int, odd: bool) -> tuple[np.ndarray, ...]:
    """Per-channel (min, max): straddling zero, positive, negative; with ``odd`` also a
    zero channel (0, 0), an inverted one, a degenerate one and a NaN one."""
    kind = rng.integers(0, 3, d)
    a = rng.uniform(0.05, 4, d)
    b = rng.uniform(0.05, 4, d)
    lo = np.where(kind == 0, -a, np.where(kind == 1, a, -a - b))
    hi = np.where(kind == 0, b, np.where(kind == 1, a + b, -a))
    lo, hi = lo.astype(F32), hi.astype(F32)
    if odd and d >= 6:
        lo[:6] = [0.0, -0.0, 1.0, 0.5, np.nan, 0.0]
        hi[:6] = [0.0, 0.0, -1.0, 0.5, 1.0, 1e-40]
    return lo, hi


def _pc(name: str, shape: tuple[int, ...], nb: int = 8, narrow: bool = False,
        odd: bool = False, fwd_too: bool = True) -> None:
    d = shape[-1]

    def data(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        lo, hi = _channel_ranges(rng, d, odd)
        x = np.empty(shape, F32)
        for c in range(d):
            x[..., c] = values(rng, shape[:-1], lo[c], hi[c], nb, narrow,
                               special=c % 2 == 0)
        return x, lo, hi

    def fwd(rng: np.random.Generator) -> dict[str, Any]:
        x, lo, hi = data(rng)
        return dict(inputs=x, min=lo, max=hi, num_bits=nb, narrow_range=narrow)

    def grad(rng: np.random.Generator) -> dict[str, Any]:
        x, lo, hi = data(rng)
        return dict(gradients=gradients(rng, shape), inputs=x, min=lo, max=hi, num_bits=nb,
                    narrow_range=narrow)

    if fwd_too:
        _add("pc", name, fwd)
    _add("pc_grad", name, grad)


# Args (and its gradient): every num_bits, narrow or not, ranges anywhere.
for _nb in range(2, 17):
    _args(f"bits{_nb}{'_narrow' if _nb % 3 == 0 else ''}", (6, 7), -1.7, 2.3, _nb, _nb % 3 == 0)
_args("default", (5, 8), -6.0, 6.0)
_args("positive_range", (40,), 1.0, 2.0)
_args("negative_range", (40,), -2.0, -1.0)
_args("straddle_small", (40,), -0.1, 0.9)
_args("tiny_range", (40,), -3e-36, 4e-36, 2)
_args("huge_range", (40,), -1e37, 2e37, 16)
_args("overflowing_range", (12,), -3e38, 3e38)
_args("infinite_min", (12,), -np.inf, 1.0)
_args("infinite_min_narrow", (12,), -np.inf, 1.0, 8, True)
_args("float64_inputs", (3, 4), -1.0, 1.0, dtype=np.float64)
_args("float16_inputs", (3, 4), -1.0, 1.0, dtype=np.float16)
_args("empty", (0, 3), -1.0, 1.0)
_args("scalar", (), -1.0, 1.0)
_args("rank5", (2, 1, 3, 2, 2), -0.5, 0.7, 4, True)

# Vars: the same, plus what only Vars accepts (min > max, min == max, NaN, zeros).
for _nb in (2, 3, 5, 8, 11, 16):
    _vars(f"bits{_nb}{'_narrow' if _nb % 2 else ''}", (6, 7), -1.7, 2.3, _nb, bool(_nb % 2))
_vars("default", (5, 8), -6.0, 6.0)
_vars("positive_range", (40,), 1.0, 2.0)
_vars("negative_range", (40,), -2.0, -1.0)
_vars("straddle_small", (40,), -0.1, 0.9)
_vars("min_above_max", (20,), 1.0, -1.0)
_vars("min_equals_max", (20,), 1.0, 1.0)
_vars("zero_range", (20,), 0.0, 0.0)
_vars("negative_zero_range", (20,), -0.0, 0.0)
_vars("denormal_max", (20,), 0.0, 1e-40)
_vars("denormal_min", (20,), -1e-40, 1.0)
_vars("nan_min", (20,), np.nan, 1.0)
_vars("tiny_range", (40,), -3e-36, 4e-36, 2)
_vars("infinite_min", (12,), -np.inf, 1.0)
_vars("empty", (0,), -1.0, 1.0)
_vars("scalar", (), -1.0, 1.0)
# Sizes around Eigen's leaf (8192) and its packets, for the gradient's sums.
for _n in (31, 33, 100, 8191, 8193, 16391, 24583):
    _vars(f"size{_n}", (_n,), -1.0, 0.6, 8, False, fwd_too=_n < 200)
_vars("size3x3001", (3, 3001), -0.4, 0.9, 5, True, fwd_too=False)

# PerChannel: ranks 1 to 5, channel counts 1 to 37, odd ranges per channel.
_pc("rank1", (9,), odd=True)
_pc("rank2", (11, 8), 4, True, odd=True)
_pc("rank3", (3, 5, 7), 16)
_pc("rank4", (2, 3, 4, 6), 2, odd=True)
_pc("rank5", (2, 2, 1, 3, 5), 7, True)
_pc("one_channel", (50, 1))
_pc("many_channels", (5, 37), 9, odd=True)
_pc("empty_rows", (0, 3))
_pc("no_channels", (4, 0))
for _nb in (3, 6, 10, 13, 15):
    _pc(f"bits{_nb}", (7, 6), _nb, _nb % 2 == 1, odd=True)
for _shape in ((33, 2), (8191, 2), (8193, 2), (16392, 1), (2, 3, 2053, 1)):
    _pc("rows" + "x".join(map(str, _shape)), _shape, 8, False, odd=False, fwd_too=False)
_pc("rows8197x6_odd", (8197, 6), 8, True, odd=True, fwd_too=False)

CASES: list[Case] = _CASES


# --------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------
def _z(*shape: int) -> np.ndarray:
    return np.zeros(shape, F32)


def _o(*shape: int) -> np.ndarray:
    return np.ones(shape, F32)


_A, _AG, _V, _VG, _P, _PG = (_OPS[k] for k in ("args", "args_grad", "vars", "vars_grad", "pc",
                                               "pc_grad"))
_NUM_BITS = r"num_bits must be between 2 and 16, inclusive"
# TF 2.21's eager kernel aborts; the words are its shape function's (tf.function), pinned
# by tests/test_fake_quant.py
_ABORTS = ("TF 2.21 aborts the process (Check failed: d >= 0) on a rank-0 input; in a "
           "tf.function its shape function raises ValueError with these words")
ERROR_CASES: list[ErrorCase] = [
    ErrorCase(_A, "num_bits_1", lambda: dict(inputs=_z(2), num_bits=1), IAE, _NUM_BITS),
    ErrorCase(_A, "num_bits_17", lambda: dict(inputs=_z(2), num_bits=17), IAE, _NUM_BITS),
    ErrorCase(_A, "min_equals_max", lambda: dict(inputs=_z(2), min=1.0, max=1.0), IAE,
              r"min has to be smaller than max, was: 1 >= 1"),
    ErrorCase(_A, "min_above_max", lambda: dict(inputs=_z(2), min=2.0, max=-1.5), IAE,
              r"min has to be smaller than max, was: 2 >= -1.5"),
    # (6 significant digits even where they do not round-trip, as TF 2.21 prints them)
    ErrorCase(_A, "min_above_max_6_digits",
              lambda: dict(inputs=_z(2), min=123456.7, max=-1.2345678),
              IAE, r"min has to be smaller than max, was: 123457 >= -1\.23457$"),
    ErrorCase(_A, "nan_min", lambda: dict(inputs=_z(2), min=float("nan"), max=1.0), IAE,
              r"min has to be smaller than max, was: nan >= 1"),
    ErrorCase(_A, "nan_max", lambda: dict(inputs=_z(2), min=-1.0, max=float("nan")), IAE,
              r"min has to be smaller than max"),
    ErrorCase(_A, "denormal_max_is_zero", lambda: dict(inputs=_z(2), min=0.0, max=1e-45),
              IAE, r"min has to be smaller than max, was: 0 >= 0"),
    ErrorCase(_A, "int_inputs", lambda: dict(inputs=np.array([1, 2], np.int32)), TypeError,
              r"inputs.*float32", tf_rejects=False,
              why="TF's Python binding casts an int32 array to float32; tfgrad's binding "
              "converts only between float dtypes"),
    ErrorCase(_AG, "shape_mismatch", lambda: dict(gradients=_z(2), inputs=_z(3)), IAE,
              r"must have the same size and shape.  Input 0: \[2\] != input 1: \[3\]"),
    ErrorCase(_AG, "same_size_other_shape", lambda: dict(gradients=_z(2, 3), inputs=_z(3, 2)),
              IAE, r"same size and shape"),
    ErrorCase(_AG, "min_above_max", lambda: dict(gradients=_z(2), inputs=_z(2), min=3.0, max=1.0),
              IAE, r"min has to be smaller than max"),
    ErrorCase(_AG, "num_bits_17", lambda: dict(gradients=_z(2), inputs=_z(2), num_bits=17),
              IAE, _NUM_BITS),
    ErrorCase(_V, "num_bits_1", lambda: dict(inputs=_z(2), min=F32(-1), max=F32(1), num_bits=1),
              IAE, _NUM_BITS),
    ErrorCase(_V, "min_rank1", lambda: dict(inputs=_z(2), min=-_o(1), max=F32(1)), IAE,
              r"`min` must be rank 0 but is rank 1"),
    ErrorCase(_V, "max_rank1", lambda: dict(inputs=_z(2), min=F32(-1), max=_o(1)), IAE,
              r"`max` must be rank 0 but is rank 1"),
    ErrorCase(_VG, "min_rank1", lambda: dict(gradients=_z(2), inputs=_z(2), min=-_o(1),
                                             max=F32(1)), IAE, r"`min` must be rank 0"),
    ErrorCase(_VG, "shape_mismatch", lambda: dict(gradients=_z(2, 3), inputs=_z(3, 2),
                                                  min=F32(-1), max=F32(1)), IAE,
              r"gradient and input must be the same size"),
    ErrorCase(_VG, "num_bits_17", lambda: dict(gradients=_z(2), inputs=_z(2), min=F32(-1),
                                               max=F32(1), num_bits=17), IAE, _NUM_BITS),
    ErrorCase(_P, "min_rank0", lambda: dict(inputs=_z(1, 1), min=F32(-1), max=_o(1)), IAE,
              r"`min` must be rank 1 but is rank 0"),
    ErrorCase(_P, "max_rank0", lambda: dict(inputs=_z(1, 1), min=-_o(1), max=F32(1)), IAE,
              r"`max` must be rank 1 but is rank 0"),
    ErrorCase(_P, "min_rank2", lambda: dict(inputs=_z(2, 3), min=_z(3, 1), max=_o(3)),
              IAE, r"`min` must be rank 1 but is rank 2"),
    ErrorCase(_P, "min_size", lambda: dict(inputs=_z(1, 3), min=_z(2), max=_o(3)), IAE,
              r"min has incorrect size, expected 3 was 2"),
    ErrorCase(_P, "max_size", lambda: dict(inputs=_z(1, 3), min=_z(3), max=_o(2)), IAE,
              r"max has incorrect size, expected 3 was 2"),
    ErrorCase(_P, "num_bits_17", lambda: dict(inputs=_z(1, 3), min=_z(3), max=_o(3), num_bits=17),
              IAE, _NUM_BITS),
    ErrorCase(_P, "scalar_inputs", lambda: dict(inputs=F32(0.3), min=-_o(1), max=_o(1)),
              IAE, r"Shape must be at least rank 1 but is rank 0", tf_rejects=False,
              why=_ABORTS),
    ErrorCase(_PG, "shape_mismatch", lambda: dict(gradients=_z(2, 3), inputs=_z(3, 2),
                                                  min=_z(2), max=_o(2)), IAE,
              r"gradient and input must be the same size"),
    ErrorCase(_PG, "min_rank2", lambda: dict(gradients=_z(2, 3), inputs=_z(2, 3), min=_z(3, 1),
                                             max=_o(3)), IAE, r"`min` must be rank 1"),
    ErrorCase(_PG, "min_size", lambda: dict(gradients=_z(2, 3), inputs=_z(2, 3), min=_z(2),
                                            max=_o(3)), IAE,
              r"min has incorrect size, expected 3 was 2"),
    ErrorCase(_PG, "max_size", lambda: dict(gradients=_z(2, 3), inputs=_z(2, 3), min=_z(3),
                                            max=_o(4)), IAE,
              r"max has incorrect size, expected 3 was 4"),
    ErrorCase(_PG, "scalar_inputs", lambda: dict(gradients=F32(1), inputs=F32(0.3), min=-_o(1),
                                                 max=_o(1)), IAE,
              r"Shape must be at least rank 1 but is rank 0", tf_rejects=False,
              why=_ABORTS),
]


# --------------------------------------------------------------------------------------
# Benchmarks (tfgrad bench, benchmarks/run.py)
# --------------------------------------------------------------------------------------
# Fake-quant benchmarks: NHWC activations [16, 56, 56, 128] float32, 8 bits.
#
# PyTorch's closest equivalents: ``fake_quantize_per_tensor_affine`` (Args/Vars) and
# ``fake_quantize_per_channel_affine`` (PerChannel) with TF's nudged scale and zero point;
# for the gradients, the backward of those ops (dx only: PyTorch computes no dmin/dmax).
F32 = np.float32
BENCH_SHAPE = (16, 56, 56, 128)
BENCH_SMOKE = (2, 8, 8, 16)


def _bench_data(rng: np.random.Generator, smoke: bool, grad: bool) -> dict[str, Any]:
    shape = BENCH_SMOKE if smoke else BENCH_SHAPE
    kw: dict[str, Any] = {"inputs": (rng.standard_normal(shape) * 2).astype(F32)}
    if grad:
        kw["gradients"] = rng.standard_normal(shape).astype(F32)
    return kw


def _bench_args(grad: bool) -> Callable[[np.random.Generator, bool], dict[str, Any]]:
    def make(rng: np.random.Generator, smoke: bool) -> dict[str, Any]:
        return dict(_bench_data(rng, smoke, grad), min=-3.0, max=3.0)
    return make


def _bench_vars(grad: bool) -> Callable[[np.random.Generator, bool], dict[str, Any]]:
    def make(rng: np.random.Generator, smoke: bool) -> dict[str, Any]:
        return dict(_bench_data(rng, smoke, grad), min=np.array(-3, F32), max=np.array(3, F32))
    return make


def _bench_per_channel(grad: bool) -> Callable[[np.random.Generator, bool], dict[str, Any]]:
    def make(rng: np.random.Generator, smoke: bool) -> dict[str, Any]:
        kw = _bench_data(rng, smoke, grad)
        d = kw["inputs"].shape[-1]
        return dict(kw, min=-rng.uniform(0.5, 4, d).astype(F32),
                    max=rng.uniform(0.5, 4, d).astype(F32))
    return make


def _bench_bytes(kw: dict[str, Any]) -> int:
    # Inputs read once, outputs (the size of inputs) written once.
    arrays = [v for v in kw.values() if isinstance(v, np.ndarray)]
    return array_bytes(*arrays) + kw["inputs"].nbytes


def _bench_torch_params(kw: dict[str, Any]) -> tuple[Any, Any, int]:
    """TF's nudged range as PyTorch's (scale, zero_point): the same grid."""
    p = nudge(np.asarray(kw["min"], F32), np.asarray(kw["max"], F32), 8, False)
    zp = np.round(-p.nmin / p.scale).astype(np.int64)
    return p.scale, zp, 255


def _bench_torch(per_channel: bool, grad: bool) -> Callable[[dict[str, Any]], Callable[[], Any]]:
    def build(kw: dict[str, Any]) -> Callable[[], Any]:
        torch = torch_module()
        scale, zp, qmax = _bench_torch_params(kw)
        x = torch.from_numpy(kw["inputs"])
        if per_channel:
            s, z = torch.from_numpy(scale.astype(F32)), torch.from_numpy(zp.astype(np.int32))

            def fwd(t: Any) -> Any:
                return torch.fake_quantize_per_channel_affine(t, s, z, t.dim() - 1, 0, qmax)
        else:
            s, z = float(scale), int(zp)

            def fwd(t: Any) -> Any:
                return torch.fake_quantize_per_tensor_affine(t, s, z, 0, qmax)
        if not grad:
            return lambda: fwd(x)
        xg = x.clone().requires_grad_(True)
        y = fwd(xg)
        g = torch.from_numpy(kw["gradients"])
        return lambda: torch.autograd.grad(y, xg, g, retain_graph=True)
    return build


BENCHES = [
    Bench("FakeQuantWithMinMaxVarsPerChannelGradient", "[16,56,56,128] 8 bits",
          _bench_per_channel(True), _bench_bytes, torch=_bench_torch(True, True)),
    Bench("FakeQuantWithMinMaxVarsPerChannel", "[16,56,56,128] 8 bits", _bench_per_channel(False),
          _bench_bytes, torch=_bench_torch(True, False)),
    Bench("FakeQuantWithMinMaxArgs", "[16,56,56,128] 8 bits", _bench_args(False), _bench_bytes,
          torch=_bench_torch(False, False)),
    Bench("FakeQuantWithMinMaxVars", "[16,56,56,128] 8 bits", _bench_vars(False), _bench_bytes,
          torch=_bench_torch(False, False)),
    Bench("FakeQuantWithMinMaxArgsGradient", "[16,56,56,128] 8 bits", _bench_args(True),
          _bench_bytes, torch=_bench_torch(False, True)),
    Bench("FakeQuantWithMinMaxVarsGradient", "[16,56,56,128] 8 bits", _bench_vars(True),
          _bench_bytes, torch=_bench_torch(False, True)),
]


# --------------------------------------------------------------------------------------
# Warmup (tfgrad warmup runs these besides every case and benchmark)
# --------------------------------------------------------------------------------------
def _warm_make(op: str, shape: tuple[int, ...], narrow: bool
               ) -> Callable[[np.random.Generator], dict[str, Any]]:
    def make(rng: np.random.Generator) -> dict[str, Any]:
        kw: dict[str, Any] = {"inputs": rng.uniform(-8, 8, shape).astype(F32), "num_bits": 8,
                              "narrow_range": narrow}
        if op.endswith("Gradient"):
            kw["gradients"] = rng.uniform(-2, 2, shape).astype(F32)
        if "Args" in op:
            kw.update(min=-3.0, max=4.0)
        elif "PerChannel" in op:
            kw.update(min=np.full(shape[-1], -3, F32), max=np.full(shape[-1], 4, F32))
        else:
            kw.update(min=F32(-3), max=F32(4))
        return kw

    return make


def _warm_channel_first(op: str, memory: tuple[int, int, int]
                        ) -> Callable[[np.random.Generator], dict[str, Any]]:
    """PerChannel on a channels-last view of channel-first memory (a torch NCHW layer's)."""
    def make(rng: np.random.Generator) -> dict[str, Any]:
        kw = _warm_make(op, memory, False)(rng)
        for k in ("inputs", "gradients"):
            if k in kw:
                kw[k] = kw[k].transpose(0, 2, 1)
        d = memory[1]
        kw.update(min=np.full(d, -3, F32), max=np.full(d, 4, F32))
        return kw

    return make


# Every op with narrow_range off and on, tiny and at 2**17 elements (threaded kernels);
# PerChannel also on channel-first memory.
WARMUP: list[Warmup] = [
    Warmup(op, f"{list(shape)} narrow_range={narrow}", _warm_make(op, shape, narrow),
           large=shape == (256, 512))
    for shape in ((3, 5), (256, 512)) for narrow in (False, True) for op in _OPS.values()
] + [
    Warmup(_OPS[kind], f"{list(memory)} channel-first view",
           _warm_channel_first(_OPS[kind], memory), large=memory[0] > 2)
    for memory in ((2, 3, 5), (16, 64, 128)) for kind in ("pc", "pc_grad")
]


def _large(op: str) -> Callable[[], dict[str, Any]]:
    """A larger input for ``op``: big enough for the kernels' threads and reductions to
    split work (tests/test_determinism.py runs it on 1 and 2 threads)."""
    def make() -> dict[str, Any]:
        g = np.random.default_rng(1)
        x = (g.standard_normal((64, 48, 40)) * 4).astype(np.float32)  # 122,880 values
        kw: dict[str, Any] = {"inputs": x}
        if "Gradient" in op:
            kw["gradients"] = g.standard_normal(x.shape).astype(np.float32)
        if "PerChannel" in op:
            kw["min"] = np.full(40, -3.0, np.float32) - g.random(40).astype(np.float32)
            kw["max"] = np.full(40, 3.0, np.float32) + g.random(40).astype(np.float32)
        elif "Vars" in op:
            kw["min"], kw["max"] = np.array(-3.3, np.float32), np.array(2.9, np.float32)
        else:
            kw["min"], kw["max"] = -3.3, 2.9
        return kw
    return make


LARGE: dict[str, Callable[[], dict[str, Any]]] = {
    name: _large(name) for name, op in OPS.items() if op.family == "fake_quant"}
