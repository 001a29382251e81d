"""Cases for BiasAdd, BiasAddGrad (NHWC and NCHW) and Identity.

BiasAdd's inputs mix normal values with +-0, denormals, infinities and NaNs (both operands
NaN too, to pin whose payload wins). BiasAddGrad's gradients carry float16-precision
mantissas with spread exponents, so that float32 sums round (the order shows) while the
fixtures compress; shapes cross TF's block rules on its 2 intra-op threads: a single row
(passed through), few rows (one block), the 2000-value minimum block, C > 64 (columns
split), NCHW ranges that start and end inside rows, rows longer than Eigen's leaf.
The sums' blocks depend on TF's thread count: the fixtures hold TF's bits with 2 threads
(``tfgrad._config.tf_intra_op_threads`` on this kind of machine; docs/bias_add.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from tfgrad import InvalidArgumentError as IAE
from tfgrad._opdefs import OPS

from ..harness import Bench, array_bytes, torch_module
from . import Case, ErrorCase, Warmup

F32 = np.float32
_SPECIAL = np.array([0.0, -0.0, 1e-40, -1e-40, 1.2e-38, np.inf, -np.inf, np.nan], F32)


def values(rng: np.random.Generator, shape: tuple[int, ...], dtype: Any = F32,
           special: float = 0.2) -> np.ndarray:
    n = int(np.prod(shape))
    x = rng.standard_normal(n).astype(np.float16).astype(dtype)
    x *= np.exp2(rng.integers(-8, 8, n)).astype(dtype)
    pick = rng.random(n) < special
    sp = _SPECIAL.astype(dtype)
    if dtype == np.float64:
        sp[2:5] = [1e-310, -1e-310, 2.3e-308]
    x[pick] = sp[rng.integers(0, sp.size, int(pick.sum()))]
    return x.reshape(shape)


def _nan_payloads(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Some NaNs with payloads and signs (which NaN an addition returns)."""
    if x.dtype != F32 or x.size < 4:
        return x
    bits = np.array([0x7FC00001, 0xFFC00002, 0x7F800003, 0xFFA00004], np.uint32).view(F32)
    flat = x.reshape(-1).copy()
    flat[rng.choice(flat.size, 4, replace=False)] = bits
    return flat.reshape(x.shape)


_CASES: list[Case] = []


def _add_case(shape: tuple[int, ...], fmt: str, dtype: Any = F32, grad: bool = True,
              fwd: bool = True, special: float = 0.2, name: str = "") -> None:
    label = (name or "x".join(map(str, shape))) + f"_{fmt}" + (
        "" if dtype == F32 else f"_{np.dtype(dtype).name}")
    c = shape[1] if fmt == "NCHW" else shape[-1]

    def make_fwd(rng: np.random.Generator) -> dict[str, Any]:
        v = _nan_payloads(values(rng, shape, dtype, special), rng)
        return dict(value=v, bias=_nan_payloads(values(rng, (c,), dtype, special), rng),
                    data_format=fmt)

    def make_grad(rng: np.random.Generator) -> dict[str, Any]:
        return dict(out_backprop=values(rng, shape, dtype, special * 0.1), data_format=fmt)

    if fwd:
        _CASES.append(Case("BiasAdd", label, make_fwd))
    if grad:
        _CASES.append(Case("BiasAddGrad", label, make_grad))


for _fmt in ("NHWC", "NCHW"):
    for _shape in ((2, 3), (1, 5), (5, 1), (3, 7, 5), (2, 3, 4, 5), (2, 3, 2, 2, 3),
                   (1, 2, 1, 2, 1, 3), (0, 3), (3, 0), (4, 3, 0, 2)):
        _add_case(_shape, _fmt)
    _add_case((3, 4, 5), _fmt, np.float64)
    _add_case((2, 3, 2, 2), _fmt, np.float64)
# NHWC sums: one block, 2 blocks (2000 values at least), columns split (C > 64), odd rows
for _shape in ((100, 16), (1001, 3), (9, 70), (3, 7, 7, 24), (2, 11, 13, 16), (501, 8),
               (8, 6, 6, 33)):
    _add_case(_shape, "NHWC", fwd=_shape[0] < 200)
_add_case((800, 5), "NHWC", np.float64, fwd=False)
# NCHW sums: ranges inside rows, many rows per channel, rows longer than Eigen's leaf
for _shape in ((2, 5, 7, 9), (17, 7, 10), (8, 16, 12, 12), (1, 3, 4, 4), (4, 64, 33)):
    _add_case(_shape, "NCHW", fwd=int(np.prod(_shape)) < 5000)
# Rows longer than Eigen's leaf (a tree of leaves): no NaN (which of two NaNs a tree node
# keeps is not modelled; docs/bias_add.md)
for _shape, _dt in (((2, 2, 8300), F32), ((2, 1, 4200), np.float64)):
    _add_case(_shape, "NCHW", _dt, fwd=False, special=0.0)
# NCHW BiasAdd: planes longer than the vector width, odd sizes
_add_case((2, 5, 33), "NCHW", grad=False)

for _dt, _shape in ((F32, (3, 4)), (np.float64, (5,)), (np.float16, (2, 3)), (F32, ()),
                    (F32, (0, 2))):
    def _ident(rng: np.random.Generator, shape: tuple[int, ...] = _shape,
               dt: Any = _dt) -> dict[str, Any]:
        with np.errstate(invalid="ignore"):  # signalling NaNs into float16, on purpose
            return dict(input=_nan_payloads(values(rng, shape, F32), rng).astype(dt))
    _CASES.append(Case("Identity", f"{np.dtype(_dt).name}_{'x'.join(map(str, _shape))}",
                       _ident))

CASES: list[Case] = _CASES


def tf_threads_dependent(case: Case, kwargs: dict[str, Any]) -> set[str]:
    """BiasAddGrad's sums: TF cuts them in blocks by its intra-op thread count
    (docs/bias_add.md; [4, 64, 33] NCHW differs between 2 and 4 threads)."""
    return {"output"} if case.op == "BiasAddGrad" else set()


# --------------------------------------------------------------------------------------
# Errors (TF's words, checked live)
# --------------------------------------------------------------------------------------
def _z(*shape: int) -> np.ndarray:
    return np.zeros(shape, F32)


_BIASES = r"Must provide as many biases as the last dimension of the input tensor: "
ERROR_CASES: list[ErrorCase] = [
    ErrorCase("BiasAdd", "rank1", lambda: dict(value=_z(3), bias=_z(3)), IAE,
              r"Input tensor must be at least 2D: \[3\]"),
    ErrorCase("BiasAdd", "bias_rank2", lambda: dict(value=_z(2, 3), bias=_z(3, 1)), IAE,
              r"Biases must be 1D: \[3,1\]"),
    ErrorCase("BiasAdd", "bias_size", lambda: dict(value=_z(2, 3), bias=_z(2)), IAE,
              _BIASES + r"\[2\] vs. \[2,3\]"),
    ErrorCase("BiasAdd", "nchw_bias_size",
              lambda: dict(value=_z(2, 3, 4), bias=_z(4), data_format="NCHW"), IAE,
              _BIASES + r"\[4\] vs. \[2,3,4\]"),
    ErrorCase("BiasAdd", "bad_format", lambda: dict(value=_z(2, 3), bias=_z(3),
                                                    data_format="NCDHW"),
              IAE, r"data_format"),
    ErrorCase("BiasAdd", "int32", lambda: dict(value=np.zeros((2, 3), np.int32),
                                               bias=np.zeros(3, np.int32)),
              TypeError, r"value", tf_rejects=False,
              why="TF has BiasAdd for every number type; tfgrad for float32 and float64"),
    ErrorCase("BiasAddGrad", "rank1", lambda: dict(out_backprop=_z(3)), IAE,
              r"Input tensor must be at least 2D: \[3\]"),
    ErrorCase("BiasAddGrad", "rank0", lambda: dict(out_backprop=F32(1)), IAE,
              r"Input tensor must be at least 2D: \[\]"),
    ErrorCase("BiasAddGrad", "float16", lambda: dict(out_backprop=np.zeros((2, 3), np.float16)),
              TypeError, r"out_backprop", tf_rejects=False,
              why="TF sums half types in float32 (and NCHW in half): not implemented here"),
]


# --------------------------------------------------------------------------------------
# Benchmarks: MobileNet's biases ([32,112,112,16] NHWC) and a Dense layer's ([32,1000])
# --------------------------------------------------------------------------------------
_BENCH = ((32, 112, 112, 16), (2, 8, 8, 16))
_DENSE = ((32, 1000), (4, 10))


def _bench(op: str, shapes: tuple) -> Callable[[np.random.Generator, bool], dict[str, Any]]:
    def make(rng: np.random.Generator, smoke: bool) -> dict[str, Any]:
        shape = shapes[1] if smoke else shapes[0]
        x = rng.standard_normal(shape).astype(F32)
        if op == "BiasAdd":
            return dict(value=x, bias=rng.standard_normal(shape[-1]).astype(F32))
        return dict(out_backprop=x)
    return make


def _bytes(kw: dict[str, Any]) -> int:
    arrays = [v for v in kw.values() if isinstance(v, np.ndarray)]
    return array_bytes(*arrays) + (kw["value"].nbytes if "value" in kw else 0)


def _torch(op: str) -> Callable[[dict[str, Any]], Callable[[], Any]]:
    def build(kw: dict[str, Any]) -> Callable[[], Any]:
        torch = torch_module()
        if op == "BiasAdd":
            x, b = torch.from_numpy(kw["value"]), torch.from_numpy(kw["bias"])
            return lambda: x + b
        g = torch.from_numpy(kw["out_backprop"])
        dims = tuple(range(g.dim() - 1))
        return lambda: g.sum(dims)
    return build


BENCHES = [Bench(op, desc, _bench(op, shapes), _bytes, torch=_torch(op))
           for op in ("BiasAdd", "BiasAddGrad")
           for desc, shapes in (("[32,112,112,16] NHWC", _BENCH), ("[32,1000]", _DENSE))]


def _warm(op: str, shape: tuple[int, ...], fmt: str, dtype: Any
          ) -> Callable[[np.random.Generator], dict[str, Any]]:
    def make(rng: np.random.Generator) -> dict[str, Any]:
        x = values(rng, shape, dtype, 0.0)
        if op == "BiasAdd":
            c = shape[1] if fmt == "NCHW" else shape[-1]
            return dict(value=x, bias=values(rng, (c,), dtype, 0.0), data_format=fmt)
        return dict(out_backprop=x, data_format=fmt)
    return make


WARMUP: list[Warmup] = [
    Warmup(op, f"{np.dtype(dt).name} {list(shape)} {fmt}", _warm(op, shape, fmt, dt),
           large=shape[0] > 100)
    for op in ("BiasAdd", "BiasAddGrad") for dt in (F32, np.float64)
    for fmt in ("NHWC", "NCHW") for shape in ((2, 3, 5), (256, 16, 32))
]


def _large(op: str) -> Callable[[], dict[str, Any]]:
    def make() -> dict[str, Any]:
        rng = np.random.default_rng(1)
        x = values(rng, (64, 48, 40), F32, 0.01)
        if op == "BiasAdd":
            return dict(value=x, bias=values(rng, (40,), F32, 0.0))
        if op == "Identity":
            return dict(input=x)
        return dict(out_backprop=x)
    return make


LARGE: dict[str, Callable[[], dict[str, Any]]] = {
    name: _large(name) for name, op in OPS.items() if op.family == "bias_add"}
