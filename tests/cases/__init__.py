"""The op-case table for the tests: the family modules shipped as tfgrad.testing.cases.

``tests.cases.<family>`` is the shipped module itself (aliased, not a second copy), and
``CASES`` / ``ERROR_CASES`` gather every family's. TFGRAD_FAMILIES=fake_quant,batch_norm
restricts the table (and these aliases) to those families, for work on one family.
"""

from __future__ import annotations

import os
import sys

from tfgrad.testing import FAMILIES as _ALL
from tfgrad.testing import family as _family
from tfgrad.testing.cases import TF_ERROR_NAMES, Case, ErrorCase, Warmup, tf_class_name

__all__ = ["Case", "ErrorCase", "Warmup", "TF_ERROR_NAMES", "tf_class_name", "FAMILIES",
           "CASES", "ERROR_CASES"]

_names = [f for f in os.environ.get("TFGRAD_FAMILIES", "").split(",") if f] or list(_ALL)
FAMILIES: dict[str, tuple[list[Case], list[ErrorCase]]] = {}
for _name in _names:
    _module = _family(_name)
    sys.modules[f"{__name__}.{_name}"] = _module
    globals()[_name] = _module
    FAMILIES[_name] = (list(_module.CASES), list(_module.ERROR_CASES))
CASES: list[Case] = [c for cases, _ in FAMILIES.values() for c in cases]
ERROR_CASES: list[ErrorCase] = [c for _, errs in FAMILIES.values() for c in errs]
