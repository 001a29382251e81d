"""Op cases for SparseSoftmaxCrossEntropyWithLogits (see tfgrad/testing/cases/__init__.py).

Class counts around Eigen's packets (the exp of a row's last classes % 8 values, and of
the last (batch * classes) % 8 backprop values, go through the C library's expf, the rest
through Eigen's pexp) and past its leaf (8192: the row's tree); logits at scales where
exp underflows; NaN, +-inf and denormal logits; int32 and int64 labels.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from tfgrad import InvalidArgumentError as IAE
from tfgrad._errors import InvalidDtypeError

from ..harness import Bench, array_bytes, torch_module
from . import Case, ErrorCase, Warmup

F32 = np.float32
OP = "SparseSoftmaxCrossEntropyWithLogits"


def logits(rng: np.random.Generator, b: int, c: int, scale: float = 3.0,
           special: bool = False) -> np.ndarray:
    x = (rng.standard_normal((b, c)) * scale).astype(F32)
    if special and b * c >= 8:
        idx = rng.choice(b * c, 4, replace=False)
        x.reshape(-1)[idx] = np.array([1e-40, -np.inf, -0.0, -3e-39], F32)
    return x


def _add(name: str, b: int, c: int, scale: float = 3.0, special: bool = False,
         ldtype: Any = np.int32, rows: dict[int, list[float]] | None = None) -> None:
    def make(rng: np.random.Generator) -> dict[str, Any]:
        x = logits(rng, b, c, scale, special)
        for i, row in (rows or {}).items():
            x[i, :len(row)] = row
        return dict(features=x, labels=rng.integers(0, c, b).astype(ldtype))

    CASES.append(Case(OP, name, make))


CASES: list[Case] = []
_add("mnist_32x10", 32, 10)
_add("batch16x10", 16, 10, ldtype=np.int64)
for _b, _c in ((1, 1), (3, 1), (5, 7), (4, 8), (3, 9), (7, 13), (2, 31), (2, 32), (2, 33),
               (64, 100), (3, 1000), (2, 1001)):
    _add(f"b{_b}_c{_c}", _b, _c)
_add("tree_2x8200", 2, 8200, scale=1.0)
_add("tree_3x8197", 3, 8197, scale=1.0)
_add("peaked", 8, 20, scale=40.0)  # exp underflows (pexp's safe path, FTZ)
_add("flat", 8, 20, scale=1e-3)
_add("specials", 6, 12, special=True)
_add("nonfinite_rows", 4, 9, rows={0: [np.nan], 1: [np.inf], 2: [-np.inf, -np.inf],
                                   3: [-np.inf] * 9})
_add("empty_batch", 0, 5)


def _x(*shape: int) -> np.ndarray:
    return np.ones(shape, F32)


def _l(*v: int, dtype: Any = np.int32) -> np.ndarray:
    return np.array(v, dtype)


ERROR_CASES: list[ErrorCase] = [
    ErrorCase(OP, "logits_rank1", lambda: dict(features=_x(3), labels=_l(0, 0, 0)), IAE,
              r"logits must be 2-D, but got shape \[3\]"),
    ErrorCase(OP, "logits_rank3", lambda: dict(features=_x(2, 3, 4), labels=_l(0, 0)), IAE,
              r"logits must be 2-D, but got shape \[2,3,4\]"),
    ErrorCase(OP, "labels_rank2", lambda: dict(features=_x(2, 3), labels=np.zeros((2, 1),
                                                                                  np.int32)),
              IAE, r"labels must be 1-D, but got shape \[2,1\]"),
    ErrorCase(OP, "batch_mismatch", lambda: dict(features=_x(2, 3), labels=_l(0, 0, 0)), IAE,
              r"logits and labels must have the same first dimension, got logits shape "
              r"\[2,3\] and labels shape \[3\]"),
    ErrorCase(OP, "no_classes", lambda: dict(features=_x(2, 0), labels=_l(0, 0)), IAE,
              r"Must have at least one class, but got logits shape \[2,0\]"),
    ErrorCase(OP, "label_too_large", lambda: dict(features=_x(2, 3), labels=_l(0, 3)), IAE,
              r"Received a label value of 3 which is outside the valid range of \[0, 3\)\.  "
              r"Label values: 0 3"),
    ErrorCase(OP, "label_negative",
              lambda: dict(features=_x(3, 3), labels=_l(0, -1, 5, dtype=np.int64)), IAE,
              r"Received a label value of -1 which is outside the valid range of \[0, 3\)\.  "
              r"Label values: 0 -1 5"),
    ErrorCase(OP, "float64_features",
              lambda: dict(features=np.ones((2, 3)), labels=_l(0, 1)), InvalidDtypeError,
              r"float32", tf_rejects=False,
              why="TF computes in float64 (and half types); tfgrad implements float32 only"),
]


def _bench(b: int, c: int) -> Callable[[np.random.Generator, bool], dict[str, Any]]:
    def make(rng: np.random.Generator, smoke: bool) -> dict[str, Any]:
        bb = 4 if smoke else b
        return dict(features=logits(rng, bb, c), labels=rng.integers(0, c, bb).astype(np.int32))
    return make


def _bytes(kw: dict[str, Any]) -> int:
    return array_bytes(kw["features"], kw["labels"]) + kw["features"].nbytes


def _torch(kw: dict[str, Any]) -> Callable[[], Any]:
    torch = torch_module()
    x = torch.from_numpy(kw["features"]).requires_grad_(True)
    lab = torch.from_numpy(kw["labels"].astype(np.int64))

    def run() -> Any:
        loss = torch.nn.functional.cross_entropy(x, lab, reduction="none")
        return torch.autograd.grad(loss.sum(), x)
    return run


BENCHES = [
    Bench(OP, "[32,10] int32", _bench(32, 10), _bytes, torch=_torch),
    Bench(OP, "[256,1000] int32", _bench(256, 1000), _bytes, torch=_torch),
]

WARMUP: list[Warmup] = [
    Warmup(OP, "[256, 1000] int64", lambda rng: dict(
        features=logits(rng, 256, 1000), labels=rng.integers(0, 1000, 256)), large=True),
]


def _large() -> dict[str, Any]:
    g = np.random.default_rng(1)
    return dict(features=logits(g, 512, 100), labels=g.integers(0, 100, 512).astype(np.int32))


LARGE: dict[str, Callable[[], dict[str, Any]]] = {OP: _large}
