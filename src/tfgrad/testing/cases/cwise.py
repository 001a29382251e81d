"""Op cases for SquaredDifference, Rsqrt and RsqrtGrad (see tfgrad/testing/cases/__init__.py).

Sizes put values in Eigen's packet body and in every position of its scalar tail (1 to
17, and tails after larger bodies; float64's packet is 4), for every float type; inputs
mix normal values of wide range with the values the code paths treat differently: +-0,
denormals (DAZ / FTZ), +-inf, NaNs with payloads, products that underflow. SquaredDifference
runs every broadcast pattern of tf.nn.moments ([N, C] against [1, C]) and TF's BCast.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np

from tfgrad import InvalidArgumentError as IAE
from tfgrad._opdefs import OPS

from ..harness import Bench, array_bytes, torch_module
from . import Case, ErrorCase, Warmup

F32 = np.float32
DTYPES = {"float32": np.float32, "float64": np.float64, "float16": np.float16,
          "bfloat16": ml_dtypes.bfloat16}
_SPECIALS = (0.0, -0.0, 1e-40, -1e-40, 3e-39, 1e-7, 1.0, -1.0, 4.0, np.inf, -np.inf,
             1e-20, -1e-20, 1e20, 3e38, 1e-30, 6e-8, 65504.0)


def values(rng: np.random.Generator, shape: tuple[int, ...], dtype: Any,
           special: float = 0.3, positive: bool = False, span: float = 12.0) -> np.ndarray:
    """Values of magnitude exp(+-span), random sign (or positive), a share of specials,
    NaNs with payloads among them."""
    n = int(np.prod(shape))
    with np.errstate(all="ignore"):  # (specials overflow the half types: inf)
        return _values(rng, shape, n, dtype, special, positive, span)


def _values(rng: np.random.Generator, shape: tuple[int, ...], n: int, dtype: Any,
            special: float, positive: bool, span: float) -> np.ndarray:
    x = np.exp(rng.uniform(-span, span, n))
    if not positive:
        x *= rng.choice([-1.0, 1.0], n)
    pick = rng.random(n) < special
    x[pick] = rng.choice(np.array(_SPECIALS), int(pick.sum()))
    out = x.astype(F32).astype(dtype) if dtype != np.float64 else x
    nan = rng.random(n) < special / 6
    if nan.any():
        if dtype == np.float64:
            bits = np.array([0x7FF8000000000000, 0xFFF8000000000001, 0x7FF0000000000003],
                            np.uint64)
        elif dtype == np.float32:
            bits = np.array([0x7FC00000, 0xFFC00001, 0x7F800003], np.uint32)
        else:
            bits = (np.array([0x7E00, 0xFE01, 0x7C03], np.uint16) if dtype == np.float16
                    else np.array([0x7FC0, 0xFFC1, 0x7F83], np.uint16))
        u = out.view(bits.dtype)
        u[nan] = rng.choice(bits, int(nan.sum()))
    if positive:  # (the payloads keep their signs: NaN in, NaN out)
        out = np.where(np.isnan(out), out, np.abs(out))
    return out.reshape(shape).astype(dtype)


CASES: list[Case] = []


def _sd(name: str, xs: tuple[int, ...], ys: tuple[int, ...], dt: str = "float32",
        special: float = 0.3) -> None:
    t = DTYPES[dt]

    def make(rng: np.random.Generator) -> dict[str, Any]:
        return dict(x=values(rng, xs, t, special), y=values(rng, ys, t, special))

    CASES.append(Case("SquaredDifference", f"{dt}_{name}", make))


def _unary(name: str, shape: tuple[int, ...], dt: str = "float32", special: float = 0.3,
           span: float = 30.0) -> None:
    t = DTYPES[dt]

    def rsqrt(rng: np.random.Generator) -> dict[str, Any]:
        # mostly positive (negative values give NaN: a few kept)
        x = values(rng, shape, t, special, positive=True, span=span)
        neg = rng.random(x.shape) < 0.05
        return dict(x=np.where(neg, -x, x).astype(t))

    def grad(rng: np.random.Generator) -> dict[str, Any]:
        return dict(y=values(rng, shape, t, special), dy=values(rng, shape, t, special))

    CASES.append(Case("Rsqrt", f"{dt}_{name}", rsqrt))
    CASES.append(Case("RsqrtGrad", f"{dt}_{name}", grad))


for _dt in DTYPES:
    for _n in (1, 2, 3, 4, 5, 7, 8, 9, 13, 16, 17):
        _unary(str(_n), (_n,), _dt)
        _sd(str(_n), (_n,), (_n,), _dt)
    _unary("scalar", (), _dt)
    _unary("empty", (0, 3), _dt)
    _unary("3x5x7", (3, 5, 7), _dt)  # 105: a tail of 1
    _unary("1027", (1027,), _dt, special=0.05)
    _sd("moments_32x12_1x12", (32, 12), (1, 12), _dt)
    _sd("scalar_y", (3, 7), (), _dt)
    _sd("scalar_x", (), (3, 7), _dt)
    _sd("bcast_3x1_1x11", (3, 1), (1, 11), _dt)
    _sd("bcast_2x3x4_3x1", (2, 3, 4), (3, 1), _dt)
    _sd("empty", (0, 3), (1, 3), _dt)
_sd("moments_x_right_4x9_9", (9,), (4, 9))
_sd("one_one", (1,), (1,))
_sd("rank0_both", (), ())
_sd("moments_256x64_1x64", (256, 64), (1, 64), special=0.02)
_sd("large_4105", (4105,), (4105,), special=0.02)
_unary("4105", (4105,), special=0.02)
# Rsqrt on the range a batch norm's variance + epsilon takes; RsqrtGrad on its outputs
_unary("bn_range_64", (64,), special=0.0, span=8.0)
# RsqrtGrad with both shapes different but the same size (TF computes, shaped like y)
CASES.append(Case("RsqrtGrad", "float32_same_size_2x3_3x2", lambda rng: dict(
    y=values(rng, (2, 3), F32), dy=values(rng, (3, 2), F32))))


def processor_dependent(case: Case, kwargs: dict[str, Any]) -> set[str]:
    """Rsqrt's outputs in full packets of 8 take the processor's ``rsqrtps`` (and Eigen's
    Newton step), as batch norm's rsqrt: Intel's and AMD's differ, and TF's bits with
    them (float64 is exact everywhere)."""
    if case.op != "Rsqrt":
        return set()
    x = kwargs["x"]
    return {"y"} if x.dtype != np.float64 and x.size >= 8 else set()


# --------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------
def _z(*shape: int, dtype: Any = F32) -> np.ndarray:
    return np.zeros(shape, dtype)


ERROR_CASES: list[ErrorCase] = [
    ErrorCase("SquaredDifference", "incompatible", lambda: dict(x=_z(2, 3), y=_z(4)), IAE,
              r"Incompatible shapes: \[2,3\] vs. \[4\]"),
    ErrorCase("SquaredDifference", "incompatible_2d", lambda: dict(x=_z(2, 3), y=_z(3, 2)),
              IAE, r"Incompatible shapes: \[2,3\] vs. \[3,2\]"),
    ErrorCase("SquaredDifference", "incompatible_1d", lambda: dict(x=_z(5), y=_z(2)), IAE,
              r"Incompatible shapes: \[5\] vs. \[2\]"),
    ErrorCase("RsqrtGrad", "size_mismatch", lambda: dict(y=_z(2), dy=_z(3)), IAE,
              r"The two arguments to a cwise op must have same number of elements, "
              r"got 2 and 3"),
    ErrorCase("Rsqrt", "int32", lambda: dict(x=np.array([1, 4], np.int32)), TypeError,
              r"x", tf_rejects=False, why="TF has no integer Rsqrt either, but its binding "
              "raises another message; tfgrad's op table refuses it"),
    ErrorCase("SquaredDifference", "int32", lambda: dict(x=np.array([1, 4], np.int32),
                                                         y=np.array([1, 4], np.int32)),
              TypeError, r"x", tf_rejects=False,
              why="TF has integer and complex SquaredDifference kernels; tfgrad implements "
              "the float types only"),
    ErrorCase("RsqrtGrad", "mixed_dtypes",
              lambda: dict(y=_z(2, dtype=np.float64), dy=_z(2)), TypeError, r"float",
              tf_rejects=False, why="TF's binding converts the second input to the first's "
              "type attr; tfgrad requires one dtype for both"),
]


# --------------------------------------------------------------------------------------
# Benchmarks: a Dense + BatchNormalization layer's batch statistics ([256, 1024] float32)
# --------------------------------------------------------------------------------------
BENCH_SHAPE = (256, 1024)
BENCH_SMOKE = (8, 64)


def _bench(op: str) -> Callable[[np.random.Generator, bool], dict[str, Any]]:
    def make(rng: np.random.Generator, smoke: bool) -> dict[str, Any]:
        shape = BENCH_SMOKE if smoke else BENCH_SHAPE
        x = rng.standard_normal(shape).astype(F32)
        if op == "SquaredDifference":
            return dict(x=x, y=x.mean(axis=0, keepdims=True).astype(F32))
        if op == "Rsqrt":
            return dict(x=np.abs(x) + F32(1e-3))
        return dict(y=np.abs(x) + F32(0.5), dy=rng.standard_normal(shape).astype(F32))
    return make


def _torch(op: str) -> Callable[[dict[str, Any]], Callable[[], Any]]:
    def build(kw: dict[str, Any]) -> Callable[[], Any]:
        torch = torch_module()
        if op == "SquaredDifference":
            x, y = torch.from_numpy(kw["x"]), torch.from_numpy(kw["y"])
            return lambda: torch.square(x - y)
        if op == "Rsqrt":
            x = torch.from_numpy(kw["x"])
            return lambda: torch.rsqrt(x)
        y, dy = torch.from_numpy(kw["y"]), torch.from_numpy(kw["dy"])
        return lambda: dy * (-0.5 * y * y * y)
    return build


def _bytes(kw: dict[str, Any]) -> int:
    out = max(v.size for v in kw.values()) * 4
    return array_bytes(*kw.values()) + out


BENCHES = [Bench(op, "[256,1024]" + (" vs [1,1024]" if op == "SquaredDifference" else ""),
                 _bench(op), _bytes, torch=_torch(op))
           for op in ("SquaredDifference", "Rsqrt", "RsqrtGrad")]


def _warm(op: str, dtype: Any, n: int) -> Callable[[np.random.Generator], dict[str, Any]]:
    def make(rng: np.random.Generator) -> dict[str, Any]:
        if op == "SquaredDifference":
            return dict(x=values(rng, (n,), dtype), y=values(rng, (n,), dtype))
        if op == "Rsqrt":
            return dict(x=values(rng, (n,), dtype, positive=True))
        return dict(y=values(rng, (n,), dtype), dy=values(rng, (n,), dtype))
    return make


WARMUP: list[Warmup] = [
    Warmup(op, f"{name} [{n}]", _warm(op, dt, n), large=n > 1000)
    for op in ("SquaredDifference", "Rsqrt", "RsqrtGrad")
    for name, dt in (("float32", F32), ("float64", np.float64)) for n in (11, 1 << 17)
]


def _large(op: str) -> Callable[[], dict[str, Any]]:
    def make() -> dict[str, Any]:
        rng = np.random.default_rng(1)
        if op == "SquaredDifference":
            return dict(x=values(rng, (600, 513), F32, 0.02),
                        y=values(rng, (1, 513), F32, 0.02))
        if op == "Rsqrt":
            return dict(x=values(rng, (7, 42859), F32, 0.02, positive=True))
        return dict(y=values(rng, (7, 42859), F32, 0.02), dy=values(rng, (7, 42859), F32, 0.02))
    return make


LARGE: dict[str, Callable[[], dict[str, Any]]] = {
    name: _large(name) for name, op in OPS.items() if op.family == "cwise"}
