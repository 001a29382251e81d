"""Reading and writing the golden fixtures (``tests/fixtures/<family>.npz``).

One ``.npz`` per op family. For case ``op/name`` it holds ``op/name/in:<arg>`` for each
array argument, ``op/name/attrs`` (JSON of the other arguments) and ``op/name/out:<i>``
for each of TF's outputs. Written by ``tools/make_fixtures.py``.

An output whose bits depend on the processor (its family's ``processor_dependent``:
batch norm's approximate rsqrt; the contractions of MatMul and Conv2D) is kept once per
processor signature it was recorded with, as ``op/name/out:<i>@rsqrt=<signature>``
(:func:`signature`: the rsqrt's, or for the contraction families what their order
depends on: oneDNN's kernel, Eigen's L1, TF's thread count); ``PROCESSOR`` names the
processor of each signature. ``tools/make_fixtures.py`` adds the running processor's set
and keeps the others' (for the cases whose inputs it leaves unchanged), so fixtures made
on an AMD and an Intel processor (or an AVX-512 and an AVX2 one) live side by side, and
each processor checks its own.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Collection, Iterable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

FIXTURES = Path(__file__).parent / "fixtures"
PROCESSOR = FIXTURES / "processor.json"
"""The processor behind each signature of the fixtures:
``{"rsqrt_signatures": {signature: {"processor": name, ...}}}`` (a contraction
signature's entry also holds its :func:`contraction_setup`)."""

CONTRACTION_FAMILIES = frozenset({"matmul", "conv2d"})
"""The families whose processor-dependent outputs are the contraction's sums."""

RECORDED_TF_THREADS = 2
"""TF's intra-op thread count the fixtures were recorded with (tools/make_fixtures.py
runs on it): outputs that depend on the count (a family's ``tf_threads_dependent``) are
compared with TF live on another (the contraction families key theirs by signature)."""

SIGNED = "@rsqrt="
"""Between an output's key and the rsqrt signature it was recorded with."""


@functools.cache
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


def contraction_setup(isa: str | None = None) -> dict[str, Any]:
    """What the order of TF's contraction sums depends on here: oneDNN's kernel
    (``isa``, default this processor's), the L1 size Eigen reads, TF's thread count."""
    from tfgrad._config import tf_intra_op_threads
    from tfgrad._tf.cpuid import eigen_caches, onednn_isa

    return {"onednn_isa": isa or onednn_isa(), "l1": eigen_caches()[0],
            "tf_threads": tf_intra_op_threads()}


def contraction_signature(isa: str | None = None) -> str:
    """A digest of :func:`contraction_setup`."""
    import hashlib

    key = json.dumps(contraction_setup(isa), sort_keys=True).encode()
    return hashlib.sha256(key).hexdigest()[:16]


def signature(family: str) -> str:
    """The signature this processor's processor-dependent outputs of ``family`` go under."""
    return contraction_signature() if family in CONTRACTION_FAMILIES else rsqrt_signature()


def recorded_signatures() -> dict[str, dict[str, Any]]:
    """PROCESSOR's signatures: {signature: {"processor": name}} ({} when absent)."""
    if not PROCESSOR.exists():
        return {}
    return json.loads(PROCESSOR.read_text()).get("rsqrt_signatures", {})


def record_processor(keep: Collection[str] | None = None,
                     signatures: Iterable[str] | None = None) -> None:
    """Add the running processor's ``signatures`` (default: its rsqrt signature) to
    PROCESSOR; of the others keep those in ``keep`` (default: all)."""
    from tfgrad._config import cpu_name

    sigs = {s: v for s, v in recorded_signatures().items() if keep is None or s in keep}
    for sig in (rsqrt_signature(),) if signatures is None else signatures:
        sigs[sig] = {"processor": cpu_name()}
        if sig == contraction_signature():
            sigs[sig].update(contraction_setup())
    PROCESSOR.write_text(json.dumps({"rsqrt_signatures": dict(sorted(sigs.items()))},
                                    indent=1) + "\n")


def signatures_in(keys: Iterable[str]) -> set[str]:
    """The rsqrt signatures that the keys of a fixture file hold outputs for."""
    return {k.rpartition(SIGNED)[2] for k in keys if SIGNED in k}


class Fixture(NamedTuple):
    """One case's stored call and TF's outputs."""

    kwargs: dict[str, Any]
    outputs: tuple[np.ndarray | None, ...]
    """TF's outputs; None for those kept per rsqrt signature (``by_rsqrt``)."""
    by_rsqrt: dict[int, dict[str, np.ndarray]]
    """Output index -> {rsqrt signature: TF's output made with that rsqrt}."""

    def for_rsqrt(self, signature: str) -> tuple[np.ndarray | None, ...]:
        """TF's outputs on a processor with this rsqrt signature: None for an output that
        depends on it and was not recorded with it."""
        return tuple(self.by_rsqrt[i].get(signature) if o is None else o
                     for i, o in enumerate(self.outputs))


def _enc(v: Any) -> Any:
    if isinstance(v, tuple):
        return list(v)
    return v


def pack(case_id: str, kwargs: dict[str, Any], outputs: tuple[np.ndarray, ...],
         rsqrt: tuple[str, Collection[int]] | None = None) -> dict[str, np.ndarray]:
    """One case's entries. ``rsqrt`` = (signature, output indices): those outputs were
    made with that rsqrt signature and are stored under it."""
    signature, signed = rsqrt or ("", ())
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
    for i, o in enumerate(outputs):
        if o.dtype.name == "bfloat16":
            attrs[f"__bf16__out{i}"] = True
            o = o.view(np.uint16)
        out[f"{case_id}/out:{i}" + (SIGNED + signature if i in signed else "")] = o
    out[f"{case_id}/attrs"] = np.array(json.dumps(attrs))
    return out


def _same_call(old: Mapping[str, np.ndarray], new: Mapping[str, np.ndarray],
               case_id: str) -> bool:
    """Whether a case has the same inputs and attrs (bit for bit) in both."""
    def call(data: Mapping[str, np.ndarray]) -> set[str]:
        return {k for k in data if k.startswith(f"{case_id}/")
                and k[len(case_id) + 1:].partition(":")[0] in ("in", "attrs")}

    keys = call(new)
    return keys == call(old) and all(
        old[k].dtype == new[k].dtype and old[k].shape == new[k].shape
        and old[k].tobytes() == new[k].tobytes() for k in keys)


def merge(old: Mapping[str, np.ndarray], new: dict[str, np.ndarray],
          ) -> tuple[dict[str, np.ndarray], list[str]]:
    """``new`` (a family's entries made on this processor) with the outputs that ``old``
    (the family's file as it was) holds for other rsqrt signatures, where they still
    apply: the case has the same call in both, and ``new`` keeps that output per
    signature too. Returns the merged entries and the keys of ``old`` left out."""
    merged = dict(new)
    dropped = []
    for key in old:
        if SIGNED not in key:
            continue
        if key in new:
            continue
        bare = key.rpartition(SIGNED)[0]
        if signatures_in(k for k in new if k.startswith(bare + SIGNED)) and _same_call(
                old, new, bare.rpartition("/")[0]):
            merged[key] = old[key]
        else:
            dropped.append(key)
    return merged, dropped


def load(family: str, path: Path | None = None) -> dict[str, Fixture]:
    """{case_id: Fixture} for one family; empty if not generated yet."""
    import ml_dtypes

    path = path or FIXTURES / f"{family}.npz"
    if not path.exists():
        return {}
    data = np.load(path, allow_pickle=False)
    cases: dict[str, tuple[dict[str, Any], dict[int, np.ndarray],
                           dict[int, dict[str, np.ndarray]]]] = {}
    for key in data.files:
        case_id, _, part = key.rpartition("/")
        part, _, signature = part.partition(SIGNED)
        kw, outs, signed = cases.setdefault(case_id, ({}, {}, {}))
        if part == "attrs":
            kw.update(json.loads(str(data[key])))
        elif part.startswith("in:"):
            kw[part[3:]] = data[key]
        elif part.startswith("out:") and signature:
            signed.setdefault(int(part[4:]), {})[signature] = data[key]
        elif part.startswith("out:"):
            outs[int(part[4:])] = data[key]
    result = {}
    for case_id, (kw, outs, signed) in cases.items():
        for k in [k for k in kw if k.startswith("__bf16__")]:
            del kw[k]
            name = k[len("__bf16__"):]
            if name.startswith("out") and name[3:].isdigit():
                i = int(name[3:])
                if i in outs:
                    outs[i] = outs[i].view(ml_dtypes.bfloat16)
                for sig, o in signed.get(i, {}).items():
                    signed[i][sig] = o.view(ml_dtypes.bfloat16)
            else:
                kw[name] = kw[name].view(ml_dtypes.bfloat16)
        n = len(outs) + len(signed)
        assert set(outs) | set(signed) == set(range(n)), (case_id, sorted(outs), sorted(signed))
        result[case_id] = Fixture(kw, tuple(outs.get(i) for i in range(n)), signed)
    return result
