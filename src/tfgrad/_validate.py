"""Argument checks shared by every op, driven by the op definitions in ``_opdefs``.

``bind`` turns the user's keyword arguments into NumPy arrays of the right dtype and
attr values of the right Python type, or raises ``TypeError`` (wrong attr type, dtypes
that do not convert) / ``InvalidArgumentError`` (attr out of range, malformed value; a
dtype the op does not allow: ``InvalidDtypeError``, TF's InvalidArgumentError and a
TypeError too), with TF's words first. Op-specific checks (shapes, sizes) live with each
op family and use the small helpers below.

Attr types are checked more strictly than TF's Python wrappers convert them, on purpose:
TF truncates a float given for an int attr (``num_bits=8.7`` runs as 8) and takes a bool
for a float attr (``min=True`` is 1.0); here both are TypeErrors. ``None`` for an attr
with a default means the default, as in TF's wrappers.
"""

from __future__ import annotations

import math
import os
from typing import Any

import ml_dtypes
import numpy as np

from ._errors import InvalidArgumentError, InvalidDtypeError, NotFoundError, ResourceLimitError
from ._opdefs import REQUIRED, Attr, Input, OpDef

DTYPES: dict[str, np.dtype] = {
    "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "float32": np.dtype(np.float32),
    "float64": np.dtype(np.float64),
    "int32": np.dtype(np.int32),
    "int64": np.dtype(np.int64),
}
_FLOAT_NAMES = ("float16", "bfloat16", "float32", "float64")
_INT_NAMES = ("int32", "int64")
_INT64_MAX = 2**63 - 1


_NAMES = {dt: name for name, dt in DTYPES.items()}
_TF_NAMES = {"float16": "half", "float32": "float", "float64": "double"}
"""TF's names of the dtypes whose names differ from NumPy's (in TF's messages)."""
_NO_CPU_KERNEL = {("FusedBatchNormV3", "U"): ("bfloat16",)}
"""Dtypes TF's op definition allows that TF 2.21 has no CPU kernel for (NotFoundError)."""


def tf_dtype_name(name: str) -> str:
    return _TF_NAMES.get(name, name)


def dtype_name(dt: np.dtype) -> str:
    name = _NAMES.get(dt)  # (np.dtype() and .name cost microseconds a call)
    if name is not None:
        return name
    dt = np.dtype(dt)
    if dt == DTYPES["bfloat16"]:
        return "bfloat16"
    return dt.name


def _is_float(dt: np.dtype) -> bool:
    return dtype_name(dt) in _FLOAT_NAMES


def _is_int(dt: np.dtype) -> bool:
    return np.dtype(dt).kind in "iu"


def _as_numeric(op: OpDef, inp: Input, value: Any) -> tuple[np.ndarray, bool]:
    """The value as an array, and whether it came from Python (lists, scalars)."""
    if isinstance(value, np.ndarray):
        return value, False
    if isinstance(value, np.generic):
        return np.asarray(value), False
    if hasattr(value, "__array__") and not isinstance(value, (list, tuple)):
        try:
            arr = np.asarray(value)
        except Exception as e:  # e.g. a CUDA torch tensor
            raise TypeError(f"{op.name}: input '{inp.name}' could not be converted to a NumPy "
                            f"array: {e}") from None
        return arr, False
    if value is None:
        raise TypeError(f"{op.name}: input '{inp.name}' is required, got None")
    try:
        arr = np.asarray(value)
    except ValueError as e:
        raise InvalidArgumentError(
            f"{op.name}: input '{inp.name}' is not a rectangular array of numbers: {e}"
        ) from None
    if arr.dtype.kind not in "biuf" or arr.dtype.kind == "b":
        raise TypeError(
            f"{op.name}: input '{inp.name}' must be numeric, got {type(value).__name__} "
            f"converting to dtype {arr.dtype}"
        )
    return arr, True


def _convert(op: OpDef, inp: Input, arr: np.ndarray, target: str, from_python: bool) -> np.ndarray:
    dt = DTYPES[target]
    if arr.dtype == dt:
        return arr
    src = dtype_name(arr.dtype)
    if from_python:
        if target in _INT_NAMES and arr.dtype.kind == "f" and arr.size:  # ([] is float64)
            raise TypeError(f"{op.name}: input '{inp.name}' expects {target}, "
                            "got non-integer Python numbers")
    elif not ((_is_float(arr.dtype) and target in _FLOAT_NAMES)
              or (_is_int(arr.dtype) and target in _INT_NAMES)):
        raise TypeError(
            f"{op.name}: input '{inp.name}' must have dtype {target}, got {src}"
        )
    check_alloc(op.name, f"input '{inp.name}' converted to {target}", arr.shape, dt)
    if target in _INT_NAMES:
        info = np.iinfo(dt)
        if arr.size and (arr.min() < info.min or arr.max() > info.max):
            raise InvalidArgumentError(
                f"{op.name}: input '{inp.name}' has values outside the range of {target}"
            )
    return arr.astype(dt)


def bind_inputs(op: OpDef, values: dict[str, Any]) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Convert inputs to arrays and infer the type attrs, as TF's Python binding does.

    Inputs with a fixed dtype are cast to it from another float (or integer) dtype, as TF
    converts a float64 array for a float32 input. Inputs that share a type attr must
    agree: the first NumPy array fixes it; Python lists and scalars follow it (floats
    default to float32, ints to int32 where allowed).
    """
    raw: dict[str, tuple[np.ndarray, bool]] = {
        inp.name: _as_numeric(op, inp, values[inp.name]) for inp in op.inputs
    }
    types: dict[str, str] = {}
    for inp in op.inputs:  # arrays decide first
        arr, from_py = raw[inp.name]
        if inp.type_attr is None or from_py:
            continue
        name = dtype_name(arr.dtype)
        ta = op.type_attr(inp.type_attr)
        if name not in ta.allowed:
            if name in _NO_CPU_KERNEL.get((op.name, ta.name), ()):
                attrs = ", ".join(f"{k}=DT_{tf_dtype_name(v).upper()}"
                                  for k, v in {**types, ta.name: name}.items())
                raise NotFoundError(
                    f"{op.name}: Could not find device for node: {{{{node {op.name}}}}} = "
                    f"{op.name}[{attrs}] (TF's op definition allows {ta.name}={name}, but TF "
                    f"2.21 has no CPU kernel for it: {ta.name} must be one of "
                    f"{', '.join(ta.allowed)}; input '{inp.name}')")
            raise InvalidDtypeError(
                f"{op.name}: Value for attr '{ta.name}' of {tf_dtype_name(name)} is not in "
                f"the list of allowed values: {', '.join(map(tf_dtype_name, ta.allowed))} "
                f"(input '{inp.name}' has dtype {name}, expected one of {', '.join(ta.allowed)})"
            )
        prev = types.setdefault(inp.type_attr, name)
        if prev != name:
            first = next(i.name for i in op.inputs if i.type_attr == inp.type_attr)
            raise TypeError(
                f"{op.name}: input '{inp.name}' has dtype {name} but '{first}' has {prev}; "
                f"inputs of type {inp.type_attr} must share one dtype"
            )
    for inp in op.inputs:
        if inp.type_attr is None or inp.type_attr in types:
            continue
        arr, _ = raw[inp.name]
        ta = op.type_attr(inp.type_attr)
        want = "int32" if arr.dtype.kind in "iu" and "int32" in ta.allowed else "float32"
        if want not in ta.allowed:
            want = ta.allowed[0]
        types[inp.type_attr] = want
    out: dict[str, np.ndarray] = {}
    for inp in op.inputs:
        arr, from_py = raw[inp.name]
        target = inp.dtype if inp.dtype is not None else types[inp.type_attr]  # type: ignore[index]
        out[inp.name] = _convert(op, inp, arr, target, from_py)
    return out, types


def _attr_error(op: OpDef, a: Attr, expected: str, value: Any) -> TypeError:
    # TF's Python binding's words, then what tfgrad wants
    kind = a.type[5:-1] if a.type.startswith("list(") else a.type
    if expected.startswith("a list"):  # (else an element of a list, or a scalar attr)
        words = f"Expected list for '{a.name}' argument to '{op.snake_name}' Op, not {value!r}."
    else:
        words = f"Expected {kind} for argument '{a.name}' not {value!r}."
    return TypeError(f"{op.name}: {words} (attr '{a.name}' must be {expected}, got "
                     f"{type(value).__name__})")


def _check_scalar(op: OpDef, a: Attr, kind: str, v: Any) -> Any:
    if kind == "int":
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
            raise _attr_error(op, a, "an int", v)
        v = int(v)
        if not -(2**63) <= v <= _INT64_MAX:
            raise InvalidArgumentError(f"{op.name}: attr '{a.name}' = {v} does not fit in int64")
        return v
    if kind == "float":
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer,
                                                                 np.floating)):
            raise _attr_error(op, a, "a float", v)
        # TF stores float attrs as float32.
        with np.errstate(over="ignore"):
            return float(np.float32(v))
    if kind == "bool":
        if not isinstance(v, (bool, np.bool_)):
            raise _attr_error(op, a, "a bool", v)
        return bool(v)
    if kind == "string":
        if isinstance(v, bytes):
            v = v.decode("utf-8", "replace")
        if not isinstance(v, str):
            raise _attr_error(op, a, "a string", v)
        return v
    raise AssertionError(kind)


def check_attr(op: OpDef, a: Attr, value: Any) -> Any:
    """Check one attr against its definition and return it normalised."""
    if a.type.startswith("list("):
        kind = a.type[5:-1]
        if isinstance(value, np.ndarray):
            value = value.tolist()
        if not isinstance(value, (list, tuple)):
            raise _attr_error(op, a, f"a list of {kind}s", value)
        if (kind == "int" and all(type(x) is int for x in value)
                and (not value or -(2**63) <= min(value) and max(value) <= _INT64_MAX)):
            v = tuple(value)  # (the common case, without a call per value)
        else:
            v = tuple(_check_scalar(op, a, kind, x) for x in value)
        if a.min_length is not None and len(v) < a.min_length:
            raise InvalidArgumentError(
                f"{op.name}: Length for attr '{a.name}' of {len(v)} must be at least minimum "
                f"{a.min_length} (got {list(v)})"
            )
        return v
    v = _check_scalar(op, a, a.type, value)
    if a.allowed is not None and v not in a.allowed:
        quoted = ", ".join(f'"{x}"' for x in a.allowed)
        raise InvalidArgumentError(
            f"{op.name}: Value for attr '{a.name}' of \"{v}\" is not in the list of allowed "
            f"values: {quoted}"
        )
    if (a.minimum is not None and v < a.minimum) or (a.maximum is not None and v > a.maximum):
        lo = a.minimum if a.minimum is not None else "-inf"
        hi = a.maximum if a.maximum is not None else "inf"
        raise InvalidArgumentError(
            f"{op.name}: {a.name} must be between {lo} and {hi}, inclusive, got {v}"
        )
    return v


def bind(op: OpDef, arguments: dict[str, Any]) -> dict[str, Any]:
    """Validate every input and attr of ``op``; return keyword arguments for its kernel."""
    attrs = {}
    for a in op.attrs:
        value = arguments.get(a.name, a.default)
        if value is None and a.default is not REQUIRED:
            value = a.default  # as TF's generated wrappers: None means the default
        if value is REQUIRED:
            raise TypeError(f"{op.name}: missing required attr '{a.name}'")
        attrs[a.name] = check_attr(op, a, value)
    arrays, _ = bind_inputs(op, arguments)
    for name, arr in arrays.items():
        # The families copy non-contiguous inputs before their kernels run; a broadcast
        # view (stride 0) can be far larger than the memory behind it.
        if not arr.flags.c_contiguous:
            check_alloc(op.name, f"a contiguous copy of input '{name}'", arr.shape, arr.dtype)
    return {**arrays, **attrs}


# --------------------------------------------------------------------------------------
# Helpers for the op families' own checks
# --------------------------------------------------------------------------------------
# (The families check with ``if not cond: raise InvalidArgumentError(f"...")``, not a
# helper taking the message: that would format every message on every call, which cost
# the depthwise ops ~15 us a call.)
def shape_str(shape: Any) -> str:
    return "[" + ",".join(str(int(d)) for d in shape) + "]"


_ALWAYS_ALLOWED = 64 << 20
"""Allocations up to this size skip the available-memory check (TFGRAD_MAX_BYTES unset)."""

_ENV = getattr(os.environ, "_data", None)
_ENV_KEY = os.environ.encodekey("TFGRAD_MAX_BYTES") if _ENV is not None else None  # type: ignore[attr-defined]


def max_bytes_set() -> bool:
    """Whether TFGRAD_MAX_BYTES is set (not empty). (os.environ.get costs ~0.7 us; its
    underlying dict, which os.environ keeps current, a tenth of that.)"""
    if _ENV is not None:
        return bool(_ENV.get(_ENV_KEY))
    return bool(os.environ.get("TFGRAD_MAX_BYTES"))


_SLOW_CHECKS = 0


def slow_checks() -> int:
    """How many allocation checks have read the machine's state (available memory or
    TFGRAD_MAX_BYTES) so far: a call whose checks did is not cached by its signature."""
    return _SLOW_CHECKS


def memory_limit_bytes() -> int:
    """Most bytes one op may allocate for its outputs.

    ``TFGRAD_MAX_BYTES`` sets it; by default it is the machine's available memory.
    """
    env = os.environ.get("TFGRAD_MAX_BYTES")
    if env:
        return int(env)
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 2**40


def check_float32_copies(op_name: str, arrays: dict[str, np.ndarray]) -> None:
    """check_alloc for the float32 working copies the kernels make of float16 / bfloat16
    inputs (they compute in float32 and round to T). Non-contiguous inputs' copies are
    checked by ``bind``."""
    for name, a in arrays.items():
        if a.dtype not in (np.float32, np.float64):
            check_alloc(op_name, f"a float32 working copy of {name}", a.shape, np.float32)


def check_alloc(op_name: str, what: str, shape: Any, dtype: Any) -> tuple[int, ...]:
    """Check that an array of ``shape`` can be allocated; return the shape as ints.

    Sizes are multiplied in Python integers, so products that overflow int64 are caught
    rather than wrapped.
    """
    dims = tuple(int(d) for d in shape)
    n = math.prod(dims)
    if (n > 0 and min(dims, default=1) > 0 and n * np.dtype(dtype).itemsize <= _ALWAYS_ALLOWED
            and not max_bytes_set()):
        return dims  # (the common case, first: every op checks its outputs)
    if any(d < 0 for d in dims):
        raise InvalidArgumentError(f"{op_name}: {what} would have a negative dimension: "
                                   f"{shape_str(dims)}")
    if n > _INT64_MAX:
        raise InvalidArgumentError(f"{op_name}: {overflow_words(dims)} ({what} of shape "
                                   f"{shape_str(dims)} has more elements than fit in int64)")
    nbytes = n * np.dtype(dtype).itemsize
    # NumPy refuses shapes whose nonzero dimensions overflow, even with a zero among them
    if math.prod(d for d in dims if d) * np.dtype(dtype).itemsize > _INT64_MAX:
        if n:  # TF tries to allocate it, and fails (ResourceExhausted)
            raise ResourceLimitError(f"{op_name}: {_oom_words(dims, dtype)} ({what} would "
                                     f"need {nbytes} bytes, more than fit in int64)")
        raise InvalidArgumentError(f"{op_name}: {what} of shape {shape_str(dims)} would need "
                                   "more bytes than fit in int64")
    if nbytes <= _ALWAYS_ALLOWED and not max_bytes_set():
        return dims  # (reading /proc/meminfo costs more than a small op)
    global _SLOW_CHECKS
    _SLOW_CHECKS += 1
    limit = memory_limit_bytes()
    if nbytes > limit:
        raise ResourceLimitError(
            f"{op_name}: {_oom_words(dims, dtype)} ({what} would need {nbytes} bytes, more "
            f"than the {limit} bytes allowed: available memory, or TFGRAD_MAX_BYTES)"
        )
    return dims


def _oom_words(dims: tuple[int, ...], dtype: Any) -> str:
    """TF's message when an allocation fails (its ResourceExhaustedError)."""
    name = tf_dtype_name(dtype_name(np.dtype(dtype)))
    return f"OOM when allocating tensor with shape{shape_str(dims)} and type {name}"


def overflow_words(dims: tuple[int, ...]) -> str:
    """TF's message for a shape whose element count overflows int64 (TensorShape's
    running product, dimension by dimension)."""
    n = 1
    for d in dims:
        if n * d > _INT64_MAX:
            return f"Encountered overflow when multiplying {n} with {d}, result: -1"
        n *= d
    return "Encountered overflow"
