"""The TF oracle ships as tfgrad.testing.oracle (``tfgrad conformance`` runs it); this
name is that module itself, for the tests."""

import sys

from tfgrad.testing import oracle

sys.modules[__name__] = oracle

import pytest  # noqa: E402

from tfgrad._tf.cpuid import modelled  # noqa: E402

_WHY = ("TF's MatMul and Conv2D run an sgemm kernel of oneDNN's that tfgrad does not model on "
        "this processor (it models the AVX-512 and the AVX2-with-FMA ones; docs/matmul.md); "
        "test_contraction_distance_unmodelled bounds the distance here")
oracle.UNMODELLED = (frozenset() if modelled()  # type: ignore[attr-defined]
                     else frozenset({"matmul", "conv2d"}))
"""The families whose processor-dependent outputs are not TF's bits on this processor
(none where oneDNN's kernel is modelled): their live comparisons skip, saying why
(``UNMODELLED_WHY``)."""
oracle.UNMODELLED_WHY = _WHY  # type: ignore[attr-defined]
oracle.onednn_modelled = pytest.mark.skipif(  # type: ignore[attr-defined]
    not modelled(), reason=_WHY)
"""For tests of TF's bits through a MatMul or Conv2D contraction (a training step)."""
