"""Every op in JAX, by TF name, with ``tf.raw_ops``' keyword arguments.

``tfgrad.jax.raw_ops.DepthwiseConv2dNativeBackpropInput(input_sizes=..., filter=...,
out_backprop=..., strides=..., padding=...)`` is ``tfgrad.raw_ops``' op over JAX arrays:
jittable, differentiable as TF differentiates it (the gradient ops are ops here too),
batched by ``jax.vmap``. Shape inputs (``input_sizes``, ``filter_sizes``,
``orig_input_tensor_shape``) must be static (lists of ints); fractional pooling's ``seed``
and ``seed2`` may be integer arrays (traced). Multi-output ops return the namedtuple of
``tfgrad.raw_ops.<Op>.Output``.

Argument errors raise when the function is traced: ``TypeError`` for a dtype the op does
not take (nothing is cast silently), ``tfgrad.InvalidArgumentError`` for shapes and attrs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .. import _shapes
from .. import raw_ops as _np_raw_ops
from .._opdefs import OPS, Input, OpDef, get_op_def
from .._validate import DTYPES, dtype_name
from . import _choice, _primitives

__all__ = sorted(OPS)

_TRACED_ATTRS = ("seed", "seed2")


def _canonical(name: str) -> np.dtype:
    return np.dtype(jax.dtypes.canonicalize_dtype(DTYPES[name]))


def as_input(v: Any, op: OpDef, inp: Input) -> jax.Array:
    """A JAX array of a dtype the input takes; Python numbers take its (first) dtype."""
    allowed = (inp.dtype,) if inp.dtype else op.type_attr(inp.type_attr).allowed
    if isinstance(v, (int, float, list, tuple)):
        want = allowed[0] if inp.dtype or "float32" not in allowed else "float32"
        return jnp.asarray(np.asarray(v, dtype=DTYPES[want]))
    v = jnp.asarray(v)
    # Without jax_enable_x64, JAX holds int64 as int32 (the pooling sequences)
    if np.dtype(v.dtype) not in {_canonical(a) for a in allowed}:
        raise TypeError(f"tfgrad.jax ({op.name}): '{inp.name}' has dtype {v.dtype}, but the "
                        f"op takes {', '.join(allowed)} (as TF's CPU kernel); convert it "
                        "explicitly with .astype(...)")
    return v


def _shape_input(v: Any, op: OpDef, inp: Input) -> tuple[int, ...]:
    if isinstance(v, jax.core.Tracer):
        raise TypeError(f"tfgrad.jax ({op.name}): '{inp.name}' is a shape and must be static "
                        "(a list of ints, or a concrete array), not a traced value")
    return tuple(int(d) for d in np.asarray(v).reshape(-1))


def _traced_attr(v: Any, op: OpDef, name: str) -> jax.Array:
    v = jnp.asarray(v)
    if v.ndim != 0 or not jnp.issubdtype(v.dtype, jnp.integer):
        raise TypeError(f"tfgrad.jax ({op.name}): '{name}' must be an int or an integer "
                        f"scalar array, got {v.dtype} of shape {v.shape}")
    return v


def call(op_name: str, arguments: dict[str, Any]) -> tuple[jax.Array, ...]:
    """Run op ``op_name`` on ``arguments`` (``tf.raw_ops``' keywords); its outputs."""
    op = get_op_def(op_name)
    known = {i.name for i in op.inputs} | {a.name for a in op.attrs} | {"name"}
    unknown = sorted(set(arguments) - known)
    if unknown:
        raise TypeError(f"tfgrad.jax ({op.name}): unexpected argument(s) {unknown}")
    operands: dict[str, Any] = {}
    static: dict[str, tuple[int, ...]] = {}
    for inp in op.inputs:
        if arguments.get(inp.name) is None:
            raise TypeError(f"tfgrad.jax ({op.name}): missing input '{inp.name}'")
        v = arguments[inp.name]
        if inp.is_shape:
            static[inp.name] = _shape_input(v, op, inp)
        else:
            operands[inp.name] = as_input(v, op, inp)
    attrs = {a.name: arguments[a.name] for a in op.attrs if a.name in arguments}
    traced = {}
    for name in _TRACED_ATTRS:
        v = attrs.get(name)
        if v is not None and not isinstance(v, (int, np.integer)):
            traced[name] = _traced_attr(v, op, name)
            attrs[name] = 0  # (its value is checked when the op runs)
    # The op's own checks, from shapes alone, while tracing
    placeholders = {n: _shapes.placeholder(v.shape, dtype_name(np.dtype(v.dtype)))
                    for n, v in operands.items()}
    bound, out_specs = _shapes.bind_and_infer(op.name, {**placeholders, **static, **attrs})
    attrs = {a.name: bound[a.name] for a in op.attrs if a.name not in traced}
    names, impl = tuple(operands) + tuple(traced), _choice.current()

    def apply(*values: jax.Array) -> tuple[jax.Array, ...]:
        outs = _primitives.bind(op.name, dict(zip(names, values)), static, attrs, impl, names)
        return tuple(outs.values())

    values = [operands[n] if n in operands else traced[n] for n in names]
    explicit = _explicit_axes()
    if explicit:
        out = _out_shardings(op, operands, [len(s) for s, _ in out_specs])
        return jax.sharding.auto_axes(apply, axes=explicit, out_sharding=out)(*values)
    return apply(*values)


def _explicit_axes() -> tuple[str, ...]:
    """The current mesh's Explicit axes (``jax.set_mesh`` with explicit sharding)."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return ()
    return tuple(n for n, t in zip(mesh.axis_names, mesh.axis_types)
                 if t == jax.sharding.AxisType.Explicit)


def _spec(x: jax.Array) -> tuple:
    spec = getattr(jax.typeof(x).sharding, "spec", None)
    return tuple(spec) + (None,) * (x.ndim - len(spec)) if spec is not None else (None,) * x.ndim


def _out_shardings(op: OpDef, operands: dict[str, jax.Array], ranks: list[int]) -> tuple:
    """Where the outputs live under explicit sharding: an output shaped like an input
    as that input; an output over the batch (the depthwise and pooling outputs and
    input gradients) split as its batch-leading input's batch dimension; the rest
    (filter gradients, statistics, sequences) replicated."""
    from jax.sharding import PartitionSpec as P

    batch = next((_spec(v)[0] for n, v in operands.items() if v.ndim == 4 and n != "filter"),
                 None)
    specs = []
    for o, rank in zip(op.outputs, ranks):
        if o.shape.startswith("like "):
            specs.append(P(*_spec(operands[o.shape[5:]])))
        elif rank == 4 and o.shape != "values of filter_sizes":
            specs.append(P(batch, *(None,) * 3))
        else:
            specs.append(P())
    return tuple(specs)


def _make(op: OpDef) -> Callable[..., Any]:
    output = getattr(_np_raw_ops, op.name).Output if len(op.outputs) > 1 else None

    def fn(**kwargs: Any) -> Any:
        outs = call(op.name, kwargs)
        return output(*outs) if output is not None else outs[0]

    fn.__name__ = fn.__qualname__ = op.name
    fn.__doc__ = (f"``tfgrad.raw_ops.{op.name}`` over JAX arrays (keyword arguments only); "
                  f"{op.summary}")
    return fn


for _op in OPS.values():
    globals()[_op.name] = _make(_op)
del _op
