"""Helpers shared by the subcommands: optional extras, output."""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType


class CLIError(Exception):
    """A user-facing failure: printed as ``tfgrad <command>: error: <message>``, exit 2."""


def require(module: str, extra: str, purpose: str) -> ModuleType:
    """Import ``module`` or fail with the pip command that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise CLIError(
            f"{purpose} needs the '{module.split('.')[0]}' package, which is not installed "
            f"({e}). Install the extra: pip install 'tfgrad[{extra}]' "
            f"(from a checkout: pip install -e '.[{extra}]')"
        ) from None


def optional(module: str) -> ModuleType | None:
    try:
        return importlib.import_module(module)
    except ImportError:
        return None


def out_dir(path: str) -> Path:
    p = Path(path)
    p.mkdir(parents=True, exist_ok=True)
    return p


def use_agg_backend() -> None:
    """Render PNGs without a display (matplotlib's default may need one)."""
    import matplotlib

    matplotlib.use("Agg")
