"""The op table's types: :class:`OpDef` and its input, attr and output records.

Each :class:`OpDef` names the op's inputs (with their dtype or the type attr that
gives it), its attrs (type, default, allowed values or range) and its outputs, in
TensorFlow 2.21's order and spelling. The family modules of :mod:`tfgrad._opdefs`
build their entries from these; the package re-exports them.

Dtypes are named as NumPy names them (``"float32"``, ``"bfloat16"`` from ml_dtypes).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()
"""Marker for an attr without a default (the caller must pass it)."""

FLOATS_HALF = ("float16", "bfloat16", "float32")
FLOATS_ALL = ("float16", "bfloat16", "float32", "float64")
POOL_TYPES = ("float32", "float64", "int32", "int64")


@dataclass(frozen=True)
class Input:
    name: str
    dtype: str | None = None
    """Fixed dtype of the input, or None when ``type_attr`` gives it."""
    type_attr: str | None = None
    doc: str = ""
    is_shape: bool = False
    """The input holds a shape (TF keeps it in host memory): the framework adapters take
    it as a list of ints, so that output shapes are known without reading a tensor."""


@dataclass(frozen=True)
class TypeAttr:
    """A dtype attr (``T``, ``U``), inferred from the inputs as TF's Python binding does."""

    name: str
    allowed: tuple[str, ...]


@dataclass(frozen=True)
class Attr:
    name: str
    type: str
    """One of ``int``, ``float``, ``bool``, ``string``, ``list(int)``, ``list(float)``."""
    default: Any = REQUIRED
    allowed: tuple[Any, ...] | None = None
    minimum: float | None = None
    maximum: float | None = None
    min_length: int | None = None
    doc: str = ""


@dataclass(frozen=True)
class Output:
    name: str
    dtype: str | None = None
    type_attr: str | None = None
    doc: str = ""
    shape: str = ""
    """How the output's shape follows from the inputs (:mod:`tfgrad._shapes`): ``"like
    <input>"``, ``"values of <input>"`` (a shape input), ``"()"`` or ``"(0,)"``; empty
    where the family's ``output_shapes`` computes it."""


@dataclass(frozen=True)
class OpDef:
    name: str
    family: str
    """Module under ``tfgrad.ops`` (and ``tfgrad.kernels``) that implements the op."""
    inputs: tuple[Input, ...]
    attrs: tuple[Attr, ...]
    outputs: tuple[Output, ...]
    type_attrs: tuple[TypeAttr, ...] = ()
    summary: str = ""
    description: str = ""
    notes: tuple[str, ...] = field(default=())
    """Where tfgrad deliberately differs from (goes beyond) TF's CPU kernel."""

    @property
    def snake_name(self) -> str:
        return snake_case(self.name)

    def type_attr(self, name: str) -> TypeAttr:
        for t in self.type_attrs:
            if t.name == name:
                return t
        raise KeyError(name)

    def attr(self, name: str) -> Attr:
        for a in self.attrs:
            if a.name == name:
                return a
        raise KeyError(name)


def snake_case(op_name: str) -> str:
    """TF's generated-wrapper name: ``FusedBatchNormV3`` -> ``fused_batch_norm_v3``."""
    # (an underscore before a capital that follows a lower-case letter, or that starts a
    # word after a digit or an acronym: Conv2DBackpropInput -> conv2d_backprop_input)
    s = re.sub(r"(?<=[a-z])(?=[A-Z])|(?<=[A-Z0-9])(?=[A-Z][a-z])", "_", op_name)
    return s.lower()
