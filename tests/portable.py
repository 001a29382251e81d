"""Running the portable (torch) and native (JAX) implementations of one op family on NumPy
arrays, as the adapters hand them their arguments: shared by tests/test_portable_*.py.

``runner("torch" | "jax", family)`` calls ``tfgrad.torch._portable.<family>.<Op>`` or a
jitted ``tfgrad.jax._native.<family>.<Op>`` (one compilation per op, attrs and shapes) and
returns every output as a NumPy array; ``split`` gives the arguments from a ``raw_ops``
call's keywords, validated as the adapters validate them; ``run_case`` runs a case over
seeds and collects a family's checks' complaints (``bit_identical``: the outputs declared
exact).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
from collections.abc import Callable, Iterator
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from tfgrad import _distance, _validate, raw_ops
from tfgrad._opdefs import get_op_def


def split(op: str, kwargs: dict[str, Any]) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Array inputs, and the rest (shape inputs as int tuples, normalised attrs), as the
    adapters hand them over after tfgrad's validation."""
    d = get_op_def(op)
    bound = _validate.bind(d, kwargs)
    arrays = {i.name: bound[i.name] for i in d.inputs if not i.is_shape}
    static = {i.name: tuple(int(v) for v in bound[i.name]) for i in d.inputs if i.is_shape}
    static.update({a.name: bound[a.name] for a in d.attrs})
    return arrays, static


def exact(op: str, kwargs: dict[str, Any]) -> tuple[np.ndarray, ...]:
    """The exact kernels' outputs (TF's bits)."""
    out = getattr(raw_ops, op)(**kwargs)
    return tuple(np.asarray(o) for o in (out if isinstance(out, tuple) else (out,)))


Check = Callable[[dict[str, Any], dict[str, np.ndarray], dict[str, Any], tuple, tuple],
                 list[str]]
"""A family's check of one call: (raw_ops keywords, arrays, attrs, the implementation's
outputs, the exact ones) -> what is wrong."""


def run_case(impl: Any, case: Any, seeds: tuple, check: Check, *,
             split: Callable[..., tuple] = split, exact: Callable[..., tuple] = exact,
             change: dict[str, Any] | None = None) -> list[str]:
    """What ``check`` finds wrong with the implementation on ``case`` over ``seeds`` (None:
    the case's own inputs); ``change`` replaces attrs in the implementation's call only
    (a mutant's arguments)."""
    bad = []
    for seed in seeds:
        kwargs = case.kwargs(seed)
        arrays, attrs = split(case.op, kwargs)
        got = impl(case.op, arrays, {**attrs, **change} if change else attrs)
        bad += [f"seed {seed}: {b}" for b in check(kwargs, arrays, attrs, got,
                                                   exact(case.op, kwargs))]
    return bad


def bit_identical(impl: Any, op: str, got: tuple, want: tuple,
                  inexact: Callable[[str, np.ndarray, np.ndarray, Any], list[str]] | None = None
                  ) -> list[str]:
    """Every output whose declared bound (the module's BOUNDS) is 0 must be bit-identical;
    the others go to ``inexact`` (name, output, exact output, bound), and without it their
    bound is a complaint."""
    bad = []
    for name, a, e in zip([o.name for o in get_op_def(op).outputs], got, want, strict=True):
        bound = impl.mod.BOUNDS[op][name][str(e.dtype)]
        if bound == 0:
            if not _distance.bit_identical(a, e):
                bad.append(f"{name} differs")
        elif inexact is None:
            bad.append(f"{name}: bound {bound} declared, but outputs here are exact")
        else:
            bad += inexact(name, a, e, bound)
    return bad


def _outputs(out: Any) -> tuple[Any, ...]:
    return out if isinstance(out, tuple) else (out,)


class TorchRunner:
    name = "torch"

    def __init__(self, family: str) -> None:
        self.torch = pytest.importorskip("torch")
        self.mod = importlib.import_module(f"tfgrad.torch._portable.{family}")

    def tensor(self, a: np.ndarray) -> Any:
        a = np.array(a)
        if a.dtype == ml_dtypes.bfloat16:  # (torch.from_numpy has no bfloat16: share bits)
            return self.torch.from_numpy(a.view(np.int16)).view(self.torch.bfloat16)
        return self.torch.from_numpy(a)

    def array(self, t: Any) -> np.ndarray:
        t = t.detach().cpu()
        if t.dtype == self.torch.bfloat16:
            return t.view(self.torch.int16).numpy().view(ml_dtypes.bfloat16)
        return t.numpy()

    def __call__(self, op: str, arrays: dict[str, np.ndarray], static: dict[str, Any]
                 ) -> tuple[np.ndarray, ...]:
        out = getattr(self.mod, op)(**{k: self.tensor(v) for k, v in arrays.items()}, **static)
        return tuple(self.array(o) for o in _outputs(out))

    def fresh(self) -> None:
        pass


class JaxRunner:
    name = "jax"

    def __init__(self, family: str) -> None:
        self.jax = pytest.importorskip("jax")
        self.mod = importlib.import_module(f"tfgrad.jax._native.{family}")
        self.jitted: dict[tuple, Any] = {}

    def __call__(self, op: str, arrays: dict[str, np.ndarray], static: dict[str, Any]
                 ) -> tuple[np.ndarray, ...]:
        key = (op, tuple(sorted(static.items())))
        wide = any(np.asarray(a).dtype.itemsize == 8 for a in arrays.values())
        with self.jax.enable_x64(True) if wide else contextlib.nullcontext():
            if key not in self.jitted:
                self.jitted[key] = self.jax.jit(functools.partial(getattr(self.mod, op),
                                                                  **static))
            return tuple(np.asarray(o) for o in _outputs(self.jitted[key](**arrays)))

    def fresh(self) -> None:
        """Forget the compiled functions (after the module changes)."""
        self.jitted.clear()


_RUNNERS: dict[tuple[str, str], Any] = {}


def runner(framework: str, family: str) -> Any:
    if (framework, family) not in _RUNNERS:
        cls = TorchRunner if framework == "torch" else JaxRunner
        _RUNNERS[framework, family] = cls(family)
    return _RUNNERS[framework, family]


@contextlib.contextmanager
def patched(impl: Any, **mutant: Any) -> Iterator[None]:
    """The implementation's module with some of its helpers replaced (mutation tests)."""
    saved = {k: getattr(impl.mod, k) for k in mutant}
    try:
        for k, v in mutant.items():
            setattr(impl.mod, k, v)
        impl.fresh()
        yield
    finally:
        for k, v in saved.items():
            setattr(impl.mod, k, v)
        impl.fresh()
