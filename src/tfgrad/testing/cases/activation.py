"""Cases for Relu, Relu6 and their gradients (ReluGrad, Relu6Grad).

Inputs mix normal values around 0 and 6 with the values where TF's kernels differ by code
path: +-0, denormals of both signs, the smallest normal, 6 and its neighbours, +-inf and
NaNs with payloads; sizes put them in the packet body and in every position of the scalar
tail (sizes 1 to 17, and odd and even tails after large bodies), for every float type.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np

from tfgrad import InvalidArgumentError as IAE
from tfgrad._opdefs import OPS
from tfgrad._tf.relu import FORMATS

from ..harness import Bench, array_bytes, torch_module
from . import Case, ErrorCase, Warmup

F32 = np.float32
DTYPES = {"float32": np.float32, "float64": np.float64, "bfloat16": ml_dtypes.bfloat16,
          "float16": np.float16}
FORWARD = ("Relu", "Relu6")
BACKWARD = ("ReluGrad", "Relu6Grad")


def specials(dtype: Any) -> np.ndarray:
    """The values whose bits the code paths treat differently, as ``dtype``."""
    fmt = FORMATS[np.dtype(dtype).name]
    s = fmt.sign
    bits = [0, s, 1, s | 1, fmt.normal - 1, s | (fmt.normal - 1), fmt.normal, s | fmt.normal,
            fmt.inf, s | fmt.inf, fmt.inf | fmt.quiet, s | fmt.inf | fmt.quiet,
            fmt.inf | fmt.quiet | 5, s | fmt.inf | 3, fmt.six, fmt.six - 1, fmt.six + 1]
    return np.array(bits, fmt.uint).view(dtype)


def values(rng: np.random.Generator, n: int, dtype: Any, special: float = 0.4) -> np.ndarray:
    """Normal values in [-8, 8] (a few exactly 0 or 6), a share of them specials."""
    x = rng.uniform(-8, 8, n)
    x[rng.random(n) < 0.05] = 6.0
    x = x.astype(dtype)
    pick = rng.random(n) < special
    sp = specials(dtype)
    x[pick] = sp[rng.integers(0, sp.size, int(pick.sum()))]
    return x


_CASES: list[Case] = []


def _add(shape: tuple[int, ...], dtype: str, name: str = "", special: float = 0.4) -> None:
    dt = DTYPES[dtype]
    n = int(np.prod(shape))
    label = name or "x".join(map(str, shape)) or "scalar"

    def fwd(rng: np.random.Generator) -> dict[str, Any]:
        return dict(features=values(rng, n, dt, special).reshape(shape))

    def bwd(rng: np.random.Generator) -> dict[str, Any]:
        return dict(gradients=values(rng, n, dt, special).reshape(shape),
                    features=values(rng, n, dt, special).reshape(shape))

    for op in FORWARD:
        _CASES.append(Case(op, f"{dtype}_{label}", fwd))
    for op in BACKWARD:
        _CASES.append(Case(op, f"{dtype}_{label}", bwd))


for _dt in DTYPES:
    for _n in (1, 2, 3, 4, 5, 7, 8, 9, 13, 16, 17):
        _add((_n,), _dt)
    _add((0,), _dt, "empty")
    _add((), _dt)
    _add((3, 5, 7), _dt)          # 105: 13 packets and a tail of 1
    _add((2, 4, 4, 3), _dt)       # 96: packets only
    _add((1027,), _dt)            # a tail of 3 (float64: 3)
    _add((6, 7, 11), _dt, special=0.1)  # 462: tail of 6 (float64: 2)
# Past the kernels' chunk (TF's parallelFor blocks are whole packets: the bits do not
# depend on its threads; tests/test_activation.py runs large tensors live)
_add((4105,), "float32", special=0.02)

CASES: list[Case] = _CASES


# --------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------
def _z(*shape: int, dtype: Any = F32) -> np.ndarray:
    return np.zeros(shape, dtype)


_SAME = r"must have the same size and shape.  Input 0: \[2\] != input 1: \[3\]"
ERROR_CASES: list[ErrorCase] = [
    ErrorCase("ReluGrad", "shape_mismatch", lambda: dict(gradients=_z(2), features=_z(3)),
              IAE, r"Inputs to operation ReluGrad of type ReluGrad " + _SAME),
    ErrorCase("Relu6Grad", "shape_mismatch", lambda: dict(gradients=_z(2), features=_z(3)),
              IAE, r"Inputs to operation Relu6Grad of type Relu6Grad " + _SAME),
    ErrorCase("ReluGrad", "same_size_other_shape",
              lambda: dict(gradients=_z(2, 3), features=_z(3, 2)), IAE,
              r"same size and shape.  Input 0: \[2,3\] != input 1: \[3,2\]"),
    ErrorCase("Relu", "int32", lambda: dict(features=np.array([1, -2], np.int32)), TypeError,
              r"features", tf_rejects=False,
              why="TF has integer Relu kernels; tfgrad implements the float types only"),
    ErrorCase("ReluGrad", "mixed_dtypes",
              lambda: dict(gradients=_z(2, dtype=np.float64), features=_z(2)), TypeError,
              r"float", tf_rejects=False,
              why="TF's binding converts the second input to the first's type attr as tfgrad "
              "does not: it requires one dtype for both"),
]


# --------------------------------------------------------------------------------------
# Benchmarks: MobileNet's activations (ReLU6 after the first conv, [32,112,112,16] float32)
# --------------------------------------------------------------------------------------
BENCH_SHAPE = (32, 112, 112, 16)
BENCH_SMOKE = (2, 8, 8, 16)


def _bench(op: str) -> Callable[[np.random.Generator, bool], dict[str, Any]]:
    def make(rng: np.random.Generator, smoke: bool) -> dict[str, Any]:
        shape = BENCH_SMOKE if smoke else BENCH_SHAPE
        kw = {"features": (rng.standard_normal(shape) * 4).astype(F32)}
        if op in BACKWARD:
            kw["gradients"] = rng.standard_normal(shape).astype(F32)
        return kw
    return make


def _bytes(kw: dict[str, Any]) -> int:
    return array_bytes(*kw.values()) + kw["features"].nbytes


def _torch(op: str) -> Callable[[dict[str, Any]], Callable[[], Any]]:
    def build(kw: dict[str, Any]) -> Callable[[], Any]:
        torch = torch_module()
        x = torch.from_numpy(kw["features"])
        if op == "Relu":
            return lambda: torch.relu(x)
        if op == "Relu6":
            return lambda: torch.nn.functional.relu6(x)
        g = torch.from_numpy(kw["gradients"])
        if op == "ReluGrad":
            return lambda: torch.ops.aten.threshold_backward(g, x, 0.0)
        return lambda: torch.ops.aten.hardtanh_backward(g, x, 0.0, 6.0)
    return build


BENCHES = [Bench(op, "[32,112,112,16]", _bench(op), _bytes, torch=_torch(op))
           for op in ("Relu6", "Relu6Grad", "Relu", "ReluGrad")]


def _warm(op: str, dtype: Any, n: int) -> Callable[[np.random.Generator], dict[str, Any]]:
    def make(rng: np.random.Generator) -> dict[str, Any]:
        kw = {"features": values(rng, n, dtype)}
        if op in BACKWARD:
            kw["gradients"] = values(rng, n, dtype)
        return kw
    return make


WARMUP: list[Warmup] = [
    Warmup(op, f"{name} [{n}]", _warm(op, dt, n), large=n > 1000)
    for op in FORWARD + BACKWARD for name, dt in DTYPES.items() for n in (11, 1 << 17)
]


def _large(op: str) -> Callable[[], dict[str, Any]]:
    def make() -> dict[str, Any]:
        rng = np.random.default_rng(1)
        kw = {"features": values(rng, 7 * 42859, F32, 0.05).reshape(7, 42859, 1)}
        if op in BACKWARD:
            kw["gradients"] = values(rng, 7 * 42859, F32, 0.05).reshape(7, 42859, 1)
        return kw
    return make


LARGE: dict[str, Callable[[], dict[str, Any]]] = {
    name: _large(name) for name, op in OPS.items() if op.family == "activation"}
