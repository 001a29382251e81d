"""The distance tables of docs/adapters.md, from the implementations' own BOUNDS.

    python tools/bounds_table.py            # print the table
    python tools/bounds_table.py --write    # replace it in docs/adapters.md

Each family module of the portable torch code (``tfgrad.torch._portable.<family>``) and of
the native JAX code (``tfgrad.jax._native.<family>``) declares ``BOUNDS[op][output][dtype]``:
0 for bit-identical, else the largest ``tfgrad._distance.distance`` (ulps of the output's
largest value) its tests allow; ``NOTES[op]`` says what is not reproduced. The docs show
exactly these numbers (tests/test_docs.py holds them equal).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "adapters.md"
BEGIN, END = "<!-- bounds-table -->", "<!-- /bounds-table -->"
FRAMEWORKS = (("torch portable", "tfgrad.torch._portable"), ("JAX native", "tfgrad.jax._native"))


def _module(package: str, family: str):
    try:
        return importlib.import_module(f"{package}.{family}")
    except ImportError:
        return None


def _cell(v: float | None) -> str:
    if v is None:
        return "-"
    return "bit-identical" if v == 0 else f"{v:g}"


def table() -> str:
    from tfgrad._opdefs import OPS

    lines = ["| op | output | dtype | " + " | ".join(f for f, _ in FRAMEWORKS) + " |",
             "|---|---|---|" + "---|" * len(FRAMEWORKS)]
    notes: dict[str, list[str]] = {}
    for name, op in OPS.items():
        mods = [_module(pkg, op.family) for _, pkg in FRAMEWORKS]
        bounds = [getattr(m, "BOUNDS", {}).get(name, {}) if m else {} for m in mods]
        for (fw, _), m in zip(FRAMEWORKS, mods):
            note = getattr(m, "NOTES", {}).get(name) if m else None
            if note:
                notes.setdefault(name, []).append(f"{fw}: {note}")
        for out in op.outputs:
            dtypes = sorted({dt for b in bounds for dt in b.get(out.name, {})})
            for dt in dtypes:
                cells = [_cell(b.get(out.name, {}).get(dt)) for b in bounds]
                lines.append(f"| {name} | {out.name} | {dt} | " + " | ".join(cells) + " |")
    if notes:
        lines += ["", "Not reproduced:", ""]
        for name, ns in notes.items():
            lines += [f"- **{name}**: " + " ".join(ns)]
    return "\n".join(lines) + "\n"


def current_doc_table() -> str:
    text = DOC.read_text()
    return text.split(BEGIN, 1)[1].split(END, 1)[0].strip("\n") + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--write", action="store_true", help="replace the table in docs/adapters.md")
    args = p.parse_args()
    t = table()
    if not args.write:
        print(t, end="")
        return 0
    text = DOC.read_text()
    head, rest = text.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    DOC.write_text(f"{head}{BEGIN}\n{t}{END}{tail}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "src"))
    sys.exit(main())
