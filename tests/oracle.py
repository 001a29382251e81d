"""The TF oracle ships as tfgrad.testing.oracle (``tfgrad conformance`` runs it); this
name is that module itself, for the tests."""

import sys

from tfgrad.testing import oracle

sys.modules[__name__] = oracle

import pytest  # noqa: E402

from tfgrad._tf.cpuid import avx512_core  # noqa: E402

_WHY = ("TF's MatMul and Conv2D run oneDNN's AVX2 sgemm on this processor, which tfgrad does "
        "not model (K passes of 256, its own edge tiles): tfgrad keeps the AVX-512 kernel's "
        "order on every processor, TF's bits on AVX-512 ones (docs/matmul.md); "
        "test_contraction_distance_without_avx512 bounds the distance here")
oracle.AVX512_ONLY = (frozenset() if avx512_core()  # type: ignore[attr-defined]
                      else frozenset({"matmul", "conv2d"}))
"""The families whose processor-dependent outputs are TF's bits on AVX-512 only (none
there): their live comparisons skip elsewhere, saying why (``AVX512_WHY``)."""
oracle.AVX512_WHY = _WHY  # type: ignore[attr-defined]
oracle.onednn_avx512 = pytest.mark.skipif(  # type: ignore[attr-defined]
    not avx512_core(), reason=_WHY)
"""For tests of TF's bits through a MatMul or Conv2D contraction (a training step)."""
