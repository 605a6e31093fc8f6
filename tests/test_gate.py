"""Confidence gate routing on crafted pLDDT vectors (protdp.gating)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protdp.config import load_config
from protdp.errors import ConfigError, InputError
from protdp.gating import AFDB_BANDS, REASON_TEXT, GatePolicy, afdb_bands, band_of, route
from protdp.paths import REPO_ROOT

POLICY = GatePolicy()
OK = dict(msa_depth=1000, training_crop=256)


def _route(p, policy=POLICY, **kw):
    p = np.asarray(p, dtype=np.float64)
    return route(p, length=len(p), policy=policy, **{**OK, **kw})


def test_confident_prediction_is_accepted_with_bands():
    d = _route(np.full(40, 95.0))
    assert d.route == "accepted" and d.reasons == []
    assert d.mean_plddt == pytest.approx(95.0)
    assert d.afdb_bands == {"very_high": 1.0, "confident": 0.0, "low": 0.0, "very_low": 0.0}


def test_mean_threshold_is_inclusive_at_70():
    assert _route(np.full(10, 70.0)).route == "accepted"
    d = _route(np.full(10, 69.99))
    assert d.route == "needs_review" and d.reasons == ["low_mean_plddt"]
    assert "69.99" in d.details["low_mean_plddt"] or "70.0" in d.details["low_mean_plddt"]


def test_high_mean_with_many_very_low_residues_needs_review():
    # 70 % at 100 and 30 % at 30: mean 79 (passes) but 30 % < 50 (> 25 %).
    p = np.array([100.0] * 7 + [30.0] * 3)
    d = _route(p)
    assert d.mean_plddt == pytest.approx(79.0)
    assert d.route == "needs_review" and d.reasons == ["low_plddt_fraction"]
    assert d.very_low_fraction == pytest.approx(0.3)


def test_very_low_fraction_at_exactly_the_limit_passes():
    p = np.array([100.0] * 3 + [10.0])  # 25 % very low, mean 77.5
    assert _route(p).route == "accepted"
    p = np.array([100.0] * 3 + [49.999])
    assert _route(p).very_low_fraction == pytest.approx(0.25)
    p = np.array([100.0] * 3 + [50.0])  # exactly 50 is not very low
    assert _route(p).very_low_fraction == 0.0


def test_length_beyond_training_crop_and_shallow_msa_are_reviewed():
    p = np.full(50, 95.0)
    assert _route(p, training_crop=50).route == "accepted"
    d = _route(p, training_crop=49)
    assert d.route == "needs_review" and d.reasons == ["length_beyond_training_crop"]
    assert _route(p, training_crop=None).route == "accepted"  # unknown crop: not checked
    assert _route(p, training_crop=49, policy=GatePolicy(review_beyond_training_crop=False)).route \
        == "accepted"
    assert _route(p, msa_depth=30).route == "accepted"
    d = _route(p, msa_depth=29)
    assert d.route == "needs_review" and d.reasons == ["shallow_msa"]


def test_screening_hit_is_reviewed_and_all_reasons_accumulate():
    d = _route(np.full(8, 95.0), screening_hits=["toxin_db:P01552 identity 0.98"])
    assert d.route == "needs_review" and d.reasons == ["screening"]
    assert "P01552" in d.details["screening"]
    d = _route(np.full(8, 20.0), msa_depth=1, training_crop=4, screening_hits=["x"])
    assert d.reasons == ["low_mean_plddt", "low_plddt_fraction", "length_beyond_training_crop",
                         "shallow_msa", "screening"]
    assert set(d.reasons) <= set(REASON_TEXT)


def test_invalid_input_is_rejected():
    d = route(np.zeros(0), length=0, msa_depth=0, training_crop=None,
              invalid_reason="MSA query does not match sequence", policy=POLICY)
    assert d.route == "rejected" and d.reasons == ["invalid_input"]
    assert "does not match" in d.details["invalid_input"]


@pytest.mark.parametrize("bad", [[95.0, np.nan, 95.0], [95.0, np.inf, 95.0], [95.0, 101.0, 99.0],
                                 [95.0, -1.0, 99.0]])
def test_broken_confidence_never_accepted(bad):
    d = _route(bad)
    assert d.route == "needs_review" and "invalid_plddt" in d.reasons
    assert d.mean_plddt is None


def test_fraction_scale_plddt_is_not_mistaken_for_confident():
    # A head that emits 0–1 instead of 0–100 must not be accepted.
    assert _route(np.full(10, 0.95)).route == "needs_review"


def test_shape_errors_name_the_field():
    with pytest.raises(InputError, match="plddt"):
        route(np.full(5, 90.0), length=6, msa_depth=100, training_crop=None, policy=POLICY)
    with pytest.raises(InputError, match="1-D"):
        route(np.full((2, 3), 90.0), length=2, msa_depth=100, training_crop=None, policy=POLICY)


def test_afdb_band_boundaries():
    p = np.array([90.01, 90.0, 70.0, 69.99, 50.0, 49.99])
    b = afdb_bands(p)
    assert b == {"very_high": 1 / 6, "confident": 2 / 6, "low": 2 / 6, "very_low": 1 / 6}
    assert [band_of(x) for x in p] == ["very_high", "confident", "confident", "low", "low",
                                       "very_low"]


def test_to_dict_is_json_serialisable():
    d = _route(np.linspace(30, 99, 17), msa_depth=3)
    back = json.loads(json.dumps(d.to_dict()))
    assert back["route"] == "needs_review" and back["reasons"] == d.reasons
    assert back["policy"]["accept_mean_plddt"] == 70.0


def test_yaml_policy_matches_defaults_and_is_configurable(tmp_path):
    assert load_config(GatePolicy, REPO_ROOT / "configs" / "gating.yaml") == GatePolicy()
    strict = tmp_path / "strict.yaml"
    strict.write_text("accept_mean_plddt: 80\nmin_msa_depth: 5\n")
    policy = load_config(GatePolicy, strict)
    assert _route(np.full(10, 75.0), msa_depth=5, policy=policy).reasons == ["low_mean_plddt"]
    bad = tmp_path / "bad.yaml"
    bad.write_text("accept_mean_plddt: 170\n")
    with pytest.raises(ConfigError, match="bad.yaml.*accept_mean_plddt"):
        load_config(GatePolicy, bad)
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text("accept_mean_pldt: 70\n")
    with pytest.raises(ConfigError, match="accept_mean_pldt"):
        load_config(GatePolicy, unknown)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(min_value=0, max_value=100), min_size=1, max_size=60),
       st.integers(min_value=0, max_value=100), st.one_of(st.none(), st.integers(1, 80)))
def test_accepted_implies_every_check_passes(values, depth, crop):
    p = np.array(values)
    d = route(p, length=len(p), msa_depth=depth, training_crop=crop, policy=POLICY)
    assert d.route in ("accepted", "needs_review")
    assert abs(sum(d.afdb_bands.values()) - 1.0) < 1e-9
    assert set(d.afdb_bands) == set(AFDB_BANDS)
    if d.route == "accepted":
        assert p.mean() >= 70 and np.mean(p < 50) <= 0.25 and depth >= 30
        assert crop is None or len(p) <= crop
    else:
        assert d.reasons


@pytest.mark.parametrize("sequence, flagged", [
    ("Q" * 40, True),                                  # homopolymer
    ("QP" * 30, True),                                 # dipeptide repeat: 1 bit
    ("GGSGGSGGSGGSGGSGGSGGSGGS", True),                # flexible linker: G is 67 %
    ("MQIFVKTLTGKTITLEVEPSDTIENVKAKIQDKEGIPPDQQRLIFAGKQLEDGRTLSDYNIQKESTLHLVLRLRGG", False),
    ("YYDPETGTWY", False),                             # short real peptide (5AWL)
])
def test_low_complexity_sequences_go_to_review(sequence, flagged):
    """Confident-looking predictions of repeats must not be accepted on pLDDT alone."""
    policy = GatePolicy(min_msa_depth=1)
    d = route(np.full(len(sequence), 95.0), length=len(sequence), msa_depth=100, training_crop=None,
              policy=policy, sequence=sequence)
    assert ("low_complexity" in d.reasons) == flagged
    assert d.route == ("needs_review" if flagged else "accepted")


def test_templates_are_evidence_for_shallow_msas():
    """issue 31 D6: a shallow MSA with no template is its own reason; the templates used are
    named in the shallow-MSA detail; a template-free model (None) adds nothing."""
    p = np.full(50, 95.0)
    assert _route(p, msa_depth=29, templates=None).reasons == ["shallow_msa"]
    d = _route(p, msa_depth=29, templates=[])
    assert d.reasons == ["shallow_msa", "shallow_msa_no_template"]
    assert "shallow_msa_no_template" in REASON_TEXT
    d = _route(p, msa_depth=29, templates=["4hhb_A", "102m_A"])
    assert d.reasons == ["shallow_msa"] and "4hhb_A, 102m_A" in d.details["shallow_msa"]
    assert _route(p, msa_depth=1000, templates=[]).route == "accepted"
