"""An op's output shapes and dtypes from its inputs' shapes and dtypes and its attrs.

The framework adapters need them without running the op: PyTorch's fake (meta) tensors
under ``torch.compile`` / ``torch.export``, JAX's abstract values under ``jit``, and the
portable implementations, which must reject what the NumPy ops reject before computing.

Dtypes follow from the op table (an output's fixed dtype or its type attr); shapes from
each output's rule in the table (``Output.shape``) or, where the rule is empty, from the
family's ``check`` (``tfgrad.ops.<family>.check``), which also runs every check of the
arguments that needs no input values (shape inputs excepted), exactly as the op does.
Array inputs may be :func:`placeholder` arrays: any shape, no memory.
"""

from __future__ import annotations

import importlib
from typing import Any

import numpy as np

from . import _validate
from ._opdefs import OpDef, get_op_def

Spec = tuple[tuple[int, ...], str]
"""(shape, dtype name) of one output."""


def placeholder(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """A read-only array of any shape backed by one element (strides 0)."""
    return np.broadcast_to(np.zeros((), _validate.DTYPES.get(dtype, dtype)), tuple(shape))


def family_module(op: OpDef) -> Any:
    return importlib.import_module(f"{__package__}.ops.{op.family}")


def output_dtypes(op: OpDef, input_dtypes: dict[str, str]) -> tuple[str, ...]:
    """Each output's dtype name, given the dtype names of the op's inputs."""
    types = {i.type_attr: input_dtypes[i.name] for i in op.inputs if i.type_attr}
    return tuple(o.dtype or types[o.type_attr] for o in op.outputs)  # type: ignore[index]


def infer(op_name: str, arguments: dict[str, Any]) -> tuple[Spec, ...]:
    """Check ``arguments`` (as ``raw_ops.<op_name>`` takes them, every attr given) as far
    as shapes, dtypes and attrs allow, and return each output's (shape, dtype name).

    Raises what the op raises for such arguments (``InvalidArgumentError``, ``TypeError``).
    """
    return bind_and_infer(op_name, arguments)[1]


def bind_and_infer(op_name: str, arguments: dict[str, Any]
                   ) -> tuple[dict[str, Any], tuple[Spec, ...]]:
    """:func:`infer`, also returning the validated arguments (attrs normalised as the op
    gets them: float attrs rounded to float32, lists as tuples)."""
    op = get_op_def(op_name)
    kwargs = _validate.bind(op, arguments)
    computed = family_module(op).check(op.name, kwargs)
    dtypes = output_dtypes(op, {i.name: _validate.dtype_name(kwargs[i.name].dtype)
                                for i in op.inputs})
    shapes = []
    for o in op.outputs:
        rule = o.shape
        if rule.startswith("like "):
            shapes.append(tuple(kwargs[rule[5:]].shape))
        elif rule.startswith("values of "):
            shapes.append(tuple(int(v) for v in kwargs[rule[10:]].reshape(-1)))
        elif rule == "()":
            shapes.append(())
        elif rule == "(0,)":
            shapes.append((0,))
        else:
            shapes.append(tuple(computed[o.name]))
    return kwargs, tuple(zip(shapes, dtypes))
