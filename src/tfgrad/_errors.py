"""Exceptions raised by tfgrad: TensorFlow's error classes, under TF's names.

Each is raised where TF 2.21 raises the class of the same name for the same input, so
that code ported from TF catches it by the same name (``tfgrad.errors``). Every one of
them is an :class:`InvalidArgumentError`, tfgrad's contract for bad input, and so a
:class:`ValueError`; the dtype errors are :class:`TypeError` too. Unlike TF's classes,
which are siblings under ``OpError``, the others subclass InvalidArgumentError: put
``except`` clauses for them before one for InvalidArgumentError.
"""

from __future__ import annotations


class OpError(ValueError):
    """The base of every error tfgrad raises for bad input, as ``tf.errors.OpError``."""


class InvalidArgumentError(OpError):
    """An argument is malformed: wrong shape, rank, size, value, attribute or dtype.

    ``tf.errors.InvalidArgumentError``. It subclasses :class:`ValueError`, so ``except
    ValueError`` catches it; every other class here subclasses it. A wrong attr type (a
    string for a float attr), which TF's Python binding rejects, raises :class:`TypeError`.
    """


class UnimplementedError(InvalidArgumentError):
    """``tf.errors.UnimplementedError``: an argument combination TF's kernel does not
    support (fractional pooling over the batch or channel dimension)."""


class ResourceExhaustedError(InvalidArgumentError):
    """``tf.errors.ResourceExhaustedError``: an output (or TF's temporary) would need more
    memory than can be allocated."""


class NotFoundError(InvalidArgumentError, TypeError):
    """``tf.errors.NotFoundError``: TF's op definition allows these dtypes but TF has no CPU
    kernel for them (FusedBatchNormV3 with bfloat16 statistics). A TypeError too."""


class InvalidDtypeError(InvalidArgumentError, TypeError):
    """An input's dtype is not one the op allows: TF raises InvalidArgumentError
    ("Value for attr 'T' of double is not in the list of allowed values"). A TypeError
    too, as tfgrad raised before it had TF's classes."""


class ResourceLimitError(ResourceExhaustedError):
    """An output would need more memory than tfgrad is allowed to allocate (the machine's
    available memory, or ``TFGRAD_MAX_BYTES``): TF's ResourceExhaustedError ("OOM when
    allocating tensor"), raised before anything is allocated."""
