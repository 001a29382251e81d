"""The op-case table: one module per op family (named as the family in the op table).

Modelled on PyTorch's OpInfo database. A :class:`Case` builds the keyword arguments of
one ``raw_ops`` call from a random generator; the same case drives

- the golden fixtures (``tools/make_fixtures.py`` runs TF 2.21 on it with a fixed seed),
- the fixture tests (tfgrad kernel and NumPy reference against the stored TF outputs),
- the live tests (fresh seeds, TF run in the same process, when TF is importable),
- the no-mutation and layout tests,
- ``tfgrad conformance`` (fresh seeds against TF) and ``tfgrad warmup`` (its inputs).

An :class:`ErrorCase` is an input TF's kernel rejects (or that tfgrad rejects on
purpose): tfgrad must raise ``error`` with a message matching ``match``; where TF rejects
it, TF must raise the class of the same name (``tf_class``) with a message matching
``match`` too.

A :class:`Warmup` is a further input for ``tfgrad warmup``, which runs every case and
every benchmark shape of the family and then these: inputs that select kernel variants
the cases and benchmarks do not (other dtypes and attrs at sizes that take the threaded
kernels).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Case:
    op: str
    name: str
    make: Callable[[np.random.Generator], dict[str, Any]]
    ulps: dict[str, int] = field(default_factory=dict)
    """Allowed distance from TF in float ulps per output name (absent: bit-identical)."""
    tf_call: Callable[[dict[str, Any]], tuple[str, dict[str, Any]]] | None = None
    """For cases TF's Eigen CPU kernel refuses (NCHW, dilations...): builds the equivalent
    call ``(op_name, kwargs)`` that TF does compute; its outputs, mapped by
    ``tf_outputs``, are what tfgrad must return."""
    tf_outputs: Callable[[Any], Any] | None = None
    """Maps TF's outputs of the ``tf_call`` call back to the outputs of this case."""
    live: bool = True
    """Also run against live TF on fresh inputs."""

    @property
    def id(self) -> str:
        return f"{self.op}/{self.name}"

    def seed(self) -> int:
        return zlib.crc32(self.id.encode())

    def kwargs(self, seed: int | None = None) -> dict[str, Any]:
        rng = np.random.default_rng(self.seed() if seed is None else seed)
        return self.make(rng)


@dataclass(frozen=True)
class ErrorCase:
    op: str
    name: str
    kwargs: Callable[[], dict[str, Any]]
    error: type[Exception]
    """The class tfgrad raises: one of ``tfgrad.errors`` (TF's names), or TypeError."""
    match: str
    """Regular expression that tfgrad's message must match (re.search), and TF's too
    where TF rejects the call (unless ``tf_match``): tfgrad's messages start with TF's
    words."""
    tf_rejects: bool = True
    """TF 2.21 (Eigen path) rejects the same call; checked live. False where TF accepts
    (or crashes on) input that tfgrad rejects on purpose; the reason goes in ``why``."""
    why: str = ""
    tf_error: str = ""
    """The class TF raises, by name, where it is not the one ``error`` stands for (a
    deliberate difference, explained in ``why``); see :attr:`tf_class`."""
    tf_match: str | None = None
    """Regular expression for TF's message where TF's words are not tfgrad's (``why``)."""

    @property
    def id(self) -> str:
        return f"{self.op}/{self.name}"

    @property
    def tf_class(self) -> str:
        """The name of the class TF 2.21 raises: a ``tf.errors`` class, or a Python
        built-in (TypeError) raised by TF's binding. By default the TF class that
        ``error`` stands for: its first base of that name in ``tfgrad.errors``
        (InvalidDtypeError -> InvalidArgumentError, ResourceLimitError ->
        ResourceExhaustedError)."""
        return self.tf_error or tf_class_name(self.error)


@dataclass(frozen=True)
class Warmup:
    op: str
    name: str
    make: Callable[[np.random.Generator], dict[str, Any]]
    large: bool = False
    """Sized for the threaded kernels (``tfgrad warmup --small`` leaves it out)."""


TF_ERROR_NAMES = ("InvalidArgumentError", "UnimplementedError", "ResourceExhaustedError",
                  "NotFoundError")
"""The ``tf.errors`` classes TF 2.21 raises for these ops (``tfgrad.errors`` has them)."""


def tf_class_name(cls: type[Exception]) -> str:
    for c in cls.__mro__:
        if c.__name__ in TF_ERROR_NAMES:
            return c.__name__
    return cls.__name__
