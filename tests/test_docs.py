"""The docs state what the code does: the distance tables of docs/adapters.md are the
implementations' own BOUNDS (the numbers their tests assert)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_adapters_bounds_table_is_current():
    pytest.importorskip("torch")
    pytest.importorskip("jax")
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import bounds_table
    finally:
        sys.path.remove(str(ROOT / "tools"))
    assert bounds_table.current_doc_table() == bounds_table.table(), (
        "docs/adapters.md's distance table is stale: run python tools/bounds_table.py --write")
