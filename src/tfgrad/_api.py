"""Builds the public functions (``raw_ops.<Op>`` and ``tfgrad.<op_name>``) from the op table.

Both forms share one call path: bind the arguments against the op's signature,
validate them from the op definition (``_validate.bind``), run the family's
implementation (``tfgrad.ops.<family>.<OpName>``) and wrap multiple outputs in a
namedtuple with TF's output names.
"""

from __future__ import annotations

import collections
import importlib
import inspect
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

from . import _validate
from ._errors import ResourceLimitError
from ._opdefs import REQUIRED, OpDef

ArrayLike = npt.ArrayLike

_TYPES = {"int": int, "float": float, "bool": bool, "string": str,
          "list(int)": "list[int]", "list(float)": "list[float]"}


_IMPLS: dict[str, Callable[..., Any]] = {}


def _impl(op: OpDef) -> Callable[..., Any]:
    impl = _IMPLS.get(op.name)
    if impl is None:  # (the family module is imported on first use)
        module = importlib.import_module(f"tfgrad.ops.{op.family}")
        impl = _IMPLS[op.name] = getattr(module, op.name)
    return impl


def output_type(op: OpDef) -> Any:
    if len(op.outputs) == 1:
        return np.ndarray
    return collections.namedtuple(op.name, [o.name for o in op.outputs])


def call(op: OpDef, arguments: dict[str, Any]) -> Any:
    """Validate ``arguments`` for ``op`` and run it."""
    kwargs = _validate.bind(op, arguments)
    try:
        result = _impl(op)(**kwargs)
    except MemoryError as e:  # a last line of defence: check_alloc should come first
        raise ResourceLimitError(f"{op.name}: out of memory ({e})") from None
    if len(op.outputs) == 1:
        return result
    return _OUTPUT_TYPES[op.name](*result)


def docstring(op: OpDef, style: str) -> str:
    lines = [op.summary, ""]
    if op.description:
        lines += [op.description, ""]
    for note in op.notes:
        lines += ["Note: " + note, ""]
    lines.append("Args:")
    for i in op.inputs:
        dt = i.dtype or f"{i.type_attr} in ({', '.join(op.type_attr(i.type_attr).allowed)})"
        lines.append(f"  {i.name}: array of {dt}. {i.doc}".rstrip())
    for a in op.attrs:
        extra = []
        if a.default is not REQUIRED:
            extra.append(f"default {a.default!r}")
        if a.allowed:
            extra.append(f"one of {', '.join(map(repr, a.allowed))}")
        if a.minimum is not None or a.maximum is not None:
            extra.append(f"range [{a.minimum}, {a.maximum}]")
        if a.min_length is not None:
            extra.append(f"at least {a.min_length} values")
        suffix = f" ({'; '.join(extra)})" if extra else ""
        lines.append(f"  {a.name}: {a.type}{suffix}. {a.doc}".rstrip())
    lines.append("  name: ignored; accepted for compatibility with TensorFlow.")
    lines.append("")
    if len(op.outputs) == 1:
        o = op.outputs[0]
        lines.append(f"Returns: numpy.ndarray `{o.name}` of {o.dtype or o.type_attr}. {o.doc}")
    else:
        lines.append(f"Returns: a namedtuple {op.name}({', '.join(o.name for o in op.outputs)}):")
        for o in op.outputs:
            lines.append(f"  {o.name}: {o.dtype or o.type_attr}. {o.doc}".rstrip())
    lines += ["", "Raises:",
              "  InvalidArgumentError: a shape, size, value or attr is invalid.",
              "  TypeError: an input has a dtype the op does not take, or an attr the wrong type."]
    if style == "raw":
        lines += ["", f"Keyword-only, as `tf.raw_ops.{op.name}` in TensorFlow 2.21."]
    return "\n".join(lines)


def _signature(op: OpDef, style: str) -> inspect.Signature:
    kind_in = (inspect.Parameter.KEYWORD_ONLY if style == "raw"
               else inspect.Parameter.POSITIONAL_OR_KEYWORD)
    params = [inspect.Parameter(i.name, kind_in, annotation="ArrayLike") for i in op.inputs]
    for a in op.attrs:
        if a.default is REQUIRED:
            kind = (inspect.Parameter.KEYWORD_ONLY if style == "raw"
                    else inspect.Parameter.POSITIONAL_OR_KEYWORD)
            params.append(inspect.Parameter(a.name, kind, annotation=_TYPES[a.type]))
    for a in op.attrs:
        if a.default is not REQUIRED:
            default = list(a.default) if isinstance(a.default, tuple) else a.default
            kind = (inspect.Parameter.KEYWORD_ONLY if style == "raw"
                    else inspect.Parameter.POSITIONAL_OR_KEYWORD)
            params.append(inspect.Parameter(a.name, kind, default=default,
                                            annotation=_TYPES[a.type]))
    params.append(inspect.Parameter("name", inspect.Parameter.KEYWORD_ONLY, default=None,
                                    annotation="str | None"))
    ret = "numpy.ndarray" if len(op.outputs) == 1 else op.name
    return inspect.Signature(params, return_annotation=ret)


def make_function(op: OpDef, style: str) -> Callable[..., Any]:
    """``style='raw'``: keyword-only ``raw_ops.<Op>``; ``'snake'``: ``tfgrad.<op_name>``."""
    sig = _signature(op, style)
    params = sig.parameters.values()
    names = frozenset(p.name for p in params)
    required = frozenset(p.name for p in params if p.default is p.empty)
    defaults = {p.name: p.default for p in params if p.default is not p.empty}

    def fn(*args: Any, **kwargs: Any) -> Any:
        if not args and required <= kwargs.keys() <= names:
            # (what sig.bind + apply_defaults give for keywords alone, in a tenth of the
            # time: ~8 us a call, 1% of a 0.6 ms depthwise op)
            return call(op, {**defaults, **kwargs})
        if style == "raw" and args:
            raise TypeError(f"raw_ops.{op.name} only takes keyword arguments, got {len(args)} "
                            "positional")
        unknown = sorted(kwargs.keys() - names)
        if unknown:  # (named before any missing argument: a misspelt one is both)
            raise TypeError(f"{fn.__name__}() got an unexpected keyword argument "
                            f"{unknown[0]!r}; its arguments: {', '.join(sig.parameters)}")
        try:
            bound = sig.bind(*args, **kwargs)
        except TypeError as e:
            raise TypeError(f"{fn.__name__}(): {e}") from None
        bound.apply_defaults()
        return call(op, bound.arguments)

    fn.__name__ = fn.__qualname__ = op.name if style == "raw" else op.snake_name
    fn.__module__ = "tfgrad.raw_ops" if style == "raw" else "tfgrad"
    fn.__doc__ = docstring(op, style)
    fn.__signature__ = sig  # type: ignore[attr-defined]
    fn.op_def = op  # type: ignore[attr-defined]
    fn.OP_NAME = op.name  # type: ignore[attr-defined]
    return fn


from ._opdefs import OPS  # noqa: E402

_OUTPUT_TYPES: dict[str, Any] = {
    name: output_type(op) for name, op in OPS.items() if len(op.outputs) > 1
}
