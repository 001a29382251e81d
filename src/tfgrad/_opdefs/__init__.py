"""The op-definition table: one declarative entry per op, as TF's ``REGISTER_OP``.

Each :class:`OpDef` names the op's inputs (with their dtype or the type attr that
gives it), its attrs (type, default, allowed values or range) and its outputs, in
TensorFlow 2.21's order and spelling. The table drives argument validation
(:mod:`tfgrad._validate`), the generated ``tfgrad.raw_ops`` and snake_case
functions (their signatures and docstrings) and ``python -m tfgrad ops``.

The types are in :mod:`._types` (re-exported here); each family's entries are in its own
module (``_opdefs/<family>.py``, a tuple of :class:`OpDef`); :data:`OPS` joins them in
the order below, which is the order of ``python -m tfgrad ops``, the README's tables and
the stubs. A new family adds its module and its tuple to :data:`OPS`.

Dtypes are named as NumPy names them (``"float32"``, ``"bfloat16"`` from ml_dtypes).
"""

from __future__ import annotations

from ._types import (
    FLOATS_ALL,
    FLOATS_HALF,
    POOL_TYPES,
    REQUIRED,
    Attr,
    Input,
    OpDef,
    Output,
    TypeAttr,
    snake_case,
)
from .activation import ACTIVATION
from .avg_pool import AVG_POOL
from .batch_norm import BATCH_NORM
from .bias_add import BIAS_ADD
from .conv2d import CONV2D
from .cwise import CWISE
from .depthwise_conv import DEPTHWISE
from .fake_quant import FAKE_QUANT
from .fractional_pool import FRACTIONAL_POOL
from .matmul import MATMUL
from .max_pool import MAX_POOL
from .reduction import REDUCTION
from .softmax import SOFTMAX
from .softmax_xent import SOFTMAX_XENT

__all__ = [
    "ACTIVATION", "AVG_POOL", "BATCH_NORM", "BIAS_ADD", "CONV2D", "CWISE", "DEPTHWISE",
    "FAKE_QUANT", "FAMILIES", "FLOATS_ALL", "FLOATS_HALF", "FRACTIONAL_POOL", "MATMUL",
    "MAX_POOL", "OPS", "POOL_TYPES", "REDUCTION", "REQUIRED", "SOFTMAX", "SOFTMAX_XENT",
    "Attr", "Input", "OpDef", "Output", "TypeAttr", "get_op_def", "snake_case",
]

OPS: dict[str, OpDef] = {
    op.name: op for op in FAKE_QUANT + BATCH_NORM + DEPTHWISE + FRACTIONAL_POOL + ACTIVATION
    + BIAS_ADD + MATMUL + CONV2D + REDUCTION + SOFTMAX_XENT + SOFTMAX + MAX_POOL
    + CWISE + AVG_POOL
}
"""Every op tfgrad implements, by TF name."""

FAMILIES: dict[str, tuple[str, ...]] = {}
for _op in OPS.values():
    FAMILIES.setdefault(_op.family, ())
    FAMILIES[_op.family] += (_op.name,)
del _op


def get_op_def(name: str) -> OpDef:
    """The definition of op ``name`` (TF's CamelCase name or the snake_case one)."""
    if name in OPS:
        return OPS[name]
    for op in OPS.values():
        if op.snake_name == name:
            return op
    raise KeyError(f"tfgrad has no op named {name!r}; known ops: {', '.join(OPS)}")
