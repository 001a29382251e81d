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
        module = importlib.import_module(f"{__package__}.ops.{op.family}")
        impl = _IMPLS[op.name] = getattr(module, op.name)
    return impl


def output_type(op: OpDef) -> Any:
    if len(op.outputs) == 1:
        return np.ndarray
    return collections.namedtuple(op.name, [o.name for o in op.outputs])


# --------------------------------------------------------------------------------------
# The signature cache
# --------------------------------------------------------------------------------------
# A call whose inputs are NumPy arrays of the op's own dtypes (passed to the op as they
# are) and whose attrs are plain Python values is described, for every check that needs
# no input values, by its signature: the op, each array's dtype, shape and strides, the
# values of the shape inputs, the attrs' values (and types: 8.0 is not 8, True is not 1,
# -0.0 is not 0.0), the seeds excepted (``_VOLATILE``). The first call of a signature
# runs ``bind`` and the family's ``prepare`` (``check``: shapes, ranks, sizes,
# allocations; what follows from the attrs alone); later calls run only what ``prepare``
# returned: the value checks and the compute. Never cached: a call that raised before
# its value checks, one whose checks read the machine (an allocation past
# ``_validate``'s always-allowed size, or TFGRAD_MAX_BYTES set), inputs that bind
# converts (Python values, other dtypes).
_CACHE: dict[tuple, tuple[Callable[[dict[str, Any]], Any], dict[str, Any], tuple[str, ...]]] = {}
_CACHE_MAX = 4096
_NO = object()


def _float_key(v: Any) -> Any:
    if type(v) is int:
        return v
    if type(v) is float:
        return v if v else repr(v)  # (-0.0 == 0.0, and hashes alike)
    return _NO


def _list_key(v: Any, kind: str) -> Any:
    if type(v) is not list and type(v) is not tuple:
        return _NO
    if kind == "list(int)":
        for x in v:
            if type(x) is not int:
                return _NO
        return tuple(v)
    k = tuple(_float_key(x) for x in v)
    return _NO if _NO in k else k


_VOLATILE = frozenset({"seed", "seed2"})
"""Int attrs whose values change from call to call (the fractional pools' seeds, drawn per
step): kept out of the signature and passed to the cached rest of the op with the arrays,
their type and range checked on every call, so that a new seed neither binds and checks
the call again nor fills the cache."""
_INT64 = (-(2**63), 2**63 - 1)


def _volatile(op: OpDef) -> tuple[str, ...]:
    return tuple(a.name for a in op.attrs if a.name in _VOLATILE and a.type == "int")


def _key_function(op: OpDef) -> Callable[[dict[str, Any]], tuple | None]:
    """The signature of a call of ``op`` (hashable), or None where it is not cacheable."""
    arrays = tuple(i.name for i in op.inputs if not i.is_shape)
    shapes = tuple(i.name for i in op.inputs if i.is_shape)
    volatile = _volatile(op)
    lo, hi = _INT64
    plain = tuple((a.name, _ATTR_TYPES[a.type]) for a in op.attrs
                  if a.type in _ATTR_TYPES and a.name not in volatile)
    floats = tuple(a.name for a in op.attrs if a.type == "float")
    lists = tuple((a.name, a.type) for a in op.attrs if a.type.startswith("list("))
    ndarray = np.ndarray

    def key(arguments: dict[str, Any]) -> tuple | None:
        k: list[Any] = [op.name]
        for n in arrays:
            v = arguments[n]
            if type(v) is not ndarray:
                return None
            k += (v.dtype, v.shape, v.strides)
        for n in shapes:  # (their values are part of the signature)
            v = arguments[n]
            if type(v) is ndarray:
                k += (v.dtype, v.shape, v.strides, v.tobytes())
            else:  # a list of Python ints (the adapters' form)
                v = _list_key(v, "list(int)")
                if v is _NO:
                    return None
                k.append(v)
        for n, t in plain:
            v = arguments[n]
            if type(v) is not t:
                return None
            k.append(v)
        for n in volatile:  # (checked here as bind would, not part of the key)
            v = arguments[n]
            if type(v) is not int or not lo <= v <= hi:
                return None
        for n in floats:
            v = _float_key(arguments[n])
            if v is _NO:
                return None
            k.append(v)
        for n, kind in lists:
            v = _list_key(arguments[n], kind)
            if v is _NO:
                return None
            k.append(v)
        return tuple(k)

    return key


_ATTR_TYPES = {"int": int, "bool": bool, "string": str}
_KEYS: dict[str, Callable[[dict[str, Any]], tuple | None]] = {}
_PREPARE: dict[str, Callable[[str, dict[str, Any]], Callable[[dict[str, Any]], Any]]] = {}


def _prepare(op: OpDef) -> Callable[[str, dict[str, Any]], Callable[[dict[str, Any]], Any]]:
    """The family's ``prepare(op_name, kwargs)`` (the checks that need no input values,
    returning the rest of the op), or the whole op where the family has none."""
    prep = _PREPARE.get(op.name)
    if prep is None:
        module = importlib.import_module(f"{__package__}.ops.{op.family}")
        prep = getattr(module, "prepare", None)
        if prep is None:
            impl = _impl(op)

            def prep(op_name: str, kwargs: dict[str, Any]) -> Callable[[dict[str, Any]], Any]:
                return lambda kw: impl(**kw)
        _PREPARE[op.name] = prep
    return prep


def signature(op: OpDef, arguments: dict[str, Any]) -> tuple | None:
    """The call's signature (see above), or None where the call is not cacheable:
    inputs that are not NumPy arrays, attrs that are not plain Python values."""
    return _KEYS[op.name](arguments)


def cached(key: tuple | None) -> tuple | None:
    """The signature cache's entry for ``key`` (the rest of the op, its fixed arguments,
    the names passed per call), where a call of that signature was cached."""
    if key is None or _validate.max_bytes_set():
        return None
    return _CACHE.get(key)


def run_cached(name: str, entry: tuple, arguments: dict[str, Any]) -> Any:
    """Run op ``name``'s cached entry (:func:`cached`) on a call of its signature, as
    :func:`run` would find and run it; the caller vouches for the signature."""
    return run_rest(name, entry[0], _kwargs(entry, arguments))


def split_entry(entry: tuple, constants: dict[str, Any]
                ) -> tuple[Callable[[dict[str, Any]], Any], dict[str, Any], tuple[str, ...]]:
    """A cached entry (:func:`cached`) for a caller that keeps it and passes the same
    constants call after call (tfgrad.qat's replay): its rest, its fixed arguments with
    those of ``constants`` it takes per call, and the names of the others, which the
    caller adds each call before :func:`run_rest`."""
    rest, fixed, passed = entry
    kwargs = dict(fixed)
    names = []
    for n in passed:
        if n in constants:
            kwargs[n] = constants[n]
        else:
            names.append(n)
    return rest, kwargs, tuple(names)


def run_rest(name: str, rest: Callable[[dict[str, Any]], Any], kwargs: dict[str, Any]) -> Any:
    """A cache entry's rest on every argument it takes, fixed and passed (:func:`run_cached`,
    or a caller of :func:`split_entry`)."""
    try:
        return rest(kwargs)
    except MemoryError as e:
        raise ResourceLimitError(f"{name}: out of memory ({e})") from None


def _kwargs(entry: tuple, arguments: dict[str, Any]) -> dict[str, Any]:
    """A cache entry's arguments for a call: its fixed ones, and those the call passes."""
    _, fixed, passed = entry
    kwargs = dict(fixed)
    for n in passed:
        kwargs[n] = arguments[n]
    return kwargs


def _run(op: OpDef, arguments: dict[str, Any], key: Any) -> Any:
    if key is _NO:
        key = _KEYS[op.name](arguments)
    if key is not None and _validate.max_bytes_set():
        key = None
    if key is not None:
        entry = _CACHE.get(key)
        if entry is not None:
            return entry[0](_kwargs(entry, arguments))
    slow = _validate.slow_checks()
    kwargs = _validate.bind(op, arguments)
    rest = _prepare(op)(op.name, kwargs)
    if key is not None and _validate.slow_checks() == slow:
        volatile = _volatile(op)
        passed = list(volatile)
        fixed = {a.name: kwargs[a.name] for a in op.attrs if a.name not in volatile}
        for i in op.inputs:
            v = arguments[i.name]
            if type(v) is np.ndarray:
                if kwargs[i.name] is not v:
                    return rest(kwargs)  # (converted: not cached)
                passed.append(i.name)
            else:  # a shape input given as ints: its array, read-only as it is shared
                fixed[i.name] = kwargs[i.name]
                kwargs[i.name].flags.writeable = False
        if len(_CACHE) >= _CACHE_MAX:
            _CACHE.clear()
        _CACHE[key] = (rest, fixed, tuple(passed))
    return rest(kwargs)


def run(op: OpDef, arguments: dict[str, Any], key: Any = _NO) -> Any:
    """Validate ``arguments`` for ``op`` (every input and attr given, as ``raw_ops.<Op>``
    takes them) and run it: the result as the family returns it (an array, or a tuple).
    ``key``: the call's ``signature``, where the caller has it."""
    try:
        return _run(op, arguments, key)
    except MemoryError as e:  # a last line of defence: check_alloc should come first
        raise ResourceLimitError(f"{op.name}: out of memory ({e})") from None


def call(op: OpDef, arguments: dict[str, Any]) -> Any:
    """Validate ``arguments`` for ``op`` and run it."""
    result = run(op, arguments)
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
_KEYS.update((name, _key_function(op)) for name, op in OPS.items())
