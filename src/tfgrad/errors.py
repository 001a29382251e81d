"""TensorFlow's error classes, as ``tf.errors``: catch tfgrad's errors by TF's names.

    try:
        tfgrad.fractional_avg_pool(x, [2.0, 1.5, 1.5, 1.0])
    except tfgrad.errors.UnimplementedError:   # where TF raises tf.errors.UnimplementedError
        ...

Only the classes TF 2.21 raises for tfgrad's ops, and ``OpError``, their base. Each is
a subclass of :class:`InvalidArgumentError` (tfgrad's error for any bad input, a
``ValueError``), so ``except tfgrad.InvalidArgumentError`` catches them all; list the
narrower ones first. tfgrad's own refinements: ``InvalidDtypeError`` (TF's
InvalidArgumentError for a dtype the op does not allow; also a ``TypeError``) and
``ResourceLimitError`` (a ResourceExhaustedError raised before allocating).
"""

from ._errors import (
    InvalidArgumentError,
    InvalidDtypeError,
    NotFoundError,
    OpError,
    ResourceExhaustedError,
    ResourceLimitError,
    UnimplementedError,
)

__all__ = [
    "InvalidArgumentError",
    "InvalidDtypeError",
    "NotFoundError",
    "OpError",
    "ResourceExhaustedError",
    "ResourceLimitError",
    "UnimplementedError",
]
