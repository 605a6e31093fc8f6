"""Hostile input round 3 (issue 28), configs: one strict YAML loader for every config reader
(duplicate keys and deep nesting are one line naming the file and line; PyYAML took the last
key silently and raised RecursionError) and every field of the release policy validated at
load (max_msa_rows 0, min_band_residues 0 and a missing screening list used to fail later)."""

from __future__ import annotations

import pytest

from protdp.config import MAX_YAML_DEPTH, load_config, read_yaml
from protdp.errors import ConfigError
from protdp.gating.release import ReleasePolicy


def test_duplicate_key_names_both_lines(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("model:\n  c_m: 16\n  c_z: 8\n  c_m: 32\n")
    with pytest.raises(ConfigError, match=rf"^{path}:4:3: invalid YAML: duplicate key 'c_m' "
                                          r"\(first given on line 2\)$"):
        read_yaml(path)
    path.write_text("a: 1\nb: {a: 1}\nc: [{a: 1}, {a: 2}]\n")     # same key, other mappings
    assert read_yaml(path) == {"a": 1, "b": {"a": 1}, "c": [{"a": 1}, {"a": 2}]}


@pytest.mark.parametrize("text", ["a: " + "[" * 100_000 + "]" * 100_000 + "\n",
                                  "".join("  " * i + f"k{i}:\n" for i in range(3000)),
                                  "a: " + "{b: " * 5000 + "1" + "}" * 5000 + "\n"])
def test_deep_nesting_is_one_line_not_a_recursion_error(tmp_path, text):
    path = tmp_path / "deep.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=f"^{path}:\\d+:\\d+: invalid YAML: nested deeper than "
                                          f"{MAX_YAML_DEPTH} levels$"):
        read_yaml(path)
    ok = "a: " + "[" * (MAX_YAML_DEPTH - 2) + "1" + "]" * (MAX_YAML_DEPTH - 2) + "\n"
    path.write_text(ok)
    assert read_yaml(path)["a"] is not None


@pytest.mark.parametrize("field,value,why", [
    ("max_msa_rows", 0, "max_msa_rows must be an integer >= 1"),
    ("min_band_residues", 0, "min_band_residues must be an integer >= 1"),
    ("screening_list", "no/such.fasta", "screening_list: no/such.fasta: config file not found"),
    ("screening_list", 7, "screening_list must be a FASTA file path"),
])
def test_release_policy_fields_are_checked_at_load(tmp_path, field, value, why):
    path = tmp_path / "release.yaml"
    path.write_text(f"{field}: {value!r}\n".replace("'", ""))
    with pytest.raises(ConfigError, match=why):
        load_config(ReleasePolicy, path)
    assert load_config(ReleasePolicy, None).max_msa_rows >= 1       # the shipped defaults load
