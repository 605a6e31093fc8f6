"""Cleaning filters: each rule triggers exactly at its threshold; config loads from YAML and
rejects bad values or unknown keys."""

from __future__ import annotations

import math

import pytest

from protdp.data.filters import FilterConfig, check_family, load_screening
from protdp.errors import ConfigError
from protdp.paths import REPO_ROOT
from protdp.data.screening import ScreeningList

SEQ = "MQIFVKTLTGKTITLEVEPSDTIENVKAKIQDKEGIPPDQQRLIFAGKQLEDGRTLSDYNIQKESTLHLVLRLRGG"
MIX = "ACDEFGHIKLMNPQRSTVWY" * 5


def rule(seq=SEQ, res=2.0, observed=None, cfg=None, screen=None):
    out = check_family(seq, res, len(seq) if observed is None else observed,
                       cfg or FilterConfig(), screen)
    return None if out is None else out[0]


def test_each_rule_at_its_threshold():
    assert rule() is None
    cfg = FilterConfig(min_length=10, max_length=20)
    assert rule(MIX[:10], cfg=cfg) is None and rule(MIX[:9], cfg=cfg) == "min_length"
    assert rule(MIX[:20], cfg=cfg) is None and rule(MIX[:21], cfg=cfg) == "max_length"
    assert rule(res=9.0) is None and rule(res=9.01) == "resolution"
    assert rule(res=math.nan) is None
    assert rule(res=math.nan, cfg=FilterConfig(allow_unknown_resolution=False)) == "resolution"
    assert rule("A" * 80 + "G" * 20) is None                      # exactly 80 %
    assert rule("A" * 81 + "G" * 19) == "single_residue_fraction"
    assert rule("X" * 20 + MIX[:80]) is None                      # exactly 20 % unknown
    assert rule("X" * 21 + MIX[:79]) == "unknown_fraction"
    assert rule(observed=8) is None and rule(observed=7) == "min_observed_residues"


def test_screening_rule_names_entry_and_k_boundary():
    screen = ScreeningList([("concern1", "W" * 5 + SEQ[20:50])], k=20)
    out = check_family(SEQ, 2.0, len(SEQ), FilterConfig(), screen)
    assert out[0] == "screening" and "concern1" in out[1] and "30-residue" in out[1]
    assert rule(SEQ[:40], screen=screen) == "screening"          # shares SEQ[20:40]: 20
    assert rule(SEQ[:39], screen=screen) is None                 # shares 19


def test_config_yaml_and_validation(tmp_path):
    cfg = FilterConfig.load(REPO_ROOT / "configs/data/default.yaml")
    assert cfg == FilterConfig()                                 # YAML documents the defaults
    screened = FilterConfig.load(REPO_ROOT / "configs/data/screened.yaml")
    assert screened.screening_fasta and load_screening(screened) is not None
    assert load_screening(cfg) is None
    bad = tmp_path / "bad.yaml"
    bad.write_text("min_lenght: 5\n")
    with pytest.raises(ConfigError, match="min_lenght"):
        FilterConfig.load(bad)
    for kwargs in ({"min_length": 0}, {"max_single_residue_fraction": 1.5},
                   {"screening_mode": "blast"}, {"max_resolution": 0},
                   {"deletion_clip": 300}):
        with pytest.raises(ConfigError):
            FilterConfig(**kwargs)
