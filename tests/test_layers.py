"""The layers import each other one way only (read from the source with ``ast``).

- ``tfgrad._tf`` (TF's arithmetic) and ``tfgrad._compile`` (the compile and threading
  policy) sit below everything: they import no ``ops``, ``dispatch`` or ``kernels``;
- ``tfgrad.kernels`` hold compiled functions: they import no ``ops`` or ``dispatch``;
- ``tfgrad.dispatch`` (layout, casts, plans, threads) imports no ``ops``;
- ``tfgrad.ops`` (semantics, checks, the NumPy references) import no kernel: they reach
  the kernels through ``dispatch``, imported inside the functions that run the kernels,
  so that loading an op module (the NumPy references, the adapters' shape checks) loads
  no Numba.

``ALLOWED`` names the crossings that remain, each one an edge ``(importer, imported)``.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
PKG = SRC / "tfgrad"

ALLOWED: set[tuple[str, str]] = set()


def _module(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(name: str) -> bool:
    p = SRC.joinpath(*name.split("."))
    return p.with_suffix(".py").exists() or (p / "__init__.py").exists()


def imports(path: Path) -> list[tuple[str, bool]]:
    """Every tfgrad module ``path`` imports, and whether at module level (not inside a
    function). ``from a import b`` counts as ``a.b`` when that is a module, else ``a``."""
    name = _module(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text(), str(path))
    found: list[tuple[str, bool]] = []

    def visit(node: ast.AST, top: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = top and not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                   ast.Lambda))
            if isinstance(child, ast.Import):
                found.extend((a.name, top) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    up = package.split(".")[: len(package.split(".")) - child.level + 1]
                    base = ".".join(up + ([base] if base else []))
                for a in child.names:
                    sub = f"{base}.{a.name}"
                    found.append((sub if _is_module(sub) else base, top))
            visit(child, inner)

    visit(tree, True)
    return [(m, top) for m, top in found if m == "tfgrad" or m.startswith("tfgrad.")]


def _edges() -> list[tuple[str, str, bool]]:
    return [(_module(p), m, top) for p in sorted(PKG.rglob("*.py")) for m, top in imports(p)]


def _under(name: str, *packages: str) -> bool:
    return any(name == p or name.startswith(p + ".") for p in packages)


def _violations(importers: tuple[str, ...], forbidden: tuple[str, ...],
                module_level_only: bool = False) -> list[str]:
    return sorted(f"{a} imports {b}" for a, b, top in _edges()
                  if _under(a, *importers) and _under(b, *forbidden)
                  and (top or not module_level_only) and (a, b) not in ALLOWED)


def test_the_parser_sees_the_imports():
    """(The checks below would pass vacuously if the parser missed imports.)"""
    edges = {(a, b) for a, b, _ in _edges()}
    assert ("tfgrad.dispatch.fake_quant", "tfgrad.kernels.fake_quant") in edges
    assert ("tfgrad.ops.fake_quant", "tfgrad.dispatch.fake_quant") in edges
    assert ("tfgrad.kernels.batch_norm", "tfgrad._tf.rsqrt") in edges
    assert ALLOWED <= edges, "an allowance that is no longer needed: remove it"


def test_tf_arithmetic_and_the_policy_import_no_layer_above():
    assert _violations(("tfgrad._tf", "tfgrad._compile", "tfgrad._config"),
                       ("tfgrad.ops", "tfgrad.dispatch", "tfgrad.kernels")) == []


def test_kernels_import_no_ops_and_no_dispatch():
    assert _violations(("tfgrad.kernels",), ("tfgrad.ops", "tfgrad.dispatch")) == []


def test_dispatch_imports_no_ops():
    assert _violations(("tfgrad.dispatch",), ("tfgrad.ops",)) == []


def test_ops_reach_the_kernels_only_through_dispatch():
    assert _violations(("tfgrad.ops",), ("tfgrad.kernels",)) == []
    assert _violations(("tfgrad.ops",), ("tfgrad.dispatch",), module_level_only=True) == []


def _runs_clean(code: str) -> None:
    """``code`` in a fresh interpreter (nothing imported yet) exits 0."""
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=str(SRC)))
    assert p.returncode == 0, p.stderr[-2000:]


def test_op_modules_load_without_numba():
    _runs_clean("import sys, tfgrad._shapes\n"
                "from tfgrad.ops import batch_norm, depthwise_conv, fake_quant, fractional_pool\n"
                "assert 'numba' not in sys.modules, 'numba imported'")


def test_the_qat_plan_is_framework_neutral():
    """tfgrad.qat (the plan, the files, tfmot's rewrite) is data: no framework adapter and no
    op layer; the adapters' builders read it, not the other way round."""
    assert _violations(("tfgrad.qat",), ("tfgrad.torch", "tfgrad.jax", "tfgrad.ops",
                                         "tfgrad.dispatch", "tfgrad.kernels")) == []
    _runs_clean("import sys, tfgrad.qat\n"
                "bad = {'torch', 'jax', 'numba', 'tensorflow'} & set(sys.modules)\n"
                "assert not bad, bad")
