"""Routes and reason codes of the confidence gate, with the one line people see for each."""

ROUTES = ("accepted", "needs_review", "rejected")

REASON_TEXT = {
    "invalid_input": "input was invalid; no usable prediction",
    "invalid_plddt": "pLDDT vector is non-finite, outside 0–100, or empty",
    "low_mean_plddt": "mean pLDDT below the acceptance threshold",
    "low_plddt_fraction": "too many residues with very low pLDDT",
    "length_beyond_training_crop": "sequence longer than the training crop",
    "shallow_msa": "MSA shallower than the configured minimum",
    "shallow_msa_no_template": "shallow MSA and no structural template: the case where templates "
                               "matter most, and none was found or given",
    "screening": "sequence matched the safety screening list",
    "low_complexity": "low-complexity sequence (homopolymer or short repeat): confident-looking "
                      "but rarely meaningful",
    "ensemble_disagreement": "the models of the ensemble (checkpoints x seeds) disagree: the "
                             "top-ranked structure is far from another prediction",
    "low_iptm": "complex: interface predicted with low confidence (ipTM below the threshold)",
    "uncertain_interface": "complex: high predicted aligned error between chains",
    "low_ipsae": "complex: a chain pair's interface has low ipSAE (confident-PAE residue pairs "
                 "only, Dunbrack 2025) below the threshold; the detail names the pair",
    "unreleased_checkpoint": "the checkpoint has no passing release record (run with "
                             "--allow-unreleased): every prediction needs review",
}
