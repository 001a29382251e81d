"""The exact implementation: a ``jax.pure_callback`` into tfgrad's CPU kernels.

The callback runs ``tfgrad.raw_ops.<Op>`` on the host, so the values are TF 2.21's bit for
bit. Under ``jax.vmap`` it receives the stacked operands (``vmap_method="expand_dims"``:
leading batch axes, of size 1 on unbatched operands) and runs the op once per element.

JAX checks the callback's results on XLA's threads, canonicalizing them under the
``jax_enable_x64`` in force *there*: with 64-bit types, set the flag globally (the
``jax.enable_x64()`` context manager is thread-local).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from .. import raw_ops
from .._opdefs import get_op_def


def function(op_name: str, names: Sequence[str], static: dict[str, Any],
             attrs: dict[str, Any], specs: Callable[[Sequence[Any]], Sequence[Any]]
             ) -> Callable[..., list[jax.Array]]:
    """A function of the op's operands (array inputs, then traced attrs such as seeds, in
    ``names`` order) that runs the op through a callback; ``specs(operands)`` gives the
    outputs' ``jax.ShapeDtypeStruct``\\s."""
    fn = getattr(raw_ops, op_name)
    op_inputs = {i.name for i in get_op_def(op_name).inputs}

    def run_one(arrays: Sequence[np.ndarray], dtypes: Sequence[np.dtype]
                ) -> tuple[np.ndarray, ...]:
        kw: dict[str, Any] = {**static, **attrs}
        for name, a in zip(names, arrays):
            # traced attrs (fractional pooling's seeds) are ints again here
            kw[name] = a if name in op_inputs else int(a)
        out = fn(**kw)
        outs = tuple(out) if isinstance(out, tuple) else (out,)
        return tuple(np.asarray(o, dtype=d) for o, d in zip(outs, dtypes))

    def apply(*operands: jax.Array) -> list[jax.Array]:
        result = tuple(specs(operands))
        dtypes = [np.dtype(r.dtype) for r in result]
        shapes = [tuple(r.shape) for r in result]
        base_ndim = [np.ndim(o) for o in operands]

        def callback(*arrays: np.ndarray) -> tuple[np.ndarray, ...]:
            arrays = tuple(np.asarray(a) for a in arrays)
            extra = arrays[0].ndim - base_ndim[0]
            if extra == 0:
                return run_one(arrays, dtypes)
            lead = np.broadcast_shapes(*(a.shape[:extra] for a in arrays))
            if 0 in lead:
                return tuple(np.zeros(lead + s, d) for s, d in zip(shapes, dtypes))
            per = [run_one([a[tuple(i if n > 1 else 0 for i, n in zip(idx, a.shape))]
                            for a in arrays], dtypes)
                   for idx in np.ndindex(*lead)]
            return tuple(np.stack([p[k] for p in per]).reshape(lead + s)
                         for k, s in enumerate(shapes))

        callback._tfgrad_host = True  # type: ignore[attr-defined]  # (see _lean_lowering)
        return list(jax.pure_callback(callback, result, *operands,
                                      vmap_method="expand_dims"))

    return apply


def _install_lean_lowering() -> bool:
    """Lower tfgrad's callbacks without what ``jax.pure_callback``'s implementation adds
    around them on the host: a ``device_put`` of every operand onto the CPU device (the
    callback then reads the arrays back) and a default-device context, ~40-60 us a call,
    more than a small op's kernel. XLA hands the host callback NumPy arrays; tfgrad's ops
    take those as they are. Every other ``pure_callback`` keeps JAX's own lowering; on a
    JAX without these internals, tfgrad's do too."""
    try:
        from jax._src import callback as cb
        from jax._src.interpreters import mlir

        original = mlir._lowerings[cb.pure_callback_p].rule
        emit, op_sharding = cb.emit_python_callback, cb._callback_op_sharding
    except (ImportError, AttributeError, KeyError):
        return False

    def lowering(ctx: Any, *args: Any, callback: Any, sharding: Any, **params: Any) -> Any:
        if not getattr(getattr(callback, "callback_func", None), "_tfgrad_host", False):
            return original(ctx, *args, callback=callback, sharding=sharding, **params)

        def host(*arrays: np.ndarray) -> tuple[np.ndarray, ...]:
            return tuple(callback(*arrays))

        result, _, _ = emit(
            ctx, host, None, list(args), ctx.avals_in, ctx.avals_out, has_side_effect=False,
            returns_token=False,
            sharding=op_sharding(ctx.module_context.axis_context, sharding, ctx.avals_out))
        return result

    mlir.register_lowering(cb.pure_callback_p, lowering, cacheable=False)
    return True


LEAN_LOWERING = _install_lean_lowering()
"""Whether tfgrad's callbacks are lowered without JAX's host-side device_put."""
