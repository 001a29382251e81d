"""The golden fixtures' outputs per rsqrt signature (tests/fixture_store.py), and what the
fixture tests do on a processor whose approximate rsqrt the fixtures were not recorded
with: compare those outputs with TF live, or skip them, saying why, without TensorFlow.

A foreign processor is simulated by replacing ``fixture_store.rsqrt_signature``.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import tfgrad
from tests import fixture_store, oracle
from tests import test_conformance as conformance
from tfgrad._config import tf_intra_op_threads

ROOT = Path(__file__).resolve().parents[1]
FOREIGN = "0123456789abcdef"
"""The rsqrt signature of no processor the fixtures were recorded on."""
GRAD = "FusedBatchNormGradV3/R1"  # float32; x_backprop, scale_backprop are processor-dependent
FWD_BF16 = "FusedBatchNormV3/eps_tiny"  # bfloat16 y, processor-dependent


def _fixture(case_id: str) -> fixture_store.Fixture:
    return conformance.FIXTURES["batch_norm"][case_id]


def _check(case_id: str) -> None:
    """Run the fixture test of a batch-norm case; a skip fails (it must compare)."""
    try:
        conformance.test_fixture("batch_norm", case_id)
    except pytest.skip.Exception as e:
        pytest.fail(f"skipped instead of compared: {e}")


def _off_by_one_ulp(a: np.ndarray) -> np.ndarray:
    a = np.array(a)
    bits = a.reshape(-1).view({2: np.uint16, 4: np.uint32}[a.dtype.itemsize])
    bits[0] ^= 1
    return a


def _corrupt(monkeypatch, case_id: str, *, signed: bool = False, plain: int | None = None):
    """Replace the stored fixture of ``case_id`` by one whose outputs stored per rsqrt
    signature (``signed``) or whose output ``plain`` are one ulp off."""
    f = _fixture(case_id)
    outputs = list(f.outputs)
    if plain is not None:
        outputs[plain] = _off_by_one_ulp(outputs[plain])
    by_rsqrt = {i: {s: _off_by_one_ulp(o) if signed else o for s, o in v.items()}
                for i, v in f.by_rsqrt.items()}
    monkeypatch.setitem(conformance.FIXTURES["batch_norm"], case_id,
                        fixture_store.Fixture(f.kwargs, tuple(outputs), by_rsqrt))


@pytest.fixture
def foreign(monkeypatch):
    """This processor's rsqrt made unknown to the fixtures; TF live calls recorded."""
    monkeypatch.setattr(fixture_store, "rsqrt_signature", lambda: FOREIGN)
    calls = []
    real = oracle.expected

    def expected(case, kwargs):
        calls.append(case.id)
        return real(case, kwargs)

    monkeypatch.setattr(oracle, "expected", expected)
    return calls


def _recorded() -> str:
    """This processor's rsqrt signature where the fixtures hold its outputs, else one they
    hold (the store's own logic is the same for any)."""
    here, held = fixture_store.rsqrt_signature(), _fixture(GRAD).by_rsqrt[0]
    return here if here in held else min(held)


def test_recorded_processor_uses_its_stored_outputs(monkeypatch):
    # The control: on the processor the fixtures were recorded on, the stored
    # processor-dependent outputs are what is compared (one ulp off fails), TF not run.
    if fixture_store.rsqrt_signature() not in _fixture(GRAD).by_rsqrt[0]:
        pytest.skip(f"this processor's rsqrt ({fixture_store.rsqrt_signature()}) is not "
                    "among the recorded ones (tools/make_fixtures.py batch_norm adds it); "
                    "the foreign-processor tests below cover such a processor")
    calls = []
    monkeypatch.setattr(oracle, "expected", lambda *a: calls.append(a) or pytest.fail("ran TF"))
    _check(GRAD)
    _corrupt(monkeypatch, GRAD, signed=True)
    with pytest.raises(AssertionError, match="x_backprop"):
        _check(GRAD)
    assert not calls


@pytest.mark.live
@pytest.mark.parametrize("case_id", [GRAD, FWD_BF16])
def test_foreign_rsqrt_is_checked_against_tf_live(foreign, monkeypatch, case_id):
    # Another processor's stored values are not used (one ulp off passes); TF run here is.
    _corrupt(monkeypatch, case_id, signed=True)
    _check(case_id)
    assert foreign == [case_id]


@pytest.mark.live
@pytest.mark.parametrize("output", ["x_backprop", "scale_backprop"])
def test_foreign_rsqrt_wrong_live_value_fails(foreign, monkeypatch, output):
    # A deliberately wrong value from TF for a processor-dependent output fails the test.
    index = [o.name for o in tfgrad.get_op_def("FusedBatchNormGradV3").outputs].index(output)
    real = oracle.expected

    def wrong(case, kwargs):
        out = list(real(case, kwargs))
        out[index] = _off_by_one_ulp(out[index])
        return tuple(out)

    monkeypatch.setattr(oracle, "expected", wrong)
    with pytest.raises(AssertionError, match=rf"TF live.*\.{output}:"):
        _check(GRAD)


@pytest.mark.parametrize("case_id", [GRAD, FWD_BF16])
def test_foreign_rsqrt_without_tf_skips_only_those_outputs(foreign, monkeypatch, case_id):
    monkeypatch.setattr(oracle, "tensorflow", lambda: None)
    with pytest.raises(pytest.skip.Exception) as info:
        conformance.test_fixture("batch_norm", case_id)
    reason = str(info.value)
    names = ("scale_backprop, x_backprop" if "Grad" in case_id else "y")
    assert reason.startswith(f"{names} not checked (every other output matched)"), reason
    assert "TensorFlow is not installed" in reason and f"this processor's ({FOREIGN})" in reason
    recorded = fixture_store.recorded_signatures()
    stored = {s for per in _fixture(case_id).by_rsqrt.values() for s in per}
    assert stored and all(f"{recorded[s]['processor']} ({s})" in reason for s in stored), reason
    assert not foreign
    # The other outputs are still compared: one ulp off in one of them fails.
    plain = next(i for i, o in enumerate(_fixture(case_id).outputs) if o is not None)
    _corrupt(monkeypatch, case_id, plain=plain)
    with pytest.raises(AssertionError):
        conformance.test_fixture("batch_norm", case_id)


# --------------------------------------------------------------------------------------
# The store: several rsqrt signatures side by side
# --------------------------------------------------------------------------------------
def _packed(case_id: str, signature: str, bump: int = 0) -> dict[str, np.ndarray]:
    """The committed fixture of ``case_id`` packed as recorded with ``signature``, its
    processor-dependent outputs ``bump`` ulps away (another processor's values)."""
    f = _fixture(case_id)
    outs = []
    for i, o in enumerate(f.outputs):
        if o is None:
            o = f.by_rsqrt[i][_recorded()]
            for _ in range(bump):
                o = _off_by_one_ulp(o)
        outs.append(o)
    return fixture_store.pack(case_id, f.kwargs, tuple(outs),
                              rsqrt=(signature, sorted(f.by_rsqrt)))


def _round_trip(tmp_path, data) -> dict[str, fixture_store.Fixture]:
    path = tmp_path / "batch_norm.npz"
    np.savez_compressed(path, **data)
    return fixture_store.load("batch_norm", path)


@pytest.mark.parametrize("case_id", [GRAD, FWD_BF16])
def test_store_keeps_each_signature(tmp_path, case_id):
    mine = _recorded()
    old = _packed(case_id, FOREIGN, bump=1)
    merged, dropped = fixture_store.merge(old, _packed(case_id, mine))
    assert not dropped
    assert fixture_store.signatures_in(merged) == {mine, FOREIGN}
    f = _round_trip(tmp_path, merged)[case_id]
    committed = _fixture(case_id)
    for i, o in enumerate(f.outputs):
        ours, theirs = f.for_rsqrt(mine)[i], f.for_rsqrt(FOREIGN)[i]
        if o is None:
            assert i in committed.by_rsqrt and f.for_rsqrt("f" * 16)[i] is None
            oracle.assert_same(ours, committed.by_rsqrt[i][mine])
            oracle.assert_same(theirs, _off_by_one_ulp(ours))
        else:
            oracle.assert_same(o, committed.outputs[i])
            assert ours is theirs is o
    assert f.kwargs.keys() == committed.kwargs.keys()
    if case_id == FWD_BF16:  # bfloat16 outputs per signature come back as bfloat16
        assert f.for_rsqrt(FOREIGN)[0].dtype == ml_dtypes.bfloat16


def test_store_drops_other_signatures_when_the_case_changes():
    mine = _recorded()
    old = _packed(GRAD, FOREIGN, bump=1)
    # new inputs: the other processor's outputs no longer apply
    new = _packed(GRAD, mine)
    x = f"{GRAD}/in:x"
    new[x] = _off_by_one_ulp(new[x])
    merged, dropped = fixture_store.merge(old, new)
    assert sorted(dropped) == sorted(k for k in old if fixture_store.SIGNED in k)
    assert fixture_store.signatures_in(merged) == {mine}
    # an output no longer processor-dependent: dropped too
    new = _packed(GRAD, mine)
    key = next(k for k in new if fixture_store.SIGNED in k)
    new[key.partition(fixture_store.SIGNED)[0]] = new.pop(key)
    merged, dropped = fixture_store.merge(old, new)
    assert dropped == [key.replace(mine, FOREIGN)]
    # same call with other attrs: dropped
    new = _packed(GRAD, mine)
    attrs = json.loads(str(new[f"{GRAD}/attrs"]))
    attrs["epsilon"] = 0.5
    new[f"{GRAD}/attrs"] = np.array(json.dumps(attrs))
    assert len(fixture_store.merge(old, new)[1]) == 2


def test_record_processor_adds_and_keeps(tmp_path, monkeypatch):
    monkeypatch.setattr(fixture_store, "PROCESSOR", tmp_path / "processor.json")
    shutil.copy(fixture_store.FIXTURES / "processor.json", fixture_store.PROCESSOR)
    before = fixture_store.recorded_signatures()
    monkeypatch.setattr(fixture_store, "rsqrt_signature", lambda: FOREIGN)
    fixture_store.record_processor()
    after = fixture_store.recorded_signatures()
    assert after.keys() == before.keys() | {FOREIGN} and after[FOREIGN]["processor"]
    fixture_store.record_processor(keep={FOREIGN})
    assert fixture_store.recorded_signatures().keys() == {FOREIGN}


@pytest.mark.live
def test_make_fixtures_adds_this_processors_set(tmp_path, monkeypatch):
    # tools/make_fixtures.py on a processor with another rsqrt: batch norm's file then
    # holds both processors' outputs, and processor.json names both.
    for name in ("batch_norm.npz", "processor.json"):
        shutil.copy(fixture_store.FIXTURES / name, tmp_path / name)
    monkeypatch.setattr(fixture_store, "FIXTURES", tmp_path)
    monkeypatch.setattr(fixture_store, "PROCESSOR", tmp_path / "processor.json")
    monkeypatch.setattr(fixture_store, "rsqrt_signature", lambda: FOREIGN)
    # (the tool runs on the fixtures' TF thread count: here, whatever this machine's is)
    monkeypatch.setattr(fixture_store, "RECORDED_TF_THREADS", tf_intra_op_threads())
    spec = importlib.util.spec_from_file_location("make_fixtures",
                                                  ROOT / "tools" / "make_fixtures.py")
    make = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make)
    assert make.main(["batch_norm"]) == 0
    theirs = conformance.FIXTURES["batch_norm"]
    got = fixture_store.load("batch_norm")
    assert got.keys() == theirs.keys()
    ours = fixture_store.recorded_signatures()
    committed = json.loads((ROOT / "tests" / "fixtures" / "processor.json").read_text())
    # (the signatures of the files present: batch norm's)
    with np.load(fixture_store.FIXTURES / "batch_norm.npz") as bn:
        assert ours.keys() == {FOREIGN} | (committed["rsqrt_signatures"].keys()
                                           & fixture_store.signatures_in(bn.files))
    for case_id, f in got.items():
        assert f.by_rsqrt.keys() == theirs[case_id].by_rsqrt.keys(), case_id
        for i, per in f.by_rsqrt.items():
            assert per.keys() == ours.keys(), case_id
            for s, o in theirs[case_id].by_rsqrt[i].items():  # the recorded sets are kept
                oracle.assert_same(per[s], o, what=case_id)
            # and this processor's is TF's here, which is what tfgrad computes
            oracle.assert_same(per[FOREIGN], conformance._run(
                conformance._case(case_id).op, f.kwargs)[i], what=case_id)


# --------------------------------------------------------------------------------------
# The contraction families: one set per oneDNN kernel, each checked on every processor
# --------------------------------------------------------------------------------------
def _kernels_differ() -> tuple[str, str, dict[str, str]]:
    """A MatMul case whose AVX-512 and AVX2 outputs differ, and {isa: signature}: of each
    kernel's sets, the one recorded with this machine's L1 and TF thread count where
    there is one."""
    recorded = fixture_store.recorded_signatures()
    here = fixture_store.contraction_setup()

    def fit(s: str) -> bool:
        return all(recorded[s][k] == here[k] for k in ("l1", "tf_threads"))

    sigs = {}
    for s in sorted((s for s, v in recorded.items() if "onednn_isa" in v), key=fit):
        sigs[recorded[s]["onednn_isa"]] = s  # (the fitting ones last: they win)
    for case_id, f in conformance.FIXTURES["matmul"].items():
        per = f.by_rsqrt.get(0, {})
        if sigs.keys() <= {recorded[s]["onednn_isa"] for s in per} and (
                per[sigs["avx2"]].tobytes() != per[sigs["avx512_core"]].tobytes()):
            return "matmul", case_id, sigs
    raise AssertionError("no MatMul case whose two kernels' outputs differ")


@pytest.mark.parametrize("isa", ["avx512_core", "avx2"])
def test_each_onednn_kernels_outputs_are_checked(monkeypatch, isa):
    # Both kernels' recorded sets are compared on any processor of the same L1 and TF
    # thread count (one ulp off in either fails), without TF: tfgrad models both.
    family, case_id, sigs = _kernels_differ()
    here = fixture_store.contraction_setup()
    if any(fixture_store.recorded_signatures()[sigs[isa]][k] != here[k]
           for k in ("l1", "tf_threads")):
        pytest.skip("recorded with another L1 size or TF thread count than this machine's")
    monkeypatch.setattr(oracle, "tensorflow", lambda: None)
    monkeypatch.setattr(oracle, "expected", None)  # never called
    conformance.test_fixture(family, case_id)
    f = conformance.FIXTURES[family][case_id]
    by_rsqrt = {0: {**f.by_rsqrt[0], sigs[isa]: _off_by_one_ulp(f.by_rsqrt[0][sigs[isa]])}}
    monkeypatch.setitem(conformance.FIXTURES[family], case_id,
                        fixture_store.Fixture(f.kwargs, f.outputs, by_rsqrt))
    with pytest.raises(AssertionError):
        conformance.test_fixture(family, case_id)
