"""Op cases for Softmax (see tfgrad/testing/cases/__init__.py).

Sizes around Eigen's packets (the exp's tail of each block of TF's tiled assignment goes
through the C library's expf; rows below 8 * (rows // 8) take rcpps + a Newton step for
the reciprocal, the others an exact division), past TF's block (6956 values: several
blocks, rows split across blocks), past the tree's leaf; logits at scales where exp
underflows; NaN, +-inf and denormal logits; ranks 1 to 4.
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
OP = "Softmax"


def logits(rng: np.random.Generator, shape: tuple[int, ...], scale: float = 3.0,
           special: bool = False) -> np.ndarray:
    x = (rng.standard_normal(shape) * scale).astype(F32)
    if special and x.size >= 8:
        idx = rng.choice(x.size, 4, replace=False)
        x.reshape(-1)[idx] = np.array([1e-40, -np.inf, -0.0, -3e-39], F32)
    return x


def _add(name: str, shape: tuple[int, ...], scale: float = 3.0, special: bool = False,
         rows: dict[int, list[float]] | None = None) -> None:
    def make(rng: np.random.Generator) -> dict[str, Any]:
        x = logits(rng, shape, scale, special)
        for i, row in (rows or {}).items():
            x.reshape(-1, shape[-1])[i, :len(row)] = row
        return dict(logits=x)

    CASES.append(Case(OP, name, make))


CASES: list[Case] = []
_add("mnist_32x10", (32, 10))
for _s in ((1,), (7,), (9,), (1, 1), (3, 1), (5, 7), (4, 8), (13, 9), (7, 13), (2, 33),
           (64, 100), (3, 1000), (2, 3, 17), (2, 2, 3, 5)):
    _add("x".join(map(str, _s)), _s)
_add("blocks_rows_1000x10", (1000, 10))  # several blocks of 696 rows
_add("blocks_rows_513x7", (513, 7))
_add("blocks_row_2x8200", (2, 8200), scale=1.0)  # a row split across blocks, tree leaves
_add("peaked", (8, 20), scale=40.0)  # exp underflows (FTZ)
_add("flat", (8, 20), scale=1e-3)
_add("specials", (6, 12), special=True)
_add("nonfinite_rows", (4, 9), rows={0: [np.nan], 1: [np.inf], 2: [-np.inf, -np.inf],
                                     3: [-np.inf] * 9})
_add("empty", (0, 5))
_add("no_classes", (3, 0))

ERROR_CASES: list[ErrorCase] = [
    ErrorCase(OP, "scalar", lambda: dict(logits=np.float32(1.0)), IAE,
              r"logits must have >= 1 dimension, got \[\]"),
    ErrorCase(OP, "float64", lambda: dict(logits=np.ones((2, 3))), InvalidDtypeError,
              r"float32", tf_rejects=False,
              why="TF computes in float64 and half types too; tfgrad implements float32"),
]


def processor_dependent(case: Case, kwargs: dict[str, Any]) -> set[str]:
    """The rows in full packets of 8 take the processor's rcpps (Intel's and AMD's
    differ, and TF's bits with them)."""
    x = kwargs["logits"]
    rows = x.size // x.shape[-1] if x.ndim and x.shape[-1] else 0
    return {"softmax"} if rows >= 8 else set()


def _bench(shape: tuple[int, ...]) -> Callable[[np.random.Generator, bool], dict[str, Any]]:
    def make(rng: np.random.Generator, smoke: bool) -> dict[str, Any]:
        return dict(logits=logits(rng, (4, shape[-1]) if smoke else shape))
    return make


def _bytes(kw: dict[str, Any]) -> int:
    return 2 * array_bytes(kw["logits"])


def _torch(kw: dict[str, Any]) -> Callable[[], Any]:
    torch = torch_module()
    x = torch.from_numpy(kw["logits"])
    return lambda: torch.softmax(x, -1)


BENCHES = [
    Bench(OP, "[32,10]", _bench((32, 10)), _bytes, torch=_torch),
    Bench(OP, "[256,1000]", _bench((256, 1000)), _bytes, torch=_torch),
]

WARMUP: list[Warmup] = [
    Warmup(OP, "[256, 1000]", lambda rng: dict(logits=logits(rng, (256, 1000))), large=True),
]


def _large() -> dict[str, Any]:
    return dict(logits=logits(np.random.default_rng(1), (512, 100)))


LARGE: dict[str, Callable[[], dict[str, Any]]] = {OP: _large}
