"""tfgrad: TensorFlow 2.21's training kernels, bit for bit, in NumPy and Numba.

Fake quantization (per tensor and per channel), fused batch normalization, depthwise
2-D convolution and fractional average/max pooling, forward and gradient.

- ``tfgrad.raw_ops.<OpName>(**kwargs)``: as ``tf.raw_ops`` (keyword-only).
- ``tfgrad.<op_name>(inputs..., attr=...)``: as TF's generated Python wrappers.
- Bad input raises :class:`InvalidArgumentError` (a ``ValueError``) or ``TypeError``;
  ``tfgrad.errors`` has TF's error classes (``UnimplementedError``...) under TF's names.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import _config, errors, raw_ops
from ._api import make_function
from ._config import use_impl
from ._errors import InvalidArgumentError, ResourceLimitError
from ._opdefs import OPS, OpDef, get_op_def

_config.tune_malloc()

__version__ = "0.1.0"

__all__ = [
    "InvalidArgumentError",
    "OpDef",
    "ResourceLimitError",
    "errors",
    "get_op_def",
    "raw_ops",
    "use_impl",
    "__version__",
]

if TYPE_CHECKING:  # the snake_case functions are generated below; _generated.pyi types them
    from ._generated import *  # noqa: F403

for _op in OPS.values():
    globals()[_op.snake_name] = make_function(_op, "snake")
    __all__.append(_op.snake_name)
del _op
