"""Generic tests driven by the op-case table (tests/cases): every op, every case.

- fixtures: tfgrad (kernel and NumPy reference) == TF 2.21's stored outputs;
- live: tfgrad == TF 2.21 run now on fresh random inputs (needs TensorFlow);
- errors: bad inputs raise the class TF raises (tfgrad.errors, TF's names; each an
  InvalidArgumentError, or a TypeError) with TF's words, and TF rejects them too;
- inputs are never modified; non-contiguous inputs give the same bits.
"""

from __future__ import annotations

import builtins
import re

import numpy as np
import pytest

import tfgrad
from tests import fixture_store, oracle
from tests.cases import CASES, ERROR_CASES, FAMILIES
from tfgrad import testing
from tfgrad._config import tf_intra_op_threads
from tfgrad._tf.cpuid import use_onednn_isa
from tfgrad.testing import processor_dependent, tf_threads_dependent

FIXTURES = {fam: fixture_store.load(fam) for fam in FAMILIES}
_FIXTURE_CASES = [
    pytest.param(fam, cid, id=cid) for fam, data in FIXTURES.items() for cid in sorted(data)
]


def _run(op: str, kwargs: dict, impl: str = "kernel"):
    with tfgrad.use_impl(impl):
        return getattr(tfgrad.raw_ops, op)(**kwargs)


def _case(case_id: str):
    return next(c for c in CASES if c.id == case_id)


def _outputs(op: str) -> list[str]:
    return [o.name for o in tfgrad.get_op_def(op).outputs]


def _processors(signatures) -> str:
    recorded = fixture_store.recorded_signatures()
    return ", ".join(f"{recorded.get(s, {}).get('processor', 'an unnamed processor')} ({s})"
                     for s in sorted(signatures)) or "no processor"


def _other_kernels(fixture, case, signature: str) -> None:
    """The contraction outputs recorded with oneDNN's other kernels (AVX-512 on an AVX2
    processor, and the reverse): tfgrad modelling that kernel gives their bits, where the
    rest of the setup (Eigen's L1, TF's threads) is this processor's."""
    here = fixture_store.contraction_setup()
    recorded = fixture_store.recorded_signatures()
    for sig in {s for per in fixture.by_rsqrt.values() for s in per} - {signature}:
        setup = recorded.get(sig, {})
        if "onednn_isa" not in setup or any(setup[k] != here[k] for k in ("l1", "tf_threads")):
            continue
        with use_onednn_isa(setup["onednn_isa"]):
            for impl in ("kernel", "reference"):
                got = _run(case.op, fixture.kwargs, impl)
                oracle.assert_outputs(case.op, got, fixture.for_rsqrt(sig), case.ulps,
                                      what=f"[{impl}, oneDNN {setup['onednn_isa']}]")


@pytest.mark.parametrize("family,case_id", _FIXTURE_CASES)
def test_fixture(family, case_id):
    """tfgrad == TF's stored outputs. An output that holds the processor's approximate
    rsqrt is stored per rsqrt signature (tests/fixture_store.py); where none was recorded
    with this processor's, it is compared with TF run here, which computes with this
    processor's rsqrt as tfgrad does, and skipped only without TensorFlow. So is an output
    whose bits follow TF's intra-op thread count, where TF here runs on another count
    than the fixtures were recorded with."""
    fixture = FIXTURES[family][case_id]
    kwargs = fixture.kwargs
    case = _case(case_id)
    names = _outputs(case.op)
    signature = fixture_store.signature(family)
    if family in fixture_store.CONTRACTION_FAMILIES:
        _other_kernels(fixture, case, signature)
    expected = list(fixture.for_rsqrt(signature))
    absent = {n for n, e in zip(names, expected) if e is None}
    assert absent <= processor_dependent(case, kwargs), absent
    threads = tf_intra_op_threads()
    other_count = threads != fixture_store.RECORDED_TF_THREADS
    if other_count:  # (TF's bits for another thread count)
        absent |= tf_threads_dependent(case, kwargs)
        expected = [None if n in absent else e for n, e in zip(names, expected)]
    what = ""
    if absent and case.live and oracle.tensorflow() is not None:
        live = oracle.expected(case, kwargs)
        expected = [live[i] if e is None else e for i, e in enumerate(expected)]
        what = (f" ({', '.join(sorted(absent))}: TF live, rsqrt signature {signature}, "
                f"{threads} TF threads)")
        absent = set()
    for impl in ("kernel", "reference"):
        got = _run(case.op, kwargs, impl)
        oracle.assert_outputs(case.op, got, tuple(expected), case.ulps,
                              what=f"[{impl}]{what}", skip=absent)
    if absent:
        why = ("TensorFlow is not installed (pip install -e .[tf]) to compute them here"
               if case.live else "the case is not run against TF live")
        stored = {s for i, n in enumerate(names) if n in absent for s in fixture.by_rsqrt[i]}
        if other_count and absent <= tf_threads_dependent(case, kwargs):
            pytest.skip(f"{', '.join(sorted(absent))} not checked (every other output "
                        f"matched): TF's bits follow its thread count, the fixtures hold "
                        f"them for {fixture_store.RECORDED_TF_THREADS} threads, TF here runs "
                        f"{threads}, and {why}")
        pytest.skip(f"{', '.join(sorted(absent))} not checked (every other output matched): "
                    f"they hold the processor's approximate rsqrt, the fixtures hold them "
                    f"for the rsqrt of {_processors(stored)} only, this processor's "
                    f"({signature}) differs, and {why}")


def test_fixture_processor_recorded():
    # Each rsqrt signature the fixtures hold outputs for (Intel's and AMD's differ) is on
    # record with its processor. The outputs kept per signature are exactly those that the
    # family declares processor-dependent: outputs of its ops, in some fixtures of each.
    recorded = fixture_store.recorded_signatures()
    assert recorded and all(re.fullmatch(r"[0-9a-f]{16}", s) and v.get("processor")
                            for s, v in recorded.items()), recorded
    dependent_ops: dict[str, bool] = {}
    for name, op in tfgrad._opdefs.OPS.items():
        if op.family not in FIXTURES:
            continue
        sets = []
        for c in [c for c in CASES if c.op == name]:
            fixture = FIXTURES[op.family][c.id]
            dependent = processor_dependent(c, fixture.kwargs)
            signed = {n for i, n in enumerate(_outputs(name)) if fixture.outputs[i] is None}
            assert signed == dependent, (c.id, signed, dependent)
            for i in fixture.by_rsqrt:
                assert fixture.by_rsqrt[i] and set(fixture.by_rsqrt[i]) <= set(recorded), c.id
            sets.append(dependent)
        assert all(s <= {o.name for o in op.outputs} for s in sets), name
        declares = hasattr(testing.family(op.family), "processor_dependent")
        assert not any(sets) or declares, name
        dependent_ops[op.family] = dependent_ops.get(op.family, False) or any(sets)
    # a family that declares processor_dependent has such outputs in some op's fixtures
    # (not necessarily in every op's: cwise's Rsqrt only)
    for fam, any_dependent in dependent_ops.items():
        assert any_dependent == hasattr(testing.family(fam), "processor_dependent"), fam


def test_every_case_has_a_fixture():
    missing = [c.id for c in CASES if c.id not in FIXTURES.get(_family(c), {})]
    assert not missing, f"run tools/make_fixtures.py: no fixture for {missing[:5]}"


def _family(case) -> str:
    return tfgrad.get_op_def(case.op).family


@pytest.mark.live
@pytest.mark.parametrize("case", [c for c in CASES if c.live], ids=lambda c: c.id)
def test_live(case):
    seed = np.random.SeedSequence().entropy % 2**32
    kwargs = case.kwargs(seed)
    if _family(case) in oracle.UNMODELLED and (processor_dependent(case, kwargs)
                                                 or _family(case) == "conv2d"):
        pytest.skip(oracle.UNMODELLED_WHY)  # (every Conv2D op sums through the contraction)
    expected = oracle.expected(case, kwargs)
    got = _run(case.op, kwargs)
    oracle.assert_outputs(case.op, got, expected, case.ulps, what=f"[seed {seed}]")


def _tiny(v: np.ndarray) -> np.ndarray:
    """``v`` scaled so that products of two of its values underflow."""
    return (v.astype(np.float64) * (2.0**-530 if v.dtype == np.float64 else 2.0**-66)
            ).astype(v.dtype)


def _floats(kwargs: dict) -> list[str]:
    return [k for k, v in kwargs.items() if isinstance(v, np.ndarray) and v.size
            and (v.dtype.kind == "f" or v.dtype.name == "bfloat16")]


@pytest.mark.live
@pytest.mark.parametrize("case", [c for c in CASES if c.live and _floats(c.kwargs(c.seed()))],
                         ids=lambda c: c.id)
def test_live_signed_zeros_and_underflow(case):
    """The case's float inputs replaced by zeros of their values' signs, each alone and
    then all at once: sums and products of zeros, whose sign follows where TF's sums
    start (a MatMul GEMV adds into a zeroed output, a lazy product keeps -0:
    docs/matmul.md); then all of them scaled by 2**-66 (float64 2**-530), so that their
    products underflow and FTZ flushes them to zeros of their signs (a contraction's
    first chain stored as it is, an average's padding not added). TF's bits, kernel and
    reference."""
    seed = np.random.SeedSequence().entropy % 2**32
    kwargs = case.kwargs(seed)
    names = _floats(kwargs)
    if _family(case) in oracle.UNMODELLED and (processor_dependent(case, kwargs)
                                                 or _family(case) == "conv2d"):
        pytest.skip(oracle.UNMODELLED_WHY)
    variants = [(f"{', '.join(group)} zeros",
                 {**kwargs, **{k: np.copysign(np.zeros_like(kwargs[k]), kwargs[k])
                               for k in group}})
                for group in [[k] for k in names] + ([names] if len(names) > 1 else [])]
    with np.errstate(all="ignore"):  # (NaN and inf inputs stay as they are)
        variants.append(("tiny", {**kwargs, **{k: _tiny(kwargs[k]) for k in names}}))
    for what, kw in variants:
        try:
            expected = oracle.expected(case, kw)
        except Exception as e:  # (TF refuses them: FractionalMaxPoolGrad's orig_output
            # is no longer orig_input's pooling) tfgrad refuses them as well
            for impl in ("kernel", "reference"):
                with pytest.raises(getattr(tfgrad.errors, type(e).__name__)):
                    _run(case.op, kw, impl)
            continue
        for impl in ("kernel", "reference"):
            oracle.assert_outputs(case.op, _run(case.op, kw, impl), expected, case.ulps,
                                  what=f"[{what}, {impl}, seed {seed}]")


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_kernel_equals_reference_and_inputs_untouched(case):
    kwargs = case.kwargs(seed=case.seed() + 1)
    before = {k: v.copy() for k, v in kwargs.items() if isinstance(v, np.ndarray)}
    for v in kwargs.values():
        if isinstance(v, np.ndarray):
            v.flags.writeable = False  # a write into an input raises
    kern = _run(case.op, kwargs, "kernel")
    ref = _run(case.op, kwargs, "reference")
    oracle.assert_outputs(case.op, kern, ref, what="kernel vs reference")
    for k, v in before.items():
        oracle.assert_same(kwargs[k], v, what=f"input {k} changed")


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_non_contiguous_inputs(case):
    kwargs = case.kwargs(seed=case.seed() + 2)
    strided = {}
    for k, v in kwargs.items():
        if isinstance(v, np.ndarray) and v.ndim >= 1 and v.size > 1:
            big = np.zeros(v.shape[:-1] + (2 * v.shape[-1],), v.dtype)
            big[..., ::2] = v
            strided[k] = big[..., ::2]
            assert not strided[k].flags.c_contiguous
        else:
            strided[k] = v
    oracle.assert_outputs(case.op, _run(case.op, strided), _run(case.op, kwargs),
                          what="strided vs contiguous")


@pytest.mark.parametrize("case", ERROR_CASES, ids=lambda c: c.id)
def test_error(case):
    with pytest.raises(case.error) as info:
        _run(case.op, case.kwargs())
    assert isinstance(info.value, (tfgrad.InvalidArgumentError, TypeError))
    assert re.search(case.match, str(info.value)), str(info.value)
    # TF's class, under TF's name: tfgrad.errors.<Name> (or the built-in TF's binding raises)
    assert case.error is TypeError or case.error in vars(tfgrad.errors).values(), case.error
    if case.tf_error:  # a deliberate difference from TF's class
        assert case.why and case.tf_error != case.error.__name__
    else:
        named = getattr(tfgrad.errors, case.tf_class, None) or getattr(builtins, case.tf_class)
        assert isinstance(info.value, named), (case.tf_class, type(info.value))


@pytest.mark.live
@pytest.mark.parametrize("case", [c for c in ERROR_CASES if c.tf_rejects], ids=lambda c: c.id)
def test_error_tf_agrees(case):
    """TF raises exactly the class the case names, with a message its pattern matches."""
    with pytest.raises(Exception) as info:
        oracle.run_tf(case.op, case.kwargs())
    assert type(info.value) is oracle.tf_error_class(case.tf_class), (
        f"TF raised {type(info.value).__name__}, the case says {case.tf_class}: {info.value}")
    message = oracle.tf_message(info.value)
    assert re.search(case.tf_match or case.match, message), message
