"""Reading and writing the golden fixtures (``tests/fixtures/<family>.npz``).

One ``.npz`` per op family. For case ``op/name`` it holds ``op/name/in:<arg>`` for each
array argument, ``op/name/attrs`` (JSON of the other arguments) and ``op/name/out:<i>``
for each of TF's outputs. Written by ``tools/make_fixtures.py``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

FIXTURES = Path(__file__).parent / "fixtures"
PROCESSOR = FIXTURES / "processor.json"
"""What the batch-norm fixtures' numbers depend on in the processor that recorded them."""


def rsqrt_signature() -> str:
    """A digest of this processor's approximate reciprocal square root as batch norm uses
    it (``rsqrtps`` plus Eigen's Newton step, tfgrad's ``eigen_rsqrt``) on 2**16 inputs:
    every 16-bit mantissa prefix of [1, 2) and [2, 4). ``rsqrtps`` is implementation-
    defined: Intel's and AMD's differ (and non-x86 builds use an exact 1/sqrt), so TF's
    own batch-norm outputs differ between them, and fixtures recorded on one processor
    hold the others' only where the approximation is not used."""
    import hashlib

    from tfgrad.ops.batch_norm import eigen_rsqrt

    bits = np.uint32(0x3F800000) + np.arange(1 << 16, dtype=np.uint32) * np.uint32(128)
    return hashlib.sha256(eigen_rsqrt(bits.view(np.float32)).tobytes()).hexdigest()[:16]


def record_processor() -> None:
    """Write PROCESSOR for the processor the fixtures are being generated on."""
    from tfgrad._config import cpu_name

    PROCESSOR.write_text(json.dumps({"rsqrt_signature": rsqrt_signature(),
                                     "processor": cpu_name()}, indent=1) + "\n")


def recorded_processor() -> dict[str, str]:
    """PROCESSOR's contents ({} when absent)."""
    return json.loads(PROCESSOR.read_text()) if PROCESSOR.exists() else {}


def _enc(v: Any) -> Any:
    if isinstance(v, tuple):
        return list(v)
    return v


def pack(case_id: str, kwargs: dict[str, Any], outputs: tuple[np.ndarray, ...]) -> dict:
    out: dict[str, np.ndarray] = {}
    attrs = {}
    for k, v in kwargs.items():
        if isinstance(v, np.ndarray):
            # bfloat16 is stored as its bits; the dtype name goes in attrs.
            if v.dtype.name == "bfloat16":
                attrs[f"__bf16__{k}"] = True
                v = v.view(np.uint16)
            out[f"{case_id}/in:{k}"] = v
        else:
            attrs[k] = _enc(v)
    out[f"{case_id}/attrs"] = np.array(json.dumps(attrs))
    for i, o in enumerate(outputs):
        if o.dtype.name == "bfloat16":
            attrs[f"__bf16__out{i}"] = True
            o = o.view(np.uint16)
        out[f"{case_id}/out:{i}"] = o
    out[f"{case_id}/attrs"] = np.array(json.dumps(attrs))
    return out


def load(family: str) -> dict[str, tuple[dict[str, Any], tuple[np.ndarray, ...]]]:
    """{case_id: (kwargs, tf_outputs)} for one family; empty if not generated yet."""
    import ml_dtypes

    path = FIXTURES / f"{family}.npz"
    if not path.exists():
        return {}
    data = np.load(path, allow_pickle=False)
    cases: dict[str, tuple[dict[str, Any], dict[int, np.ndarray]]] = {}
    for key in data.files:
        case_id, _, part = key.rpartition("/")
        kw, outs = cases.setdefault(case_id, ({}, {}))
        if part == "attrs":
            kw.update(json.loads(str(data[key])))
        elif part.startswith("in:"):
            kw[part[3:]] = data[key]
        elif part.startswith("out:"):
            outs[int(part[4:])] = data[key]
    result = {}
    for case_id, (kw, outs) in cases.items():
        for k in [k for k in kw if k.startswith("__bf16__")]:
            del kw[k]
            name = k[len("__bf16__"):]
            if name.startswith("out") and name[3:].isdigit():
                outs[int(name[3:])] = outs[int(name[3:])].view(ml_dtypes.bfloat16)
            else:
                kw[name] = kw[name].view(ml_dtypes.bfloat16)
        result[case_id] = (kw, tuple(outs[i] for i in range(len(outs))))
    return result
