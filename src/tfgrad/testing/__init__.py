"""The family registry: everything that exercises an op family, shipped with the package
so that ``tfgrad bench``, ``conformance`` and ``warmup`` need no source checkout.

The families are those of the op table (:data:`tfgrad._opdefs.FAMILIES`); nothing else
lists them. Family ``f`` has the module ``tfgrad.testing.cases.f``, which defines

- ``CASES`` (list of :class:`~tfgrad.testing.cases.Case`): the op cases (fixtures, live
  TF, the generic tests, ``tfgrad conformance``);
- ``ERROR_CASES`` (list of :class:`~tfgrad.testing.cases.ErrorCase`): malformed calls;
- ``BENCHES`` (list of :class:`~tfgrad.testing.harness.Bench`): the benchmark shapes
  (``tfgrad bench``, ``benchmarks/run.py``);
- ``WARMUP`` (list of :class:`~tfgrad.testing.cases.Warmup`, optional): inputs that
  ``tfgrad warmup`` runs besides every case and every benchmark shape;
- ``processor_dependent(case, kwargs) -> set[str]`` (optional): the outputs of a case
  whose bits depend on the processor (the fixtures keep them per processor, and where
  none was recorded on this one the fixture tests compare them with TF live).
- ``tf_threads_dependent(case, kwargs) -> set[str]`` (optional): the outputs of a case
  whose bits depend on TF's intra-op thread count (the fixtures hold them for the count
  they were recorded with; on another the fixture tests compare them with TF live).
- ``LARGE`` (op name -> function returning keyword arguments): one larger input per op,
  big enough for the kernels' threads and reductions to split work (the determinism
  tests run it on 1 and 2 threads and in several memory layouts).

Adding an op touches the op table, its ``ops`` and ``kernels`` modules and its family's
module here. ``oracle`` (TensorFlow as the reference) and ``harness`` (benchmark timing)
import TensorFlow and PyTorch only when asked to run them.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

from .._opdefs import FAMILIES as _OP_FAMILIES

FAMILIES: tuple[str, ...] = tuple(_OP_FAMILIES)
"""Every op family, in the op table's order."""


def family(name: str) -> ModuleType:
    """The module ``tfgrad.testing.cases.<name>``."""
    if name not in FAMILIES:
        raise KeyError(f"no op family {name!r}; the families are {', '.join(FAMILIES)}")
    return importlib.import_module(f"{__name__}.cases.{name}")


def load(families: list[str] | tuple[str, ...] | None = None,
         ) -> tuple[dict[str, ModuleType], list[str]]:
    """The modules of ``families`` (default: all) that import, and one line per family
    that does not: the commands report a broken family and go on with the others."""
    modules, problems = {}, []
    for name in families or FAMILIES:
        try:
            modules[name] = family(name)
        except Exception as e:
            problems.append(f"{name}: tfgrad.testing.cases.{name} failed to load: "
                            f"{type(e).__name__}: {e}")
    return modules, problems


def _declared(name: str, case: Any, kwargs: dict[str, Any]) -> set[str]:
    from .._opdefs import OPS

    declared = getattr(family(OPS[case.op].family), name, None)
    return set(declared(case, kwargs)) if declared else set()


def processor_dependent(case: Any, kwargs: dict[str, Any]) -> set[str]:
    """The outputs of ``case`` (called with ``kwargs``) whose bits depend on the processor,
    as its family module declares them (none where it declares nothing)."""
    return _declared("processor_dependent", case, kwargs)


def tf_threads_dependent(case: Any, kwargs: dict[str, Any]) -> set[str]:
    """The outputs of ``case`` whose bits depend on TF's intra-op thread count, as its
    family module declares them (none where it declares nothing)."""
    return _declared("tf_threads_dependent", case, kwargs)
