"""Regenerate the golden fixtures in tests/fixtures/ by running TensorFlow 2.21.

    pip install -e ".[tf]"
    python tools/make_fixtures.py              # every family
    python tools/make_fixtures.py fake_quant   # one family

Each case of the op-case table (tfgrad/testing/cases/) is built with its fixed seed and run
through tf.raw_ops on TF's reference CPU kernels (TF_ENABLE_ONEDNN_OPTS=0). Cases that
TF's CPU kernel refuses (``tf_call``) are run in their TF-computable equivalent form.

Outputs whose bits depend on the processor (its family's ``processor_dependent``: batch
norm's approximate rsqrt; MatMul's and Conv2D's contraction sums) are stored under this
processor's signature (``fixture_store.signature``), next to those recorded on processors
with other signatures, which are kept for every case whose inputs are unchanged
(tests/fixture_store.py); tests/fixtures/processor.json names the processor of each
signature. Run on an Intel and an AMD processor (an AVX-512 and an AVX2 one), the
fixtures hold both. On an AVX-512 processor, oneDNN's AVX2 kernel's set (MatMul's and
Conv2D's contraction sums) comes from a second run with oneDNN held to AVX2 and tfgrad
modelling it::

    ONEDNN_MAX_CPU_ISA=AVX2 TFGRAD_ONEDNN_ISA=avx2 python tools/make_fixtures.py matmul conv2d
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ["TF_ENABLE_ONEDNN_OPTS"] = "0"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from tests import fixture_store, oracle  # noqa: E402
from tests.cases import FAMILIES  # noqa: E402
from tfgrad import get_op_def  # noqa: E402
from tfgrad.testing import processor_dependent  # noqa: E402


def main(argv: list[str]) -> int:
    import tensorflow as tf

    from tfgrad._config import tf_intra_op_threads

    if tf_intra_op_threads() != fixture_store.RECORDED_TF_THREADS:
        # (outputs whose bits follow TF's thread count are stored for one count)
        print(f"TF would run on {tf_intra_op_threads()} intra-op threads: run with "
              f"TF_NUM_INTRAOP_THREADS={fixture_store.RECORDED_TF_THREADS}", file=sys.stderr)
        return 2
    print(f"TensorFlow {tf.__version__}, oneDNN opts off")
    families = argv or list(FAMILIES)
    used: set[str] = set()
    fixture_store.FIXTURES.mkdir(exist_ok=True)
    for fam in families:
        signature = fixture_store.signature(fam)
        cases, _ = FAMILIES[fam]
        data: dict[str, np.ndarray] = {}
        for case in cases:
            kwargs = case.kwargs()
            outs = oracle.expected(case, kwargs)
            dependent = processor_dependent(case, kwargs)
            signed = [i for i, o in enumerate(get_op_def(case.op).outputs)
                      if o.name in dependent]
            data.update(fixture_store.pack(case.id, kwargs, outs,
                                           rsqrt=(signature, signed) if signed else None))
        path = fixture_store.FIXTURES / f"{fam}.npz"
        if path.exists():
            with np.load(path, allow_pickle=False) as old:
                data, dropped = fixture_store.merge(old, data)
            for key in dropped:
                print(f"  dropped {key}: its case's inputs or outputs changed")
        np.savez_compressed(path, **data)
        signatures = fixture_store.signatures_in(data)
        print(f"{fam}: {len(cases)} cases -> {os.path.relpath(path, ROOT)} "
              f"({path.stat().st_size // 1024} KiB)" + (
                  f"; signature {signature}, kept {sorted(signatures - {signature})}"
                  if signature in signatures else ""))
        if signature in signatures:
            used.add(signature)
    if used:  # processor.json: this processor, and the others still in some fixture
        kept: set[str] = set()
        for path in fixture_store.FIXTURES.glob("*.npz"):
            with np.load(path, allow_pickle=False) as stored:
                kept |= fixture_store.signatures_in(stored.files)
        fixture_store.record_processor(keep=kept, signatures=used)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
